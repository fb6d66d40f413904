//! `BENCH_ONLY=stream`: what vk-sandbox adds to an exec and to a
//! port-forward (docs/streaming.md).
//!
//! Exec round trips of `true` (each a new connection, as kubectl makes):
//! sandboxd's buffered `/exec` alone; the guest agent relay (`/agent`) as
//! vk-sandbox drives it, in this process; vk-sandbox's kubelet API over
//! WebSocket v5 (TLS, token auth, the relay); the same through the
//! apiserver; and `kubectl exec`. vk-sandbox's addition is the kubelet API
//! figure minus the relay's. A kubelet API that does nothing
//! ([`super::null_kubelet`]), timed the same way between them, is the
//! floor of that addition on this machine: the new connection an exec
//! opens and its upgrade, which any kubelet API pays.
//!
//! Port-forward throughput, one way into a guest service that counts what
//! it reads: sandboxd's `/ports` relay alone; vk-sandbox's kubelet API over
//! SPDY (in-process client); and `kubectl port-forward` (apiserver
//! included).

use kube::client::ConfigExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use vk_sandbox::kubelet::SandboxdPlane;
use vk_sandbox::kubelet::exec::{self, Channels, ExecRequest, Output};
use vk_sandbox::kubelet::sandbox::{DataPlane, SandboxRef};
use vk_sandbox::sandboxd::{SandboxdClient, Secret};

use super::*;

/// The guest port of the counting service.
const SINK_PORT: u16 = 9000;

/// What the stream part measured.
pub struct StreamFigures {
    /// Exec round trips (ms), by path.
    pub exec: Vec<(String, Quantiles)>,
    /// The kubelet API's round trip by step (ms each step took).
    pub phases: Vec<(&'static str, Quantiles)>,
    /// The null kubelet API's round trip by the same steps.
    pub null_phases: Vec<(&'static str, Quantiles)>,
    /// Of the kubelet API's round trips, how many resumed a TLS session.
    pub resumed: (usize, usize),
    /// Port-forward throughput (MiB/s), by path, and the bytes moved.
    pub throughput: Vec<(String, f64)>,
    pub mib: usize,
}

impl StreamFigures {
    fn p50(&self, label: &str) -> Option<f64> {
        self.exec
            .iter()
            .find(|(l, _)| l == label)
            .map(|(_, q)| q.p50)
    }

    /// kubelet API p50 minus the relay's p50 (ms), the relay driven from
    /// another process as vk-sandbox drives it.
    pub fn exec_added_ms(&self) -> Option<f64> {
        Some(self.p50(KUBELET_WS)? - self.p50(AGENT_APART)?)
    }

    /// The same against the relay driven from the simulator's own process
    /// (the reference before 2026-12-07): its hops to sandboxd are task
    /// switches there, so this charges vk-sandbox with what a second
    /// process costs any relay client.
    pub fn exec_added_in_process_ms(&self) -> Option<f64> {
        Some(self.p50(KUBELET_WS)? - self.p50(AGENT)?)
    }

    /// The null kubelet API's p50 (ms): a new connection's set-up, an
    /// upgrade and a status between two processes on this machine.
    pub fn exec_floor_ms(&self) -> Option<f64> {
        self.p50(NULL_WS)
    }

    fn rate(&self, label: &str) -> Option<f64> {
        self.throughput
            .iter()
            .find(|(l, _)| l == label)
            .map(|(_, r)| *r)
    }

    /// (kubelet API, kubectl) throughput over the direct relay's.
    pub fn pf_ratios(&self) -> Option<(f64, f64)> {
        let direct = self.rate(RELAY)?;
        Some((
            self.rate(KUBELET_SPDY)? / direct,
            self.rate(KUBECTL_PF)? / direct,
        ))
    }
}

pub const EXEC_DIRECT: &str = "sandboxd POST /exec alone";
pub const AGENT: &str = "sandboxd /agent relay (exec frames), from the simulator's own process";
pub const AGENT_APART: &str = "sandboxd /agent relay (exec frames), from another process on one thread, as vk-sandbox drives it";
pub const KUBELET_WS: &str = "vk-sandbox kubelet API, WebSocket v5 (TLS, token)";
pub const NULL_WS: &str =
    "a kubelet API that does nothing, another process (TLS, WebSocket v5, a status): the floor";
pub const APISERVER_WS: &str = "apiserver → vk-sandbox, WebSocket v5";
pub const KUBECTL_EXEC: &str = "kubectl exec (process start included)";
pub const RELAY: &str = "sandboxd /ports relay alone";
pub const KUBELET_SPDY: &str = "vk-sandbox kubelet API, SPDY port-forward";
pub const KUBECTL_PF: &str = "kubectl port-forward (apiserver → vk-sandbox)";

/// A loopback server running `serve` on each connection it accepts.
pub async fn loopback_service<F, Fut>(what: &str, serve: F) -> std::net::SocketAddr
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| die(&format!("bind the {what}: {e}")));
    let addr = l
        .local_addr()
        .unwrap_or_else(|e| die(&format!("{what} address: {e}")));
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            tokio::spawn(serve(c));
        }
    });
    addr
}

/// Reads everything until EOF, answers with the count (8 bytes, big
/// endian), closes.
pub async fn sink() -> std::net::SocketAddr {
    loopback_service("sink", |mut c| async move {
        let mut buf = vec![0u8; 256 * 1024];
        let mut n: u64 = 0;
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k as u64,
            }
        }
        let _ = c.write_all(&n.to_be_bytes()).await;
        let _ = c.shutdown().await;
    })
    .await
}

/// Write `mib` MiB into `io`, half-close, read the count; MiB/s.
pub async fn push<IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    io: IO,
    mib: usize,
) -> f64 {
    push_with(io, mib, false).await
}

/// [`push`] for a sink that is told the length first (8 bytes,
/// big-endian) and answers once it has read that much, without a
/// half-close (which a port-forward through a real kubelet does not carry).
pub async fn push_sized<IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    io: IO,
    mib: usize,
) -> f64 {
    push_with(io, mib, true).await
}

async fn push_with<IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut io: IO,
    mib: usize,
    sized: bool,
) -> f64 {
    let total = (mib * 1024 * 1024) as u64;
    let chunk = vec![0x5au8; 256 * 1024];
    let t = Instant::now();
    if sized {
        io.write_all(&total.to_be_bytes())
            .await
            .unwrap_or_else(|e| die(&format!("push: {e}")));
    }
    for _ in 0..mib * 4 {
        io.write_all(&chunk)
            .await
            .unwrap_or_else(|e| die(&format!("push: {e}")));
    }
    if !sized {
        io.shutdown()
            .await
            .unwrap_or_else(|e| die(&format!("half-close: {e}")));
    }
    let mut count = [0u8; 8];
    io.read_exact(&mut count)
        .await
        .unwrap_or_else(|e| die(&format!("the sink's count: {e}")));
    let secs = t.elapsed().as_secs_f64();
    let n = u64::from_be_bytes(count);
    if n != total {
        die(&format!("the sink read {n} bytes of {mib} MiB"));
    }
    mib as f64 / secs
}

/// The sink of [`push_sized`]: reads the length, then that many bytes,
/// answers the count.
pub async fn sized_sink() -> std::net::SocketAddr {
    loopback_service("sized sink", |mut c| async move {
        let mut len = [0u8; 8];
        if c.read_exact(&mut len).await.is_err() {
            return;
        }
        let want = u64::from_be_bytes(len);
        let mut buf = vec![0u8; 256 * 1024];
        let mut n: u64 = 0;
        while n < want {
            let ask = usize::try_from(want - n).map_or(buf.len(), |w| w.min(buf.len()));
            match c.read(&mut buf[..ask]).await {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k as u64,
            }
        }
        let _ = c.write_all(&n.to_be_bytes()).await;
        let _ = c.shutdown().await;
    })
    .await
}

pub struct Discard;

/// `true` through the guest agent relay, output discarded, as vk-sandbox
/// runs a command without stdin.
pub async fn exec_true(plane: Arc<dyn DataPlane>, sandbox: SandboxRef) -> exec::Outcome {
    let ch = Channels {
        stdin: None,
        stdout: Some(Box::new(Discard)),
        stderr: Some(Box::new(Discard)),
        resize: None,
        hangup: tokio_util::sync::CancellationToken::new(),
    };
    let req = ExecRequest {
        argv: vec!["true".into()],
        tty: false,
    };
    exec::run(plane, sandbox, req, ch).await
}

impl Output for Discard {
    fn write(&self, _: bytes::Bytes) -> futures::future::BoxFuture<'_, Result<(), ()>> {
        Box::pin(async { Ok(()) })
    }
    fn finish(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// When each step of one WebSocket exec ended, in ms from its start.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// TCP connected.
    pub connect: f64,
    /// TLS handshake done.
    pub tls: f64,
    /// The `101` read (request sent, authenticated, authorized, Pod found).
    pub upgraded: f64,
    /// The status message read (the relay opened, the command ran).
    pub status: f64,
    /// The server's close read: the whole round trip.
    pub closed: f64,
    /// The TLS session was resumed (no full handshake).
    pub resumed: bool,
}

/// One WebSocket v5 exec of `true` at `path`, with its phases.
async fn ws_exec(
    tls: Arc<rustls::ClientConfig>,
    port: u16,
    path: &str,
    bearer: Option<&str>,
) -> Phases {
    let t = Instant::now();
    let ms = || t.elapsed().as_secs_f64() * 1000.0;
    let mut ph = Phases::default();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap_or_else(|e| die(&format!("connect: {e}")));
    tcp.set_nodelay(true).ok();
    ph.connect = ms();
    let name =
        rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap_or_else(|e| die(&e.to_string()));
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .unwrap_or_else(|e| die(&format!("TLS: {e}")));
    ph.tls = ms();
    ph.resumed = stream.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
    let mut req = format!("wss://127.0.0.1:{port}{path}")
        .into_client_request()
        .unwrap_or_else(|e| die(&format!("request: {e}")));
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        http::HeaderValue::from_static("v5.channel.k8s.io"),
    );
    if let Some(token) = bearer {
        req.headers_mut().insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_str(&format!("Bearer {token}"))
                .unwrap_or_else(|e| die(&e.to_string())),
        );
    }
    let (mut ws, _) = tokio_tungstenite::client_async(req, stream)
        .await
        .unwrap_or_else(|e| die(&format!("WebSocket upgrade of {path}: {e}")));
    ph.upgraded = ms();
    let mut status = None;
    while let Some(Ok(m)) = ws.next().await {
        match m {
            Message::Binary(b) if b.first() == Some(&3) => {
                ph.status = ms();
                status = Some(String::from_utf8_lossy(&b[1..]).to_string());
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    ph.closed = ms();
    match status {
        Some(s) if s.contains("Success") => ph,
        other => die(&format!("exec through {path} did not succeed: {other:?}")),
    }
}

fn any_cert() -> Arc<rustls::ClientConfig> {
    #[derive(Debug)]
    struct AnyCert;
    impl rustls::client::danger::ServerCertVerifier for AnyCert {
        fn verify_server_cert(
            &self,
            _: &rustls_pki_types::CertificateDer<'_>,
            _: &[rustls_pki_types::CertificateDer<'_>],
            _: &rustls_pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls_pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &rustls_pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &rustls_pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            rustls::crypto::ring::default_provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
    let mut cfg = rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert))
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

/// The admin kubeconfig's TLS (client certificate, cluster CA), HTTP/1.1.
async fn admin_tls(kubeconfig: &Path) -> Arc<rustls::ClientConfig> {
    let kc = Kubeconfig::read_from(kubeconfig).unwrap_or_else(|e| die(&e.to_string()));
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap_or_else(|e| die(&e.to_string()));
    let mut tls = cfg
        .rustls_client_config()
        .unwrap_or_else(|e| die(&format!("admin TLS: {e}")));
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(tls)
}

pub async fn timed_kubectl(kubeconfig: &Path, args: &[&str]) -> f64 {
    match timed_kubectl_answer(kubeconfig, args).await {
        (ms, Ok(())) => ms,
        (_, Err(e)) => die(&format!("kubectl {args:?}: {e}")),
    }
}

/// How long `kubectl ARGS` took to answer (ms), and its error if it failed.
pub async fn timed_kubectl_answer(kubeconfig: &Path, args: &[&str]) -> (f64, Result<(), String>) {
    let t = Instant::now();
    let out = tokio::process::Command::new(support::kubectl::path())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| die(&format!("kubectl: {e}")));
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    if !out.status.success() {
        return (
            ms,
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        );
    }
    (ms, Ok(()))
}

pub async fn run(env: &Env, n: usize, mib: usize) -> StreamFigures {
    let sink = sink().await;
    let mut cfg = support::sim::config(TOKEN, &[&format!("{TEMPLATE}=2")]);
    cfg.wake_delay_ms = 0;
    cfg.port_map.push(sandboxd_sim::PortMapping {
        sandbox: None,
        template: Some(TEMPLATE.into()),
        guest_port: SINK_PORT,
        target: sink,
    });
    let sim = start_sim_cfg(cfg).await;
    let node = format!("bench-stream-{}", support::suffix());
    let vk = Vk::start(env, &node, &sim, &env.sa_kubeconfig, None);
    vk.wait_ready(&env.cluster.client, Duration::from_secs(60))
        .await;
    let ns = env.cluster.namespace("bench-stream").await;
    let pods: Api<Pod> = Api::namespaced(env.cluster.client.clone(), &ns);
    pods.create(&PostParams::default(), &pod("p", &node, None))
        .await
        .unwrap_or_else(|e| die(&format!("create the Pod: {e}")));
    let id = support::wait_for("the Pod Running", Duration::from_secs(60), || async {
        let p = pods.get("p").await.map_err(|e| e.to_string())?;
        let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let id = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("sandbox.cocoonstack.io/claim-id").cloned());
        match (running, id) {
            (true, Some(id)) => Ok(id),
            _ => Err("not Running yet".to_string()),
        }
    })
    .await;
    let token = sim
        .sim()
        .claims()
        .into_iter()
        .find(|c| c.id == id)
        .map(|c| c.token)
        .unwrap_or_else(|| die("the claim's token"));
    let sandbox = SandboxRef {
        id: id.clone(),
        token: Secret::new(token.clone()),
    };
    let client = SandboxdClient::builder(sim.base_url())
        .token(Some(TOKEN.into()))
        .build()
        .unwrap_or_else(|e| die(&format!("sandboxd client: {e}")));
    let plane = Arc::new(SandboxdPlane::new(client.clone()));
    // A token allowed to exec and port-forward on this node.
    let role = support::rbac::grant(
        &env.cluster.client,
        &ns,
        "bench-streamer",
        json!({"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get", "create"]}),
    )
    .await;
    let bearer = support::rbac::sa_token(&env.cluster.client, &ns, "bench-streamer").await;
    let kubelet = vk.process.kubelet_port;
    let exec_path = format!("/exec/{ns}/p/agent?command=true&output=1&error=1");
    // Wait out RBAC propagation (a denial is cached for 30 s).
    support::wait_for("the exec grant", Duration::from_secs(60), || async {
        let r = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()
            .map_err(|e| e.to_string())?
            .get(format!("https://127.0.0.1:{kubelet}/pods"))
            .bearer_auth(&bearer)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        (r.status() == reqwest::StatusCode::OK)
            .then_some(())
            .ok_or(r.status().to_string())
    })
    .await;

    let http = reqwest::Client::new();
    let exec_url = format!("{}/v1/sandboxes/{id}/exec", sim.base_url());
    let direct = || async {
        let t = Instant::now();
        let r = http
            .post(&exec_url)
            .bearer_auth(&token)
            .json(&json!({"argv": ["true"]}))
            .send()
            .await
            .unwrap_or_else(|e| die(&format!("sandboxd /exec: {e}")));
        if !r.status().is_success() {
            die(&format!("sandboxd /exec: {}", r.status()));
        }
        let _ = r.bytes().await;
        t.elapsed().as_secs_f64() * 1000.0
    };
    let agent = || async {
        let t = Instant::now();
        let outcome = exec_true(plane.clone() as Arc<dyn DataPlane>, sandbox.clone()).await;
        if outcome != exec::Outcome::Exited(0) {
            die(&format!("agent exec: {outcome:?}"));
        }
        t.elapsed().as_secs_f64() * 1000.0
    };
    let kubelet_tls = any_cert();
    let null = super::null_kubelet::start().await;
    let null_path = "/exec/ns/p/agent?command=true&output=1&error=1";
    let admin = admin_tls(&env.cluster.kubeconfig).await;
    let api_port: u16 = env
        .cluster
        .kubeconfig
        .to_str()
        .and_then(|_| {
            let kc = Kubeconfig::read_from(&env.cluster.kubeconfig).ok()?;
            let server = kc.clusters.first()?.cluster.as_ref()?.server.clone()?;
            server
                .rsplit(':')
                .next()?
                .trim_end_matches('/')
                .parse()
                .ok()
        })
        .unwrap_or_else(|| die("the apiserver's port in the admin kubeconfig"));
    let api_path =
        format!("/api/v1/namespaces/{ns}/pods/p/exec?command=true&stdout=true&stderr=true");
    let kubeconfig = env.cluster.kubeconfig.clone();
    let ns_s = ns.clone();

    // Warm-up, then n of each, interleaved so that load drifts hit all.
    let _ = (direct().await, agent().await);
    let _ = ws_exec(kubelet_tls.clone(), null.port, null_path, None).await;
    let mut apart =
        super::agent_client::AgentClient::start(&sim.base_url(), &id, &token, TOKEN).await;
    let _ = apart.exec().await;
    let mut samples: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut kubelet_phases = Vec::new();
    let mut null_phases = Vec::new();
    for _ in 0..n {
        samples.entry(EXEC_DIRECT).or_default().push(direct().await);
        samples.entry(AGENT).or_default().push(agent().await);
        samples
            .entry(AGENT_APART)
            .or_default()
            .push(apart.exec().await);
        let ph = ws_exec(kubelet_tls.clone(), kubelet, &exec_path, Some(&bearer)).await;
        samples.entry(KUBELET_WS).or_default().push(ph.closed);
        kubelet_phases.push(ph);
        let ph = ws_exec(kubelet_tls.clone(), null.port, null_path, None).await;
        samples.entry(NULL_WS).or_default().push(ph.closed);
        null_phases.push(ph);
        samples.entry(APISERVER_WS).or_default().push(
            ws_exec(admin.clone(), api_port, &api_path, None)
                .await
                .closed,
        );
    }
    for _ in 0..n.min(20) {
        samples
            .entry(KUBECTL_EXEC)
            .or_default()
            .push(timed_kubectl(&kubeconfig, &["-n", &ns_s, "exec", "p", "--", "true"]).await);
    }
    drop(null);
    drop(apart);
    let exec = [
        EXEC_DIRECT,
        AGENT,
        AGENT_APART,
        KUBELET_WS,
        NULL_WS,
        APISERVER_WS,
        KUBECTL_EXEC,
    ]
    .iter()
    .map(|l| {
        (
            l.to_string(),
            quantiles(samples.remove(l).unwrap_or_default()),
        )
    })
    .collect();
    let phases = phase_quantiles(&kubelet_phases);
    let null_phases = phase_quantiles(&null_phases);
    let resumed = kubelet_phases.iter().filter(|p| p.resumed).count();

    let throughput = if mib > 0 {
        throughput(env, &client, &id, &token, kubelet, &bearer, &ns, mib).await
    } else {
        Vec::new()
    };

    support::rbac::revoke(&env.cluster.client, &role).await;
    env.cluster.drop_namespace(&ns).await;
    vk.delete_node(&env.cluster.client).await;
    StreamFigures {
        exec,
        phases,
        null_phases,
        resumed: (resumed, kubelet_phases.len()),
        throughput,
        mib,
    }
}

/// Port-forward throughput, best of three of each path (MiB/s).
#[allow(clippy::too_many_arguments)]
async fn throughput(
    env: &Env,
    client: &SandboxdClient,
    id: &str,
    token: &str,
    kubelet: u16,
    bearer: &str,
    ns: &str,
    mib: usize,
) -> Vec<(String, f64)> {
    let mut throughput = Vec::new();
    let mut best = |label: &str, v: Vec<f64>| {
        throughput.push((label.to_string(), v.into_iter().fold(0.0, f64::max)));
    };
    let mut relay = Vec::new();
    for _ in 0..3 {
        let io = client
            .port(id, &Secret::new(token.to_string()), SINK_PORT)
            .await
            .unwrap_or_else(|e| die(&format!("/ports relay: {e}")));
        relay.push(push(io, mib).await);
    }
    best(RELAY, relay);
    let mut spdy = Vec::new();
    for i in 0..3u32 {
        let auth = format!("Bearer {bearer}");
        let c = support::spdy::connect(
            kubelet,
            "POST",
            &format!("/portForward/{ns}/p"),
            &[
                ("X-Stream-Protocol-Version", "portforward.k8s.io"),
                ("Authorization", auth.as_str()),
            ],
        )
        .await
        .unwrap_or_else(|h| die(&format!("port-forward upgrade: {}", h.text)));
        spdy.push(spdy_push(&c, i, mib).await);
    }
    best(KUBELET_SPDY, spdy);
    let pf = kubectl_pf_best(&env.cluster.kubeconfig, ns, "p", SINK_PORT, mib, false).await;
    throughput.push((KUBECTL_PF.to_string(), pf));
    throughput
}

/// A `kubectl port-forward` to a Pod's port, running until dropped.
pub struct KubectlPf {
    _process: tokio::process::Child,
    local: u16,
}

impl KubectlPf {
    pub fn start(kubeconfig: &Path, ns: &str, pod: &str, port: u16) -> Self {
        let local = free_port();
        let process = tokio::process::Command::new(support::kubectl::path())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args([
                "-n",
                ns,
                "port-forward",
                &format!("pod/{pod}"),
                &format!("{local}:{port}"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| die(&format!("kubectl port-forward: {e}")));
        Self {
            _process: process,
            local,
        }
    }

    /// `mib` MiB one way over a new connection through it (MiB/s);
    /// `sized`: to a sink told the length first ([`push_sized`]).
    pub async fn push(&self, mib: usize, sized: bool) -> f64 {
        let io = support::wait_for("kubectl port-forward", Duration::from_secs(30), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", self.local))
                .await
                .map_err(|e| e.to_string())
        })
        .await;
        if sized {
            push_sized(io, mib).await
        } else {
            push(io, mib).await
        }
    }
}

/// `kubectl port-forward` to `pod`'s `port` (a counting sink; `sized`:
/// one told the length first, [`push_sized`]): `mib` MiB one way, best of
/// 3 connections through one port-forward (MiB/s).
pub async fn kubectl_pf_best(
    kubeconfig: &Path,
    ns: &str,
    pod: &str,
    port: u16,
    mib: usize,
    sized: bool,
) -> f64 {
    let pf = KubectlPf::start(kubeconfig, ns, pod, port);
    let mut best: f64 = 0.0;
    for _ in 0..3 {
        best = best.max(pf.push(mib, sized).await);
    }
    best
}

/// How long each step of the kubelet API's round trips took.
fn phase_quantiles(all: &[Phases]) -> Vec<(&'static str, Quantiles)> {
    type Step = (&'static str, fn(&Phases) -> f64);
    let steps: [Step; 5] = [
        ("TCP connect", |p| p.connect),
        ("TLS handshake", |p| p.tls - p.connect),
        ("HTTP upgrade (auth, Pod lookup) to the 101", |p| {
            p.upgraded - p.tls
        }),
        ("101 to the status (the relay, the command)", |p| {
            p.status - p.upgraded
        }),
        ("status to the close", |p| p.closed - p.status),
    ];
    steps
        .iter()
        .map(|(label, f)| (*label, quantiles(all.iter().map(f).collect())))
        .collect()
}

/// `mib` MiB over one port-forward connection of `c`; MiB/s.
async fn spdy_push(c: &support::spdy::Client, request: u32, mib: usize) -> f64 {
    use support::spdy::Event;
    let (port, rid) = (SINK_PORT.to_string(), request.to_string());
    let mut error = c
        .open(&[
            ("streamType", "error"),
            ("port", &port),
            ("requestID", &rid),
        ])
        .await;
    let _ = error.next().await;
    c.finish(error.id).await;
    let mut data = c
        .open(&[("streamType", "data"), ("port", &port), ("requestID", &rid)])
        .await;
    let _ = data.next().await;
    let chunk = vec![0x5au8; 32 * 1024];
    let t = Instant::now();
    for _ in 0..mib * 32 {
        c.write(data.id, &chunk).await;
    }
    c.finish(data.id).await;
    let (got, end) = data.read_to_end().await;
    let secs = t.elapsed().as_secs_f64();
    let n = got
        .get(..8)
        .map(|b| u64::from_be_bytes(b.try_into().unwrap_or([0; 8])))
        .unwrap_or(0);
    if n != (mib * 1024 * 1024) as u64 || end != Event::Fin {
        die(&format!("port-forward sink read {n} bytes ({end:?})"));
    }
    mib as f64 / secs
}
