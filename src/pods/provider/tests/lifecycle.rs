//! The hibernate's credential and its refusals (src/pods/provider/lifecycle.rs).

use super::*;
use crate::claims::VmState;

fn hibernates(sim: &sandboxd_sim::SimHandle) -> Vec<sandboxd_sim::RequestRecord> {
    sim.sim()
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/hibernate"))
        .collect()
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
    let fault: sandboxd_sim::Fault = serde_json::from_value(json!({
        "endpoint": "hibernate", "kind": "status", "status": 404,
        "body": "404 page not found\n", "content_type": "text/plain; charset=utf-8",
    }))
    .expect("fault");
    sim.sim().arm_fault(fault).expect("arm");
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
