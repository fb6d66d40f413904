use super::*;
use crate::spdy::frame::{self, Frame};
use crate::spdy::testing::Peer;
use crate::stream_stats::StreamStats;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Takes at most `step` bytes per write, across slices when vectored,
/// and records each write's size.
struct Trickle {
    got: Vec<u8>,
    writes: Vec<usize>,
    step: usize,
    vectored: bool,
}

impl AsyncWrite for Trickle {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let n = buf.len().min(self.step);
        self.got.extend_from_slice(&buf[..n]);
        self.writes.push(n);
        Poll::Ready(Ok(n))
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if !self.vectored {
            let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| b);
            return self.poll_write(cx, first);
        }
        let mut n = 0;
        for b in bufs {
            let take = b.len().min(self.step - n);
            self.got.extend_from_slice(&b[..take]);
            n += take;
            if n == self.step {
                break;
            }
        }
        self.writes.push(n);
        Poll::Ready(Ok(n))
    }
    fn is_write_vectored(&self) -> bool {
        self.vectored
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn frames() -> Vec<Bytes> {
    [&b"abc"[..], b"", b"defgh", b"i", b"jklmnopq"]
        .into_iter()
        .map(Bytes::from_static)
        .collect()
}

#[tokio::test]
async fn frames_are_written_whole_and_in_order_across_partial_writes() {
    for (step, vectored) in [(4, true), (100, true), (1, true), (3, false), (100, false)] {
        let mut w = Trickle {
            got: Vec::new(),
            writes: Vec::new(),
            step,
            vectored,
        };
        let mut batch = frames();
        write_all_frames(&mut w, &mut batch).await.expect("written");
        assert_eq!(
            w.got, b"abcdefghijklmnopq",
            "step {step}, vectored {vectored}"
        );
        assert!(batch.is_empty(), "the batch is emptied for reuse");
        if step == 100 && vectored {
            assert_eq!(w.writes, [17], "one write for the whole batch");
        }
        if step == 100 && !vectored {
            assert_eq!(w.writes, [3, 5, 1, 8], "one write per frame");
        }
    }
}

/// Accepts every write into a buffer and delivers it only on a flush, as a
/// TLS session does with what its socket could not take at once.
#[derive(Default)]
struct HoldsUntilFlushed {
    held: Vec<u8>,
    delivered: Vec<u8>,
}

impl AsyncWrite for HoldsUntilFlushed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.held.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let held = std::mem::take(&mut self.held);
        self.delivered.extend_from_slice(&held);
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.poll_flush(cx)
    }
}

/// What the client sent reaches the guest when it is written, not when the
/// client next sends something: over a relay that buffers (TLS to an https
/// sandboxd) a request whose client waits for the answer would otherwise
/// never arrive whole.
#[tokio::test]
async fn a_batch_is_delivered_through_a_writer_that_buffers() {
    let mut w = HoldsUntilFlushed::default();
    let mut batch = frames();
    write_all_frames(&mut w, &mut batch).await.expect("written");
    assert_eq!(w.delivered, b"abcdefghijklmnopq");
    assert!(w.held.is_empty());
}

#[tokio::test]
async fn a_writer_that_takes_nothing_is_an_error_not_a_spin() {
    let mut w = Trickle {
        got: Vec::new(),
        writes: Vec::new(),
        step: 0,
        vectored: true,
    };
    let mut batch = frames();
    let e = write_all_frames(&mut w, &mut batch)
        .await
        .expect_err("write zero");
    assert_eq!(e.kind(), std::io::ErrorKind::WriteZero);
    // A batch of empty frames only is no write at all.
    let mut empty = vec![Bytes::new(), Bytes::new()];
    write_all_frames(&mut w, &mut empty)
        .await
        .expect("nothing to write");
    assert!(empty.is_empty());
}

/// Guest ports whose relays echo what they read; any other port is
/// unreachable.
struct EchoPorts(u16);

impl DataPlane for EchoPorts {
    fn agent<'a>(
        &'a self,
        _: &'a SandboxRef,
    ) -> futures::future::BoxFuture<'a, Result<crate::kubelet::sandbox::Relay, RelayError>> {
        Box::pin(async { Err(RelayError::Unreachable("no agent".into())) })
    }
    fn port<'a>(
        &'a self,
        _: &'a SandboxRef,
        port: u16,
    ) -> futures::future::BoxFuture<'a, Result<crate::kubelet::sandbox::Relay, RelayError>> {
        Box::pin(async move {
            if port != self.0 {
                return Err(RelayError::Unreachable("guest port unreachable".into()));
            }
            let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
            tokio::spawn(async move {
                let (mut r, mut w) = tokio::io::split(&mut theirs);
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
            Ok(Box::new(ours) as crate::kubelet::sandbox::Relay)
        })
    }
    fn stats<'a>(
        &'a self,
        _: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<crate::kubelet::sandbox::SandboxStats, RelayError>>
    {
        Box::pin(async { Err(RelayError::Transport("none".into())) })
    }
}

/// A port-forward session on a pipe, and the client's end.
fn session(pair_timeout: Duration, max_streams: usize) -> (Peer, Arc<StreamStats>) {
    let (a, b) = tokio::io::duplex(1 << 20);
    let upkeep = Upkeep::default();
    let stats = Arc::clone(&upkeep.spdy.stats);
    let upkeep = Upkeep {
        spdy: spdy::Limits {
            max_streams,
            ..upkeep.spdy
        },
        ..upkeep
    };
    tokio::spawn(serve(
        b,
        Forward {
            plane: Arc::new(EchoPorts(8080)),
            sandbox: SandboxRef {
                id: "sb_1".into(),
                token: crate::sandboxd::Secret::new("t"),
            },
            pod: "ns/p".into(),
            pair_timeout,
            upkeep,
        },
    ));
    (Peer::new(a), stats)
}

/// Frames until `done` says enough (each checked as it comes).
async fn frames_until(peer: &mut Peer, mut done: impl FnMut(&Frame) -> bool) -> Vec<Frame> {
    let mut seen = Vec::new();
    loop {
        let f = peer.recv().await.expect("the session is open");
        let stop = done(&f);
        seen.push(f);
        if stop {
            return seen;
        }
    }
}

fn data_of(frames: &[Frame], id: u32) -> Vec<u8> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Data {
                stream_id, data, ..
            } if *stream_id == id => Some(data.to_vec()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn fin_of(id: u32) -> impl Fn(&Frame) -> bool {
    move |f| matches!(f, Frame::Data { stream_id, fin: true, .. } if *stream_id == id)
}

#[tokio::test]
async fn an_incomplete_pair_is_answered_after_the_pair_timeout() {
    let (mut peer, _) = session(Duration::from_millis(300), 512);
    let started = Instant::now();
    peer.open(
        1,
        &[
            ("streamType", "error"),
            ("port", "8080"),
            ("requestID", "a"),
        ],
        false,
    )
    .await;
    peer.open(
        3,
        &[("streamType", "data"), ("port", "8080"), ("requestID", "b")],
        false,
    )
    .await;
    let (mut reset, mut fin) = (false, false);
    let seen = frames_until(&mut peer, |f| {
        reset |= f
            == &Frame::RstStream {
                stream_id: 3,
                status: frame::rst::CANCEL,
            };
        fin |= fin_of(1)(f);
        reset && fin
    })
    .await;
    let took = started.elapsed();
    assert_eq!(
        String::from_utf8(data_of(&seen, 1)).unwrap(),
        "timed out waiting for the data stream of request a"
    );
    assert!(
        seen.iter()
            .any(|f| matches!(f, Frame::RstStream { stream_id: 3, .. }))
    );
    assert!(
        took >= Duration::from_millis(300),
        "not before the timeout: {took:?}"
    );
    assert!(took < Duration::from_secs(3), "soon after it: {took:?}");
    // The session goes on.
    peer.open(
        5,
        &[
            ("streamType", "error"),
            ("port", "8080"),
            ("requestID", "c"),
        ],
        false,
    )
    .await;
    peer.open(
        7,
        &[("streamType", "data"), ("port", "8080"), ("requestID", "c")],
        false,
    )
    .await;
    peer.data(7, b"echo", false).await;
    let seen = frames_until(
        &mut peer,
        |f| matches!(f, Frame::Data { stream_id: 7, data, .. } if !data.is_empty()),
    )
    .await;
    assert_eq!(data_of(&seen, 7), b"echo");
}

#[test]
fn pairs_are_looked_at_a_sixth_of_their_timeout() {
    assert_eq!(sweep_every(PAIR_TIMEOUT), Duration::from_secs(5));
    assert_eq!(sweep_every(Duration::from_secs(60)), Duration::from_secs(5));
    assert_eq!(
        sweep_every(Duration::from_secs(3)),
        Duration::from_millis(500)
    );
    assert_eq!(
        sweep_every(Duration::from_millis(60)),
        Duration::from_millis(100)
    );
}

/// Finding 5: a connection whose error stream takes the session's last
/// stream is refused on it, naming the limit; the others go on.
#[tokio::test]
async fn a_connection_over_the_stream_limit_is_told_why() {
    let (mut peer, stats) = session(PAIR_TIMEOUT, 5);
    for (e, d, rid) in [(1, 3, "1"), (5, 7, "2")] {
        peer.open(
            e,
            &[
                ("streamType", "error"),
                ("port", "8080"),
                ("requestID", rid),
            ],
            false,
        )
        .await;
        peer.open(
            d,
            &[("streamType", "data"), ("port", "8080"), ("requestID", rid)],
            false,
        )
        .await;
    }
    peer.open(
        9,
        &[
            ("streamType", "error"),
            ("port", "8080"),
            ("requestID", "3"),
        ],
        false,
    )
    .await;
    let seen = frames_until(&mut peer, fin_of(9)).await;
    let msg = String::from_utf8(data_of(&seen, 9)).unwrap();
    assert_eq!(msg, too_many_streams("ns/p", "8080", 5));
    assert!(msg.contains("--max-streams-per-session"), "{msg}");
    assert_eq!(stats.refusals(Refusal::SessionStreams), 1);
    // Four streams are still held: the other connections work.
    peer.data(7, b"still", false).await;
    let seen = frames_until(
        &mut peer,
        |f| matches!(f, Frame::Data { stream_id: 7, data, .. } if !data.is_empty()),
    )
    .await;
    assert_eq!(data_of(&seen, 7), b"still");
    // Below the limit again (connection 1 done), a connection is taken.
    peer.data(3, b"", true).await;
    let _ = frames_until(&mut peer, fin_of(1)).await;
    peer.open(
        11,
        &[
            ("streamType", "error"),
            ("port", "8080"),
            ("requestID", "4"),
        ],
        false,
    )
    .await;
    peer.open(
        13,
        &[("streamType", "data"), ("port", "8080"), ("requestID", "4")],
        false,
    )
    .await;
    peer.data(13, b"again", false).await;
    let seen = frames_until(
        &mut peer,
        |f| matches!(f, Frame::Data { stream_id: 13, data, .. } if !data.is_empty()),
    )
    .await;
    assert_eq!(data_of(&seen, 13), b"again");
    assert_eq!(stats.refusals(Refusal::SessionStreams), 1);
}

#[test]
fn ports() {
    assert_eq!(parse_port(Some("8080")), Ok(8080));
    assert_eq!(parse_port(Some("65535")), Ok(65535));
    assert_eq!(parse_port(Some("0022")), Ok(22));
    for bad in ["0", "65536", "-1", "http", "", "+22", " 1"] {
        assert!(parse_port(Some(bad)).is_err(), "{bad}");
    }
    assert!(parse_port(None).is_err());
}

#[test]
fn failure_messages_name_the_port_and_pod() {
    let m = failure_message(
        "ns/p",
        8080,
        &RelayError::Unreachable("guest port unreachable".into()),
    );
    assert!(m.contains("port 8080") && m.contains("ns/p") && m.contains("nothing accepts"));
    let m = failure_message(
        "ns/p",
        1,
        &RelayError::Gone {
            status: 404,
            message: "unknown sandbox".into(),
        },
    );
    assert!(m.contains("no longer serves"), "{m}");
}
