//! The side loops against reconciles: one key is worked on by one of them
//! at a time, a sweep never acts on a snapshot older than the key's Pod,
//! and a long preserved-claim recheck keeps `/livez` fed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::runtime::reflector;
use kube::runtime::watcher;
use sandboxd_sim::{Endpoint, Fault};
use serde_json::{Value, json};

use super::context::Context;
use super::controller::reconcile;
use super::fixtures::*;
use super::pod::Pod;
use super::sweeps::{self, Periods};
use super::synced::Synced;
use crate::health::Health;
use crate::periodic::Beat;

fn owner_gets(w: &ApiServer) -> usize {
    w.seen()
        .iter()
        .filter(|s| s.method == "GET" && s.path().contains("/sandboxes/"))
        .count()
}

/// A preserved claim whose owner is replaced (same name, new UID) is
/// released by the lifecycle upkeep while the new owner's Pod arrives here: the
/// release and the adoption of the key never interleave. The release runs
/// first, so the new Pod claims afresh and runs on a live sandbox.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_and_an_adoption_of_one_key_never_interleave() {
    let replaced = Arc::new(AtomicBool::new(false));
    let owner = Arc::clone(&replaced);
    let w = world_with(move |s| match (s.method.as_str(), s.path()) {
        ("GET", "/apis/agents.x-k8s.io/v1beta1") => sandbox_discovery(),
        ("GET", "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/sb") => sandbox(
            if owner.load(Ordering::SeqCst) {
                "o2"
            } else {
                "o1"
            },
            false,
        ),
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
    .expect("preserved");
    assert!(release_requests(&w.sim).is_empty());
    replaced.store(true, Ordering::SeqCst);
    w.sim
        .sim()
        .arm_fault(Fault::slow(Endpoint::Release, 1000).times(1))
        .expect("arm");
    let recheck = tokio::spawn({
        let ctx = Arc::clone(&w.ctx);
        async move { upkeep_turn(&ctx, &[]).await }
    });
    for _ in 0..100 {
        if !release_requests(&w.sim).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        release_requests(&w.sim),
        vec![format!("/v1/sandboxes/{id}/release")]
    );
    // The new owner's Pod, while that release is on its way.
    within(reconcile(
        Arc::new(owned_pod("p2", "o2")),
        Arc::clone(&w.ctx),
    ))
    .await
    .expect("reconcile");
    within(recheck).await.expect("recheck");
    let last = w.api.writes().pop().expect("a status write");
    let running_on = last.body["metadata"]["annotations"]["sandbox.cocoonstack.io/claim-id"]
        .as_str()
        .expect("claim id")
        .to_string();
    assert_ne!(running_on, id, "reported Running on the released sandbox");
    assert!(
        w.sim.sim().claims().iter().any(|c| c.id == running_on),
        "reported Running on a sandbox that is not live"
    );
    assert!(
        w.ctx.provider.holds_id("ns/sb", &running_on),
        "the new claim is held"
    );
}

/// A replacement Pod that arrived after the sweep's snapshot is not taken
/// for a vanished one: its owner is not asked and it stays tracked.
#[tokio::test(flavor = "multi_thread")]
async fn the_vanished_sweep_checks_the_key_before_acting_on_its_snapshot() {
    let w = world(sandbox("o1", false)).await;
    claimed(&w).await;
    let tracked = w.ctx.provider.tracked("ns/sb").expect("tracked");
    // The watch cache has the Pod; the sweep's snapshot was taken before.
    let (store, mut writer) = reflector::store::<Pod>();
    writer.apply_watcher_event(&watcher::Event::Apply((*tracked).clone()));
    let stale = std::collections::HashMap::new();
    let before = owner_gets(&w.api);
    let mut retries = sweeps::Retries::default();
    sweeps::sweep_vanished(&w.ctx, &store, &stale, &mut retries, &Beat::none()).await;
    assert_eq!(owner_gets(&w.api), before, "the owner was asked");
    assert_eq!(
        w.ctx.provider.tracked("ns/sb").map(|p| p.uid().to_string()),
        Some("p1".into())
    );
    assert!(release_requests(&w.sim).is_empty());
}

/// A claim whose reply timed out while sandboxd persisted it later: the
/// Pod claimed again and runs, then the late row appears, tagged for that
/// same Pod. The vanished sweep returns it while the Pod runs; before, it
/// was returned only once the Pod was gone, so a Pod that lives for days
/// kept an idle VM as long, and the orphan audit reported a stray.
#[tokio::test(flavor = "multi_thread")]
async fn a_late_stray_of_a_running_pod_is_returned_while_it_runs() {
    let w = world(sandbox("o1", false)).await;
    // The first claim's reply timed out; the row was not listed yet.
    w.ctx.provider.note_unknown_outcome("ns/sb", "p1");
    let held = claimed(&w).await;
    let late = crate::sandboxd::SandboxdClient::builder(w.sim.base_url())
        .token(Some(TOKEN.into()))
        .build()
        .expect("client")
        .claim(&crate::sandboxd::ClaimRequest {
            template: "base:24.04".into(),
            claim_ref: super::claim_ref::for_pod("ns/sb", "p1"),
            ..Default::default()
        })
        .await
        .expect("the late claim")
        .id;
    let tracked = w.ctx.provider.tracked("ns/sb").expect("tracked");
    let (store, mut writer) = reflector::store::<Pod>();
    writer.apply_watcher_event(&watcher::Event::Apply((*tracked).clone()));
    let present = std::collections::HashMap::from([("ns/sb".to_string(), Some("p1".to_string()))]);
    let mut retries = sweeps::Retries::default();
    sweeps::sweep_vanished(&w.ctx, &store, &present, &mut retries, &Beat::none()).await;
    assert_eq!(
        release_requests(&w.sim),
        vec![format!("/v1/sandboxes/{late}/release")]
    );
    let live: Vec<String> = w.sim.sim().claims().into_iter().map(|c| c.id).collect();
    assert_eq!(live, vec![held.clone()], "the Pod's own sandbox is kept");
    assert!(w.ctx.provider.holds_id("ns/sb", &held));
}

/// The Pod `ns/<name>` owned by Sandbox `<name>`.
fn owned(name: &str) -> Pod {
    let mut p = owned_pod(&format!("u-{name}"), &format!("o-{name}"));
    p.metadata.name = Some(name.into());
    if let Some(o) = p
        .metadata
        .owner_references
        .as_mut()
        .and_then(|o| o.iter_mut().find(|o| o.controller == Some(true)))
    {
        o.name = name.into();
    }
    p
}

/// Twelve preserved claims whose owners answer slowly (300 ms each): the
/// lifecycle upkeep (which asks the owners of claims with no Pod here)
/// beats per claim looked after, so `/livez` stays OK with a margin of
/// 500 ms, and an owner just asked is not asked again on the next tick.
#[tokio::test(flavor = "multi_thread")]
async fn livez_stays_ok_under_a_slow_preserved_recheck() {
    crate::crypto::install_provider();
    let slow = Arc::new(AtomicBool::new(false));
    let delay = Arc::clone(&slow);
    let api = ApiServer::slow(
        |s| match (s.method.as_str(), s.path()) {
            ("GET", "/apis/agents.x-k8s.io/v1beta1") => sandbox_discovery(),
            ("GET", p) if p.contains("/sandboxes/") => {
                let name = p.rsplit('/').next().unwrap_or_default();
                (
                    200,
                    json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                        "metadata": {"name": name, "namespace": "ns", "uid": format!("o-{name}")}}),
                )
            }
            ("GET", "/api/v1/namespaces/ns/pods") => (
                200,
                json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []}),
            ),
            _ => (404, Value::Null),
        },
        move |s| {
            if delay.load(Ordering::SeqCst) && s.path().contains("/sandboxes/") {
                Duration::from_millis(300)
            } else {
                Duration::ZERO
            }
        },
    );
    let sim = sim_with_pool(Some(TOKEN), 12).await;
    let (provider, _dir) = provider_over(&sim, Some(TOKEN), api.client.clone()).await;
    let health = Health::new();
    let ctx = Arc::new(
        Context::new(
            api.client.clone(),
            Arc::new(provider),
            "node-a",
            crate::metrics::Metrics::new().expect("metrics"),
        )
        .with_health(Arc::clone(&health)),
    );
    for i in 0..12 {
        let pod = Arc::new(owned(&format!("sb{i}")));
        within(ctx.provider.create(&pod)).await.expect("claim");
        let gone = deleting((*pod).clone(), 30);
        let outcome = within(ctx.provider.delete(&gone)).await.expect("delete");
        assert!(
            matches!(outcome, super::provider::Deleted::Preserved { .. }),
            "{outcome:?}"
        );
    }
    assert_eq!(owner_gets(&api), 12);
    slow.store(true, Ordering::SeqCst);
    let (store, _writer) = reflector::store::<Pod>();
    let stop = tokio_util::sync::CancellationToken::new();
    let periods = Periods {
        vanished: Duration::from_secs(3600),
        lease_expiry: Duration::from_millis(50),
        refresh: Duration::from_secs(3600),
        upkeep: Duration::from_millis(50),
        stall_margin: Duration::from_millis(500),
    };
    let mut loops = sweeps::spawn(ctx, store, Synced::ready(), periods, stop.clone());
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Err(stalled) = health.liveness() {
            panic!("/livez failed during the recheck: {stalled:?}");
        }
    }
    assert_eq!(
        owner_gets(&api),
        24,
        "each owner asked once more in 5 s, not once per tick"
    );
    stop.cancel();
    while loops.join_next().await.is_some() {}
}
