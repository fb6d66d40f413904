//! The check before a claim, through reconcile against the scripted
//! apiserver and the in-process simulator: a Pod whose VM another node
//! holds is handed back while that node lives, claimed for (and said so)
//! once it is gone for good, and neither while it cannot be read.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::context::Context;
use super::controller::reconcile;
use super::elsewhere::VmHolders;
use super::fixtures::*;

/// The NodeInventories as a fixed answer.
struct Fixed(Option<Vec<String>>);

impl VmHolders for Fixed {
    fn nodes_holding(&self, key: &str) -> Option<Vec<String>> {
        assert_eq!(key, "ns/sb");
        self.0.clone()
    }
}

const GONE_AFTER: Duration = Duration::from_secs(300);

/// A Node `node-b` as the apiserver answers it: `reachable_since`: its
/// `SandboxdReachable` condition `False` since then.
fn node_b(unreachable_since: Option<&str>) -> Answer {
    let conditions = match unreachable_since {
        Some(t) => json!([{"type": "SandboxdReachable", "status": "False",
            "lastTransitionTime": t, "reason": "Unreachable"}]),
        None => json!([{"type": "SandboxdReachable", "status": "True",
            "lastTransitionTime": "2026-12-06T10:00:00Z", "reason": "Answers"}]),
    };
    (
        200,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-b"},
               "status": {"conditions": conditions}}),
    )
}

/// The fixture world (a Sandbox `sb` alive) whose apiserver answers
/// `node` for `GET /api/v1/nodes/node-b`, checking `held` before claims.
async fn world_held(held: Option<Vec<&str>>, node: Answer) -> (World, Arc<Context>) {
    let w = world_with(move |s| match (s.method.as_str(), s.path()) {
        ("GET", "/api/v1/nodes/node-b") => node.clone(),
        ("GET", "/apis/agents.x-k8s.io/v1beta1") => sandbox_discovery(),
        ("GET", "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/sb") => sandbox("o1", false),
        ("PATCH", "/api/v1/namespaces/ns/pods/sb/status") => (200, pod_json()),
        ("DELETE", "/api/v1/namespaces/ns/pods/sb") => (200, pod_json()),
        ("POST", p) if p.ends_with("/events") => (201, s.body.clone()),
        _ => (404, Value::Null),
    })
    .await;
    let held = held.map(|h| h.into_iter().map(String::from).collect());
    let ctx = Arc::new(
        Context::new(
            w.api.client.clone(),
            Arc::clone(&w.ctx.provider),
            "node-a",
            crate::metrics::Metrics::new().expect("metrics"),
        )
        .checking_holders(Arc::new(Fixed(held)), GONE_AFTER),
    );
    (w, ctx)
}

fn events(w: &World, reason: &str) -> Vec<String> {
    w.api
        .seen()
        .into_iter()
        .filter(|s| s.path().ends_with("/events") && s.body["reason"] == reason)
        .map(|s| s.body["note"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn deleted(w: &World) -> bool {
    w.api.writes().iter().any(|s| s.method == "DELETE")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_whose_vm_a_live_node_holds_is_handed_back_and_nothing_claimed() {
    let (w, ctx) = world_held(Some(vec!["node-a", "node-b"]), node_b(None)).await;
    let pod = Arc::new(owned_pod("p1", "o1"));
    within(reconcile(pod, Arc::clone(&ctx)))
        .await
        .expect("handed back");
    ctx.announced().await;
    assert!(deleted(&w), "{:#?}", w.api.writes());
    let notes = events(&w, "HandedBack");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("held on node node-b"), "{}", notes[0]);
    assert!(w.sim.sim().claims().is_empty(), "a second VM was claimed");
    assert!(w.sim.sim().requests().iter().all(|r| r.path != "/v1/claim"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_holder_unreachable_within_the_grace_still_gets_the_pod_back() {
    let recent = (jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60)).to_string();
    let (w, ctx) = world_held(Some(vec!["node-b"]), node_b(Some(&recent))).await;
    within(reconcile(Arc::new(owned_pod("p1", "o1")), Arc::clone(&ctx)))
        .await
        .expect("handed back");
    assert!(deleted(&w));
    assert!(w.sim.sim().claims().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_holder_gone_for_good_lets_this_node_claim_and_say_so() {
    let long_ago = (jiff::Timestamp::now() - jiff::SignedDuration::from_secs(600)).to_string();
    for (name, node) in [
        (
            "its Node deleted",
            status(404, "NotFound", json!({"name": "node-b", "kind": "nodes"})),
        ),
        (
            "its sandboxd unreachable past the grace",
            node_b(Some(&long_ago)),
        ),
    ] {
        let (w, ctx) = world_held(Some(vec!["node-b"]), node).await;
        within(reconcile(Arc::new(owned_pod("p1", "o1")), Arc::clone(&ctx)))
            .await
            .expect("claimed");
        ctx.announced().await;
        assert!(!deleted(&w), "{name}");
        assert_eq!(w.sim.sim().claims().len(), 1, "{name}: a fresh VM");
        let notes = events(&w, "SandboxMovedNode");
        assert_eq!(notes.len(), 1, "{name}: {notes:?}");
        assert!(
            notes[0].contains("was on node node-b"),
            "{name}: {}",
            notes[0]
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_holder_claims_nothing_and_hands_nothing_back() {
    let (w, ctx) = world_held(
        Some(vec!["node-b"]),
        status(503, "ServiceUnavailable", json!({})),
    )
    .await;
    let err = within(reconcile(Arc::new(owned_pod("p1", "o1")), Arc::clone(&ctx)))
        .await
        .expect_err("retried");
    assert!(err.to_string().contains("held on node node-b"), "{err}");
    assert!(!deleted(&w));
    assert!(w.sim.sim().claims().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_known_or_held_only_here_claims_as_before() {
    for (name, held) in [
        ("the index has not listed", None),
        ("held by no node", Some(vec![])),
        ("held only here", Some(vec!["node-a"])),
    ] {
        let (w, ctx) = world_held(held, node_b(None)).await;
        within(reconcile(Arc::new(owned_pod("p1", "o1")), Arc::clone(&ctx)))
            .await
            .expect("claimed");
        assert_eq!(w.sim.sim().claims().len(), 1, "{name}");
        assert!(!deleted(&w), "{name}");
        assert!(
            !w.api
                .seen()
                .iter()
                .any(|s| s.path() == "/api/v1/nodes/node-b"),
            "{name}: the holder was read"
        );
    }
}
