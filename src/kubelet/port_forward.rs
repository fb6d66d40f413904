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

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::kubelet::sandbox::{DataPlane, RelayError, SandboxRef};
use crate::spdy::{self, End, Stream};

/// How long the second stream of a pair may take to arrive.
pub const PAIR_TIMEOUT: Duration = Duration::from_secs(30);
/// Read size from the guest.
const READ_CHUNK: usize = 64 * 1024;
/// The most of the client's data frames gathered into one write to the
/// guest (a bulk upload is one syscall per batch, not per 32 KiB frame).
const WRITE_BATCH: usize = 256 * 1024;

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

/// Serve one port-forward session on an upgraded connection (or tunnel).
#[tracing::instrument(skip_all, fields(pod = %pod, sandbox = %sandbox.id))]
pub async fn serve<IO>(io: IO, plane: Arc<dyn DataPlane>, sandbox: SandboxRef, pod: String)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (_session, mut incoming) = spdy::start(io);
    let mut pending: HashMap<String, Pair> = HashMap::new();
    let mut sweep = tokio::time::interval(Duration::from_secs(5));
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
                    tokio::spawn(forward(Arc::clone(&plane), sandbox.clone(), pod.clone(), error, data));
                }
            }
            _ = sweep.tick() => {
                let stale: Vec<String> = pending
                    .iter()
                    .filter(|(_, p)| p.since.is_some_and(|t| t.elapsed() > PAIR_TIMEOUT))
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
        loop {
            match from_client.next_batch(WRITE_BATCH).await {
                Ok(b) => {
                    if guest_write.write_all(&b).await.is_err() {
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
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        loop {
            buf.reserve(READ_CHUNK);
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
