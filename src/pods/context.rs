//! What every Pod reconcile shares: the provider, the Kubernetes client,
//! Events, per-Pod back-off, and the gate that holds reconciles until the
//! Node is registered.

use super::owners::Owners;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;

use super::pod::Pod;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, Resource};
use tokio::sync::{Semaphore, watch};
use tracing::{Instrument, warn};

use super::provider::Provider;
use crate::health::Health;
use crate::identity::{FIELD_MANAGER, REPORTING_CONTROLLER};
use crate::metrics::Metrics;

/// Normal Events [`Context::announce`] has waiting to be posted (in the
/// Events' token bucket or on the wire), at most; past it, the announcing
/// reconcile waits for one to finish: nothing is dropped, and a queue
/// longer than this slows the Pods down instead of growing. The kubelet's
/// recorder queues 1000 and drops the rest.
pub const ANNOUNCING_MAX: usize = 1024;

const BACKOFF_START: Duration = Duration::from_millis(500);
const BACKOFF_CAP: Duration = Duration::from_secs(180);

/// Event reasons. Failures use virtual-kubelet's reasons, which clusters
/// running the Go implementation already alert and filter on; the precise
/// cause is the Event's action and the first word of its note. The mapping
/// is listed in docs/pod-contract.md.
pub mod reason {
    pub const CLAIMED: &str = "Claimed";
    pub const ADOPTED: &str = "Adopted";
    pub const PRESERVED: &str = "SandboxPreserved";
    pub const RELEASED: &str = "SandboxReleased";
    pub const LEFT_TO_EXPIRE: &str = "SandboxLeftToExpire";
    pub const LEASE_EXPIRED: &str = "SandboxLeaseExpired";
    /// virtual-kubelet's reason for a failed provider create.
    pub const CREATE_FAILED: &str = "ProviderCreateFailed";
    /// virtual-kubelet's reason for a failed provider delete.
    pub const DELETE_FAILED: &str = "ProviderDeleteFailed";
    /// The cause of a failed release (the action of a `ProviderDeleteFailed`).
    pub const RELEASE_FAILED: &str = "ReleaseFailed";
}

pub struct Context {
    pub provider: Arc<Provider>,
    /// Who owns a Pod or a claim, and whether it lives (the provider's).
    pub owners: Arc<Owners>,
    pub client: Client,
    pub recorder: Recorder,
    pub node: String,
    pub metrics: Arc<Metrics>,
    /// Liveness: reconciles and side loops report here.
    pub health: Option<Arc<Health>>,
    failures: Mutex<HashMap<ObjectRef<Pod>, u32>>,
    /// Reconciles wait until this turns true (the Node is registered), so
    /// the Node's own writes are not queued behind every Pod's.
    gate: Option<watch::Receiver<bool>>,
    /// One permit per Event [`Context::announce`] is posting.
    announcing: Arc<Semaphore>,
    /// `--hand-back-after`: how long a Pod may wait here for capacity
    /// before it is handed back (`None`: never; see [`super::handback`]).
    pub hand_back_after: Option<Duration>,
    /// The NodeInventories (which node holds which key's VM), to check
    /// before claiming (`None`: not watched; see [`super::elsewhere`]), and
    /// `--vm-holder-gone-after`.
    pub holders: Option<(Arc<dyn super::elsewhere::VmHolders>, Duration)>,
}

impl Context {
    pub fn new(
        client: Client,
        provider: Arc<Provider>,
        node: &str,
        metrics: Arc<Metrics>,
    ) -> Context {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: REPORTING_CONTROLLER.into(),
                instance: Some(node.to_string()),
            },
        );
        Context {
            owners: Arc::clone(provider.owners()),
            provider,
            client,
            recorder,
            node: node.to_string(),
            metrics,
            health: None,
            failures: Mutex::new(HashMap::new()),
            gate: None,
            announcing: Arc::new(Semaphore::new(ANNOUNCING_MAX)),
            hand_back_after: None,
            holders: None,
        }
    }

    /// Checks the NodeInventories in `index` before claiming: a Pod whose
    /// VM another node holds is handed back while that node lives, and
    /// claimed for once it has been gone `gone_after`.
    pub fn checking_holders(
        mut self,
        index: Arc<dyn super::elsewhere::VmHolders>,
        gone_after: Duration,
    ) -> Context {
        self.holders = Some((index, gone_after));
        self
    }

    /// Hands back Pods that waited `grace` for capacity (`None`: never).
    pub fn handing_back_after(mut self, grace: Option<Duration>) -> Context {
        self.hand_back_after = grace;
        self
    }

    /// Holds every reconcile until `open` turns true.
    pub fn gated(mut self, open: watch::Receiver<bool>) -> Context {
        self.gate = Some(open);
        self
    }

    /// Whether reconciles may run: the gate is open (or there is none).
    /// `false` only when the gate was dropped closed (shutting down).
    pub async fn wait_open(&self) -> bool {
        match &self.gate {
            None => true,
            Some(gate) => gate.clone().wait_for(|open| *open).await.is_ok(),
        }
    }

    pub fn with_health(mut self, health: Arc<Health>) -> Context {
        self.health = Some(health);
        self
    }

    /// A Normal Event on the Pod (claimed, adopted, woken, released,
    /// preserved), posted without waiting: see [`Context::announce_about`].
    pub async fn announce(&self, pod: &Pod, reason: &str, note: String) {
        self.announce_about(&pod.object_ref(&()), reason, note)
            .await;
    }

    /// A Normal Event about `regarding` (a Pod, or a Sandbox whose Pod is
    /// gone), posted by a task of its own, as a kubelet's Events go through
    /// a queue: a reconcile gives its slot back (the controller runs a
    /// bounded number at once) as soon as its own work is stored, and an
    /// upkeep turn goes on; under a burst an Event's round trip is about as
    /// long as a status write's. At most `ANNOUNCING_MAX` wait; beyond, the
    /// caller waits for a place (nothing is dropped).
    ///
    /// Each of these happens once per Pod, so it is created directly rather
    /// than through kube's `Recorder`, which remembers every Event for 6
    /// minutes to fold repeats: nothing to fold here, and a burst of
    /// thousands of Pods is not remembered.
    pub async fn announce_about(&self, regarding: &ObjectReference, reason: &str, note: String) {
        let ev = once_event(regarding, &self.node, reason, note, jiff::Timestamp::now());
        let Ok(permit) = Arc::clone(&self.announcing).acquire_owned().await else {
            return;
        };
        let client = self.client.clone();
        tokio::spawn(
            async move {
                post(&client, &ev).await;
                drop(permit);
            }
            .in_current_span(),
        );
    }

    /// Returns once every Event [`Context::announce`] started is posted
    /// (or failed).
    pub async fn announced(&self) {
        if let Ok(all) = self.announcing.acquire_many(ANNOUNCING_MAX as u32).await {
            drop(all);
        }
    }

    /// A Warning Event on the Pod, through kube's `Recorder`, which folds a
    /// repeat (a retried failure) into a series on the first Event.
    /// `action` says what was being done (the precise cause, when `reason`
    /// is virtual-kubelet's generic one).
    pub async fn warning(&self, pod: &Pod, reason: &str, action: &str, note: String) {
        self.warning_about(&pod.object_ref(&()), reason, action, note)
            .await;
    }

    /// [`Context::warning`] about `regarding` (a Pod, or a Sandbox whose
    /// Pod is gone).
    pub async fn warning_about(
        &self,
        regarding: &ObjectReference,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let ev = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, regarding).await {
            warn!(error = %e, reason, "event not recorded");
        }
    }

    /// The next retry delay for `pod`: 0.5 s doubling to 3 min.
    pub fn backoff(&self, pod: &Pod) -> Duration {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = f.entry(ObjectRef::from_obj(pod)).or_insert(0);
        *n = n.saturating_add(1);
        crate::backoff::nth(BACKOFF_START, BACKOFF_CAP, *n)
    }

    pub fn succeeded(&self, pod: &Pod) {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        f.remove(&ObjectRef::from_obj(pod));
    }

    /// Forgets the back-off of Pods that no longer exist, so the map does
    /// not grow with every Pod that once failed and was then deleted.
    pub fn prune_backoff(&self, present: impl Fn(&ObjectRef<Pod>) -> bool) {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        f.retain(|obj, _| present(obj));
    }
}

/// Create `ev`; a failure is logged, never retried (an Event is a note,
/// not state).
async fn post(client: &Client, ev: &K8sEvent) {
    let ns = ev.metadata.namespace.as_deref().unwrap_or("default");
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    if let Err(e) = Api::<K8sEvent>::namespaced(client.clone(), ns)
        .create(&pp, ev)
        .await
    {
        warn!(error = %e, reason = ev.reason.as_deref().unwrap_or(""), "event not recorded");
    }
}

/// A Normal `events.k8s.io/v1` Event as kube's `Recorder` would write it
/// (same reporting controller and instance, name `<object>.<nanos hex>`).
pub fn once_event(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": uid}
        }))
        .expect("pod")
    }

    #[test]
    fn once_event_matches_what_the_recorder_writes() {
        let p = pod("u");
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
        assert_eq!(ev.note.as_deref(), Some("claimed sandbox sb"));
        assert_eq!(ev.event_time, Some(MicroTime(now)));
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
}
