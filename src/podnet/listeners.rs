//! The listening sockets on Pod addresses: one per (Pod address, declared
//! TCP `containerPort`) of every Pod this node runs in a sandbox, made and
//! closed as Pods come and go (looked at every [`PERIOD`], and at once
//! before a Pod is reported Running on its address). A port the Pod
//! does not declare has no listener: a connection there is refused by the
//! kernel, as on any Pod where nothing listens.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::{Instrument, info, info_span, warn};

use super::netns::PodNetns;
use super::relay::{self, Relaying};

/// How often the wanted listeners are compared with the open ones.
pub const PERIOD: Duration = Duration::from_secs(1);

/// One listener wanted: Pod `key`'s sandbox `id` answers on `addr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub addr: SocketAddr,
    pub key: String,
    pub id: String,
}

/// Which listeners the node's Pods want now (the provider's tracked Pods,
/// their claims' addresses and their declared ports).
pub trait Endpoints: Send + Sync {
    fn wanted(&self) -> Vec<Wanted>;

    /// Notified when a Pod is about to be reported Running on its address,
    /// so that its listeners open before a client can read the address
    /// (not a [`PERIOD`] later).
    fn changed(&self) -> Option<Arc<tokio::sync::Notify>> {
        None
    }
}

struct Open {
    key: String,
    id: String,
    task: JoinHandle<()>,
}

/// The open listeners, by address.
pub struct Listeners {
    netns: PodNetns,
    relaying: Arc<Relaying>,
    open: HashMap<SocketAddr, Open>,
    /// Addresses whose bind failed, so the failure is logged once.
    failed: HashMap<SocketAddr, String>,
}

impl Listeners {
    pub fn new(netns: PodNetns, relaying: Arc<Relaying>) -> Listeners {
        Listeners {
            netns,
            relaying,
            open: HashMap::new(),
            failed: HashMap::new(),
        }
    }

    /// The addresses listened on now.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        let mut v: Vec<SocketAddr> = self.open.keys().copied().collect();
        v.sort();
        v
    }

    /// Opens what is wanted and not open, closes what is open and no
    /// longer wanted (or now wanted for another Pod or sandbox).
    pub fn converge(&mut self, wanted: &[Wanted]) {
        let by_addr: HashMap<SocketAddr, &Wanted> = wanted.iter().map(|w| (w.addr, w)).collect();
        self.open.retain(|addr, o| {
            let keep = by_addr
                .get(addr)
                .is_some_and(|w| w.key == o.key && w.id == o.id);
            if !keep {
                o.task.abort();
                info!(pod = %o.key, sandbox = %o.id, %addr, "Pod address closed");
            }
            keep
        });
        self.failed.retain(|addr, _| by_addr.contains_key(addr));
        for w in wanted {
            if self.open.contains_key(&w.addr) {
                continue;
            }
            match self.netns.listen(w.addr) {
                Ok(std) => match tokio::net::TcpListener::from_std(std) {
                    Ok(listener) => {
                        self.failed.remove(&w.addr);
                        info!(pod = %w.key, sandbox = %w.id, addr = %w.addr, "Pod address listening");
                        let task =
                            tokio::spawn(accept(listener, Arc::clone(&self.relaying), w.clone()));
                        self.open.insert(
                            w.addr,
                            Open {
                                key: w.key.clone(),
                                id: w.id.clone(),
                                task,
                            },
                        );
                    }
                    Err(e) => self.bind_failed(w, &e),
                },
                Err(e) => self.bind_failed(w, &e),
            }
        }
    }

    fn bind_failed(&mut self, w: &Wanted, e: &std::io::Error) {
        let text = e.to_string();
        if self.failed.get(&w.addr) != Some(&text) {
            warn!(pod = %w.key, addr = %w.addr, error = %text,
                  "cannot listen on the Pod address; retried every second (is the Pod range \
                   routed locally in the Pod network namespace? `ip route add local <range> \
                   dev lo`, docs/pod-network.md)");
            self.failed.insert(w.addr, text);
        }
    }

    /// Converges every [`PERIOD`], and at once when the endpoints say
    /// they changed, until the process ends.
    pub async fn run(mut self, endpoints: Arc<dyn Endpoints>) {
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let changed = endpoints.changed().unwrap_or_default();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = changed.notified() => {}
            }
            self.converge(&endpoints.wanted());
        }
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        for o in self.open.values() {
            o.task.abort();
        }
    }
}

/// Accepts until aborted; the connections are the listener's own, so
/// closing a Pod's address (its Pod gone, suspended) ends them too.
async fn accept(listener: tokio::net::TcpListener, relaying: Arc<Relaying>, w: Wanted) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((conn, peer)) => {
                    let relaying = Arc::clone(&relaying);
                    let w = w.clone();
                    let span = info_span!("pod_address", pod = %w.key, sandbox = %w.id, %peer);
                    conns.spawn(
                        async move {
                            relay::serve(&relaying, conn, peer, &w.key, &w.id, w.addr.port()).await;
                        }
                        .instrument(span),
                    );
                }
                Err(e) => {
                    // Out of descriptors and the like: wait, not spin.
                    warn!(addr = %w.addr, error = %e, "accept on a Pod address failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}
