//! The provider's upkeep: the compensating release of an unrecorded claim,
//! releasing a recovered claim by id, the lease-expiry candidates and the
//! listed deadline, and the questions the side loops ask (`holds_id`,
//! `has_quarantined`, `running_on`), and the recheck of preserved claims.

use super::*;

fn deleting(mut p: Pod) -> Pod {
    p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-01-01T00:00:00Z".parse().expect("ts"),
    ));
    p
}

fn list_calls(sim: &sandboxd_sim::SimHandle) -> usize {
    sim.sim()
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/sandboxes")
        .count()
}

/// A claim whose commit fails is given back to sandboxd at once: no VM is
/// held under a credential nothing recorded.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_whose_commit_fails_is_returned() {
    let (sim, provider, dir) = provider_with_token().await;
    // Make the next commit fail: the state directory's place is a file.
    let state = dir.path();
    let parked = state.with_extension("parked");
    std::fs::rename(state, &parked).expect("park");
    std::fs::write(state, "").expect("block");
    let failed = provider
        .create(&Arc::new(pod("u1")))
        .await
        .expect_err("not persisted");
    std::fs::remove_file(state).expect("unblock");
    std::fs::rename(&parked, state).expect("restore");
    assert!(failed.message.contains("persist claim"), "{failed:?}");
    let claims = sim
        .sim()
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/claim")
        .count();
    assert_eq!(claims, 1, "one claim was made");
    assert_eq!(released(&sim).len(), 1, "and returned");
    assert!(sim.sim().claims().is_empty(), "no VM is left claimed");
    assert!(provider.claims.get("ns/p").is_none());
}

/// A claim recovered without its credential (empty token) is released by
/// id with the node token when its bare Pod goes.
#[tokio::test(flavor = "multi_thread")]
async fn a_recovered_claim_is_released_by_id_with_the_node_token() {
    let (sim, provider, _dir) = provider_with_token().await;
    let id = neighbour_claims(&sim, &claim_ref::for_pod("ns/p", "u1")).await;
    provider.list().await.expect("list");
    let running = pod_with_claim("u1", &id, Some("10.0.0.5"));
    let created = provider
        .create(&Arc::new(running.clone()))
        .await
        .expect("recover");
    assert!(
        matches!(&created, Created::Adopted { id: got, .. } if *got == id),
        "{created:?}"
    );
    assert_eq!(
        provider.claims.get("ns/p").map(|(c, _)| c.token),
        Some(None),
        "recovered without its credential"
    );
    let deleted = provider.delete(&deleting(running)).await.expect("delete");
    assert!(
        matches!(&deleted, Deleted::Released { id: got, .. } if *got == id),
        "{deleted:?}"
    );
    assert_eq!(released(&sim), [id]);
    assert!(sim.sim().claims().is_empty());
}

/// Lease expiry asks sandboxd only when a settled claim of a tracked Pod
/// is past its deadline, and then hands back those claims with the
/// listing to confirm them against.
#[tokio::test(flavor = "multi_thread")]
async fn expiry_candidates_are_tracked_claims_past_their_deadline() {
    let (sim, provider, _dir) = provider_with_token().await;
    let Created::Claimed { id, .. } = provider.create(&Arc::new(pod("u1"))).await.expect("claim")
    else {
        panic!("expected a fresh claim");
    };
    let (claim, _) = provider.claims.get("ns/p").expect("stored");
    let deadline = claim.deadline.expect("the simulator sets a deadline");
    let before = list_calls(&sim);
    let early = deadline
        .checked_sub(jiff::SignedDuration::from_secs(60))
        .expect("ts");
    assert!(provider.expiry_check(early).await.expect("check").is_none());
    assert_eq!(list_calls(&sim), before, "nothing due: sandboxd not asked");

    let late = deadline
        .checked_add(jiff::SignedDuration::from_secs(60))
        .expect("ts");
    let (candidates, listing) = provider
        .expiry_check(late)
        .await
        .expect("check")
        .expect("one candidate");
    assert_eq!(list_calls(&sim), before + 1);
    assert_eq!(
        candidates
            .iter()
            .map(|(k, c)| (k.as_str(), c.id.as_str()))
            .collect::<Vec<_>>(),
        [("ns/p", id.as_str())]
    );
    assert!(listing.iter().any(|r| r.id == id), "{listing:?}");

    // Untracked, the claim is nobody's to expire here.
    provider.untrack("ns/p", "u1");
    assert!(provider.expiry_check(late).await.expect("check").is_none());
}

/// A candidate still listed takes the listing's deadline.
#[tokio::test(flavor = "multi_thread")]
async fn a_listed_deadline_replaces_the_stored_one() {
    let (_sim, provider, _dir) = provider_with_token().await;
    let Created::Claimed { id, .. } = provider.create(&Arc::new(pod("u1"))).await.expect("claim")
    else {
        panic!("expected a fresh claim");
    };
    let listed = provider
        .list()
        .await
        .expect("list")
        .into_iter()
        .find(|r| r.id == id)
        .expect("listed");
    // The store keeps whole seconds.
    let want = listed
        .deadline
        .expires_at()
        .and_then(crate::claims::format::to_file_deadline);
    assert!(want.is_some());
    provider
        .claims
        .set_deadline("ns/p", &id, None)
        .await
        .expect("clear");
    let (claim, _) = provider.claims.get("ns/p").expect("stored");
    assert_eq!(claim.deadline, None);
    provider.take_listed_deadline("ns/p", &claim, &listed).await;
    assert_eq!(
        provider.claims.get("ns/p").and_then(|(c, _)| c.deadline),
        want
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn holds_id_is_this_key_holding_this_claim() {
    let (_sim, provider, _dir) = provider_with_token().await;
    let Created::Claimed { id, .. } = provider.create(&Arc::new(pod("u1"))).await.expect("claim")
    else {
        panic!("expected a fresh claim");
    };
    assert!(provider.holds_id("ns/p", &id));
    assert!(!provider.holds_id("ns/p", "sb_other"));
    assert!(!provider.holds_id("ns/q", &id));
}

/// Rows loaded from the previous run wait for a listing to vouch for them;
/// `has_quarantined` says so until one has.
#[tokio::test(flavor = "multi_thread")]
async fn quarantined_rows_wait_for_a_listing() {
    let sim = sim_with_pool().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let (first, claims) = open_mode_provider(&sim, &path).await;
    assert!(!first.has_quarantined(), "a new store holds nothing");
    first.create(&Arc::new(pod("u1"))).await.expect("claim");
    assert!(
        !first.has_quarantined(),
        "this run's claim is not quarantined"
    );
    claims.compact().await.expect("compact");
    drop((first, claims));

    let (restarted, _claims) = open_mode_provider(&sim, &path).await;
    assert!(restarted.has_quarantined());
    restarted.refresh().await.expect("verify");
    assert!(!restarted.has_quarantined());
}

/// The sandbox a Pod runs on (what the vanished sweep keeps when it
/// returns that Pod's strays) is its key's settled claim made for that
/// Pod: not one made for another Pod under the key, not a row loaded from
/// the previous run before a listing vouched for it.
#[tokio::test(flavor = "multi_thread")]
async fn running_on_is_a_settled_claim_made_for_that_pod() {
    let sim = sim_with_pool().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let (first, claims) = open_mode_provider(&sim, &path).await;
    let created = first.create(&Arc::new(pod("u1"))).await.expect("claim");
    let Created::Claimed { id, .. } = created else {
        panic!("expected a fresh claim, got {created:?}");
    };
    assert_eq!(first.running_on("ns/p", "u1"), Some(id.clone()));
    assert_eq!(first.running_on("ns/p", "u2"), None, "made for another Pod");
    assert_eq!(first.running_on("ns/q", "u1"), None, "another key");
    claims.compact().await.expect("compact");
    drop((first, claims));

    let (restarted, _claims) = open_mode_provider(&sim, &path).await;
    assert_eq!(
        restarted.running_on("ns/p", "u1"),
        None,
        "a quarantined row is not run on"
    );
    restarted.refresh().await.expect("verify");
    assert_eq!(restarted.running_on("ns/p", "u1"), Some(id));
}

/// A preserved claim that left the store another way (released, expired)
/// is forgotten at the next check, without asking its owner again.
#[tokio::test(flavor = "multi_thread")]
async fn a_preserved_claim_no_longer_held_is_forgotten_unasked() {
    let sim = crate::pods::fixtures::sim_with_pool(Some(crate::pods::fixtures::TOKEN), 2).await;
    let living = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (provider, _dir, id, api) = preserved_without_owner(&sim, living).await;
    let asked = || owner_asked(&api);
    assert_eq!(asked(), 1);

    provider.claims.remove("ns/sb", &id).await.expect("remove");
    crate::pods::fixtures::within(provider.recheck_preserved(
        &crate::periodic::Beat::none(),
        crate::pods::fixtures::any_time(),
    ))
    .await;
    assert_eq!(asked(), 1, "the owner was asked for a claim no longer held");
    assert!(lock(&provider.preserved).is_empty());
}

/// A preserved claim with no owner recorded (the write failed), whose Pod
/// went while its owner lived; `gone` switches the owner's answer to 404.
/// Returns the provider, its store's guard, the claim id and the scripted
/// apiserver (to count the owner lookups).
async fn preserved_without_owner(
    sim: &sandboxd_sim::SimHandle,
    gone: Arc<std::sync::atomic::AtomicBool>,
) -> (
    Provider,
    tempfile::TempDir,
    String,
    crate::pods::fixtures::ApiServer,
) {
    use crate::pods::fixtures::{
        ApiServer, TOKEN, owned_pod, provider_over, sandbox, sandbox_discovery, status,
    };
    use std::sync::atomic::Ordering;
    crate::crypto::install_provider();
    let api = ApiServer::new(move |s| match (s.method.as_str(), s.path()) {
        ("GET", "/apis/agents.x-k8s.io/v1beta1") => sandbox_discovery(),
        ("GET", "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/sb")
            if !gone.load(Ordering::SeqCst) =>
        {
            sandbox("o1", false)
        }
        _ => status(404, "NotFound", json!({"name": "sb", "kind": "sandboxes"})),
    });
    let (provider, dir) = provider_over(sim, Some(TOKEN), api.client.clone()).await;
    let p = Arc::new(owned_pod("p1", "o1"));
    let Created::Claimed { id, .. } = provider.create(&p).await.expect("claim") else {
        panic!("expected a fresh claim");
    };
    let deleted = crate::pods::fixtures::within(provider.delete(&deleting((*p).clone())))
        .await
        .expect("delete");
    assert!(matches!(deleted, Deleted::Preserved { .. }), "{deleted:?}");
    assert_eq!(lock(&provider.preserved).len(), 1);
    // As if recording the owner had failed (a store write error): the
    // claim is the recheck's.
    provider
        .claims
        .update_lifecycle("ns/sb", &id, |l, _| l.owner = None)
        .await
        .expect("forget the owner");
    let held = provider.claims.get("ns/sb").map(|(c, _)| c.id);
    assert_eq!(held.as_deref(), Some(id.as_str()));
    (provider, dir, id, api)
}

/// A Pod deleted while its owner lives preserves the claim and records
/// the owner on it (a row without one, e.g. recovered, gets it then).
#[tokio::test]
async fn a_preserve_records_the_owner_the_row_lacked() {
    use crate::pods::fixtures::{owned_pod, within, world};
    let w = world(crate::pods::fixtures::sandbox("o1", false)).await;
    let provider = &w.ctx.provider;
    let p = Arc::new(owned_pod("p1", "o1"));
    let Created::Claimed { id, .. } = provider.create(&p).await.expect("claim") else {
        panic!("expected a fresh claim");
    };
    provider
        .claims
        .update_lifecycle("ns/sb", &id, |l, _| l.owner = None)
        .await
        .expect("forget the owner");
    let deleted = within(provider.delete(&deleting((*p).clone())))
        .await
        .expect("delete");
    assert!(matches!(deleted, Deleted::Preserved { .. }), "{deleted:?}");
    let owner = provider
        .claims
        .get("ns/sb")
        .and_then(|(c, _)| c.lifecycle.owner.clone())
        .expect("the owner recorded");
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Sandbox", "sb", "o1")
    );
    assert_eq!(owner.api_version, "agents.x-k8s.io/v1beta1");
}

fn owner_asked(api: &crate::pods::fixtures::ApiServer) -> usize {
    api.seen()
        .iter()
        .filter(|s| s.path().ends_with("/sandboxes/sb"))
        .count()
}

/// The recheck's purpose: a preserved claim whose owner has gone since,
/// with no Pod of its key here, is given back to sandboxd.
#[tokio::test(flavor = "multi_thread")]
async fn a_preserved_claim_whose_owner_went_is_released_by_the_recheck() {
    let sim = crate::pods::fixtures::sim_with_pool(Some(crate::pods::fixtures::TOKEN), 2).await;
    let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (provider, _dir, id, api) = preserved_without_owner(&sim, Arc::clone(&gone)).await;
    assert!(crate::pods::fixtures::release_requests(&sim).is_empty());

    gone.store(true, std::sync::atomic::Ordering::SeqCst);
    crate::pods::fixtures::within(provider.recheck_preserved(
        &crate::periodic::Beat::none(),
        crate::pods::fixtures::any_time(),
    ))
    .await;
    // Once by the recheck, once more by the deletion path it hands over to.
    assert_eq!(owner_asked(&api), 3, "the owner is asked again");
    assert_eq!(
        crate::pods::fixtures::release_requests(&sim),
        vec![format!("/v1/sandboxes/{id}/release")],
        "the claim goes back to sandboxd"
    );
    assert!(
        provider.claims.get("ns/sb").is_none(),
        "and leaves the store"
    );
}

/// A claim whose owner the lifecycle upkeep recorded while the recheck
/// waited for its key is the upkeep's from then on: not asked, not
/// released, dropped from the recheck.
#[tokio::test(flavor = "multi_thread")]
async fn a_preserved_claim_given_an_owner_meanwhile_is_left_to_the_upkeep() {
    let sim = crate::pods::fixtures::sim_with_pool(Some(crate::pods::fixtures::TOKEN), 2).await;
    let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (provider, _dir, id, api) = preserved_without_owner(&sim, Arc::clone(&gone)).await;
    // Were the recheck to ask, it would release.
    gone.store(true, std::sync::atomic::Ordering::SeqCst);
    let provider = Arc::new(provider);

    let guard = provider.lock_key("ns/sb").await;
    let recheck = tokio::spawn({
        let provider = Arc::clone(&provider);
        async move {
            provider
                .recheck_preserved(
                    &crate::periodic::Beat::none(),
                    crate::pods::fixtures::any_time(),
                )
                .await
        }
    });
    // The recheck has chosen the key and waits for it.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!recheck.is_finished());
    let owner = crate::claims::lifecycle::OwnerRef {
        api_version: "agents.x-k8s.io/v1beta1".into(),
        kind: "Sandbox".into(),
        name: "sb".into(),
        uid: "o1".into(),
    };
    provider
        .record_owner("ns/sb", &id, owner)
        .await
        .expect("record owner");
    drop(guard);
    crate::pods::fixtures::within(recheck)
        .await
        .expect("recheck");

    assert_eq!(
        owner_asked(&api),
        1,
        "the recheck asked an owner the upkeep keeps"
    );
    assert!(lock(&provider.preserved).is_empty(), "left to the upkeep");
    assert!(crate::pods::fixtures::release_requests(&sim).is_empty());
    assert!(provider.claims.get("ns/sb").is_some());
}
