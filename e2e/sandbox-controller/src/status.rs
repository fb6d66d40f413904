//! The Sandbox status a Pod observation implies (behaviour.md §10.3), as a
//! pure function.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::pod::{NAME_HASH_LABEL, name_hash};
use crate::types::{OperatingMode, Sandbox, SandboxStatus};

pub const READY: &str = "Ready";
pub const FINISHED: &str = "Finished";
pub const SUSPENDED: &str = "Suspended";

/// Why the controller holds no Pod for the Sandbox, when that is not just
/// "not created yet".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// The runtime mutator (or a missing field) refused the Pod.
    Rejected(String),
    /// A Pod with the name exists but another owner controls it.
    Conflict(String),
    /// `shutdownTime` has passed.
    Expired,
}

/// One condition before timestamps: status, reason, message.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Cond {
    status: bool,
    reason: &'static str,
    message: String,
}

fn cond(status: bool, reason: &'static str, message: impl Into<String>) -> Cond {
    Cond {
        status,
        reason,
        message: message.into(),
    }
}

pub fn pod_ips(pod: &Pod) -> Vec<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ips.as_ref())
        .map(|ips| {
            ips.iter()
                .map(|i| i.ip.clone())
                .filter(|ip| !ip.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

fn pod_condition_true(pod: &Pod, type_: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

fn pod_detail(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let reason = status.and_then(|s| s.reason.as_deref()).unwrap_or("");
    let message = status.and_then(|s| s.message.as_deref()).unwrap_or("");
    match (reason.is_empty(), message.is_empty()) {
        (true, true) => String::new(),
        (false, true) => format!(": {reason}"),
        (true, false) => format!(": {message}"),
        (false, false) => format!(": {reason}: {message}"),
    }
}

/// Ready and Finished as the Pod's state implies them.
fn from_pod(pod: &Pod) -> (Cond, Cond) {
    let name = pod.name_any();
    let not_finished = cond(
        false,
        "PodNotFinished",
        format!("Pod {name} has not finished"),
    );
    if pod.metadata.deletion_timestamp.is_some() {
        return (
            cond(
                false,
                "PodTerminating",
                format!("Pod {name} is terminating"),
            ),
            not_finished,
        );
    }
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    let detail = pod_detail(pod);
    match phase {
        "Failed" => {
            let msg = format!("Pod {name} failed{detail}");
            (cond(false, "PodFailed", &msg), cond(true, "PodFailed", msg))
        }
        "Succeeded" => {
            let msg = format!("Pod {name} succeeded{detail}");
            (
                cond(false, "PodSucceeded", &msg),
                cond(true, "PodSucceeded", msg),
            )
        }
        "Running" => {
            let ips = pod_ips(pod);
            let ready = if !pod_condition_true(pod, "Ready") {
                cond(
                    false,
                    "PodNotReady",
                    format!("Pod {name} is Running but not Ready"),
                )
            } else if ips.is_empty() {
                cond(
                    false,
                    "PodNoIPs",
                    format!("Pod {name} is Ready but has no podIPs yet"),
                )
            } else {
                cond(
                    true,
                    "PodReady",
                    format!("Pod {name} is Ready at {}", ips.join(",")),
                )
            };
            (ready, not_finished)
        }
        other => {
            let where_ = match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
                Some(node) if !node.is_empty() => format!("on node {node}"),
                _ => "not bound to a node yet".to_string(),
            };
            (
                cond(
                    false,
                    "PodPending",
                    format!("Pod {name} is {other}, {where_}{detail}"),
                ),
                not_finished,
            )
        }
    }
}

/// The status the Sandbox should show, given its (controlled) Pod if any,
/// why there is none when that is known, and the time now. Conditions keep
/// their `lastTransitionTime` while their status does not change;
/// `service`/`serviceFQDN` (not managed here) are carried over.
pub fn compute_status(
    sandbox: &Sandbox,
    pod: Option<&Pod>,
    blocker: Option<&Blocker>,
    now: Timestamp,
) -> SandboxStatus {
    let pod_name = crate::pod::pod_name(sandbox);
    let suspended_mode = sandbox.operating_mode() == OperatingMode::Suspended;
    let (ready, finished) = match (pod, blocker) {
        (Some(p), _) => from_pod(p),
        (None, Some(Blocker::Rejected(m))) => (
            cond(false, "PodRejected", m.clone()),
            cond(false, "PodNotFinished", "no Pod"),
        ),
        (None, Some(Blocker::Conflict(m))) => (
            cond(false, "PodConflict", m.clone()),
            cond(false, "PodNotFinished", "no Pod"),
        ),
        (None, Some(Blocker::Expired)) => {
            let msg = "shutdownTime has passed; the Pod is deleted";
            (
                cond(false, "ShutdownTimeReached", msg),
                cond(true, "ShutdownTimeReached", msg),
            )
        }
        (None, None) if suspended_mode => (
            cond(
                false,
                "Suspended",
                "the Sandbox is suspended; its Pod is deleted",
            ),
            cond(false, "PodNotFinished", "no Pod"),
        ),
        (None, None) => (
            cond(
                false,
                "PodMissing",
                format!("Pod {pod_name} does not exist yet"),
            ),
            cond(false, "PodNotFinished", "no Pod"),
        ),
    };
    let suspended = match (suspended_mode, pod.is_some()) {
        (true, false) => cond(true, "Suspended", "operatingMode is Suspended"),
        (true, true) => cond(
            false,
            "Suspending",
            format!("operatingMode is Suspended; Pod {pod_name} is being deleted"),
        ),
        (false, _) => cond(false, "Running", "operatingMode is Running"),
    };

    let previous = sandbox.status.clone().unwrap_or_default();
    let now = Time(Timestamp::from_second(now.as_second()).unwrap_or(now));
    let generation = sandbox.metadata.generation;
    let conditions = [(READY, ready), (FINISHED, finished), (SUSPENDED, suspended)]
        .into_iter()
        .map(|(type_, c)| {
            let status = if c.status { "True" } else { "False" };
            let last_transition_time = previous
                .condition(type_)
                .filter(|old| old.status == status)
                .map(|old| old.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: type_.into(),
                status: status.into(),
                reason: c.reason.into(),
                message: c.message,
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect();

    SandboxStatus {
        service_fqdn: previous.service_fqdn,
        service: previous.service,
        conditions,
        selector: Some(format!(
            "{NAME_HASH_LABEL}={}",
            name_hash(&sandbox.name_any())
        )),
        pod_ips: pod.map(pod_ips).unwrap_or_default(),
        node_name: pod
            .and_then(|p| p.spec.as_ref())
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
    }
}

/// A JSON merge patch that sets the managed status fields to `status`,
/// removing those it leaves empty. `service`/`serviceFQDN` are untouched.
pub fn status_patch(status: &SandboxStatus) -> Value {
    let null_if_empty = |v: &[String]| {
        if v.is_empty() { Value::Null } else { json!(v) }
    };
    json!({"status": {
        "conditions": status.conditions,
        "selector": status.selector,
        "podIPs": null_if_empty(&status.pod_ips),
        "nodeName": status.node_name,
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(extra_spec: Value) -> Sandbox {
        let mut spec = json!({"podTemplate": {"spec": {"containers": [{"name": "a", "image": "base:24.04"}]}}});
        if let (Value::Object(s), Value::Object(e)) = (&mut spec, extra_spec) {
            s.extend(e);
        }
        serde_json::from_value(json!({
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": "demo", "namespace": "ns", "uid": "u1", "generation": 3},
            "spec": spec
        }))
        .expect("sandbox")
    }

    fn pod(status: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "demo", "namespace": "ns"},
            "spec": {"nodeName": "vk-1", "containers": [{"name": "a", "image": "base:24.04"}]},
            "status": status
        }))
        .expect("pod")
    }

    fn running(ready: bool, ips: &[&str]) -> Pod {
        let ips: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        pod(json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}],
            "podIP": ips.first().and_then(|v| v.get("ip")).cloned().unwrap_or(Value::Null),
            "podIPs": ips
        }))
    }

    fn now() -> Timestamp {
        "2030-01-01T00:00:00Z".parse().expect("ts")
    }

    fn get<'a>(s: &'a SandboxStatus, t: &str) -> &'a Condition {
        s.condition(t).expect("condition present")
    }

    #[test]
    fn ready_needs_running_ready_and_pod_ips() {
        let sb = sandbox(json!({}));
        let s = compute_status(&sb, Some(&running(true, &["10.0.0.5"])), None, now());
        let r = get(&s, READY);
        assert_eq!((r.status.as_str(), r.reason.as_str()), ("True", "PodReady"));
        assert_eq!(r.observed_generation, Some(3));
        assert_eq!(s.pod_ips, vec!["10.0.0.5".to_string()]);
        assert_eq!(s.node_name.as_deref(), Some("vk-1"));
        assert_eq!(
            s.selector,
            Some(format!(
                "agents.x-k8s.io/sandbox-name-hash={}",
                name_hash("demo")
            ))
        );
        assert_eq!(get(&s, FINISHED).status, "False");
        assert_eq!(get(&s, SUSPENDED).status, "False");

        let s = compute_status(&sb, Some(&running(true, &[])), None, now());
        let r = get(&s, READY);
        assert_eq!(
            (r.status.as_str(), r.reason.as_str()),
            ("False", "PodNoIPs")
        );
        assert!(
            r.message
                .contains("Pod demo is Ready but has no podIPs yet"),
            "{}",
            r.message
        );
        assert!(s.pod_ips.is_empty());

        let s = compute_status(&sb, Some(&running(false, &["10.0.0.5"])), None, now());
        assert_eq!(get(&s, READY).reason, "PodNotReady");
        assert_eq!(get(&s, READY).status, "False");

        let pending =
            pod(json!({"phase": "Pending", "reason": "ProviderFailed", "message": "boom"}));
        let s = compute_status(&sb, Some(&pending), None, now());
        let r = get(&s, READY);
        assert_eq!(r.reason, "PodPending");
        assert!(r.message.contains("ProviderFailed: boom"), "{}", r.message);
    }

    #[test]
    fn failed_pod_finishes_the_sandbox() {
        let sb = sandbox(json!({}));
        let failed = pod(
            json!({"phase": "Failed", "reason": "SandboxLeaseExpired", "message": "lease ended"}),
        );
        let s = compute_status(&sb, Some(&failed), None, now());
        let r = get(&s, READY);
        let f = get(&s, FINISHED);
        assert_eq!(
            (r.status.as_str(), r.reason.as_str()),
            ("False", "PodFailed")
        );
        assert_eq!(
            (f.status.as_str(), f.reason.as_str()),
            ("True", "PodFailed")
        );
        assert!(f.message.contains("SandboxLeaseExpired"), "{}", f.message);
    }

    #[test]
    fn no_pod_states() {
        let sb = sandbox(json!({}));
        let s = compute_status(&sb, None, None, now());
        assert_eq!(get(&s, READY).reason, "PodMissing");
        assert!(s.pod_ips.is_empty() && s.node_name.is_none());

        let s = compute_status(&sb, None, Some(&Blocker::Rejected("no".into())), now());
        assert_eq!(get(&s, READY).reason, "PodRejected");
        assert_eq!(get(&s, READY).message, "no");

        let s = compute_status(&sb, None, Some(&Blocker::Expired), now());
        assert_eq!(get(&s, READY).reason, "ShutdownTimeReached");
        assert_eq!(get(&s, FINISHED).status, "True");

        let sb = sandbox(json!({"operatingMode": "Suspended"}));
        let s = compute_status(&sb, None, None, now());
        assert_eq!(get(&s, READY).reason, "Suspended");
        assert_eq!(get(&s, SUSPENDED).status, "True");
        let s = compute_status(&sb, Some(&running(true, &["10.0.0.5"])), None, now());
        assert_eq!(get(&s, SUSPENDED).reason, "Suspending");
    }

    #[test]
    fn transition_time_is_kept_while_status_is_unchanged() {
        let mut sb = sandbox(json!({}));
        let first = compute_status(&sb, None, None, now());
        sb.status = Some(first.clone());
        let later: Timestamp = "2030-01-01T00:05:00Z".parse().expect("ts");
        // Still not ready (other reason): same transition time, whole status equal.
        let again = compute_status(&sb, Some(&running(false, &[])), None, later);
        assert_eq!(
            get(&again, READY).last_transition_time,
            get(&first, READY).last_transition_time
        );
        // Ready: a new transition time.
        let ready = compute_status(&sb, Some(&running(true, &["1.2.3.4"])), None, later);
        assert_eq!(get(&ready, READY).last_transition_time, Time(later));
        // A stable observation yields an identical status (no write).
        sb.status = Some(ready.clone());
        assert_eq!(
            compute_status(&sb, Some(&running(true, &["1.2.3.4"])), None, later),
            ready
        );
    }

    #[test]
    fn status_patch_clears_what_is_gone() {
        let sb = sandbox(json!({}));
        let s = compute_status(&sb, None, None, now());
        let patch = status_patch(&s);
        assert_eq!(patch["status"]["podIPs"], Value::Null);
        assert_eq!(patch["status"]["nodeName"], Value::Null);
        assert!(patch["status"].get("service").is_none());
        assert_eq!(
            patch["status"]["conditions"].as_array().map(Vec::len),
            Some(3)
        );
    }
}
