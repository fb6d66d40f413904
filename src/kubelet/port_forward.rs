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
/// writer takes, flush, then empty it. A writer that is not vectored still
/// gets every byte, one frame per write. The flush matters for a relay over
/// TLS (an `https` sandboxd): a write the socket could not take whole is
/// accepted into the TLS session's buffer and stays there until the next
/// write or a flush, so without one the tail of what the client sent would
/// wait for its next bytes (for ever, if the client waits for an answer).
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
    w.flush().await
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
mod tests;
