//! The hibernate's credential and its refusals (src/pods/provider/lifecycle.rs).

use super::*;
use crate::claims::VmState;
use crate::pods::provider::lifecycle::{Renewal, WakeError};

fn hibernates(sim: &sandboxd_sim::SimHandle) -> Vec<sandboxd_sim::RequestRecord> {
    sim.sim()
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/hibernate"))
        .collect()
}

/// sandboxd's router answers the next call on `endpoint` with its
/// plain-text 404: a build without that route.
fn no_route_once(sim: &sandboxd_sim::SimHandle, endpoint: &str) {
    let fault: sandboxd_sim::Fault = serde_json::from_value(json!({
        "endpoint": endpoint, "kind": "status", "status": 404, "times": 1,
        "body": "404 page not found\n", "content_type": "text/plain; charset=utf-8",
    }))
    .expect("fault");
    sim.sim().arm_fault(fault).expect("arm");
}

/// A claim recovered without its own token hibernates with the node token.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_without_its_token_hibernates_with_the_node_token() {
    let (sim, provider, _dir) = provider_with_token().await;
    let id = neighbour_claims(&sim, &claim_ref::for_pod("ns/p", "u1")).await;
    provider.list().await.expect("list");
    provider
        .create(&Arc::new(pod_with_claim("u1", &id, Some("10.0.0.5"))))
        .await
        .expect("recover");
    let (claim, _) = provider.claims.get("ns/p").expect("row");
    assert_eq!(claim.token, None);
    let got = provider
        .hibernate_claim("ns/p", &claim, None, "suspended")
        .await;
    assert!(matches!(got, Hibernation::Hibernated), "{got:?}");
    let calls = hibernates(&sim);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
}

/// Without its token and without a node token there is no credential:
/// nothing is sent.
#[tokio::test(flavor = "multi_thread")]
async fn without_any_token_there_is_no_credential() {
    let sim = sim_with_pool().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (provider, _claims) = open_mode_provider(&sim, &dir.path().join("claims.json")).await;
    let claim = Claim {
        id: "sb_x".into(),
        token: None,
        address: String::new(),
        pod_uid: "u1".into(),
        claimed_at: Timestamp::now(),
        deadline: None,
        lifecycle: Box::default(),
    };
    let got = provider
        .hibernate_claim("ns/p", &claim, None, "suspended")
        .await;
    assert!(matches!(got, Hibernation::NoCredential), "{got:?}");
    assert!(hibernates(&sim).is_empty());
}

/// A build without the hibernate route (its router's plain-text 404) is
/// refused for good: the VM stays Running, recorded as refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_build_without_hibernate_is_a_refusal_for_good() {
    let (sim, provider, _dir) = provider_with_token().await;
    provider.create(&Arc::new(pod("u1"))).await.expect("create");
    let (claim, _) = provider.claims.get("ns/p").expect("row");
    no_route_once(&sim, "hibernate");
    let got = provider
        .hibernate_claim("ns/p", &claim, None, "suspended")
        .await;
    assert!(matches!(got, Hibernation::Refused(_)), "{got:?}");
    let (after, _) = provider.claims.get("ns/p").expect("row kept");
    assert!(after.lifecycle.hibernate_refused);
    assert!(
        matches!(after.lifecycle.vm, VmState::Running),
        "{:?}",
        after.lifecycle.vm
    );
}

/// A sandbox sandboxd no longer has (its JSON 404) is gone: the record
/// goes with it, nothing is left pending.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_sandboxd_forgot_is_gone_and_its_record_removed() {
    let (sim, provider, _dir) = provider_with_token().await;
    provider.create(&Arc::new(pod("u1"))).await.expect("create");
    let (claim, _) = provider.claims.get("ns/p").expect("row");
    // Released behind vk-sandbox's back (root, by id).
    let gone = sim
        .sim()
        .release(Some(&format!("Bearer {TOKEN}")), &claim.id, None);
    assert!(gone.is_ok(), "release: {gone:?}");
    let got = provider
        .hibernate_claim("ns/p", &claim, None, "suspended")
        .await;
    assert!(matches!(got, Hibernation::Gone), "{got:?}");
    assert!(provider.claims.get("ns/p").is_none(), "the record stayed");
}

/// A `409` for a sandbox sandboxd has archived meanwhile: the row says
/// archived, so the VM is asleep already (recorded as archived, with the
/// deadline sandboxd gave it), not refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_conflict_for_an_archived_sandbox_records_it_archived() {
    let (sim, provider, _dir) = provider_with_token().await;
    provider.create(&Arc::new(pod("u1"))).await.expect("create");
    let (claim, _) = provider.claims.get("ns/p").expect("row");
    let got = provider
        .hibernate_claim("ns/p", &claim, None, "suspended")
        .await;
    assert!(matches!(got, Hibernation::Hibernated), "{got:?}");
    sim.sim().patch_config(sandboxd_sim::ConfigPatch {
        archive_after_seconds: Some(60),
        ..Default::default()
    });
    sim.sim()
        .clock()
        .advance(jiff::SignedDuration::from_secs(120));
    assert_eq!(
        sim.sim().sweep(),
        std::slice::from_ref(&claim.id),
        "archived"
    );
    let fault: sandboxd_sim::Fault = serde_json::from_value(json!({
        "endpoint": "hibernate", "kind": "status", "status": 409,
        "error": "sandbox is archived",
    }))
    .expect("fault");
    sim.sim().arm_fault(fault).expect("arm");
    let got = provider
        .hibernate_claim("ns/p", &claim, None, "suspended")
        .await;
    assert!(matches!(got, Hibernation::Hibernated), "{got:?}");
    let (after, _) = provider.claims.get("ns/p").expect("row kept");
    assert!(
        matches!(after.lifecycle.vm, VmState::Archived { .. }),
        "{:?}",
        after.lifecycle.vm
    );
    assert!(!after.lifecycle.hibernate_refused);
}

/// The fault `status` on `endpoint` once, with sandboxd's JSON error.
fn refuse_once(sim: &sandboxd_sim::SimHandle, endpoint: &str, status: u16) {
    let fault: sandboxd_sim::Fault = serde_json::from_value(json!({
        "endpoint": endpoint, "kind": "status", "status": status, "error": "refused by the test",
        "times": 1,
    }))
    .expect("fault");
    sim.sim().arm_fault(fault).expect("arm");
}

/// A `409` for a sandbox that is hibernated already (not archived): the
/// hibernate is done, not refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_conflict_for_a_hibernated_sandbox_is_done() {
    let (sim, provider, _dir) = provider_with_token().await;
    provider.create(&Arc::new(pod("u1"))).await.expect("create");
    let (claim, _) = provider.claims.get("ns/p").expect("row");
    let first = provider
        .hibernate_claim("ns/p", &claim, None, "suspended")
        .await;
    assert!(matches!(first, Hibernation::Hibernated), "{first:?}");
    refuse_once(&sim, "hibernate", 409);
    let got = provider
        .hibernate_claim("ns/p", &claim, None, "suspended")
        .await;
    assert!(matches!(got, Hibernation::Hibernated), "{got:?}");
    let (after, _) = provider.claims.get("ns/p").expect("row kept");
    assert!(!after.lifecycle.hibernate_refused);
    assert!(
        matches!(after.lifecycle.vm, VmState::Hibernated { .. }),
        "{:?}",
        after.lifecycle.vm
    );
}

/// A wake: a forgotten sandbox is gone; a build without the route wakes on
/// its first relay call instead (told apart from a failure); each says
/// what happened.
#[tokio::test(flavor = "multi_thread")]
async fn a_wake_tells_gone_and_unsupported_from_a_failure() {
    let (sim, provider, _dir) = provider_with_token().await;
    provider.create(&Arc::new(pod("u1"))).await.expect("create");
    let (claim, _) = provider.claims.get("ns/p").expect("row");
    assert!(provider.wake_claim(&claim).await.is_ok());

    no_route_once(&sim, "wake");
    let unsupported = provider.wake_claim(&claim).await;
    assert!(
        matches!(unsupported, Err(WakeError::NoCredential)),
        "{unsupported:?}"
    );

    refuse_once(&sim, "wake", 500);
    let failed = provider.wake_claim(&claim).await.expect_err("a 500");
    assert!(matches!(failed, WakeError::Failed(_)), "{failed:?}");
    assert!(
        failed.to_string().contains("refused by the test"),
        "{failed}"
    );

    let gone = sim
        .sim()
        .release(Some(&format!("Bearer {TOKEN}")), &claim.id, None);
    assert!(gone.is_ok(), "release: {gone:?}");
    let gone = provider.wake_claim(&claim).await.expect_err("gone");
    assert!(matches!(gone, WakeError::Gone), "{gone:?}");
    assert_eq!(gone.to_string(), "sandboxd no longer has this sandbox");
    assert!(
        WakeError::NoCredential
            .to_string()
            .contains("no node token is configured")
    );
}

/// A renewal records the length sandboxd granted; a `409` for a sandbox
/// that is not archived, or any other failure, is a failure (retried), not
/// "archived" or "gone".
#[tokio::test(flavor = "multi_thread")]
async fn a_renewal_records_its_grant_and_fails_plainly() {
    let (sim, provider, _dir) = provider_with_token().await;
    provider.create(&Arc::new(pod("u1"))).await.expect("create");
    let (claim, _) = provider.claims.get("ns/p").expect("row");
    let ttl = std::num::NonZeroU64::new(3600).expect("ttl");
    let renewed = provider.renew_claim("ns/p", &claim, ttl, true).await;
    assert!(matches!(renewed, Renewal::Renewed(Some(_))), "{renewed:?}");
    let (after, _) = provider.claims.get("ns/p").expect("row");
    let granted = after.lifecycle.granted_seconds.expect("granted recorded");
    assert!((3590..=3600).contains(&granted), "granted {granted}");

    refuse_once(&sim, "renew", 409);
    let conflict = provider.renew_claim("ns/p", &claim, ttl, true).await;
    assert!(matches!(conflict, Renewal::Failed(_)), "{conflict:?}");

    refuse_once(&sim, "renew", 500);
    let failed = provider.renew_claim("ns/p", &claim, ttl, true).await;
    assert!(matches!(failed, Renewal::Failed(_)), "{failed:?}");
}
