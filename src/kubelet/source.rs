//! Where `/pods` and `/runningpods/` get their Pods from.

use crate::pods::pod::Pod;

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
