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

use support::kubelet::{FixedSandboxes, LocalPorts, StaticPods};
use support::spdy::{self, Event};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use vk_sandbox::kubelet::tls::KubeletTls;
use vk_sandbox::kubelet::{KubeletState, Streaming, router, serve};
use vk_sandbox::metrics::Metrics;

type Ports = LocalPorts;

fn sandboxes() -> FixedSandboxes {
    FixedSandboxes::default()
        .with("ns/p", "sb_1")
        .without("ns/waiting", "pod ns/waiting has no sandbox")
}

struct Api {
    port: u16,
    stop: CancellationToken,
}

impl Drop for Api {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start(plane: Arc<Ports>) -> Api {
    vk_sandbox::crypto::install_provider();
    let tls = KubeletTls::init(&Default::default(), "node-a", Some("127.0.0.1")).expect("tls");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let state = KubeletState {
        node_name: "node-a".into(),
        pods: Arc::new(StaticPods::default()),
        auth: None,
        metrics: Metrics::new().expect("metrics"),
        streaming: Some(Streaming::new(Arc::new(sandboxes()), plane)),
    };
    let stop = CancellationToken::new();
    tokio::spawn(serve(
        listener,
        tls.server_config(None).expect("server config"),
        router(state),
        stop.clone(),
    ));
    Api { port, stop }
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
