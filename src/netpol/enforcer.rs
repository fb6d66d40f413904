//! The handle the Pod-IP relay asks on every accepted connection
//! ([`NetworkPolicies::verdict`]: in memory, no I/O) and the watches that
//! keep it current ([`NetworkPolicies::run`]): every NetworkPolicy, every
//! namespace's labels, and only the Pods the ingress peers of policies
//! selecting this node's Pods can name (docs/networkpolicy.md#what-is-watched).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kube::Client;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span};

use super::egress;
use super::peers::{self, PeerPod, PeerWatch};
use super::selector::Labels;
use super::target::TargetPod;
use super::verdict::{self, NAMESPACE_NAME_LABEL, Source, SourcePod, Target, Verdict};
use super::watches::{self, Changes, NamespaceStore, PeerSlot, PolicyStore};

/// How often the node's Pods are looked at for a change in which policies
/// select them (policy and namespace changes wake the loop at once).
const LOCAL_PODS_PERIOD: Duration = Duration::from_secs(1);

/// The node's sandbox Pods, as namespace and labels.
pub type LocalPods = Arc<dyn Fn() -> Vec<(String, Labels)> + Send + Sync>;

/// One running peer watch: its Pods, and its task.
struct Running {
    slot: Arc<PeerSlot>,
    task: AbortHandle,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Ingress NetworkPolicy for this node's sandbox Pods.
pub struct NetworkPolicies {
    policies: Arc<PolicyStore>,
    namespaces: Arc<NamespaceStore>,
    changes: Arc<Changes>,
    peers: Mutex<BTreeMap<PeerWatch, Running>>,
    local: LocalPods,
}

impl NetworkPolicies {
    /// `local` lists the node's Pods (namespace and labels): only policies
    /// selecting one of them have their peers watched.
    pub fn new(local: LocalPods) -> Arc<NetworkPolicies> {
        Arc::new(NetworkPolicies {
            policies: Arc::default(),
            namespaces: Arc::default(),
            changes: Arc::default(),
            peers: Mutex::default(),
            local,
        })
    }

    /// Whether a TCP connection from `source` to `target`'s `port` may be
    /// relayed. Until the policies have been listed once, nothing is.
    pub fn verdict(&self, target: &impl TargetPod, source: IpAddr, port: u16) -> Verdict {
        if !self.policies.listed() {
            return Verdict {
                allowed: false,
                why: "NetworkPolicies not listed yet".into(),
            };
        }
        let (namespace, labels) = (target.namespace(), target.labels());
        let policies = self.policies.in_namespace(namespace);
        // Most connections: nothing selects the Pod, no source to look up.
        if !policies.iter().any(|p| p.selects_pod(namespace, labels)) {
            return verdict::decide(
                std::iter::empty(),
                &no_ports(namespace, labels),
                &bare(source),
                port,
            );
        }
        let ports = target.declared_ports();
        let target = Target {
            namespace,
            labels,
            ports: &ports,
        };
        let pods = self.pods_at(source);
        let ns_labels: Vec<Arc<Labels>> = pods
            .iter()
            .map(|p| {
                self.namespaces.labels(&p.namespace).unwrap_or_else(|| {
                    // Not seen yet: it has at least its name label.
                    let name = (NAMESPACE_NAME_LABEL.to_string(), p.namespace.clone());
                    Arc::new(Labels::from([name]))
                })
            })
            .collect();
        let sources: Vec<SourcePod> = pods
            .iter()
            .zip(&ns_labels)
            .map(|(p, l)| SourcePod {
                namespace: &p.namespace,
                labels: &p.labels,
                namespace_labels: l,
            })
            .collect();
        let source = Source {
            ip: source,
            pods: &sources,
        };
        verdict::decide(policies.iter().map(|p| &**p), &target, &source, port)
    }

    /// Why the egress policies selecting a Pod are not what limits its VM
    /// ([`egress::gap`]); `None` also until the policies are listed.
    pub fn egress_gap(&self, namespace: &str, labels: &Labels, lane: &str) -> Option<String> {
        if !self.policies.listed() {
            return None;
        }
        let policies = self.policies.in_namespace(namespace);
        egress::gap(policies.iter().map(|p| &**p), namespace, labels, lane)
    }

    /// The Pods the peer watches know at `ip`, each once.
    fn pods_at(&self, ip: IpAddr) -> Vec<Arc<PeerPod>> {
        let slots: Vec<Arc<PeerSlot>> = lock(&self.peers)
            .values()
            .map(|r| Arc::clone(&r.slot))
            .collect();
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for pod in slots.iter().flat_map(|s| s.at(ip)) {
            if seen.insert(pod.uid.clone()) {
                out.push(pod);
            }
        }
        out
    }

    /// The peer watches running, each with how many Pods it holds and
    /// whether it has listed them (for logs and tests).
    pub fn peer_watches(&self) -> Vec<(String, usize, bool)> {
        lock(&self.peers)
            .iter()
            .map(|(k, r)| (k.to_string(), r.slot.len(), r.slot.listed()))
            .collect()
    }

    /// How many NetworkPolicies are known, once listed.
    pub fn policies_known(&self) -> Option<usize> {
        self.policies.listed().then(|| self.policies.len())
    }

    /// The policies as if listed from the cluster (tests without one).
    #[cfg(test)]
    pub(crate) fn seed(&self, policies: &[k8s_openapi::api::networking::v1::NetworkPolicy]) {
        use kube::runtime::watcher::Event;
        let mut buffer = None;
        self.policies.apply(Event::Init, &mut buffer);
        for p in policies {
            self.policies
                .apply(Event::InitApply(p.clone()), &mut buffer);
        }
        self.policies.apply(Event::InitDone, &mut buffer);
    }

    /// Watches until `stop`: policies and namespaces all along, peer Pods
    /// as the policies selecting this node's Pods ask.
    pub async fn run(self: Arc<Self>, client: Client, node: String, stop: CancellationToken) {
        let span = info_span!("netpol", node = %node);
        async move {
            let policies = watches::policies(
                client.clone(),
                Arc::clone(&self.policies),
                Arc::clone(&self.changes),
            );
            let namespaces = watches::namespaces(
                client.clone(),
                Arc::clone(&self.namespaces),
                Arc::clone(&self.changes),
            );
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = policies => {}
                _ = namespaces => {}
                _ = self.keep_peer_watches(&client) => {}
            }
            for (_, r) in std::mem::take(&mut *lock(&self.peers)) {
                r.task.abort();
            }
            info!("NetworkPolicy watches stopped");
        }
        .instrument(span)
        .await
    }

    /// Starts and stops peer watches as the policies, the namespaces and
    /// the node's Pods change.
    async fn keep_peer_watches(&self, client: &Client) {
        let mut last: Option<(u64, Vec<(String, Labels)>)> = None;
        loop {
            let mut local = (self.local)();
            local.sort();
            local.dedup();
            let generation = self.changes.generation();
            let now = (generation, local);
            if last.as_ref() != Some(&now) {
                let wanted = self.wanted(&now.1);
                self.start_and_stop(client, wanted);
                last = Some(now);
            }
            tokio::select! {
                _ = self.changes.wait() => {}
                _ = tokio::time::sleep(LOCAL_PODS_PERIOD) => {}
            }
        }
    }

    fn wanted(&self, local: &[(String, Labels)]) -> BTreeSet<PeerWatch> {
        let here: BTreeSet<&str> = local.iter().map(|(ns, _)| ns.as_str()).collect();
        let policies: Vec<_> = here
            .iter()
            .flat_map(|ns| self.policies.in_namespace(ns))
            .collect();
        let namespaces = self.namespaces.snapshot();
        peers::desired(policies.iter().map(|p| &**p), local, &namespaces)
    }

    fn start_and_stop(&self, client: &Client, wanted: BTreeSet<PeerWatch>) {
        let mut peers = lock(&self.peers);
        peers.retain(|key, r| {
            let keep = wanted.contains(key);
            if !keep {
                r.task.abort();
                info!(watch = %key, "peer Pod watch stopped: no policy selecting a Pod here needs it");
            }
            keep
        });
        for key in wanted {
            if peers.contains_key(&key) {
                continue;
            }
            info!(watch = %key, "peer Pod watch started");
            let slot = Arc::new(PeerSlot::default());
            let task = tokio::spawn(
                watches::peer_pods(client.clone(), key.clone(), Arc::clone(&slot))
                    .in_current_span(),
            );
            let running = Running {
                slot,
                task: task.abort_handle(),
            };
            peers.insert(key, running);
        }
    }
}

fn no_ports<'a>(namespace: &'a str, labels: &'a Labels) -> Target<'a> {
    Target {
        namespace,
        labels,
        ports: &[],
    }
}

fn bare(ip: IpAddr) -> Source<'static> {
    Source { ip, pods: &[] }
}

#[cfg(test)]
mod tests;
