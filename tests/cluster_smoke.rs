//! Proves the local control plane is a real one: the scheduler binds Pods by
//! taints/tolerations and the garbage collector deletes dependents. Fails if
//! kube-scheduler or kube-controller-manager is not running.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::from_json;

#[tokio::test]
async fn scheduler_binds_by_toleration_and_gc_collects_dependents() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let client = cluster.client.clone();
    let ns = cluster.namespace("smoke").await;
    let node_name = format!("smoke-node-{}", support::suffix());
    // Deleted at the end, or when the test fails.
    let _node_cleanup = support::nodes::NodeCleanup::new(cluster.kubeconfig.clone(), &node_name);

    // A schedulable, tainted Node (no kubelet behind it).
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node_name, "labels": {"smoke": node_name}},
                "spec": {"taints": [{"key": "smoke.vk-sandbox.test/only", "value": "yes", "effect": "NoSchedule"}]}
            })),
        )
        .await
        .expect("create node");
    let now = jiff::Timestamp::now().to_string();
    nodes
        .patch_status(
            &node_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "capacity": {"cpu": "4", "memory": "8Gi", "pods": "10"},
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "10"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "Smoke",
                                "lastHeartbeatTime": now, "lastTransitionTime": now}]
            }})),
        )
        .await
        .expect("node status");

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = |name: &str, tolerate: bool| -> Pod {
        let mut tolerations = vec![
            json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists"}),
            json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists"}),
        ];
        if tolerate {
            tolerations.push(
                json!({"key": "smoke.vk-sandbox.test/only", "operator": "Equal",
                                    "value": "yes", "effect": "NoSchedule"}),
            );
        }
        from_json(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"smoke": node_name},
                "tolerations": tolerations,
                "containers": [{"name": "c", "image": "example.invalid/none:1"}]
            }
        }))
    };
    pods.create(&PostParams::default(), &pod("tolerates", true))
        .await
        .expect("create tolerating pod");
    pods.create(&PostParams::default(), &pod("intolerant", false))
        .await
        .expect("create intolerant pod");

    support::wait_for(
        "the scheduler to bind the tolerating Pod to the tainted node",
        Duration::from_secs(60),
        || async {
            let p = pods.get("tolerates").await.map_err(|e| e.to_string())?;
            match p.spec.and_then(|s| s.node_name) {
                Some(n) if n == node_name => Ok(()),
                other => Err(format!("spec.nodeName = {other:?}")),
            }
        },
    )
    .await;
    support::wait_for(
        "the scheduler to report the intolerant Pod Unschedulable",
        Duration::from_secs(60),
        || async {
            let p = pods.get("intolerant").await.map_err(|e| e.to_string())?;
            let bound = p.spec.as_ref().and_then(|s| s.node_name.clone());
            if bound.is_some() {
                return Err(format!("bound to {bound:?} despite the taint"));
            }
            let unschedulable = p
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"));
            if unschedulable {
                Ok(())
            } else {
                Err("no Unschedulable condition yet".into())
            }
        },
    )
    .await;

    // Garbage collection: a Pod owned by a ConfigMap goes when the owner goes.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let owner = cms
        .create(
            &PostParams::default(),
            &from_json(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}),
            ),
        )
        .await
        .expect("create owner");
    let uid = owner.metadata.uid.expect("uid");
    pods.create(
        &PostParams::default(),
        &from_json(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "dependent", "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}
            ]},
            // Never schedulable, so deletion is immediate (no kubelet to confirm).
            "spec": {"nodeSelector": {"smoke": "nowhere"},
                     "containers": [{"name": "c", "image": "example.invalid/none:1"}]}
        })),
    )
    .await
    .expect("create dependent");
    cms.delete("owner", &DeleteParams::background())
        .await
        .expect("delete owner");
    support::wait_for(
        "the garbage collector to delete the Pod whose owner was deleted",
        Duration::from_secs(60),
        || async {
            match pods.get_opt("dependent").await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(p) => Err(format!(
                    "still present (deletionTimestamp {:?})",
                    p.metadata.deletion_timestamp
                )),
            }
        },
    )
    .await;

    let _ = nodes.delete(&node_name, &DeleteParams::default()).await;
    cluster.drop_namespace(&ns).await;
}
