//! Reconciles after a restart, while sandboxd's listing fails: every row of
//! the previous run is quarantined until a listing vouches for it, and a
//! failed verification is vk-sandbox's own trouble, never the Pod's.

use std::sync::Arc;

use sandboxd_sim::{Endpoint, Fault};
use serde_json::Value;

use super::context::Context;
use super::controller::reconcile;
use super::fixtures::*;
use super::pod::Pod;
use super::provider::Provider;

/// The world's provider as after a restart: a new process over the same
/// state path (every row quarantined), the same apiserver and sandboxd.
async fn restarted(w: &World) -> Arc<Context> {
    let claims = crate::claims::ClaimsStore::open(&w.dir.path().join("claims.json"))
        .await
        .expect("reopen the claims store");
    assert_eq!(
        claims.counts().quarantined,
        claims.len(),
        "rows are quarantined"
    );
    let sandboxd = crate::sandboxd::SandboxdClient::builder(w.sim.base_url())
        .token(Some(TOKEN.into()))
        .build()
        .expect("client");
    let provider = Provider::new(w.api.client.clone(), sandboxd, Arc::new(claims));
    Arc::new(Context::new(
        w.api.client.clone(),
        Arc::new(provider),
        "node-a",
        crate::metrics::Metrics::new().expect("metrics"),
    ))
}

fn never_restarts(mut p: Pod) -> Pod {
    p.spec.get_or_insert_default().restart_policy = Some("Never".into());
    p
}

fn lists(w: &World) -> usize {
    w.sim
        .sim()
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == "/v1/sandboxes")
        .count()
}

fn warnings(w: &World) -> Vec<Value> {
    w.api
        .seen()
        .into_iter()
        .filter(|s| s.method == "POST" && s.path().ends_with("/events"))
        .map(|s| s.body)
        .filter(|b| b["type"] == "Warning")
        .collect()
}

/// A Pod Running on the claim its key holds is left exactly as it is when
/// the verification listing fails after a restart: no status write (its
/// `restartPolicy: Never` makes no difference), no Warning; the reconcile
/// fails and is retried with back-off.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_verification_leaves_a_running_pod_untouched() {
    let w = world(sandbox("o1", false)).await;
    claimed(&w).await;
    let writes = w.api.writes().len();
    // The Pod as our Running write left it.
    let mut stored = serde_json::to_value(owned_pod("p1", "o1")).expect("json");
    json_patch::merge(&mut stored, &w.api.writes()[0].body);
    let stored: Pod = serde_json::from_value(stored).expect("pod");
    let ctx = restarted(&w).await;
    w.sim
        .sim()
        .arm_fault(Fault::status(Endpoint::List, 503))
        .expect("arm");
    let pod = Arc::new(never_restarts(stored));
    for _ in 0..3 {
        let r = within(reconcile(Arc::clone(&pod), Arc::clone(&ctx))).await;
        assert!(r.is_err(), "retried with back-off: {r:?}");
    }
    assert_eq!(w.api.writes().len(), writes, "{:#?}", w.api.writes());
    assert!(warnings(&w).is_empty(), "{:#?}", warnings(&w));
    assert!(ctx.provider.holds("ns/sb"), "the row is kept quarantined");
    assert!(release_requests(&w.sim).is_empty());
    // sandboxd answers again: once the back-off has passed, the row is
    // vouched for, the Pod resumed, and still nothing is written (its
    // status is already right).
    w.sim.sim().clear_faults();
    let mut resumed = Err(crate::Error::Internal("not tried".into()));
    for _ in 0..50 {
        resumed = within(reconcile(Arc::clone(&pod), Arc::clone(&ctx))).await;
        if resumed.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    resumed.expect("resumed");
    assert_eq!(w.api.writes().len(), writes, "{:#?}", w.api.writes());
    assert_eq!(
        ctx.provider.tracked("ns/sb").map(|p| p.uid().to_string()),
        Some("p1".into())
    );
}

/// A Pod whose claim was made but never reported Running (the process died
/// in between) is reported Pending while the verification fails, never
/// Failed, whatever its restart policy: vk-sandbox's fault, not the Pod's.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_verification_is_pending_never_failed() {
    let w = world(sandbox("o1", false)).await;
    claimed(&w).await;
    let writes = w.api.writes().len();
    let ctx = restarted(&w).await;
    w.sim
        .sim()
        .arm_fault(Fault::status(Endpoint::List, 503))
        .expect("arm");
    let pod = Arc::new(never_restarts(owned_pod("p1", "o1")));
    let r = within(reconcile(Arc::clone(&pod), Arc::clone(&ctx))).await;
    assert!(r.is_err(), "retried with back-off: {r:?}");
    let new: Vec<_> = w.api.writes().into_iter().skip(writes).collect();
    assert_eq!(new.len(), 1, "{new:#?}");
    assert_eq!(new[0].body["status"]["phase"], "Pending", "{new:#?}");
    assert_eq!(new[0].body["status"]["reason"], "ProviderFailed");
}

/// Many Pods reconciled at once while the listing fails share one
/// verification listing, and a retry within its back-off lists nothing.
#[tokio::test(flavor = "multi_thread")]
async fn reconciles_share_one_verification_listing_with_back_off() {
    let w = world(sandbox("o1", false)).await;
    let id = claimed(&w).await;
    let ctx = restarted(&w).await;
    w.sim
        .sim()
        .arm_fault(Fault::status(Endpoint::List, 503))
        .expect("arm");
    let before = lists(&w);
    let pod = Arc::new(running_pod(&id));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..16 {
        tasks.spawn(reconcile(Arc::clone(&pod), Arc::clone(&ctx)));
    }
    while let Some(r) = tasks.join_next().await {
        assert!(r.expect("join").is_err());
    }
    assert_eq!(lists(&w) - before, 1, "one listing for all of them");
    let r = within(reconcile(Arc::clone(&pod), Arc::clone(&ctx))).await;
    assert!(r.is_err());
    assert_eq!(
        lists(&w) - before,
        1,
        "a retry within the back-off lists nothing"
    );
}
