//! Strays never leak: an unknown claim outcome is kept per (key, Pod UID)
//! until that Pod is gone, a listing that does not show the row yet
//! settles nothing, a deleted Pod that ran returns the other rows made for
//! it, a claim made before any listing succeeded looks for strays first,
//! and a claim refused for capacity leaves nothing behind.

use std::time::Duration;

use sandboxd_sim::{Endpoint, Fault};

use super::*;

fn live(sim: &sandboxd_sim::SimHandle) -> Vec<sandboxd_sim::ClaimRecord> {
    sim.sim().claims()
}

fn live_for(sim: &sandboxd_sim::SimHandle, claim_ref: &str) -> Vec<String> {
    live(sim)
        .into_iter()
        .filter(|c| c.claim_ref == claim_ref)
        .map(|c| c.id)
        .collect()
}

/// Two Pods of one name, each with a lost claim reply: the first one's
/// stray is not forgotten when the second's outcome is noted, and both go
/// back once their Pods are gone.
#[tokio::test(flavor = "multi_thread")]
async fn unknown_outcomes_are_kept_per_pod_uid() {
    let (sim, provider, _dir) = provider_with_token().await;
    drop_next_claim_reply(&sim);
    let first = pod("u1");
    provider
        .create(&Arc::new(first.clone()))
        .await
        .expect_err("the reply was lost");
    // The first Pod goes while sandboxd cannot be listed: its strays stay.
    sim.sim()
        .arm_fault(Fault::status(Endpoint::List, 503).times(1))
        .expect("arm");
    provider
        .forget_never_ran(&first)
        .await
        .expect_err("no listing");
    drop_next_claim_reply(&sim);
    provider
        .create(&Arc::new(pod("u2")))
        .await
        .expect_err("the second reply was lost too");
    let mut unknown = provider.unknown_outcomes();
    unknown.sort();
    assert_eq!(
        unknown,
        vec![
            ("ns/p".to_string(), "u1".to_string()),
            ("ns/p".to_string(), "u2".to_string())
        ]
    );
    for (k, uid) in provider.unknown_outcomes() {
        provider
            .return_strays(&k, &uid, None)
            .await
            .expect("returned");
    }
    assert!(
        live_for(&sim, "ns/p#vk-sandbox:u1").is_empty(),
        "{:?}",
        live(&sim)
    );
    assert!(
        live_for(&sim, "ns/p#vk-sandbox:u2").is_empty(),
        "{:?}",
        live(&sim)
    );
}

/// The claim reply times out while sandboxd goes on and persists the
/// claim later. The retry's listing does not show it yet: the outcome
/// stays unknown, and when the Pod (which ran on its second claim) is
/// deleted, the late row goes back with the held one.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_persisted_after_its_reply_timed_out_is_returned_with_its_pod() {
    crate::crypto::install_provider();
    let sim = crate::pods::fixtures::sim_with_pool(Some(TOKEN), 4).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let claims = Arc::new(
        ClaimsStore::open(&dir.path().join("claims.json"))
            .await
            .expect("store"),
    );
    let sandboxd = SandboxdClient::builder(sim.base_url())
        .token(Some(TOKEN.into()))
        .timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let provider = Provider::new(silent_client(), sandboxd, claims);
    provider.list().await.expect("start-up listing");
    sim.sim()
        .arm_fault(Fault::claim_persists_late(1200).times(1))
        .expect("arm");
    let p = Arc::new(pod("u1"));
    let lost = provider.create(&p).await.expect_err("the reply timed out");
    assert!(lost.message.contains("outcome unknown"), "{lost:?}");
    let created = provider.create(&p).await.expect("claimed again");
    let Created::Claimed { id: held, .. } = created else {
        panic!("expected a claim, got {created:?}");
    };
    assert_eq!(
        provider.unknown_outcomes(),
        vec![("ns/p".to_string(), "u1".to_string())],
        "a listing that does not show the row yet settles nothing"
    );
    // sandboxd persists the first claim.
    let mut late = Vec::new();
    for _ in 0..50 {
        late = live_for(&sim, "ns/p#vk-sandbox:u1");
        if late.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(late.len(), 2, "{:?}", live(&sim));
    // The Pod is deleted (no owner: released).
    let mut gone = (*p).clone();
    gone.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::now(),
    ));
    let deleted = provider.delete(&gone).await.expect("delete");
    assert!(
        matches!(deleted, Deleted::Released { ref id, .. } if *id == held),
        "{deleted:?}"
    );
    assert!(
        live_for(&sim, "ns/p#vk-sandbox:u1").is_empty(),
        "the late row leaked: {:?}",
        live(&sim)
    );
}

/// vk-sandbox restarts after sandboxd persisted a claim whose reply it
/// never got, and the start-up listing fails: the first claim for that
/// Pod still looks for the stray before claiming (and does not claim
/// while it cannot look).
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_before_any_listing_succeeded_looks_for_strays_first() {
    let (sim, provider, _dir) = provider_with_token().await;
    let stray = neighbour_claims(&sim, "ns/p#vk-sandbox:u1").await;
    sim.sim()
        .arm_fault(Fault::status(Endpoint::List, 503).times(1))
        .expect("arm");
    let p = Arc::new(pod("u1"));
    let refused = provider
        .create(&p)
        .await
        .expect_err("cannot look for strays");
    assert_eq!(live(&sim).len(), 1, "claimed while blind: {:?}", live(&sim));
    assert!(!refused.message.is_empty());
    let created = provider.create(&p).await.expect("claimed");
    assert!(matches!(created, Created::Claimed { .. }), "{created:?}");
    assert_eq!(released(&sim), vec![stray.clone()]);
    assert_eq!(live_for(&sim, "ns/p#vk-sandbox:u1").len(), 1);
}

/// A claim refused for capacity (`429`) creates nothing: the Pod waits
/// with `NoWarmCapacity` (the claim's trouble, not vk-sandbox's), no
/// unknown outcome is noted, no row is kept, and the next try claims.
#[tokio::test(flavor = "multi_thread")]
async fn a_capacity_miss_waits_and_leaves_nothing_behind() {
    let (sim, provider, _dir) = provider_with_token().await;
    sim.sim()
        .arm_fault(Fault::status(Endpoint::Claim, 429).times(1))
        .expect("arm");
    let p = Arc::new(pod("u1"));
    let missed = provider.create(&p).await.expect_err("no capacity");
    assert_eq!(
        (missed.reason, missed.cause),
        ("NoWarmCapacity", crate::pods::failure::Cause::Claim),
        "{missed:?}"
    );
    assert!(
        missed
            .message
            .starts_with("claim sandbox for ns/p (template base:24.04): "),
        "{missed:?}"
    );
    assert!(provider.unknown_outcomes().is_empty());
    assert!(provider.claims.get("ns/p").is_none());
    assert!(live(&sim).is_empty(), "{:?}", live(&sim));
    let created = provider.create(&p).await.expect("claimed");
    assert!(matches!(created, Created::Claimed { .. }), "{created:?}");
    assert_eq!(live_for(&sim, "ns/p#vk-sandbox:u1").len(), 1);
}
