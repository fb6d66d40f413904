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

mod commands;
mod terminal;
