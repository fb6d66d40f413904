//! The node Lease (`kube-node-lease/<node>`): the heartbeat the node
//! lifecycle controller reads (docs/architecture.md, "Node and Lease").

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span, warn};

use super::desired::FIELD_MANAGER;
use crate::backoff::Backoff;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::periodic::{Beat, Next, Periodic, Turn};
use crate::{Error, Result};

pub const NAMESPACE: &str = "kube-node-lease";
pub const DURATION_SECONDS: i32 = 40;
/// Renew at a quarter of the duration, as the kubelet does.
pub const RENEW_INTERVAL: Duration = Duration::from_secs(10);
const MAX_QUICK_RETRIES: usize = 5;
const BACKOFF_START: Duration = Duration::from_millis(200);
const BACKOFF_CAP: Duration = Duration::from_secs(7);

/// The Lease as it should be now, owned by the Node (so it goes with it).
pub fn desired(node: &str, node_uid: &str, now: Timestamp) -> Lease {
    serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": NAMESPACE,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}],
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": DURATION_SECONDS,
            "renewTime": MicroTime(now),
        },
    }))
    .expect("a static Lease shape always deserializes")
}

/// `last` with its renewal moved to `now` and our identity re-asserted
/// (another writer may have changed them).
pub fn renewed(mut last: Lease, node: &str, node_uid: &str, now: Timestamp) -> Lease {
    let want = desired(node, node_uid, now);
    let spec = last.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some(node.into());
    spec.lease_duration_seconds = Some(DURATION_SECONDS);
    spec.renew_time = Some(MicroTime(now));
    if last
        .metadata
        .owner_references
        .as_ref()
        .is_none_or(|refs| !refs.iter().any(|r| r.uid == node_uid))
    {
        last.metadata.owner_references = want.metadata.owner_references;
    }
    last
}

/// A renewal's outcome.
#[derive(Debug, Clone)]
pub struct Renewed {
    /// The Lease as stored.
    pub lease: Lease,
    /// The Lease was gone and has been created.
    pub created: bool,
}

/// One renewal: update from the last written object; on a conflict re-read
/// and retry a few times; recreate when the Lease is gone.
pub async fn renew_once(
    leases: &Api<Lease>,
    node: &str,
    node_uid: &str,
    last: Option<Lease>,
) -> Result<Renewed> {
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let mut current = last;
    for _ in 0..MAX_QUICK_RETRIES {
        let base = match current.take() {
            Some(l) => l,
            None => match leases.get_opt(node).await {
                Ok(Some(l)) => l,
                Ok(None) => {
                    let l = desired(node, node_uid, Timestamp::now());
                    match leases.create(&pp, &l).await {
                        Ok(lease) => {
                            return Ok(Renewed {
                                lease,
                                created: true,
                            });
                        }
                        Err(kube::Error::Api(ae)) if ae.code == 409 => continue,
                        Err(e) => {
                            return Err(Error::kube(format!("create Lease {NAMESPACE}/{node}"), e));
                        }
                    }
                }
                Err(e) => return Err(Error::kube(format!("read Lease {NAMESPACE}/{node}"), e)),
            },
        };
        let next = renewed(base, node, node_uid, Timestamp::now());
        match leases.replace(node, &pp, &next).await {
            Ok(lease) => {
                return Ok(Renewed {
                    lease,
                    created: false,
                });
            }
            // Someone else wrote it, or it was deleted: re-read and retry.
            Err(kube::Error::Api(ae)) if ae.code == 409 || ae.code == 404 => {
                debug!(code = ae.code, "lease renewal raced; re-reading");
                current = None;
            }
            Err(e) => return Err(Error::kube(format!("renew Lease {NAMESPACE}/{node}"), e)),
        }
    }
    Err(Error::Conflict {
        context: format!(
            "renew Lease {NAMESPACE}/{node}: still conflicting after {MAX_QUICK_RETRIES} attempts"
        ),
    })
}

/// The Lease loop: renews every 10 s until stopped. Failures back off
/// (200 ms doubling to 7 s); each outcome is counted and sets readiness
/// (`/readyz` needs the last renewal to have succeeded). Nothing here
/// panics or gives up. `node_uid` follows the Node (it changes when the
/// Node is deleted and registered again), so the Lease is always owned by
/// the Node that exists.
///
/// A Lease that vanished while the loop ran was, as a rule, collected
/// with its owner, the Node: the loop then wakes the Node status loop
/// (`node_gone`), which registers the Node again at once instead of at its
/// next heartbeat (60 s), before PodGC force-deletes the node's Pods (about
/// 40 s after the Node went). A renewal that comes more than two intervals
/// after the previous one (the process was stopped, the apiserver away)
/// wakes it too: the node lifecycle controller has marked the Node
/// not Ready meanwhile, and Ready is written at once, not at the next
/// heartbeat.
pub struct Renewal {
    leases: Api<Lease>,
    node: String,
    node_uid: watch::Receiver<String>,
    last: Option<Lease>,
    backoff: Backoff,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    node_gone: Arc<Notify>,
    /// A renewal has succeeded in this process (the first one may create
    /// the Lease of a new Node; a later creation means it vanished).
    renewed_before: bool,
    /// When the last renewal succeeded.
    renewed_at: Option<Instant>,
}

impl Renewal {
    pub fn new(
        client: Client,
        node: &str,
        node_uid: watch::Receiver<String>,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        node_gone: Arc<Notify>,
    ) -> Renewal {
        Renewal {
            leases: Api::namespaced(client, NAMESPACE),
            node: node.to_string(),
            node_uid,
            last: None,
            backoff: Backoff::new(BACKOFF_START, BACKOFF_CAP),
            metrics,
            health,
            node_gone,
            renewed_before: false,
            renewed_at: None,
        }
    }

    /// Renews until `stop` is cancelled.
    pub async fn run(self, stop: CancellationToken) {
        let span = info_span!("lease", node = %self.node);
        let health = Arc::clone(&self.health);
        Periodic::new("node Lease", RENEW_INTERVAL)
            .run(Some(&health), &stop, self)
            .instrument(span)
            .await
    }
}

impl Turn for Renewal {
    async fn turn(&mut self, _: &Beat) -> Next {
        let uid = self.node_uid.borrow().clone();
        let renewal = renew_once(&self.leases, &self.node, &uid, self.last.take()).await;
        self.metrics.lease_renewed(renewal.is_ok());
        self.health.set_lease_ok(renewal.is_ok());
        match renewal {
            Ok(Renewed { lease, created }) => {
                let now = Instant::now();
                if vanished(self.renewed_before, created) {
                    warn!(
                        "the node Lease was gone (collected with a deleted Node?); asking the \
                         Node status loop to check the Node now"
                    );
                    self.node_gone.notify_one();
                } else if let Some(gap) = lapsed(self.renewed_at, now) {
                    // The node lifecycle controller has marked the Node
                    // NotReady meanwhile (unreachable taints, evictions to
                    // come): say Ready now, not at the next heartbeat (60 s).
                    warn!(
                        since_last = ?gap,
                        "the node Lease had lapsed (renewals more than two intervals apart: \
                         the process was stopped, or the apiserver away); asking the Node \
                         status loop to write Ready now"
                    );
                    self.node_gone.notify_one();
                }
                self.renewed_before = true;
                self.renewed_at = Some(now);
                self.last = Some(lease);
                self.backoff.reset();
                Next::After(RENEW_INTERVAL)
            }
            Err(e) => {
                let wait = self.backoff.failed();
                warn!(error = %e, retry_in = ?wait, "node lease renewal failed");
                Next::After(wait)
            }
        }
    }
}

/// How long since the last successful renewal, when renewals were more
/// than two intervals apart: the node lifecycle controller, whose grace
/// this process cannot know (40 s by default, often 20 s), may have marked
/// the Node not Ready in between. Pure.
pub fn lapsed(renewed_at: Option<Instant>, now: Instant) -> Option<Duration> {
    let gap = now.saturating_duration_since(renewed_at?);
    (gap > 2 * RENEW_INTERVAL).then_some(gap)
}

/// Whether a renewal found the Lease gone after an earlier one had
/// succeeded: its Node was probably deleted. Pure.
pub fn vanished(renewed_before: bool, created: bool) -> bool {
    renewed_before && created
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_lapse_when_more_than_two_intervals_apart() {
        let t0 = Instant::now();
        assert_eq!(lapsed(None, t0), None, "the first renewal");
        assert_eq!(lapsed(Some(t0), t0 + RENEW_INTERVAL), None);
        assert_eq!(lapsed(Some(t0), t0 + Duration::from_secs(20)), None);
        let late = t0 + Duration::from_secs(21);
        assert_eq!(lapsed(Some(t0), late), Some(Duration::from_secs(21)));
        assert_eq!(lapsed(Some(late), t0), None, "a clock that went back");
    }

    #[test]
    fn only_a_lease_that_existed_can_vanish() {
        assert!(!vanished(false, true), "a new Node's first Lease");
        assert!(!vanished(true, false));
        assert!(!vanished(false, false));
        assert!(vanished(true, true));
    }

    #[test]
    fn desired_lease_shape() {
        let now: Timestamp = "2026-01-01T00:00:00.123456Z".parse().expect("ts");
        let l = desired("vk-a", "uid-1", now);
        assert_eq!(l.metadata.namespace.as_deref(), Some(NAMESPACE));
        let spec = l.spec.expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("vk-a"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert_eq!(spec.renew_time, Some(MicroTime(now)));
        let owners = l.metadata.owner_references.expect("owners");
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].kind, "Node");
        assert_eq!(owners[0].uid, "uid-1");
        assert_eq!(owners[0].controller, None);
    }

    #[test]
    fn renewal_moves_time_and_restores_identity() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().expect("t0");
        let t1: Timestamp = "2026-01-01T00:00:10Z".parse().expect("t1");
        let mut l = desired("vk-a", "uid-1", t0);
        l.metadata.resource_version = Some("42".into());
        l.spec.as_mut().expect("spec").holder_identity = Some("intruder".into());
        l.metadata.owner_references = None;
        let r = renewed(l, "vk-a", "uid-2", t1);
        assert_eq!(r.metadata.resource_version.as_deref(), Some("42"));
        let spec = r.spec.expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("vk-a"));
        assert_eq!(spec.renew_time, Some(MicroTime(t1)));
        assert_eq!(r.metadata.owner_references.expect("owners")[0].uid, "uid-2");
    }
}
