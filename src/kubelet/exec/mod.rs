//! `kubectl exec` inside a sandbox: the remote-command channels (whichever
//! protocol carried them, see [`crate::kubelet::stream`]) joined to the
//! guest agent's frames through sandboxd's `/agent` relay
//! (docs/streaming.md#exec).
//!
//! - without a terminal: an `exec` RPC with the argv; stdout and stderr
//!   apart, stdin forwarded and closed with `stdin_close`;
//! - with a terminal: the agent's pseudo-terminal shell, told to `exec` the
//!   argv ([`tty`]), resized through `pty_resize` RPCs on a second
//!   connection;
//! - the exit code becomes the client's status ([`status`]);
//! - a client that hangs up gets its process killed (`kill` on a second
//!   connection: the agent only notices a dropped client when it writes).

pub mod agent;
pub mod silkd;
pub mod status;
pub mod tty;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde::Deserialize;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use agent::{AgentFailure, AgentReader, AgentWriter};
use silkd::{Reply, Request};
pub use status::Outcome;

use crate::kubelet::sandbox::{DataPlane, SandboxRef};

/// How long to wait for the client's first terminal size before opening
/// the terminal at the default size (kubectl sends it at once).
pub const FIRST_SIZE_WAIT: Duration = Duration::from_millis(500);
/// Terminal size when the client sends none.
pub const DEFAULT_SIZE: TermSize = TermSize {
    width: 80,
    height: 24,
};
/// How long the terminal's shell gets to start the command (print the
/// marker) before its output passes unfiltered.
pub const MARKER_WAIT: Duration = Duration::from_secs(15);
/// The most of the client's input one `stdin` frame carries: a WebSocket
/// message of up to 16 MiB would otherwise be one frame of ~21 MiB of
/// base64, over the agent's 8 MiB frame limit.
pub const STDIN_FRAME: usize = 64 * 1024;

/// `data` as `stdin` frames of at most [`STDIN_FRAME`] bytes each.
pub fn stdin_frames(data: &[u8]) -> impl Iterator<Item = Request> + '_ {
    data.chunks(STDIN_FRAME).map(|c| Request::Stdin(c.to_vec()))
}

/// A terminal size as the resize channel carries it (JSON
/// `{"Width":…,"Height":…}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct TermSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// The client's input (stdin).
pub trait Input: Send {
    /// The next bytes; `None` when the client closed its input (or left).
    fn next(&mut self) -> BoxFuture<'_, Option<Bytes>>;
}

/// Output to the client (stdout or stderr).
pub trait Output: Send + Sync {
    /// Send `data`; an error means the client is gone.
    fn write(&self, data: Bytes) -> BoxFuture<'_, Result<(), ()>>;
    /// No more output on this channel.
    fn finish(&self) -> BoxFuture<'_, ()>;
}

/// The remote-command channels the client asked for.
pub struct Channels {
    pub stdin: Option<Box<dyn Input>>,
    pub stdout: Option<Box<dyn Output>>,
    pub stderr: Option<Box<dyn Output>>,
    pub resize: Option<mpsc::Receiver<TermSize>>,
    /// Cancelled when the client's connection is gone.
    pub hangup: CancellationToken,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    pub tty: bool,
}

/// A connection to a sandbox's guest agent, or why there is none.
pub type Connection = Result<(AgentReader, AgentWriter), AgentFailure>;

fn no_command() -> Outcome {
    Outcome::Refused {
        reason: "BadRequest",
        message: "no command given".into(),
    }
}

/// Run `req` in `sandbox`, wired to `ch`, until the process ends or the
/// client hangs up. The outcome is for the client's status channel.
pub async fn run(
    plane: Arc<dyn DataPlane>,
    sandbox: SandboxRef,
    req: ExecRequest,
    ch: Channels,
) -> Outcome {
    if req.argv.is_empty() {
        return no_command();
    }
    let conn = agent::connect(plane.as_ref(), &sandbox).await;
    run_on(conn, plane, sandbox, req, ch).await
}

/// [`run`] on a guest agent connection already opened (or failed) for
/// `sandbox`: the kubelet API opens it while its `101` goes out.
#[tracing::instrument(skip_all, fields(sandbox = %sandbox.id, tty = req.tty))]
pub async fn run_on(
    conn: Connection,
    plane: Arc<dyn DataPlane>,
    sandbox: SandboxRef,
    req: ExecRequest,
    mut ch: Channels,
) -> Outcome {
    if req.argv.is_empty() {
        return no_command();
    }
    let (reader, writer) = match conn {
        Ok(c) => c,
        Err(e) => return Outcome::Unreachable(e.to_string()),
    };
    let (pid_tx, pid_rx) = watch::channel(None);
    let mut filter = None;
    let (release_tx, release_rx) = watch::channel(!req.tty);
    let opened = if req.tty {
        let size = first_size(ch.resize.as_mut()).await;
        let inj = tty::injection(&req.argv, &nonce());
        filter = Some(tty::MarkerFilter::of(&inj));
        let mut r = writer
            .send(Request::PtyOpen {
                cols: size.width,
                rows: size.height,
            })
            .await;
        for frame in stdin_frames(&inj.typed) {
            if r.is_err() {
                break;
            }
            r = writer.send(frame).await;
        }
        r
    } else {
        let no_stdin = ch.stdin.is_none();
        let r = writer
            .send(Request::Exec {
                argv: req.argv.clone(),
            })
            .await;
        // Without stdin its end goes right behind the request (as sandboxd's
        // own exec does): one write, and a command reading stdin does not
        // wait. A terminal's input is never closed (that types ^D).
        match r {
            Ok(()) if no_stdin => writer.send(Request::StdinClose).await,
            r => r,
        }
    };
    if let Err(e) = opened {
        return Outcome::Unreachable(e.to_string());
    }
    // Without stdin there is nothing to pump: its end went with the
    // request, or it is a terminal's, left open.
    let stdin_task = ch
        .stdin
        .take()
        .map(|input| tokio::spawn(pump_stdin(input, writer.clone(), release_rx)));
    let resize_task = ch.resize.take().map(|rx| {
        tokio::spawn(forward_resizes(
            Arc::clone(&plane),
            sandbox.clone(),
            rx,
            pid_rx.clone(),
        ))
    });
    let session = Session {
        reader,
        filter,
        release: release_tx,
        pid: pid_tx,
        stdout: ch.stdout.as_deref(),
        stderr: ch.stderr.as_deref(),
        hangup: &ch.hangup,
    };
    let outcome = session.run().await;
    if let Some(t) = stdin_task {
        t.abort();
    }
    if let Some(t) = resize_task {
        t.abort();
    }
    drop(writer);
    let pid = *pid_rx.borrow();
    // The agent notices a dropped client only when it writes: a quiet
    // process would run on. A client that left (or a server shutting down)
    // waits for nothing, so the kill is part of the session (and of the
    // server's shutdown grace); a broken relay's client waits for its
    // status, so that kill goes on alone.
    let kill = pid.map(|pid| {
        let plane = Arc::clone(&plane);
        let sandbox = sandbox.clone();
        async move {
            let kill = Request::Kill { pid, signal: None };
            match agent::control(plane.as_ref(), &sandbox, kill).await {
                Ok(()) => tracing::debug!(pid, "killed the process of a gone client"),
                Err(e) => tracing::debug!(pid, error = %e, "kill after hang-up"),
            }
        }
    });
    match (&outcome, kill) {
        (Ended::HungUp, Some(kill)) => kill.await,
        (Ended::Broken(_), Some(kill)) => {
            tokio::spawn(kill);
        }
        _ => {}
    }
    for out in [ch.stdout.as_deref(), ch.stderr.as_deref()]
        .into_iter()
        .flatten()
    {
        out.finish().await;
    }
    match outcome {
        Ended::Finished(o) => o,
        Ended::HungUp => Outcome::Exited(-1),
        Ended::Broken(why) => Outcome::Unreachable(why),
    }
}

/// How the reply loop ended.
enum Ended {
    Finished(Outcome),
    HungUp,
    Broken(String),
}

struct Session<'a> {
    reader: AgentReader,
    filter: Option<tty::MarkerFilter>,
    release: watch::Sender<bool>,
    pid: watch::Sender<Option<u32>>,
    stdout: Option<&'a dyn Output>,
    stderr: Option<&'a dyn Output>,
    hangup: &'a CancellationToken,
}

impl Session<'_> {
    async fn run(mut self) -> Ended {
        let marker_deadline = tokio::time::sleep(MARKER_WAIT);
        tokio::pin!(marker_deadline);
        loop {
            let waiting = self.filter.as_ref().is_some_and(|f| !f.passing());
            let reply = tokio::select! {
                biased;
                _ = self.hangup.cancelled() => return Ended::HungUp,
                _ = &mut marker_deadline, if waiting => {
                    if let Some(f) = self.filter.as_mut() {
                        let held = f.give_up();
                        let _ = self.release.send(true);
                        tracing::info!("the terminal's shell did not start the command in time; passing its output as is");
                        if emit(self.stdout, held, self.hangup).await.is_err() {
                            return Ended::HungUp;
                        }
                    }
                    continue;
                }
                r = self.reader.next() => r,
            };
            match reply {
                Ok(Reply::Started { pid }) => {
                    let _ = self.pid.send(Some(pid));
                }
                Ok(Reply::Stdout(data)) => {
                    let data = match self.filter.as_mut() {
                        Some(f) => {
                            let was = f.passing();
                            let out = f.feed(&data);
                            if !was && f.passing() {
                                let _ = self.release.send(true);
                            }
                            out
                        }
                        None => data,
                    };
                    if emit(self.stdout, data, self.hangup).await.is_err() {
                        return Ended::HungUp;
                    }
                }
                Ok(Reply::Stderr(data)) => {
                    if emit(self.stderr, data, self.hangup).await.is_err() {
                        return Ended::HungUp;
                    }
                }
                Ok(Reply::Exit { code }) => return Ended::Finished(Outcome::Exited(code)),
                Ok(Reply::Error { kind, message }) => {
                    return Ended::Finished(Outcome::AgentError { kind, message });
                }
                Ok(Reply::Done | Reply::Other(_)) => {}
                Err(AgentFailure::Closed) => {
                    return Ended::Broken(
                        "the guest agent relay closed before the command ended".into(),
                    );
                }
                Err(e) => return Ended::Broken(e.to_string()),
            }
        }
    }
}

/// Write to the client unless it hangs up meanwhile.
async fn emit(
    out: Option<&dyn Output>,
    data: Vec<u8>,
    hangup: &CancellationToken,
) -> Result<(), ()> {
    let Some(out) = out else { return Ok(()) };
    if data.is_empty() {
        return Ok(());
    }
    tokio::select! {
        r = out.write(Bytes::from(data)) => r,
        _ = hangup.cancelled() => Err(()),
    }
}

/// The client's first terminal size, if it sends one soon.
async fn first_size(resize: Option<&mut mpsc::Receiver<TermSize>>) -> TermSize {
    let Some(rx) = resize else {
        return DEFAULT_SIZE;
    };
    match tokio::time::timeout(FIRST_SIZE_WAIT, rx.recv()).await {
        Ok(Some(size)) if size.width > 0 && size.height > 0 => size,
        _ => DEFAULT_SIZE,
    }
}

/// Forward stdin once released (at once without a terminal; with one, once
/// the command runs, so nothing typed reaches the shell before it), then
/// `stdin_close`.
async fn pump_stdin(
    mut input: Box<dyn Input>,
    writer: AgentWriter,
    mut release: watch::Receiver<bool>,
) {
    if release.wait_for(|r| *r).await.is_err() {
        return;
    }
    while let Some(data) = input.next().await {
        if data.is_empty() {
            continue;
        }
        for frame in stdin_frames(&data) {
            if writer.send(frame).await.is_err() {
                return;
            }
        }
    }
    let _ = writer.send(Request::StdinClose).await;
}

/// Each new terminal size becomes a `pty_resize` RPC on its own connection.
async fn forward_resizes(
    plane: Arc<dyn DataPlane>,
    sandbox: SandboxRef,
    mut sizes: mpsc::Receiver<TermSize>,
    mut pid: watch::Receiver<Option<u32>>,
) {
    while let Some(mut size) = sizes.recv().await {
        // Only the latest of a burst matters.
        while let Ok(newer) = sizes.try_recv() {
            size = newer;
        }
        let Ok(pid) = pid.wait_for(Option::is_some).await.map(|p| p.unwrap_or(0)) else {
            return;
        };
        let req = Request::PtyResize {
            pid,
            cols: size.width,
            rows: size.height,
        };
        if let Err(e) = agent::control(plane.as_ref(), &sandbox, req).await {
            tracing::debug!(error = %e, "terminal resize");
        }
    }
}

fn nonce() -> String {
    let n: u64 = rand::random();
    format!("{n:016x}")
}

#[cfg(test)]
mod tests;
