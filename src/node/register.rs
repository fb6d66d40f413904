//! Registers or adopts the virtual Node, and keeps its status fresh.

use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, instrument, warn};

use super::desired::{self, FIELD_MANAGER, NodeSettings};
use crate::admin::LoopHeartbeat;
use crate::backoff::Backoff;
use crate::{Error, Result};

/// Whether an existing Node may be taken over: it is labelled as a virtual
/// kubelet, or vk-sandbox already manages it (its labels may have been
/// overridden through `--node-labels`). A physical node is neither.
pub fn adoptable(node: &Node) -> bool {
    let (k, v) = desired::VIRTUAL_KUBELET_LABEL;
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(k))
        .is_some_and(|x| x == v);
    let managed = node.metadata.managed_fields.as_ref().is_some_and(|m| {
        m.iter()
            .any(|f| f.manager.as_deref() == Some(FIELD_MANAGER))
    });
    labelled || managed
}

fn refuse_foreign(name: &str) -> Error {
    Error::Config(format!(
        "a Node named {name:?} already exists and is not a virtual kubelet (no label \
         type=virtual-kubelet, not managed by vk-sandbox); it is probably the physical node. \
         Give the virtual node its own name with --node-name or VK_NODE_NAME \
         (for example \"{name}-sandboxd\")"
    ))
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
/// `seen` is the Node as read earlier (`Some(None)`: absent), or `None` to
/// read it now. An earlier read only ever spares requests: "absent" leads
/// to a create, which a Node made meanwhile refuses (409, then read
/// afresh), and "present with everything in place" to no write at all;
/// any write to an existing Node is decided from a fresh read.
#[instrument(skip_all, fields(node = %s.name))]
pub async fn register(
    client: &Client,
    s: &NodeSettings,
    seen: Option<Option<Node>>,
    ready: bool,
) -> Result<Registered> {
    let nodes: Api<Node> = Api::all(client.clone());
    let (existing, fresh_read) = match seen {
        Some(n) => (n, false),
        None => (
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
        let status = desired::status(s, ready, Timestamp::now(), None);
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
                Box::pin(register(client, s, None, ready)).await
            }
            Err(e) => Err(Error::kube(format!("create Node {}", s.name), e)),
        };
    };
    if !adoptable(&node) {
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
        return Box::pin(register(client, s, None, ready)).await;
    }
    let node = adopt(&nodes, s).await?;
    info!("adopted existing Node");
    Ok(Registered {
        node,
        status_fresh: false,
    })
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
) -> Result<Node> {
    let status = desired::status(
        s,
        ready,
        Timestamp::now(),
        observed.and_then(|n| n.status.as_ref()),
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

/// Keeps the Node status fresh: every `interval`, and at once when
/// readiness changes. `registered` says whether the Node was just created
/// with its status (then the first apply waits for the interval). A Node
/// deleted while vk-sandbox runs is registered again (and its new UID sent
/// on `node_uid`, so the Lease follows it). Errors are logged and retried
/// after a short back-off; the loop ends when `stop` is cancelled.
#[allow(clippy::too_many_arguments)]
#[instrument(skip_all, fields(node = %s.name))]
pub async fn run_status_loop(
    client: Client,
    s: NodeSettings,
    registered: Registered,
    mut ready: watch::Receiver<bool>,
    interval: Duration,
    stop: CancellationToken,
    heartbeat: Option<LoopHeartbeat>,
    node_uid: watch::Sender<String>,
    on_result: impl Fn(&Result<()>, Duration) + Send,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(7));
    let mut observed = registered.node;
    // The readiness last applied, and when.
    let mut applied: Option<(bool, Instant)> = registered
        .status_fresh
        .then(|| (*ready.borrow(), Instant::now()));
    loop {
        if let Some(hb) = &heartbeat {
            hb.beat();
        }
        let is_ready = *ready.borrow_and_update();
        let wait = match heartbeat_due(applied, is_ready, interval, Instant::now()) {
            Some(wait) => wait,
            None => {
                let started = Instant::now();
                let result = tokio::select! {
                    r = apply_status(&nodes, &s, is_ready, Some(&observed)) => r,
                    _ = stop.cancelled() => return,
                };
                let result = match result {
                    Err(Error::Kube { source, .. }) if is_not_found(&source) => {
                        warn!("the Node was deleted; registering it again");
                        match register(&client, &s, None, is_ready).await {
                            Ok(r) => {
                                let uid = r.node.metadata.uid.clone().unwrap_or_default();
                                node_uid.send_replace(uid);
                                apply_status(&nodes, &s, is_ready, Some(&r.node)).await
                            }
                            Err(e) => Err(e),
                        }
                    }
                    other => other,
                };
                let took = started.elapsed();
                match result {
                    Ok(n) => {
                        observed = n;
                        applied = Some((is_ready, started));
                        backoff.reset();
                        on_result(&Ok(()), took);
                        interval
                    }
                    Err(e) => {
                        warn!(error = %e, "node status update failed; retrying");
                        on_result(&Err(e), took);
                        // Applied again after the back-off, whatever is due.
                        applied = None;
                        backoff.failed()
                    }
                }
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            changed = ready.changed() => { if changed.is_err() { return; } }
            _ = stop.cancelled() => return,
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
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    fn node(labels: &[(&str, &str)], manager: Option<&str>) -> Node {
        let mut n = Node::default();
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n.metadata.managed_fields = manager.map(|m| {
            vec![ManagedFieldsEntry {
                manager: Some(m.into()),
                ..Default::default()
            }]
        });
        n
    }

    #[test]
    fn physical_node_is_not_adoptable() {
        assert!(!adoptable(&node(
            &[("kubernetes.io/hostname", "a")],
            Some("kubelet")
        )));
        assert!(!adoptable(&node(&[("type", "physical")], None)));
    }

    #[test]
    fn virtual_or_ours_is_adoptable() {
        assert!(adoptable(&node(&[("type", "virtual-kubelet")], None)));
        assert!(adoptable(&node(&[("type", "vk")], Some("vk-sandbox"))));
    }

    #[test]
    fn the_heartbeat_is_due_when_never_applied_readiness_changed_or_the_period_passed() {
        let t0 = Instant::now();
        let every = Duration::from_secs(10);
        assert_eq!(heartbeat_due(None, true, every, t0), None);
        assert_eq!(
            heartbeat_due(Some((true, t0)), true, every, t0 + Duration::from_secs(4)),
            Some(Duration::from_secs(6))
        );
        assert_eq!(heartbeat_due(Some((false, t0)), true, every, t0), None);
        assert_eq!(heartbeat_due(Some((true, t0)), false, every, t0), None);
        assert_eq!(
            heartbeat_due(Some((true, t0)), true, every, t0 + every),
            None
        );
        assert_eq!(
            heartbeat_due(Some((true, t0)), true, every, t0 + Duration::from_secs(11)),
            None
        );
    }

    #[test]
    fn refusal_names_the_flag_and_env() {
        let msg = refuse_foreign("worker-1").to_string();
        assert!(msg.contains("worker-1"));
        assert!(msg.contains("--node-name"));
        assert!(msg.contains("VK_NODE_NAME"));
    }
}
