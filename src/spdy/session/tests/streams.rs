//! Streams: replies, data both ways, resets, pings, frames cut and
//! gathered, the count of what handlers hold.

use super::*;

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
