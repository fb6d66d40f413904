//! The Pod controller: a kube-runtime `Controller` over the Pods bound to
//! this node. Reconcile reads the cached Pod and the provider's state, picks
//! one action, and converges through requeues with per-key back-off.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde_json::Value;
use tokio::sync::watch;
use tracing::{Instrument, debug, info, info_span, warn};

use super::annotations::key;
use super::provider::{Created, Deleted, Provider};
use super::status;
use crate::claims::ClaimState;
use crate::{Error, Result};

/// Healthy Pods are looked at again this often, so drifted status is
/// re-published even without a watch event.
const RESYNC: Duration = Duration::from_secs(300);
/// Reconciles in flight at once. Each mostly waits on the apiserver; the
/// bound keeps a burst (or a restart over thousands of Pods) from putting
/// thousands of requests in the apiserver's queue ahead of the Lease
/// renewal and Node status, which share this client's priority level.
const MAX_CONCURRENT_RECONCILES: u16 = 64;
/// The reporting controller of every Event written here (the instance is
/// the node name), whether through kube's `Recorder` or directly.
const REPORTING_CONTROLLER: &str = "vk-sandbox";
const BACKOFF_START: Duration = Duration::from_millis(500);
const BACKOFF_CAP: Duration = Duration::from_secs(180);

pub struct Context {
    pub provider: Arc<Provider>,
    pub client: Client,
    pub recorder: Recorder,
    pub node: String,
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
    failures: Mutex<HashMap<ObjectRef<Pod>, u32>>,
    /// Reconciles wait until this turns true (the Node is registered), so
    /// the Node's own writes are not queued behind every Pod's.
    gate: Option<watch::Receiver<bool>>,
}

impl Context {
    pub fn new(client: Client, provider: Arc<Provider>, node: &str) -> Context {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: REPORTING_CONTROLLER.into(),
                instance: Some(node.to_string()),
            },
        );
        Context {
            provider,
            client,
            recorder,
            node: node.to_string(),
            metrics: None,
            failures: Mutex::new(HashMap::new()),
            gate: None,
        }
    }

    /// Holds every reconcile until `open` turns true.
    pub fn gated(mut self, open: watch::Receiver<bool>) -> Context {
        self.gate = Some(open);
        self
    }

    /// Whether reconciles may run: the gate is open (or there is none).
    /// `false` only when the gate was dropped closed (shutting down).
    async fn wait_open(&self) -> bool {
        match &self.gate {
            None => true,
            Some(gate) => gate.clone().wait_for(|open| *open).await.is_ok(),
        }
    }

    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Context {
        self.metrics = Some(metrics);
        self
    }

    /// Records an Event on the Pod. Warnings go through kube's `Recorder`,
    /// which folds a repeat (a retried failure) into a series on the first
    /// Event; it remembers every Event for 6 minutes to do so. Normal
    /// Events here happen once per Pod (claimed, adopted, released,
    /// preserved), so they are created directly: nothing to fold, and a
    /// burst of thousands of Pods is not remembered.
    async fn event(&self, pod: &Pod, type_: EventType, reason: &str, note: String) {
        let regarding = pod.object_ref(&());
        let result = match type_ {
            EventType::Warning => {
                let ev = Event {
                    type_,
                    reason: reason.into(),
                    note: Some(note),
                    action: reason.into(),
                    secondary: None,
                };
                self.recorder.publish(&ev, &regarding).await
            }
            EventType::Normal => {
                let ev = once_event(&regarding, &self.node, reason, note, jiff::Timestamp::now());
                let ns = regarding.namespace.as_deref().unwrap_or("default");
                Api::<K8sEvent>::namespaced(self.client.clone(), ns)
                    .create(&PostParams::default(), &ev)
                    .await
                    .map(drop)
            }
        };
        if let Err(e) = result {
            warn!(error = %e, reason, "event not recorded");
        }
    }

    fn backoff(&self, pod: &Pod) -> Duration {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = f.entry(ObjectRef::from_obj(pod)).or_insert(0);
        *n = n.saturating_add(1);
        let exp = BACKOFF_START.saturating_mul(1u32 << (*n - 1).min(16));
        exp.min(BACKOFF_CAP)
    }

    fn succeeded(&self, pod: &Pod) {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        f.remove(&ObjectRef::from_obj(pod));
    }
}

/// A Normal `events.k8s.io/v1` Event as kube's `Recorder` would write it
/// (same reporting controller and instance, name `<object>.<nanos hex>`).
fn once_event(
    regarding: &ObjectReference,
    node: &str,
    reason: &str,
    note: String,
    now: jiff::Timestamp,
) -> K8sEvent {
    K8sEvent {
        action: Some(reason.into()),
        reason: Some(reason.into()),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding.clone()),
        note: Some(note),
        metadata: ObjectMeta {
            namespace: regarding.namespace.clone(),
            name: Some(format!(
                "{}.{:x}",
                regarding.name.as_deref().unwrap_or(REPORTING_CONTROLLER),
                now.as_nanosecond()
            )),
            ..Default::default()
        },
        reporting_controller: Some(REPORTING_CONTROLLER.into()),
        reporting_instance: Some(node.into()),
        type_: Some("Normal".into()),
        ..Default::default()
    }
}

fn pods_api(client: &Client, pod: &Pod) -> Api<Pod> {
    Api::namespaced(
        client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    )
}

/// Writes `patch` to pods/status unless the Pod already shows it.
async fn publish(client: &Client, pod: &Pod, patch: &Value) -> Result<()> {
    if !status::changes(pod, patch) {
        return Ok(());
    }
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    match pods_api(client, pod)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("write status of Pod {}", key(pod)), e)),
    }
}

/// Whether the apiserver already removes the object on its own: grace 0
/// was set (by our earlier delete, or `kubectl delete --force`), so it goes
/// as soon as no finalizer holds it. A second delete would only repeat
/// that; skipping it saves one write per Pod (our grace-0 delete echoes
/// back as an update before the object is gone).
fn removal_pending(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        && pod.metadata.deletion_grace_period_seconds == Some(0)
}

/// Deletes the Pod object for good: grace 0, only this generation.
async fn force_delete(client: &Client, pod: &Pod) -> Result<()> {
    if removal_pending(pod) {
        return Ok(());
    }
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match pods_api(client, pod).delete(name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("delete Pod {}", key(pod)), e)),
    }
}

/// A container is "running" unless every status is terminated or waiting.
fn has_running_container(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.state
                    .as_ref()
                    .is_none_or(|st| st.terminated.is_none() && st.waiting.is_none())
            })
        })
}

fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed") | Some("Succeeded")
    )
}

fn never_restarts(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never")
}

async fn delete_pod(pod: Arc<Pod>, ctx: &Context) -> Result<Action> {
    match ctx.provider.delete(&pod).await {
        Ok(outcome) => {
            match &outcome {
                Deleted::Preserved { id, reason } => {
                    ctx.event(
                        &pod,
                        EventType::Normal,
                        "SandboxPreserved",
                        format!("sandbox {id} preserved for the next Pod: {reason}"),
                    )
                    .await
                }
                Deleted::Released { id, reason } => {
                    ctx.event(
                        &pod,
                        EventType::Normal,
                        "SandboxReleased",
                        format!("sandbox {id} released: {reason}"),
                    )
                    .await
                }
                Deleted::Stale | Deleted::NothingHeld => {}
            }
            force_delete(&ctx.client, &pod).await?;
            Ok(Action::await_change())
        }
        Err(e) => {
            ctx.event(
                &pod,
                EventType::Warning,
                "ProviderDeleteFailed",
                format!("release failed; the claim is kept and retried: {e}"),
            )
            .await;
            Err(Error::Sandboxd(e))
        }
    }
}

async fn create_pod(pod: Arc<Pod>, ctx: &Context) -> Result<Action> {
    let started = std::time::Instant::now();
    match ctx.provider.create(&pod).await {
        Ok(created) => {
            // A resumed claim (this same Pod, after a restart) is not news:
            // no Event and no claim latency, and the status is written only
            // if it drifted, so a restart costs the apiserver next to nothing.
            let (announce, patch) = match created {
                Created::Claimed { id, status } => {
                    (Some(("Claimed", format!("claimed sandbox {id}"))), status)
                }
                Created::Adopted { id, status } => (
                    Some((
                        "Adopted",
                        format!("adopted sandbox {id}, kept from the previous Pod"),
                    )),
                    status,
                ),
                Created::Resumed { id, status } => {
                    debug!(sandbox = %id, "resumed the Pod's own claim after a restart");
                    (None, status)
                }
            };
            let metrics = ctx.metrics.as_ref().filter(|_| announce.is_some());
            if let Some(m) = metrics {
                m.claim_provider.observe(started.elapsed().as_secs_f64());
            }
            publish(&ctx.client, &pod, &patch).await?;
            if let Some(m) = metrics {
                m.claim_duration.observe(started.elapsed().as_secs_f64());
            }
            if let Some((reason, note)) = announce {
                ctx.event(&pod, EventType::Normal, reason, note).await;
            }
            Ok(Action::requeue(RESYNC))
        }
        Err(failure) => {
            let terminal = never_restarts(&pod);
            let patch = status::create_failed(terminal, failure.reason, &failure.message);
            publish(&ctx.client, &pod, &patch).await?;
            ctx.event(
                &pod,
                EventType::Warning,
                failure.reason,
                failure.message.clone(),
            )
            .await;
            if terminal {
                return Ok(Action::await_change());
            }
            Err(Error::PodCreate {
                pod: key(&pod),
                reason: failure.reason,
                message: failure.message,
            })
        }
    }
}

pub async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action> {
    let k = key(&pod);
    let span = info_span!("reconcile", node = %ctx.node, pod = %k);
    async move {
        if !ctx.wait_open().await {
            return Ok(Action::await_change());
        }
        let timer = ctx.metrics.as_ref().map(|m| {
            m.reconcile_runs.with_label_values(&["pods"]).inc();
            m.reconcile_duration
                .with_label_values(&["pods"])
                .start_timer()
        });
        let result = reconcile_inner(pod.clone(), &ctx).await;
        drop(timer);
        if result.is_ok() {
            ctx.succeeded(&pod);
        }
        result
    }
    .instrument(span)
    .await
}

/// What one reconcile does, decided from the observed Pod and the
/// provider's tracked generation for its key. Pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// A different generation is tracked under this key: it is gone, so
    /// run provider Delete for it first (decisions.md D3).
    pub retire_tracked: bool,
    pub step: Step,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Deleting, and a container may be running: authorize, then release
    /// or preserve, then delete the object (grace 0, UID precondition).
    DeleteAfterProvider,
    /// Deleting, and nothing ran (Pending) or all terminated: delete the
    /// object now.
    DeleteNow,
    /// Failed or Succeeded: never touched again.
    Leave,
    /// Ours already: keep the tracked copy and re-publish on drift.
    Republish,
    /// Claim or adopt.
    Create,
}

/// `holds_claim`: the claims store holds a claim for the Pod's key. A
/// terminating Pod with one goes through the provider even when no
/// container runs (claimed, then the process died or the status write
/// failed before Running was published): deleting it alone would leak it.
pub fn plan(pod: &Pod, tracked_uid: Option<Option<&str>>, holds_claim: bool) -> Plan {
    let uid = pod.metadata.uid.as_deref();
    let retire_tracked = tracked_uid.is_some_and(|t| t != uid);
    let still_tracked = tracked_uid.is_some() && !retire_tracked;
    let step = if pod.metadata.deletion_timestamp.is_some() {
        if has_running_container(pod) || holds_claim {
            Step::DeleteAfterProvider
        } else {
            Step::DeleteNow
        }
    } else if terminal(pod) {
        Step::Leave
    } else if still_tracked {
        Step::Republish
    } else {
        Step::Create
    };
    Plan {
        retire_tracked,
        step,
    }
}

async fn reconcile_inner(pod: Arc<Pod>, ctx: &Context) -> Result<Action> {
    let k = key(&pod);
    let tracked = ctx.provider.tracked(&k);
    let plan = plan(
        &pod,
        tracked.as_ref().map(|t| t.metadata.uid.as_deref()),
        ctx.provider.holds(&k),
    );
    if plan.retire_tracked
        && let Some(old) = tracked
    {
        info!(old_uid = ?old.metadata.uid, "Pod replaced under the same name");
        ctx.provider.delete(&old).await.map_err(Error::Sandboxd)?;
    }
    match plan.step {
        Step::DeleteNow => {
            force_delete(&ctx.client, &pod).await?;
            Ok(Action::await_change())
        }
        Step::DeleteAfterProvider => delete_pod(pod, ctx).await,
        Step::Leave => Ok(Action::await_change()),
        Step::Republish => {
            ctx.provider.update_tracked(&pod);
            if let Some((_, patch)) = ctx.provider.running_status(&pod) {
                publish(&ctx.client, &pod, &patch).await?;
            }
            Ok(Action::requeue(RESYNC))
        }
        Step::Create => create_pod(pod, ctx).await,
    }
}

pub fn error_policy(pod: Arc<Pod>, error: &Error, ctx: Arc<Context>) -> Action {
    if let Some(m) = &ctx.metrics {
        m.reconcile_failures
            .with_label_values(&["pods", error.metric_label()])
            .inc();
    }
    let wait = ctx.backoff(&pod);
    warn!(pod = %key(&pod), error = %error, retry_in = ?wait, "reconcile failed");
    Action::requeue(wait)
}

/// Provider Delete for tracked Pods that vanished from the API (deleted
/// with grace 0 by someone else, or gone while we looked away).
async fn sweep_vanished(ctx: &Context, store: &Store<Pod>) {
    let present: HashMap<String, Option<String>> = store
        .state()
        .iter()
        .map(|p| (key(p), p.metadata.uid.clone()))
        .collect();
    for k in ctx.provider.tracked_keys() {
        let Some(old) = ctx.provider.tracked(&k) else {
            continue;
        };
        let gone = match present.get(&k) {
            None => true,
            Some(uid) => *uid != old.metadata.uid,
        };
        if !gone {
            continue;
        }
        match ctx.provider.delete(&old).await {
            Ok(outcome) => info!(pod = %k, ?outcome, "tracked Pod vanished from the API"),
            Err(e) => warn!(pod = %k, error = %e, "release for a vanished Pod failed; retrying"),
        }
    }
}

/// Claims the lease watch must confirm with sandboxd: settled, with a
/// known deadline at or before `now`, for a key with a tracked Pod. A claim
/// without a deadline never expires.
pub fn expiry_candidates(
    all: Vec<(String, crate::claims::Claim, ClaimState)>,
    now: jiff::Timestamp,
    tracked: impl Fn(&str) -> bool,
) -> Vec<(String, crate::claims::Claim, ClaimState)> {
    all.into_iter()
        .filter(|(k, c, s)| {
            *s == ClaimState::Settled && c.deadline.is_some_and(|d| d <= now) && tracked(k)
        })
        .collect()
}

/// Lease expiry (behaviour.md §3.7): settled claims past their deadline
/// are confirmed against sandboxd before their Pod is marked Failed.
async fn lease_expiry_tick(ctx: &Context, store: &Store<Pod>) {
    let candidates = expiry_candidates(ctx.provider.claims.all(), jiff::Timestamp::now(), |k| {
        ctx.provider.tracked(k).is_some()
    });
    if candidates.is_empty() {
        return;
    }
    let listing = match ctx.provider.sandboxd.list().await {
        Ok(l) => l,
        Err(e) => {
            warn!(error = %e, "lease check skipped: sandboxd cannot be listed (a failed list is not an empty one)");
            return;
        }
    };
    for (k, claim, _) in candidates {
        if let Some(row) = listing.iter().find(|r| r.id == claim.id) {
            let _ = ctx
                .provider
                .claims
                .set_deadline(&k, &claim.id, row.deadline.expires_at())
                .await;
            continue;
        }
        // The key may have changed hands meanwhile.
        let still = ctx
            .provider
            .claims
            .get(&k)
            .is_some_and(|(c, _)| c.id == claim.id);
        let Some(tracked) = ctx.provider.tracked(&k) else {
            continue;
        };
        let Some(deadline) = claim.deadline else {
            continue;
        };
        if !still {
            continue;
        }
        let Some(pod) = store
            .state()
            .into_iter()
            .find(|p| key(p) == k && p.metadata.uid == tracked.metadata.uid)
        else {
            continue;
        };
        if terminal(&pod) {
            continue;
        }
        let patch = status::expired(&pod, &super::provider::view(&claim), deadline);
        match publish(&ctx.client, &pod, &patch).await {
            Ok(()) => {
                ctx.event(
                    &pod,
                    EventType::Warning,
                    "SandboxLeaseExpired",
                    format!("sandbox {} lease ended at {deadline}", claim.id),
                )
                .await
            }
            Err(e) => warn!(pod = %k, error = %e, "could not publish the expired status"),
        }
    }
}

/// Drops what nothing here reads from a Pod before it is cached, since the
/// cache holds every Pod of the node: `managedFields`, volumes and volume
/// mounts (a microVM mounts none of them; the projected ServiceAccount
/// token volume alone is about a third of a typical Pod in memory). The
/// kubelet API's `/pods` serves this cache, so it shows Pods without them.
pub fn slim(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(spec) = pod.spec.as_mut() {
        spec.volumes = None;
        let containers = spec.containers.iter_mut();
        let inits = spec.init_containers.iter_mut().flatten();
        for c in containers.chain(inits) {
            c.volume_mounts = None;
            c.volume_devices = None;
        }
    }
}

/// Waits until the store has its initial list. Polled in short slices:
/// kube-runtime's readiness signal wakes only one of several concurrent
/// waiters (the controller's own applier is one), so a lone long wait could
/// miss it.
pub async fn wait_synced(store: &Store<Pod>) {
    loop {
        match tokio::time::timeout(Duration::from_millis(200), store.wait_until_ready()).await {
            Ok(Ok(())) => return,
            Ok(Err(_)) => {
                // The writer is gone (shutdown); nothing will ever sync.
                std::future::pending::<()>().await;
            }
            Err(_) => {}
        }
    }
}

/// The Pod controller over `spec.nodeName=<node>`; its store also serves
/// the kubelet API's `/pods` and the node's readiness.
/// The Pods are [`slim`]med before the cache.
pub fn controller(client: &Client, node: &str) -> Controller<Pod> {
    let api: Api<Pod> = Api::all(client.clone());
    let wc = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let (reader, writer) = reflector::store();
    let pods = watcher(api, wc)
        .modify(slim)
        .reflect(writer)
        .applied_objects();
    Controller::for_stream(pods, reader).with_config(
        kube::runtime::controller::Config::default().concurrency(MAX_CONCURRENT_RECONCILES),
    )
}

/// Runs the controller and its side loops (vanished-Pod sweep, lease
/// expiry, claim verification) until `shutdown` fires. The side loops
/// start only once the watch has synced, so an incomplete list never makes
/// a tracked Pod look vanished.
pub async fn run(
    controller: Controller<Pod>,
    ctx: Arc<Context>,
    mut shutdown: watch::Receiver<bool>,
) {
    let store = controller.store();
    let side = {
        let ctx = Arc::clone(&ctx);
        let store = store.clone();
        let mut stop = shutdown.clone();
        async move {
            wait_synced(&store).await;
            let mut sweep = tokio::time::interval(Duration::from_secs(2));
            let mut lease = tokio::time::interval(Duration::from_secs(30));
            let mut verify = tokio::time::interval(Duration::from_secs(15));
            lease.tick().await;
            loop {
                tokio::select! {
                    _ = sweep.tick() => sweep_vanished(&ctx, &store).await,
                    _ = lease.tick() => lease_expiry_tick(&ctx, &store).await,
                    _ = verify.tick() => {
                        if !ctx.provider.claims.quarantined().is_empty()
                            && let Err(e) = ctx.provider.verify().await
                        {
                            warn!(error = %e, "claim verification skipped; retrying");
                        }
                    }
                    _ = stop.changed() => return,
                }
            }
        }
    };
    let main = controller
        .graceful_shutdown_on(async move {
            let _ = shutdown.wait_for(|s| *s).await;
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|r| {
            if let Err(e) = r {
                match e {
                    kube::runtime::controller::Error::ReconcilerFailed(..) => {}
                    // A Pod deleted between its event and its turn: normal
                    // after every grace-0 delete, nothing to do.
                    kube::runtime::controller::Error::ObjectNotFound(obj) => {
                        debug!(pod = %obj, "reconcile skipped: the Pod is gone")
                    }
                    other => warn!(error = %other, "pod controller"),
                }
            }
            futures::future::ready(())
        });
    tokio::join!(main, side);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::Claim;

    fn claim(deadline: Option<&str>) -> Claim {
        Claim {
            id: "sb_1".into(),
            token: "t".into(),
            address: String::new(),
            pod_uid: "u".into(),
            claimed_at: "2026-01-01T00:00:00Z".parse().expect("ts"),
            deadline: deadline.map(|d| d.parse().expect("ts")),
        }
    }

    fn pod(uid: &str, deleting: bool, phase: Option<&str>, running: bool) -> Pod {
        let mut v = serde_json::json!({"metadata": {"name": "p", "namespace": "ns", "uid": uid}});
        if deleting {
            v["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        }
        let mut status = serde_json::json!({});
        if let Some(p) = phase {
            status["phase"] = p.into();
        }
        if running {
            status["containerStatuses"] = serde_json::json!([{"name": "a", "ready": true,
                "restartCount": 0, "image": "x", "imageID": "sandboxd://sb",
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]);
        }
        v["status"] = status;
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn plan_table() {
        use Step::*;
        let cases = [
            // (pod, tracked uid, retire old, step)
            (pod("u", false, None, false), None, false, Create),
            (
                pod("u", false, Some("Pending"), false),
                Some(Some("u")),
                false,
                Republish,
            ),
            (
                pod("u", false, Some("Running"), true),
                Some(Some("u")),
                false,
                Republish,
            ),
            (
                pod("u2", false, None, false),
                Some(Some("u1")),
                true,
                Create,
            ),
            (
                pod("u", true, Some("Running"), true),
                Some(Some("u")),
                false,
                DeleteAfterProvider,
            ),
            // After a restart nothing is tracked: still authorized release/preserve.
            (
                pod("u", true, Some("Running"), true),
                None,
                false,
                DeleteAfterProvider,
            ),
            (
                pod("u", true, Some("Pending"), false),
                None,
                false,
                DeleteNow,
            ),
            (
                pod("u2", true, None, false),
                Some(Some("u1")),
                true,
                DeleteNow,
            ),
            (
                pod("u", false, Some("Failed"), false),
                Some(Some("u")),
                false,
                Leave,
            ),
            (
                pod("u", false, Some("Succeeded"), false),
                None,
                false,
                Leave,
            ),
        ];
        for (i, (p, tracked, retire, step)) in cases.into_iter().enumerate() {
            let got = plan(&p, tracked, false);
            assert_eq!(
                got,
                Plan {
                    retire_tracked: retire,
                    step
                },
                "case {i}"
            );
        }
    }

    /// Reliability finding: a terminating Pod that never showed a running
    /// container but whose key holds a stored claim (killed between commit
    /// and the Running write) goes through the provider, not straight to
    /// deletion, which leaked the sandbox.
    #[test]
    fn terminating_pod_with_a_stored_claim_goes_through_the_provider() {
        let p = pod("u", true, Some("Pending"), false);
        assert_eq!(plan(&p, None, false).step, Step::DeleteNow);
        assert_eq!(plan(&p, None, true).step, Step::DeleteAfterProvider);
        let done = pod("u", false, Some("Failed"), false);
        assert_eq!(plan(&done, None, true).step, Step::Leave);
    }

    #[test]
    fn slim_keeps_what_reconcile_and_status_read() {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u",
                "annotations": {"sandbox.cocoonstack.io/template": "base:24.04"},
                "ownerReferences": [{"apiVersion": "agents.x-k8s.io/v1alpha1", "kind": "Sandbox",
                    "name": "s", "uid": "o", "controller": true}],
                "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "spec": {"nodeName": "n", "restartPolicy": "Never",
                "containers": [{"name": "a", "image": "img", "env": [{"name": "K", "value": "V"}],
                    "volumeMounts": [{"name": "tok", "mountPath": "/var/run/secrets"}]}],
                "initContainers": [{"name": "i", "image": "img",
                    "volumeMounts": [{"name": "tok", "mountPath": "/x"}]}],
                "volumes": [{"name": "tok", "projected": {"sources": []}}]},
            "status": {"phase": "Running"},
        }))
        .expect("pod");
        let before = serde_json::to_value(&p).expect("json");
        slim(&mut p);
        let after = serde_json::to_value(&p).expect("json");
        assert!(after["metadata"].get("managedFields").is_none());
        assert!(after["spec"].get("volumes").is_none());
        assert!(after["spec"]["containers"][0].get("volumeMounts").is_none());
        assert!(
            after["spec"]["initContainers"][0]
                .get("volumeMounts")
                .is_none()
        );
        // Everything else is as it was.
        for path in [
            "/metadata/annotations",
            "/metadata/ownerReferences",
            "/metadata/uid",
            "/spec/nodeName",
            "/spec/restartPolicy",
            "/spec/containers/0/image",
            "/spec/containers/0/env",
            "/status",
        ] {
            assert_eq!(after.pointer(path), before.pointer(path), "{path}");
        }
    }

    #[test]
    fn once_event_matches_what_the_recorder_writes() {
        let p = pod("u", false, Some("Running"), true);
        let now: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().expect("ts");
        let ev = once_event(
            &p.object_ref(&()),
            "node-1",
            "Claimed",
            "claimed sandbox sb".into(),
            now,
        );
        assert_eq!(ev.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(
            ev.metadata.name,
            Some(format!("p.{:x}", now.as_nanosecond()))
        );
        assert_eq!(ev.type_.as_deref(), Some("Normal"));
        assert_eq!(
            (ev.reason.as_deref(), ev.action.as_deref()),
            (Some("Claimed"), Some("Claimed"))
        );
        assert_eq!(ev.reporting_controller.as_deref(), Some("vk-sandbox"));
        assert_eq!(ev.reporting_instance.as_deref(), Some("node-1"));
        let regarding = ev.regarding.expect("regarding");
        assert_eq!(
            (
                regarding.name.as_deref(),
                regarding.uid.as_deref(),
                regarding.kind.as_deref()
            ),
            (Some("p"), Some("u"), Some("Pod"))
        );
        assert!(ev.series.is_none());
    }

    #[test]
    fn grace_zero_means_the_apiserver_removes_it() {
        let mut p = pod("u", true, Some("Running"), true);
        p.metadata.deletion_grace_period_seconds = Some(30);
        assert!(!removal_pending(&p));
        p.metadata.deletion_grace_period_seconds = Some(0);
        assert!(removal_pending(&p));
        // Not deleting at all: never pending, whatever the field says.
        let mut live = pod("u", false, Some("Running"), true);
        live.metadata.deletion_grace_period_seconds = Some(0);
        assert!(!removal_pending(&live));
    }

    #[test]
    fn expiry_candidates_need_a_past_deadline_a_settled_row_and_a_tracked_pod() {
        let now: jiff::Timestamp = "2026-06-01T00:00:00Z".parse().expect("ts");
        let rows = vec![
            ("a/none".to_string(), claim(None), ClaimState::Settled),
            (
                "a/past".to_string(),
                claim(Some("2026-05-01T00:00:00Z")),
                ClaimState::Settled,
            ),
            (
                "a/now".to_string(),
                claim(Some("2026-06-01T00:00:00Z")),
                ClaimState::Settled,
            ),
            (
                "a/future".to_string(),
                claim(Some("2026-07-01T00:00:00Z")),
                ClaimState::Settled,
            ),
            (
                "a/quarantined".to_string(),
                claim(Some("2026-05-01T00:00:00Z")),
                ClaimState::Quarantined,
            ),
            (
                "a/untracked".to_string(),
                claim(Some("2026-05-01T00:00:00Z")),
                ClaimState::Settled,
            ),
        ];
        let keys: Vec<String> = expiry_candidates(rows, now, |k| k != "a/untracked")
            .into_iter()
            .map(|(k, _, _)| k)
            .collect();
        // Test 44: no deadline, never a candidate.
        assert_eq!(keys, vec!["a/past".to_string(), "a/now".to_string()]);
    }
}
