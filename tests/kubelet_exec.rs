//! Exec through the kubelet API over real TLS on 127.0.0.1, against a
//! scripted guest agent: what each remote-command version tells the client
//! when the command ends (a `v1.Status` for v4 and v5, text before them), on
//! SPDY and on a WebSocket, as kubectl reads it (docs/streaming.md#exec).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use serde_json::json;
use support::kubelet::{Api, FixedSandboxes, StuckAgent, start_streaming};
use support::spdy::{self, Event};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use vk_sandbox::kubelet::Streaming;
use vk_sandbox::kubelet::sandbox::{DataPlane, Relay, RelayError, SandboxRef, SandboxStats};
use vk_sandbox::kubelet::server::SHUTDOWN_GRACE;

/// A guest agent whose `exec` prints `hi` and exits with `code`; counts the
/// relays closed.
struct ExitAgent {
    code: i32,
    closed: Arc<AtomicUsize>,
}

impl DataPlane for ExitAgent {
    fn agent<'a>(&'a self, _: &'a SandboxRef) -> BoxFuture<'a, Result<Relay, RelayError>> {
        let code = self.code;
        let closed = Arc::clone(&self.closed);
        Box::pin(async move {
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            let (r, mut w) = tokio::io::split(theirs);
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(r).lines();
                let line = lines.next_line().await.ok().flatten().unwrap_or_default();
                assert!(line.contains("\"exec\""), "{line}");
                let replies = format!(
                    "{{\"type\":\"started\",\"pid\":7}}\n\
                     {{\"type\":\"stdout\",\"data\":\"aGkK\"}}\n\
                     {{\"type\":\"exit\",\"code\":{code}}}\n"
                );
                w.write_all(replies.as_bytes()).await.expect("reply");
                // Read on (stdin_close) until the relay is dropped.
                while let Ok(Some(_)) = lines.next_line().await {}
                closed.fetch_add(1, Ordering::SeqCst);
            });
            Ok(Box::new(ours) as Relay)
        })
    }

    fn port<'a>(&'a self, _: &'a SandboxRef, _: u16) -> BoxFuture<'a, Result<Relay, RelayError>> {
        Box::pin(async { Err(RelayError::Transport("no ports here".into())) })
    }

    fn stats<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<SandboxStats, RelayError>> {
        Box::pin(async { Err(RelayError::Transport("no stats here".into())) })
    }
}

async fn start(code: i32) -> Api {
    start_counting(code).await.0
}

/// [`start`], with the count of guest agent relays closed.
async fn start_counting(code: i32) -> (Api, Arc<AtomicUsize>) {
    let sandboxes = FixedSandboxes::default().with("ns/p", "sb_1");
    let closed = Arc::new(AtomicUsize::new(0));
    let agent = ExitAgent {
        code,
        closed: Arc::clone(&closed),
    };
    let api = start_streaming(|_| Streaming::new(Arc::new(sandboxes), Arc::new(agent))).await;
    (api, closed)
}

const EXEC: &str = "/exec/ns/p/c?command=sh&command=-c&command=x&output=1";
const EXITED_3: &str =
    "command terminated with non-zero exit code: command [\"sh\", \"-c\", \"x\"] exited with 3";

/// Exec `path` over SPDY under `version`: what stdout carried, and what the
/// error stream carried before its FIN.
async fn spdy_exec(api: &Api, path: &str, version: &str) -> (Vec<u8>, Vec<u8>) {
    let (mut stdout, status) = spdy_status(api, path, version).await;
    let (out, end) = stdout.read_to_end().await;
    assert_eq!(end, Event::Fin, "stdout ends with a FIN");
    (out, status)
}

/// Exec `path` over SPDY under `version`: the client, its error and
/// stdout streams (replied to).
async fn spdy_open(
    api: &Api,
    path: &str,
    version: &str,
) -> (spdy::Client, spdy::ClientStream, spdy::ClientStream) {
    let c = spdy::connect(
        api.port,
        "POST",
        path,
        &[("X-Stream-Protocol-Version", version)],
    )
    .await
    .unwrap_or_else(|h| panic!("upgrade: {}", h.text));
    let mut error = c.open(&[("streamType", "error")]).await;
    assert_eq!(error.next().await, Some(Event::Reply));
    let mut stdout = c.open(&[("streamType", "stdout")]).await;
    assert_eq!(stdout.next().await, Some(Event::Reply));
    (c, error, stdout)
}

/// Open the streams of `path` over SPDY under `version`: the stdout stream,
/// and what the error stream carried before its FIN.
async fn spdy_status(api: &Api, path: &str, version: &str) -> (spdy::ClientStream, Vec<u8>) {
    let (_c, mut error, stdout) = spdy_open(api, path, version).await;
    let (status, end) = error.read_to_end().await;
    assert_eq!(end, Event::Fin, "the error stream ends with a FIN");
    (stdout, status)
}

/// The status JSON as kubectl decodes it, and as it is.
fn status(body: &[u8]) -> (Status, serde_json::Value) {
    let typed: Status = serde_json::from_slice(body).expect("a v1.Status");
    let raw: serde_json::Value = serde_json::from_slice(body).expect("JSON");
    assert_eq!(raw["metadata"], json!({}), "{raw}");
    (typed, raw)
}

#[tokio::test(flavor = "multi_thread")]
async fn spdy_v4_carries_a_status_with_the_exit_code() {
    let api = start(3).await;
    for version in ["v4.channel.k8s.io", "v5.channel.k8s.io"] {
        let (out, body) = spdy_exec(&api, EXEC, version).await;
        assert_eq!(out, b"hi\n", "{version}");
        let (st, raw) = status(&body);
        assert_eq!(st.status.as_deref(), Some("Failure"), "{raw}");
        assert_eq!(st.reason.as_deref(), Some("NonZeroExitCode"), "{raw}");
        assert_eq!(st.message.as_deref(), Some(EXITED_3), "{raw}");
        assert_eq!(st.code, None, "{raw}");
        let causes = st.details.and_then(|d| d.causes).expect("causes");
        assert_eq!(causes.len(), 1, "{raw}");
        assert_eq!(causes[0].reason.as_deref(), Some("ExitCode"));
        assert_eq!(causes[0].message.as_deref(), Some("3"));
    }
    let api = start(0).await;
    let (out, body) = spdy_exec(&api, EXEC, "v4.channel.k8s.io").await;
    assert_eq!(out, b"hi\n");
    let (st, raw) = status(&body);
    assert_eq!(st.status.as_deref(), Some("Success"), "{raw}");
    assert_eq!(
        (st.reason, st.message, st.code, st.details),
        (None, None, None, None),
        "{raw}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn spdy_before_v4_carries_text_and_nothing_on_success() {
    let api = start(3).await;
    for version in ["v3.channel.k8s.io", "v2.channel.k8s.io"] {
        let (out, body) = spdy_exec(&api, EXEC, version).await;
        assert_eq!(out, b"hi\n", "{version}");
        assert_eq!(String::from_utf8_lossy(&body), EXITED_3, "{version}");
    }
    let api = start(0).await;
    let (out, body) = spdy_exec(&api, EXEC, "v3.channel.k8s.io").await;
    assert_eq!((out.as_slice(), body.as_slice()), (&b"hi\n"[..], &b""[..]));
}

#[tokio::test(flavor = "multi_thread")]
async fn attach_is_refused_with_a_bad_request_status() {
    let api = start(0).await;
    let path = "/attach/ns/p/c?output=1";
    let (mut stdout, body) = spdy_status(&api, path, "v4.channel.k8s.io").await;
    assert_eq!(stdout.events.try_recv().ok(), None, "no output");
    let (st, raw) = status(&body);
    assert_eq!(st.status.as_deref(), Some("Failure"), "{raw}");
    assert_eq!(st.reason.as_deref(), Some("BadRequest"), "{raw}");
    assert_eq!(st.code, Some(400), "{raw}");
    assert!(
        st.message.is_some_and(|m| m.contains("kubectl exec")),
        "{raw}"
    );
}

/// Exec `EXEC` over a WebSocket under `version`: the messages up to the
/// server's close (which must come).
async fn ws_exec(api: &Api, version: &str) -> Vec<Message> {
    let tls = spdy::tls_to(api.port).await;
    let mut req = format!("wss://127.0.0.1:{}{EXEC}", api.port)
        .into_client_request()
        .expect("request");
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", version.parse().expect("header"));
    let (mut ws, resp) = tokio_tungstenite::client_async(req, tls)
        .await
        .expect("WebSocket upgrade");
    assert_eq!(
        resp.headers()
            .get("Sec-WebSocket-Protocol")
            .and_then(|v| v.to_str().ok()),
        Some(version)
    );
    let mut got = Vec::new();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("a message within 20 s");
        match msg {
            Some(Ok(Message::Close(_))) => break,
            Some(Ok(m)) => got.push(m),
            other => panic!("{version}: the session ended without a close: {other:?}"),
        }
    }
    let _ = ws.close(None).await;
    got
}

fn binary(channel: u8, data: &[u8]) -> Message {
    let mut b = vec![channel];
    b.extend_from_slice(data);
    Message::Binary(b.into())
}

#[tokio::test(flavor = "multi_thread")]
async fn websocket_versions_frame_output_and_status() {
    let api = start(3).await;
    let got = ws_exec(&api, "v5.channel.k8s.io").await;
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0], binary(1, b""), "first an empty stdout message");
    assert_eq!(got[1], binary(1, b"hi\n"));
    let Message::Binary(b) = &got[2] else {
        panic!("{got:?}")
    };
    assert_eq!(b[0], 3, "the status channel");
    let (st, raw) = status(&b[1..]);
    assert_eq!(st.reason.as_deref(), Some("NonZeroExitCode"), "{raw}");
    assert_eq!(st.message.as_deref(), Some(EXITED_3), "{raw}");

    let got = ws_exec(&api, "channel.k8s.io").await;
    assert_eq!(
        got,
        [
            binary(1, b""),
            binary(1, b"hi\n"),
            binary(3, EXITED_3.as_bytes())
        ]
    );

    let api = start(0).await;
    let got = ws_exec(&api, "base64.channel.k8s.io").await;
    assert_eq!(
        got,
        [Message::text("1"), Message::text("1aGkK")],
        "no status text on success"
    );
    let got = ws_exec(&api, "v4.base64.channel.k8s.io").await;
    assert_eq!(got.len(), 3, "{got:?}");
    let Message::Text(t) = &got[2] else {
        panic!("{got:?}")
    };
    assert!(t.as_str().starts_with('3'), "{t}");
    let body = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &t.as_str()[1..])
        .expect("base64");
    let (st, raw) = status(&body);
    assert_eq!(st.status.as_deref(), Some("Success"), "{raw}");
}

/// The guest agent relay is closed once the command ended and its status
/// is out, while the client still holds its connection: an open relay
/// would hold the sandbox against sandboxd's idle hibernation.
#[tokio::test(flavor = "multi_thread")]
async fn the_relay_closes_once_the_status_is_out() {
    let (api, closed) = start_counting(0).await;
    let tls = spdy::tls_to(api.port).await;
    let mut req = format!("wss://127.0.0.1:{}{EXEC}", api.port)
        .into_client_request()
        .expect("request");
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v5.channel.k8s.io".parse().expect("header"),
    );
    let (mut ws, _) = tokio_tungstenite::client_async(req, tls)
        .await
        .expect("WebSocket upgrade");
    // Read up to the status, then nothing more: the server's close is left
    // unread and unanswered.
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("a message within 20 s");
        match msg {
            Some(Ok(Message::Binary(b))) if b.first() == Some(&3) => break,
            Some(Ok(_)) => {}
            other => panic!("the session ended before its status: {other:?}"),
        }
    }
    for _ in 0..200 {
        if closed.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        closed.load(Ordering::SeqCst),
        1,
        "the relay still open 2 s after the status"
    );
    drop(ws);
}

/// Shutdown during an open exec: the session is inside the server's grace.
/// Its process is killed (as for a client that leaves), its connection
/// closed, and `serve` returns Ok within SHUTDOWN_GRACE, with the session
/// counted as closed by the shutdown.
#[tokio::test(flavor = "multi_thread")]
async fn shutdown_during_an_exec_kills_it_and_ends_within_the_grace() {
    let agent = Arc::new(StuckAgent::default());
    let sandboxes = FixedSandboxes::default().with("ns/p", "sb_1");
    let mut api = start_streaming(|m| {
        Streaming::new(Arc::new(sandboxes), Arc::clone(&agent) as _)
            .with_limits(Default::default(), m.streaming())
    })
    .await;
    let path = "/exec/ns/p/c?command=sleep&command=3600&output=1";
    let (c, _error, _stdout) = spdy_open(&api, path, "v4.channel.k8s.io").await;
    for _ in 0..200 {
        if !agent.held.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!agent.held.lock().unwrap().is_empty(), "the exec started");
    let ended = c.ended.notified();
    tokio::pin!(ended);
    ended.as_mut().enable();
    let stopped = tokio::time::Instant::now();
    api.stop.cancel();
    let served = api.served.take().expect("serving");
    let ok = tokio::time::timeout(SHUTDOWN_GRACE, served)
        .await
        .expect("serve returned within the grace")
        .expect("serve task");
    assert!(ok, "serve returned Ok");
    assert!(stopped.elapsed() < SHUTDOWN_GRACE);
    let kills: Vec<_> = agent
        .control
        .lock()
        .unwrap()
        .iter()
        .filter(|f| f["op"] == "kill")
        .cloned()
        .collect();
    assert_eq!(kills.len(), 1, "one kill, before serve returned");
    assert_eq!(kills[0]["pid"], 42);
    tokio::time::timeout(Duration::from_secs(5), ended)
        .await
        .expect("the client's connection ends");
    assert_eq!(
        api.metrics.value(
            "vk_sandbox_streaming_closes_total",
            &[("reason", "shutdown")]
        ),
        Some(1.0)
    );
}
