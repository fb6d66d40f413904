//! Lost claim replies and neighbours: strays of ours are returned, other
//! clients' sandboxes never are.

use super::*;

/// Lost replies among neighbours: a sandbox another client claimed under this
/// Pod's key is never a stray of ours, whether it was listed at
/// start-up or the Pod needs a fresh claim after a lost reply; the real
/// lost reply (tagged with this Pod's UID) is returned.
#[tokio::test(flavor = "multi_thread")]
async fn neighbours_rows_are_never_returned_our_lost_reply_is() {
    let (sim, provider, _dir) = provider_with_token().await;
    let foreign = neighbour_claims(&sim, "ns/p").await;
    // The start-up listing sees the foreign row.
    provider.list().await.expect("list");
    assert!(
        !provider.suspect("ns/p"),
        "a foreign row made the key suspect"
    );

    // A claim whose reply is lost, then the retry.
    drop_next_claim_reply(&sim);
    let pod = Arc::new(pod("u1"));
    let lost = provider.create(&pod).await.expect_err("the reply was lost");
    assert!(lost.message.contains("outcome unknown"), "{lost:?}");
    assert!(provider.suspect("ns/p"));
    let stray: Vec<String> = sim
        .sim()
        .claims()
        .into_iter()
        .filter(|c| c.claim_ref == "ns/p#vk-sandbox:u1")
        .map(|c| c.id)
        .collect();
    assert_eq!(stray.len(), 1, "the lost reply's sandbox exists, tagged");
    let created = provider.create(&pod).await.expect("claim again");
    let Created::Claimed { id, .. } = created else {
        panic!("expected a fresh claim, got {created:?}");
    };
    assert_eq!(released(&sim), stray, "only the lost reply was returned");
    assert!(
        sim.sim().claims().iter().any(|c| c.id == foreign),
        "the neighbour's sandbox was released"
    );
    assert!(sim.sim().claims().iter().any(|c| c.id == id));
    // The unknown outcome stays until that Pod is gone (a late row may
    // still appear); once it is, the key is no longer suspect.
    assert!(provider.suspect("ns/p"), "settled while the Pod lives");
    let provider = provider.settle_strays_after(std::time::Duration::ZERO);
    assert!(
        provider
            .return_strays_of_gone("ns/p", "u1")
            .await
            .expect("settle")
    );
    assert!(!provider.suspect("ns/p"));
    let node_auth = format!("Bearer {TOKEN}");
    assert!(
        sim.sim()
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/release"))
            .all(|r| r.authorization.as_deref() == Some(node_auth.as_str())),
        "strays go back with the node token"
    );
}

/// After a restart the only trace of a lost reply is the listing: a
/// tagged row no stored claim holds marks the key, and the next fresh
/// claim for that Pod returns it.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_reply_seen_only_in_the_listing_is_returned() {
    let (sim, provider, _dir) = provider_with_token().await;
    let ours = neighbour_claims(&sim, "ns/p#vk-sandbox:u1").await;
    let other_pod = neighbour_claims(&sim, "ns/p#vk-sandbox:u0").await;
    assert!(!provider.suspect("ns/p"));
    provider.list().await.expect("list");
    assert!(provider.suspect("ns/p"));
    let created = provider.create(&Arc::new(pod("u1"))).await.expect("claim");
    assert!(matches!(created, Created::Claimed { .. }), "{created:?}");
    assert_eq!(released(&sim), vec![ours]);
    // A stray of another Pod under the same name is not this Pod's to
    // return (it may be a VM that Pod ran on): it is left alone.
    assert!(sim.sim().claims().iter().any(|c| c.id == other_pod));
}

/// A Pod that goes away without having run returns its own strays, and
/// an unknown outcome is forgotten once settled.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_that_never_ran_returns_its_strays_when_it_goes() {
    let (sim, provider, _dir) = provider_with_token().await;
    let provider = provider.settle_strays_after(std::time::Duration::ZERO);
    let foreign = neighbour_claims(&sim, "ns/p").await;
    drop_next_claim_reply(&sim);
    let p = pod("u1");
    provider
        .create(&Arc::new(p.clone()))
        .await
        .expect_err("the reply was lost");
    assert_eq!(
        provider.unknown_outcomes(),
        vec![("ns/p".into(), "u1".into())]
    );
    provider
        .return_strays_of_gone("ns/p", "u1")
        .await
        .expect("settle");
    assert!(provider.unknown_outcomes().is_empty());
    let released = released(&sim);
    assert_eq!(released.len(), 1, "{released:?}");
    assert_ne!(released[0], foreign);
    // forget_never_ran with nothing suspect calls nothing.
    let before = sim.sim().requests().len();
    provider.forget_never_ran(&p).await.expect("nothing to do");
    assert_eq!(sim.sim().requests().len(), before);
}

/// Open mode (no node token): nothing can be released by id, so no key
/// is ever held back as suspect, and a create after a lost reply goes
/// on (the stray ends at its deadline).
#[tokio::test(flavor = "multi_thread")]
async fn open_mode_never_waits_on_strays() {
    let sim = sim_with_pool().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (provider, _claims) = open_mode_provider(&sim, &dir.path().join("claims.json")).await;
    drop_next_claim_reply(&sim);
    let pod = Arc::new(pod("u1"));
    provider.create(&pod).await.expect_err("lost reply");
    assert!(!provider.suspect("ns/p"));
    provider.list().await.expect("list");
    assert!(!provider.suspect("ns/p"), "open mode marked a key suspect");
    let created = provider.create(&pod).await.expect("claim");
    assert!(matches!(created, Created::Claimed { .. }));
    assert!(released(&sim).is_empty());
}

/// A release by id answered 404 is proof of nothing while sandboxd
/// still lists the sandbox (a tenant token gets that answer): the row
/// is kept and the release reported as failed.
#[tokio::test(flavor = "multi_thread")]
async fn a_404_on_release_by_id_is_not_proof_while_listed() {
    crate::crypto::install_provider();
    let sim = sandboxd_sim::start_local(sandboxd_sim::SimConfig {
        api_token: TOKEN.into(),
        tenants: vec![
            serde_json::from_value(json!({"name": "acme", "token": "tenant-token"}))
                .expect("tenant"),
        ],
        tenant_list: sandboxd_sim::config::TenantList::Own,
        pools: vec![sandboxd_sim::config::PoolConfig::parse_spec("base:24.04=2").expect("pool")],
        ..Default::default()
    })
    .await
    .expect("sim");
    let (provider, _dir) =
        crate::pods::fixtures::provider_over(&sim, Some("tenant-token"), silent_client()).await;
    drop_next_claim_reply(&sim);
    let pod = Arc::new(pod("u1"));
    provider.create(&pod).await.expect_err("lost reply");
    let again = provider
        .create(&pod)
        .await
        .expect_err("the stray cannot go");
    assert!(
        again.message.contains("cannot release sandboxes by id"),
        "{again:?}"
    );
    assert_eq!(sim.sim().claims().len(), 1, "the stray is still there");
    assert!(provider.suspect("ns/p"), "the key stays suspect");
}

/// A claim-id annotation naming a sandbox sandboxd lists under another
/// key (a stale or copied annotation) recovers nothing: that VM is a
/// neighbour's, and recording it would release it with the node token.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_id_annotation_naming_another_keys_sandbox_is_not_recovered() {
    let (sim, provider, _dir) = provider_with_token().await;
    let neighbour = neighbour_claims(&sim, "other/x").await;
    let copied = pod_with_claim("u1", &neighbour, None);
    let created = provider.create(&Arc::new(copied)).await.expect("create");
    assert!(
        matches!(&created, Created::Claimed { id, .. } if *id != neighbour),
        "the neighbour's sandbox was taken: {created:?}"
    );
    assert!(!provider.claims.held_ids().contains(&neighbour));
    assert!(released(&sim).is_empty(), "{:?}", released(&sim));
}

/// A claim-id annotation naming a sandbox listed under this Pod's key but
/// not tagged for this Pod recovers nothing: an untagged `ns/p` is what
/// sandbox-operator writes for its Sandbox `ns/p` (or a Go-era row), and a
/// row tagged for another UID was claimed for an earlier Pod of that name
/// (an annotation copied through a template). Recording either would put
/// the Pod on another owner's VM and release it with the node token.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_id_annotation_naming_a_row_not_tagged_for_the_pod_is_not_recovered() {
    for other in ["ns/p".to_string(), claim_ref::for_pod("ns/p", "u0")] {
        let (sim, provider, _dir) = provider_with_token().await;
        let theirs = neighbour_claims(&sim, &other).await;
        let copied = pod_with_claim("u1", &theirs, None);
        let created = provider.create(&Arc::new(copied)).await.expect("create");
        assert!(
            matches!(&created, Created::Claimed { id, .. } if *id != theirs),
            "the sandbox claimed as {other} was taken: {created:?}"
        );
        assert!(!provider.claims.held_ids().contains(&theirs), "{other}");
        assert!(released(&sim).is_empty(), "{:?}", released(&sim));
        assert!(
            sim.sim().claims().iter().any(|c| c.id == theirs),
            "{other}: its sandbox is gone"
        );
    }
}

/// Suspects (keys to check for strays before claiming again): unheld rows
/// carrying this node's tag, and Pods whose last claim had an unknown
/// outcome. Held rows and other clients' rows never count.
#[tokio::test(flavor = "multi_thread")]
async fn suspects_are_unheld_rows_of_ours_or_unknown_outcomes() {
    let (sim, provider, _dir) = provider_with_token().await;
    neighbour_claims(&sim, "ns/n").await;
    provider.create(&Arc::new(pod("u1"))).await.expect("claim");
    let mut listing = provider.list().await.expect("list");
    assert!(!provider.suspect("ns/p"), "a held row is no stray");
    assert!(!provider.suspect("ns/n"), "an untagged row is not ours");

    let row: SandboxRow = serde_json::from_value(json!({
        "id": "sb_unheld", "claim_ref": claim_ref::for_pod("ns/q", "u9")}))
    .expect("row");
    listing.push(row);
    provider.note_listing(&listing);
    assert!(provider.suspect("ns/q"), "an unheld row of ours");
    assert!(!provider.suspect("ns/p"));
    assert!(provider.unknown_outcomes().is_empty());

    provider.note_unknown_outcome("ns/r", "u7");
    assert!(provider.suspect("ns/r"), "an unknown outcome");
    assert_eq!(
        provider.unknown_outcomes(),
        vec![("ns/r".to_string(), "u7".to_string())]
    );
}

/// A Pod deleted while Pending after a lost claim reply returns that
/// stray when it goes (and only it: the neighbour's row under the same
/// key stays).
#[tokio::test(flavor = "multi_thread")]
async fn a_pending_pod_deleted_after_a_lost_reply_returns_its_stray() {
    let (sim, provider, _dir) = provider_with_token().await;
    let foreign = neighbour_claims(&sim, "ns/p").await;
    drop_next_claim_reply(&sim);
    let p = pod("u1");
    provider
        .create(&Arc::new(p.clone()))
        .await
        .expect_err("the reply was lost");
    provider.forget_never_ran(&p).await.expect("returned");
    let released = released(&sim);
    assert_eq!(released.len(), 1, "{released:?}");
    assert_ne!(released[0], foreign);
    assert!(sim.sim().claims().iter().any(|c| c.id == foreign));
}
