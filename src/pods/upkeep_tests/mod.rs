//! The lifecycle upkeep over several turns of one loop (its per-claim
//! schedule kept between them), against a scripted apiserver, the
//! in-process simulator and a watch cache the test fills: which claims a
//! turn looks at, and when it looks again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use sandboxd_sim::{ClaimPatch, Endpoint, Fault};
use serde_json::{Value, json};

use super::controller::reconcile;
use super::fixtures::*;
use super::pod::Pod;
use super::upkeep::LifecycleUpkeep;
use crate::claims::VmState;
use crate::periodic::{Beat, Turn};

mod drift;
mod keys;
mod owners;
mod relays;

const ALIVE: u8 = 0;
const SUSPENDED: u8 = 1;
const GONE: u8 = 2;
/// Alive, running, with a `shutdownTime` a minute away ([`ENDS_AT`]).
const ENDING: u8 = 3;
/// A new generation: a Sandbox of the same name, another UID (`o2`).
const REBORN: u8 = 4;
const KEY: &str = "ns/sb";

/// The `shutdownTime` of an [`ENDING`] owner: a minute from the test
/// process's first call, at whole seconds (as the apiserver writes it).
fn ends_at() -> jiff::Timestamp {
    static AT: std::sync::OnceLock<jiff::Timestamp> = std::sync::OnceLock::new();
    *AT.get_or_init(|| {
        let s = jiff::Timestamp::now().as_second() + 60;
        jiff::Timestamp::from_second(s).expect("a time")
    })
}

/// One upkeep loop, its watch cache, and the owner's state (`ALIVE`,
/// `SUSPENDED`, `GONE`) as the scripted apiserver answers it.
struct Scene {
    w: World,
    owner: Arc<AtomicU8>,
    upkeep: LifecycleUpkeep,
    cache: Writer<Pod>,
    /// The apiserver lists the key's Pod on node-b under the same owner.
    elsewhere: Arc<AtomicBool>,
    /// The key's Pods were listed (the answer may still be on its way).
    listed: Arc<AtomicBool>,
}

async fn scene(owner: u8) -> Scene {
    scene_slow(owner, Duration::ZERO).await
}

/// [`scene`] whose apiserver takes `list` to answer where the key's Pod
/// runs (nothing else is answered meanwhile).
async fn scene_slow(owner: u8, list: Duration) -> Scene {
    let state = Arc::new(AtomicU8::new(owner));
    let answer = Arc::clone(&state);
    let (elsewhere, listed) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (moved, seen_list) = (Arc::clone(&elsewhere), Arc::clone(&listed));
    let is_list = |s: &Seen| s.method == "GET" && s.path() == "/api/v1/namespaces/ns/pods";
    let delay = move |s: &Seen| if is_list(s) { list } else { Duration::ZERO };
    let w = world_slow(
        move |s| match (s.method.as_str(), s.path()) {
            ("GET", "/apis/agents.x-k8s.io/v1beta1") => sandbox_discovery(),
            ("GET", "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/sb") => {
                match answer.load(Ordering::SeqCst) {
                    ALIVE => sandbox("o1", false),
                    SUSPENDED => {
                        let (code, mut obj) = sandbox("o1", false);
                        obj["spec"] = json!({"operatingMode": "Suspended"});
                        (code, obj)
                    }
                    REBORN => sandbox("o2", false),
                    ENDING => {
                        let (code, mut obj) = sandbox("o1", false);
                        obj["spec"] = json!({"shutdownTime": ends_at().to_string()});
                        (code, obj)
                    }
                    _ => status(404, "NotFound", json!({"name": "sb", "kind": "sandboxes"})),
                }
            }
            // Where the key's Pod runs: nowhere else, or (`elsewhere`) on
            // node-b under the same owner.
            ("GET", "/api/v1/namespaces/ns/pods") => {
                seen_list.store(true, Ordering::SeqCst);
                let mut items = Vec::new();
                if moved.load(Ordering::SeqCst) {
                    let mut p = serde_json::to_value(owned_pod("p2", "o1")).expect("json");
                    p["spec"]["nodeName"] = json!("node-b");
                    p["status"] = json!({"phase": "Running"});
                    items.push(p);
                }
                (
                    200,
                    json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}),
                )
            }
            ("PATCH", "/api/v1/namespaces/ns/pods/sb/status") => (200, pod_json()),
            ("DELETE", "/api/v1/namespaces/ns/pods/sb") => (200, pod_json()),
            ("POST", p) if p.ends_with("/events") => (201, s.body.clone()),
            _ => (404, Value::Null),
        },
        delay,
    )
    .await;
    let (store, cache) = reflector::store::<Pod>();
    // Its first look at sandboxd's listing comes 30 s after the start:
    // the tests below pin a turn's own decisions, `drift` the listing's
    // (`observe_next_turn`).
    let upkeep = LifecycleUpkeep::new(Arc::clone(&w.ctx), store);
    Scene {
        w,
        owner: state,
        upkeep,
        cache,
        elsewhere,
        listed,
    }
}

impl Scene {
    async fn turn(&mut self) {
        within(self.upkeep.turn(&Beat::none())).await;
    }

    fn cache(&mut self, pod: &Pod) {
        self.cache
            .apply_watcher_event(&watcher::Event::Apply(pod.clone()));
    }

    fn owner_is(&self, state: u8) {
        self.owner.store(state, Ordering::SeqCst);
    }

    fn owner_gets(&self) -> usize {
        self.w
            .api
            .seen()
            .iter()
            .filter(|s| s.method == "GET" && s.path().ends_with("/sandboxes/sb"))
            .count()
    }

    fn pod_lists(&self) -> usize {
        self.w
            .api
            .seen()
            .iter()
            .filter(|s| s.method == "GET" && s.path() == "/api/v1/namespaces/ns/pods")
            .count()
    }

    fn sandboxd(&self, id: &str, verb: &str) -> usize {
        let path = format!("/v1/sandboxes/{id}/{verb}");
        self.w
            .sim
            .sim()
            .requests()
            .iter()
            .filter(|r| r.path == path)
            .count()
    }

    /// The claim's lease ends now: its renewal is due.
    async fn lease_due(&self) {
        let claim = self
            .w
            .ctx
            .provider
            .settled_claims_of(KEY)
            .expect("the claim");
        self.w.ctx.provider.lease_gone(KEY, &claim).await;
    }

    /// The Pod deleted with its owner as it is now (preserved or
    /// hibernated): the claim has no Pod here and is the upkeep's.
    async fn pod_deleted(&self, id: &str) {
        within(reconcile(
            Arc::new(deleting(running_pod(id), 30)),
            Arc::clone(&self.w.ctx),
        ))
        .await
        .expect("delete");
    }
}

/// A claim with no Pod here is looked at on its first turn (owner asked,
/// where its Pod runs listed, kept), and its owner is not asked again
/// before its cadence; the nearest lease is published meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_with_no_pod_here_is_asked_about_at_its_cadence() {
    let mut s = scene(ALIVE).await;
    let id = claimed(&s.w).await;
    s.pod_deleted(&id).await;
    let asked = s.owner_gets();
    s.turn().await;
    assert_eq!(s.owner_gets(), asked + 1, "the owner was not asked");
    assert_eq!(s.pod_lists(), 1, "where its Pod runs was not asked");
    s.turn().await;
    s.turn().await;
    assert_eq!(s.owner_gets(), asked + 1, "asked again before its cadence");
    assert_eq!(s.pod_lists(), 1);
    assert!(release_requests(&s.w.sim).is_empty());
    assert!(s.w.ctx.provider.holds(KEY));
    let text = s.w.ctx.metrics.encode().expect("metrics");
    let left = support_metric(&text, "vk_sandbox_claim_lease_remaining_min_seconds");
    assert!(left > 0.0, "the nearest lease not published:\n{text}");
}

/// A failed hibernate is retried after its back-off, not on the next turn.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_hibernate_waits_for_its_back_off() {
    let mut s = scene(SUSPENDED).await;
    let id = claimed(&s.w).await;
    s.w.sim
        .sim()
        .arm_fault(Fault::status(Endpoint::Hibernate, 500).times(2))
        .expect("arm");
    s.pod_deleted(&id).await;
    assert_eq!(s.sandboxd(&id, "hibernate"), 1);
    s.turn().await;
    assert_eq!(s.sandboxd(&id, "hibernate"), 2, "the pending hibernate");
    s.turn().await;
    assert_eq!(
        s.sandboxd(&id, "hibernate"),
        2,
        "retried before its back-off"
    );
}

/// A Pod here that is being deleted is its reconcile's: its due lease is
/// neither renewed nor its claim released by the upkeep, whatever the
/// owner says.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_being_deleted_is_left_to_its_reconcile() {
    let mut s = scene(ALIVE).await;
    let id = claimed(&s.w).await;
    s.lease_due().await;
    s.owner_is(GONE);
    s.cache(&deleting(running_pod(&id), 30));
    s.turn().await;
    assert_eq!(s.sandboxd(&id, "renew"), 0);
    assert!(release_requests(&s.w.sim).is_empty());
    assert!(s.w.ctx.provider.holds(KEY));
}

/// A running Pod here is left alone while its lease is fresh (its
/// reference names a served version: the owner is not asked), and has its
/// lease renewed once due.
#[tokio::test(flavor = "multi_thread")]
async fn a_running_pod_here_has_its_due_lease_renewed() {
    let mut s = scene(ALIVE).await;
    let id = claimed(&s.w).await;
    s.cache(&running_pod(&id));
    s.turn().await;
    assert_eq!(s.owner_gets(), 0, "a fresh lease under a served reference");
    assert_eq!(s.sandboxd(&id, "renew"), 0);
    s.lease_due().await;
    let deadline = |s: &Scene| {
        s.w.ctx
            .provider
            .settled_claims_of(KEY)
            .and_then(|c| c.deadline)
    };
    let before = deadline(&s);
    s.turn().await;
    assert_eq!(s.sandboxd(&id, "renew"), 1, "the due lease not renewed");
    let after = deadline(&s);
    assert!(after > before, "{before:?} -> {after:?}");
}

/// A Pod tracked but not in the watch cache yet (just made) keeps its
/// claim out of the upkeep: the stored owner is not asked on its behalf.
#[tokio::test(flavor = "multi_thread")]
async fn a_tracked_pod_not_in_the_cache_yet_is_not_taken_for_gone() {
    let mut s = scene(GONE).await;
    let id = claimed(&s.w).await;
    s.turn().await;
    assert!(
        release_requests(&s.w.sim).is_empty(),
        "released under its Pod"
    );
    assert!(s.w.ctx.provider.holds(KEY));
    assert_eq!(s.sandboxd(&id, "release"), 0);
}

/// The value of an unlabelled series in a Prometheus text.
fn support_metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A Pod of the key here that has ended (Failed) holds nothing: the
/// stored owner decides, and once it is gone the VM is released.
#[tokio::test(flavor = "multi_thread")]
async fn an_ended_pod_here_does_not_hold_the_claim() {
    let mut s = scene(ALIVE).await;
    let id = claimed(&s.w).await;
    s.pod_deleted(&id).await;
    let mut ended = owned_pod("p2", "o1");
    ended.status = serde_json::from_value(json!({"phase": "Failed"})).expect("status");
    s.cache(&ended);
    s.owner_is(GONE);
    s.turn().await;
    assert_eq!(
        release_requests(&s.w.sim),
        [format!("/v1/sandboxes/{id}/release")]
    );
    assert!(!s.w.ctx.provider.holds(KEY));
}

/// A resumed Pod's wake whose reply is lost (sandboxd woke the VM, the
/// connection closed: a reply past the client's timeout, or a process
/// killed while waiting) leaves the VM possibly running. Suspended again
/// before a wake succeeds, the Sandbox's VM must end hibernated: the
/// record may not still say "hibernated" and skip the hibernate.
/// (Reliability scenario 10 found a VM running under a suspended Sandbox.)
#[tokio::test(flavor = "multi_thread")]
async fn a_wake_whose_reply_was_lost_is_hibernated_again_on_suspend() {
    let mut s = scene(SUSPENDED).await;
    let id = claimed(&s.w).await;
    s.pod_deleted(&id).await;
    assert_eq!(s.sandboxd(&id, "hibernate"), 1);
    let paused = |s: &Scene| {
        s.w.sim
            .sim()
            .claims()
            .iter()
            .any(|c| c.id == id && c.hibernated)
    };
    assert!(paused(&s), "the suspend hibernated the VM");
    // Resumed: the new Pod's wake is done by sandboxd, its reply lost.
    s.owner_is(ALIVE);
    s.w.sim
        .sim()
        .arm_fault(Fault::drop_after(Endpoint::Wake).times(1))
        .expect("arm");
    let resumed = owned_pod("p2", "o1");
    let _ = within(reconcile(Arc::new(resumed.clone()), Arc::clone(&s.w.ctx))).await;
    assert_eq!(s.sandboxd(&id, "wake"), 1);
    assert!(!paused(&s), "sandboxd woke it");
    // Suspended again before the wake is retried.
    s.owner_is(SUSPENDED);
    within(reconcile(
        Arc::new(deleting(resumed, 30)),
        Arc::clone(&s.w.ctx),
    ))
    .await
    .expect("delete");
    s.turn().await;
    assert!(
        paused(&s),
        "a suspended Sandbox's VM left running ({} hibernates asked)",
        s.sandboxd(&id, "hibernate")
    );
    assert!(release_requests(&s.w.sim).is_empty());
}

/// A hibernated claim (no Pod here) whose lease is due.
async fn hibernated_and_due() -> (Scene, String) {
    let s = scene(SUSPENDED).await;
    let id = claimed(&s.w).await;
    s.pod_deleted(&id).await;
    s.lease_due().await;
    (s, id)
}

/// [`hibernated_and_due`], and sandboxd no longer has the sandbox: its
/// renewal is answered 404.
async fn gone_and_due() -> (Scene, String) {
    let (s, id) = hibernated_and_due().await;
    s.w.sim
        .sim()
        .arm_fault(Fault::status(Endpoint::Renew, 404).times(1))
        .expect("arm");
    (s, id)
}

/// [`hibernated_and_due`], and sandboxd has archived the sandbox: its
/// renewal is refused with 409.
async fn archived_and_due() -> (Scene, String) {
    let (s, id) = hibernated_and_due().await;
    s.w.sim
        .sim()
        .patch_claim(
            &id,
            ClaimPatch {
                archived: Some(true),
                ..Default::default()
            },
        )
        .expect("archive");
    (s, id)
}

fn vm(s: &Scene) -> VmState {
    s.w.ctx
        .provider
        .settled_claims_of(KEY)
        .expect("the claim kept")
        .lifecycle
        .vm
}

/// How long the apiserver takes to list the key's Pods in the tests below.
const SLOW_LIST: Duration = Duration::from_millis(1500);

/// Until the apiserver has been asked where the key's Pod runs.
async fn until_listed(listed: &AtomicBool) {
    within(async {
        while !listed.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}
