//! Where `/pods` and `/runningpods/` get their Pods from.

use std::sync::RwLock;

use k8s_openapi::api::core::v1::Pod;

/// The Pods the kubelet API reports. The Pods controller implements it:
/// `node_pods` from the watch cache (every Pod bound to this node),
/// `running_pods` from the provider (Pods with a claimed or adopted
/// sandbox). Both are snapshots; keep them cheap.
pub trait PodSource: Send + Sync {
    /// Every Pod bound to this node (`GET /pods`).
    fn node_pods(&self) -> Vec<Pod>;
    /// The provider's tracked Pods (`GET /runningpods/`).
    fn running_pods(&self) -> Vec<Pod>;
}

/// An in-memory [`PodSource`] (tests, and a stand-in until the Pods
/// controller exists).
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

    pub fn set_running_pods(&self, pods: Vec<Pod>) {
        if let Ok(mut g) = self.running.write() {
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
