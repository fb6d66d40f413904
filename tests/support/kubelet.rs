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
