//! One connection to a sandbox's guest agent through sandboxd's `/agent`
//! relay: a reader of reply frames (cancel-safe) and a writer task fed in
//! order. Never half-closed: sandboxd takes the client's EOF for "gone" and
//! the agent then aborts the RPC, so input ends only with `stdin_close`.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::silkd::{BadFrame, LineBuffer, Reply, Request, parse_reply};
use crate::kubelet::sandbox::{DataPlane, Relay, RelayError, SandboxRef};

/// How long a control RPC (resize, kill) may take end to end.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of request lines queued for the agent before a sender waits (a
/// command that does not read its stdin holds no more than this of it
/// here; a larger line waits for the queue to be empty).
pub const QUEUE_BYTES: usize = 256 * 1024;

/// Why the agent connection failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentFailure {
    #[error(transparent)]
    Relay(#[from] RelayError),
    #[error(transparent)]
    Frame(#[from] BadFrame),
    #[error("the guest agent relay closed")]
    Closed,
    #[error("the guest agent relay failed: {0}")]
    Io(String),
}

/// Reads reply frames.
pub struct AgentReader {
    read: ReadHalf<Relay>,
    lines: LineBuffer,
}

impl AgentReader {
    /// The next reply. Cancel-safe: a cancelled call loses nothing.
    pub async fn next(&mut self) -> Result<Reply, AgentFailure> {
        loop {
            if let Some(line) = self.lines.next_line()? {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(parse_reply(&line)?);
            }
            let buf = self.lines.buffer();
            if buf.capacity() - buf.len() < 4096 {
                buf.reserve(64 * 1024);
            }
            match self.read.read_buf(buf).await {
                Ok(0) => return Err(AgentFailure::Closed),
                Ok(_) => {}
                Err(e) => return Err(AgentFailure::Io(e.to_string())),
            }
        }
    }
}

/// A request line and its share of the queue's bytes.
type Queued = (Vec<u8>, OwnedSemaphorePermit);

/// Queues request frames for the connection's writer task, at most
/// [`QUEUE_BYTES`] of them.
#[derive(Clone)]
pub struct AgentWriter {
    tx: mpsc::Sender<Queued>,
    room: Arc<Semaphore>,
}

impl AgentWriter {
    /// Queue `req` once there is room; an error means the connection is
    /// gone.
    pub async fn send(&self, req: Request) -> Result<(), AgentFailure> {
        let line = req.to_line();
        let share = u32::try_from(line.len().min(QUEUE_BYTES)).unwrap_or(u32::MAX);
        let permit = Arc::clone(&self.room)
            .acquire_many_owned(share)
            .await
            .map_err(|_| AgentFailure::Closed)?;
        self.tx
            .send((line, permit))
            .await
            .map_err(|_| AgentFailure::Closed)
    }
}

/// Open a connection to the guest agent of `sandbox`.
pub async fn connect(
    plane: &dyn DataPlane,
    sandbox: &SandboxRef,
) -> Result<(AgentReader, AgentWriter), AgentFailure> {
    let relay = plane.agent(sandbox).await?;
    let (read, write) = tokio::io::split(relay);
    let (tx, rx) = mpsc::channel(32);
    tokio::spawn(write_loop(write, rx));
    Ok((
        AgentReader {
            read,
            lines: LineBuffer::default(),
        },
        AgentWriter {
            tx,
            room: Arc::new(Semaphore::new(QUEUE_BYTES)),
        },
    ))
}

async fn write_loop(mut write: WriteHalf<Relay>, mut rx: mpsc::Receiver<Queued>) {
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut shares = Vec::new();
    while let Some((line, share)) = rx.recv().await {
        buf.extend_from_slice(&line);
        shares.push(share);
        // Batch what is queued into one write.
        while buf.len() < 256 * 1024 {
            match rx.try_recv() {
                Ok((line, share)) => {
                    buf.extend_from_slice(&line);
                    shares.push(share);
                }
                Err(_) => break,
            }
        }
        if write.write_all(&buf).await.is_err() || write.flush().await.is_err() {
            return;
        }
        buf.clear();
        // Written: the queue has room again.
        shares.clear();
    }
    // Every sender dropped: the connection closes when the reader half is
    // dropped too (no shutdown: a half-close reads as "client gone").
}

/// One control RPC (resize, kill) on a fresh connection, as the protocol
/// asks (a request on the busy connection would end the running RPC's
/// input). `Ok(())` on `done`; the agent's error otherwise.
pub async fn control(
    plane: &dyn DataPlane,
    sandbox: &SandboxRef,
    req: Request,
) -> Result<(), AgentFailure> {
    let rpc = async {
        let (mut reader, writer) = connect(plane, sandbox).await?;
        writer.send(req).await?;
        loop {
            match reader.next().await? {
                Reply::Done => return Ok(()),
                Reply::Error { kind, message } => {
                    return Err(AgentFailure::Io(format!("{kind}: {message}")));
                }
                _ => continue,
            }
        }
    };
    match tokio::time::timeout(CONTROL_TIMEOUT, rpc).await {
        Ok(r) => r,
        Err(_) => Err(AgentFailure::Io(format!(
            "no answer within {}s",
            CONTROL_TIMEOUT.as_secs()
        ))),
    }
}
