use super::*;
use crate::pods::{annotations, claim_ref};
use serde_json::json;

/// A kube client whose requests go nowhere: these paths must not call
/// the apiserver at all (a call would hang and time the test out).
fn silent_client() -> Client {
    let (mock, _handle) = tower_test::mock::pair::<
        http::Request<kube::client::Body>,
        http::Response<kube::client::Body>,
    >();
    std::mem::forget(_handle);
    Client::new(mock, "default")
}

/// An in-process simulator with a warm `base:24.04` pool of two.
async fn sim_with_pool() -> sandboxd_sim::SimHandle {
    crate::pods::fixtures::sim_with_pool(None, 2).await
}

fn pod(uid: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": uid, "annotations": {
            "sandbox.cocoonstack.io/template": "base:24.04"}},
        "spec": {"containers": [{"name": "a", "image": "base:24.04"}]},
    }))
    .expect("pod")
}

/// The Pod `uid` carrying claim `id` in its annotation: with `ip`, as a
/// Running Pod whose status names the sandbox's address.
fn pod_with_claim(uid: &str, id: &str, ip: Option<&str>) -> Pod {
    let mut p = pod(uid);
    p.metadata
        .annotations
        .get_or_insert_default()
        .insert(annotations::CLAIM_ID.to_string(), id.to_string());
    p.status = ip.map(|ip| crate::pods::pod::PodStatus {
        pod_ip: Some(ip.into()),
        ..Default::default()
    });
    p
}

/// A provider in open mode (no sandboxd token) over the claims store at
/// `path` (opened, or reopened as after a restart), and that store.
async fn open_mode_provider(
    sim: &sandboxd_sim::SimHandle,
    path: &std::path::Path,
) -> (Provider, Arc<ClaimsStore>) {
    let claims = Arc::new(ClaimsStore::open(path).await.expect("store"));
    let sandboxd = SandboxdClient::builder(sim.base_url())
        .build()
        .expect("client");
    (
        Provider::new(silent_client(), sandboxd, Arc::clone(&claims)),
        claims,
    )
}

const TOKEN: &str = "node-root-token";

/// An in-process simulator with a root token and a warm pool of four,
/// and a provider (node token configured) over a fresh claims store.
async fn provider_with_token() -> (sandboxd_sim::SimHandle, Provider, tempfile::TempDir) {
    crate::crypto::install_provider();
    let sim = crate::pods::fixtures::sim_with_pool(Some(TOKEN), 4).await;
    let (provider, dir) =
        crate::pods::fixtures::provider_over(&sim, Some(TOKEN), silent_client()).await;
    (sim, provider, dir)
}

/// Another client of the same sandboxd (sandbox-operator's aggregated
/// apiserver) claims with `claim_ref = <namespace>/<name>`.
async fn neighbour_claims(sim: &sandboxd_sim::SimHandle, claim_ref: &str) -> String {
    SandboxdClient::builder(sim.base_url())
        .token(Some(TOKEN.into()))
        .build()
        .expect("client")
        .claim(&crate::sandboxd::ClaimRequest {
            template: "base:24.04".into(),
            claim_ref: claim_ref.into(),
            ..Default::default()
        })
        .await
        .expect("neighbour claim")
        .id
}

fn released(sim: &sandboxd_sim::SimHandle) -> Vec<String> {
    sim.sim()
        .requests()
        .iter()
        .filter_map(|r| {
            r.path
                .strip_prefix("/v1/sandboxes/")
                .and_then(|p| p.strip_suffix("/release"))
                .map(str::to_string)
        })
        .collect()
}

fn drop_next_claim_reply(sim: &sandboxd_sim::SimHandle) {
    let fault: sandboxd_sim::Fault =
        serde_json::from_value(json!({"endpoint": "claim", "kind": "drop_after", "times": 1}))
            .expect("fault");
    sim.sim().arm_fault(fault).expect("arm");
}

/// A claim recovered without its credential whose commit fails must not
/// wedge the key: the row is not left "stranded" (returning it would
/// need a token it does not have); once the state is writable again the
/// next try recovers it, and nothing is released or claimed twice.
#[tokio::test(flavor = "multi_thread")]
async fn recovered_claim_whose_commit_fails_is_recovered_again() {
    crate::crypto::install_provider();
    let sim = crate::pods::fixtures::sim_with_pool(Some(TOKEN), 2).await;
    let id = neighbour_claims(&sim, "ns/p#vk-sandbox:u1").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state_dir = dir.path().join("state");
    let parked = dir.path().join("parked");
    let claims = Arc::new(
        ClaimsStore::open(&state_dir.join("claims.json"))
            .await
            .expect("store"),
    );
    let sandboxd = SandboxdClient::builder(sim.base_url())
        .token(Some(TOKEN.into()))
        .build()
        .expect("client");
    let provider = Provider::new(silent_client(), sandboxd, Arc::clone(&claims));
    let running = pod_with_claim("u1", &id, Some("10.0.0.5"));
    let running = Arc::new(running);
    // The state cannot be written: the directory's place is a file.
    std::fs::rename(&state_dir, &parked).expect("park");
    std::fs::write(&state_dir, "").expect("block");
    let failed = provider.create(&running).await.expect_err("not persisted");
    assert!(
        failed.message.contains("persist the recovered claim"),
        "{failed:?}"
    );
    assert!(
        claims.get("ns/p").is_none(),
        "a stranded token-less row was left"
    );
    std::fs::remove_file(&state_dir).expect("unblock");
    std::fs::rename(&parked, &state_dir).expect("restore");
    let created = provider.create(&running).await.expect("recovered");
    assert!(
        matches!(&created, Created::Adopted { id: got, .. } if *got == id),
        "{created:?}"
    );
    assert!(released(&sim).is_empty(), "the Pod's sandbox was released");
    assert_eq!(sim.sim().claims().len(), 1, "a second sandbox was claimed");
}

/// Reliability finding: with the claims state lost, a Pod running on
/// its sandbox must keep it (adopted, to be released with the node
/// token), not see it returned as a stray and a second one claimed.
#[tokio::test(flavor = "multi_thread")]
async fn lost_credential_is_recovered_not_released() {
    let sim = sim_with_pool().await;
    let sandboxd = SandboxdClient::builder(sim.base_url())
        .build()
        .expect("client");
    let first = sandboxd
        .claim(&crate::sandboxd::ClaimRequest {
            template: "base:24.04".into(),
            claim_ref: claim_ref::for_pod("ns/p", "u1"),
            ..Default::default()
        })
        .await
        .expect("claim");
    let dir = tempfile::tempdir().expect("tempdir");
    let claims = Arc::new(
        ClaimsStore::open(&dir.path().join("claims.json"))
            .await
            .expect("store"),
    );
    let provider = Provider::new(silent_client(), sandboxd, Arc::clone(&claims));
    provider.list().await.expect("list");
    let running = pod_with_claim("u1", &first.id, Some("10.0.0.5"));
    let created = provider.create(&Arc::new(running)).await.expect("create");
    assert!(
        matches!(&created, Created::Adopted { id, .. } if *id == first.id),
        "expected the running sandbox adopted, got {created:?}"
    );
    let requests = sim.sim().requests();
    assert!(
        requests.iter().all(|r| !r.path.ends_with("/release")),
        "the running sandbox was released: {requests:?}"
    );
    assert_eq!(
        requests.iter().filter(|r| r.path == "/v1/claim").count(),
        1,
        "a second sandbox was claimed"
    );
    let (stored, _) = claims.get("ns/p").expect("stored");
    assert_eq!(
        (
            stored.id.as_str(),
            stored.token.as_deref().map_or("", |t| t.expose())
        ),
        (first.id.as_str(), "")
    );
    assert_eq!(sim.sim().claims().len(), 1);
}

/// After a restart the same Pod resumes its own claim (no Event is
/// announced for it); a new Pod under the key adopts it. Neither claims.
#[tokio::test(flavor = "multi_thread")]
async fn restart_resumes_the_same_pod_and_a_new_pod_adopts() {
    let sim = sim_with_pool().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let (first, claims) = open_mode_provider(&sim, &path).await;
    let Created::Claimed { id, .. } = first.create(&Arc::new(pod("u1"))).await.expect("claim")
    else {
        panic!("expected a fresh claim");
    };
    claims.compact().await.expect("compact");
    drop((first, claims));

    let (restarted, claims) = open_mode_provider(&sim, &path).await;
    restarted.refresh().await.expect("verify");
    let again = restarted
        .create(&Arc::new(pod("u1")))
        .await
        .expect("resume");
    assert!(
        matches!(&again, Created::Resumed { id: got, .. } if *got == id),
        "same Pod after a restart: {again:?}"
    );
    let sandboxd = SandboxdClient::builder(sim.base_url())
        .build()
        .expect("client");
    let other = Provider::new(silent_client(), sandboxd, Arc::clone(&claims));
    let next = other.create(&Arc::new(pod("u2"))).await.expect("adopt");
    assert!(
        matches!(&next, Created::Adopted { id: got, .. } if *got == id),
        "a new Pod under the key: {next:?}"
    );
    assert_eq!(
        sim.sim()
            .requests()
            .iter()
            .filter(|r| r.path == "/v1/claim")
            .count(),
        1,
        "claimed again instead of resuming or adopting"
    );
}

/// Test 34: a delete or update for an older generation of a tracked key
/// is ignored: no release, the claim and the tracked Pod stay.
#[tokio::test(flavor = "multi_thread")]
async fn stale_uid_is_ignored() {
    let sim = sim_with_pool().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (provider, claims) = open_mode_provider(&sim, &dir.path().join("claims.json")).await;

    let created = provider.create(&Arc::new(pod("u2"))).await.expect("create");
    let Created::Claimed { id, .. } = created else {
        panic!("expected a fresh claim, got {created:?}");
    };
    let deleted = tokio::time::timeout(Duration::from_secs(5), provider.delete(&pod("u1")))
        .await
        .expect("a stale delete must not call out")
        .expect("delete");
    assert_eq!(deleted, Deleted::Stale);
    provider.update_tracked(&Arc::new(pod("u1")));
    assert_eq!(
        provider
            .tracked("ns/p")
            .and_then(|p| p.metadata.uid.clone())
            .as_deref(),
        Some("u2"),
        "an update for an old generation replaced the tracked Pod"
    );
    assert_eq!(claims.get("ns/p").map(|(c, _)| c.id), Some(id));
    assert!(
        sim.sim()
            .requests()
            .iter()
            .all(|r| !r.path.ends_with("/release")),
        "a stale delete released the sandbox"
    );
}

/// A settled claim past its cached deadline is settled by sandboxd's
/// listing, row by row: still listed (its lease was extended), it is kept
/// and resumed; gone, it is forgotten and a fresh sandbox is claimed. A
/// neighbour's listed row never stands in for ours.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_past_its_cached_deadline_is_settled_by_the_listing() {
    let (sim, provider, _dir) = provider_with_token().await;
    let neighbour = neighbour_claims(&sim, "other/x").await;
    let past = Timestamp::now() - jiff::SignedDuration::from_secs(60);

    // Still listed: kept, with sandboxd's deadline.
    let Created::Claimed { id: live, .. } =
        provider.create(&Arc::new(pod("u1"))).await.expect("claim")
    else {
        panic!("expected a fresh claim");
    };
    provider
        .claims
        .set_deadline("ns/p", &live, Some(past))
        .await
        .expect("deadline");
    let again = provider.create(&Arc::new(pod("u1"))).await.expect("resume");
    assert!(
        matches!(&again, Created::Resumed { id, .. } if *id == live),
        "a listed claim past its cached deadline is kept: {again:?}"
    );

    // Gone from sandboxd: the stored id names no listed sandbox.
    provider.claims.remove("ns/p", &live).await.expect("remove");
    let dead = Claim {
        id: "sb_gone".into(),
        token: crate::sandboxd::Token::new("t"),
        address: "10.0.0.9:7777".into(),
        pod_uid: "u1".into(),
        claimed_at: past,
        deadline: Some(past),
        lifecycle: Default::default(),
    };
    provider.claims.commit("ns/p", dead).await.expect("commit");
    let got = provider.create(&Arc::new(pod("u1"))).await.expect("create");
    let Created::Claimed { id, .. } = &got else {
        panic!("a sandbox sandboxd no longer lists was taken as live: {got:?}");
    };
    assert!(
        *id != "sb_gone" && *id != neighbour,
        "a fresh sandbox, not {id}"
    );
    assert_eq!(
        provider.claims.get("ns/p").map(|(c, _)| c.id),
        Some(id.clone())
    );
}

fn pod_named(name: &str, uid: &str) -> Pod {
    let mut p = pod(uid);
    p.metadata.name = Some(name.into());
    p
}

/// A listing is needed until one succeeds, and again after one fails (a
/// failed list is never an empty one); the side loop reads this.
#[tokio::test(flavor = "multi_thread")]
async fn a_listing_is_needed_until_one_succeeds_and_after_one_fails() {
    let (sim, provider, _dir) = provider_with_token().await;
    assert!(provider.refresh_needed(), "nothing listed yet");
    provider.list().await.expect("list");
    assert!(!provider.refresh_needed(), "listed");
    let fault: sandboxd_sim::Fault = serde_json::from_value(
        json!({"endpoint": "list", "kind": "status", "status": 500, "times": 1}),
    )
    .expect("fault");
    sim.sim().arm_fault(fault).expect("arm");
    assert!(provider.list().await.is_err());
    assert!(provider.refresh_needed(), "the last listing failed");
    assert!(provider.refresh().await.is_ok());
    assert!(!provider.refresh_needed(), "listed again");
}

/// A tenant token's 403 is said once per process; other refusals never
/// say it.
#[tokio::test(flavor = "multi_thread")]
async fn only_the_first_403_says_the_token_is_not_root() {
    let (_sim, provider, _dir) = provider_with_token().await;
    let refused = |status| SandboxdError::Http {
        op: Op::List,
        status,
        message: String::new(),
    };
    assert!(
        !provider.first_not_root(&refused(500)),
        "a 500 is not a tenant token"
    );
    assert!(
        provider.first_not_root(&refused(403)),
        "the first 403 is said"
    );
    assert!(!provider.first_not_root(&refused(403)), "once");
    assert!(!provider.first_not_root(&refused(500)));
}

mod addresses;
mod leaks;
mod lifecycle;
mod strays;
mod tracked;
mod upkeep;
