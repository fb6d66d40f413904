//! Where the kubelet API's `/pods` and `/runningpods/` get their Pods from.

use std::sync::Arc;

use kube::runtime::reflector::Store;

use super::pod::Pod;
use super::provider::Provider;

/// The Pods the kubelet API reports. Both are snapshots; keep them cheap.
pub trait PodSource: Send + Sync {
    /// Every Pod bound to this node (`GET /pods`).
    fn node_pods(&self) -> Vec<Pod>;
    /// The provider's tracked Pods (`GET /runningpods/`).
    fn running_pods(&self) -> Vec<Pod>;
    /// Pod `ns/name` if it is bound to this node (exec, port-forward). The
    /// default scans [`PodSource::node_pods`]; a source with an index
    /// answers directly.
    fn node_pod(&self, ns: &str, name: &str) -> Option<Pod> {
        self.node_pods().into_iter().find(|p| named(p, ns, name))
    }
    /// Pod `ns/name` as the provider tracks it (it holds its sandbox).
    fn running_pod(&self, ns: &str, name: &str) -> Option<Pod> {
        self.running_pods().into_iter().find(|p| named(p, ns, name))
    }
}

fn named(pod: &Pod, ns: &str, name: &str) -> bool {
    pod.key() == super::pod::key_of(Some(ns), name)
}

/// The daemon's source: `/pods` from the watch cache (every Pod bound to
/// this node), `/runningpods/` from the provider (Pods with a claimed or
/// adopted sandbox), both sorted by key.
pub struct NodePods {
    store: Store<Pod>,
    provider: Arc<Provider>,
}

impl NodePods {
    pub fn new(store: Store<Pod>, provider: Arc<Provider>) -> NodePods {
        NodePods { store, provider }
    }
}

impl PodSource for NodePods {
    fn node_pods(&self) -> Vec<Pod> {
        let mut pods: Vec<_> = self.store.state().iter().map(|p| (**p).clone()).collect();
        pods.sort_by_key(Pod::key);
        pods
    }

    fn running_pods(&self) -> Vec<Pod> {
        self.provider.tracked_pods()
    }

    fn node_pod(&self, ns: &str, name: &str) -> Option<Pod> {
        let key = kube::runtime::reflector::ObjectRef::new(name).within(ns);
        self.store.get(&key).map(|p| (*p).clone())
    }

    fn running_pod(&self, ns: &str, name: &str) -> Option<Pod> {
        self.provider
            .tracked(&super::pod::key_of(Some(ns), name))
            .map(|p| (*p).clone())
    }
}
