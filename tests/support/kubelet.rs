//! An in-memory Pod source for the kubelet API tests.

use std::sync::RwLock;

use vk_sandbox::kubelet::PodSource;
use vk_sandbox::pods::pod::Pod;

/// Serves the Pods it is given (`/pods` and `/runningpods/`).
#[derive(Debug, Default)]
pub struct StaticPods {
    node: RwLock<Vec<Pod>>,
    running: RwLock<Vec<Pod>>,
}

impl StaticPods {
    pub fn new(node: Vec<Pod>, running: Vec<Pod>) -> Self {
        StaticPods {
            node: RwLock::new(node),
            running: RwLock::new(running),
        }
    }

    pub fn set_node_pods(&self, pods: Vec<Pod>) {
        if let Ok(mut g) = self.node.write() {
            *g = pods;
        }
    }
}

impl PodSource for StaticPods {
    fn node_pods(&self) -> Vec<Pod> {
        self.node.read().map(|g| g.clone()).unwrap_or_default()
    }

    fn running_pods(&self) -> Vec<Pod> {
        self.running.read().map(|g| g.clone()).unwrap_or_default()
    }
}

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use futures::future::BoxFuture;
use vk_sandbox::kubelet::sandbox::{
    DataPlane, Relay, RelayError, SandboxRef, SandboxStats, Sandboxes, Unavailable,
};
use vk_sandbox::sandboxd::Secret;

/// Sandboxes by `ns/name`: a sandbox (`Ok`), or why there is none.
#[derive(Default)]
pub struct FixedSandboxes {
    pub by_pod: HashMap<String, Result<String, String>>,
}

impl FixedSandboxes {
    /// `ns/name` runs in sandbox `id` (token `claim-token`).
    pub fn with(mut self, key: &str, id: &str) -> Self {
        self.by_pod.insert(key.into(), Ok(id.into()));
        self
    }

    /// `ns/name` is bound here but has no sandbox, for `why`.
    pub fn without(mut self, key: &str, why: &str) -> Self {
        self.by_pod.insert(key.into(), Err(why.into()));
        self
    }
}

impl Sandboxes for FixedSandboxes {
    fn lookup(&self, ns: &str, name: &str, _: Option<&str>) -> Result<SandboxRef, Unavailable> {
        match self.by_pod.get(&format!("{ns}/{name}")) {
            Some(Ok(id)) => Ok(SandboxRef {
                id: id.clone(),
                token: Secret::new("claim-token"),
            }),
            Some(Err(why)) => Err(Unavailable::NoSandbox(why.clone())),
            None => Err(Unavailable::NoPod),
        }
    }

    fn running(&self) -> Vec<(Pod, SandboxRef)> {
        Vec::new()
    }
}

/// Guest ports lead to local listeners (by guest port); any other port is
/// "unreachable", as sandboxd's 502. No guest agent.
#[derive(Default)]
pub struct LocalPorts {
    pub listeners: Mutex<HashMap<u16, SocketAddr>>,
    pub opened: Mutex<Vec<u16>>,
}

impl LocalPorts {
    pub fn map(&self, guest_port: u16, to: SocketAddr) {
        self.listeners.lock().unwrap().insert(guest_port, to);
    }
}

impl DataPlane for LocalPorts {
    fn agent<'a>(&'a self, _: &'a SandboxRef) -> BoxFuture<'a, Result<Relay, RelayError>> {
        Box::pin(async {
            Err(RelayError::Unreachable(
                "no guest agent in this test".into(),
            ))
        })
    }

    fn port<'a>(
        &'a self,
        s: &'a SandboxRef,
        port: u16,
    ) -> BoxFuture<'a, Result<Relay, RelayError>> {
        Box::pin(async move {
            assert_eq!(s.token.expose(), "claim-token");
            self.opened.lock().unwrap().push(port);
            let addr = self.listeners.lock().unwrap().get(&port).copied();
            match addr {
                Some(a) => {
                    let tcp = tokio::net::TcpStream::connect(a)
                        .await
                        .map_err(|e| RelayError::Transport(e.to_string()))?;
                    Ok(Box::new(tcp) as Relay)
                }
                None => Err(RelayError::Unreachable(
                    "sandboxd answered 502: guest port unreachable".into(),
                )),
            }
        })
    }

    fn stats<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<SandboxStats, RelayError>> {
        Box::pin(async { Err(RelayError::Transport("no stats in this test".into())) })
    }
}

use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use vk_sandbox::kubelet::tls::KubeletTls;
use vk_sandbox::kubelet::{KubeletState, Streaming, router, serve};
use vk_sandbox::metrics::Metrics;

/// The kubelet API served on a loopback port for a test; stopped when
/// dropped.
pub struct Api {
    pub port: u16,
    pub stop: CancellationToken,
    pub metrics: Arc<Metrics>,
    /// `serve`: true when it returned Ok.
    pub served: Option<tokio::task::JoinHandle<bool>>,
}

impl Drop for Api {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The kubelet API over TLS on 127.0.0.1 with the streaming `make` builds
/// (given the metrics it may count into).
pub async fn start_streaming(make: impl FnOnce(&Arc<Metrics>) -> Streaming) -> Api {
    vk_sandbox::crypto::install_provider();
    let metrics = Metrics::new().expect("metrics");
    let tls = KubeletTls::init(&Default::default(), "node-a", Some("127.0.0.1")).expect("tls");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let state = KubeletState {
        node_name: "node-a".into(),
        pods: Arc::new(StaticPods::default()),
        auth: None,
        metrics: Arc::clone(&metrics),
        streaming: Some(make(&metrics)),
    };
    let stop = CancellationToken::new();
    let served = tokio::spawn({
        let serving = serve(
            listener,
            tls.server_config(None).expect("server config"),
            router(state),
            stop.clone(),
        );
        async move { serving.await.is_ok() }
    });
    Api {
        port,
        stop,
        metrics,
        served: Some(served),
    }
}

/// A guest agent for exec: its first connection reads the `exec` frame,
/// answers `started` and then reads nothing more (a command that never
/// reads its stdin); later connections are control RPCs, recorded.
#[derive(Default)]
pub struct StuckAgent {
    connections: std::sync::Mutex<usize>,
    pub held: Arc<std::sync::Mutex<Vec<tokio::io::DuplexStream>>>,
    pub control: Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
}

impl DataPlane for StuckAgent {
    fn agent<'a>(&'a self, _: &'a SandboxRef) -> BoxFuture<'a, Result<Relay, RelayError>> {
        Box::pin(async move {
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            let first = {
                let mut n = self.connections.lock().unwrap();
                *n += 1;
                *n == 1
            };
            let control = Arc::clone(&self.control);
            let (r, mut w) = tokio::io::split(theirs);
            let mut lines = tokio::io::BufReader::new(r).lines();
            if first {
                let held = Arc::clone(&self.held);
                tokio::spawn(async move {
                    let line = lines.next_line().await.ok().flatten().unwrap_or_default();
                    assert!(line.contains("\"exec\""), "{line}");
                    w.write_all(b"{\"type\":\"started\",\"pid\":42}\n")
                        .await
                        .unwrap();
                    // Keep the relay open, unread.
                    let theirs = lines.into_inner().into_inner().unsplit(w);
                    held.lock().unwrap().push(theirs);
                });
            } else {
                tokio::spawn(async move {
                    while let Ok(Some(line)) = lines.next_line().await {
                        let f: serde_json::Value = serde_json::from_str(&line).unwrap();
                        control.lock().unwrap().push(f);
                        let _ = w.write_all(b"{\"type\":\"done\"}\n").await;
                    }
                });
            }
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
