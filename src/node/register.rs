//! Registers or adopts the virtual Node, and keeps its status fresh.

use std::time::Duration;

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

/// Creates the Node if absent, or adopts ours: re-applies our labels and
/// restores the taint if it is missing, leaving others' labels, taints and
/// conditions alone. Returns the Node as stored.
#[instrument(skip_all, fields(node = %s.name))]
pub async fn register(client: &Client, s: &NodeSettings) -> Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let existing = nodes
        .get_opt(&s.name)
        .await
        .map_err(|e| Error::kube(format!("read Node {}", s.name), e))?;
    let Some(node) = existing else {
        // Created with a plain POST: the taint is then owned by an Update
        // manager, so later applies of labels alone never remove it.
        let new: Node = serde_json::from_value(desired::new_node(s))
            .map_err(|e| Error::Internal(format!("building Node {}: {e}", s.name)))?;
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        return match nodes.create(&pp, &new).await {
            Ok(n) => {
                info!("registered Node");
                Ok(n)
            }
            // Lost a race with another writer: adopt what is there.
            Err(kube::Error::Api(ae)) if ae.code == 409 => Box::pin(register(client, s)).await,
            Err(e) => Err(Error::kube(format!("create Node {}", s.name), e)),
        };
    };
    if !adoptable(&node) {
        return Err(refuse_foreign(&s.name));
    }
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
    info!("adopted existing Node");
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
/// readiness changes. A Node deleted while vk-sandbox runs is registered
/// again (and its new UID sent on `node_uid`, so the Lease follows it).
/// Errors are logged and retried after a short back-off; the loop ends when
/// `stop` is cancelled.
#[allow(clippy::too_many_arguments)]
#[instrument(skip_all, fields(node = %s.name))]
pub async fn run_status_loop(
    client: Client,
    s: NodeSettings,
    mut observed: Node,
    mut ready: watch::Receiver<bool>,
    interval: Duration,
    stop: CancellationToken,
    heartbeat: Option<LoopHeartbeat>,
    node_uid: watch::Sender<String>,
    on_result: impl Fn(&Result<()>, Duration) + Send,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(7));
    loop {
        if let Some(hb) = &heartbeat {
            hb.beat();
        }
        let is_ready = *ready.borrow_and_update();
        let started = std::time::Instant::now();
        let result = tokio::select! {
            r = apply_status(&nodes, &s, is_ready, Some(&observed)) => r,
            _ = stop.cancelled() => return,
        };
        let result = match result {
            Err(Error::Kube { source, .. }) if is_not_found(&source) => {
                warn!("the Node was deleted; registering it again");
                match register(&client, &s).await {
                    Ok(n) => {
                        let uid = n.metadata.uid.clone().unwrap_or_default();
                        node_uid.send_replace(uid);
                        apply_status(&nodes, &s, is_ready, Some(&n)).await
                    }
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        let took = started.elapsed();
        let wait = match result {
            Ok(n) => {
                observed = n;
                backoff.reset();
                on_result(&Ok(()), took);
                interval
            }
            Err(e) => {
                warn!(error = %e, "node status update failed; retrying");
                on_result(&Err(e), took);
                backoff.failed()
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            changed = ready.changed() => { if changed.is_err() { return; } }
            _ = stop.cancelled() => return,
        }
    }
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
    fn refusal_names_the_flag_and_env() {
        let msg = refuse_foreign("worker-1").to_string();
        assert!(msg.contains("worker-1"));
        assert!(msg.contains("--node-name"));
        assert!(msg.contains("VK_NODE_NAME"));
    }
}
