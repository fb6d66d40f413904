//! The watches behind the verdicts (I/O): every NetworkPolicy (compiled as
//! it arrives), every namespace's labels (a metadata watch), and one
//! label-selected Pod watch per [`PeerWatch`]. Each keeps its store whole
//! across relists: the initial list is buffered and swapped in at its end.
//! A failing watch keeps its last state and retries with kube's back-off.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde::{Deserialize, Deserializer};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use super::peers::{PeerIndex, PeerPod, PeerWatch};
use super::selector::Labels;
use super::verdict::Policy;

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// What the policy and namespace watches changed: bumped on every change,
/// and the peer-watch loop woken.
#[derive(Debug, Default)]
pub struct Changes {
    generation: AtomicU64,
    notify: Notify,
}

impl Changes {
    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
        self.notify.notify_one();
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Until the next change (or at once, if one came since the last wait).
    pub async fn wait(&self) {
        self.notify.notified().await
    }
}

/// Policies by namespace, then name.
pub type ByNamespace = BTreeMap<String, BTreeMap<String, Arc<Policy>>>;

/// Every NetworkPolicy of the cluster, compiled, by namespace and name.
#[derive(Debug, Default)]
pub struct PolicyStore {
    listed: AtomicBool,
    by_ns: RwLock<ByNamespace>,
}

impl PolicyStore {
    /// Whether the first list has been read (until then nothing is known).
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    pub fn in_namespace(&self, ns: &str) -> Vec<Arc<Policy>> {
        read(&self.by_ns)
            .get(ns)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        read(&self.by_ns).values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies one watch event; `buffer` holds a relist until it is done.
    /// Whether anything changed.
    pub fn apply(&self, event: Event<NetworkPolicy>, buffer: &mut Option<ByNamespace>) -> bool {
        match event {
            Event::Init => {
                *buffer = Some(ByNamespace::new());
                false
            }
            Event::InitApply(np) => {
                if let Some(b) = buffer {
                    let p = compiled(&np);
                    b.entry(p.namespace.clone())
                        .or_default()
                        .insert(p.name.clone(), p);
                }
                false
            }
            Event::InitDone => {
                if let Some(b) = buffer.take() {
                    *write(&self.by_ns) = b;
                }
                self.listed.store(true, Ordering::Release);
                true
            }
            Event::Apply(np) => {
                let p = compiled(&np);
                let mut by_ns = write(&self.by_ns);
                let names = by_ns.entry(p.namespace.clone()).or_default();
                let changed = names.get(&p.name).is_none_or(|old| **old != *p);
                names.insert(p.name.clone(), p);
                changed
            }
            Event::Delete(np) => {
                let ns = np.namespace().unwrap_or_default();
                let mut by_ns = write(&self.by_ns);
                let Some(names) = by_ns.get_mut(&ns) else {
                    return false;
                };
                let gone = names.remove(&np.name_any()).is_some();
                if names.is_empty() {
                    by_ns.remove(&ns);
                }
                gone
            }
        }
    }
}

/// The policy as the verdict reads it; what the apiserver should have
/// refused in it is logged (it matches nothing).
fn compiled(np: &NetworkPolicy) -> Arc<Policy> {
    let (policy, problems) = Policy::compile(np);
    if !problems.is_empty() {
        warn!(
            policy = %format!("{}/{}", policy.namespace, policy.name),
            problems = %problems.join("; "),
            "NetworkPolicy parts the apiserver should have refused match nothing"
        );
    }
    Arc::new(policy)
}

/// Every namespace's labels, by name.
#[derive(Debug, Default)]
pub struct NamespaceStore {
    by_name: RwLock<BTreeMap<String, Arc<Labels>>>,
}

impl NamespaceStore {
    pub fn labels(&self, name: &str) -> Option<Arc<Labels>> {
        read(&self.by_name).get(name).cloned()
    }

    pub fn snapshot(&self) -> BTreeMap<String, Arc<Labels>> {
        read(&self.by_name).clone()
    }

    /// Applies one watch event (name and labels); `buffer` holds a relist
    /// until it is done. Whether anything changed.
    pub fn apply(
        &self,
        event: Event<(String, Labels)>,
        buffer: &mut Option<BTreeMap<String, Arc<Labels>>>,
    ) -> bool {
        match event {
            Event::Init => {
                *buffer = Some(BTreeMap::new());
                false
            }
            Event::InitApply((name, labels)) => {
                if let Some(b) = buffer {
                    b.insert(name, Arc::new(labels));
                }
                false
            }
            Event::InitDone => {
                if let Some(b) = buffer.take() {
                    *write(&self.by_name) = b;
                }
                true
            }
            Event::Apply((name, labels)) => {
                let mut by_name = write(&self.by_name);
                let changed = by_name.get(&name).is_none_or(|old| **old != labels);
                by_name.insert(name, Arc::new(labels));
                changed
            }
            Event::Delete((name, _)) => write(&self.by_name).remove(&name).is_some(),
        }
    }
}

/// Watches every NetworkPolicy into `store` until dropped.
pub async fn policies(client: Client, store: Arc<PolicyStore>, changes: Arc<Changes>) {
    let api: Api<NetworkPolicy> = Api::all(client);
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    let mut buffer = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(e) => {
                if store.apply(e, &mut buffer) {
                    changes.bump();
                }
            }
            Err(e) => {
                warn!(error = %e, "NetworkPolicy watch failed; the last policies stay in force")
            }
        }
    }
}

fn map_event<A, B>(e: Event<A>, f: impl Fn(A) -> B) -> Event<B> {
    match e {
        Event::Apply(a) => Event::Apply(f(a)),
        Event::Delete(a) => Event::Delete(f(a)),
        Event::Init => Event::Init,
        Event::InitApply(a) => Event::InitApply(f(a)),
        Event::InitDone => Event::InitDone,
    }
}

/// Watches every namespace's labels (metadata only) into `store` until
/// dropped.
pub async fn namespaces(client: Client, store: Arc<NamespaceStore>, changes: Arc<Changes>) {
    // Metadata-only requests: the namespaces' specs and statuses never come.
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
    let events = watcher(api, watcher::Config::default()).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut buffer = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(e) => {
                let e = map_event(e, |m| (m.name_any(), m.metadata.labels.unwrap_or_default()));
                if store.apply(e, &mut buffer) {
                    changes.bump();
                }
            }
            Err(e) => warn!(error = %e, "namespace watch failed; the last labels stay in force"),
        }
    }
}

/// The Pods one [`PeerWatch`] holds.
#[derive(Debug, Default)]
pub struct PeerSlot {
    listed: AtomicBool,
    index: RwLock<PeerIndex>,
}

impl PeerSlot {
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// The Pods known to have `ip`.
    pub fn at(&self, ip: IpAddr) -> Vec<Arc<PeerPod>> {
        read(&self.index).at(ip).to_vec()
    }

    pub fn len(&self) -> usize {
        read(&self.index).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies one watch event; `buffer` holds a relist until it is done.
    pub fn apply(&self, event: Event<WatchedPod>, buffer: &mut Option<PeerIndex>) {
        match event {
            Event::Init => *buffer = Some(PeerIndex::default()),
            Event::InitApply(p) => {
                if let Some(b) = buffer {
                    b.upsert(p.peer());
                }
            }
            Event::InitDone => {
                if let Some(b) = buffer.take() {
                    *write(&self.index) = b;
                }
                self.listed.store(true, Ordering::Release);
            }
            Event::Apply(p) => write(&self.index).upsert(p.peer()),
            Event::Delete(p) => write(&self.index).remove(&p.peer().uid),
        }
    }
}

/// Watches the Pods of `key` into `slot` until dropped (its task aborted).
pub async fn peer_pods(client: Client, key: PeerWatch, slot: Arc<PeerSlot>) {
    let (api, pods): (Api<WatchedPod>, _) = match &key {
        PeerWatch::Namespace { namespace, pods } => (Api::namespaced(client, namespace), pods),
        PeerWatch::Cluster { pods } => (Api::all(client), pods),
    };
    let config = watcher::Config::default().labels(&pods.to_string());
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    let mut buffer = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(e) => {
                let done = matches!(e, Event::InitDone);
                slot.apply(e, &mut buffer);
                if done {
                    debug!(watch = %key, pods = slot.len(), "peer Pods listed");
                }
            }
            Err(e) => warn!(watch = %key, error = %e, "peer Pod watch failed; retried"),
        }
    }
    info!(watch = %key, "peer Pod watch ended");
}

/// A Pod as a peer watch decodes it: its identity, labels and addresses;
/// every other field is skipped while decoding, so never allocated.
#[derive(Clone, Debug, Deserialize, kube::Resource)]
#[resource(inherit = "k8s_openapi::api::core::v1::Pod")]
pub struct WatchedPod {
    #[serde(default, deserialize_with = "lean_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    status: Option<WatchedStatus>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct WatchedStatus {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default, rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(default, rename = "podIPs")]
    pod_ips: Option<Vec<WatchedIp>>,
}

#[derive(Clone, Debug, Deserialize)]
struct WatchedIp {
    #[serde(default)]
    ip: String,
}

fn lean_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
        labels: Option<Labels>,
    }
    let m = Meta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        labels: m.labels,
        ..ObjectMeta::default()
    })
}

impl WatchedPod {
    /// The Pod as the index holds it. A finished Pod has no address (its
    /// address may already be another Pod's).
    pub fn peer(&self) -> PeerPod {
        let status = self.status.clone().unwrap_or_default();
        let finished = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
        let listed = status.pod_ips.unwrap_or_default();
        let raw: Vec<String> = if listed.is_empty() {
            status.pod_ip.into_iter().collect()
        } else {
            listed.into_iter().map(|i| i.ip).collect()
        };
        let mut ips: Vec<IpAddr> = raw
            .iter()
            .filter_map(|s| s.parse::<IpAddr>().ok())
            .map(|ip| ip.to_canonical())
            .collect();
        ips.sort();
        ips.dedup();
        if finished {
            ips.clear();
        }
        PeerPod {
            uid: self.metadata.uid.clone().unwrap_or_default(),
            namespace: self.metadata.namespace.clone().unwrap_or_default(),
            labels: self.metadata.labels.clone().unwrap_or_default(),
            ips,
        }
    }
}

#[cfg(test)]
mod tests;
