//! Reconcile against a scripted apiserver and the in-process simulator:
//! claim → status write, preserve or release by the owner's answer, a
//! conflicting status write, the grace-0 delete.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use serde_json::{Value, json};

use super::controller::reconcile;
use super::fixtures::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_is_written_once_onto_this_pod() {
    let w = world(sandbox("o1", false)).await;
    claimed(&w).await;
    // The echo of our write (already Running with this claim) writes nothing.
    let id = w
        .ctx
        .provider
        .tracked("ns/sb")
        .map(|p| p.metadata.uid.clone());
    assert_eq!(id, Some(Some("p1".to_string())));
}

/// The Claimed Event is posted after the Running status, by a task of its
/// own: the reconcile (and its slot among the controller's bounded
/// reconciles) does not wait for the apiserver's answer to it.
#[tokio::test(flavor = "multi_thread")]
async fn a_claims_reconcile_does_not_wait_for_its_event() {
    let w = world_slow(
        |s| match (s.method.as_str(), s.path()) {
            ("PATCH", "/api/v1/namespaces/ns/pods/sb/status") => (200, pod_json()),
            ("POST", p) if p.ends_with("/events") => (201, s.body.clone()),
            _ => (404, Value::Null),
        },
        |s| {
            if s.path().ends_with("/events") {
                Duration::from_secs(4)
            } else {
                Duration::ZERO
            }
        },
    )
    .await;
    let done = tokio::time::timeout(
        Duration::from_secs(2),
        reconcile(Arc::new(owned_pod("p1", "o1")), Arc::clone(&w.ctx)),
    )
    .await
    .expect("the reconcile ends before its Event is answered")
    .expect("reconcile");
    assert_eq!(done, Action::requeue(Duration::from_secs(300)));
    // `announced` waits for the answer, which comes 4 s after the POST.
    let waited = std::time::Instant::now();
    w.ctx.announced().await;
    assert!(
        waited.elapsed() >= Duration::from_secs(2),
        "announced returned before the Event was answered"
    );
    let seen = w.api.seen();
    let order: Vec<_> = seen
        .iter()
        .filter(|s| s.method != "GET")
        .map(|s| (s.method.as_str(), s.body["reason"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(order, [("PATCH", ""), ("POST", "Claimed")], "{seen:#?}");
    let posted = seen.iter().find(|s| s.method == "POST").expect("the Event");
    assert!(
        posted.uri.contains("fieldManager=vk-sandbox"),
        "{}",
        posted.uri
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_republish_onto_a_newer_version_conflicts_and_is_not_forced() {
    let conflict = status(409, "Conflict", json!({"name": "sb", "kind": "pods"}));
    let w = world_with(move |s| match (s.method.as_str(), s.path()) {
        ("PATCH", "/api/v1/namespaces/ns/pods/sb/status")
            if s.body["metadata"].get("resourceVersion").is_some() =>
        {
            conflict.clone()
        }
        ("PATCH", "/api/v1/namespaces/ns/pods/sb/status") => (200, pod_json()),
        ("POST", p) if p.ends_with("/events") => (201, s.body.clone()),
        _ => (404, Value::Null),
    })
    .await;
    let id = claimed(&w).await;
    // The cache shows the Pod drifted (not Ready): re-publish from it.
    let mut drifted = running_pod(&id);
    drifted.metadata.resource_version = Some("7".into());
    let action = within(reconcile(Arc::new(drifted), Arc::clone(&w.ctx)))
        .await
        .expect("a conflict is not an error");
    assert_eq!(action, Action::requeue(std::time::Duration::from_secs(2)));
    let writes = w.api.writes();
    assert_eq!(writes.len(), 2, "{writes:#?}");
    assert_eq!(writes[1].body["metadata"]["resourceVersion"], "7");
    assert_eq!(writes[1].body["metadata"]["uid"], "p1");
}

/// Our Running write is stored at a later version than the cache shows;
/// a reconcile that runs before the watch brings it (another update of the
/// Pod queued one) decides from the stored copy and writes nothing again.
/// A version newer than our write is decided from as usual.
#[tokio::test(flavor = "multi_thread")]
async fn a_reconcile_before_the_echo_does_not_write_the_same_status_again() {
    let w = world_with(|s| match (s.method.as_str(), s.path()) {
        ("PATCH", "/api/v1/namespaces/ns/pods/sb/status") => {
            // The Pod as the apiserver stores it after the patch.
            let mut stored = pod_json();
            json_patch::merge(&mut stored, &s.body);
            stored["metadata"]["resourceVersion"] = json!("8");
            (200, stored)
        }
        ("POST", p) if p.ends_with("/events") => (201, s.body.clone()),
        _ => (404, Value::Null),
    })
    .await;
    let id = claimed(&w).await;
    // The cache still has version 7 (no status).
    let stale = owned_pod("p1", "o1");
    assert_eq!(stale.metadata.resource_version.as_deref(), Some("7"));
    let action = within(reconcile(Arc::new(stale), Arc::clone(&w.ctx)))
        .await
        .expect("reconcile");
    assert_eq!(action, Action::requeue(std::time::Duration::from_secs(300)));
    assert_eq!(w.api.writes().len(), 1, "{:#?}", w.api.writes());
    // Version 9, after ours, says the Pod is not Ready: that is drift.
    let mut later = running_pod(&id);
    later.metadata.resource_version = Some("9".into());
    if let Some(st) = later.status.as_mut() {
        st.phase = Some("Pending".into());
    }
    within(reconcile(Arc::new(later), Arc::clone(&w.ctx)))
        .await
        .expect("reconcile");
    let writes = w.api.writes();
    assert_eq!(writes.len(), 2, "{writes:#?}");
    assert_eq!(writes[1].body["metadata"]["resourceVersion"], "9");
    assert_eq!(writes[1].body["status"]["phase"], "Running");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_refused_for_another_pod_is_dropped() {
    let replaced = status(
        422,
        "Invalid",
        json!({"name": "sb", "kind": "Pod", "causes": [
            {"reason": "FieldValueInvalid", "message": "field is immutable", "field": "metadata.uid"}]}),
    );
    let w = world_with(move |s| match (s.method.as_str(), s.path()) {
        ("PATCH", "/api/v1/namespaces/ns/pods/sb/status") => replaced.clone(),
        ("POST", p) if p.ends_with("/events") => (201, s.body.clone()),
        _ => (404, Value::Null),
    })
    .await;
    let action = within(reconcile(
        Arc::new(owned_pod("p1", "o1")),
        Arc::clone(&w.ctx),
    ))
    .await
    .expect("a replaced Pod is not an error");
    assert_eq!(action, Action::await_change());
    w.ctx.announced().await;
    let events = w
        .api
        .seen()
        .iter()
        .filter(|s| s.path().ends_with("/events"))
        .count();
    assert_eq!(events, 0, "no Claimed Event for a Pod that is gone");
    // The claim stays with the key for the successor to adopt.
    assert!(w.ctx.provider.holds("ns/sb"));
}

/// Pod deletion with the owner alive: the sandbox is kept for the next Pod,
/// then the object is deleted with grace 0 and a UID precondition.
#[tokio::test(flavor = "multi_thread")]
async fn deletion_with_the_owner_alive_preserves() {
    let w = world(sandbox("o1", false)).await;
    let id = claimed(&w).await;
    within(reconcile(
        Arc::new(deleting(running_pod(&id), 30)),
        Arc::clone(&w.ctx),
    ))
    .await
    .expect("delete");
    assert!(
        release_requests(&w.sim).is_empty(),
        "released while the owner lives"
    );
    assert!(
        w.ctx.provider.holds("ns/sb"),
        "the claim is kept for adoption"
    );
    let del = w
        .api
        .writes()
        .into_iter()
        .find(|s| s.method == "DELETE")
        .expect("the Pod object is deleted");
    assert_eq!(del.body["gracePeriodSeconds"], 0);
    assert_eq!(del.body["preconditions"]["uid"], "p1");
}

/// A deletion's `SandboxReleased` Event is posted by a task of its own:
/// the reconcile deletes the Pod and ends without waiting for the
/// apiserver's answer to the Event.
#[tokio::test(flavor = "multi_thread")]
async fn a_deletes_reconcile_does_not_wait_for_its_event() {
    let gone = status(404, "NotFound", json!({"name": "sb", "kind": "sandboxes"}));
    let w = world_slow(
        move |s| match (s.method.as_str(), s.path()) {
            ("GET", "/apis/agents.x-k8s.io/v1beta1") => sandbox_discovery(),
            ("GET", "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/sb") => gone.clone(),
            ("PATCH", "/api/v1/namespaces/ns/pods/sb/status") => (200, pod_json()),
            ("DELETE", "/api/v1/namespaces/ns/pods/sb") => (200, pod_json()),
            ("POST", p) if p.ends_with("/events") => (201, s.body.clone()),
            _ => (404, Value::Null),
        },
        |s| {
            if s.body["reason"] == "SandboxReleased" {
                Duration::from_secs(4)
            } else {
                Duration::ZERO
            }
        },
    )
    .await;
    let id = claimed(&w).await;
    let done = tokio::time::timeout(
        Duration::from_secs(2),
        reconcile(Arc::new(deleting(running_pod(&id), 30)), Arc::clone(&w.ctx)),
    )
    .await
    .expect("the reconcile ends before its Event is answered")
    .expect("delete");
    assert_eq!(done, Action::await_change());
    assert!(!w.ctx.provider.holds("ns/sb"), "released");
    let waited = std::time::Instant::now();
    w.ctx.announced().await;
    assert!(
        waited.elapsed() >= Duration::from_secs(1),
        "announced returned before the Event was answered"
    );
    let seen = w.api.seen();
    let released: Vec<_> = seen
        .iter()
        .filter(|s| s.method == "POST" && s.body["reason"] == "SandboxReleased")
        .collect();
    assert_eq!(released.len(), 1, "{seen:#?}");
    assert_eq!(released[0].body["regarding"]["name"], "sb");
    assert!(seen.iter().any(|s| s.method == "DELETE"), "{seen:#?}");
}

/// Pod deletion with the owner gone (404 naming it): released with the
/// claim's own token.
#[tokio::test(flavor = "multi_thread")]
async fn deletion_with_the_owner_gone_releases() {
    let w = world(status(
        404,
        "NotFound",
        json!({"name": "sb", "kind": "sandboxes"}),
    ))
    .await;
    let id = claimed(&w).await;
    let token = w
        .sim
        .sim()
        .claims()
        .into_iter()
        .find(|c| c.id == id)
        .expect("live")
        .token;
    within(reconcile(
        Arc::new(deleting(running_pod(&id), 30)),
        Arc::clone(&w.ctx),
    ))
    .await
    .expect("delete");
    let releases: Vec<_> = w
        .sim
        .sim()
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/release"))
        .collect();
    assert_eq!(releases.len(), 1);
    assert_eq!(releases[0].path, format!("/v1/sandboxes/{id}/release"));
    assert_eq!(
        releases[0].authorization.as_deref(),
        Some(format!("Bearer {token}").as_str())
    );
    assert!(!w.ctx.provider.holds("ns/sb"));
    assert!(w.api.writes().iter().any(|s| s.method == "DELETE"));
}

/// A Pod the apiserver is removing (grace 0 set just now) gets no second
/// delete, only a look again later; one that never ran is deleted at once
/// without asking the owner.
#[tokio::test(flavor = "multi_thread")]
async fn grace_zero_is_left_to_the_apiserver() {
    let w = world(sandbox("o1", false)).await;
    let action = within(reconcile(
        Arc::new(deleting(owned_pod("p1", "o1"), 0)),
        Arc::clone(&w.ctx),
    ))
    .await
    .expect("delete");
    assert!(w.api.writes().is_empty(), "{:#?}", w.api.writes());
    assert_eq!(
        action,
        Action::requeue(crate::pods::pod::REMOVAL_WAIT + Duration::from_secs(1)),
        "a pending removal is looked at again"
    );
    within(reconcile(
        Arc::new(deleting(owned_pod("p1", "o1"), 30)),
        Arc::clone(&w.ctx),
    ))
    .await
    .expect("delete");
    let writes = w.api.writes();
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(writes[0].method, "DELETE");
    assert!(
        !w.api
            .seen()
            .iter()
            .any(|s| s.path().contains("/sandboxes/")),
        "a Pod that never ran does not need its owner asked"
    );
    assert!(w.sim.sim().requests().is_empty(), "sandboxd was called");
}

/// A grace-0 deletion still there long after it was set was cut half-way
/// (the apiserver records grace 0, then removes the object in a second
/// step; a timeout or our kill -9 between the two leaves it Terminating
/// for good): it is deleted again, as a kubelet does.
#[tokio::test(flavor = "multi_thread")]
async fn a_grace_zero_removal_cut_half_way_is_sent_again() {
    let w = world(sandbox("o1", false)).await;
    let stale = deleting_since(owned_pod("p1", "o1"), 0, Duration::from_secs(60));
    let action = within(reconcile(Arc::new(stale), Arc::clone(&w.ctx)))
        .await
        .expect("delete");
    let writes = w.api.writes();
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(writes[0].method, "DELETE");
    assert_eq!(writes[0].body["gracePeriodSeconds"], 0);
    assert_eq!(writes[0].body["preconditions"]["uid"], "p1");
    assert_eq!(action, Action::await_change());
}

/// A claim preserved on its Pod's deletion (the owner answered alive);
/// storing `true` into the flag makes the owner answer 404 from then on.
async fn preserved_world() -> (World, Arc<std::sync::atomic::AtomicBool>, String) {
    let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let owner_gone = Arc::clone(&gone);
    let w = world_with(move |s| match (s.method.as_str(), s.path()) {
        ("GET", "/apis/agents.x-k8s.io/v1beta1") => sandbox_discovery(),
        ("GET", "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/sb") => {
            if owner_gone.load(std::sync::atomic::Ordering::SeqCst) {
                status(404, "NotFound", json!({"name": "sb", "kind": "sandboxes"}))
            } else {
                sandbox("o1", false)
            }
        }
        ("PATCH", "/api/v1/namespaces/ns/pods/sb/status") => (200, pod_json()),
        ("DELETE", "/api/v1/namespaces/ns/pods/sb") => (200, pod_json()),
        ("POST", p) if p.ends_with("/events") => (201, s.body.clone()),
        _ => (404, Value::Null),
    })
    .await;
    let id = claimed(&w).await;
    within(reconcile(
        Arc::new(deleting(running_pod(&id), 30)),
        Arc::clone(&w.ctx),
    ))
    .await
    .expect("delete");
    (w, gone, id)
}

/// A Pod deleted with its owner alive keeps the VM; when the owner goes
/// away while no Pod of that key is on this node (the replacement never
/// reached it), the preserved claim is released on a later check, and not
/// before.
#[tokio::test(flavor = "multi_thread")]
async fn a_preserved_claim_is_released_once_its_owner_goes_with_no_pod_here() {
    let (w, gone, id) = preserved_world().await;
    assert!(
        release_requests(&w.sim).is_empty(),
        "the owner lives: preserved"
    );
    assert!(w.ctx.provider.holds("ns/sb"));

    within(upkeep_turn(&w.ctx, &[])).await;
    assert!(release_requests(&w.sim).is_empty(), "the owner still lives");
    assert!(w.ctx.provider.holds("ns/sb"));

    gone.store(true, std::sync::atomic::Ordering::SeqCst);
    within(upkeep_turn(&w.ctx, &[])).await;
    assert_eq!(
        release_requests(&w.sim),
        vec![format!("/v1/sandboxes/{id}/release")]
    );
    assert!(!w.ctx.provider.holds("ns/sb"));
    within(upkeep_turn(&w.ctx, &[])).await;
    assert_eq!(release_requests(&w.sim).len(), 1, "released once");
}

/// A replacement Pod that arrives here takes the preserved claim back:
/// its owner is not asked again on its behalf, whatever the old one says.
#[tokio::test(flavor = "multi_thread")]
async fn a_replacement_pod_here_takes_a_preserved_claim_back() {
    let (w, gone, _) = preserved_world().await;
    let replacement = owned_pod("p2", "o1");
    let created = within(w.ctx.provider.create(&Arc::new(replacement.clone())))
        .await
        .expect("adopt");
    assert!(matches!(created, super::provider::Created::Adopted { .. }));
    gone.store(true, std::sync::atomic::Ordering::SeqCst);
    within(upkeep_turn(&w.ctx, &[replacement])).await;
    assert!(
        release_requests(&w.sim).is_empty(),
        "the replacement holds it"
    );
    assert!(w.ctx.provider.holds("ns/sb"));
}
