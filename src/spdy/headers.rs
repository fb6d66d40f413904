//! SPDY/3 header blocks: the name/value list and its zlib compression.
//!
//! A block is `count:32` then, per pair, `len:32 name len:32 value`; several
//! values of one name are joined with NUL bytes. Each direction of a session
//! compresses every block into one zlib stream primed with the protocol's
//! dictionary, ending each block with a sync flush: so the [`Deflater`] and
//! [`Inflater`] live as long as the session and see every block in order.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::dictionary::dictionary;
use super::frame::FrameError;

/// Largest inflated header block accepted (the kubectl and apiserver
/// clients send a few dozen bytes); a bound against compression bombs.
pub const MAX_BLOCK: usize = 64 * 1024;

/// A decoded header block: lowercase names in the order sent, one entry per
/// value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(String, String)>);

impl Headers {
    /// The first value of `name` (names compare case-insensitively).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn block_error(what: impl Into<String>) -> FrameError {
    FrameError::HeaderBlock(what.into())
}

/// Serialise `pairs` (uncompressed). Values of a repeated name are joined
/// with NUL, names are lowercased, as the protocol asks.
pub fn encode_block(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut names: Vec<String> = Vec::new();
    let mut values: Vec<String> = Vec::new();
    for (name, value) in pairs {
        let name = name.to_ascii_lowercase();
        match names.iter().position(|n| *n == name) {
            Some(i) => {
                values[i].push('\0');
                values[i].push_str(value);
            }
            None => {
                names.push(name);
                values.push((*value).to_string());
            }
        }
    }
    let mut out = Vec::new();
    out.extend_from_slice(&len32(names.len()).to_be_bytes());
    for (n, v) in names.iter().zip(&values) {
        out.extend_from_slice(&len32(n.len()).to_be_bytes());
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(&len32(v.len()).to_be_bytes());
        out.extend_from_slice(v.as_bytes());
    }
    out
}

/// Header names and values are short; saturate rather than wrap on absurd
/// input (the peer then rejects the block).
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn take<'a>(raw: &mut &'a [u8], n: usize, what: &str) -> Result<&'a [u8], FrameError> {
    if raw.len() < n {
        return Err(block_error(format!(
            "{what} needs {n} bytes, {} left",
            raw.len()
        )));
    }
    let (head, rest) = raw.split_at(n);
    *raw = rest;
    Ok(head)
}

fn take_u32(raw: &mut &[u8], what: &str) -> Result<usize, FrameError> {
    let b = take(raw, 4, what)?;
    Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
}

/// Parse an inflated block. Empty names, names or values that are not
/// UTF-8, and trailing bytes are errors.
pub fn decode_block(mut raw: &[u8]) -> Result<Headers, FrameError> {
    let count = take_u32(&mut raw, "pair count")?;
    // Each pair takes at least 8 bytes: a count beyond that is a lie.
    if count > raw.len() / 8 {
        return Err(block_error(format!(
            "{count} pairs announced in {} bytes",
            raw.len()
        )));
    }
    let mut pairs = Vec::with_capacity(count);
    for _ in 0..count {
        let n = take_u32(&mut raw, "name length")?;
        if n == 0 {
            return Err(block_error("empty header name"));
        }
        let name = std::str::from_utf8(take(&mut raw, n, "name")?)
            .map_err(|_| block_error("header name is not UTF-8"))?
            .to_ascii_lowercase();
        let n = take_u32(&mut raw, "value length")?;
        let value = std::str::from_utf8(take(&mut raw, n, "value")?)
            .map_err(|_| block_error(format!("value of {name} is not UTF-8")))?;
        for v in value.split('\0') {
            pairs.push((name.clone(), v.to_string()));
        }
    }
    if !raw.is_empty() {
        return Err(block_error(format!(
            "{} bytes after the last pair",
            raw.len()
        )));
    }
    Ok(Headers(pairs))
}

/// One direction's compressor.
pub struct Deflater {
    z: Compress,
}

impl std::fmt::Debug for Deflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deflater").finish_non_exhaustive()
    }
}

impl Deflater {
    pub fn new() -> Result<Deflater, FrameError> {
        let mut z = Compress::new(Compression::default(), true);
        z.set_dictionary(dictionary())
            .map_err(|e| block_error(format!("prime the compressor: {e}")))?;
        Ok(Deflater { z })
    }

    /// Compress one serialised block, sync-flushed.
    pub fn compress(&mut self, raw: &[u8]) -> Result<Vec<u8>, FrameError> {
        let mut out = Vec::with_capacity(raw.len() / 2 + 64);
        let start = self.z.total_in();
        loop {
            let used = consumed(self.z.total_in(), start)?;
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity().max(64));
            }
            let before = out.len();
            self.z
                .compress_vec(&raw[used..], &mut out, FlushCompress::Sync)
                .map_err(|e| block_error(format!("compress: {e}")))?;
            let now = consumed(self.z.total_in(), start)?;
            // Done once all input is in and the flush left room to spare (a
            // full buffer may hide more pending output).
            if now == raw.len() && (out.len() < out.capacity() || out.len() == before) {
                return Ok(out);
            }
        }
    }
}

fn consumed(total: u64, start: u64) -> Result<usize, FrameError> {
    usize::try_from(total - start).map_err(|_| block_error("zlib overran its input"))
}

/// One direction's decompressor.
pub struct Inflater {
    z: Decompress,
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater").finish_non_exhaustive()
    }
}

impl Default for Inflater {
    fn default() -> Self {
        Inflater::new()
    }
}

impl Inflater {
    pub fn new() -> Inflater {
        Inflater {
            z: Decompress::new(true),
        }
    }

    /// Inflate one compressed block (at most [`MAX_BLOCK`] bytes out).
    pub fn decompress(&mut self, block: &[u8]) -> Result<Vec<u8>, FrameError> {
        let mut out = Vec::with_capacity(256);
        let start = self.z.total_in();
        loop {
            if out.len() >= MAX_BLOCK {
                return Err(block_error(format!("inflates beyond {MAX_BLOCK} bytes")));
            }
            if out.capacity() - out.len() < 256 {
                out.reserve(out.capacity().max(256));
            }
            let used = consumed(self.z.total_in(), start)?;
            let before = out.len();
            match self
                .z
                .decompress_vec(&block[used..], &mut out, FlushDecompress::Sync)
            {
                Ok(Status::StreamEnd) => {
                    return Err(block_error(
                        "the zlib stream ended (each block must be sync-flushed)",
                    ));
                }
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    // zlib checks the dictionary id the stream names.
                    self.z.set_dictionary(dictionary()).map_err(|e| {
                        block_error(format!("the stream wants another dictionary: {e}"))
                    })?;
                    continue;
                }
                Err(e) => return Err(block_error(format!("inflate: {e}"))),
            }
            let now = consumed(self.z.total_in(), start)?;
            let progress = now != used || out.len() != before;
            if now == block.len() && (out.len() < out.capacity() || !progress) {
                return Ok(out);
            }
            if !progress {
                return Err(block_error("inflate made no progress"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip_through_one_stream_each_way() {
        let mut d = Deflater::new().unwrap();
        let mut i = Inflater::new();
        for round in 0..50 {
            let rid = round.to_string();
            let pairs = [
                ("streamType", "data"),
                ("port", "8080"),
                ("requestID", rid.as_str()),
                ("x", "a"),
                ("x", "b"),
            ];
            let raw = encode_block(&pairs);
            let packed = d.compress(&raw).unwrap();
            let unpacked = i.decompress(&packed).unwrap();
            assert_eq!(unpacked, raw);
            let h = decode_block(&unpacked).unwrap();
            assert_eq!(h.get("streamtype"), Some("data"));
            assert_eq!(h.get("requestid"), Some(rid.as_str()));
            assert_eq!(
                h.0.iter().filter(|(n, _)| n == "x").count(),
                2,
                "NUL-joined values split"
            );
        }
    }

    #[test]
    fn empty_blocks_and_large_values() {
        let mut d = Deflater::new().unwrap();
        let mut i = Inflater::new();
        let raw = encode_block(&[]);
        assert_eq!(raw, vec![0, 0, 0, 0]);
        assert_eq!(i.decompress(&d.compress(&raw).unwrap()).unwrap(), raw);
        let big = "v".repeat(40_000);
        let raw = encode_block(&[("big", big.as_str())]);
        assert_eq!(i.decompress(&d.compress(&raw).unwrap()).unwrap(), raw);
    }

    #[test]
    fn incompressible_blocks_round_trip_across_buffer_growth() {
        // Values that barely compress make the deflater's output outgrow its
        // first buffer and the inflater's outgrow 256 bytes many times.
        let mut d = Deflater::new().unwrap();
        let mut i = Inflater::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut noise = |n: usize| -> String {
            (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    char::from(b'!' + (x % 94) as u8)
                })
                .collect()
        };
        for n in [10, 300, 5_000, 20_000, 60_000, 40] {
            let v = noise(n);
            let raw = encode_block(&[("k", v.as_str())]);
            let packed = d.compress(&raw).unwrap();
            assert!(packed.len() > raw.len() / 2, "{n}: noise compressed");
            assert_eq!(i.decompress(&packed).unwrap(), raw, "{n}");
        }
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        let e = decode_block(&[0, 0, 0, 2, 0, 0, 0, 1, b'a', 0, 0, 0, 0]).unwrap_err();
        assert_eq!(e.to_string(), "header block: 2 pairs announced in 9 bytes");
        let e = decode_block(&[0, 0, 0, 1, 0, 0, 0, 1, b'a', 0, 0, 0, 0, 9]).unwrap_err();
        assert_eq!(e.to_string(), "header block: 1 bytes after the last pair");
        assert_eq!(format!("{:?}", Deflater::new().unwrap()), "Deflater { .. }");
        assert_eq!(format!("{:?}", Inflater::new()), "Inflater { .. }");
        // Not zlib at all: the inflater's own reason, not a dictionary one.
        let e = Inflater::new().decompress(b"not zlib").unwrap_err();
        assert!(e.to_string().starts_with("header block: inflate: "), "{e}");
    }

    #[test]
    fn malformed_blocks_are_errors() {
        for bad in [
            &b""[..],
            &[0, 0, 0, 1][..],
            &[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0][..],
            &[0, 0, 0, 1, 0, 0, 0, 9, b'a', 0, 0, 0, 0][..],
            &[0, 0, 0, 1, 0, 0, 0, 1, 0xff, 0, 0, 0, 0][..],
            &[0, 0, 0, 0, 1][..],
            &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0][..],
        ] {
            assert!(decode_block(bad).is_err(), "{bad:?}");
        }
        assert!(Inflater::new().decompress(b"not zlib").is_err());
    }

    #[test]
    fn a_bomb_is_refused() {
        let mut d = Deflater::new().unwrap();
        let zeros = vec![0u8; MAX_BLOCK * 4];
        let packed = d.compress(&zeros).unwrap();
        assert!(packed.len() < MAX_BLOCK / 4);
        let err = Inflater::new().decompress(&packed).unwrap_err();
        assert!(err.to_string().contains("inflates beyond"), "{err}");
    }
}
