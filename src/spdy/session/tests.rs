use std::time::Duration;

use super::*;
use crate::spdy::testing::Peer;

fn pair() -> (Peer, Session, mpsc::Receiver<Stream>) {
    let (a, b) = tokio::io::duplex(1 << 20);
    let (session, streams) = start(b);
    (Peer::new(a), session, streams)
}

async fn next_stream(streams: &mut mpsc::Receiver<Stream>) -> Stream {
    tokio::time::timeout(Duration::from_secs(10), streams.recv())
        .await
        .expect("a stream within 10 s")
        .expect("session alive")
}

#[tokio::test]
async fn a_stream_is_replied_to_then_carries_data_both_ways() {
    let (mut peer, _session, mut streams) = pair();
    peer.open(1, &[("streamType", "stdin"), ("x", "1")], false)
        .await;
    let mut s = next_stream(&mut streams).await;
    assert_eq!(s.id, 1);
    assert_eq!(s.headers.get("streamtype"), Some("stdin"));
    assert!(matches!(
        peer.recv().await,
        Some(Frame::SynReply {
            stream_id: 1,
            fin: false,
            ..
        })
    ));
    peer.data(1, b"ping", false).await;
    peer.data(1, b"", true).await;
    assert_eq!(s.reader.next().await, Ok(Bytes::from_static(b"ping")));
    assert_eq!(s.reader.next().await, Err(End::Fin));
    assert_eq!(s.reader.next().await, Err(End::Fin), "stays ended");
    s.writer.write(Bytes::from_static(b"pong")).await.unwrap();
    s.writer.finish().await.unwrap();
    assert_eq!(
        peer.recv().await,
        Some(Frame::Data {
            stream_id: 1,
            fin: false,
            data: Bytes::from_static(b"pong")
        })
    );
    assert_eq!(
        peer.recv().await,
        Some(Frame::Data {
            stream_id: 1,
            fin: true,
            data: Bytes::new()
        })
    );
}

#[tokio::test]
async fn many_streams_keep_one_compression_context() {
    let (mut peer, _session, mut streams) = pair();
    for i in 0..40u32 {
        let id = 2 * i + 1;
        let rid = i.to_string();
        peer.open(id, &[("streamType", "data"), ("requestID", &rid)], false)
            .await;
        let s = next_stream(&mut streams).await;
        assert_eq!(s.headers.get("requestid"), Some(rid.as_str()));
        assert!(
            matches!(peer.recv().await, Some(Frame::SynReply { stream_id, .. }) if stream_id == id)
        );
    }
}

#[tokio::test]
async fn client_pings_are_echoed_and_others_ignored() {
    let (mut peer, _session, _streams) = pair();
    peer.send(Frame::Ping { id: 2 }).await;
    peer.send(Frame::Settings {
        clear: false,
        entries: vec![],
    })
    .await;
    peer.send(Frame::WindowUpdate {
        stream_id: 0,
        delta: 10,
    })
    .await;
    peer.send(Frame::Ping { id: 7 }).await;
    assert_eq!(peer.recv().await, Some(Frame::Ping { id: 7 }));
}

#[tokio::test]
async fn a_reset_reaches_the_handler_and_silences_its_writes() {
    let (mut peer, _session, mut streams) = pair();
    peer.open(1, &[("streamType", "data")], false).await;
    let mut s = next_stream(&mut streams).await;
    let _ = peer.recv().await;
    peer.send(Frame::RstStream {
        stream_id: 1,
        status: rst::CANCEL,
    })
    .await;
    tokio::time::timeout(Duration::from_secs(10), s.writer.gone())
        .await
        .expect("gone after the reset");
    assert_eq!(s.reader.next().await, Err(End::Reset));
    assert_eq!(
        s.writer.write(Bytes::from_static(b"late")).await,
        Err(Closed)
    );
    // The session goes on: a new stream works and nothing of stream 1 comes.
    peer.open(3, &[("streamType", "data")], false).await;
    let s3 = next_stream(&mut streams).await;
    s3.writer.write(Bytes::from_static(b"x")).await.unwrap();
    assert!(matches!(
        peer.recv().await,
        Some(Frame::SynReply { stream_id: 3, .. })
    ));
    assert!(matches!(
        peer.recv().await,
        Some(Frame::Data { stream_id: 3, .. })
    ));
}

#[tokio::test]
async fn bad_stream_ids_are_refused_without_ending_the_session() {
    let (mut peer, session, mut streams) = pair();
    peer.open(2, &[], false).await;
    assert_eq!(
        peer.recv().await,
        Some(Frame::RstStream {
            stream_id: 2,
            status: rst::PROTOCOL_ERROR
        })
    );
    peer.open(5, &[], false).await;
    let _ = next_stream(&mut streams).await;
    let _ = peer.recv().await;
    peer.open(3, &[], false).await;
    assert_eq!(
        peer.recv().await,
        Some(Frame::RstStream {
            stream_id: 3,
            status: rst::PROTOCOL_ERROR
        })
    );
    assert!(!session.has_ended());
}

#[tokio::test]
async fn a_garbled_frame_ends_the_session_with_goaway() {
    let (mut peer, session, mut streams) = pair();
    peer.open(1, &[], false).await;
    let mut s = next_stream(&mut streams).await;
    let _ = peer.recv().await;
    // PING with a 3-byte payload.
    peer.io
        .write_all(&[0x80, 3, 0, 6, 0, 0, 0, 3, 0, 0, 0])
        .await
        .unwrap();
    assert_eq!(
        peer.recv().await,
        Some(Frame::GoAway {
            last_good_stream_id: 1,
            status: goaway::PROTOCOL_ERROR
        })
    );
    tokio::time::timeout(Duration::from_secs(10), session.ended())
        .await
        .expect("ended");
    assert_eq!(s.reader.next().await, Err(End::Reset));
    assert!(s.writer.is_gone());
}

#[tokio::test]
async fn a_peer_that_hangs_up_ends_every_stream() {
    let (mut peer, session, mut streams) = pair();
    peer.open(1, &[], false).await;
    let mut s = next_stream(&mut streams).await;
    peer.data(1, b"partial", false).await;
    drop(peer);
    assert_eq!(s.reader.next().await, Ok(Bytes::from_static(b"partial")));
    assert_eq!(s.reader.next().await, Err(End::Reset));
    tokio::time::timeout(Duration::from_secs(10), session.ended())
        .await
        .expect("ended");
    assert!(streams.recv().await.is_none());
}

#[tokio::test]
async fn large_writes_are_cut_into_frames() {
    let (mut peer, _session, mut streams) = pair();
    peer.open(1, &[], true).await;
    let mut s = next_stream(&mut streams).await;
    assert_eq!(s.reader.next().await, Err(End::Fin), "FIN on SYN_STREAM");
    let _ = peer.recv().await;
    let big: Vec<u8> = (0..(3 * MAX_DATA_FRAME + 5)).map(|i| i as u8).collect();
    let w = s.writer.clone();
    let sent = big.clone();
    tokio::spawn(async move { w.write(Bytes::from(sent)).await });
    let mut got = Vec::new();
    while got.len() < big.len() {
        match peer.recv().await {
            Some(Frame::Data { data, .. }) => {
                assert!(data.len() <= MAX_DATA_FRAME);
                got.extend_from_slice(&data);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, big);
}

#[tokio::test]
async fn close_flushes_says_goaway_and_shuts_the_write_side() {
    let (mut peer, session, mut streams) = pair();
    peer.open(1, &[], false).await;
    let s = next_stream(&mut streams).await;
    s.writer.write(Bytes::from_static(b"last")).await.unwrap();
    session.close().await;
    let mut seen = Vec::new();
    while let Some(f) = peer.recv().await {
        seen.push(f);
    }
    assert!(matches!(seen[0], Frame::SynReply { .. }));
    assert!(matches!(&seen[1], Frame::Data { data, .. } if &data[..] == b"last"));
    assert_eq!(
        seen[2],
        Frame::GoAway {
            last_good_stream_id: 0,
            status: goaway::OK
        }
    );
    assert_eq!(seen.len(), 3);
}

#[tokio::test]
async fn data_frames_are_cut_at_exactly_the_largest_frame() {
    let (mut peer, _session, mut streams) = pair();
    peer.open(1, &[], true).await;
    let s = next_stream(&mut streams).await;
    assert_eq!(s.writer.id(), 1);
    let _ = peer.recv().await;
    let w = s.writer.clone();
    tokio::spawn(async move { w.write(Bytes::from(vec![7u8; MAX_DATA_FRAME + 1])).await });
    let sizes: Vec<usize> = [peer.recv().await, peer.recv().await]
        .into_iter()
        .map(|f| match f {
            Some(Frame::Data { data, .. }) => data.len(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(sizes, vec![64 * 1024, 1]);
}

#[tokio::test]
async fn inbound_frames_up_to_64_kib_are_taken_and_larger_ones_end_the_session() {
    let (mut peer, session, mut streams) = pair();
    peer.open(1, &[], false).await;
    let mut s = next_stream(&mut streams).await;
    let _ = peer.recv().await;
    // The documented limit, not the constant (a changed constant must fail):
    // twice the Go clients' 32 KiB.
    let max = 64 * 1024;
    peer.data(1, &vec![1u8; max], false).await;
    assert_eq!(s.reader.next().await.map(|d| d.len()), Ok(max));
    // A DATA header announcing one byte more: refused from the header
    // alone (the session stops reading, so no payload is sent).
    let len = u32::try_from(max + 1).unwrap().to_be_bytes();
    peer.io
        .write_all(&[0, 0, 0, 1, 0, len[1], len[2], len[3]])
        .await
        .unwrap();
    assert_eq!(
        peer.recv().await,
        Some(Frame::GoAway {
            last_good_stream_id: 1,
            status: goaway::PROTOCOL_ERROR
        })
    );
    session.ended().await;
    assert!(session.has_ended());
}

#[tokio::test]
async fn an_empty_data_frame_is_no_read() {
    let (mut peer, _session, mut streams) = pair();
    peer.open(1, &[], false).await;
    let mut s = next_stream(&mut streams).await;
    peer.data(1, b"", false).await;
    peer.data(1, b"x", true).await;
    assert_eq!(s.reader.next().await, Ok(Bytes::from_static(b"x")));
    assert_eq!(s.reader.next().await, Err(End::Fin));
}

#[tokio::test]
async fn only_odd_pings_are_echoed() {
    let (mut peer, _session, _streams) = pair();
    for id in [2, 4, 5, 9] {
        peer.send(Frame::Ping { id }).await;
    }
    assert_eq!(peer.recv().await, Some(Frame::Ping { id: 5 }));
    assert_eq!(peer.recv().await, Some(Frame::Ping { id: 9 }));
}

#[tokio::test]
async fn reset_sends_rst_stream_cancel() {
    let (mut peer, _session, mut streams) = pair();
    peer.open(3, &[], false).await;
    let s = next_stream(&mut streams).await;
    assert_eq!(s.writer.id(), 3);
    let _ = peer.recv().await;
    s.writer.reset().await.unwrap();
    assert_eq!(
        peer.recv().await,
        Some(Frame::RstStream {
            stream_id: 3,
            status: rst::CANCEL
        })
    );
}

#[tokio::test]
async fn the_session_has_not_ended_while_the_peer_is_there() {
    use futures::FutureExt;
    let (peer, session, _streams) = pair();
    tokio::task::yield_now().await;
    assert!(!session.has_ended());
    assert!(session.ended().now_or_never().is_none(), "ended() waits");
    drop(peer);
    session.ended().await;
    assert!(session.has_ended());
}

#[tokio::test]
async fn after_goaway_new_streams_are_refused() {
    let (mut peer, session, mut streams) = pair();
    peer.open(1, &[], false).await;
    let _s = next_stream(&mut streams).await;
    let _ = peer.recv().await;
    peer.send(Frame::GoAway {
        last_good_stream_id: 0,
        status: goaway::OK,
    })
    .await;
    peer.open(3, &[], false).await;
    assert_eq!(
        peer.recv().await,
        Some(Frame::RstStream {
            stream_id: 3,
            status: rst::REFUSED_STREAM
        })
    );
    assert!(!session.has_ended());
}

#[tokio::test]
async fn nothing_more_is_written_for_a_stream_the_peer_reset() {
    let (mut peer, session, mut streams) = pair();
    peer.open(1, &[], false).await;
    let s = next_stream(&mut streams).await;
    let _ = peer.recv().await;
    peer.send(Frame::RstStream {
        stream_id: 1,
        status: rst::CANCEL,
    })
    .await;
    s.writer.gone().await;
    // The ping's echo is queued after the writer was told to forget stream
    // 1: once it arrives, the FIN below meets a writer that knows.
    peer.send(Frame::Ping { id: 1 }).await;
    assert_eq!(peer.recv().await, Some(Frame::Ping { id: 1 }));
    s.writer.finish().await.unwrap();
    s.writer.reset().await.unwrap();
    session.close().await;
    let mut rest = Vec::new();
    while let Some(f) = peer.recv().await {
        rest.push(f);
    }
    assert_eq!(
        rest,
        vec![Frame::GoAway {
            last_good_stream_id: 0,
            status: goaway::OK
        }]
    );
}

#[tokio::test(flavor = "current_thread")]
async fn nothing_queued_after_close_is_written() {
    let (mut peer, session, mut streams) = pair();
    peer.open(1, &[], false).await;
    let s = next_stream(&mut streams).await;
    let _ = peer.recv().await;
    // Both queued before the writer task runs again (one thread).
    session.close().await;
    s.writer.write(Bytes::from_static(b"after")).await.unwrap();
    let mut rest = Vec::new();
    while let Some(f) = peer.recv().await {
        rest.push(f);
    }
    assert_eq!(
        rest,
        vec![Frame::GoAway {
            last_good_stream_id: 0,
            status: goaway::OK
        }]
    );
}

/// A reader fed streams directly, its replies and streams drained.
fn bare_reader() -> Reader {
    bare_reader_with(Limits::default())
}

fn bare_reader_with(limits: Limits) -> Reader {
    let (out, mut out_rx) = mpsc::channel(WRITE_QUEUE);
    let (streams, mut streams_rx) = mpsc::channel::<Stream>(8);
    tokio::spawn(async move { while out_rx.recv().await.is_some() {} });
    tokio::spawn(async move { while streams_rx.recv().await.is_some() {} });
    Reader {
        out,
        streams,
        open: HashMap::new(),
        live: HashMap::new(),
        prune_at: 64,
        inflater: Inflater::new(),
        last_id: 0,
        going_away: false,
        stream_bytes: limits.stream_bytes,
        session_budget: Arc::new(Semaphore::new(limits.session_bytes)),
        max_streams: limits.max_streams,
        tally: Arc::new(Tally {
            streams: AtomicUsize::new(0),
            stats: limits.stats,
        }),
        activity: Activity::new(),
        ended: CancellationToken::new(),
    }
}

#[tokio::test]
async fn dropped_streams_are_pruned_and_held_ones_kept() {
    // Streams the handler dropped at once: the table stays small.
    let mut r = bare_reader();
    for i in 0..300u32 {
        r.open_stream(2 * i + 1, true, Headers::default()).await;
        tokio::task::yield_now().await;
    }
    assert!(r.live.len() <= 64, "{} kept", r.live.len());

    // Held streams are kept (a reset must still reach each), and the next
    // prune waits until the table has doubled.
    let mut r = bare_reader();
    let (held_tx, mut held_rx) = mpsc::channel::<Stream>(512);
    r.streams = held_tx;
    for i in 0..100u32 {
        r.open_stream(2 * i + 1, false, Headers::default()).await;
    }
    assert_eq!(r.live.len(), 100);
    assert_eq!(r.prune_at, 128);
    let first = held_rx.recv().await.unwrap();
    r.handle(Frame::RstStream {
        stream_id: 1,
        status: rst::CANCEL,
    })
    .await
    .unwrap();
    assert!(first.writer.is_gone());
}

/// Frames already arrived are gathered into one batch (in order, up to the
/// bound, never past a FIN); the FIN comes on the next call, and a reset
/// stays a reset.
#[tokio::test]
async fn data_already_arrived_is_gathered_up_to_the_bound_and_the_fin_kept() {
    let (mut peer, _session, mut streams) = pair();
    peer.open(1, &[("streamType", "data")], false).await;
    let mut s = next_stream(&mut streams).await;
    let _ = peer.recv().await;
    peer.data(1, b"ab", false).await;
    peer.data(1, b"cd", false).await;
    peer.data(1, b"ef", false).await;
    peer.data(1, b"gh", false).await;
    peer.data(1, b"", true).await;
    // Let the session's reader queue all of them.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut batch = Vec::new();
    assert_eq!(s.reader.next_batch(&mut batch, 5).await, Ok(()));
    assert_eq!(
        batch,
        [&b"ab"[..], b"cd", b"ef"],
        "gathers until the bound is reached, frame by frame"
    );
    batch.clear();
    assert_eq!(s.reader.next_batch(&mut batch, 100).await, Ok(()));
    assert_eq!(batch, [&b"gh"[..]]);
    batch.clear();
    assert_eq!(s.reader.next_batch(&mut batch, 100).await, Err(End::Fin));
    assert!(batch.is_empty());
    assert_eq!(s.reader.next().await, Err(End::Fin), "stays ended");
    // One frame at or over the bound is returned alone.
    peer.open(3, &[("streamType", "data")], false).await;
    let mut t = next_stream(&mut streams).await;
    let _ = peer.recv().await;
    peer.data(3, b"wxyz", false).await;
    peer.data(3, b"12", false).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(t.reader.next_batch(&mut batch, 4).await, Ok(()));
    assert_eq!(batch, [&b"wxyz"[..]]);
    batch.clear();
    assert_eq!(t.reader.next_batch(&mut batch, 4).await, Ok(()));
    assert_eq!(batch, [&b"12"[..]]);
    // One-byte frames count one byte each towards the bound.
    peer.open(5, &[("streamType", "data")], false).await;
    let mut u = next_stream(&mut streams).await;
    let _ = peer.recv().await;
    for b in [b"a", b"b", b"c", b"d"] {
        peer.data(5, b, false).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    batch.clear();
    assert_eq!(u.reader.next_batch(&mut batch, 2).await, Ok(()));
    assert_eq!(batch, [&b"a"[..], b"b"]);
}

/// A reader whose messages to the writer task are kept for the test.
fn bare_reader_seen(limits: Limits) -> (Reader, mpsc::Receiver<Outbound>) {
    let mut r = bare_reader_with(limits);
    let (out, out_rx) = mpsc::channel(1 << 20);
    r.out = out;
    (r, out_rx)
}

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

async fn wait_for(f: impl Fn() -> bool) {
    for _ in 0..1000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not met in 10 s");
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

/// An aborted session lets go at once, even with its reader waiting for a
/// stream's budget and its peer gone quiet.
#[tokio::test]
async fn abort_ends_a_session_whose_reader_is_stuck() {
    let (a, b) = tokio::io::duplex(1 << 20);
    let limits = Limits::default();
    let (session, mut streams) = start_with(b, limits);
    let mut peer = Peer::new(a);
    peer.open(1, &[], false).await;
    let mut s = next_stream(&mut streams).await;
    let _ = peer.recv().await;
    for _ in 0..8 {
        peer.data(1, &vec![0u8; 64 * 1024], false).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!session.has_ended());
    session.abort();
    tokio::time::timeout(Duration::from_secs(5), session.ended())
        .await
        .expect("ended");
    assert!(s.writer.is_gone());
    // What was queued is still readable, then the reset.
    let mut got = 0;
    let end = loop {
        match s.reader.next().await {
            Ok(d) => got += d.len(),
            Err(e) => break e,
        }
    };
    assert!(got > 0);
    assert_eq!(end, End::Reset);
    // The connection is let go: the peer reads EOF.
    assert_eq!(peer.recv().await, None);
}

/// A transport that reads nothing and fails every write.
struct Unwritable;

impl AsyncRead for Unwritable {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        _: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Pending
    }
}

impl AsyncWrite for Unwritable {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        _: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Finding 7: a writer that cannot write ends the session (it used to drop
/// only one of two senders of `ended`, which then never fired).
#[tokio::test]
async fn a_failed_write_ends_the_session() {
    let (session, _streams) = start(Unwritable);
    session.close().await;
    tokio::time::timeout(Duration::from_secs(5), session.ended())
        .await
        .expect("ended after the failed write");
}

/// A connection whose writes fail once `broken` is set; reads pass.
struct BreakingWrites {
    io: tokio::io::DuplexStream,
    broken: Arc<AtomicBool>,
}

impl AsyncRead for BreakingWrites {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for BreakingWrites {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.broken.load(Ordering::Relaxed) {
            return std::task::Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
        }
        std::pin::Pin::new(&mut self.io).poll_write(cx, data)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The writer's comment in `start_with`, as it says: a connection that
/// cannot be written to ends the session even while the reader waits on a
/// stream's budget (and so reads nothing that would tell it).
#[tokio::test]
async fn a_failed_write_ends_a_session_whose_reader_waits_on_a_budget() {
    let (a, b) = tokio::io::duplex(1 << 20);
    let broken = Arc::new(AtomicBool::new(false));
    let limits = Limits::default();
    let stats = Arc::clone(&limits.stats);
    let io = BreakingWrites {
        io: b,
        broken: Arc::clone(&broken),
    };
    let (session, mut streams) = start_with(io, limits);
    let mut peer = Peer::new(a);
    peer.open(1, &[], false).await;
    let mut s = next_stream(&mut streams).await;
    assert!(matches!(peer.recv().await, Some(Frame::SynReply { .. })));
    for _ in 0..8 {
        peer.data(1, &vec![0u8; 64 * 1024], false).await;
    }
    wait_for(|| stats.queued_bytes() >= Limits::DEFAULT_STREAM_BYTES as i64 - 64 * 1024).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!session.has_ended(), "the reader waits on the budget");
    broken.store(true, Ordering::Relaxed);
    s.writer.write(Bytes::from_static(b"x")).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), session.ended())
        .await
        .expect("ended by the failed write");
    assert!(s.writer.is_gone());
    assert_eq!(s.writer.write(Bytes::from_static(b"y")).await, Err(Closed));
    let end = loop {
        match s.reader.next().await {
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    assert_eq!(end, End::Reset);
    assert_eq!(peer.recv().await, None, "the connection is let go");
}

/// One cancellation: the moment a session ends, every stream it holds is
/// gone (no task has to run in between).
#[tokio::test]
async fn every_stream_is_gone_the_moment_the_session_ends() {
    let (mut peer, session, mut streams) = pair();
    peer.open(1, &[], false).await;
    peer.open(3, &[], true).await;
    let s1 = next_stream(&mut streams).await;
    let s3 = next_stream(&mut streams).await;
    assert!(!s1.writer.is_gone() && !s3.writer.is_gone());
    session.abort();
    assert!(session.has_ended());
    assert!(s1.writer.is_gone() && s3.writer.is_gone());
    assert_eq!(
        s3.writer.write(Bytes::from_static(b"late")).await,
        Err(Closed)
    );
}

/// A peer that closes only its side still reads, as whole frames, what
/// was queued for it before (the session has ended: its streams are gone).
#[tokio::test]
async fn what_is_queued_when_the_peer_closes_its_side_still_goes_out_whole() {
    let (a, b) = tokio::io::duplex(16 * 1024);
    let (session, mut streams) = start(b);
    let mut peer = Peer::new(a);
    peer.open(1, &[], false).await;
    let s = next_stream(&mut streams).await;
    let payload = Bytes::from(vec![7u8; 200 * 1024]);
    s.writer.write(payload.clone()).await.unwrap();
    peer.io.shutdown().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), session.ended())
        .await
        .expect("ended at the peer's EOF");
    let mut got = 0;
    while let Some(f) = peer.recv().await {
        if let Frame::Data {
            stream_id: 1, data, ..
        } = f
        {
            got += data.len();
        }
    }
    assert_eq!(got, payload.len(), "every queued byte, in whole frames");
}

/// A peer that reads nothing does not hold an ended session's writer for
/// longer than LINGER: then the connection is let go, mid-frame.
#[tokio::test]
async fn a_peer_that_reads_nothing_is_let_go_after_the_linger() {
    let (a, b) = tokio::io::duplex(16 * 1024);
    let (session, mut streams) = start(b);
    let mut peer = Peer::new(a);
    peer.open(1, &[], false).await;
    let s = next_stream(&mut streams).await;
    let payload = 200 * 1024;
    s.writer
        .write(Bytes::from(vec![7u8; payload]))
        .await
        .unwrap();
    session.abort();
    tokio::time::sleep(LINGER + Duration::from_millis(300)).await;
    // What the connection held, then its end, at once.
    let mut held = Vec::new();
    let read = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::io::AsyncReadExt::read_to_end(&mut peer.io, &mut held),
    )
    .await
    .expect("let go: EOF after what the connection held");
    assert!(read.is_ok());
    assert!(held.len() < payload, "cut: {} bytes", held.len());
}

#[tokio::test]
async fn reads_and_writes_are_activity() {
    let (mut peer, session, mut streams) = pair();
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(session.activity().idle_for() >= Duration::from_millis(60));
    peer.open(1, &[], false).await;
    let s = next_stream(&mut streams).await;
    assert!(session.activity().idle_for() < Duration::from_millis(50));
    let _ = peer.recv().await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    s.writer.write(Bytes::from_static(b"x")).await.unwrap();
    let _ = peer.recv().await;
    assert!(session.activity().idle_for() < Duration::from_millis(50));
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

/// The session's count of open streams follows its handlers.
#[tokio::test]
async fn open_streams_counts_what_handlers_hold() {
    let (mut peer, session, mut streams) = pair();
    assert_eq!(session.open_streams(), 0);
    peer.open(1, &[], false).await;
    let s1 = next_stream(&mut streams).await;
    peer.open(3, &[], true).await;
    let s3 = next_stream(&mut streams).await;
    assert_eq!(session.open_streams(), 2);
    let w = s1.writer.clone();
    drop(s1);
    assert_eq!(session.open_streams(), 2, "a writer still holds it");
    drop(w);
    assert_eq!(session.open_streams(), 1);
    drop(s3);
    assert_eq!(session.open_streams(), 0);
}
