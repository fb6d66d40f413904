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
}
