//! Property tests over random frames and random bytes: the fast tier's
//! stand-in for the fuzz target (fuzz/fuzz_targets/spdy.rs), run by every
//! `cargo test --lib`.

use proptest::collection::vec;
use proptest::prelude::*;

use super::*;

fn block() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..64).prop_map(Bytes::from)
}

fn id31() -> impl Strategy<Value = u32> {
    0..=STREAM_ID_MASK
}

fn nonzero_id() -> impl Strategy<Value = u32> {
    1..=STREAM_ID_MASK
}

/// Frames as a peer may send them: fields within their wire widths,
/// nonzero stream ids where the protocol requires them.
fn frame() -> impl Strategy<Value = Frame> {
    let setting = (any::<u8>(), 0..=0x00FF_FFFFu32, any::<u32>())
        .prop_map(|(flags, id, value)| Setting { flags, id, value });
    prop_oneof![
        (id31(), any::<bool>(), block()).prop_map(|(stream_id, fin, data)| Frame::Data {
            stream_id,
            fin,
            data
        }),
        (
            nonzero_id(),
            id31(),
            0..=7u8,
            any::<u8>(),
            any::<bool>(),
            any::<bool>(),
            block()
        )
            .prop_map(
                |(stream_id, associated_to, priority, slot, fin, unidirectional, header_block)| {
                    Frame::SynStream {
                        stream_id,
                        associated_to,
                        priority,
                        slot,
                        fin,
                        unidirectional,
                        header_block,
                    }
                }
            ),
        (nonzero_id(), any::<bool>(), block()).prop_map(|(stream_id, fin, header_block)| {
            Frame::SynReply {
                stream_id,
                fin,
                header_block,
            }
        }),
        (nonzero_id(), any::<bool>(), block()).prop_map(|(stream_id, fin, header_block)| {
            Frame::Headers {
                stream_id,
                fin,
                header_block,
            }
        }),
        (id31(), any::<u32>())
            .prop_map(|(stream_id, status)| Frame::RstStream { stream_id, status }),
        (any::<bool>(), vec(setting, 0..8))
            .prop_map(|(clear, entries)| Frame::Settings { clear, entries }),
        any::<u32>().prop_map(|id| Frame::Ping { id }),
        (id31(), any::<u32>()).prop_map(|(last_good_stream_id, status)| Frame::GoAway {
            last_good_stream_id,
            status
        }),
        (id31(), id31()).prop_map(|(stream_id, delta)| Frame::WindowUpdate { stream_id, delta }),
        (
            any::<u16>().prop_filter("a type this framer knows", |k| {
                ![1, 2, 3, 4, 6, 7, 8, 9].contains(k)
            }),
            any::<u8>(),
            block()
        )
            .prop_map(|(kind, flags, payload)| Frame::Unknown {
                kind,
                flags,
                payload
            }),
    ]
}

/// The 24-bit length of an encoded frame.
fn wire_len(bytes: &[u8]) -> usize {
    usize::from(bytes[5]) << 16 | usize::from(bytes[6]) << 8 | usize::from(bytes[7])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Every frame decodes back to itself from exactly its own bytes,
    /// whose header names the payload's length.
    #[test]
    fn frames_round_trip(f in frame()) {
        let bytes = enc(&f);
        prop_assert_eq!(wire_len(&bytes), bytes.len() - HEADER_LEN);
        let control = !matches!(f, Frame::Data { .. });
        prop_assert_eq!(bytes[0] & 0x80 != 0, control);
        let mut buf = BytesMut::from(&bytes[..]);
        prop_assert_eq!(decode(&mut buf, MAX_PAYLOAD), Ok(Some(f)));
        prop_assert!(buf.is_empty());
    }

    /// A run of frames cut at arbitrary points (as reads arrive)
    /// decodes to the same frames; an incomplete frame consumes nothing.
    #[test]
    fn frames_survive_any_chunking(
        frames in vec(frame(), 1..6),
        cuts in vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let mut wire = BytesMut::new();
        for f in &frames {
            encode(f, &mut wire).expect("encode");
        }
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
        points.push(wire.len());
        points.sort_unstable();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut from = 0;
        for to in points {
            buf.extend_from_slice(&wire[from..to]);
            from = to;
            loop {
                let before = buf.len();
                match decode(&mut buf, MAX_PAYLOAD) {
                    Ok(Some(f)) => got.push(f),
                    Ok(None) => {
                        prop_assert_eq!(buf.len(), before);
                        break;
                    }
                    Err(e) => prop_assert!(false, "{e}"),
                }
            }
        }
        prop_assert_eq!(got, frames);
        prop_assert!(buf.is_empty());
    }

    /// Arbitrary bytes never panic the decoder. What it accepts took
    /// exactly one frame's bytes and re-encodes to a frame that decodes
    /// to itself; what it leaves for later consumed nothing; a limit is
    /// enforced from the header alone.
    #[test]
    fn arbitrary_bytes_decode_or_are_refused(
        bytes in vec(any::<u8>(), 0..96),
        limit in prop_oneof![Just(MAX_PAYLOAD), 0..64usize],
    ) {
        let mut buf = BytesMut::from(&bytes[..]);
        match decode(&mut buf, limit) {
            Ok(Some(f)) => {
                let len = wire_len(&bytes);
                prop_assert!(len <= limit);
                prop_assert_eq!(buf.len(), bytes.len() - HEADER_LEN - len);
                let again = enc(&f);
                prop_assert_eq!(dec(&again), Ok(Some(f)));
            }
            Ok(None) => {
                prop_assert_eq!(&buf[..], &bytes[..]);
                if bytes.len() >= HEADER_LEN {
                    prop_assert!(wire_len(&bytes) <= limit);
                    prop_assert!(bytes.len() < HEADER_LEN + wire_len(&bytes));
                }
            }
            Err(FrameError::TooLarge { len, limit: l }) => {
                prop_assert_eq!(l, limit);
                prop_assert_eq!(len, wire_len(&bytes));
                prop_assert!(len > limit);
            }
            Err(e) => {
                // Only control frames can be malformed.
                prop_assert!(bytes[0] & 0x80 != 0, "{e} for a data frame");
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}
