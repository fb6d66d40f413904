//! Registers or adopts the virtual Node, and keeps its status fresh.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, instrument, warn};

use super::desired::{self, FIELD_MANAGER, NodeSettings};
use crate::backoff::Backoff;
use crate::fleet::decide::{FleetSettings, FleetTaint, OWNED_TAINTS, Verdict, decide};
use crate::fleet::reading::Sample;
use crate::fleet::taints;
use crate::health::Health;
use crate::metrics::{Controller, Metrics};
use crate::periodic::{Beat, Next, Periodic, Turn};
use crate::{Error, Result};

fn refuse_foreign(name: &str) -> Error {
    Error::Config(format!(
        "a Node named {name:?} already exists and is not a virtual kubelet (no label \
         type=virtual-kubelet, not managed by vk-sandbox); it is probably the physical node. \
         Give the virtual node its own name with --node-name or VK_NODE_NAME \
         (for example \"{name}-sandboxd\")"
    ))
}

/// The Node as read before registering (start-up reads it while the Pod
/// watch lists).
#[derive(Debug, Clone)]
pub enum Seen {
    /// Not read (or the read failed): registration reads it.
    ReadNow,
    Absent,
    Present(Box<Node>),
}

impl Seen {
    /// Reads the Node; a failed read leaves it to registration.
    pub async fn read(client: Client, name: String) -> Seen {
        match Api::<Node>::all(client).get_opt(&name).await {
            Ok(Some(node)) => Seen::Present(Box::new(node)),
            Ok(None) => Seen::Absent,
            Err(_) => Seen::ReadNow,
        }
    }
}

/// What registration found and did.
#[derive(Debug, Clone)]
pub struct Registered {
    /// The Node as stored.
    pub node: Node,
    /// The Node was created carrying its status for the readiness given:
    /// there is nothing to apply until the next heartbeat.
    pub status_fresh: bool,
}

/// Creates the Node if absent (with its status, so it is Ready in one
/// request), or adopts ours: re-applies our labels unless they are already
/// ours as applied, and restores the taint if it is missing, leaving
/// others' labels, taints and conditions alone.
///
/// `seen` is the Node as read earlier, or [`Seen::ReadNow`]. An earlier read only ever spares requests: "absent" leads
/// to a create, which a Node made meanwhile refuses (409, then read
/// afresh), and "present with everything in place" to no write at all;
/// any write to an existing Node is decided from a fresh read.
#[instrument(skip_all, fields(node = %s.name))]
pub async fn register(
    client: &Client,
    s: &NodeSettings,
    seen: Seen,
    ready: bool,
) -> Result<Registered> {
    let nodes: Api<Node> = Api::all(client.clone());
    let (existing, fresh_read) = match seen {
        Seen::Absent => (None, false),
        Seen::Present(n) => (Some(*n), false),
        Seen::ReadNow => (
            nodes
                .get_opt(&s.name)
                .await
                .map_err(|e| Error::kube(format!("read Node {}", s.name), e))?,
            true,
        ),
    };
    let Some(node) = existing else {
        // Created with a plain POST: the taint is then owned by an Update
        // manager, so later applies of labels alone never remove it.
        // sandboxd's conditions and taints follow once the status loop
        // has a reading.
        let status = desired::status(s, ready, Timestamp::now(), None, &Verdict::default());
        let new: Node = serde_json::from_value(desired::new_node(s, &status))
            .map_err(|e| Error::Internal(format!("building Node {}: {e}", s.name)))?;
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        return match nodes.create(&pp, &new).await {
            Ok(n) => {
                info!("registered Node");
                Ok(Registered {
                    node: n,
                    status_fresh: true,
                })
            }
            // Lost a race with another writer: adopt what is there.
            Err(kube::Error::Api(ae)) if ae.code == 409 => {
                Box::pin(register(client, s, Seen::ReadNow, ready)).await
            }
            Err(e) => Err(Error::kube(format!("create Node {}", s.name), e)),
        };
    };
    if !desired::adoptable(&node) {
        return Err(refuse_foreign(&s.name));
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|sp| sp.taints.clone())
        .unwrap_or_default();
    if desired::labels_current(&node, s) && desired::has_taint(&taints) {
        info!("adopted existing Node (labels and taint in place)");
        return Ok(Registered {
            node,
            status_fresh: false,
        });
    }
    if !fresh_read {
        // Writes are decided from a fresh read only.
        return Box::pin(register(client, s, Seen::ReadNow, ready)).await;
    }
    let node = adopt(&nodes, s).await?;
    info!("adopted existing Node");
    Ok(Registered {
        node,
        status_fresh: false,
    })
}

/// Start-up registration, counted as the Node's first reconcile (a Node
/// created with its status has no status apply until the heartbeat). The
/// node is Ready once it is done.
pub async fn at_start(
    client: &Client,
    s: &NodeSettings,
    seen: Seen,
    metrics: &Metrics,
) -> Result<Registered> {
    let started = Instant::now();
    let r = register(client, s, seen, true).await;
    metrics.reconciled(Controller::Node, started.elapsed(), &r);
    r
}

/// Applies our labels to an existing Node and restores the taint if it is
/// missing; returns the Node as stored.
async fn adopt(nodes: &Api<Node>, s: &NodeSettings) -> Result<Node> {
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let mut node = nodes
        .patch(&s.name, &pp, &Patch::Apply(desired::labels_apply(s)))
        .await
        .map_err(|e| Error::kube(format!("apply labels to Node {}", s.name), e))?;
    let taints = node
        .spec
        .as_ref()
        .and_then(|sp| sp.taints.clone())
        .unwrap_or_default();
    if !desired::has_taint(&taints) {
        warn!(
            "adopted Node lacks the {}={}:NoSchedule taint; adding it back",
            desired::TAINT_KEY,
            desired::TAINT_VALUE
        );
        let rv = node.metadata.resource_version.clone().unwrap_or_default();
        let op = if node
            .spec
            .as_ref()
            .and_then(|sp| sp.taints.as_ref())
            .is_some()
        {
            serde_json::json!({"op": "add", "path": "/spec/taints/-", "value": desired::taint()})
        } else {
            serde_json::json!({"op": "add", "path": "/spec/taints", "value": [desired::taint()]})
        };
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            op
        ]))
        .map_err(|e| Error::Internal(format!("building taint patch: {e}")))?;
        node = nodes
            .patch(&s.name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
            .map_err(|e| Error::kube(format!("restore taint on Node {}", s.name), e))?;
    }
    Ok(node)
}

/// Applies the status once; returns the Node as stored.
pub async fn apply_status(
    nodes: &Api<Node>,
    s: &NodeSettings,
    ready: bool,
    observed: Option<&Node>,
    fleet: &Verdict,
) -> Result<Node> {
    let status = desired::status(
        s,
        ready,
        Timestamp::now(),
        observed.and_then(|n| n.status.as_ref()),
        fleet,
    );
    nodes
        .patch_status(
            &s.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(desired::status_apply(&s.name, &status)),
        )
        .await
        .map_err(|e| Error::kube(format!("apply status of Node {}", s.name), e))
}

/// The Node status loop: applies the status every `interval`, and at once
/// when readiness changes. A Node deleted while vk-sandbox runs is
/// registered again (and its new UID sent on `node_uid`, so the Lease
/// follows it). Each apply counts as a reconcile of the Node; errors are
/// logged and retried after a short back-off.
pub struct StatusLoop {
    pub client: Client,
    pub settings: NodeSettings,
    /// What registration found and did: when the Node was just created
    /// with its status, the first apply waits for the interval.
    pub registered: Registered,
    /// The Node's readiness (the Pod watch synced and the Node registered).
    pub ready: watch::Receiver<bool>,
    pub interval: Duration,
    pub node_uid: watch::Sender<String>,
    pub metrics: Arc<Metrics>,
    /// Notified by the Lease loop when the Lease vanished (the Node was
    /// probably deleted): the status is applied at once, which registers
    /// the Node again if it is gone.
    pub node_gone: Arc<Notify>,
    /// sandboxd's readings (src/fleet) and what the Node takes from them;
    /// `None` when every part is off (our taints, if any, are removed).
    pub fleet: Option<(watch::Receiver<Sample>, FleetSettings)>,
}

impl StatusLoop {
    /// Keeps the status fresh until `stop` is cancelled.
    pub async fn run(self, health: Arc<Health>, stop: CancellationToken) {
        let span = info_span!("node status", node = %self.settings.name);
        let applied = self
            .registered
            .status_fresh
            .then(|| (*self.ready.borrow(), Instant::now()));
        let turns = StatusTurns {
            nodes: Api::all(self.client.clone()),
            observed: self.registered.node,
            applied,
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(7)),
            client: self.client,
            settings: self.settings,
            ready: self.ready,
            interval: self.interval,
            node_uid: self.node_uid,
            metrics: self.metrics,
            node_gone: self.node_gone,
            check_now: false,
            // A Node created just now carries no sandboxd verdict yet.
            applied_verdict: self.registered.status_fresh.then(Verdict::default),
            fleet: self.fleet,
        };
        Periodic::new("Node status", turns.interval)
            .run(Some(&health), &stop, turns)
            .instrument(span)
            .await
    }
}

struct StatusTurns {
    client: Client,
    nodes: Api<Node>,
    settings: NodeSettings,
    /// The Node as last stored.
    observed: Node,
    /// The readiness last applied, and when.
    applied: Option<(bool, Instant)>,
    ready: watch::Receiver<bool>,
    interval: Duration,
    node_uid: watch::Sender<String>,
    backoff: Backoff,
    metrics: Arc<Metrics>,
    node_gone: Arc<Notify>,
    /// The Lease loop asked for the Node to be checked now.
    check_now: bool,
    /// sandboxd's verdict as last applied (status and taints).
    applied_verdict: Option<Verdict>,
    fleet: Option<(watch::Receiver<Sample>, FleetSettings)>,
}

impl StatusTurns {
    /// What sandboxd's latest reading says (nothing when every part is off).
    fn verdict(&mut self) -> Verdict {
        match &mut self.fleet {
            Some((rx, settings)) => decide(&rx.borrow_and_update().reading, settings),
            None => Verdict::default(),
        }
    }

    /// Our taints as `want` says, every other taint left as it is: a JSON
    /// patch guarded by the resourceVersion it was computed from, computed
    /// again from a fresh read when the Node changed meanwhile.
    async fn sync_taints(&mut self, want: &[FleetTaint]) -> Result<()> {
        let name = self.settings.name.clone();
        for attempt in 0..3 {
            let spec = self.observed.spec.as_ref();
            let current = spec.and_then(|sp| sp.taints.clone());
            let Some(new) = taints::merged(current.as_deref().unwrap_or_default(), want) else {
                return Ok(());
            };
            let rv = self
                .observed
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default();
            let op = if current.is_some() { "replace" } else { "add" };
            let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                {"op": op, "path": "/spec/taints", "value": new},
            ]))
            .map_err(|e| Error::Internal(format!("building taint patch: {e}")))?;
            match self
                .nodes
                .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
                .await
            {
                Ok(n) => {
                    let keys: Vec<&str> = want.iter().map(|t| t.key).collect();
                    info!(taints = ?keys, "sandboxd taints on the Node updated");
                    self.observed = n;
                    return Ok(());
                }
                Err(e) if attempt < 2 => {
                    debug!(error = %e, "taint patch refused; reading the Node again");
                    self.observed = self
                        .nodes
                        .get(&name)
                        .await
                        .map_err(|e| Error::kube(format!("read Node {name}"), e))?;
                }
                Err(e) => return Err(Error::kube(format!("update taints of Node {name}"), e)),
            }
        }
        Ok(())
    }

    /// Applies the status; registers the Node again when it is gone.
    async fn apply(&self, ready: bool, fleet: &Verdict) -> Result<Node> {
        let s = &self.settings;
        match apply_status(&self.nodes, s, ready, Some(&self.observed), fleet).await {
            Err(Error::Kube { source, .. }) if is_not_found(&source) => {
                warn!("the Node was deleted; registering it again");
                let r = register(&self.client, s, Seen::ReadNow, ready).await?;
                let uid = r.node.metadata.uid.clone().unwrap_or_default();
                self.node_uid.send_replace(uid);
                apply_status(&self.nodes, s, ready, Some(&r.node), fleet).await
            }
            other => other,
        }
    }
}

impl Turn for StatusTurns {
    async fn turn(&mut self, _: &Beat) -> Next {
        let ready = *self.ready.borrow_and_update();
        let verdict = self.verdict();
        if std::mem::take(&mut self.check_now) {
            self.applied = None;
        }
        let changed = self.applied_verdict.as_ref() != Some(&verdict);
        if !changed
            && let Some(wait) = heartbeat_due(self.applied, ready, self.interval, Instant::now())
        {
            return Next::After(wait);
        }
        let started = Instant::now();
        let mut result = self.apply(ready, &verdict).await;
        if let Ok(n) = result {
            self.observed = n;
            result = self
                .sync_taints(&verdict.taints)
                .await
                .map(|()| self.observed.clone());
        }
        self.metrics
            .reconciled(Controller::Node, started.elapsed(), &result);
        match result {
            Ok(_) => {
                let present: Vec<(&str, bool)> = OWNED_TAINTS
                    .iter()
                    .map(|k| (*k, verdict.taints.iter().any(|t| t.key == *k)))
                    .collect();
                self.metrics.node_sandboxd_taints(&present);
                self.applied = Some((ready, started));
                self.applied_verdict = Some(verdict);
                self.backoff.reset();
                Next::After(self.interval)
            }
            Err(e) => {
                warn!(error = %e, "node status update failed; retrying");
                // Applied again after the back-off, whatever is due.
                self.applied = None;
                self.applied_verdict = None;
                Next::After(self.backoff.failed())
            }
        }
    }

    async fn woken(&mut self) {
        let gone = Arc::clone(&self.node_gone);
        let sandboxd = async {
            let alive = match &mut self.fleet {
                Some((rx, _)) => rx.changed().await.is_ok(),
                None => false,
            };
            if !alive {
                std::future::pending::<()>().await
            }
        };
        tokio::select! {
            changed = self.ready.changed() => {
                if changed.is_err() {
                    std::future::pending::<()>().await
                }
            }
            () = sandboxd => {}
            _ = gone.notified() => self.check_now = true,
        }
    }
}

/// `None` when the status must be applied now (never applied, readiness
/// changed since, or the heartbeat is due); else how long until it is.
/// Pure.
pub fn heartbeat_due(
    applied: Option<(bool, Instant)>,
    ready: bool,
    interval: Duration,
    now: Instant,
) -> Option<Duration> {
    let (was_ready, at) = applied?;
    if was_ready != ready {
        return None;
    }
    let since = now.saturating_duration_since(at);
    (since < interval).then(|| interval - since)
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

#[cfg(test)]
mod tests;
