//! What the kubelet API's routes share.

use std::sync::Arc;

use crate::kubelet::auth::KubeletAuth;
use crate::kubelet::sandbox::{DataPlane, Sandboxes};
use crate::kubelet::stats::StatsSource;
use crate::metrics::Metrics;
use crate::pods::source::PodSource;

/// What the routes need.
#[derive(Clone)]
pub struct KubeletState {
    pub node_name: String,
    pub pods: Arc<dyn PodSource>,
    /// `None` = authentication and authorization off (`--kubelet-auth=false`).
    pub auth: Option<Arc<KubeletAuth>>,
    pub metrics: Arc<Metrics>,
    /// exec, attach and port-forward into sandboxes, and their stats;
    /// `None` answers 503 (and empty stats).
    pub streaming: Option<Streaming>,
}

/// What the streaming and stats routes need.
#[derive(Clone)]
pub struct Streaming {
    pub sandboxes: Arc<dyn Sandboxes>,
    pub plane: Arc<dyn DataPlane>,
    pub stats: Arc<StatsSource>,
}

impl Streaming {
    pub fn new(sandboxes: Arc<dyn Sandboxes>, plane: Arc<dyn DataPlane>) -> Streaming {
        let stats = Arc::new(StatsSource::new(Arc::clone(&sandboxes), Arc::clone(&plane)));
        Streaming {
            sandboxes,
            plane,
            stats,
        }
    }
}
