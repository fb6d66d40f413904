//! The NodeInventory watch behind the placement webhook: every node's
//! inventory, as vk-sandbox publishes it, folded into [`Holders`]. The
//! webhook answers from this index; it never asks a node at admission
//! time.
//!
//! The group read is `--inventory-group` when set, else the first of the
//! known groups the cluster serves (the publisher writes every one of
//! them, so the first has every node).

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::inventory::groups;
use crate::inventory::types::{KIND, NodeInventory, PLURAL, VERSION};

use super::decide::Lookup;
use super::holders::Holders;

/// How long to wait before looking for a served group again.
const GROUP_RETRY: Duration = Duration::from_secs(30);

/// The index the webhook reads, kept by [`run`].
#[derive(Debug, Default)]
pub struct Index {
    holders: RwLock<Holders>,
    synced: AtomicBool,
    /// The inventories of a relist, swapped in whole at its end (so an
    /// inventory deleted during a watch gap is forgotten).
    relist: RwLock<Option<Holders>>,
}

/// One inventory from the watch: its node and entries.
fn node_of(obj: &DynamicObject) -> Option<(String, NodeInventory)> {
    let value = serde_json::to_value(obj).ok()?;
    let inv: NodeInventory = serde_json::from_value(value).ok()?;
    let node = if inv.node.is_empty() {
        obj.metadata.name.clone()?
    } else {
        inv.node.clone()
    };
    Some((node, inv))
}

impl Index {
    /// What the index says about `key`.
    pub fn lookup(&self, key: &str) -> Lookup {
        if !self.synced.load(Ordering::Acquire) {
            return Lookup::NotSynced;
        }
        let holders = match self.holders.read() {
            Ok(h) => h,
            Err(poisoned) => poisoned.into_inner(),
        };
        Lookup::Held(holders.of(key))
    }

    /// Whether the watch has listed once.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// How many keys have a VM on some node.
    pub fn keys(&self) -> usize {
        match self.holders.read() {
            Ok(h) => h.keys(),
            Err(poisoned) => poisoned.into_inner().keys(),
        }
    }

    /// One watch event folded in.
    pub fn apply(&self, event: Event<DynamicObject>) {
        let mut relist = match self.relist.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let mut holders = match self.holders.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        match event {
            Event::Init => *relist = Some(Holders::default()),
            Event::InitApply(obj) => {
                if let (Some(fresh), Some((node, inv))) = (relist.as_mut(), node_of(&obj)) {
                    fresh.set_node(&node, &inv.entries);
                }
            }
            Event::InitDone => {
                if let Some(fresh) = relist.take() {
                    *holders = fresh;
                }
                self.synced.store(true, Ordering::Release);
            }
            Event::Apply(obj) => {
                if let Some((node, inv)) = node_of(&obj) {
                    holders.set_node(&node, &inv.entries);
                }
            }
            Event::Delete(obj) => {
                if let Some((node, _)) = node_of(&obj) {
                    holders.remove_node(&node);
                }
            }
        }
    }
}

/// What the Pod controller checks before a claim (src/pods/elsewhere).
impl crate::pods::elsewhere::VmHolders for Index {
    fn nodes_holding(&self, key: &str) -> Option<Vec<String>> {
        match self.lookup(key) {
            Lookup::NotSynced => None,
            Lookup::Held(nodes) => Some(nodes),
        }
    }
}

/// The group to read: the flag's, else the first known one served.
async fn group(
    client: &kube::Client,
    flag: Option<&str>,
    stop: &CancellationToken,
) -> Option<String> {
    if let Some(g) = flag {
        return Some(g.to_string());
    }
    loop {
        match groups::served_known(client).await {
            Ok(served) if !served.is_empty() => return served.into_iter().next(),
            Ok(_) => warn!(
                "placement: no nodeinventories CRD is served; Pods are not placed until one is \
                 (install crds/, and run vk-sandbox with --publish-inventory)"
            ),
            Err(e) => warn!(error = %e, "placement: API discovery of the NodeInventory failed"),
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(GROUP_RETRY) => {}
        }
    }
}

/// Keeps `index` until `stop`. A failed watch keeps the last index (the
/// watcher retries with back-off).
pub async fn run(
    index: std::sync::Arc<Index>,
    client: kube::Client,
    flag: Option<String>,
    stop: CancellationToken,
) {
    let Some(group) = group(&client, flag.as_deref(), &stop).await else {
        return;
    };
    let gvk = GroupVersionKind::gvk(&group, VERSION, KIND);
    let api: Api<DynamicObject> =
        Api::all_with(client, &ApiResource::from_gvk_with_plural(&gvk, PLURAL));
    info!(%group, "placement: watching NodeInventories");
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            event = events.next() => match event {
                Some(Ok(e)) => index.apply(e),
                Some(Err(e)) => warn!(error = %e, "placement: NodeInventory watch failed; the last index stays"),
                None => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inventory(node: &str, keys: &[&str]) -> DynamicObject {
        let entries: Vec<_> = keys
            .iter()
            .map(|k| serde_json::json!({"name": k, "phase": "Running", "claimRef": k, "addr": "10.0.0.1"}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "sandbox.cocoonstack.io/v1beta1", "kind": "NodeInventory",
            "metadata": {"name": node},
            "node": node,
            "entries": entries,
        }))
        .unwrap()
    }

    fn held(nodes: &[&str]) -> Lookup {
        Lookup::Held(nodes.iter().map(|n| n.to_string()).collect())
    }

    #[test]
    fn nothing_is_known_before_the_first_list_and_a_relist_replaces_the_index() {
        let index = Index::default();
        assert_eq!(index.lookup("ns/a"), Lookup::NotSynced);
        index.apply(Event::Init);
        index.apply(Event::InitApply(inventory("n1", &["ns/a"])));
        // Mid-list: still not synced.
        assert_eq!(index.lookup("ns/a"), Lookup::NotSynced);
        index.apply(Event::InitApply(inventory("n2", &["ns/b"])));
        index.apply(Event::InitDone);
        assert!(index.synced());
        assert_eq!(index.lookup("ns/a"), held(&["n1"]));
        assert_eq!(index.lookup("ns/b"), held(&["n2"]));
        assert_eq!(index.lookup("ns/c"), held(&[]));

        // A change, then a delete.
        index.apply(Event::Apply(inventory("n2", &["ns/b", "ns/a"])));
        assert_eq!(index.lookup("ns/a"), held(&["n1", "n2"]));
        index.apply(Event::Delete(inventory("n1", &[])));
        assert_eq!(index.lookup("ns/a"), held(&["n2"]));

        // A relist after a watch gap: n2 went meanwhile; until the list
        // ends the old index answers.
        index.apply(Event::Init);
        index.apply(Event::InitApply(inventory("n3", &["ns/a"])));
        assert_eq!(index.lookup("ns/a"), held(&["n2"]));
        index.apply(Event::InitDone);
        assert_eq!(index.lookup("ns/a"), held(&["n3"]));
        assert_eq!(index.lookup("ns/b"), held(&[]));
        assert_eq!(index.keys(), 1);
    }
}
