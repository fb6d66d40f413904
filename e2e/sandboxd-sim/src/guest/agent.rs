//! One agent connection, as the in-guest agent serves it: RPCs one after
//! another on the connection ("proto 2"), each streaming responses until a
//! terminal frame (`exit`, `done` or `error`).
//!
//! - A request frame that arrives while a streaming RPC runs ends that RPC's
//!   input and waits until it is over: a resize or a kill of a running
//!   process must come on a second connection.
//! - A client EOF is "client gone" (sandboxd closes the guest connection):
//!   a foreground command is killed when it next writes output (a silent
//!   one runs to completion); a shell is killed at once. Only that process
//!   is: what it started in the background runs on, as in a VM.
//! - After a command exits its remaining output is relayed for up to 2 s,
//!   then `exit`.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::process::{ChildStderr, ChildStdout, Command};
use tokio::sync::mpsc;
use tracing::debug;

use super::Vm;
use super::frames::{self, ErrorKind, ExecSpec, MAX_FRAME, PtySpec, Request};
use super::process::{Launch, exit_code, spawn_piped, spawn_refusal};
use super::pty;

/// How long remaining output may drain after the process exits.
const DRAIN: Duration = Duration::from_secs(2);
/// Output read size.
const CHUNK: usize = 32 * 1024;

/// What the agent's settings are.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The guest shell `pty_open` starts.
    pub shell: String,
}

/// One frame from the client, as the reader task saw it.
#[derive(Debug)]
enum Incoming {
    Req(Request),
    Bad(String),
    /// Longer than the frame cap: answered, then the connection closes.
    TooLarge,
}

/// Reads frames off the connection into a channel; the channel closes on
/// EOF or a read error.
async fn read_frames<R: AsyncRead + Unpin>(reader: R, tx: mpsc::Sender<Incoming>) {
    let mut reader = BufReader::new(reader);
    let mut line = Vec::new();
    loop {
        line.clear();
        let mut limited = (&mut reader).take(MAX_FRAME as u64 + 1);
        match limited.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let incoming = if line.len() > MAX_FRAME && line.last() != Some(&b'\n') {
            Incoming::TooLarge
        } else {
            let trimmed = line.trim_ascii();
            if trimmed.is_empty() {
                continue;
            }
            match frames::parse_request(trimmed) {
                Ok(r) => Incoming::Req(r),
                Err(e) => Incoming::Bad(e),
            }
        };
        let stop = matches!(incoming, Incoming::TooLarge);
        if tx.send(incoming).await.is_err() || stop {
            return;
        }
    }
}

/// Serve one agent connection until the client goes.
pub async fn serve<S>(vm: Arc<Vm>, stream: S, cfg: AgentConfig)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (reader, mut writer) = tokio::io::split(stream);
    let (tx, mut rx) = mpsc::channel(64);
    // Aborted however this connection ends (its future may be dropped when
    // the simulator kills relays), so the read half is never left behind.
    let reader_task = AbortOnDrop(tokio::spawn(read_frames(reader, tx)));
    let mut queued: VecDeque<Incoming> = VecDeque::new();
    let mut conn = Conn {
        vm,
        cfg,
        gone: false,
    };
    loop {
        let incoming = match queued.pop_front() {
            Some(i) => i,
            None => match rx.recv().await {
                Some(i) => i,
                None => break,
            },
        };
        let reply = match incoming {
            Incoming::TooLarge => {
                let _ = writer
                    .write_all(&frames::error(ErrorKind::BadRequest, "frame exceeds 8 MiB"))
                    .await;
                break;
            }
            Incoming::Bad(message) => frames::error(ErrorKind::BadRequest, message),
            Incoming::Req(req) => conn
                .handle(req, &mut rx, &mut writer, &mut queued)
                .await
                .unwrap_or_default(),
        };
        if conn.gone || (!reply.is_empty() && writer.write_all(&reply).await.is_err()) {
            break;
        }
    }
    drop(reader_task);
    let _ = writer.shutdown().await;
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Conn {
    vm: Arc<Vm>,
    cfg: AgentConfig,
    /// The client went away (EOF) or a write to it failed.
    gone: bool,
}

type Writer<S> = tokio::io::WriteHalf<S>;

impl Conn {
    /// One RPC. Streaming RPCs write their own frames and return `None`;
    /// the others return their single reply.
    async fn handle<S: AsyncWrite>(
        &mut self,
        req: Request,
        rx: &mut mpsc::Receiver<Incoming>,
        w: &mut Writer<S>,
        queued: &mut VecDeque<Incoming>,
    ) -> Option<Vec<u8>> {
        match req {
            Request::Exec(spec) if spec.detach => Some(frames::error(
                ErrorKind::Unimplemented,
                "detached commands are not simulated",
            )),
            Request::Exec(spec) => {
                self.exec(spec, rx, w, queued).await;
                None
            }
            Request::PtyOpen(spec) => {
                self.pty(spec, rx, w, queued).await;
                None
            }
            Request::PtyResize { pid, cols, rows } => Some(match self.vm.resize(pid, cols, rows) {
                Ok(()) => frames::done(),
                Err(e) => frames::error(ErrorKind::NotFound, e.to_string()),
            }),
            Request::Kill { pid, signal } => Some(match self.vm.kill(pid, signal) {
                Ok(()) => frames::done(),
                Err(e @ super::PidError::BadSignal(_)) => {
                    frames::error(ErrorKind::BadRequest, e.to_string())
                }
                Err(e) => frames::error(ErrorKind::NotFound, e.to_string()),
            }),
            Request::Ps => Some(frames::procs(self.vm.ps())),
            Request::Info => Some(frames::info(self.vm.uptime_secs(), self.vm.proc_count())),
            Request::Logs { pid } | Request::Attach { pid } => Some(frames::error(
                ErrorKind::NotFound,
                format!("no detached process {pid}"),
            )),
            Request::Stdin(_) | Request::StdinClose => Some(frames::error(
                ErrorKind::BadRequest,
                "no command is running on this connection",
            )),
            Request::Unknown(op) => Some(frames::error(
                ErrorKind::Unimplemented,
                format!("unknown op {op:?}"),
            )),
        }
    }

    async fn send<S: AsyncWrite>(&mut self, w: &mut Writer<S>, frame: &[u8]) {
        if !self.gone && w.write_all(frame).await.is_err() {
            self.gone = true;
        }
    }

    /// A foreground command: `started`, its output, `exit`.
    async fn exec<S: AsyncWrite>(
        &mut self,
        spec: ExecSpec,
        rx: &mut mpsc::Receiver<Incoming>,
        w: &mut Writer<S>,
        queued: &mut VecDeque<Incoming>,
    ) {
        let launch = Launch {
            argv: &spec.argv,
            cwd: spec.cwd.as_deref(),
            env: &spec.env,
            user: spec.user.as_deref(),
            term: "dumb",
            net: self.vm.net(),
        };
        let mut child = match spawn_piped(&self.vm.scratch, &launch, true) {
            Ok(c) => c,
            Err((kind, message)) => return self.send(w, &frames::error(kind, message)).await,
        };
        let Some(pid) = child.id() else {
            return self
                .send(
                    w,
                    &frames::error(ErrorKind::Internal, "the command vanished"),
                )
                .await;
        };
        self.vm.register(pid, spec.argv.clone(), None);
        self.send(w, &frames::started(pid)).await;
        let input = child.stdin.take().map(Input::pipe);
        let source = Source::Pipes {
            stdout: child.stdout.take(),
            stderr: child.stderr.take(),
            merged: spec.session.is_some(),
        };
        let code = self.pump(&mut child, input, source, rx, w, queued).await;
        self.vm.unregister(pid);
        self.send(w, &frames::exit(code)).await;
    }

    /// The guest shell under a pseudo-terminal: `started`, its output as
    /// `stdout`, `exit`.
    async fn pty<S: AsyncWrite>(
        &mut self,
        spec: PtySpec,
        rx: &mut mpsc::Receiver<Incoming>,
        w: &mut Writer<S>,
        queued: &mut VecDeque<Incoming>,
    ) {
        let argv = vec![self.cfg.shell.clone()];
        let launch = Launch {
            argv: &argv,
            cwd: spec.cwd.as_deref(),
            env: &spec.env,
            user: spec.user.as_deref(),
            term: "xterm-256color",
            net: self.vm.net(),
        };
        let mut cmd: Command = match super::process::command(&self.vm.scratch, &launch) {
            Ok(c) => c,
            Err((kind, message)) => return self.send(w, &frames::error(kind, message)).await,
        };
        let opened = pty::open(spec.cols, spec.rows).and_then(|(master, slave)| {
            Ok((master, slave.try_clone()?, slave.try_clone()?, slave))
        });
        let (master, s_in, s_out, s_err) = match opened {
            Ok(p) => p,
            Err(e) => {
                let message = format!("open a pty: {e}");
                return self
                    .send(w, &frames::error(ErrorKind::Internal, message))
                    .await;
            }
        };
        cmd.stdin(s_in)
            .stdout(s_out)
            .stderr(s_err)
            .kill_on_drop(false);
        // SAFETY: between fork and exec the child makes two system calls
        // (setsid, TIOCSCTTY on its stdin, the pty slave); both are
        // async-signal-safe and allocate nothing.
        unsafe {
            cmd.pre_exec(|| {
                rustix::process::setsid()?;
                rustix::process::ioctl_tiocsctty(std::io::stdin().as_fd())?;
                Ok(())
            });
        }
        let spawned = cmd.spawn();
        // The parent keeps no slave descriptor, so the master reads EOF once
        // the shell and everything it started are gone.
        drop(cmd);
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let (kind, message) = spawn_refusal(&argv, &e);
                return self.send(w, &frames::error(kind, message)).await;
            }
        };
        let Some(pid) = child.id() else {
            return self
                .send(w, &frames::error(ErrorKind::Internal, "the shell vanished"))
                .await;
        };
        let master = Arc::new(master);
        self.vm.register(pid, argv, Some(Arc::clone(&master)));
        self.send(w, &frames::started(pid)).await;
        let input = Some(Input::pty(Arc::clone(&master)));
        let code = self
            .pump(&mut child, input, Source::Pty(master), rx, w, queued)
            .await;
        self.vm.unregister(pid);
        self.send(w, &frames::exit(code)).await;
    }

    /// Relay a running process: input frames in, output frames out, until
    /// it exits and its output is drained (at most [`DRAIN`] after the
    /// exit). Returns the exit code.
    async fn pump<S: AsyncWrite>(
        &mut self,
        child: &mut tokio::process::Child,
        mut input: Option<Input>,
        source: Source,
        rx: &mut mpsc::Receiver<Incoming>,
        w: &mut Writer<S>,
        queued: &mut VecDeque<Incoming>,
    ) -> i32 {
        let is_pty = matches!(source, Source::Pty(_));
        let (mut stdout, mut stderr, merged, master) = match source {
            Source::Pipes {
                stdout,
                stderr,
                merged,
            } => (stdout, stderr, merged, None),
            Source::Pty(m) => (None, None, true, Some(m)),
        };
        let mut pty_open = master.is_some();
        let mut out_buf = vec![0u8; CHUNK];
        let mut err_buf = vec![0u8; CHUNK];
        let mut pty_buf = vec![0u8; CHUNK];
        let mut reading = true;
        let mut code: Option<i32> = None;
        let drain = tokio::time::sleep(Duration::MAX);
        tokio::pin!(drain);
        loop {
            let outputs_open = stdout.is_some() || stderr.is_some() || pty_open;
            if code.is_some() && !outputs_open {
                break;
            }
            let mut chunk: Option<(Which, usize)> = None;
            tokio::select! {
                frame = rx.recv(), if reading && !self.gone => match frame {
                    Some(Incoming::Req(Request::Stdin(data))) => {
                        if let Some(i) = &input {
                            i.write(data);
                        }
                    }
                    Some(Incoming::Req(Request::StdinClose)) => {
                        if let Some(i) = input.take() {
                            i.close();
                        }
                    }
                    Some(other) => {
                        // Another request ends this RPC's input and waits.
                        queued.push_back(other);
                        reading = false;
                        input = None;
                    }
                    None => {
                        // Client gone: sandboxd closes the guest connection.
                        self.gone = true;
                        input = None;
                        if is_pty && code.is_none() {
                            let _ = child.start_kill();
                        }
                    }
                },
                n = read_opt(&mut stdout, &mut out_buf) => match n {
                    Some(n) if n > 0 => chunk = Some((Which::Out, n)),
                    _ => stdout = None,
                },
                n = read_opt(&mut stderr, &mut err_buf) => match n {
                    Some(n) if n > 0 => chunk = Some((Which::Err, n)),
                    _ => stderr = None,
                },
                n = read_pty(&master, &mut pty_buf), if pty_open => match n {
                    Some(n) if n > 0 => chunk = Some((Which::Pty, n)),
                    _ => pty_open = false,
                },
                status = child.wait(), if code.is_none() => {
                    code = Some(exit_code(status));
                    drain.as_mut().reset(tokio::time::Instant::now() + DRAIN);
                },
                () = &mut drain, if code.is_some() => break,
            }
            if let Some((which, n)) = chunk {
                let frame = match which {
                    Which::Out => frames::stdout(&out_buf[..n]),
                    Which::Err if merged => frames::stdout(&err_buf[..n]),
                    Which::Err => frames::stderr(&err_buf[..n]),
                    Which::Pty => frames::stdout(&pty_buf[..n]),
                };
                self.send(w, &frame).await;
                if self.gone && code.is_none() {
                    // Output with nobody to take it: the agent's write
                    // fails and it kills the command.
                    let _ = child.start_kill();
                }
            }
        }
        code.unwrap_or(-1)
    }
}

/// Which output a chunk came from.
#[derive(Debug, Clone, Copy)]
enum Which {
    Out,
    Err,
    Pty,
}

/// Where a process's output comes from.
enum Source {
    Pipes {
        stdout: Option<ChildStdout>,
        stderr: Option<ChildStderr>,
        /// A session exec merges stderr into stdout.
        merged: bool,
    },
    Pty(Arc<pty::PtyMaster>),
}

/// Read from an optional pipe; pending for ever when there is none.
/// `None` is EOF or an error.
async fn read_opt<R: AsyncRead + Unpin>(pipe: &mut Option<R>, buf: &mut [u8]) -> Option<usize> {
    match pipe {
        Some(p) => p.read(buf).await.ok(),
        None => std::future::pending().await,
    }
}

async fn read_pty(master: &Option<Arc<pty::PtyMaster>>, buf: &mut [u8]) -> Option<usize> {
    match master {
        Some(m) => m.read(buf).await.ok(),
        None => std::future::pending().await,
    }
}

/// A process's input, written by a task of its own so a full pipe never
/// stops the output from being relayed. Dropping it ends the input.
struct Input {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    /// What `stdin_close` types: nothing for a pipe (its end is EOF), ^D
    /// for a terminal.
    eof: Option<Vec<u8>>,
}

impl Input {
    fn pipe(mut stdin: tokio::process::ChildStdin) -> Input {
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            while let Some(data) = rx.recv().await {
                if stdin.write_all(&data).await.is_err() {
                    return;
                }
            }
            // Dropping stdin closes the pipe: the command reads EOF.
        });
        Input { tx, eof: None }
    }

    fn pty(master: Arc<pty::PtyMaster>) -> Input {
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            while let Some(data) = rx.recv().await {
                if let Err(e) = master.write_all(&data).await {
                    debug!(error = %e, "sandboxd-sim: pty input failed");
                    return;
                }
            }
        });
        Input {
            tx,
            eof: Some(vec![0x04]),
        }
    }

    fn write(&self, data: Vec<u8>) {
        let _ = self.tx.send(data);
    }

    fn close(self) {
        if let Some(eof) = &self.eof {
            let _ = self.tx.send(eof.clone());
        }
    }
}
