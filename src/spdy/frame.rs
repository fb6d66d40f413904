//! SPDY/3.1 frames, decoded from and encoded into byte buffers. Pure: no
//! I/O and no header compression (header blocks stay compressed bytes here;
//! [`super::headers`] inflates and deflates them).
//!
//! Layout (all integers big-endian):
//!
//! ```text
//! control: |1| version:15 | type:16 | flags:8 | length:24 | payload…
//! data:    |0| stream-id:31         | flags:8 | length:24 | data…
//! ```

use bytes::{Buf, BufMut, Bytes, BytesMut};
use thiserror::Error;

/// The only version spoken.
pub const VERSION: u16 = 3;
/// The largest payload a frame's 24-bit length can name.
pub const MAX_PAYLOAD: usize = 0xFF_FFFF;
/// Bytes before every frame's payload.
pub const HEADER_LEN: usize = 8;

/// `FLAG_FIN`: the sender's last frame on the stream.
pub const FLAG_FIN: u8 = 0x01;
/// `FLAG_UNIDIRECTIONAL` on SYN_STREAM: the receiver may not send.
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;
/// `FLAG_SETTINGS_CLEAR_SETTINGS` on SETTINGS.
pub const FLAG_CLEAR_SETTINGS: u8 = 0x01;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// RST_STREAM status codes.
pub mod rst {
    pub const PROTOCOL_ERROR: u32 = 1;
    pub const INVALID_STREAM: u32 = 2;
    pub const REFUSED_STREAM: u32 = 3;
    pub const UNSUPPORTED_VERSION: u32 = 4;
    pub const CANCEL: u32 = 5;
    pub const INTERNAL_ERROR: u32 = 6;
    pub const FLOW_CONTROL_ERROR: u32 = 7;
    pub const STREAM_IN_USE: u32 = 8;
    pub const STREAM_ALREADY_CLOSED: u32 = 9;
    pub const FRAME_TOO_LARGE: u32 = 11;
}

/// GOAWAY status codes.
pub mod goaway {
    pub const OK: u32 = 0;
    pub const PROTOCOL_ERROR: u32 = 1;
    pub const INTERNAL_ERROR: u32 = 2;
}

/// One SETTINGS entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    pub flags: u8,
    pub id: u32,
    pub value: u32,
}

/// A frame. Header blocks are the compressed bytes as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Data {
        stream_id: u32,
        fin: bool,
        data: Bytes,
    },
    SynStream {
        stream_id: u32,
        associated_to: u32,
        /// 0 (highest) to 7.
        priority: u8,
        slot: u8,
        fin: bool,
        unidirectional: bool,
        header_block: Bytes,
    },
    SynReply {
        stream_id: u32,
        fin: bool,
        header_block: Bytes,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings {
        clear: bool,
        entries: Vec<Setting>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        fin: bool,
        header_block: Bytes,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    /// A control frame type this framer does not know; the protocol says to
    /// ignore it.
    Unknown {
        kind: u16,
        flags: u8,
        payload: Bytes,
    },
}

/// Why bytes are not a valid frame (a session-level protocol error).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    #[error("control frame of SPDY version {0}; only version 3 is spoken")]
    UnsupportedVersion(u16),
    #[error("frame of {len} bytes is over the {limit}-byte limit")]
    TooLarge { len: usize, limit: usize },
    #[error("{kind} frame of {len} bytes; it must be {expected}")]
    BadLength {
        kind: &'static str,
        len: usize,
        expected: &'static str,
    },
    #[error("{0} frame names stream 0")]
    StreamZero(&'static str),
    #[error("header block: {0}")]
    HeaderBlock(String),
}

const STREAM_ID_MASK: u32 = 0x7FFF_FFFF;

fn stream_id(raw: u32) -> u32 {
    raw & STREAM_ID_MASK
}

fn bad_len(kind: &'static str, len: usize, expected: &'static str) -> FrameError {
    FrameError::BadLength {
        kind,
        len,
        expected,
    }
}

/// The payload length a frame header names (its 24-bit length field);
/// `buf` holds at least the header.
fn payload_len(buf: &[u8]) -> usize {
    usize::from(buf[5]) << 16 | usize::from(buf[6]) << 8 | usize::from(buf[7])
}

/// How many more bytes `buf` needs before [`decode`] can take a frame off
/// it: what is missing of the next frame's header, or, once the header is
/// in, of its payload (0 when a whole frame is there).
pub fn missing(buf: &[u8]) -> usize {
    if buf.len() < HEADER_LEN {
        return HEADER_LEN - buf.len();
    }
    let len = payload_len(buf);
    (HEADER_LEN + len).saturating_sub(buf.len())
}

/// Take one frame off the front of `buf`. `Ok(None)` when `buf` holds no
/// whole frame yet (nothing is consumed). A frame whose payload is over
/// `limit` bytes is an error as soon as its header is in, so a peer cannot
/// make the reader buffer it.
pub fn decode(buf: &mut BytesMut, limit: usize) -> Result<Option<Frame>, FrameError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let word = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let flags = buf[4];
    let len = payload_len(buf);
    if len > limit {
        return Err(FrameError::TooLarge { len, limit });
    }
    if buf.len() < HEADER_LEN + len {
        // The caller makes room ([`missing`] says how much): reserving here
        // would allocate a new block while frames cut from this one are
        // still in use.
        return Ok(None);
    }
    buf.advance(HEADER_LEN);
    let mut payload = buf.split_to(len).freeze();
    let control = word & 0x8000_0000 != 0;
    if !control {
        return Ok(Some(Frame::Data {
            stream_id: stream_id(word),
            fin: flags & FLAG_FIN != 0,
            data: payload,
        }));
    }
    // The top bit is the control bit: what is left fits 15 bits.
    let version = ((word >> 16) & 0x7FFF) as u16;
    let kind = (word & 0xFFFF) as u16;
    if version != VERSION {
        return Err(FrameError::UnsupportedVersion(version));
    }
    let fin = flags & FLAG_FIN != 0;
    let frame = match kind {
        SYN_STREAM => {
            if len < 10 {
                return Err(bad_len("SYN_STREAM", len, "at least 10"));
            }
            let id = stream_id(payload.get_u32());
            let associated_to = stream_id(payload.get_u32());
            let priority = payload.get_u8() >> 5;
            let slot = payload.get_u8();
            if id == 0 {
                return Err(FrameError::StreamZero("SYN_STREAM"));
            }
            Frame::SynStream {
                stream_id: id,
                associated_to,
                priority,
                slot,
                fin,
                unidirectional: flags & FLAG_UNIDIRECTIONAL != 0,
                header_block: payload,
            }
        }
        SYN_REPLY | HEADERS => {
            let name = if kind == SYN_REPLY {
                "SYN_REPLY"
            } else {
                "HEADERS"
            };
            if len < 4 {
                return Err(bad_len(name, len, "at least 4"));
            }
            let id = stream_id(payload.get_u32());
            if id == 0 {
                return Err(FrameError::StreamZero(name));
            }
            if kind == SYN_REPLY {
                Frame::SynReply {
                    stream_id: id,
                    fin,
                    header_block: payload,
                }
            } else {
                Frame::Headers {
                    stream_id: id,
                    fin,
                    header_block: payload,
                }
            }
        }
        RST_STREAM => {
            if len != 8 {
                return Err(bad_len("RST_STREAM", len, "8"));
            }
            Frame::RstStream {
                stream_id: stream_id(payload.get_u32()),
                status: payload.get_u32(),
            }
        }
        SETTINGS => {
            if len < 4 {
                return Err(bad_len("SETTINGS", len, "at least 4"));
            }
            let count = payload.get_u32() as usize;
            if count.checked_mul(8) != Some(len - 4) {
                return Err(bad_len("SETTINGS", len, "4 + 8 per entry"));
            }
            let entries = (0..count)
                .map(|_| {
                    let word = payload.get_u32();
                    Setting {
                        flags: (word >> 24) as u8,
                        id: word & 0x00FF_FFFF,
                        value: payload.get_u32(),
                    }
                })
                .collect();
            Frame::Settings {
                clear: flags & FLAG_CLEAR_SETTINGS != 0,
                entries,
            }
        }
        PING => {
            if len != 4 {
                return Err(bad_len("PING", len, "4"));
            }
            Frame::Ping {
                id: payload.get_u32(),
            }
        }
        GOAWAY => {
            if len != 8 {
                return Err(bad_len("GOAWAY", len, "8"));
            }
            Frame::GoAway {
                last_good_stream_id: stream_id(payload.get_u32()),
                status: payload.get_u32(),
            }
        }
        WINDOW_UPDATE => {
            if len != 8 {
                return Err(bad_len("WINDOW_UPDATE", len, "8"));
            }
            Frame::WindowUpdate {
                stream_id: stream_id(payload.get_u32()),
                delta: payload.get_u32() & STREAM_ID_MASK,
            }
        }
        other => Frame::Unknown {
            kind: other,
            flags,
            payload,
        },
    };
    Ok(Some(frame))
}

fn control_header(out: &mut BytesMut, kind: u16, flags: u8, len: usize) {
    out.put_u16(0x8000 | VERSION);
    out.put_u16(kind);
    out.put_u8(flags);
    // Callers checked len <= MAX_PAYLOAD: it fits 24 bits.
    out.put_uint(len as u64, 3);
}

fn checked(len: usize) -> Result<usize, FrameError> {
    if len > MAX_PAYLOAD {
        return Err(FrameError::TooLarge {
            len,
            limit: MAX_PAYLOAD,
        });
    }
    Ok(len)
}

fn flag(on: bool, bit: u8) -> u8 {
    if on { bit } else { 0 }
}

/// Append `frame` to `out`. A payload over [`MAX_PAYLOAD`] is an error
/// (callers cut data into smaller frames).
pub fn encode(frame: &Frame, out: &mut BytesMut) -> Result<(), FrameError> {
    match frame {
        Frame::Data {
            stream_id,
            fin,
            data,
        } => {
            let len = checked(data.len())?;
            out.reserve(HEADER_LEN + len);
            out.put_u32(stream_id & STREAM_ID_MASK);
            out.put_u8(flag(*fin, FLAG_FIN));
            out.put_uint(len as u64, 3);
            out.put_slice(data);
        }
        Frame::SynStream {
            stream_id,
            associated_to,
            priority,
            slot,
            fin,
            unidirectional,
            header_block,
        } => {
            let len = checked(10 + header_block.len())?;
            let flags = flag(*fin, FLAG_FIN) | flag(*unidirectional, FLAG_UNIDIRECTIONAL);
            control_header(out, SYN_STREAM, flags, len);
            out.put_u32(stream_id & STREAM_ID_MASK);
            out.put_u32(associated_to & STREAM_ID_MASK);
            out.put_u8((priority & 0x7) << 5);
            out.put_u8(*slot);
            out.put_slice(header_block);
        }
        Frame::SynReply {
            stream_id,
            fin,
            header_block,
        }
        | Frame::Headers {
            stream_id,
            fin,
            header_block,
        } => {
            let kind = if matches!(frame, Frame::SynReply { .. }) {
                SYN_REPLY
            } else {
                HEADERS
            };
            let len = checked(4 + header_block.len())?;
            control_header(out, kind, flag(*fin, FLAG_FIN), len);
            out.put_u32(stream_id & STREAM_ID_MASK);
            out.put_slice(header_block);
        }
        Frame::RstStream { stream_id, status } => {
            control_header(out, RST_STREAM, 0, 8);
            out.put_u32(stream_id & STREAM_ID_MASK);
            out.put_u32(*status);
        }
        Frame::Settings { clear, entries } => {
            let len = checked(4 + entries.len().saturating_mul(8))?;
            control_header(out, SETTINGS, flag(*clear, FLAG_CLEAR_SETTINGS), len);
            // len fits 24 bits, so the count fits 32.
            out.put_u32(entries.len() as u32);
            for s in entries {
                out.put_u32(u32::from(s.flags) << 24 | (s.id & 0x00FF_FFFF));
                out.put_u32(s.value);
            }
        }
        Frame::Ping { id } => {
            control_header(out, PING, 0, 4);
            out.put_u32(*id);
        }
        Frame::GoAway {
            last_good_stream_id,
            status,
        } => {
            control_header(out, GOAWAY, 0, 8);
            out.put_u32(last_good_stream_id & STREAM_ID_MASK);
            out.put_u32(*status);
        }
        Frame::WindowUpdate { stream_id, delta } => {
            control_header(out, WINDOW_UPDATE, 0, 8);
            out.put_u32(stream_id & STREAM_ID_MASK);
            out.put_u32(delta & STREAM_ID_MASK);
        }
        Frame::Unknown {
            kind,
            flags,
            payload,
        } => {
            control_header(out, *kind, *flags, checked(payload.len())?);
            out.put_slice(payload);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
