//! What the kubelet API's routes share.

use std::sync::Arc;
use std::time::Duration;

use crate::config::StreamingConfig;
use crate::kubelet::auth::KubeletAuth;
use crate::kubelet::limits::SessionGate;
use crate::kubelet::port_forward::PAIR_TIMEOUT;
use crate::kubelet::sandbox::{DataPlane, Sandboxes};
use crate::kubelet::stats::StatsSource;
use crate::metrics::Metrics;
use crate::pods::source::PodSource;
use crate::stream_stats::StreamStats;

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
    /// Sessions open, and the limits they are held to.
    pub gate: Arc<SessionGate>,
    /// How long the second stream of a port-forward pair may take.
    pub pair_timeout: Duration,
}

impl Streaming {
    /// Streaming with the default limits ([`StreamingConfig::default`]),
    /// counted apart from any metrics.
    pub fn new(sandboxes: Arc<dyn Sandboxes>, plane: Arc<dyn DataPlane>) -> Streaming {
        let stats = Arc::new(StatsSource::new(Arc::clone(&sandboxes), Arc::clone(&plane)));
        Streaming {
            sandboxes,
            plane,
            stats,
            gate: SessionGate::new(StreamingConfig::default(), Arc::default()),
            pair_timeout: PAIR_TIMEOUT,
        }
    }

    /// The same with `limits`, counted in `counts` (the metrics' own, see
    /// [`Metrics::streaming`]).
    pub fn with_limits(self, limits: StreamingConfig, counts: Arc<StreamStats>) -> Streaming {
        Streaming {
            gate: SessionGate::new(limits, counts),
            ..self
        }
    }

    /// The same with another port-forward pair timeout (tests).
    pub fn with_pair_timeout(self, pair_timeout: Duration) -> Streaming {
        Streaming {
            pair_timeout,
            ..self
        }
    }
}
