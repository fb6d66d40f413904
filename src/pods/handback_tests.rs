//! Handing back, through reconcile against the scripted apiserver and the
//! in-process simulator: which Pod is deleted, which marked `Failed`, which
//! keeps waiting, and what the apiserver is sent.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::context::Context;
use super::controller::reconcile;
use super::fixtures::*;
use super::pod::Pod;
use crate::Error;

const GRACE: Duration = Duration::from_secs(10);

/// `owned_pod`, bound `ago` (its `PodScheduled` condition), owned by
/// `owner` (apiVersion, kind) or by nobody.
fn bound_pod(ago: Duration, owner: Option<(&str, &str)>) -> Pod {
    let mut v = serde_json::to_value(owned_pod("p1", "o1")).expect("json");
    let at = jiff::Timestamp::now() - jiff::SignedDuration::try_from(ago).expect("duration");
    v["status"] = json!({"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": at.to_string()},
    ]});
    v["metadata"]["ownerReferences"] = match owner {
        Some((api_version, kind)) => json!([{"apiVersion": api_version, "kind": kind,
            "name": "sb", "uid": "o1", "controller": true}]),
        None => json!([]),
    };
    serde_json::from_value(v).expect("pod")
}

/// The fixture world with `--hand-back-after` at [`GRACE`].
fn handing_back(w: &World) -> Arc<Context> {
    Arc::new(
        Context::new(
            w.api.client.clone(),
            Arc::clone(&w.ctx.provider),
            "node-a",
            crate::metrics::Metrics::new().expect("metrics"),
        )
        .handing_back_after(Some(GRACE)),
    )
}

fn draining(w: &World) {
    w.sim.sim().patch_config(sandboxd_sim::config::ConfigPatch {
        draining: Some(true),
        ..Default::default()
    });
}

const SANDBOX: Option<(&str, &str)> = Some(("agents.x-k8s.io/v1beta1", "Sandbox"));

#[tokio::test(flavor = "multi_thread")]
async fn a_sandboxs_pod_past_the_grace_on_a_draining_node_is_deleted_and_nothing_claimed() {
    let w = world(sandbox("o1", false)).await;
    draining(&w);
    let ctx = handing_back(&w);
    let pod = Arc::new(bound_pod(Duration::from_secs(12), SANDBOX));
    let done = within(reconcile(pod, Arc::clone(&ctx)))
        .await
        .expect("reconcile");
    assert_eq!(done, kube::runtime::controller::Action::await_change());
    ctx.announced().await;
    let writes = w.api.writes();
    let delete = writes
        .iter()
        .find(|s| s.method == "DELETE")
        .unwrap_or_else(|| panic!("no DELETE: {writes:#?}"));
    assert_eq!(delete.path(), "/api/v1/namespaces/ns/pods/sb");
    // This very Pod, with its own grace period (its reconcile then sees a
    // Pod that never ran).
    assert_eq!(delete.body["preconditions"]["uid"], "p1", "{delete:?}");
    assert!(
        delete.body.get("gracePeriodSeconds").is_none(),
        "{delete:?}"
    );
    assert!(
        !writes.iter().any(|s| s.path().ends_with("/status")),
        "no status write: {writes:#?}"
    );
    let seen = w.api.seen();
    let event = seen
        .iter()
        .find(|s| s.path().ends_with("/events"))
        .unwrap_or_else(|| panic!("the Warning Event: {:#?}", w.api.seen()));
    assert_eq!(event.body["reason"], "HandedBack");
    assert_eq!(event.body["type"], "Warning");
    let note = event.body["note"].as_str().unwrap_or_default();
    assert!(note.contains("node node-a for 12s"), "{note}");
    assert!(note.contains("draining"), "{note}");
    assert!(w.sim.sim().claims().is_empty(), "a claim was left");
    assert!(!w.ctx.provider.holds("ns/sb"));
    assert_eq!(
        ctx.metrics
            .value("vk_sandbox_pods_handed_back_total", &[("how", "deleted")]),
        Some(1.0)
    );
}

/// The one status write the reconcile sent, after checking it deleted
/// nothing.
fn the_status_written(w: &World) -> serde_json::Value {
    let writes = w.api.writes();
    assert!(!writes.iter().any(|s| s.method == "DELETE"), "{writes:#?}");
    writes
        .iter()
        .find(|s| s.path().ends_with("/status"))
        .unwrap_or_else(|| panic!("no status write: {writes:#?}"))
        .body
        .clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn within_the_grace_the_pod_waits_pending_and_is_looked_at_before_the_grace_ends() {
    let w = world(sandbox("o1", false)).await;
    draining(&w);
    let ctx = handing_back(&w);
    let pod = Arc::new(bound_pod(Duration::from_secs(3), SANDBOX));
    let err = within(reconcile(pod, Arc::clone(&ctx)))
        .await
        .expect_err("still waiting");
    match &err {
        Error::PodCreate {
            reason,
            retry_within: Some(left),
            ..
        } => {
            assert_eq!(*reason, "NoWarmCapacity");
            assert!(
                *left <= Duration::from_secs(7) && *left > Duration::from_secs(5),
                "{left:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let status = the_status_written(&w);
    assert_eq!(status["status"]["reason"], "NoWarmCapacity");
    assert_eq!(status["status"]["phase"], "Pending");
}

#[tokio::test(flavor = "multi_thread")]
async fn another_controllers_pod_with_sandboxd_down_is_marked_failed_a_bare_pod_waits() {
    let w = world(sandbox("o1", false)).await;
    w.sim.sim().set_accepting(false);
    let ctx = handing_back(&w);
    let rs = Arc::new(bound_pod(
        Duration::from_secs(30),
        Some(("apps/v1", "ReplicaSet")),
    ));
    within(reconcile(rs, Arc::clone(&ctx)))
        .await
        .expect("handed back");
    let status = the_status_written(&w);
    assert_eq!(status["status"]["phase"], "Failed");
    assert_eq!(status["status"]["reason"], "HandedBack");
    assert_eq!(status["metadata"]["uid"], "p1");

    let w = world(sandbox("o1", false)).await;
    w.sim.sim().set_accepting(false);
    let ctx = handing_back(&w);
    let bare = Arc::new(bound_pod(Duration::from_secs(30), None));
    within(reconcile(bare, Arc::clone(&ctx)))
        .await
        .expect_err("waits");
    let status = the_status_written(&w);
    assert_eq!(status["status"]["phase"], "Pending");
}

/// A Pod that never restarts is not marked Failed for a capacity miss while
/// it may still be handed back (its Sandbox would end); past the grace it
/// is handed back as any other.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_that_never_restarts_waits_for_the_hand_back_instead_of_failing() {
    let never = |ago: u64| {
        let mut v =
            serde_json::to_value(bound_pod(Duration::from_secs(ago), SANDBOX)).expect("json");
        v["spec"]["restartPolicy"] = json!("Never");
        Arc::new(serde_json::from_value::<Pod>(v).expect("pod"))
    };
    let w = world(sandbox("o1", false)).await;
    draining(&w);
    let ctx = handing_back(&w);
    within(reconcile(never(2), Arc::clone(&ctx)))
        .await
        .expect_err("waits");
    assert_eq!(the_status_written(&w)["status"]["phase"], "Pending");

    // With handing back off, the first miss fails it, as before.
    let w = world(sandbox("o1", false)).await;
    draining(&w);
    within(reconcile(never(2), Arc::clone(&w.ctx)))
        .await
        .expect("failed for good");
    assert_eq!(the_status_written(&w)["status"]["phase"], "Failed");
}
