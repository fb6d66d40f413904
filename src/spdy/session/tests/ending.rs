//! How a session ends: the peer's EOF or a protocol error, close, abort,
//! a failed write; what is still written then; activity.

use super::*;

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
