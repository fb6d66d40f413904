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
