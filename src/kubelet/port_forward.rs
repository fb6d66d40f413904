//! `kubectl port-forward` into a sandbox (docs/streaming.md#port-forward):
//! the SPDY `portforward.k8s.io` protocol, directly or tunnelled through a
//! WebSocket. Each forwarded connection is a pair of streams sharing a
//! `requestID` header: `data` carries the bytes, `error` carries a message
//! if the connection fails. Each pair becomes one sandboxd `/ports/{port}`
//! relay to the guest's loopback, with half-closes passed both ways; a
//! guest port where nothing listens fails that connection alone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::kubelet::sandbox::{DataPlane, RelayError, SandboxRef};
use crate::kubelet::stream::watch::Upkeep;
use crate::spdy::{self, End, Recycler, Stream};
use crate::stream_stats::Refusal;

/// How long the second stream of a pair may take to arrive.
pub const PAIR_TIMEOUT: Duration = Duration::from_secs(30);
/// Read size from the guest.
const READ_CHUNK: usize = 64 * 1024;
/// Blocks of guest data kept for reuse while the session's writer still
/// holds them (docs/benchmarks.md, "Port-forward"): at most 512 KiB per
/// connection.
const SPARE_READ_CHUNKS: usize = 8;
/// The most of the client's data frames gathered into one write to the
/// guest (a bulk upload is one syscall per batch, not per 32 KiB frame).
const WRITE_BATCH: usize = 256 * 1024;
/// Frames written by one vectored write at most.
const MAX_SLICES: usize = 32;

/// Write every frame of `frames` in order, as few (vectored) writes as the
/// writer takes, then empty it. A writer that is not vectored still gets
/// every byte, one frame per write.
async fn write_all_frames<W: AsyncWrite + Unpin>(
    w: &mut W,
    frames: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    let mut first = 0;
    while first < frames.len() {
        let mut slices = [std::io::IoSlice::new(&[]); MAX_SLICES];
        let mut used = 0;
        for (slot, f) in slices.iter_mut().zip(&frames[first..]) {
            *slot = std::io::IoSlice::new(f);
            used += 1;
        }
        let mut n = w.write_vectored(&slices[..used]).await?;
        if n == 0 && frames[first..].iter().any(|f| !f.is_empty()) {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while first < frames.len() && n >= frames[first].len() {
            n -= frames[first].len();
            first += 1;
        }
        // (A writer claiming more than it was given leaves nothing to advance.)
        if let Some(f) = frames.get_mut(first).filter(|_| n > 0) {
            f.advance(n);
        }
    }
    frames.clear();
    Ok(())
}

/// A pair being assembled.
#[derive(Default)]
struct Pair {
    error: Option<Stream>,
    data: Option<Stream>,
    since: Option<Instant>,
}

/// The guest port a stream names: 1–65535.
pub fn parse_port(header: Option<&str>) -> Result<u16, String> {
    let raw = header.ok_or("the stream names no port")?;
    let digits = !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit());
    match raw.parse::<u16>() {
        Ok(p) if digits && p > 0 => Ok(p),
        _ => Err(format!("invalid port {raw:?}: want 1-65535")),
    }
}

/// The message a failed connection's error stream carries.
pub fn failure_message(pod: &str, port: u16, e: &RelayError) -> String {
    match e {
        RelayError::Unreachable(why) => format!(
            "error forwarding port {port} to pod {pod}: nothing accepts connections on port \
             {port} inside the sandbox ({why})"
        ),
        other => format!("error forwarding port {port} to pod {pod}: {other}"),
    }
}

/// One port-forward session: where it forwards to, and what it is held to.
pub struct Forward {
    pub plane: Arc<dyn DataPlane>,
    pub sandbox: SandboxRef,
    /// `namespace/name`, for messages.
    pub pod: String,
    /// How long the second stream of a pair may take ([`PAIR_TIMEOUT`]).
    pub pair_timeout: Duration,
    pub upkeep: Upkeep,
}

/// How often incomplete pairs are looked at: a sixth of their timeout
/// (at most 5 s, at least 100 ms).
fn sweep_every(pair_timeout: Duration) -> Duration {
    (pair_timeout / 6).clamp(Duration::from_millis(100), Duration::from_secs(5))
}

/// The message of a connection refused because its session forwards all
/// the connections its limit of `limit` streams allows.
pub fn too_many_streams(pod: &str, port: &str, limit: usize) -> String {
    format!(
        "error forwarding port {port} to pod {pod}: this port-forward session already \
         forwards all the connections its limit allows ({limit} streams, two per \
         connection: --max-streams-per-session, env VK_MAX_STREAMS_PER_SESSION); close \
         some connections or raise the limit"
    )
}

/// Serve one port-forward session on an upgraded connection (or tunnel).
#[tracing::instrument(skip_all, fields(pod = %f.pod, sandbox = %f.sandbox.id))]
pub async fn serve<IO>(io: IO, f: Forward)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let Forward {
        plane,
        sandbox,
        pod,
        pair_timeout,
        upkeep,
    } = f;
    let max_streams = upkeep.spdy.max_streams;
    let stats = Arc::clone(&upkeep.spdy.stats);
    let (session, mut incoming) = spdy::start_with(io, upkeep.spdy);
    let _watching = upkeep.watch.spdy(&session);
    let mut pending: HashMap<String, Pair> = HashMap::new();
    // One clone per connection being forwarded (two streams each).
    let forwarding = Arc::new(());
    let mut sweep = tokio::time::interval(sweep_every(pair_timeout));
    loop {
        tokio::select! {
            s = incoming.recv() => {
                let Some(s) = s else { break };
                let Some(id) = s.headers.get("requestid").map(str::to_string) else {
                    tracing::debug!("port-forward stream without a requestID; reset");
                    let _ = s.writer.reset().await;
                    continue;
                };
                let kind = s.headers.get("streamtype").unwrap_or_default().to_string();
                // A new pair whose two streams would pass the session's
                // limit: its data stream would be refused, so say why on its
                // error stream now.
                let held = pending
                    .values()
                    .map(|p| usize::from(p.error.is_some()) + usize::from(p.data.is_some()))
                    .sum::<usize>()
                    + 2 * (Arc::strong_count(&forwarding) - 1);
                if kind == "error" && !pending.contains_key(&id) && held + 2 > max_streams {
                    stats.refused(Refusal::SessionStreams);
                    let port = s.headers.get("port").unwrap_or("?").to_string();
                    tracing::info!(port, limit = max_streams, "port-forward connection refused: the session holds --max-streams-per-session streams");
                    let msg = too_many_streams(&pod, &port, max_streams);
                    let _ = s.writer.write(Bytes::from(msg)).await;
                    let _ = s.writer.finish().await;
                    continue;
                }
                let pair = pending.entry(id.clone()).or_default();
                pair.since.get_or_insert_with(Instant::now);
                let slot = match kind.as_str() {
                    "error" => &mut pair.error,
                    "data" => &mut pair.data,
                    _ => {
                        let _ = s.writer.reset().await;
                        continue;
                    }
                };
                if slot.is_some() {
                    let _ = s.writer.reset().await;
                    continue;
                }
                *slot = Some(s);
                if pair.error.is_some()
                    && pair.data.is_some()
                    && let Some(Pair { error: Some(error), data: Some(data), .. }) = pending.remove(&id)
                {
                    let busy = Arc::clone(&forwarding);
                    let (plane, sandbox, pod) = (Arc::clone(&plane), sandbox.clone(), pod.clone());
                    tokio::spawn(async move {
                        forward(plane, sandbox, pod, error, data).await;
                        drop(busy);
                    });
                }
            }
            _ = sweep.tick() => {
                let stale: Vec<String> = pending
                    .iter()
                    .filter(|(_, p)| p.since.is_some_and(|t| t.elapsed() > pair_timeout))
                    .map(|(k, _)| k.clone())
                    .collect();
                for id in stale {
                    if let Some(p) = pending.remove(&id) {
                        tracing::debug!(request = %id, "port-forward pair incomplete; dropped");
                        if let Some(e) = p.error {
                            let msg = format!("timed out waiting for the data stream of request {id}");
                            let _ = e.writer.write(Bytes::from(msg)).await;
                            let _ = e.writer.finish().await;
                        }
                        if let Some(d) = p.data {
                            let _ = d.writer.reset().await;
                        }
                    }
                }
            }
        }
    }
}

/// One forwarded connection.
async fn forward(
    plane: Arc<dyn DataPlane>,
    sandbox: SandboxRef,
    pod: String,
    error: Stream,
    data: Stream,
) {
    let port = match parse_port(data.headers.get("port")) {
        Ok(p) => p,
        Err(why) => {
            fail(
                &error,
                &data,
                format!("error forwarding to pod {pod}: {why}"),
            )
            .await;
            return;
        }
    };
    let relay = match plane.port(&sandbox, port).await {
        Ok(r) => r,
        Err(e) => {
            tracing::info!(port, error = %e, "port-forward connection refused");
            fail(&error, &data, failure_message(&pod, port, &e)).await;
            return;
        }
    };
    let (mut guest_read, mut guest_write) = tokio::io::split(relay);
    let Stream {
        reader: mut from_client,
        writer: to_client,
        ..
    } = data;
    let gone = to_client.clone();
    let up = async {
        let mut batch = Vec::new();
        loop {
            match from_client.next_batch(&mut batch, WRITE_BATCH).await {
                Ok(()) => {
                    if write_all_frames(&mut guest_write, &mut batch)
                        .await
                        .is_err()
                    {
                        return Err(());
                    }
                }
                Err(End::Fin) => {
                    // The client's half-close reaches the guest.
                    let _ = guest_write.shutdown().await;
                    return Ok(());
                }
                Err(End::Reset) => return Err(()),
            }
        }
    };
    let down = async {
        let mut room = Recycler::new(READ_CHUNK, SPARE_READ_CHUNKS);
        let mut buf = BytesMut::new();
        loop {
            room.make_room(&mut buf, READ_CHUNK);
            match guest_read.read_buf(&mut buf).await {
                Ok(0) => {
                    // The guest's half-close reaches the client.
                    return to_client.finish().await.map_err(|_| ());
                }
                Ok(_) => {
                    if to_client.write(buf.split().freeze()).await.is_err() {
                        return Err(());
                    }
                }
                Err(_) => return Err(()),
            }
        }
    };
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    let clean = loop {
        tokio::select! {
            r = &mut up, if !up_done => {
                up_done = true;
                if r.is_err() { break false; }
            }
            r = &mut down, if !down_done => {
                down_done = true;
                if r.is_err() { break false; }
            }
            _ = gone.gone() => break false,
        }
        if up_done && down_done {
            break true;
        }
    };
    if !clean && !gone.is_gone() {
        let _ = gone.reset().await;
    }
    let _ = error.writer.finish().await;
}

async fn fail(error: &Stream, data: &Stream, message: String) {
    let _ = error.writer.write(Bytes::from(message)).await;
    let _ = error.writer.finish().await;
    let _ = data.writer.finish().await;
}

#[cfg(test)]
mod tests {
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
        ) -> futures::future::BoxFuture<'a, Result<crate::kubelet::sandbox::Relay, RelayError>>
        {
            Box::pin(async { Err(RelayError::Unreachable("no agent".into())) })
        }
        fn port<'a>(
            &'a self,
            _: &'a SandboxRef,
            port: u16,
        ) -> futures::future::BoxFuture<'a, Result<crate::kubelet::sandbox::Relay, RelayError>>
        {
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
}
