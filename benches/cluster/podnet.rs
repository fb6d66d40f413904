//! `BENCH_ONLY=podnet`: what a sandbox Pod's own address costs
//! (docs/pod-network.md) against the direct `/ports` relay it rides on.
//!
//! vk-sandbox runs with `--pod-cidr` and `--pod-netns` in a network
//! namespace of this run's (the range is routed locally in there, as the
//! operator routes it on a node; no private-range address is a target in
//! the host's own namespace). The client's sockets are made in that
//! namespace. Each path is timed from a new connection to the first byte
//! echoed back by a guest service: sandboxd's `/ports` upgrade alone, and
//! `PODIP:PORT` (vk-sandbox accepts, checks the Pod and the policies, and
//! opens that same `/ports` relay). Throughput: `mib` MiB one way into a
//! guest service counting what it reads, both paths.

use std::net::{IpAddr, SocketAddr};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vk_sandbox::podnet::netns::PodNetns;
use vk_sandbox::sandboxd::{SandboxdClient, Secret};

use super::support::netns::TestNetns;
use super::*;

/// The guest ports of the echo and the counting services.
const ECHO_PORT: u16 = 9001;
const SINK_PORT: u16 = 9000;
/// The Pod range, inside the run's network namespace only.
const RANGE: &str = "10.250.77.0/24";

pub const DIRECT: &str = "sandboxd /ports relay alone (HTTP upgrade)";
pub const POD_ADDRESS: &str = "the Pod's own address (vk-sandbox relay → /ports)";

pub struct PodnetFigures {
    /// New connection → first echoed byte (ms), by path.
    pub setup: Vec<(&'static str, Quantiles)>,
    /// One way, best of 3 (MiB/s), by path.
    pub throughput: Vec<(&'static str, f64)>,
    pub mib: usize,
    pub n: usize,
}

impl PodnetFigures {
    fn setup_p50(&self, label: &str) -> Option<f64> {
        self.setup
            .iter()
            .find(|(l, _)| *l == label)
            .map(|(_, q)| q.p50)
    }

    fn rate(&self, label: &str) -> Option<f64> {
        self.throughput
            .iter()
            .find(|(l, _)| *l == label)
            .map(|(_, r)| *r)
    }

    /// The Pod address's set-up p50 minus the direct relay's (ms).
    pub fn setup_added_ms(&self) -> Option<f64> {
        Some(self.setup_p50(POD_ADDRESS)? - self.setup_p50(DIRECT)?)
    }

    /// The Pod address's throughput over the direct relay's.
    pub fn throughput_ratio(&self) -> Option<f64> {
        Some(self.rate(POD_ADDRESS)? / self.rate(DIRECT)?)
    }

    pub fn render(&self, s: &mut String) {
        use std::fmt::Write as _;
        let _ = writeln!(
            s,
            "\n### A Pod's own address (docs/pod-network.md)\n\n\
             | new connection → first byte echoed ({} each) | p50 | p90 | p99 | max |\n|---|---|---|---|---|",
            self.n
        );
        for (label, q) in &self.setup {
            let _ = writeln!(
                s,
                "| {label} | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms |",
                q.p50, q.p90, q.p99, q.max
            );
        }
        let _ = writeln!(
            s,
            "\n| {} MiB one way (best of 3) | MiB/s |\n|---|---|",
            self.mib
        );
        for (label, rate) in &self.throughput {
            let _ = writeln!(s, "| {label} | {rate:.0} |");
        }
    }

    pub fn goals(&self) -> Vec<(String, String, Option<bool>)> {
        let added = self.setup_added_ms();
        let ratio = self.throughput_ratio();
        vec![
            (
                "Pod address: connection set-up adds < 1 ms p50 over the direct /ports relay"
                    .to_string(),
                added.map_or("–".into(), |a| format!("{a:.3} ms")),
                added.map(|a| a < 1.0),
            ),
            (
                "Pod address: throughput ≥ 0.8 of the direct /ports relay's".to_string(),
                ratio.map_or("–".into(), |r| format!("{r:.2}")),
                ratio.map(|r| r >= 0.8),
            ),
        ]
    }
}

/// Answers every byte it reads with the same byte, until EOF.
async fn echo() -> SocketAddr {
    super::stream::loopback_service("echo", |mut c| async move {
        let mut buf = [0u8; 4096];
        while let Ok(n) = c.read(&mut buf).await {
            if n == 0 || c.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    })
    .await
}

/// A socket made in `net` (it stays there: connections from it start in
/// the namespace), ready to connect.
fn socket_in(net: &PodNetns) -> tokio::net::TcpSocket {
    net.within(tokio::net::TcpSocket::new_v4)
        .unwrap_or_else(|e| die(&format!("a socket in the run's network namespace: {e}")))
}

async fn first_byte<IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut io: IO) {
    io.write_all(b"x")
        .await
        .unwrap_or_else(|e| die(&format!("echo write: {e}")));
    let mut b = [0u8; 1];
    io.read_exact(&mut b)
        .await
        .unwrap_or_else(|e| die(&format!("echo read: {e}")));
}

pub async fn run(env: &Env, n: usize, mib: usize) -> Option<PodnetFigures> {
    let Some(net) = TestNetns::make("vkbench", RANGE) else {
        eprintln!("bench: podnet skipped: cannot make a network namespace (needs root)");
        return None;
    };
    let inside = PodNetns::new(Some(net.path()));
    let mut cfg = support::sim::config(TOKEN, &[&format!("{TEMPLATE}=2")]);
    cfg.wake_delay_ms = 0;
    for (guest_port, target) in [
        (ECHO_PORT, echo().await),
        (SINK_PORT, super::stream::sink().await),
    ] {
        cfg.port_map.push(sandboxd_sim::PortMapping {
            sandbox: None,
            template: Some(TEMPLATE.into()),
            guest_port,
            target,
        });
    }
    let sim = start_sim_cfg(cfg).await;
    let node = format!("bench-podnet-{}", support::suffix());
    let extra = [
        format!("--pod-cidr={RANGE}"),
        format!("--pod-netns={}", net.path().display()),
    ];
    let vk = Vk::start_with(env, &node, &sim, &env.sa_kubeconfig, None, &extra);
    vk.wait_ready(&env.cluster.client, Duration::from_secs(60))
        .await;
    let ns = env.cluster.namespace("bench-podnet").await;
    let pods: Api<Pod> = Api::namespaced(env.cluster.client.clone(), &ns);
    let mut p = pod("p", &node, None);
    if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.ports = Some(
            [ECHO_PORT, SINK_PORT]
                .iter()
                .map(|&port| k8s_openapi::api::core::v1::ContainerPort {
                    container_port: i32::from(port),
                    ..Default::default()
                })
                .collect(),
        );
    }
    pods.create(&PostParams::default(), &p)
        .await
        .unwrap_or_else(|e| die(&format!("create the Pod: {e}")));
    let (id, ip): (String, IpAddr) =
        support::running_address(&pods, "p", Duration::from_secs(60), String::new).await;
    let token = sim
        .sim()
        .claims()
        .into_iter()
        .find(|c| c.id == id)
        .map(|c| Secret::new(c.token))
        .unwrap_or_else(|| die("the claim's token"));
    let client = SandboxdClient::builder(sim.base_url())
        .token(Some(TOKEN.into()))
        .build()
        .unwrap_or_else(|e| die(&format!("sandboxd client: {e}")));
    let echo_addr = SocketAddr::new(ip, ECHO_PORT);
    let sink_addr = SocketAddr::new(ip, SINK_PORT);
    let via_pod = |addr: SocketAddr| {
        let s = socket_in(&inside);
        async move {
            s.connect(addr)
                .await
                .unwrap_or_else(|e| die(&format!("connect {addr}: {e}")))
        }
    };
    let direct = |port: u16| {
        let (client, id, token) = (&client, &id, &token);
        async move {
            client
                .port(id, token, port)
                .await
                .unwrap_or_else(|e| die(&format!("/ports relay: {e}")))
        }
    };
    // The Pod's address answers once its listener is up and the policies
    // (none here) are listed.
    support::wait_for(
        &format!("{echo_addr} echoes"),
        Duration::from_secs(30),
        || async {
            let s = socket_in(&inside);
            let mut c = s.connect(echo_addr).await.map_err(|e| e.to_string())?;
            c.write_all(b"x").await.map_err(|e| e.to_string())?;
            let mut b = [0u8; 1];
            match tokio::time::timeout(Duration::from_secs(2), c.read(&mut b)).await {
                Ok(Ok(1)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    // Interleaved, so that load drifts hit both paths alike.
    let mut direct_ms = Vec::with_capacity(n);
    let mut pod_ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        first_byte(direct(ECHO_PORT).await).await;
        direct_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        let s = socket_in(&inside);
        let t = Instant::now();
        let c = s
            .connect(echo_addr)
            .await
            .unwrap_or_else(|e| die(&format!("connect {echo_addr}: {e}")));
        first_byte(c).await;
        pod_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let setup = vec![
        (DIRECT, quantiles(direct_ms)),
        (POD_ADDRESS, quantiles(pod_ms)),
    ];

    let mut throughput = Vec::new();
    if mib > 0 {
        let (mut d, mut a) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            d.push(super::stream::push(direct(SINK_PORT).await, mib).await);
            a.push(super::stream::push(via_pod(sink_addr).await, mib).await);
        }
        throughput.push((DIRECT, d.into_iter().fold(0.0, f64::max)));
        throughput.push((POD_ADDRESS, a.into_iter().fold(0.0, f64::max)));
    }

    env.cluster.drop_namespace(&ns).await;
    vk.delete_node(&env.cluster.client).await;
    drop(vk);
    drop(net);
    Some(PodnetFigures {
        setup,
        throughput,
        mib,
        n,
    })
}
