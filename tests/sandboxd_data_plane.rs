//! Contract tests of sandboxd's data plane: the client's relay calls
//! (`/agent`, `/ports/{port}`), the buffered `/exec`, `/stats`, the
//! single-sandbox read and the `/owner` probe, against the simulator,
//! whose agent stand-in really runs the commands (and a real pseudo-
//! terminal) in each VM's scratch directory.

mod sandboxd_common;

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use jiff::Timestamp;
use sandboxd_common::*;
use sandboxd_sim::{ClaimPatch, Endpoint, Fault, FaultKind, PortMapping, SimHandle};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, ReadHalf, WriteHalf};
use vk_sandbox::sandboxd::{
    ClaimRequest, ExecRequest, Op, OwnerProbe, Refusal, RelayStream, SandboxAuth, SandboxdClient,
    SandboxdError, Secret,
};

/// A claim: its id and token.
async fn claim(c: &SandboxdClient, net: &str) -> (String, Secret) {
    let granted = c
        .claim(&ClaimRequest {
            template: TEMPLATE.into(),
            net: net.into(),
            ttl_seconds: 3600,
            claim_ref: "ns/pod".into(),
            ..ClaimRequest::default()
        })
        .await
        .expect("claim");
    (granted.id.clone(), (*granted.token).clone())
}

fn hibernate_hook(h: &SimHandle, id: &str, hibernated: bool) {
    h.patch_claim(
        id,
        ClaimPatch {
            hibernated: Some(hibernated),
            ..ClaimPatch::default()
        },
    )
    .expect("patch");
}

fn is_hibernated(h: &SimHandle, id: &str) -> bool {
    h.claims().iter().any(|c| c.id == id && c.hibernated)
}

// ---------------------------------------------------------------------------
// The agent relay
// ---------------------------------------------------------------------------

/// An agent connection speaking the frames.
struct Agent {
    r: BufReader<ReadHalf<RelayStream>>,
    w: WriteHalf<RelayStream>,
}

impl Agent {
    async fn open(c: &SandboxdClient, id: &str, token: &Secret) -> Agent {
        let stream = c.agent(id, token).await.expect("agent relay");
        let (r, w) = tokio::io::split(stream);
        Agent {
            r: BufReader::new(r),
            w,
        }
    }

    async fn send(&mut self, frame: Value) {
        let mut line = serde_json::to_vec(&frame).expect("frame");
        line.push(b'\n');
        self.w.write_all(&line).await.expect("send frame");
    }

    async fn stdin(&mut self, data: &[u8]) {
        self.send(json!({"v":1,"op":"stdin","data":STANDARD.encode(data)}))
            .await;
    }

    async fn next(&mut self) -> Value {
        let mut line = String::new();
        let n = tokio::time::timeout(PATIENCE, self.r.read_line(&mut line))
            .await
            .expect("a frame in time")
            .expect("read a frame");
        assert!(n > 0, "the agent closed the connection");
        serde_json::from_str(&line).expect("a JSON frame")
    }

    /// Frames up to and including the terminal one (`exit`, `done`,
    /// `error`, or a single-frame reply such as `procs`).
    async fn rpc_frames(&mut self) -> Vec<Value> {
        let mut frames = Vec::new();
        loop {
            let f = self.next().await;
            let t = f["type"].as_str().unwrap_or_default().to_string();
            frames.push(f);
            if matches!(t.as_str(), "exit" | "done" | "error" | "procs" | "info") {
                return frames;
            }
        }
    }

    /// Output of `stdout` (or `stderr`) frames, decoded.
    fn output(frames: &[Value], kind: &str) -> String {
        frames
            .iter()
            .filter(|f| f["type"] == kind)
            .map(|f| {
                let bytes = STANDARD
                    .decode(f["data"].as_str().expect("data"))
                    .expect("base64");
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .collect()
    }

    /// Read output frames until the text appears (a terminal's output
    /// arrives in pieces).
    async fn read_until_output(&mut self, want: &str) -> String {
        let mut seen = String::new();
        while !seen.contains(want) {
            let f = self.next().await;
            assert_eq!(f["type"], "stdout", "{f} (seen so far: {seen:?})");
            let bytes = STANDARD
                .decode(f["data"].as_str().expect("data"))
                .expect("b64");
            seen.push_str(&String::from_utf8_lossy(&bytes));
        }
        seen
    }
}

#[tokio::test]
async fn agent_exec_streams_both_outputs_and_the_exit_code() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim(&c, "").await;
    let mut a = Agent::open(&c, &id, &token).await;
    a.send(json!({"v":1,"op":"exec","argv":["sh","-c","echo out; echo err >&2; exit 3"],"detach":false}))
        .await;
    let frames = a.rpc_frames().await;
    assert_eq!(frames[0]["type"], "started", "{frames:?}");
    assert!(frames[0]["pid"].as_u64().is_some_and(|p| p > 0));
    assert_eq!(Agent::output(&frames, "stdout"), "out\n");
    assert_eq!(Agent::output(&frames, "stderr"), "err\n");
    assert_eq!(frames.last().expect("exit")["type"], "exit");
    assert_eq!(frames.last().expect("exit")["code"], 3);

    // RPCs follow one another on one connection.
    a.send(json!({"v":1,"op":"exec","argv":["pwd"],"detach":false}))
        .await;
    let frames = a.rpc_frames().await;
    let state = h.claim_state(&id).expect("state");
    let scratch = state["scratch_dir"]
        .as_str()
        .expect("scratch dir")
        .to_string();
    assert_eq!(Agent::output(&frames, "stdout").trim_end(), scratch);
    assert_eq!(frames.last().expect("exit")["code"], 0);

    // The environment is cleared to PATH and TERM plus what was asked.
    a.send(json!({"v":1,"op":"exec","argv":["env"],"env":{"GREETING":"hi"},"detach":false}))
        .await;
    let frames = a.rpc_frames().await;
    let mut names: Vec<String> = Agent::output(&frames, "stdout")
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.to_string()))
        .collect();
    names.sort();
    assert_eq!(names, ["GREETING", "PATH", "TERM"]);

    // A command that cannot start is the caller's error.
    a.send(json!({"v":1,"op":"exec","argv":["/nonexistent/cmd"],"detach":false}))
        .await;
    let frames = a.rpc_frames().await;
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(
        (frames[0]["type"].as_str(), frames[0]["kind"].as_str()),
        (Some("error"), Some("bad_request"))
    );
    a.send(json!({"v":1,"op":"exec","argv":["true"],"cwd":"no/such/dir","detach":false}))
        .await;
    assert_eq!(a.rpc_frames().await[0]["kind"], "bad_request");
    a.send(json!({"v":1,"op":"nonsense"})).await;
    assert_eq!(a.rpc_frames().await[0]["kind"], "unimplemented");
    a.send(json!({"v":1,"op":"info"})).await;
    let info = a.rpc_frames().await;
    assert_eq!(info[0]["proto"], 2);

    // The scratch directory goes with the sandbox.
    assert!(std::path::Path::new(&scratch).is_dir());
    drop(a);
    c.release(&id, &token).await.expect("release");
    assert!(
        !std::path::Path::new(&scratch).exists(),
        "scratch dir removed on release"
    );
}

#[tokio::test]
async fn agent_stdin_frames_feed_the_command_and_another_request_ends_its_input() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim(&c, "").await;
    let mut a = Agent::open(&c, &id, &token).await;
    a.send(json!({"v":1,"op":"exec","argv":["cat"],"detach":false}))
        .await;
    let started = a.next().await;
    assert_eq!(started["type"], "started");
    a.stdin(b"hello ").await;
    a.stdin(b"world\n").await;
    a.send(json!({"v":1,"op":"stdin_close"})).await;
    let frames = a.rpc_frames().await;
    assert_eq!(Agent::output(&frames, "stdout"), "hello world\n");
    assert_eq!(frames.last().expect("exit")["code"], 0);

    // A request frame while `cat` runs ends its input and waits its turn.
    a.send(json!({"v":1,"op":"exec","argv":["cat"],"detach":false}))
        .await;
    assert_eq!(a.next().await["type"], "started");
    a.stdin(b"abc").await;
    a.send(json!({"v":1,"op":"ps"})).await;
    let frames = a.rpc_frames().await;
    assert_eq!(Agent::output(&frames, "stdout"), "abc");
    assert_eq!(frames.last().expect("exit")["code"], 0);
    let procs = a.rpc_frames().await;
    assert_eq!(procs[0]["type"], "procs");
    assert_eq!(procs[0]["procs"], json!([]), "cat has exited");
}

#[tokio::test]
async fn agent_kill_on_a_second_connection_ends_the_command_with_minus_one() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim(&c, "").await;
    let mut a = Agent::open(&c, &id, &token).await;
    a.send(json!({"v":1,"op":"exec","argv":["sleep","60"],"detach":false}))
        .await;
    let pid = a.next().await["pid"].as_u64().expect("pid");
    let mut b = Agent::open(&c, &id, &token).await;
    b.send(json!({"v":1,"op":"ps"})).await;
    let procs = b.rpc_frames().await;
    assert_eq!(procs[0]["procs"][0]["pid"], pid);
    assert_eq!(procs[0]["procs"][0]["argv"], json!(["sleep", "60"]));
    b.send(json!({"v":1,"op":"kill","pid":pid})).await;
    assert_eq!(b.rpc_frames().await[0]["type"], "done");
    let frames = a.rpc_frames().await;
    assert_eq!(
        frames.last().expect("exit")["code"],
        -1,
        "killed: {frames:?}"
    );
    b.send(json!({"v":1,"op":"kill","pid":pid})).await;
    assert_eq!(b.rpc_frames().await[0]["kind"], "not_found");
}

#[tokio::test]
async fn agent_pty_runs_the_shell_under_a_real_terminal_with_resize() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim(&c, "").await;
    let mut a = Agent::open(&c, &id, &token).await;
    a.send(json!({"v":1,"op":"pty_open","cols":80,"rows":24}))
        .await;
    let started = a.next().await;
    assert_eq!(started["type"], "started", "{started}");
    let pid = started["pid"].as_u64().expect("pid");
    // The marker is computed, so the echoed command line never contains
    // it (nor the prompt, whose path carries the random sandbox id).
    a.stdin(b"stty size; tty; echo done-$((6*7))\n").await;
    let seen = a.read_until_output("done-42").await;
    assert!(seen.contains("24 80"), "{seen:?}");
    assert!(seen.contains("/dev/pts/"), "a real terminal: {seen:?}");

    // A resize goes on a second connection, keyed by the shell's pid.
    let mut b = Agent::open(&c, &id, &token).await;
    b.send(json!({"v":1,"op":"pty_resize","pid":pid,"cols":132,"rows":40}))
        .await;
    assert_eq!(b.rpc_frames().await[0]["type"], "done");
    a.stdin(b"stty size\n").await;
    a.read_until_output("40 132").await;
    b.send(json!({"v":1,"op":"pty_resize","pid":999_999,"cols":1,"rows":1}))
        .await;
    assert_eq!(b.rpc_frames().await[0]["kind"], "not_found");

    a.stdin(b"exit 7\n").await;
    let exit = loop {
        let f = a.next().await;
        if f["type"] == "exit" {
            break f;
        }
        assert_eq!(f["type"], "stdout", "{f}");
    };
    assert_eq!(exit["code"], 7);
}

#[tokio::test]
async fn agent_client_gone_kills_the_shell() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim(&c, "").await;
    let mut a = Agent::open(&c, &id, &token).await;
    a.send(json!({"v":1,"op":"pty_open","cols":80,"rows":24}))
        .await;
    let pid = a.next().await["pid"].as_u64().expect("pid");
    let listed = |h: &SimHandle| {
        h.claim_state(&id).expect("state")["processes"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["pid"] == pid))
    };
    assert!(listed(&h));
    drop(a);
    wait_until("the shell is gone", || async { !listed(&h) }).await;
}

/// stdout of an exec, as the client would get it.
#[derive(Clone, Default)]
struct Collected(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl vk_sandbox::kubelet::exec::Output for Collected {
    fn write(&self, data: bytes::Bytes) -> futures::future::BoxFuture<'_, Result<(), ()>> {
        self.0.lock().unwrap().extend_from_slice(&data);
        Box::pin(async { Ok(()) })
    }
    fn finish(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// `kubectl exec -t` of `argv` through the exec engine, against the
/// simulator's agent whose terminal runs `shell` (empty: its default,
/// bash) on a real pseudo-terminal: the outcome and what the user sees.
async fn exec_on_a_terminal(
    shell: &str,
    argv: &[String],
) -> (vk_sandbox::kubelet::exec::Outcome, String) {
    use vk_sandbox::kubelet::exec::{self, Channels, ExecRequest as Exec};
    let mut cfg = cfg();
    cfg.agent_shell = shell.into();
    let h = sim(cfg).await;
    let c = client(&h);
    let (id, token) = claim(&c, "").await;
    let out = Collected::default();
    let ch = Channels {
        stdin: None,
        stdout: Some(Box::new(out.clone())),
        stderr: None,
        resize: None,
        hangup: tokio_util::sync::CancellationToken::new(),
    };
    let plane = std::sync::Arc::new(vk_sandbox::kubelet::SandboxdPlane::new(c));
    let outcome = tokio::time::timeout(
        PATIENCE,
        exec::run(
            plane,
            vk_sandbox::kubelet::SandboxRef { id, token },
            Exec {
                argv: argv.to_vec(),
                tty: true,
            },
            ch,
        ),
    )
    .await
    .expect("the command ends in time");
    let seen = String::from_utf8_lossy(&out.0.lock().unwrap()).into_owned();
    (outcome, seen)
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Finding 8 of the 2026-12-b review: the argv reaches the program whole,
/// whatever the shell's line editor would do to it typed as is (bash
/// completes on a TAB; dash's terminal cuts lines at 4095 bytes, busybox
/// ash's editor at 1024).
#[tokio::test]
async fn a_terminal_runs_any_argv_whole_under_each_shell() {
    let tab = strings(&["printf", "%s", "a\tb"]);
    let (outcome, seen) = exec_on_a_terminal("", &tab).await;
    assert_eq!(outcome, vk_sandbox::kubelet::exec::Outcome::Exited(0));
    assert_eq!(seen, "a\tb", "bash: the TAB arrives as a TAB");

    let long = "x".repeat(5000);
    let count = strings(&["sh", "-c", "printf %s \"$1\" | wc -c", "_", &long]);
    let mut shells = vec!["/bin/sh", "/bin/bash"];
    if std::path::Path::new("/usr/bin/busybox").exists() {
        // busybox-static from e2e/deps.sh; its `sh` applet is ash.
        let dir = tempfile::tempdir().expect("tempdir");
        let ash = dir.path().join("sh");
        std::os::unix::fs::symlink("/usr/bin/busybox", &ash).expect("symlink");
        let ash = ash.to_string_lossy().into_owned();
        for argv in [&tab, &count] {
            let (outcome, seen) = exec_on_a_terminal(&ash, argv).await;
            assert_eq!(
                outcome,
                vk_sandbox::kubelet::exec::Outcome::Exited(0),
                "{seen:?}"
            );
            let want = if argv == &tab { "a\tb" } else { "5000" };
            assert_eq!(seen.trim(), want, "busybox ash");
        }
        drop(dir);
    } else {
        eprintln!("busybox not installed: its ash is not checked (e2e/deps.sh installs it)");
    }
    for shell in shells.drain(..) {
        let (outcome, seen) = exec_on_a_terminal(shell, &count).await;
        assert_eq!(
            outcome,
            vk_sandbox::kubelet::exec::Outcome::Exited(0),
            "{shell}: {seen:?}"
        );
        assert_eq!(seen.trim(), "5000", "{shell}: the 5000-byte argument whole");
    }
}

#[tokio::test]
async fn agent_refusals_and_the_implicit_wake() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim(&c, "").await;
    // The root token is a wrong token here.
    assert_refused(
        c.agent(&id, &Secret::new(ROOT)).await,
        Op::Agent,
        404,
        Refusal::UnknownSandbox,
    );
    assert_refused(
        c.agent(&id, &Secret::new("")).await,
        Op::Agent,
        401,
        Refusal::Unauthorized,
    );
    assert_refused(
        c.agent("sb_0000000000000000", &token).await,
        Op::Agent,
        404,
        Refusal::UnknownSandbox,
    );
    // No upgrade header: 426 naming the protocol, before anything wakes.
    hibernate_hook(&h, &id, true);
    let resp = reqwest::Client::new()
        .get(format!("{}/v1/sandboxes/{id}/agent", h.base_url()))
        .bearer_auth(token.expose())
        .send()
        .await
        .expect("plain GET");
    assert_eq!(resp.status().as_u16(), 426);
    assert_eq!(resp.headers()["upgrade"], "silkd");
    assert!(is_hibernated(&h, &id), "a plain GET never wakes");
    // A failed implicit wake is sandboxd's 500.
    h.arm_fault(Fault::fail(Endpoint::Wake).times(1))
        .expect("arm");
    assert_refused(c.agent(&id, &token).await, Op::Agent, 500, Refusal::Failed);
    assert!(is_hibernated(&h, &id));
    // The relay wakes a hibernated sandbox first.
    let mut a = Agent::open(&c, &id, &token).await;
    assert!(!is_hibernated(&h, &id), "woken by the relay");
    a.send(json!({"v":1,"op":"exec","argv":["true"],"detach":false}))
        .await;
    assert_eq!(a.rpc_frames().await.last().expect("exit")["code"], 0);
    // A failed VM has no guest.
    h.patch_claim(
        &id,
        ClaimPatch {
            failed: Some("vmm exited".into()),
            ..ClaimPatch::default()
        },
    )
    .expect("patch");
    assert_refused(
        c.agent(&id, &token).await,
        Op::Agent,
        409,
        Refusal::Conflict,
    );
    // A status fault answers before the upgrade.
    h.arm_fault(Fault::status(Endpoint::Agent, 502).times(1))
        .expect("arm");
    assert_refused(
        c.agent(&id, &token).await,
        Op::Agent,
        502,
        Refusal::GuestUnreachable,
    );
    let log = h.requests();
    assert!(
        log.iter()
            .any(|r| r.path.ends_with("/agent") && r.status == Some(101)),
        "{log:?}"
    );
}

// ---------------------------------------------------------------------------
// The buffered exec
// ---------------------------------------------------------------------------

#[tokio::test]
async fn exec_runs_the_command_and_maps_each_status() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim(&c, "").await;
    let req = |argv: &[&str]| ExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        ..ExecRequest::default()
    };
    let out = c
        .exec(
            &id,
            &token,
            &req(&["sh", "-c", "echo out; echo err >&2; exit 3"]),
        )
        .await
        .expect("exec");
    assert_eq!(
        (out.exit_code, out.stdout.as_str(), out.stderr.as_str()),
        (3, "out\n", "err\n")
    );
    let mut env = BTreeMap::new();
    env.insert("X".to_string(), "y".to_string());
    let out = c
        .exec(
            &id,
            &token,
            &ExecRequest {
                argv: vec![
                    "sh".into(),
                    "-c".into(),
                    "printf %s \"$X\"; printf '\\377'".into(),
                ],
                env,
                ..ExecRequest::default()
            },
        )
        .await
        .expect("exec with env");
    assert_eq!(out.stdout, "y\u{fffd}", "non-UTF-8 output becomes U+FFFD");

    let slow = ExecRequest {
        timeout_seconds: 1,
        ..req(&["sleep", "30"])
    };
    assert_refused(
        c.exec(&id, &token, &slow).await,
        Op::Exec,
        504,
        Refusal::TimedOut,
    );
    assert_refused(
        c.exec(&id, &token, &req(&["/no/such/binary"])).await,
        Op::Exec,
        400,
        Refusal::BadRequest,
    );
    assert_refused(
        c.exec(&id, &Secret::new(ROOT), &req(&["true"])).await,
        Op::Exec,
        404,
        Refusal::UnknownSandbox,
    );
    assert_refused(
        c.exec(&id, &Secret::new(""), &req(&["true"])).await,
        Op::Exec,
        401,
        Refusal::Unauthorized,
    );
    let big = req(&["sh", "-c", "head -c 9000000 /dev/zero"]);
    assert_refused(
        c.exec(&id, &token, &big).await,
        Op::Exec,
        413,
        Refusal::TooLarge,
    );
    assert!(matches!(
        c.exec(&id, &token, &req(&[])).await,
        Err(SandboxdError::InvalidRequest { op: Op::Exec, .. })
    ));
    // Strict decoding: an unknown field is a 400.
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/sandboxes/{id}/exec", h.base_url()))
        .bearer_auth(token.expose())
        .body(r#"{"argv":["true"],"tty":true}"#)
        .send()
        .await
        .expect("raw exec");
    assert_eq!(resp.status().as_u16(), 400);

    // It wakes a hibernated sandbox.
    hibernate_hook(&h, &id, true);
    assert_eq!(
        c.exec(&id, &token, &req(&["true"]))
            .await
            .expect("exec")
            .exit_code,
        0
    );
    assert!(!is_hibernated(&h, &id));
}

// ---------------------------------------------------------------------------
// The port relay
// ---------------------------------------------------------------------------

/// A guest service: echoes what it reads, after the client's EOF.
async fn echo_service() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut all = Vec::new();
                if s.read_to_end(&mut all).await.is_ok() {
                    let _ = s.write_all(&all).await;
                    let _ = s.shutdown().await;
                }
            });
        }
    });
    addr
}

fn map(
    h: &SimHandle,
    template: Option<&str>,
    sandbox: Option<&str>,
    guest_port: u16,
    target: std::net::SocketAddr,
) {
    h.map_port(
        PortMapping {
            sandbox: sandbox.map(str::to_string),
            template: template.map(str::to_string),
            guest_port,
            target,
        },
        false,
    )
    .expect("map port");
}

#[tokio::test]
async fn port_relay_is_byte_exact_and_half_closes_both_ways() {
    let h = sim(cfg()).await;
    let c = client_with(&h, Some(ROOT), Duration::from_millis(500));
    let (id, token) = claim(&c, "").await;
    map(&h, Some(TEMPLATE), None, 8080, echo_service().await);

    let mut relay = c.port(&id, &token, 8080).await.expect("relay");
    // Idle longer than the client's request timeout: a relay has none.
    tokio::time::sleep(Duration::from_millis(900)).await;
    relay.write_all(b"hello").await.expect("write");
    relay.shutdown().await.expect("half-close");
    let mut back = Vec::new();
    relay
        .read_to_end(&mut back)
        .await
        .expect("read to the guest's EOF");
    assert_eq!(back, b"hello");

    // 8 MiB each way, concurrently, byte for byte.
    let payload: Vec<u8> = (0..8 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let relay = c.port(&id, &token, 8080).await.expect("relay");
    let (mut r, mut w) = tokio::io::split(relay);
    let send = async {
        w.write_all(&payload).await.expect("send");
        w.shutdown().await.expect("half-close");
    };
    let recv = async {
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.expect("receive");
        got
    };
    let ((), got) = tokio::time::timeout(PATIENCE, async { tokio::join!(send, recv) })
        .await
        .expect("transfer in time");
    assert_eq!(got.len(), payload.len());
    assert!(got == payload, "byte-exact");
    let log = h.requests();
    assert!(
        log.iter()
            .any(|r| r.path.ends_with("/ports/8080") && r.status == Some(101))
    );
}

#[tokio::test]
async fn port_relay_keeps_guest_bytes_sent_right_after_the_101() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim(&c, "").await;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        if let Ok((mut s, _)) = l.accept().await {
            let _ = s.write_all(b"SSH-2.0-guest\r\n").await;
            let _ = s.shutdown().await;
        }
    });
    map(&h, None, Some(&id), 22, addr);
    let mut relay = c.port(&id, &token, 22).await.expect("relay");
    let mut banner = Vec::new();
    relay.read_to_end(&mut banner).await.expect("banner");
    assert_eq!(banner, b"SSH-2.0-guest\r\n");
}

#[tokio::test]
async fn port_relay_refusals_and_the_passive_root_relay() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim(&c, "").await;
    // Nothing mapped, and mapped to a port where nothing listens: 502.
    assert_refused(
        c.port(&id, &token, 9).await,
        Op::Port,
        502,
        Refusal::GuestUnreachable,
    );
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    map(&h, Some(TEMPLATE), None, 9, closed);
    assert_refused(
        c.port(&id, &token, 9).await,
        Op::Port,
        502,
        Refusal::GuestUnreachable,
    );
    assert_refused(
        c.port(&id, &token, 0).await,
        Op::Port,
        400,
        Refusal::BadRequest,
    );
    assert_refused(
        c.port(&id, &Secret::new("x"), 80).await,
        Op::Port,
        404,
        Refusal::UnknownSandbox,
    );
    let resp = reqwest::Client::new()
        .get(format!("{}/v1/sandboxes/{id}/ports/80", h.base_url()))
        .bearer_auth(token.expose())
        .send()
        .await
        .expect("plain GET");
    assert_eq!(resp.status().as_u16(), 426);
    assert_eq!(resp.headers()["upgrade"], "tcp");
    for bad in ["65536", "http", "-1", "+22"] {
        let resp = reqwest::Client::new()
            .get(format!("{}/v1/sandboxes/{id}/ports/{bad}", h.base_url()))
            .bearer_auth(token.expose())
            .header("upgrade", "tcp")
            .header("connection", "Upgrade")
            .send()
            .await
            .expect("bad port");
        assert_eq!(resp.status().as_u16(), 400, "{bad}");
    }

    // The root token's relay is passive: no wake, 409 while paused.
    map(&h, Some(TEMPLATE), None, 8080, echo_service().await);
    hibernate_hook(&h, &id, true);
    assert_refused(
        c.port_as_node(&id, 8080).await,
        Op::Port,
        409,
        Refusal::Conflict,
    );
    assert!(is_hibernated(&h, &id), "a passive relay never wakes");
    // The sandbox token wakes it.
    let mut relay = c.port(&id, &token, 8080).await.expect("waking relay");
    assert!(!is_hibernated(&h, &id));
    relay.shutdown().await.expect("half-close");
    let mut passive = c.port_as_node(&id, 8080).await.expect("passive relay");
    passive.write_all(b"metrics").await.expect("write");
    passive.shutdown().await.expect("half-close");
    let mut back = Vec::new();
    passive.read_to_end(&mut back).await.expect("read");
    assert_eq!(back, b"metrics");
    // Mid builds: root is just a wrong token.
    h.patch_config(serde_json::from_value(json!({"passive_root_ports": false})).expect("patch"));
    assert_refused(
        c.port_as_node(&id, 8080).await,
        Op::Port,
        404,
        Refusal::UnknownSandbox,
    );
}

#[tokio::test]
async fn an_open_relay_holds_the_sandbox_against_idle_hibernation() {
    let mut cfg = cfg();
    cfg.idle_hibernate_seconds = 60;
    let h = sim(cfg).await;
    let c = client(&h);
    let (id, token) = claim(&c, "").await;
    map(&h, Some(TEMPLATE), None, 8080, echo_service().await);
    let mut relay = c.port(&id, &token, 8080).await.expect("relay");
    h.patch_clock(serde_json::from_value(json!({"advance_seconds": 600})).expect("clock"));
    assert!(h.sweep().is_empty(), "an open relay holds it");
    relay.shutdown().await.expect("half-close");
    let mut rest = Vec::new();
    relay.read_to_end(&mut rest).await.expect("drain");
    drop(relay);
    wait_until("the relay is closed", || async {
        h.claim_state(&id).expect("state")["open_relays"] == 0
    })
    .await;
    // Its end counted as activity: idle from then on.
    assert!(h.sweep().is_empty());
    h.patch_clock(serde_json::from_value(json!({"advance_seconds": 61})).expect("clock"));
    assert_eq!(h.sweep(), vec![id.clone()]);
    assert!(is_hibernated(&h, &id));
}

// ---------------------------------------------------------------------------
// Stats, the single-sandbox read, the owner probe
// ---------------------------------------------------------------------------

#[tokio::test]
async fn stats_report_memory_only_while_running() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, _) = claim(&c, "").await;
    let s = c.stats(&id).await.expect("stats");
    assert_eq!(
        (s.id.as_str(), s.cpu_count, s.mem_total_bytes),
        (id.as_str(), 1, 512 * 1024 * 1024)
    );
    assert_eq!(s.mem_used_bytes, Some(128 * 1024 * 1024));
    assert_eq!(
        s.measured_at,
        Some("2026-07-06T00:00:00Z".parse::<Timestamp>().expect("ts"))
    );
    h.patch_claim(
        &id,
        ClaimPatch {
            mem_used_bytes: Some(42),
            ..ClaimPatch::default()
        },
    )
    .expect("patch");
    assert_eq!(c.stats(&id).await.expect("stats").mem_used_bytes, Some(42));
    hibernate_hook(&h, &id, true);
    let s = c.stats(&id).await.expect("stats");
    assert!(s.hibernated);
    assert_eq!(
        s.mem_used_bytes, None,
        "hibernated: not measured, never zero"
    );
    assert_refused(
        c.stats("sb_0000000000000000").await,
        Op::Stats,
        404,
        Refusal::UnknownSandbox,
    );
    let anon = client_with(&h, Some("wrong"), Duration::from_secs(5));
    assert_refused(anon.stats(&id).await, Op::Stats, 401, Refusal::Unauthorized);
}

#[tokio::test]
async fn get_reads_one_row_with_its_token_for_root() {
    let mut cfg = cfg();
    cfg.tenants = vec![sandboxd_sim::TenantConfig {
        name: "acme".into(),
        token: "acme-token".into(),
        max_claims: 0,
    }];
    let h = sim(cfg).await;
    let c = client(&h);
    let (id, token) = claim(&c, "").await;
    let info = c.get(&id).await.expect("get");
    assert_eq!(info.id, id);
    assert_eq!(info.claim_ref, "ns/pod");
    assert_eq!(
        info.token.as_ref().map(Secret::expose),
        Some(token.expose())
    );
    assert!(!info.hibernated && !info.archived && info.failed.is_none());
    h.patch_claim(
        &id,
        ClaimPatch {
            failed: Some("vmm exited".into()),
            ..ClaimPatch::default()
        },
    )
    .expect("patch");
    assert_eq!(
        c.get(&id).await.expect("get").failed.as_deref(),
        Some("vmm exited")
    );
    let tenant = client_with(&h, Some("acme-token"), Duration::from_secs(5));
    assert_refused(tenant.get(&id).await, Op::Get, 403, Refusal::Forbidden);
    assert_refused(
        c.get("sb_0000000000000000").await,
        Op::Get,
        404,
        Refusal::UnknownSandbox,
    );
    h.patch_config(
        serde_json::from_value(json!({"quirks": {"no_token_in_get": true}})).expect("patch"),
    );
    assert!(c.get(&id).await.expect("get").token.is_none(), "mid builds");
    // A build without the route answers the router's plain-text 404.
    h.arm_fault(
        Fault::new(
            Endpoint::Get,
            FaultKind::Status {
                status: 404,
                error: None,
                body: Some("404 page not found\n".into()),
                content_type: Some("text/plain; charset=utf-8".into()),
            },
        )
        .times(1),
    )
    .expect("arm");
    assert_refused(c.get(&id).await, Op::Get, 404, Refusal::Unsupported);
}

#[tokio::test]
async fn owner_probe_answers_for_the_token_and_leaves_a_paused_sandbox_paused() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim(&c, "").await;
    hibernate_hook(&h, &id, true);
    assert_eq!(
        c.owner(&id, &token).await.expect("owner"),
        OwnerProbe::Owned {
            owner_addr: "10.0.0.5:7777".into()
        }
    );
    assert!(is_hibernated(&h, &id), "the probe does not wake");
    assert_eq!(
        c.owner(&id, &Secret::new(ROOT)).await.expect("root"),
        OwnerProbe::NotOwnedHere
    );
    assert_eq!(
        c.owner("sb_0000000000000000", &token).await.expect("gone"),
        OwnerProbe::NotOwnedHere
    );
    assert_refused(
        c.owner(&id, &Secret::new("")).await,
        Op::Owner,
        401,
        Refusal::Unauthorized,
    );
    let _ = SandboxAuth::Node;
}

// ---------------------------------------------------------------------------
// The guest network and the VM's processes
// ---------------------------------------------------------------------------

/// A process's state letter from `/proc/PID/stat` (`None`: no such
/// process).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// Alive: exists and is neither a zombie nor dead.
fn alive(pid: u32) -> bool {
    proc_state(pid).is_some_and(|s| !matches!(s, 'Z' | 'X'))
}

/// Processes (alive) in the network namespace the simulator names `path`.
fn processes_in(path: &str) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let ns = std::fs::metadata(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && alive(pid))
        .filter(|pid| {
            std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|m| m.dev() == ns.dev() && m.ino() == ns.ino())
        })
        .collect()
}

/// The simulator makes a namespace per VM here, or the test says why it
/// skips.
fn namespaces_or_skip(h: &SimHandle) -> bool {
    match h.guests().network() {
        sandboxd_sim::GuestNetwork::Namespaces => true,
        other => {
            eprintln!("SKIPPED: no network namespaces here: {}", other.describe());
            false
        }
    }
}

fn busybox_or_skip() -> bool {
    let found = std::process::Command::new("busybox")
        .arg("true")
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        eprintln!("SKIPPED: busybox is not installed (e2e/deps.sh installs busybox-static)");
    }
    found
}

/// `GET /` over a port relay to the guest's port.
async fn http_get_in_guest(c: &SandboxdClient, id: &str, token: &Secret, port: u16) -> String {
    let mut relay = c.port(id, token, port).await.expect("relay to the guest");
    relay
        .write_all(b"GET / HTTP/1.0\r\n\r\n")
        .await
        .expect("request");
    let mut reply = Vec::new();
    tokio::time::timeout(PATIENCE, relay.read_to_end(&mut reply))
        .await
        .expect("a reply in time")
        .expect("read the reply");
    String::from_utf8_lossy(&reply).into_owned()
}

fn sh(script: &str) -> ExecRequest {
    ExecRequest {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        ..ExecRequest::default()
    }
}

#[tokio::test]
async fn each_vm_has_a_guest_network_of_its_own() {
    let h = sim(cfg()).await;
    if !namespaces_or_skip(&h) || !busybox_or_skip() {
        return;
    }
    let c = client(&h);
    let (a, a_token) = claim(&c, "").await;
    let (b, b_token) = claim(&c, "").await;
    // Both listen on 8080, each in its own VM; busybox httpd makes itself
    // a daemon (a session of its own) and the exec ends at once.
    for (id, token, name) in [(&a, &a_token, "vm-a"), (&b, &b_token, "vm-b")] {
        let out = c
            .exec(
                id,
                token,
                &sh(&format!(
                    "echo {name} > index.html && busybox httpd -p 127.0.0.1:8080 -h ."
                )),
            )
            .await
            .expect("start a server");
        assert_eq!(out.exit_code, 0, "{out:?}");
    }
    for (id, token, name) in [(&a, &a_token, "vm-a"), (&b, &b_token, "vm-b")] {
        let reply = http_get_in_guest(&c, id, token, 8080).await;
        assert!(
            reply.starts_with("HTTP/1.") && reply.ends_with(&format!("{name}\n")),
            "{reply}"
        );
    }
    // The guest's own loopback: a port nobody listens on answers 502 at
    // once, and the guest sees only its loopback.
    assert_refused(
        c.port(&a, &a_token, 8081).await,
        Op::Port,
        502,
        Refusal::GuestUnreachable,
    );
    let links = c
        .exec(&a, &a_token, &sh("cat /proc/net/dev"))
        .await
        .expect("exec");
    let ifaces: Vec<&str> = links
        .stdout
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifaces, ["lo"], "{}", links.stdout);

    // The namespace is named in the admin API; the server is in it.
    let netns = |id: &str| {
        h.claim_state(id).expect("state")["netns"]
            .as_str()
            .expect("a namespace path")
            .to_string()
    };
    let (a_ns, b_ns) = (netns(&a), netns(&b));
    assert_ne!(a_ns, b_ns);
    let a_procs = processes_in(&a_ns);
    assert_eq!(a_procs.len(), 1, "the daemon alone: {a_procs:?}");
    let server = a_procs[0];
    let cmdline = std::fs::read(format!("/proc/{server}/cmdline")).expect("cmdline");
    assert!(
        String::from_utf8_lossy(&cmdline).contains("httpd"),
        "{cmdline:?}"
    );

    // Hibernate stops it, wake continues it; the other VM is untouched.
    c.hibernate(&a, SandboxAuth::Node).await.expect("hibernate");
    wait_until("the server stopped with its VM", || async {
        proc_state(server) == Some('T')
    })
    .await;
    let b_server = processes_in(&b_ns)[0];
    assert_ne!(proc_state(b_server), Some('T'));
    c.wake(&a, SandboxAuth::Node).await.expect("wake");
    assert_ne!(proc_state(server), Some('T'), "continued on wake");
    assert!(
        http_get_in_guest(&c, &a, &a_token, 8080)
            .await
            .ends_with("vm-a\n")
    );

    // Releasing the VM ends its processes; the other one serves on.
    c.release(&a, &a_token).await.expect("release");
    wait_until("the released VM's server is gone", || async {
        !alive(server)
    })
    .await;
    assert!(
        http_get_in_guest(&c, &b, &b_token, 8080)
            .await
            .ends_with("vm-b\n")
    );
    c.release(&b, &b_token).await.expect("release");
    wait_until("the other server is gone", || async { !alive(b_server) }).await;
}

/// `sh -c '… & echo $!'` over the agent: the background pid it prints.
async fn agent_background(a: &mut Agent, script: &str) -> (u32, Vec<Value>) {
    a.send(json!({"v":1,"op":"exec","argv":["sh","-c",script],"detach":false}))
        .await;
    let mut frames = Vec::new();
    let mut out = String::new();
    loop {
        let f = a.next().await;
        if f["type"] == "stdout" {
            out.push_str(&Agent::output(std::slice::from_ref(&f), "stdout"));
        }
        frames.push(f);
        if let Some(pid) = out
            .lines()
            .next()
            .and_then(|l| l.trim().parse::<u32>().ok())
            && out.contains('\n')
        {
            return (pid, frames);
        }
    }
}

async fn background_processes_outlive_their_exec(network: sandboxd_sim::GuestNetworkMode) {
    let mut cfg = cfg();
    cfg.guest_network = network;
    let h = sim(cfg).await;
    let c = client(&h);
    let (id, token) = claim(&c, "").await;

    // A foreground exec that leaves a process behind and ends.
    let mut a = Agent::open(&c, &id, &token).await;
    let (kept, _) = agent_background(&mut a, "sleep 300 >/dev/null 2>&1 & echo $!").await;
    let rest = a.rpc_frames().await;
    assert_eq!(rest.last().expect("exit")["code"], 0, "{rest:?}");
    assert!(alive(kept), "the background process outlives the exec");

    // The buffered exec too.
    let out = c
        .exec(&id, &token, &sh("sleep 301 >/dev/null 2>&1 & echo $!"))
        .await
        .expect("exec");
    let kept_buffered: u32 = out.stdout.trim().parse().expect("a pid");
    assert!(
        alive(kept_buffered),
        "the background process outlives /exec"
    );

    // A client that hangs up: the node kills the exec's own process (on a
    // second connection, as vk-sandbox does); what it started in the
    // background runs on.
    let mut gone = Agent::open(&c, &id, &token).await;
    let (kept_hangup, frames) = agent_background(
        &mut gone,
        "sleep 302 >/dev/null 2>&1 & echo $!; exec sleep 600",
    )
    .await;
    let exec_pid = frames
        .iter()
        .find(|f| f["type"] == "started")
        .and_then(|f| f["pid"].as_u64())
        .expect("started") as u32;
    drop(gone);
    let mut ctl = Agent::open(&c, &id, &token).await;
    ctl.send(json!({"v":1,"op":"kill","pid":exec_pid})).await;
    assert_eq!(ctl.rpc_frames().await[0]["type"], "done");
    wait_until("the exec's own process is killed", || async {
        !alive(exec_pid)
    })
    .await;
    assert!(alive(kept_hangup), "its background process runs on");

    // Hibernate stops them all, wake continues them.
    c.hibernate(&id, SandboxAuth::Node)
        .await
        .expect("hibernate");
    wait_until("every process stopped", || async {
        [kept, kept_buffered, kept_hangup]
            .into_iter()
            .all(|pid| proc_state(pid) == Some('T'))
    })
    .await;
    c.wake(&id, SandboxAuth::Node).await.expect("wake");
    for pid in [kept, kept_buffered, kept_hangup] {
        assert_ne!(proc_state(pid), Some('T'), "{pid} continued");
    }
    // All of them end with the VM.
    c.release(&id, &token).await.expect("release");
    wait_until("every process of the VM is gone", || async {
        ![kept, kept_buffered, kept_hangup].into_iter().any(alive)
    })
    .await;
}

#[tokio::test]
async fn background_processes_outlive_their_exec_in_a_namespace() {
    let h = sim(cfg()).await;
    if !namespaces_or_skip(&h) {
        return;
    }
    drop(h);
    background_processes_outlive_their_exec(sandboxd_sim::GuestNetworkMode::Namespaces).await;
}

#[tokio::test]
async fn background_processes_outlive_their_exec_on_the_hosts_loopback() {
    background_processes_outlive_their_exec(sandboxd_sim::GuestNetworkMode::Host).await;
}

#[tokio::test]
async fn without_namespaces_guest_ports_are_the_hosts_loopback() {
    let mut cfg = cfg();
    cfg.guest_network = sandboxd_sim::GuestNetworkMode::Host;
    let h = sim(cfg).await;
    assert!(
        h.snapshot()["guest_network"]
            .as_str()
            .is_some_and(|s| s.contains("host's loopback")),
        "{}",
        h.snapshot()["guest_network"]
    );
    let c = client(&h);
    let (id, token) = claim(&c, "").await;
    // No mapping: the guest's port N is the host's 127.0.0.1:N.
    let echo = echo_service().await;
    let mut relay = c.port(&id, &token, echo.port()).await.expect("relay");
    relay.write_all(b"host").await.expect("write");
    relay.shutdown().await.expect("half-close");
    let mut back = Vec::new();
    relay.read_to_end(&mut back).await.expect("read");
    assert_eq!(back, b"host");
    assert_eq!(h.claim_state(&id).expect("state")["netns"], Value::Null);
}

/// The raw bytes up to the end of the reply's head.
async fn raw_head(h: &SimHandle, request: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(h.addr())
        .await
        .expect("connect");
    s.write_all(request.as_bytes()).await.expect("request");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(PATIENCE, s.read(&mut byte))
            .await
            .expect("the reply in time")
            .expect("read");
        assert_eq!(n, 1, "closed after {:?}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    String::from_utf8(head).expect("an ASCII head")
}

#[tokio::test]
async fn upgrades_answer_exactly_the_status_line_and_the_two_headers() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim(&c, "").await;
    map(&h, Some(TEMPLATE), None, 8080, echo_service().await);
    let token = token.expose();
    for (path, proto) in [
        (format!("/v1/sandboxes/{id}/agent"), "silkd"),
        (format!("/v1/sandboxes/{id}/ports/8080"), "tcp"),
    ] {
        let head = raw_head(
            &h,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: sandboxd\r\nAuthorization: Bearer {token}\r\n\
                 Upgrade: {proto}\r\nConnection: Upgrade\r\n\r\n"
            ),
        )
        .await;
        assert_eq!(
            head,
            format!(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: {proto}\r\nConnection: Upgrade\r\n\r\n"
            ),
            "{path}"
        );
    }
    // Other replies carry a Date, as Go's server writes one.
    let head = raw_head(
        &h,
        "GET /healthz HTTP/1.1\r\nHost: sandboxd\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("\r\nDate: "), "{head}");
}
