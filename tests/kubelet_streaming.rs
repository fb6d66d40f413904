//! The kubelet API's port-forward and upgrade handling over real TLS on
//! 127.0.0.1, with a SPDY client that checks what kubectl cannot show:
//! several connections at once, one failing alone, half-closes both ways,
//! large transfers, the WebSocket tunnel, refusals before the upgrade.
//! The guest ports are local listeners behind a data plane that stands
//! where sandboxd's `/ports` relay is (tests/e2e_streaming.rs runs the
//! whole chain with the simulator, the apiserver and kubectl).

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::kubelet::{Api, FixedSandboxes, LocalPorts, StuckAgent, start_streaming};
use support::spdy::{self, Event};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use vk_sandbox::config::StreamingConfig;
use vk_sandbox::kubelet::Streaming;

type Ports = LocalPorts;

fn sandboxes() -> FixedSandboxes {
    FixedSandboxes::default()
        .with("ns/p", "sb_1")
        .without("ns/waiting", "pod ns/waiting has no sandbox")
}

async fn start(plane: Arc<Ports>) -> Api {
    start_streaming(|_| Streaming::new(Arc::new(sandboxes()), plane)).await
}

/// A guest service: `behaviour` handles each accepted connection.
async fn guest<F, Fut>(plane: &Ports, port: u16, behaviour: F)
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind guest");
    plane.map(port, l.local_addr().expect("addr"));
    let behaviour = Arc::new(behaviour);
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let b = Arc::clone(&behaviour);
            tokio::spawn(async move { b(c).await });
        }
    });
}

async fn echo(mut c: tokio::net::TcpStream) {
    let (mut r, mut w) = c.split();
    let _ = tokio::io::copy(&mut r, &mut w).await;
    let _ = w.shutdown().await;
}

const PF: [(&str, &str); 1] = [("X-Stream-Protocol-Version", "portforward.k8s.io")];

async fn pair(
    c: &spdy::Client,
    port: u16,
    request: u32,
) -> (spdy::ClientStream, spdy::ClientStream) {
    let (p, r) = (port.to_string(), request.to_string());
    let mut error = c
        .open(&[("streamType", "error"), ("port", &p), ("requestID", &r)])
        .await;
    assert_eq!(error.next().await, Some(Event::Reply));
    c.finish(error.id).await;
    let mut data = c
        .open(&[("streamType", "data"), ("port", &p), ("requestID", &r)])
        .await;
    assert_eq!(data.next().await, Some(Event::Reply));
    (error, data)
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_run_side_by_side_and_fail_alone() {
    let plane = Arc::new(Ports::default());
    guest(&plane, 8080, echo).await;
    let api = start(Arc::clone(&plane)).await;
    let c = spdy::connect(api.port, "POST", "/portForward/ns/p", &PF)
        .await
        .unwrap_or_else(|h| panic!("upgrade: {}", h.text));

    let (mut e1, mut d1) = pair(&c, 8080, 0).await;
    let (mut e2, mut d2) = pair(&c, 9999, 1).await;
    let (mut e3, mut d3) = pair(&c, 8080, 2).await;
    // Nothing listens on 9999: that connection's error stream says so.
    let (msg, end) = e2.read_to_end().await;
    assert_eq!(end, Event::Fin);
    let msg = String::from_utf8_lossy(&msg).to_string();
    assert!(msg.contains("port 9999") && msg.contains("ns/p"), "{msg}");
    assert!(msg.contains("nothing accepts connections"), "{msg}");
    assert!(msg.contains("guest port unreachable"), "{msg}");
    assert_eq!(d2.read_to_end().await.1, Event::Fin);
    // The other two are untouched, and interleave.
    c.write(d1.id, b"one").await;
    c.write(d3.id, b"three").await;
    assert_eq!(d3.next().await, Some(Event::Data("three".into())));
    assert_eq!(d1.next().await, Some(Event::Data("one".into())));
    for (e, d) in [(&mut e1, &mut d1), (&mut e3, &mut d3)] {
        c.finish(d.id).await;
        assert_eq!(d.read_to_end().await, (Vec::new(), Event::Fin));
        assert_eq!(e.read_to_end().await, (Vec::new(), Event::Fin), "no error");
    }
    assert_eq!(
        plane.opened.lock().unwrap().len(),
        3,
        "one relay per connection"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn half_closes_pass_both_ways() {
    let plane = Arc::new(Ports::default());
    // Reads to EOF, then answers with what it read: needs the client's
    // half-close to arrive while its own side is still open.
    guest(&plane, 7000, |mut c: tokio::net::TcpStream| async move {
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got).await;
        let _ = c
            .write_all(format!("read {} bytes", got.len()).as_bytes())
            .await;
        let _ = c.shutdown().await;
    })
    .await;
    // Speaks first and closes its side, then still reads what comes.
    let (heard_tx, heard_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    guest(&plane, 7001, move |mut c: tokio::net::TcpStream| {
        let heard = heard_tx.clone();
        async move {
            let _ = c.write_all(b"hello").await;
            let _ = c.shutdown().await;
            let mut got = Vec::new();
            let _ = c.read_to_end(&mut got).await;
            let _ = heard.send(got);
        }
    })
    .await;
    let api = start(Arc::clone(&plane)).await;
    let c = spdy::connect(api.port, "POST", "/portForward/ns/p", &PF)
        .await
        .unwrap_or_else(|h| panic!("upgrade: {}", h.text));

    let (_e, mut d) = pair(&c, 7000, 0).await;
    c.write(d.id, b"0123456789").await;
    c.finish(d.id).await;
    let (got, end) = d.read_to_end().await;
    assert_eq!(
        (String::from_utf8_lossy(&got).as_ref(), end),
        ("read 10 bytes", Event::Fin)
    );

    let (_e, mut d) = pair(&c, 7001, 1).await;
    let (got, end) = d.read_to_end().await;
    assert_eq!((got.as_slice(), end), (&b"hello"[..], Event::Fin));
    c.write(d.id, b"after your FIN").await;
    c.finish(d.id).await;
    let mut heard_rx = heard_rx;
    let heard = tokio::time::timeout(Duration::from_secs(20), heard_rx.recv())
        .await
        .expect("the guest hears")
        .expect("a message");
    assert_eq!(heard, b"after your FIN");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_large_transfer_is_byte_exact() {
    let plane = Arc::new(Ports::default());
    guest(&plane, 8080, echo).await;
    let api = start(Arc::clone(&plane)).await;
    let c = Arc::new(
        spdy::connect(api.port, "POST", "/portForward/ns/p", &PF)
            .await
            .unwrap_or_else(|h| panic!("upgrade: {}", h.text)),
    );
    let (_e, mut d) = pair(&c, 8080, 0).await;
    let size = 64 * 1024 * 1024;
    let data: Arc<Vec<u8>> = Arc::new((0..size).map(|i| (i * 7 + i / 4099) as u8).collect());
    let (c2, data2, id) = (Arc::clone(&c), Arc::clone(&data), d.id);
    let writer = tokio::spawn(async move {
        c2.write(id, &data2).await;
        c2.finish(id).await;
    });
    let (got, end) = d.read_to_end().await;
    writer.await.expect("writer");
    assert_eq!(end, Event::Fin);
    assert_eq!(got.len(), size);
    assert!(got == *data, "64 MiB echoed byte for byte");
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_before_the_upgrade() {
    let plane = Arc::new(Ports::default());
    let api = start(Arc::clone(&plane)).await;
    // A Pod not bound here: 404, as from a kubelet.
    let h = spdy::connect(api.port, "POST", "/portForward/ns/elsewhere", &PF)
        .await
        .err()
        .expect("refused");
    assert_eq!(h.status, 404, "{}", h.text);
    assert!(h.text.contains("pod does not exist"));
    // A Pod with no sandbox: the reason.
    let h = spdy::connect(api.port, "POST", "/portForward/ns/waiting", &PF)
        .await
        .err()
        .expect("refused");
    assert_eq!(h.status, 400, "{}", h.text);
    assert!(h.text.contains("has no sandbox"), "{}", h.text);
    // No protocol in common: 403 naming both sides.
    let h = spdy::connect(
        api.port,
        "POST",
        "/portForward/ns/p",
        &[("X-Stream-Protocol-Version", "portforward.k8s.io.v2")],
    )
    .await
    .err()
    .expect("refused");
    assert_eq!(h.status, 403, "{}", h.text);
    assert!(h.text.contains("portforward.k8s.io.v2"), "{}", h.text);
    // exec with options the kubelet rejects.
    let h = spdy::connect(
        api.port,
        "POST",
        "/exec/ns/p/c?command=ls&tty=1&output=1&error=1",
        &[("X-Stream-Protocol-Version", "v4.channel.k8s.io")],
    )
    .await
    .err()
    .expect("refused");
    assert_eq!(h.status, 400, "{}", h.text);
    assert!(plane.opened.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_incomplete_pair_and_a_bad_port_fail_cleanly() {
    let plane = Arc::new(Ports::default());
    guest(&plane, 8080, echo).await;
    let api = start(Arc::clone(&plane)).await;
    let c = spdy::connect(api.port, "POST", "/portForward/ns/p", &PF)
        .await
        .unwrap_or_else(|h| panic!("upgrade: {}", h.text));
    let (mut e, mut d) = {
        let mut error = c
            .open(&[
                ("streamType", "error"),
                ("port", "http"),
                ("requestID", "5"),
            ])
            .await;
        assert_eq!(error.next().await, Some(Event::Reply));
        let mut data = c
            .open(&[("streamType", "data"), ("port", "http"), ("requestID", "5")])
            .await;
        assert_eq!(data.next().await, Some(Event::Reply));
        (error, data)
    };
    let (msg, _) = e.read_to_end().await;
    assert!(
        String::from_utf8_lossy(&msg).contains("invalid port"),
        "{msg:?}"
    );
    assert_eq!(d.read_to_end().await.1, Event::Fin);
    // A stream with no requestID is reset; the session goes on.
    let mut lone = c.open(&[("streamType", "data"), ("port", "8080")]).await;
    assert_eq!(lone.next().await, Some(Event::Reply));
    assert!(matches!(lone.next().await, Some(Event::Reset(_))));
    let (_e, mut d) = pair(&c, 8080, 6).await;
    c.write(d.id, b"still here").await;
    assert_eq!(d.next().await, Some(Event::Data("still here".into())));
}

/// The review's test gap: a pair left incomplete is answered on its error
/// stream once the pair timeout passes ("timed out waiting for the data
/// stream"), a lone data stream is reset, and the session goes on.
#[tokio::test(flavor = "multi_thread")]
async fn an_incomplete_pair_times_out() {
    let plane = Arc::new(Ports::default());
    guest(&plane, 8080, echo).await;
    let api = start_streaming(|_| {
        Streaming::new(Arc::new(sandboxes()), Arc::clone(&plane) as _)
            .with_pair_timeout(Duration::from_millis(600))
    })
    .await;
    let c = spdy::connect(api.port, "POST", "/portForward/ns/p", &PF)
        .await
        .unwrap_or_else(|h| panic!("upgrade: {}", h.text));
    let mut error = c
        .open(&[
            ("streamType", "error"),
            ("port", "8080"),
            ("requestID", "1"),
        ])
        .await;
    assert_eq!(error.next().await, Some(Event::Reply));
    let mut data = c
        .open(&[("streamType", "data"), ("port", "8080"), ("requestID", "2")])
        .await;
    assert_eq!(data.next().await, Some(Event::Reply));
    let (msg, end) = error.read_to_end().await;
    assert_eq!(end, Event::Fin);
    assert_eq!(
        String::from_utf8_lossy(&msg),
        "timed out waiting for the data stream of request 1"
    );
    assert!(matches!(data.next().await, Some(Event::Reset(_))));
    assert!(plane.opened.lock().unwrap().is_empty(), "nothing forwarded");
    let (_e, mut d) = pair(&c, 8080, 3).await;
    c.write(d.id, b"after").await;
    assert_eq!(d.next().await, Some(Event::Data("after".into())));
}

fn limits(per_pod: usize, streams: usize) -> StreamingConfig {
    StreamingConfig {
        max_sessions_per_pod: per_pod,
        max_streams_per_session: streams,
        ..StreamingConfig::default()
    }
}

/// Sessions over the per-Pod limit are refused before the upgrade (429,
/// naming the limit and its flag) and counted; ending one makes room.
#[tokio::test(flavor = "multi_thread")]
async fn sessions_over_the_pod_limit_are_refused_until_one_ends() {
    let plane = Arc::new(Ports::default());
    guest(&plane, 8080, echo).await;
    let api = start_streaming(|m| {
        Streaming::new(Arc::new(sandboxes()), Arc::clone(&plane) as _)
            .with_limits(limits(2, 512), m.streaming())
    })
    .await;
    let first = spdy::connect(api.port, "POST", "/portForward/ns/p", &PF)
        .await
        .unwrap_or_else(|h| panic!("upgrade: {}", h.text));
    let _second = spdy::connect(api.port, "POST", "/portForward/ns/p", &PF)
        .await
        .unwrap_or_else(|h| panic!("upgrade: {}", h.text));
    let h = spdy::connect(api.port, "POST", "/portForward/ns/p", &PF)
        .await
        .err()
        .expect("refused");
    assert_eq!(h.status, 429, "{}", h.text);
    assert!(h.text.contains("pod ns/p"), "{}", h.text);
    assert!(h.text.contains("2 is the limit"), "{}", h.text);
    assert!(
        h.text.contains("--max-streaming-sessions-per-pod"),
        "{}",
        h.text
    );
    // exec counts against the same limit.
    let h = spdy::connect(
        api.port,
        "POST",
        "/exec/ns/p/c?command=ls&output=1",
        &[("X-Stream-Protocol-Version", "v4.channel.k8s.io")],
    )
    .await
    .err()
    .expect("refused");
    assert_eq!(h.status, 429, "{}", h.text);
    let refused = || {
        api.metrics.value(
            "vk_sandbox_streaming_refusals_total",
            &[("reason", "pod_sessions")],
        )
    };
    assert_eq!(refused(), Some(2.0));
    assert_eq!(
        api.metrics.value("vk_sandbox_streaming_sessions", &[]),
        Some(2.0)
    );
    first.hang_up().await;
    let mut third = None;
    for _ in 0..100 {
        match spdy::connect(api.port, "POST", "/portForward/ns/p", &PF).await {
            Ok(c) => {
                third = Some(c);
                break;
            }
            Err(h) => assert_eq!(h.status, 429, "{}", h.text),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let third = third.expect("room once a session ended");
    let (_e, mut d) = pair(&third, 8080, 0).await;
    c_write_echo(&third, &mut d).await;
}

async fn c_write_echo(c: &spdy::Client, d: &mut spdy::ClientStream) {
    c.write(d.id, b"ping").await;
    assert_eq!(d.next().await, Some(Event::Data("ping".into())));
}

/// A forwarded connection over the session's stream limit is refused on
/// its own error stream, saying which limit; the others go on.
#[tokio::test(flavor = "multi_thread")]
async fn connections_over_the_stream_limit_are_refused_with_a_message() {
    let plane = Arc::new(Ports::default());
    guest(&plane, 8080, echo).await;
    let api = start_streaming(|m| {
        Streaming::new(Arc::new(sandboxes()), Arc::clone(&plane) as _)
            .with_limits(limits(16, 5), m.streaming())
    })
    .await;
    let c = spdy::connect(api.port, "POST", "/portForward/ns/p", &PF)
        .await
        .unwrap_or_else(|h| panic!("upgrade: {}", h.text));
    let (_e1, mut d1) = pair(&c, 8080, 1).await;
    let (_e2, mut d2) = pair(&c, 8080, 2).await;
    let mut e3 = c
        .open(&[
            ("streamType", "error"),
            ("port", "8080"),
            ("requestID", "3"),
        ])
        .await;
    let (msg, end) = e3.read_to_end().await;
    assert_eq!(end, Event::Fin);
    let msg = String::from_utf8_lossy(&msg).to_string();
    assert!(
        msg.contains("error forwarding port 8080 to pod ns/p"),
        "{msg}"
    );
    assert!(
        msg.contains("5 streams") && msg.contains("--max-streams-per-session"),
        "{msg}"
    );
    assert_eq!(
        api.metrics.value(
            "vk_sandbox_streaming_refusals_total",
            &[("reason", "session_streams")]
        ),
        Some(1.0)
    );
    c_write_echo(&c, &mut d1).await;
    c_write_echo(&c, &mut d2).await;
    assert_eq!(plane.opened.lock().unwrap().len(), 2);
}

/// Finding 7 of the 2026-12-b review: a client that hangs up while its
/// stdin is back-pressured (the command reads none of it, so the session's
/// reader waits on the stream's budget and reads the connection no more)
/// still gets its process killed: the socket says the client is gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_hangs_up_on_stuck_stdin_gets_its_process_killed() {
    let agent = Arc::new(StuckAgent::default());
    let api = start_streaming(|m| {
        Streaming::new(Arc::new(sandboxes()), Arc::clone(&agent) as _)
            .with_limits(StreamingConfig::default(), m.streaming())
    })
    .await;
    let c = spdy::connect(
        api.port,
        "POST",
        "/exec/ns/p/c?command=sleep&command=3600&input=1&output=1&error=1",
        &[("X-Stream-Protocol-Version", "v4.channel.k8s.io")],
    )
    .await
    .unwrap_or_else(|h| panic!("upgrade: {}", h.text));
    let mut streams = Vec::new();
    for kind in ["error", "stdin", "stdout", "stderr"] {
        let mut s = c.open(&[("streamType", kind)]).await;
        assert_eq!(s.next().await, Some(Event::Reply));
        streams.push(s);
    }
    let stdin = streams[1].id;
    // Written a frame at a time until the session holds what its stream
    // budget allows and its reader stops taking more: then the reader no
    // longer reads the connection. No more is written after that, so the
    // hang-up's FIN is not queued behind data that cannot reach this
    // side's kernel (the limit docs/streaming.md states: a FIN behind more
    // unread data than the receive buffer holds is not seen until the
    // keep-alive or the idle timeout). Writing 64 frames at once left that
    // to the socket buffers' sizes, and failed now and then.
    let frame = vec![b'x'; 8 * 1024];
    let queued = || api.metrics.value("vk_sandbox_streaming_queued_bytes", &[]);
    let near_full = Some(200_000.0);
    let mut stalled = false;
    for _ in 0..256 {
        let before = queued();
        c.write(stdin, &frame).await;
        if before < near_full {
            // The agent's relay and the stdin queue are still taking
            // frames: paced, not watched.
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        let mut moved = false;
        for _ in 0..15 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if queued() != before {
                moved = true;
                break;
            }
        }
        if !moved {
            stalled = true;
            break;
        }
    }
    assert!(
        stalled,
        "stdin is back-pressured: the session stopped taking frames at {:?} queued bytes",
        queued()
    );
    assert!(agent.control.lock().unwrap().is_empty());
    c.hang_up().await;
    let mut killed = None;
    for _ in 0..50 {
        killed = agent
            .control
            .lock()
            .unwrap()
            .iter()
            .find(|f| f["op"] == "kill")
            .cloned();
        if killed.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let killed = killed.expect("a kill within 5 s of the hang-up");
    assert_eq!(killed["pid"], 42);
    assert_eq!(
        api.metrics.value(
            "vk_sandbox_streaming_closes_total",
            &[("reason", "hang_up")]
        ),
        Some(1.0)
    );
}
