//! The exec engine against a scripted guest agent on in-memory relays
//! (the end-to-end tests use the simulator's agent through sandboxd's
//! relay).

use std::sync::Mutex;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};

use super::*;
use crate::kubelet::sandbox::{Relay, RelayError, SandboxStats};
use crate::sandboxd::Secret;

/// What the scripted agent saw, by connection.
#[derive(Default)]
struct Seen {
    connections: usize,
    frames: Vec<Value>,
}

struct FakePlane {
    seen: Arc<Mutex<Seen>>,
    reachable: bool,
    killed: Arc<tokio::sync::Notify>,
}

impl FakePlane {
    fn new() -> Arc<FakePlane> {
        Arc::new(FakePlane {
            seen: Arc::default(),
            reachable: true,
            killed: Arc::default(),
        })
    }

    fn ops(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .frames
            .iter()
            .map(|f| f["op"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    fn frames(&self, op: &str) -> Vec<Value> {
        self.seen
            .lock()
            .unwrap()
            .frames
            .iter()
            .filter(|f| f["op"] == op)
            .cloned()
            .collect()
    }
}

fn b64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn unb64(v: &Value) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap_or_default())
        .unwrap()
}

async fn say(w: &mut tokio::io::WriteHalf<DuplexStream>, v: Value) {
    let mut line = v.to_string().into_bytes();
    line.push(b'\n');
    let _ = w.write_all(&line).await;
}

/// One connection of the scripted agent.
async fn agent(io: DuplexStream, seen: Arc<Mutex<Seen>>, killed: Arc<tokio::sync::Notify>) {
    let (r, mut w) = tokio::io::split(io);
    let mut lines = BufReader::new(r).lines();
    let mut running: Option<String> = None;
    loop {
        let line = tokio::select! {
            l = lines.next_line() => l,
            _ = killed.notified(), if running.as_deref() == Some("sleep") => {
                say(&mut w, serde_json::json!({"type": "exit", "code": -1})).await;
                return;
            }
        };
        let Ok(Some(line)) = line else { return };
        let f: Value = serde_json::from_str(&line).unwrap();
        seen.lock().unwrap().frames.push(f.clone());
        match f["op"].as_str().unwrap_or_default() {
            "exec" => {
                let argv: Vec<String> = serde_json::from_value(f["argv"].clone()).unwrap();
                say(&mut w, serde_json::json!({"type": "started", "pid": 42})).await;
                match argv[0].as_str() {
                    "echo" => {
                        let out = format!("{}\n", argv[1..].join(" "));
                        say(
                            &mut w,
                            serde_json::json!({"type": "stdout", "data": b64(out.as_bytes())}),
                        )
                        .await;
                        say(
                            &mut w,
                            serde_json::json!({"type": "stderr", "data": b64(b"to stderr\n")}),
                        )
                        .await;
                        say(&mut w, serde_json::json!({"type": "exit", "code": 3})).await;
                    }
                    "cat" | "sleep" => running = Some(argv[0].clone()),
                    _ => {
                        say(&mut w, serde_json::json!({"type": "error", "kind": "bad_request", "message": "no such command"})).await;
                    }
                }
            }
            "stdin" => {
                let data = unb64(&f["data"]);
                match running.as_deref() {
                    Some("cat") => {
                        say(
                            &mut w,
                            serde_json::json!({"type": "stdout", "data": b64(&data)}),
                        )
                        .await;
                    }
                    Some("pty") => {
                        // The terminal echoes; the injected line starts the command.
                        say(
                            &mut w,
                            serde_json::json!({"type": "stdout", "data": b64(&data)}),
                        )
                        .await;
                        let text = String::from_utf8_lossy(&data).to_string();
                        if let Some(rest) = text.split("\\036' ").nth(1) {
                            let nonce = rest.split(';').next().unwrap_or_default();
                            let argv = rest.split("exec ").nth(1).unwrap_or_default();
                            let argv = argv.trim_end_matches(" || exit 127\n");
                            let out = format!("\x1e{nonce}\x1eran {argv}\r\n");
                            say(
                                &mut w,
                                serde_json::json!({"type": "stdout", "data": b64(out.as_bytes())}),
                            )
                            .await;
                            running = Some("pty-command".into());
                        }
                    }
                    Some("pty-command") => {
                        say(
                            &mut w,
                            serde_json::json!({"type": "stdout", "data": b64(&data)}),
                        )
                        .await;
                        if data.contains(&b'q') {
                            say(&mut w, serde_json::json!({"type": "exit", "code": 0})).await;
                        }
                    }
                    _ => {}
                }
            }
            "stdin_close" if running.as_deref() == Some("cat") => {
                say(&mut w, serde_json::json!({"type": "exit", "code": 0})).await;
            }
            "pty_open" => {
                say(&mut w, serde_json::json!({"type": "started", "pid": 77})).await;
                say(
                    &mut w,
                    serde_json::json!({"type": "stdout", "data": b64(b"motd\r\n$ ")}),
                )
                .await;
                running = Some("pty".into());
            }
            "pty_resize" | "kill" => {
                if f["op"] == "kill" {
                    killed.notify_waiters();
                }
                say(&mut w, serde_json::json!({"type": "done"})).await;
            }
            _ => {}
        }
    }
}

impl DataPlane for FakePlane {
    fn agent<'a>(&'a self, sandbox: &'a SandboxRef) -> BoxFuture<'a, Result<Relay, RelayError>> {
        Box::pin(async move {
            assert_eq!(sandbox.token.expose(), "claim-token");
            if !self.reachable {
                return Err(RelayError::Unreachable("guest agent unreachable".into()));
            }
            self.seen.lock().unwrap().connections += 1;
            let (a, b) = tokio::io::duplex(1 << 16);
            tokio::spawn(agent(b, Arc::clone(&self.seen), Arc::clone(&self.killed)));
            Ok(Box::new(a) as Relay)
        })
    }

    fn port<'a>(&'a self, _: &'a SandboxRef, _: u16) -> BoxFuture<'a, Result<Relay, RelayError>> {
        Box::pin(async { Err(RelayError::Transport("no ports here".into())) })
    }

    fn stats<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<SandboxStats, RelayError>> {
        Box::pin(async { Err(RelayError::Transport("no stats here".into())) })
    }
}

#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<u8>>>);

impl Collect {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).to_string()
    }
}

impl Output for Collect {
    fn write(&self, data: Bytes) -> BoxFuture<'_, Result<(), ()>> {
        self.0.lock().unwrap().extend_from_slice(&data);
        Box::pin(async { Ok(()) })
    }

    fn finish(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

struct Feed(mpsc::Receiver<Bytes>);

impl Input for Feed {
    fn next(&mut self) -> BoxFuture<'_, Option<Bytes>> {
        Box::pin(async move { self.0.recv().await })
    }
}

fn sandbox() -> SandboxRef {
    SandboxRef {
        id: "sb_1".into(),
        token: Secret::new("claim-token"),
    }
}

fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

struct Harness {
    out: Collect,
    err: Collect,
    stdin: Option<mpsc::Sender<Bytes>>,
    resize: Option<mpsc::Sender<TermSize>>,
    hangup: CancellationToken,
}

fn channels(stdin: bool, tty: bool) -> (Harness, Channels) {
    let out = Collect::default();
    let err = Collect::default();
    let (in_tx, in_rx) = mpsc::channel(8);
    let (rs_tx, rs_rx) = mpsc::channel(8);
    let hangup = CancellationToken::new();
    let ch = Channels {
        stdin: stdin.then(|| Box::new(Feed(in_rx)) as Box<dyn Input>),
        stdout: Some(Box::new(out.clone())),
        stderr: (!tty).then(|| Box::new(err.clone()) as Box<dyn Output>),
        resize: tty.then_some(rs_rx),
        hangup: hangup.clone(),
    };
    (
        Harness {
            out,
            err,
            stdin: stdin.then_some(in_tx),
            resize: tty.then_some(rs_tx),
            hangup,
        },
        ch,
    )
}

async fn wait_until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn output_streams_apart_and_the_exit_code() {
    let plane = FakePlane::new();
    let (h, ch) = channels(false, false);
    let req = ExecRequest {
        argv: argv(&["echo", "hello", "world"]),
        tty: false,
    };
    let outcome = run(plane.clone(), sandbox(), req, ch).await;
    assert_eq!(outcome, Outcome::Exited(3));
    assert_eq!(h.out.text(), "hello world\n");
    assert_eq!(h.err.text(), "to stderr\n");
    let exec = plane.frames("exec");
    assert_eq!(
        exec[0]["argv"],
        serde_json::json!(["echo", "hello", "world"])
    );
    assert_eq!(exec[0]["detach"], false);
    // No stdin asked for: the agent is told at once.
    wait_until("stdin_close", || {
        plane.ops().contains(&"stdin_close".to_string())
    })
    .await;
}

#[tokio::test]
async fn stdin_is_forwarded_and_closed() {
    let plane = FakePlane::new();
    let (h, ch) = channels(true, false);
    let tx = h.stdin.clone().unwrap();
    let task = tokio::spawn(run(
        plane.clone(),
        sandbox(),
        ExecRequest {
            argv: argv(&["cat"]),
            tty: false,
        },
        ch,
    ));
    tx.send(Bytes::from_static(b"hi\n")).await.unwrap();
    drop(tx);
    drop(h.stdin);
    assert_eq!(task.await.unwrap(), Outcome::Exited(0));
    assert_eq!(h.out.text(), "hi\n");
    assert_eq!(plane.ops(), ["exec", "stdin", "stdin_close"]);
}

#[tokio::test]
async fn agent_refusals_and_an_unreachable_agent() {
    let plane = FakePlane::new();
    let (_h, ch) = channels(false, false);
    let outcome = run(
        plane,
        sandbox(),
        ExecRequest {
            argv: argv(&["nope"]),
            tty: false,
        },
        ch,
    )
    .await;
    assert_eq!(
        outcome,
        Outcome::AgentError {
            kind: "bad_request".into(),
            message: "no such command".into()
        }
    );
    let down = Arc::new(FakePlane {
        seen: Arc::default(),
        reachable: false,
        killed: Arc::default(),
    });
    let (_h, ch) = channels(false, false);
    let outcome = run(
        down,
        sandbox(),
        ExecRequest {
            argv: argv(&["echo"]),
            tty: false,
        },
        ch,
    )
    .await;
    assert!(matches!(outcome, Outcome::Unreachable(m) if m.contains("guest agent unreachable")));
    let (_h, ch) = channels(false, false);
    let outcome = run(
        FakePlane::new(),
        sandbox(),
        ExecRequest {
            argv: vec![],
            tty: false,
        },
        ch,
    )
    .await;
    assert!(matches!(
        outcome,
        Outcome::Refused {
            reason: "BadRequest",
            ..
        }
    ));
}

#[tokio::test]
async fn a_client_that_hangs_up_gets_its_quiet_process_killed() {
    let plane = FakePlane::new();
    let (h, ch) = channels(false, false);
    let task = tokio::spawn(run(
        plane.clone(),
        sandbox(),
        ExecRequest {
            argv: argv(&["sleep"]),
            tty: false,
        },
        ch,
    ));
    wait_until("the exec", || !plane.frames("exec").is_empty()).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.hangup.cancel();
    assert_eq!(task.await.unwrap(), Outcome::Exited(-1));
    wait_until("the kill", || !plane.frames("kill").is_empty()).await;
    let kill = &plane.frames("kill")[0];
    assert_eq!(kill["pid"], 42);
    assert!(kill.get("signal").is_none(), "SIGKILL is the default");
    assert_eq!(
        plane.seen.lock().unwrap().connections,
        2,
        "kill on its own connection"
    );
}

#[tokio::test]
async fn a_terminal_runs_the_argv_under_the_shell_and_hides_the_preamble() {
    let plane = FakePlane::new();
    let (h, ch) = channels(true, true);
    let resize = h.resize.clone().unwrap();
    resize
        .send(TermSize {
            width: 120,
            height: 40,
        })
        .await
        .unwrap();
    let task = tokio::spawn(run(
        plane.clone(),
        sandbox(),
        ExecRequest {
            argv: argv(&["python3", "-i"]),
            tty: true,
        },
        ch,
    ));
    wait_until("the command", || h.out.text().contains("ran")).await;
    assert_eq!(
        h.out.text(),
        "ran 'python3' '-i'\r\n",
        "no motd, prompt or echo"
    );
    let open = &plane.frames("pty_open")[0];
    assert_eq!(
        (open["cols"].as_u64(), open["rows"].as_u64()),
        (Some(120), Some(40))
    );
    // Typing reaches the command; a resize goes on its own connection.
    let stdin = h.stdin.clone().unwrap();
    stdin.send(Bytes::from_static(b"x")).await.unwrap();
    wait_until("the echo", || h.out.text().ends_with('x')).await;
    resize
        .send(TermSize {
            width: 90,
            height: 30,
        })
        .await
        .unwrap();
    wait_until("the resize", || !plane.frames("pty_resize").is_empty()).await;
    let r = &plane.frames("pty_resize")[0];
    assert_eq!(
        (r["pid"].as_u64(), r["cols"].as_u64(), r["rows"].as_u64()),
        (Some(77), Some(90), Some(30))
    );
    stdin.send(Bytes::from_static(b"q")).await.unwrap();
    assert_eq!(task.await.unwrap(), Outcome::Exited(0));
}

#[tokio::test]
async fn without_a_size_the_terminal_opens_at_80_by_24() {
    let plane = FakePlane::new();
    let (h, ch) = channels(true, true);
    let task = tokio::spawn(run(
        plane.clone(),
        sandbox(),
        ExecRequest {
            argv: argv(&["sh"]),
            tty: true,
        },
        ch,
    ));
    wait_until("the command", || h.out.text().contains("ran")).await;
    let open = &plane.frames("pty_open")[0];
    assert_eq!(
        (open["cols"].as_u64(), open["rows"].as_u64()),
        (Some(80), Some(24))
    );
    h.stdin
        .clone()
        .unwrap()
        .send(Bytes::from_static(b"q"))
        .await
        .unwrap();
    assert_eq!(task.await.unwrap(), Outcome::Exited(0));
}

/// The review's lower note: one large stdin message (a WebSocket one may be
/// 16 MiB) went to the agent as one frame, over its 8 MiB limit once in
/// base64. It now goes in frames of at most 64 KiB, in order.
#[tokio::test]
async fn large_stdin_reaches_the_agent_in_bounded_frames() {
    let plane = FakePlane::new();
    let (h, ch) = channels(true, false);
    let tx = h.stdin.clone().unwrap();
    let task = tokio::spawn(run(
        plane.clone(),
        sandbox(),
        ExecRequest {
            argv: argv(&["cat"]),
            tty: false,
        },
        ch,
    ));
    let big: Vec<u8> = (0..(3 * STDIN_FRAME + 100))
        .map(|i| (i % 251) as u8)
        .collect();
    tx.send(Bytes::from(big.clone())).await.unwrap();
    drop(tx);
    drop(h.stdin);
    assert_eq!(task.await.unwrap(), Outcome::Exited(0));
    let frames = plane.frames("stdin");
    let sizes: Vec<usize> = frames.iter().map(|f| unb64(&f["data"]).len()).collect();
    assert_eq!(sizes, [STDIN_FRAME, STDIN_FRAME, STDIN_FRAME, 100]);
    let joined: Vec<u8> = frames.iter().flat_map(|f| unb64(&f["data"])).collect();
    assert_eq!(joined, big);
    assert_eq!(
        h.out.0.lock().unwrap().len(),
        big.len(),
        "cat echoed it all"
    );
}

/// Finding 5: requests queued for an agent that does not read stop at the
/// queue's bytes (they were 32 frames of any size).
#[tokio::test]
async fn the_agent_queue_is_bounded_in_bytes() {
    struct Deaf(std::sync::Mutex<Vec<DuplexStream>>);
    impl DataPlane for Deaf {
        fn agent<'a>(&'a self, _: &'a SandboxRef) -> BoxFuture<'a, Result<Relay, RelayError>> {
            Box::pin(async move {
                let (a, b) = tokio::io::duplex(4096);
                self.0.lock().unwrap().push(b);
                Ok(Box::new(a) as Relay)
            })
        }
        fn port<'a>(
            &'a self,
            _: &'a SandboxRef,
            _: u16,
        ) -> BoxFuture<'a, Result<Relay, RelayError>> {
            Box::pin(async { Err(RelayError::Transport("none".into())) })
        }
        fn stats<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<SandboxStats, RelayError>> {
            Box::pin(async { Err(RelayError::Transport("none".into())) })
        }
    }
    let plane = Deaf(Default::default());
    let (_reader, writer) = agent::connect(&plane, &sandbox()).await.unwrap();
    let chunk = vec![7u8; 8 * 1024];
    let line = Request::Stdin(chunk.clone()).to_line().len();
    let mut sent = 0;
    while tokio::time::timeout(
        Duration::from_millis(200),
        writer.send(Request::Stdin(chunk.clone())),
    )
    .await
    .is_ok()
    {
        sent += 1;
        assert!(sent < 10_000, "never pushed back");
    }
    // The queue's bytes, plus the batch being written into the pipe.
    let most = agent::QUEUE_BYTES / line + 1;
    assert!(
        sent <= most && sent * line >= agent::QUEUE_BYTES / 2,
        "{sent} lines of {line} bytes queued"
    );
}
