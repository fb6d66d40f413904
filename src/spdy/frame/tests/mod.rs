use super::*;

fn enc(f: &Frame) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode(f, &mut out).expect("encode");
    out.to_vec()
}

fn dec(bytes: &[u8]) -> Result<Option<Frame>, FrameError> {
    decode(&mut BytesMut::from(bytes), MAX_PAYLOAD)
}

fn every_kind() -> Vec<Frame> {
    vec![
        Frame::Data {
            stream_id: 7,
            fin: true,
            data: Bytes::from_static(b"hello"),
        },
        Frame::Data {
            stream_id: 0x7FFF_FFFF,
            fin: false,
            data: Bytes::new(),
        },
        Frame::SynStream {
            stream_id: 1,
            associated_to: 0,
            priority: 7,
            slot: 0,
            fin: false,
            unidirectional: true,
            header_block: Bytes::from_static(b"\x78\xbb"),
        },
        Frame::SynReply {
            stream_id: 3,
            fin: true,
            header_block: Bytes::from_static(b"abc"),
        },
        Frame::RstStream {
            stream_id: 5,
            status: rst::CANCEL,
        },
        Frame::Settings {
            clear: true,
            entries: vec![
                Setting {
                    flags: 1,
                    id: 7,
                    value: 65536,
                },
                Setting {
                    flags: 0,
                    id: 0xFF_FFFF,
                    value: 0,
                },
            ],
        },
        Frame::Ping { id: 0xFFFF_FFFF },
        Frame::GoAway {
            last_good_stream_id: 9,
            status: goaway::PROTOCOL_ERROR,
        },
        Frame::Headers {
            stream_id: 11,
            fin: false,
            header_block: Bytes::new(),
        },
        Frame::WindowUpdate {
            stream_id: 13,
            delta: 0x7FFF_FFFF,
        },
        Frame::Unknown {
            kind: 5,
            flags: 0x42,
            payload: Bytes::from_static(b"noop"),
        },
    ]
}

#[test]
fn every_kind_round_trips() {
    for f in every_kind() {
        let bytes = enc(&f);
        assert_eq!(dec(&bytes).unwrap(), Some(f.clone()), "{f:?}");
    }
}

#[test]
fn wire_bytes_as_the_protocol_lays_them_out() {
    assert_eq!(
        enc(&Frame::Ping { id: 1 }),
        [0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]
    );
    assert_eq!(
        enc(&Frame::Data {
            stream_id: 3,
            fin: true,
            data: Bytes::from_static(b"ab"),
        }),
        [0, 0, 0, 3, 1, 0, 0, 2, b'a', b'b']
    );
    assert_eq!(
        enc(&Frame::SynStream {
            stream_id: 1,
            associated_to: 0,
            priority: 2,
            slot: 0,
            fin: true,
            unidirectional: false,
            header_block: Bytes::from_static(b"H"),
        }),
        [
            0x80, 3, 0, 1, 1, 0, 0, 11, 0, 0, 0, 1, 0, 0, 0, 0, 0x40, 0, b'H'
        ]
    );
    assert_eq!(
        enc(&Frame::RstStream {
            stream_id: 1,
            status: rst::REFUSED_STREAM
        }),
        [0x80, 3, 0, 3, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 3]
    );
    assert_eq!(
        enc(&Frame::GoAway {
            last_good_stream_id: 2,
            status: 0
        }),
        [0x80, 3, 0, 7, 0, 0, 0, 8, 0, 0, 0, 2, 0, 0, 0, 0]
    );
}

#[test]
fn reserved_bits_are_ignored_on_read() {
    // X bit set on the stream ids of a SYN_STREAM, unused priority bits set.
    let bytes = [
        0x80, 3, 0, 1, 0, 0, 0, 10, 0x80, 0, 0, 1, 0x80, 0, 0, 2, 0xFF, 9,
    ];
    assert_eq!(
        dec(&bytes).unwrap(),
        Some(Frame::SynStream {
            stream_id: 1,
            associated_to: 2,
            priority: 7,
            slot: 9,
            fin: false,
            unidirectional: false,
            header_block: Bytes::new(),
        })
    );
}

#[test]
fn partial_input_waits_and_consumes_nothing() {
    let bytes = enc(&Frame::Data {
        stream_id: 1,
        fin: false,
        data: Bytes::from_static(b"0123456789"),
    });
    for cut in 0..bytes.len() {
        let mut buf = BytesMut::from(&bytes[..cut]);
        assert_eq!(decode(&mut buf, MAX_PAYLOAD).unwrap(), None, "cut {cut}");
        assert_eq!(buf.len(), cut);
    }
}

#[test]
fn back_to_back_frames_decode_one_at_a_time() {
    let mut buf = BytesMut::new();
    let frames = every_kind();
    for f in &frames {
        encode(f, &mut buf).unwrap();
    }
    for f in &frames {
        assert_eq!(decode(&mut buf, MAX_PAYLOAD).unwrap().as_ref(), Some(f));
    }
    assert!(buf.is_empty());
    assert_eq!(decode(&mut buf, MAX_PAYLOAD).unwrap(), None);
}

#[test]
fn an_oversized_frame_is_refused_from_its_header() {
    let mut buf = BytesMut::from(&[0, 0, 0, 1, 0, 0x01, 0, 1][..]);
    assert_eq!(
        decode(&mut buf, 65536),
        Err(FrameError::TooLarge {
            len: 65537,
            limit: 65536
        })
    );
    let mut at_limit = BytesMut::from(&[0, 0, 0, 1, 0, 0x01, 0, 0][..]);
    assert_eq!(decode(&mut at_limit, 65536), Ok(None));
    let big = Frame::Data {
        stream_id: 1,
        fin: false,
        data: Bytes::from(vec![0; MAX_PAYLOAD + 1]),
    };
    assert!(matches!(
        encode(&big, &mut BytesMut::new()),
        Err(FrameError::TooLarge { .. })
    ));
    let most = Frame::Data {
        stream_id: 1,
        fin: false,
        data: Bytes::from(vec![0; MAX_PAYLOAD]),
    };
    assert_eq!(dec(&enc(&most)).unwrap(), Some(most));
}

#[test]
fn malformed_control_frames_are_errors() {
    let cases: [(&[u8], &str); 10] = [
        (&[0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1], "version 2"),
        (&[0x80, 3, 0, 6, 0, 0, 0, 3, 0, 0, 0], "PING of 3"),
        (&[0x80, 3, 0, 6, 0, 0, 0, 5, 0, 0, 0, 0, 0], "PING of 5"),
        (&[0x80, 3, 0, 3, 0, 0, 0, 4, 0, 0, 0, 1], "RST of 4"),
        (&[0x80, 3, 0, 7, 0, 0, 0, 4, 0, 0, 0, 1], "GOAWAY of 4"),
        (
            &[0x80, 3, 0, 9, 0, 0, 0, 4, 0, 0, 0, 1],
            "WINDOW_UPDATE of 4",
        ),
        (
            &[0x80, 3, 0, 4, 0, 0, 0, 4, 0, 0, 0, 1],
            "SETTINGS count 1, no entry",
        ),
        (
            &[0x80, 3, 0, 1, 0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 0, 0],
            "SYN_STREAM of 9",
        ),
        (
            &[0x80, 3, 0, 1, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            "SYN_STREAM for stream 0",
        ),
        (
            &[0x80, 3, 0, 2, 0, 0, 0, 4, 0, 0, 0, 0],
            "SYN_REPLY for stream 0",
        ),
    ];
    for (bytes, what) in cases {
        assert!(dec(bytes).is_err(), "{what} accepted");
    }
    assert!(dec(&[0x80, 3, 0, 2, 0, 0, 0, 3, 0, 0, 0]).is_err());
    assert!(dec(&[0x80, 3, 0, 8, 0, 0, 0, 0]).is_err());
    assert!(dec(&[0x80, 3, 0, 4, 0, 0, 0, 0]).is_err());
    assert_eq!(
        dec(&[0x80, 3, 0, 4, 0, 0, 0, 4, 0, 0, 0, 0]).unwrap(),
        Some(Frame::Settings {
            clear: false,
            entries: vec![]
        })
    );
    assert!(matches!(
        dec(&[
            0x80, 3, 0, 4, 0, 0, 0, 12, 0x20, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0
        ]),
        Err(FrameError::BadLength { .. })
    ));
}

#[test]
fn errors_name_the_problem() {
    let e = dec(&[0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "control frame of SPDY version 2; only version 3 is spoken"
    );
    let e = dec(&[0x80, 3, 0, 6, 0, 0, 0, 3, 0, 0, 0]).unwrap_err();
    assert_eq!(e.to_string(), "PING frame of 3 bytes; it must be 4");
}

#[test]
fn what_a_partial_frame_still_misses_is_known() {
    assert_eq!(missing(&[]), HEADER_LEN);
    assert_eq!(missing(&[0, 0, 0]), HEADER_LEN - 3);
    // The header names 1 byte of payload.
    assert_eq!(missing(&[0, 0, 0, 1, 0, 0, 0, 1]), 1);
    assert_eq!(missing(&[0, 0, 0, 1, 0, 0, 0, 1, 7]), 0);
    assert_eq!(
        missing(&[0, 0, 0, 1, 0, 0, 0, 1, 7, 8]),
        0,
        "more than a frame"
    );
    // 0x010203 bytes of payload, two of them in.
    assert_eq!(missing(&[0, 0, 0, 1, 0, 1, 2, 3, 1, 2]), 0x010203 - 2);
    // decode leaves a partial frame as it is.
    let mut buf = BytesMut::from(&[0, 0, 0, 1, 0, 0, 0x10, 0, 1, 2][..]);
    assert_eq!(decode(&mut buf, MAX_PAYLOAD), Ok(None));
    assert_eq!(buf.len(), 10);
    assert_eq!(missing(&buf), 0x1000 - 2);
}

#[test]
fn malformed_header_frames_name_their_kind() {
    let e = dec(&[0x80, 3, 0, 8, 0, 0, 0, 3, 0, 0, 0]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "HEADERS frame of 3 bytes; it must be at least 4"
    );
    let e = dec(&[0x80, 3, 0, 2, 0, 0, 0, 3, 0, 0, 0]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "SYN_REPLY frame of 3 bytes; it must be at least 4"
    );
    let e = dec(&[0x80, 3, 0, 8, 0, 0, 0, 4, 0, 0, 0, 0]).unwrap_err();
    assert_eq!(e, FrameError::StreamZero("HEADERS"));
    let e = dec(&[0x80, 3, 0, 2, 0, 0, 0, 4, 0, 0, 0, 0]).unwrap_err();
    assert_eq!(e, FrameError::StreamZero("SYN_REPLY"));
}

mod properties;
