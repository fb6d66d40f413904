//! Every write vk-sandbox makes to a Pod: its status (JSON merge patches of
//! `pods/status`) and the final delete. Each write is conditional on the Pod
//! it was computed for, so nothing computed for one Pod lands on its
//! same-name successor, and each names the `vk-sandbox` field manager.

use std::sync::Arc;

use super::pod::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};
use serde_json::Value;

use super::status;
use crate::identity::FIELD_MANAGER;
use crate::metrics::Metrics;
use crate::{Error, Result};

/// How far a status write is tied to the Pod it was computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Only this Pod (its UID), whatever else changed: for a status computed
    /// from the claim and the Pod's immutable spec (Running after a claim,
    /// a failed create).
    Uid,
    /// Only this version of this Pod (UID and resourceVersion): for a status
    /// computed from what the cache showed (a re-publish, lease expiry). A
    /// newer version makes the write fail with a conflict: the caller waits
    /// for the watch to bring that version and decides again from it (a
    /// re-read from the cache, never an overwrite, and no extra GET).
    Fresh,
}

/// What a status write did.
#[derive(Debug, Clone, PartialEq)]
pub enum Written {
    /// The Pod already shows the status: nothing was sent.
    Unchanged,
    /// Sent; the Pod as the apiserver stored it.
    Stored(Arc<Pod>),
    /// The Pod is gone, or another Pod now has its name.
    Gone,
    /// The Pod changed since it was read ([`Guard::Fresh`] only).
    Conflict,
}

impl Written {
    fn label(&self) -> &'static str {
        match self {
            Written::Unchanged => "unchanged",
            Written::Stored(_) => "written",
            Written::Gone => "gone",
            Written::Conflict => "conflict",
        }
    }
}

pub fn pods_api(client: &Client, pod: &Pod) -> Api<Pod> {
    Api::namespaced(
        client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    )
}

/// `patch` with the preconditions of `guard` for `pod` added to its
/// metadata: the apiserver refuses a patch whose `uid` differs from the
/// stored object's (it is immutable), and one whose `resourceVersion` is
/// not the stored one (conflict). Pure.
pub fn guarded(patch: &Value, pod: &Pod, guard: Guard) -> Value {
    let mut body = patch.clone();
    if let Some(obj) = body.as_object_mut() {
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(meta) = meta.as_object_mut() {
            if let Some(uid) = &pod.metadata.uid {
                meta.insert("uid".into(), Value::String(uid.clone()));
            }
            if guard == Guard::Fresh
                && let Some(rv) = &pod.metadata.resource_version
            {
                meta.insert("resourceVersion".into(), Value::String(rv.clone()));
            }
        }
    }
    body
}

/// Whether an apiserver refusal says the write was for another Pod (or
/// none): 404, or a `uid` that no longer matches (422 "field is
/// immutable" on `metadata.uid`).
fn refused_as_gone(status: &kube::core::Status) -> bool {
    status.code == 404
        || (status.code == 422
            && status
                .details
                .as_ref()
                .is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid")))
}

/// Writes `patch` to `pod`'s status unless the Pod already shows it.
pub async fn write_status(
    client: &Client,
    metrics: &Metrics,
    pod: &Pod,
    patch: &Value,
    guard: Guard,
) -> Result<Written> {
    if !status::changes(pod, patch) {
        return Ok(Written::Unchanged);
    }
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let body = guarded(patch, pod, guard);
    let sent = std::time::Instant::now();
    let result = match pods_api(client, pod)
        .patch_status(name, &pp, &Patch::Merge(&body))
        .await
    {
        Ok(stored) => Ok(Written::Stored(Arc::new(stored))),
        Err(kube::Error::Api(s)) if refused_as_gone(&s) => Ok(Written::Gone),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Written::Conflict),
        Err(e) => Err(Error::kube(format!("write status of Pod {}", pod.key()), e)),
    };
    let (outcome, took) = (
        result.as_ref().map_or("error", |w| w.label()),
        sent.elapsed(),
    );
    // The round trip as this process sees it: under a burst, set against
    // the apiserver's own request duration (or its audit log) it tells a
    // slow apiserver from a slow client (docs/benchmarks.md).
    tracing::debug!(elapsed = ?took, outcome, "status write answered");
    metrics.pod_status_write(outcome, took);
    result
}

/// Deletes the Pod object for good: grace 0, only this generation (UID
/// precondition). Nothing is sent while the apiserver is removing it
/// already; then the answer is `Removal::Pending` (look again later).
pub async fn force_delete(client: &Client, pod: &Pod) -> Result<Removal> {
    if pod.removal_pending(jiff::Timestamp::now()) {
        return Ok(Removal::Pending);
    }
    delete_this(client, pod, Some(0)).await
}

/// Deletes this very Pod (UID precondition) with its own grace period
/// (`None`) or `grace` seconds; gone or replaced already is done.
pub async fn delete_this(client: &Client, pod: &Pod, grace: Option<u32>) -> Result<Removal> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let dp = DeleteParams {
        grace_period_seconds: grace,
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match pods_api(client, pod).delete(name, &dp).await {
        Ok(_) => Ok(Removal::Sent),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Removal::Sent),
        Err(e) => Err(Error::kube(format!("delete Pod {}", pod.key()), e)),
    }
}

/// What [`force_delete`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The delete went out (or the object is gone already).
    Sent,
    /// Left to the apiserver's own grace-0 removal, which may yet fail.
    Pending,
}

impl Removal {
    /// The reconcile's next step: a pending removal is looked at again
    /// once it should be over, so a removal cut half-way is sent again.
    pub fn then(self) -> kube::runtime::controller::Action {
        match self {
            Removal::Sent => kube::runtime::controller::Action::await_change(),
            Removal::Pending => kube::runtime::controller::Action::requeue(
                crate::pods::pod::REMOVAL_WAIT + std::time::Duration::from_secs(1),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "resourceVersion": "42"}
        }))
        .expect("pod")
    }

    #[test]
    fn guards_add_uid_and_only_fresh_adds_the_version() {
        let patch =
            json!({"metadata": {"annotations": {"a": "b"}}, "status": {"phase": "Running"}});
        let uid = guarded(&patch, &pod(), Guard::Uid);
        assert_eq!(uid["metadata"]["uid"], "u-1");
        assert_eq!(uid["metadata"]["annotations"]["a"], "b");
        assert!(uid["metadata"].get("resourceVersion").is_none());
        assert_eq!(uid["status"], patch["status"]);
        let fresh = guarded(&patch, &pod(), Guard::Fresh);
        assert_eq!(fresh["metadata"]["uid"], "u-1");
        assert_eq!(fresh["metadata"]["resourceVersion"], "42");
        // A patch without metadata gets it.
        let bare = guarded(&json!({"status": {}}), &pod(), Guard::Uid);
        assert_eq!(bare["metadata"], json!({"uid": "u-1"}));
    }

    #[test]
    fn a_uid_refusal_reads_as_gone_other_refusals_do_not() {
        let status = |code: u16, field: Option<&str>| -> kube::core::Status {
            serde_json::from_value(json!({
                "status": "Failure", "code": code, "reason": "Invalid", "message": "m",
                "details": {"causes": field.map(|f| vec![json!({"field": f, "message": "field is immutable"})]).unwrap_or_default()}
            }))
            .expect("status")
        };
        assert!(refused_as_gone(&status(404, None)));
        assert!(refused_as_gone(&status(422, Some("metadata.uid"))));
        assert!(!refused_as_gone(&status(422, Some("status.podIP"))));
        assert!(!refused_as_gone(&status(409, None)));
        assert!(!refused_as_gone(&status(500, None)));
    }
}
