//! A suspended owner's Pod deleted, against a scripted apiserver and the
//! in-process simulator: the reconcile runs again for the same deleting Pod
//! (the MODIFIED event our own grace-0 delete causes is reconciled before
//! the DELETED one reaches the cache), and the upkeep takes its turn.
//! sandboxd is asked to hibernate a VM once per suspend, whatever the
//! outcome: a refused (409) hibernate is never asked again, a done one is
//! not repeated, and a failed one is retried by the upkeep alone.

use std::sync::Arc;

use sandboxd_sim::{Endpoint, Fault};
use serde_json::json;

use super::controller::reconcile;
use super::fixtures::*;
use crate::claims::VmState;

/// The Sandbox `sb` (UID `o1`) with `spec.operatingMode: Suspended`.
fn suspended() -> Answer {
    let (code, mut obj) = sandbox("o1", false);
    obj["spec"] = json!({"operatingMode": "Suspended"});
    (code, obj)
}

fn hibernates(w: &World, id: &str) -> usize {
    let path = format!("/v1/sandboxes/{id}/hibernate");
    w.sim
        .sim()
        .requests()
        .iter()
        .filter(|r| r.path == path)
        .count()
}

fn sim_hibernated(w: &World, id: &str) -> bool {
    w.sim
        .sim()
        .claims()
        .iter()
        .any(|c| c.id == id && c.hibernated)
}

/// The Events with `reason` the scripted apiserver was sent, once every
/// Event announced so far is posted (Normal ones go out in tasks of their
/// own).
async fn posted(w: &World, reason: &str) -> Vec<Seen> {
    w.ctx.announced().await;
    w.api
        .seen()
        .into_iter()
        .filter(|s| s.method == "POST" && s.path().ends_with("/events"))
        .filter(|s| s.body["reason"] == reason)
        .collect()
}

async fn events(w: &World, reason: &str) -> usize {
    posted(w, reason).await.len()
}

/// Claimed under a suspended owner, the Pod deleted, then reconciled once
/// more as our own grace-0 delete left it.
async fn suspended_and_deleted_twice(fault: Option<Fault>) -> (World, String) {
    let w = world(suspended()).await;
    let id = claimed(&w).await;
    if let Some(f) = fault {
        w.sim.sim().arm_fault(f).expect("arm");
    }
    within(reconcile(
        Arc::new(deleting(running_pod(&id), 30)),
        Arc::clone(&w.ctx),
    ))
    .await
    .expect("delete");
    within(reconcile(
        Arc::new(deleting(running_pod(&id), 0)),
        Arc::clone(&w.ctx),
    ))
    .await
    .expect("the delete reconciled again");
    (w, id)
}

fn recorded(w: &World) -> crate::claims::Claim {
    w.ctx
        .provider
        .settled_claims_of("ns/sb")
        .expect("the claim is kept")
}

/// issue 24: a refused hibernate was asked twice in a full e2e run.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_hibernate_is_asked_once_also_when_the_delete_is_reconciled_again() {
    let (w, id) =
        suspended_and_deleted_twice(Some(Fault::status(Endpoint::Hibernate, 409).times(1))).await;
    assert_eq!(hibernates(&w, &id), 1, "a refused hibernate asked again");
    let claim = recorded(&w);
    assert!(claim.lifecycle.hibernate_refused);
    assert_eq!(claim.lifecycle.vm, VmState::Running);
    assert!(!sim_hibernated(&w, &id), "the VM keeps running");
    let warned = posted(&w, "SandboxHibernateFailed").await;
    assert_eq!(warned.len(), 1, "one Warning says so");
    assert_eq!(warned[0].body["type"], "Warning");
    assert_eq!(warned[0].body["action"], "HibernateRefused");
    within(upkeep_turn(&w.ctx, &[])).await;
    assert_eq!(hibernates(&w, &id), 1, "the upkeep asked it again");
    assert!(release_requests(&w.sim).is_empty());
}

/// A hibernate done is not asked again, nor announced twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_hibernate_done_is_not_repeated_when_the_delete_is_reconciled_again() {
    let (w, id) = suspended_and_deleted_twice(None).await;
    assert_eq!(hibernates(&w, &id), 1, "hibernated twice");
    assert!(sim_hibernated(&w, &id));
    assert!(matches!(
        recorded(&w).lifecycle.vm,
        VmState::Hibernated { .. }
    ));
    assert_eq!(events(&w, "SandboxHibernated").await, 1, "announced twice");
    within(upkeep_turn(&w.ctx, &[])).await;
    assert_eq!(hibernates(&w, &id), 1, "the upkeep hibernated it again");
    assert!(release_requests(&w.sim).is_empty());
}

/// A failed hibernate (500) is pending: the repeated delete leaves it to
/// the upkeep, whose turn retries it.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_hibernate_is_left_pending_to_the_upkeep() {
    let (w, id) =
        suspended_and_deleted_twice(Some(Fault::status(Endpoint::Hibernate, 500).times(1))).await;
    assert_eq!(
        hibernates(&w, &id),
        1,
        "retried without the upkeep's back-off"
    );
    assert!(matches!(
        recorded(&w).lifecycle.vm,
        VmState::Hibernating { .. }
    ));
    within(upkeep_turn(&w.ctx, &[])).await;
    assert_eq!(hibernates(&w, &id), 2, "the upkeep retries it");
    assert!(sim_hibernated(&w, &id));
    // Announced about the Sandbox: its Pod is gone.
    let done = posted(&w, "SandboxHibernated").await;
    assert_eq!(done.len(), 1, "{done:#?}");
    assert!(
        done[0].uri.contains("fieldManager=vk-sandbox"),
        "{}",
        done[0].uri
    );
    assert_eq!(
        done[0].body["regarding"],
        json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "name": "sb",
               "namespace": "ns", "uid": "o1"})
    );
    assert!(matches!(
        recorded(&w).lifecycle.vm,
        VmState::Hibernated { .. }
    ));
    assert!(release_requests(&w.sim).is_empty());
}
