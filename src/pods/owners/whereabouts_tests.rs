//! Where a key's Pod runs now, as the upkeep's `Moved` release asks it.

use super::*;

/// Where a key's Pod runs now: only a live Pod of the same owner on
/// another node says the Sandbox moved.
#[tokio::test]
async fn whereabouts_names_another_node_only_for_a_live_pod_of_the_same_owner() {
    use crate::pods::fixtures::*;
    use serde_json::json;
    let pending_on = |node: &str, owner: &str| {
        let mut p = serde_json::to_value(owned_pod("p2", owner)).expect("pod");
        p["spec"]["nodeName"] = json!(node);
        p["status"] = json!({"phase": "Pending"});
        p
    };
    let pod_on = |node: &str, owner: &str, deleting: bool| {
        let mut p = serde_json::to_value(owned_pod("p2", owner)).expect("pod");
        p["spec"]["nodeName"] = json!(node);
        p["status"] = json!({"phase": "Running"});
        if deleting {
            p["metadata"]["deletionTimestamp"] = json!("2026-12-06T10:00:00Z");
        }
        p
    };
    let owner = OwnerRef {
        api_version: "agents.x-k8s.io/v1beta1".into(),
        kind: "Sandbox".into(),
        name: "sb".into(),
        uid: "o1".into(),
    };
    let cases = [
        (
            "same owner, another node",
            pod_on("node-b", "o1", false),
            Whereabouts::Elsewhere("node-b".into()),
        ),
        (
            "same owner, this node",
            pod_on("node-a", "o1", false),
            Whereabouts::NotElsewhere,
        ),
        (
            "another owner, another node",
            pod_on("node-b", "o2", false),
            Whereabouts::NotElsewhere,
        ),
        (
            "same owner, another node, being deleted",
            pod_on("node-b", "o1", true),
            Whereabouts::NotElsewhere,
        ),
        (
            "same owner, only bound to another node",
            pending_on("node-b", "o1"),
            Whereabouts::NotElsewhere,
        ),
    ];
    for (name, pod, want) in cases {
        let list = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [pod]});
        let api = ApiServer::new(move |s| match s.path() {
            "/api/v1/namespaces/ns/pods" => (200, list.clone()),
            _ => (404, serde_json::Value::Null),
        });
        let owners = Owners::new(api.client.clone());
        let got = within(owners.whereabouts("ns/sb", &owner, "node-a"))
            .await
            .expect("listed");
        assert_eq!(got, want, "{name}");
        let asked = api.seen();
        assert!(
            asked[0].uri.contains("fieldSelector=metadata.name%3Dsb"),
            "{name}: {}",
            asked[0].uri
        );
    }
}
