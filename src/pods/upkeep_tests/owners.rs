//! Owners the upkeep records and keeps: a claim made without one gets its
//! Pod's controller, a new owner generation never adopts the old one's VM,
//! a Pod of another controller waits while the recorded owner lives.

use super::*;

/// A claim with no owner recorded (made for a bare Pod, or before the
/// lifecycle state existed) whose Pod here now has a controller owner (a
/// controller adopted it): the owner is recorded at the claim's next turn,
/// so the claim can be looked after once the Pod is gone.
#[tokio::test(flavor = "multi_thread")]
async fn an_owner_is_recorded_for_a_claim_made_without_one() {
    let mut s = scene(ALIVE).await;
    let mut bare = owned_pod("p1", "o1");
    bare.metadata.owner_references = None;
    let created = within(s.w.ctx.provider.create(&Arc::new(bare)))
        .await
        .expect("claim");
    let crate::pods::provider::Created::Claimed { id, .. } = created else {
        panic!("expected a fresh claim, got {created:?}");
    };
    let owner = |s: &Scene| {
        s.w.ctx
            .provider
            .settled_claims_of(KEY)
            .and_then(|c| c.lifecycle.owner)
    };
    assert_eq!(owner(&s), None);
    s.lease_due().await;
    s.cache(&running_pod(&id));
    s.turn().await;
    let recorded = owner(&s).expect("the owner recorded");
    assert_eq!(
        (recorded.kind.as_str(), recorded.uid.as_str()),
        ("Sandbox", "o1")
    );
}

/// A suspended Sandbox deleted and re-created under the same name: the new
/// Sandbox's Pod does not get (nor wake) the old one's hibernated VM; the
/// old generation's VM is released and a fresh one claimed. (Defect review
/// 2026-12-b, finding 6: it was woken and adopted.)
#[tokio::test(flavor = "multi_thread")]
async fn a_new_owner_generation_does_not_adopt_the_old_ones_vm() {
    let s = scene(SUSPENDED).await;
    let id = claimed(&s.w).await;
    s.pod_deleted(&id).await;
    assert!(matches!(vm(&s), VmState::Hibernated { .. }), "{:?}", vm(&s));
    s.owner_is(REBORN);
    let outcome = within(s.w.ctx.provider.create(&Arc::new(owned_pod("p2", "o2"))))
        .await
        .expect("a fresh claim");
    assert_eq!(s.sandboxd(&id, "wake"), 0, "the old VM was woken");
    assert!(
        matches!(&outcome, crate::pods::provider::Created::Claimed { id: new, .. } if *new != id),
        "{outcome:?}"
    );
    assert_eq!(
        release_requests(&s.w.sim),
        [format!("/v1/sandboxes/{id}/release")],
        "the old generation's VM not released"
    );
    let row =
        s.w.ctx
            .provider
            .settled_claims_of(KEY)
            .expect("the new row");
    assert_ne!(row.id, id);
}

/// While the recorded owner generation still exists, a Pod of another
/// controller gets nothing: no wake, no release, the row kept; it waits.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_of_another_controller_waits_while_the_recorded_owner_lives() {
    let s = scene(SUSPENDED).await;
    let id = claimed(&s.w).await;
    s.pod_deleted(&id).await;
    let failed = within(s.w.ctx.provider.create(&Arc::new(owned_pod("p2", "o2"))))
        .await
        .expect_err("it waits");
    assert!(
        failed.message.contains("still exists"),
        "{}",
        failed.message
    );
    assert_eq!(s.sandboxd(&id, "wake"), 0);
    assert!(release_requests(&s.w.sim).is_empty());
    assert_eq!(
        s.w.ctx.provider.settled_claims_of(KEY).map(|c| c.id),
        Some(id)
    );
}
