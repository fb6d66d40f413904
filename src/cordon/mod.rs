//! Cordon means drain (`--drain-sandboxd-on-cordon`): while the Node is
//! cordoned (`spec.unschedulable`, set by `kubectl cordon` and `kubectl
//! drain`), sandboxd is drained too, so nothing claims a VM here behind the
//! scheduler's back; on uncordon it takes claims again. Running sandboxes
//! are never touched (sandboxd's drain refuses only new claims). The
//! decision is [`decide`]; this module watches the Node, takes sandboxd's
//! `draining` from the one `/v1/info` reader (src/fleet/feed.rs) and acts.

pub mod decide;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::backoff::Backoff;
use crate::fleet::reading::{Reading, Sample};
use crate::health::Health;
use crate::periodic::{Beat, Next, Periodic, Turn};
use crate::sandboxd::SandboxdClient;
use crate::{Error, Result};

use decide::{Seen, Step, decide};

/// The Node annotation that records "vk-sandbox drained sandboxd for the
/// cordon" (written before the drain, removed after the undrain).
pub const DRAINED_FOR_CORDON: &str = "sandbox.cocoonstack.io/sandboxd-drained-for-cordon";

/// How often the decision is taken again without a change (a missed
/// event, a sandboxd that lost its drain between readings).
const RESYNC: Duration = Duration::from_secs(30);

/// The Node's part of [`Seen`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeSide {
    pub cordoned: bool,
    pub ours: bool,
}

impl NodeSide {
    pub fn of(node: &Node) -> NodeSide {
        NodeSide {
            cordoned: node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            ours: node
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(DRAINED_FOR_CORDON)),
        }
    }
}

/// sandboxd's `draining` as the decision takes it: a reading taken before
/// our own drain (its sequence number at most `drained_at`) says drained.
pub fn draining(sample: &Sample, drained_at: Option<u64>) -> Option<bool> {
    if drained_at.is_some_and(|at| sample.seq <= at) {
        return Some(true);
    }
    match &sample.reading {
        Reading::Read(info) => Some(info.draining),
        Reading::NotYet | Reading::Failed { .. } => None,
    }
}

/// The task: the Node's cordon drives sandboxd's drain.
pub struct CordonDrain {
    pub client: Client,
    pub node: String,
    pub sandboxd: SandboxdClient,
    pub feed: watch::Receiver<Sample>,
}

impl CordonDrain {
    /// Until `stop` is cancelled.
    pub async fn run(self, health: Arc<Health>, stop: CancellationToken) {
        let span = info_span!("cordon drain", node = %self.node);
        let nodes: Api<Node> = Api::all(self.client);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.node));
        let turns = Turns {
            events: watcher(nodes.clone(), config).default_backoff().boxed(),
            nodes,
            name: self.node,
            sandboxd: self.sandboxd,
            feed: self.feed,
            node: None,
            drained_at: None,
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(15)),
        };
        Periodic::new("cordon drain", RESYNC)
            .run(Some(&health), &stop, turns)
            .instrument(span)
            .await
    }
}

struct Turns {
    events: BoxStream<'static, std::result::Result<Event<Node>, watcher::Error>>,
    nodes: Api<Node>,
    name: String,
    sandboxd: SandboxdClient,
    feed: watch::Receiver<Sample>,
    /// The Node as last seen; `None` before the watch's first list (or
    /// while the Node is deleted).
    node: Option<NodeSide>,
    /// The feed's sequence number when our last drain was done.
    drained_at: Option<u64>,
    backoff: Backoff,
}

/// Writes (`ours`) or removes our record on the Node.
async fn record(nodes: &Api<Node>, name: &str, ours: bool) -> Result<()> {
    let value = if ours { json!("true") } else { json!(null) };
    let patch = json!({"metadata": {"annotations": {DRAINED_FOR_CORDON: value}}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube(format!("record the cordon drain on Node {name}"), e))?;
    Ok(())
}

impl Turns {
    async fn act(&mut self, step: Step, node: NodeSide, seq: u64) -> Result<()> {
        match step {
            Step::Nothing | Step::Wait => Ok(()),
            Step::Drain => {
                if !node.ours {
                    record(&self.nodes, &self.name, true).await?;
                    self.node = Some(NodeSide { ours: true, ..node });
                }
                self.sandboxd.drain().await.map_err(Error::Sandboxd)?;
                self.drained_at = Some(seq);
                info!("Node cordoned: sandboxd drained (Running sandboxes untouched)");
                Ok(())
            }
            Step::Undrain => {
                self.sandboxd.undrain().await.map_err(Error::Sandboxd)?;
                self.drained_at = None;
                record(&self.nodes, &self.name, false).await?;
                self.node = Some(NodeSide {
                    ours: false,
                    ..node
                });
                info!("Node uncordoned: sandboxd takes claims again");
                Ok(())
            }
        }
    }
}

impl Turn for Turns {
    async fn turn(&mut self, _: &Beat) -> Next {
        let Some(node) = self.node else {
            return Next::After(RESYNC);
        };
        let (seq, draining) = {
            let sample = self.feed.borrow_and_update();
            (sample.seq, draining(&sample, self.drained_at))
        };
        let step = decide(Seen {
            cordoned: node.cordoned,
            ours: node.ours,
            draining,
        });
        if step == Step::Wait {
            debug!("Node cordoned; sandboxd's draining unknown, waiting for a reading");
        }
        match self.act(step, node, seq).await {
            Ok(()) => {
                self.backoff.reset();
                Next::After(RESYNC)
            }
            Err(e) => {
                warn!(error = %e, ?step, "cordon drain step failed; retrying");
                Next::After(self.backoff.failed())
            }
        }
    }

    async fn woken(&mut self) {
        tokio::select! {
            event = self.events.next() => match event {
                Some(Ok(Event::Apply(n) | Event::InitApply(n))) => self.node = Some(NodeSide::of(&n)),
                Some(Ok(Event::Delete(_))) => self.node = None,
                Some(Ok(Event::Init | Event::InitDone)) => {}
                Some(Err(e)) => debug!(error = %e, "Node watch failed; it retries"),
                None => std::future::pending::<()>().await,
            },
            changed = self.feed.changed() => {
                if changed.is_err() {
                    std::future::pending::<()>().await
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandboxd::NodeInfo;

    fn sample(seq: u64, reading: Reading) -> Sample {
        Sample { seq, reading }
    }

    fn read(draining: bool) -> Reading {
        let info: NodeInfo =
            serde_json::from_value(json!({"pools": [], "draining": draining})).expect("info");
        Reading::Read(info)
    }

    #[test]
    fn a_reading_from_before_our_drain_counts_as_drained() {
        assert_eq!(draining(&sample(4, read(false)), Some(4)), Some(true));
        assert_eq!(draining(&sample(5, read(false)), Some(4)), Some(false));
        assert_eq!(draining(&sample(5, read(true)), None), Some(true));
        assert_eq!(draining(&sample(1, Reading::NotYet), None), None);
        assert_eq!(
            draining(
                &sample(
                    7,
                    Reading::Failed {
                        kind: crate::fleet::reading::FailureKind::Unreachable,
                        message: "x".into(),
                        consecutive: 1,
                        last: None,
                    }
                ),
                None
            ),
            None
        );
    }

    #[test]
    fn the_node_side_reads_the_cordon_and_our_record() {
        let mut n = Node::default();
        assert_eq!(
            NodeSide::of(&n),
            NodeSide {
                cordoned: false,
                ours: false
            }
        );
        n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            unschedulable: Some(true),
            ..Default::default()
        });
        n.metadata.annotations =
            Some([(DRAINED_FOR_CORDON.to_string(), "true".to_string())].into());
        assert_eq!(
            NodeSide::of(&n),
            NodeSide {
                cordoned: true,
                ours: true
            }
        );
    }
}
