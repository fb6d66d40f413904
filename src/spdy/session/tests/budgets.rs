//! What a peer can make a session hold: byte budgets per stream and per
//! session, frame costs, the stream limit, resets that leave nothing behind.

use super::*;

/// Finding 5(a) of the 2026-12-b review: every RST_STREAM used to leave its
/// id in a set the writer never pruned (one `Forget` message each, 1
/// entry each). Now an unknown id costs nothing, and a known one only its
/// stream's flag.
#[tokio::test]
async fn a_flood_of_resets_leaves_nothing_behind() {
    let (mut r, mut out) = bare_reader_seen(Limits::default());
    for i in 0..100_000u32 {
        r.handle(Frame::RstStream {
            stream_id: 2 * i + 1_000_001,
            status: rst::CANCEL,
        })
        .await
        .unwrap();
    }
    assert!(
        out.try_recv().is_err(),
        "nothing is queued for the writer for ids never opened"
    );
    assert!(r.open.is_empty() && r.live.is_empty());
    // Opened streams reset by the peer, their handlers gone: the tables
    // stay small, and each reset queues nothing either.
    let (held_tx, mut held_rx) = mpsc::channel::<Stream>(8);
    r.streams = held_tx;
    for i in 0..10_000u32 {
        let id = 2 * i + 1;
        r.open_stream(id, false, Headers::default()).await;
        drop(held_rx.recv().await);
        r.handle(Frame::RstStream {
            stream_id: id,
            status: rst::CANCEL,
        })
        .await
        .unwrap();
    }
    assert!(
        r.open.len() + r.live.len() <= 64,
        "{}",
        r.open.len() + r.live.len()
    );
    let mut replies = 0;
    while let Ok(m) = out.try_recv() {
        assert!(matches!(m, Outbound::Reply { .. }), "{m:?}");
        replies += 1;
    }
    assert_eq!(
        replies, 10_000,
        "one SYN_REPLY per stream, nothing per reset"
    );
}

/// The same through a whole session: a million resets for ids never
/// opened, then the session still answers, and its streams still work.
#[tokio::test]
async fn a_session_takes_a_million_resets_and_goes_on() {
    let (mut peer, session, mut streams) = pair();
    let mut frames = BytesMut::new();
    for i in 0..1_000_000u32 {
        frame::encode(
            &Frame::RstStream {
                stream_id: 2 * i + 101,
                status: rst::CANCEL,
            },
            &mut frames,
        )
        .unwrap();
        if frames.len() >= 64 * 1024 {
            peer.io.write_all(&frames).await.unwrap();
            frames.clear();
        }
    }
    peer.io.write_all(&frames).await.unwrap();
    peer.send(Frame::Ping { id: 3 }).await;
    assert_eq!(peer.recv().await, Some(Frame::Ping { id: 3 }));
    peer.open(1, &[], false).await;
    let s = next_stream(&mut streams).await;
    let _ = peer.recv().await;
    s.writer.write(Bytes::from_static(b"ok")).await.unwrap();
    assert!(matches!(peer.recv().await, Some(Frame::Data { .. })));
    assert!(!session.has_ended());
}

/// Finding 5(b): a stream whose handler does not read holds at most its
/// byte budget, whatever the frames' size (it held 16 frames of up to
/// 1 MiB each). Measured from the peer's side: what the session took
/// before the peer's writes stopped.
#[tokio::test]
async fn a_stream_nobody_reads_takes_at_most_its_byte_budget() {
    let frame_len = 64 * 1024;
    let pipe = frame_len + 64;
    let (a, b) = tokio::io::duplex(pipe);
    let limits = Limits::default();
    let stats = Arc::clone(&limits.stats);
    let (_session, mut streams) = start_with(b, limits);
    let mut peer = Peer::new(a);
    peer.open(1, &[], false).await;
    let s = next_stream(&mut streams).await;
    let _ = peer.recv().await;
    let mut sent = 0usize;
    let data = vec![7u8; frame_len];
    loop {
        let f = Frame::Data {
            stream_id: 1,
            fin: false,
            data: Bytes::copy_from_slice(&data),
        };
        let mut out = BytesMut::new();
        frame::encode(&f, &mut out).unwrap();
        match tokio::time::timeout(Duration::from_millis(300), peer.io.write_all(&out)).await {
            Ok(r) => r.unwrap(),
            Err(_) => break,
        }
        sent += frame_len;
        assert!(sent < 64 * 1024 * 1024, "the session never pushed back");
    }
    // The budget, one frame waiting for room in the reader, one partly in
    // the pipe.
    let budget = 256 * 1024;
    assert!(
        sent <= budget + 2 * frame_len + pipe,
        "took {sent} bytes for a stream nobody reads"
    );
    let queued = stats.queued_bytes();
    assert!(queued > 0 && queued <= budget as i64, "{queued}");
    drop(s);
    wait_for(|| stats.queued_bytes() == 0).await;
}

/// Tiny frames are charged for what they hold, so a flood of them stops at
/// the budget as well (in frames: budget / (1 + FRAME_COST)).
#[tokio::test]
async fn tiny_frames_are_charged_their_cost() {
    let limits = Limits {
        stream_bytes: 200 * 1024,
        ..Limits::default()
    };
    let stats = Arc::clone(&limits.stats);
    let (r, _out) = bare_reader_seen(limits);
    let mut r = r;
    let (held_tx, mut held_rx) = mpsc::channel::<Stream>(8);
    r.streams = held_tx;
    r.open_stream(1, false, Headers::default()).await;
    let mut s = held_rx.recv().await.unwrap();
    let mut queued = 0;
    loop {
        let fed = tokio::time::timeout(
            Duration::from_millis(100),
            r.data(1, false, Bytes::from_static(b"x")),
        )
        .await;
        if fed.is_err() {
            break;
        }
        queued += 1;
        assert!(queued < 1_000_000, "never pushed back");
    }
    let limit = (200 * 1024) / charge(1);
    assert!(
        (limit - 1..=limit).contains(&queued),
        "{queued} one-byte frames queued, want about {limit}"
    );
    assert_eq!(stats.queued_bytes(), (queued * charge(1)) as i64);
    // Taking one frame frees its charge at the next call, so one more fits.
    assert_eq!(s.reader.next().await, Ok(Bytes::from_static(b"x")));
    assert_eq!(
        stats.queued_bytes(),
        (queued * charge(1)) as i64,
        "still held"
    );
    assert_eq!(s.reader.next().await, Ok(Bytes::from_static(b"x")));
    tokio::time::timeout(
        Duration::from_secs(5),
        r.data(1, false, Bytes::from_static(b"y")),
    )
    .await
    .expect("room again");
}

/// The session's budget is shared: streams that each stay within their
/// own still stop the reader once the session's is spent.
#[tokio::test]
async fn the_session_budget_bounds_all_streams_together() {
    let limits = Limits {
        stream_bytes: 300 * 1024,
        session_bytes: 400 * 1024,
        ..Limits::default()
    };
    let stats = Arc::clone(&limits.stats);
    let (mut r, _out) = bare_reader_seen(limits);
    let (held_tx, mut held_rx) = mpsc::channel::<Stream>(8);
    r.streams = held_tx;
    let mut held = Vec::new();
    for id in [1, 3] {
        r.open_stream(id, false, Headers::default()).await;
        held.push(held_rx.recv().await.unwrap());
    }
    let frame = Bytes::from(vec![1u8; 64 * 1024]);
    let mut fed = 0;
    'outer: for _ in 0..10 {
        for id in [1, 3] {
            let r =
                tokio::time::timeout(Duration::from_millis(100), r.data(id, false, frame.clone()))
                    .await;
            if r.is_err() {
                break 'outer;
            }
            fed += 1;
        }
    }
    assert_eq!(fed, 400 * 1024 / charge(64 * 1024), "frames taken");
    assert!(stats.queued_bytes() <= 400 * 1024);
    // A stream's handler letting go gives its share back at once.
    drop(held.remove(0));
    tokio::time::timeout(Duration::from_secs(5), r.data(3, false, frame.clone()))
        .await
        .expect("room after the other stream is gone");
}

/// Finding 5: streams held at once are capped; the next is refused, and a
/// stream given up makes room.
#[tokio::test]
async fn streams_over_the_limit_are_refused() {
    let limits = Limits {
        max_streams: 2,
        ..Limits::default()
    };
    let stats = Arc::clone(&limits.stats);
    let (a, b) = tokio::io::duplex(1 << 20);
    let (session, mut streams) = start_with(b, limits);
    let mut peer = Peer::new(a);
    peer.open(1, &[], false).await;
    let s1 = next_stream(&mut streams).await;
    peer.open(3, &[], false).await;
    let _s3 = next_stream(&mut streams).await;
    assert_eq!(session.open_streams(), 2);
    peer.open(5, &[], false).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(peer.recv().await.unwrap());
    }
    assert_eq!(
        seen[2],
        Frame::RstStream {
            stream_id: 5,
            status: rst::REFUSED_STREAM
        }
    );
    assert_eq!(
        stats.refusals(crate::stream_stats::Refusal::SessionStreams),
        1
    );
    drop(s1);
    assert_eq!(session.open_streams(), 1);
    peer.open(7, &[], false).await;
    let s7 = next_stream(&mut streams).await;
    assert_eq!(s7.id, 7);
    assert_eq!(stats.streams(), 2);
}

/// Small frames are copied out of the read block (a slice would keep the
/// whole block alive); frames of COPY_BELOW bytes or more stay slices.
#[tokio::test]
async fn small_frames_are_copied_and_large_ones_kept_as_slices() {
    let (mut r, _out) = bare_reader_seen(Limits::default());
    let (held_tx, mut held_rx) = mpsc::channel::<Stream>(8);
    r.streams = held_tx;
    r.open_stream(1, false, Headers::default()).await;
    let mut s = held_rx.recv().await.unwrap();
    let block = Bytes::from(vec![3u8; 2 * COPY_BELOW]);
    let small = block.slice(0..COPY_BELOW - 1);
    let large = block.slice(COPY_BELOW..2 * COPY_BELOW);
    r.data(1, false, small.clone()).await;
    r.data(1, false, large.clone()).await;
    let got_small = s.reader.next().await.unwrap();
    let got_large = s.reader.next().await.unwrap();
    assert_eq!(
        (got_small.len(), got_large.len()),
        (COPY_BELOW - 1, COPY_BELOW)
    );
    assert_ne!(got_small.as_ptr(), small.as_ptr(), "copied");
    assert_eq!(got_large.as_ptr(), large.as_ptr(), "the same slice");
}

/// Budgets below one largest frame are raised to it (a frame must always
/// fit), and a session's to at least a stream's.
#[tokio::test]
async fn budgets_too_small_for_a_frame_are_raised() {
    let limits = Limits {
        stream_bytes: 1,
        session_bytes: 1,
        ..Limits::default()
    };
    let stats = Arc::clone(&limits.stats);
    let (a, b) = tokio::io::duplex(1 << 20);
    let (_session, mut streams) = start_with(b, limits);
    let mut peer = Peer::new(a);
    peer.open(1, &[], false).await;
    let mut s = next_stream(&mut streams).await;
    peer.data(1, &vec![1u8; MAX_INBOUND_FRAME], false).await;
    assert_eq!(
        s.reader.next().await.map(|d| d.len()),
        Ok(MAX_INBOUND_FRAME)
    );
    peer.data(1, &vec![1u8; MAX_INBOUND_FRAME], false).await;
    assert_eq!(
        s.reader.next().await.map(|d| d.len()),
        Ok(MAX_INBOUND_FRAME)
    );
    assert_eq!(stats.queued_bytes(), charge(MAX_INBOUND_FRAME) as i64);
}

/// A handler that lets go of its stream while the reader waits for room
/// on it frees the reader (its data is dropped), and all its charge.
#[tokio::test]
async fn a_stream_let_go_of_frees_the_waiting_reader() {
    let limits = Limits {
        stream_bytes: 2 * charge(MAX_INBOUND_FRAME),
        ..Limits::default()
    };
    let stats = Arc::clone(&limits.stats);
    let (mut r, _out) = bare_reader_seen(limits);
    let (held_tx, mut held_rx) = mpsc::channel::<Stream>(8);
    r.streams = held_tx;
    r.open_stream(1, false, Headers::default()).await;
    let s = held_rx.recv().await.unwrap();
    let frame = Bytes::from(vec![0u8; MAX_INBOUND_FRAME]);
    r.data(1, false, frame.clone()).await;
    r.data(1, false, frame.clone()).await;
    let waiting = r.data(1, false, frame.clone());
    tokio::pin!(waiting);
    assert!(
        tokio::time::timeout(Duration::from_millis(100), &mut waiting)
            .await
            .is_err(),
        "the stream is full"
    );
    drop(s);
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("freed");
    assert_eq!(stats.queued_bytes(), 0);
    assert_eq!(stats.streams(), 0);
}
