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
