//! The record and sandboxd drifting apart (defect review 2026-12-b,
//! finding 1, finding 2's backstop, the "hibernate refusal remembered
//! forever" note): a relay wakes a VM behind the record, sandboxd's idle
//! tiers hibernate and archive it, a wake's reply is lost. The upkeep's
//! look at sandboxd's listing brings the record back, and the turn acts
//! on it.

use super::*;
use crate::claims::Claim;
use crate::pods::lifecycle::observe::Correction;
use crate::sandboxd::SandboxdClient;
use sandboxd_sim::ClaimRecord;

fn row(s: &Scene, id: &str) -> ClaimRecord {
    s.w.sim
        .sim()
        .claims()
        .into_iter()
        .find(|c| c.id == id)
        .expect("sandboxd has the sandbox")
}

fn record(s: &Scene) -> Claim {
    s.w.ctx
        .provider
        .settled_claims_of(KEY)
        .expect("the claim kept")
}

/// Opens (and closes) the guest agent relay with the claim's own token,
/// as `kubectl exec` does: sandboxd wakes a hibernated or archived VM.
async fn relay_opened(s: &Scene, id: &str) {
    let token = record(s)
        .token
        .as_deref()
        .cloned()
        .expect("the claim's token");
    let client = SandboxdClient::builder(s.w.sim.base_url())
        .build()
        .expect("client");
    drop(within(client.agent(id, &token)).await.expect("the relay"));
    let r = row(s, id);
    assert!(!r.hibernated && !r.archived, "the relay woke the VM: {r:?}");
}

fn patch(s: &Scene, id: &str, patch: ClaimPatch) {
    s.w.sim.sim().patch_claim(id, patch).expect("patch");
}

fn observed(s: &Scene, state: &str) -> f64 {
    let text = s.w.ctx.metrics.encode().expect("metrics");
    let series = format!("vk_sandbox_claim_observed_total{{state=\"{state}\"}}");
    support_metric(&text, &series)
}

/// The deadline sandboxd has for the sandbox.
async fn listed_deadline(s: &Scene, id: &str) -> Option<jiff::Timestamp> {
    let client = SandboxdClient::builder(s.w.sim.base_url())
        .token(Some(TOKEN.to_string()))
        .build()
        .expect("client");
    within(client.get(id))
        .await
        .expect("get")
        .deadline
        .expires_at()
}

/// Finding 1 (A): an archived VM woken by a relay runs on a fresh lease;
/// the record said `Archived` for good, so that lease was never renewed
/// and sandboxd reaped the VM under a living owner. The upkeep's look at
/// the listing records it running, and its due lease is renewed.
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_woken_from_the_archive_by_a_relay_is_renewed_again() {
    let mut s = scene(ALIVE).await;
    let id = claimed(&s.w).await;
    s.cache(&running_pod(&id));
    patch(
        &s,
        &id,
        ClaimPatch {
            hibernated: Some(true),
            archived: Some(true),
            ..Default::default()
        },
    );
    s.lease_due().await;
    s.turn().await;
    assert_eq!(s.sandboxd(&id, "renew"), 1);
    assert!(matches!(vm(&s), VmState::Archived { .. }), "{:?}", vm(&s));

    relay_opened(&s, &id).await;
    s.upkeep.observe_next_turn();
    s.turn().await;
    assert_eq!(vm(&s), VmState::Running);
    s.lease_due().await;
    s.turn().await;
    assert_eq!(
        s.sandboxd(&id, "renew"),
        2,
        "the woken VM's lease was not renewed"
    );
    assert_eq!(observed(&s, "running"), 1.0);
    assert!(release_requests(&s.w.sim).is_empty());
}

/// A VM woken from the archive runs on a fresh lease: the corrected
/// record takes sandboxd's deadline, not the archive's it held, so the
/// renewal comes before the fresh lease ends (found by reliability
/// scenario 11: a 30 s lease ended under a living owner).
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_woken_from_the_archive_takes_its_fresh_deadline() {
    let mut s = scene(ALIVE).await;
    let id = claimed(&s.w).await;
    s.cache(&running_pod(&id));
    patch(
        &s,
        &id,
        ClaimPatch {
            hibernated: Some(true),
            archived: Some(true),
            deadline_in_seconds: Some(7 * 86_400),
            ..Default::default()
        },
    );
    s.upkeep.observe_next_turn();
    s.turn().await;
    assert!(matches!(vm(&s), VmState::Archived { .. }), "{:?}", vm(&s));
    relay_opened(&s, &id).await;
    let fresh = listed_deadline(&s, &id).await;
    let seconds = |d: Option<jiff::Timestamp>| d.map(|d| d.as_second());
    assert!(
        seconds(fresh) < seconds(record(&s).deadline),
        "the wake gave a fresh lease shorter than the archive's"
    );
    s.upkeep.observe_next_turn();
    s.turn().await;
    assert_eq!(vm(&s), VmState::Running);
    assert_eq!(
        seconds(record(&s).deadline),
        seconds(fresh),
        "the record kept the archive's deadline"
    );
}

/// Finding 1 (B): a wake of an archived VM whose reply was lost left the
/// record `Archived`; suspended before the retry, the running VM was
/// kept as it was (never hibernated, never renewed). The wake is recorded
/// before it is sent, so the suspend hibernates it.
#[tokio::test(flavor = "multi_thread")]
async fn an_archived_vm_whose_wake_reply_was_lost_is_hibernated_again_on_suspend() {
    let (mut s, id) = archived_and_due().await;
    s.turn().await;
    assert!(matches!(vm(&s), VmState::Archived { .. }), "{:?}", vm(&s));
    s.owner_is(ALIVE);
    s.w.sim
        .sim()
        .arm_fault(Fault::drop_after(Endpoint::Wake).times(1))
        .expect("arm");
    let resumed = owned_pod("p2", "o1");
    let _ = within(reconcile(Arc::new(resumed.clone()), Arc::clone(&s.w.ctx))).await;
    assert_eq!(s.sandboxd(&id, "wake"), 1);
    let r = row(&s, &id);
    assert!(!r.hibernated && !r.archived, "sandboxd woke it: {r:?}");
    s.owner_is(SUSPENDED);
    within(reconcile(
        Arc::new(deleting(resumed, 30)),
        Arc::clone(&s.w.ctx),
    ))
    .await
    .expect("delete");
    s.turn().await;
    let r = row(&s, &id);
    assert!(
        r.hibernated || r.archived,
        "a suspended Sandbox's VM left running: {r:?}, recorded {:?}",
        vm(&s)
    );
    assert!(release_requests(&s.w.sim).is_empty());
}

/// Finding 2's backstop: a relay (a port-forward connection, an exec's
/// `kill` or resize) woke a suspended Sandbox's hibernated VM; the record
/// said `Hibernated`, so nothing hibernated it again. The next look at
/// the listing records it running, and the same turn hibernates it.
#[tokio::test(flavor = "multi_thread")]
async fn a_hibernated_vm_woken_behind_the_record_is_hibernated_again() {
    let mut s = scene(SUSPENDED).await;
    let id = claimed(&s.w).await;
    s.pod_deleted(&id).await;
    assert_eq!(s.sandboxd(&id, "hibernate"), 1);
    assert!(row(&s, &id).hibernated);
    s.turn().await;
    relay_opened(&s, &id).await;
    s.upkeep.observe_next_turn();
    s.turn().await;
    assert!(
        row(&s, &id).hibernated,
        "the VM runs under a suspended Sandbox; recorded {:?}",
        vm(&s)
    );
    assert_eq!(s.sandboxd(&id, "hibernate"), 2);
    assert!(matches!(vm(&s), VmState::Hibernated { .. }), "{:?}", vm(&s));
    assert_eq!(observed(&s, "running"), 1.0);
}

/// sandboxd's idle tiers hibernate, then archive, a running VM: the
/// record follows (the archive's deadline with it), so a suspend keeps it
/// as it is and the next Pod wakes it.
#[tokio::test(flavor = "multi_thread")]
async fn sandboxds_idle_tiers_are_recorded() {
    let mut s = scene(ALIVE).await;
    let id = claimed(&s.w).await;
    s.cache(&running_pod(&id));
    patch(
        &s,
        &id,
        ClaimPatch {
            hibernated: Some(true),
            ..Default::default()
        },
    );
    s.upkeep.observe_next_turn();
    s.turn().await;
    assert!(matches!(vm(&s), VmState::Hibernated { .. }), "{:?}", vm(&s));
    patch(
        &s,
        &id,
        ClaimPatch {
            archived: Some(true),
            deadline_in_seconds: Some(7 * 86_400),
            ..Default::default()
        },
    );
    s.upkeep.observe_next_turn();
    s.turn().await;
    assert!(matches!(vm(&s), VmState::Archived { .. }), "{:?}", vm(&s));
    let listed = listed_deadline(&s, &id).await;
    let seconds = |d: Option<jiff::Timestamp>| d.map(|d| d.as_second());
    assert_eq!(
        seconds(record(&s).deadline),
        seconds(listed),
        "the archive's deadline"
    );
    assert_eq!(observed(&s, "hibernated"), 1.0);
    assert_eq!(observed(&s, "archived"), 1.0);
    // Nothing more to correct: a third look changes nothing.
    s.upkeep.observe_next_turn();
    s.turn().await;
    assert_eq!(observed(&s, "archived"), 1.0);
}

/// A record made after the listing was read is newer than the listing:
/// the correction is made only if the row is still as it was read.
#[tokio::test(flavor = "multi_thread")]
async fn a_transition_recorded_after_the_listing_is_not_undone() {
    let s = scene(SUSPENDED).await;
    let _id = claimed(&s.w).await;
    let before_hibernate = record(&s);
    assert_eq!(before_hibernate.lifecycle.vm, VmState::Running);
    s.pod_deleted(&before_hibernate.id).await;
    assert!(matches!(vm(&s), VmState::Hibernated { .. }), "{:?}", vm(&s));
    let taken =
        s.w.ctx
            .provider
            .take_observed(KEY, &before_hibernate, Correction::Archived, None)
            .await;
    assert!(!taken);
    assert!(matches!(vm(&s), VmState::Hibernated { .. }), "{:?}", vm(&s));
    let now = record(&s);
    assert!(
        s.w.ctx
            .provider
            .take_observed(KEY, &now, Correction::Running, None)
            .await
    );
    assert_eq!(vm(&s), VmState::Running);
}

/// A hibernate answered 409 because the VM had failed was taken for "this
/// VM can never hibernate", for every later suspend. The row says which
/// 409 it is: a failed VM's hibernate stays pending, and is sent again
/// once sandboxd has it back.
#[tokio::test(flavor = "multi_thread")]
async fn a_hibernate_refused_for_a_failed_vm_is_asked_again() {
    let mut s = scene(SUSPENDED).await;
    let id = claimed(&s.w).await;
    patch(
        &s,
        &id,
        ClaimPatch {
            failed: Some("the VMM died".into()),
            ..Default::default()
        },
    );
    s.pod_deleted(&id).await;
    assert_eq!(s.sandboxd(&id, "hibernate"), 1);
    let l = record(&s).lifecycle;
    assert!(!l.hibernate_refused, "a failed VM refused for good");
    assert!(matches!(l.vm, VmState::Hibernating { .. }), "{:?}", l.vm);
    patch(
        &s,
        &id,
        ClaimPatch {
            failed: Some(String::new()),
            ..Default::default()
        },
    );
    s.turn().await;
    assert_eq!(s.sandboxd(&id, "hibernate"), 2);
    assert!(row(&s, &id).hibernated);
}

/// A 409 for a VM that can never hibernate (volumes attached) is still
/// remembered: it is preserved running and not asked again.
#[tokio::test(flavor = "multi_thread")]
async fn a_hibernate_refused_for_volumes_is_remembered() {
    let s = scene(SUSPENDED).await;
    let id = claimed(&s.w).await;
    patch(
        &s,
        &id,
        ClaimPatch {
            volumes: Some(vec!["data".into()]),
            ..Default::default()
        },
    );
    s.pod_deleted(&id).await;
    assert_eq!(s.sandboxd(&id, "hibernate"), 1);
    let l = record(&s).lifecycle;
    assert!(l.hibernate_refused);
    assert_eq!(l.vm, VmState::Running);
}

/// A suspended owner's running VM whose lease is due is renewed first and
/// hibernated in the same turn: with leases short enough to be due at
/// every look, renewing alone put the hibernate off for good (reliability
/// scenario 11 with 30 s leases: the VM ran through the suspension).
#[tokio::test(flavor = "multi_thread")]
async fn a_due_renewal_does_not_put_the_hibernate_off() {
    let mut s = scene(SUSPENDED).await;
    let id = claimed(&s.w).await;
    s.pod_deleted(&id).await;
    relay_opened(&s, &id).await;
    // The lease sandboxd lists ends in a minute: due at once.
    patch(
        &s,
        &id,
        ClaimPatch {
            deadline_in_seconds: Some(60),
            ..Default::default()
        },
    );
    s.upkeep.observe_next_turn();
    s.turn().await;
    assert_eq!(s.sandboxd(&id, "renew"), 1, "the due lease first");
    assert!(
        row(&s, &id).hibernated,
        "renewed but not hibernated: {:?}",
        vm(&s)
    );
    assert_eq!(s.sandboxd(&id, "hibernate"), 2);
}
