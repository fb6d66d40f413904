//! Relays opened across a suspend (defect review 2026-12-b, finding 2):
//! sandboxd wakes a hibernated VM for any relay opened with the claim's
//! token, so a port-forward session or an exec that outlived its Pod
//! (kept open by kubectl, which does not watch the Pod) must open none.

use super::*;
use crate::kubelet::exec::agent;
use crate::kubelet::exec::silkd::Request;
use crate::kubelet::recheck::Rechecked;
use crate::kubelet::relays::SandboxdPlane;
use crate::kubelet::sandbox::{ClaimedSandboxes, DataPlane, Sandboxes, Unavailable};
use crate::pods::source::NodePods;
use crate::sandboxd::SandboxdClient;

fn hibernated(s: &Scene, id: &str) -> bool {
    s.w.sim
        .sim()
        .claims()
        .iter()
        .any(|c| c.id == id && c.hibernated)
}

/// A session opened while its Pod ran (the lookup at the upgrade), then
/// the Sandbox suspended: the Pod deleted, its VM hibernated. The
/// session's next port-forward connection, its exec's `kill` and its
/// terminal resize each open no relay, so the VM stays hibernated; a new
/// session is refused with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_open_across_a_suspend_does_not_wake_the_vm() {
    let mut s = scene(SUSPENDED).await;
    let id = claimed(&s.w).await;
    s.cache(&running_pod(&id));
    let provider = Arc::clone(&s.w.ctx.provider);
    let pods = Arc::new(NodePods::new(s.cache.as_reader(), Arc::clone(&provider)));
    let sandboxes: Arc<dyn Sandboxes> = Arc::new(ClaimedSandboxes::new(
        pods,
        Arc::clone(provider.claims_store()),
    ));
    let relays: Arc<dyn DataPlane> = Arc::new(SandboxdPlane::new(
        SandboxdClient::builder(s.w.sim.base_url())
            .build()
            .expect("client"),
    ));
    let sandbox = sandboxes
        .lookup("ns", "sb", None)
        .expect("the upgrade's lookup");
    let session = Rechecked::new(relays, Arc::clone(&sandboxes), "ns", "sb", None);

    s.cache(&deleting(running_pod(&id), 30));
    s.pod_deleted(&id).await;
    assert!(hibernated(&s, &id), "the suspend hibernated the VM");

    assert!(session.port(&sandbox, 8080).await.is_err());
    let kill = Request::Kill {
        pid: 1,
        signal: None,
    };
    assert!(agent::control(&session, &sandbox, kill).await.is_err());
    let resize = Request::PtyResize {
        pid: 1,
        cols: 80,
        rows: 24,
    };
    assert!(agent::control(&session, &sandbox, resize).await.is_err());
    assert!(
        hibernated(&s, &id),
        "a relay woke the suspended Sandbox's VM"
    );
    match sandboxes.lookup("ns", "sb", None) {
        Err(Unavailable::NoSandbox(why)) => assert!(why.contains("being deleted"), "{why}"),
        other => panic!("a new session on a Pod being deleted: {other:?}"),
    }
    s.turn().await;
    assert_eq!(s.sandboxd(&id, "hibernate"), 1);
    assert!(hibernated(&s, &id));
}

/// The delete untracks the Pod before it sends the hibernate: a session
/// upgraded while the hibernate is in flight (its lookup between the
/// owner's answer and the hibernate's) finds no sandbox, even before the
/// watch cache shows the deletion.
#[tokio::test(flavor = "multi_thread")]
async fn no_session_starts_while_the_hibernate_is_in_flight() {
    let mut s = scene(SUSPENDED).await;
    let id = claimed(&s.w).await;
    s.cache(&running_pod(&id));
    let provider = Arc::clone(&s.w.ctx.provider);
    let pods = Arc::new(NodePods::new(s.cache.as_reader(), Arc::clone(&provider)));
    let sandboxes = ClaimedSandboxes::new(pods, Arc::clone(provider.claims_store()));
    assert!(sandboxes.lookup("ns", "sb", None).is_ok());
    s.w.sim
        .sim()
        .arm_fault(Fault::slow_hibernate(800).times(1))
        .expect("arm");
    let ctx = Arc::clone(&s.w.ctx);
    let pod = deleting(running_pod(&id), 30);
    let deleted = tokio::spawn(async move { reconcile(Arc::new(pod), ctx).await });
    within(async {
        while s.sandboxd(&id, "hibernate") == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(!hibernated(&s, &id), "the hibernate is still in flight");
    assert!(
        sandboxes.lookup("ns", "sb", None).is_err(),
        "a session could start on a VM being hibernated"
    );
    within(deleted).await.expect("join").expect("delete");
    assert!(hibernated(&s, &id));
}
