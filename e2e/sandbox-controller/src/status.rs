//! The Sandbox status a Pod observation implies, as a pure function, with
//! the conditions, reasons and messages of the upstream agent-sandbox
//! controller (tests/e2e_controller_parity.rs compares the two):
//!
//! - `Suspended`, always present: `False/NotSuspended`, or in Suspended mode
//!   `True/PodTerminated` once the Pod is gone, `False/PodTerminating`
//!   while it goes;
//! - `Finished`, only while the Pod has ended: `True/PodSucceeded` or
//!   `True/PodFailed`;
//! - `PodScheduled`, only while there is a Pod: the Pod's own condition
//!   mirrored (`Unknown/PodSchedulingUnknown` until it has one);
//! - `Ready`: `True/DependenciesReady` when the Pod is Running, Ready and
//!   has podIPs; otherwise `False` with `DependenciesNotReady`,
//!   `PodSucceeded`, `PodFailed`, `SandboxSuspended`, `SandboxExpired` or
//!   `ReconcilerError`.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

use crate::pod::{NAME_HASH_LABEL, name_hash};
use crate::types::{OperatingMode, Sandbox, SandboxStatus};

pub const READY: &str = "Ready";
pub const FINISHED: &str = "Finished";
pub const SUSPENDED: &str = "Suspended";
pub const POD_SCHEDULED: &str = "PodScheduled";

/// Why the controller holds no Pod for the Sandbox, when that is not just
/// "not created yet".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// The runtime mutator (an opt-in mode) or a missing field refused the
    /// Pod.
    Rejected(String),
    /// A Pod with the name exists but another owner controls it.
    Conflict(String),
    /// `shutdownTime` has passed.
    Expired,
}

/// One condition before timestamps.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Cond {
    type_: &'static str,
    status: &'static str,
    reason: String,
    message: String,
}

fn cond(type_: &'static str, status: &'static str, reason: &str, message: &str) -> Cond {
    Cond {
        type_,
        status,
        reason: reason.to_string(),
        message: message.to_string(),
    }
}

pub fn pod_ips(pod: &Pod) -> Vec<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ips.as_ref())
        .map(|ips| ips.iter().map(|i| i.ip.clone()).collect())
        .unwrap_or_default()
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn pod_condition<'a>(
    pod: &'a Pod,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
}

fn suspended(sandbox: &Sandbox, pod: Option<&Pod>) -> Cond {
    if sandbox.operating_mode() != OperatingMode::Suspended {
        return cond(
            SUSPENDED,
            "False",
            "NotSuspended",
            "Sandbox is not suspended",
        );
    }
    match pod {
        None => cond(
            SUSPENDED,
            "True",
            "PodTerminated",
            "Pod has been terminated. Sandbox is suspended",
        ),
        Some(_) => cond(
            SUSPENDED,
            "False",
            "PodTerminating",
            "Pod is terminating. Sandbox is suspending",
        ),
    }
}

fn finished(pod: Option<&Pod>) -> Option<Cond> {
    match phase(pod?) {
        "Succeeded" => Some(cond(
            FINISHED,
            "True",
            "PodSucceeded",
            "Pod completed successfully",
        )),
        "Failed" => Some(cond(FINISHED, "True", "PodFailed", "Pod failed")),
        _ => None,
    }
}

fn pod_scheduled(pod: Option<&Pod>) -> Option<Cond> {
    let pod = pod?;
    let Some(c) = pod_condition(pod, "PodScheduled") else {
        return Some(cond(
            POD_SCHEDULED,
            "Unknown",
            "PodSchedulingUnknown",
            "Pod has not reported a PodScheduled condition yet",
        ));
    };
    let status = match c.status.as_str() {
        "True" => "True",
        "False" => "False",
        _ => "Unknown",
    };
    let reason = match c.reason.as_deref().filter(|r| !r.is_empty()) {
        Some(r) => r.to_string(),
        None if status == "True" => "PodScheduled".into(),
        None => "PodSchedulingUnknown".into(),
    };
    Some(Cond {
        type_: POD_SCHEDULED,
        status,
        reason,
        message: c.message.clone().unwrap_or_default(),
    })
}

fn ready(sandbox: &Sandbox, pod: Option<&Pod>, blocker: Option<&Blocker>) -> Cond {
    let not_ready = |reason: &str, message: &str| cond(READY, "False", reason, message);
    match blocker {
        Some(Blocker::Rejected(m)) => return not_ready("PodRejected", m),
        Some(Blocker::Conflict(m)) => {
            return not_ready("ReconcilerError", &format!("Error seen: {m}"));
        }
        Some(Blocker::Expired) => return not_ready("SandboxExpired", "Sandbox has expired"),
        None => {}
    }
    if sandbox.operating_mode() == OperatingMode::Suspended {
        let m = if pod.is_some() {
            "Sandbox is suspending"
        } else {
            "Sandbox is suspended"
        };
        return not_ready("SandboxSuspended", m);
    }
    let Some(pod) = pod else {
        return not_ready("DependenciesNotReady", "Pod does not exist");
    };
    match phase(pod) {
        "Succeeded" => return not_ready("PodSucceeded", "Pod completed successfully"),
        "Failed" => return not_ready("PodFailed", "Pod failed"),
        _ => {}
    }
    let (pod_ready, message) = if phase(pod) != "Running" {
        (false, format!("Pod exists with phase: {}", phase(pod)))
    } else if pod_condition(pod, "Ready").is_none_or(|c| c.status != "True") {
        (false, "Pod is Running but not Ready".to_string())
    } else if pod_ips(pod).is_empty() {
        (false, "Pod is Ready but has no podIPs yet".to_string())
    } else {
        (true, "Pod is Ready".to_string())
    };
    // The stand-in never makes a Service: one asked for is missing.
    if sandbox.spec.service == Some(true) {
        return not_ready(
            "DependenciesNotReady",
            &format!("{message}; Service does not exist"),
        );
    }
    if pod_ready {
        cond(READY, "True", "DependenciesReady", &message)
    } else {
        not_ready("DependenciesNotReady", &message)
    }
}

/// The status the Sandbox should show, given its (controlled) Pod if any,
/// why there is none when that is known, and the time now. Conditions keep
/// their place and `lastTransitionTime` while their status does not change
/// (new ones are appended); `service`/`serviceFQDN` are carried over.
pub fn compute_status(
    sandbox: &Sandbox,
    pod: Option<&Pod>,
    blocker: Option<&Blocker>,
    now: Timestamp,
) -> SandboxStatus {
    let previous = sandbox.status.clone().unwrap_or_default();
    let expired = blocker == Some(&Blocker::Expired);
    // Present this pass, in the order first added; absent ones are removed
    // (an expired Sandbox keeps whatever Finished it had).
    let mut now_conds: Vec<Cond> = Vec::new();
    if !expired {
        now_conds.push(suspended(sandbox, pod));
        now_conds.extend(finished(pod));
        now_conds.extend(pod_scheduled(pod));
    }
    now_conds.push(ready(sandbox, pod, blocker));
    let now = Time(Timestamp::from_second(now.as_second()).unwrap_or(now));
    let generation = sandbox.metadata.generation;
    let to_condition = |c: &Cond| Condition {
        type_: c.type_.into(),
        status: c.status.into(),
        reason: c.reason.clone(),
        message: c.message.clone(),
        observed_generation: generation,
        last_transition_time: previous
            .condition(c.type_)
            .filter(|old| old.status == c.status)
            .map(|old| old.last_transition_time.clone())
            .unwrap_or_else(|| now.clone()),
    };
    let mut conditions: Vec<Condition> = Vec::new();
    for old in &previous.conditions {
        if let Some(c) = now_conds.iter().find(|c| c.type_ == old.type_) {
            conditions.push(to_condition(c));
        } else if expired && old.type_ != POD_SCHEDULED {
            conditions.push(old.clone());
        }
    }
    for c in &now_conds {
        if !conditions.iter().any(|x| x.type_ == c.type_) {
            conditions.push(to_condition(c));
        }
    }
    if expired {
        return SandboxStatus {
            conditions,
            ..SandboxStatus::default()
        };
    }
    SandboxStatus {
        service_fqdn: previous.service_fqdn,
        service: previous.service,
        conditions,
        // Set once a Pod was seen, then kept.
        selector: if pod.is_some() {
            Some(format!(
                "{NAME_HASH_LABEL}={}",
                name_hash(sandbox_name(sandbox))
            ))
        } else {
            previous.selector
        },
        pod_ips: pod.map(pod_ips).unwrap_or_default(),
        node_name: pod
            .and_then(|p| p.spec.as_ref())
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
    }
}

fn sandbox_name(sandbox: &Sandbox) -> &str {
    sandbox.metadata.name.as_deref().unwrap_or_default()
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
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": if ready {"True"} else {"False"}}
            ],
            "podIPs": ips
        }))
    }

    fn now() -> Timestamp {
        "2030-01-01T00:00:00Z".parse().expect("ts")
    }

    fn get<'a>(s: &'a SandboxStatus, t: &str) -> &'a Condition {
        s.condition(t).expect("condition present")
    }

    fn triple(s: &SandboxStatus, t: &str) -> (String, String, String) {
        let c = get(s, t);
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    fn t(s: &str, r: &str, m: &str) -> (String, String, String) {
        (s.into(), r.into(), m.into())
    }

    #[test]
    fn ready_needs_running_ready_and_pod_ips() {
        let sb = sandbox(json!({}));
        let s = compute_status(&sb, Some(&running(true, &["10.0.0.5"])), None, now());
        assert_eq!(
            triple(&s, READY),
            t("True", "DependenciesReady", "Pod is Ready")
        );
        assert_eq!(get(&s, READY).observed_generation, Some(3));
        assert_eq!(s.pod_ips, vec!["10.0.0.5".to_string()]);
        assert_eq!(s.node_name.as_deref(), Some("vk-1"));
        assert_eq!(
            s.selector,
            Some(format!(
                "agents.x-k8s.io/sandbox-name-hash={}",
                name_hash("demo")
            ))
        );
        assert!(s.condition(FINISHED).is_none());
        assert_eq!(triple(&s, POD_SCHEDULED), t("True", "PodScheduled", ""));
        assert_eq!(
            triple(&s, SUSPENDED),
            t("False", "NotSuspended", "Sandbox is not suspended")
        );
        let order: Vec<&str> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(order, vec![SUSPENDED, POD_SCHEDULED, READY]);

        let s = compute_status(&sb, Some(&running(true, &[])), None, now());
        assert_eq!(
            triple(&s, READY),
            t(
                "False",
                "DependenciesNotReady",
                "Pod is Ready but has no podIPs yet"
            )
        );
        let s = compute_status(&sb, Some(&running(false, &["10.0.0.5"])), None, now());
        assert_eq!(get(&s, READY).message, "Pod is Running but not Ready");
        let pending = pod(json!({"phase": "Pending"}));
        let s = compute_status(&sb, Some(&pending), None, now());
        assert_eq!(get(&s, READY).message, "Pod exists with phase: Pending");
        assert_eq!(
            triple(&s, POD_SCHEDULED),
            t(
                "Unknown",
                "PodSchedulingUnknown",
                "Pod has not reported a PodScheduled condition yet"
            )
        );
        // A Service asked for is never made by the stand-in.
        let sb = sandbox(json!({"service": true}));
        let s = compute_status(&sb, Some(&running(true, &["10.0.0.5"])), None, now());
        assert_eq!(
            triple(&s, READY),
            t(
                "False",
                "DependenciesNotReady",
                "Pod is Ready; Service does not exist"
            )
        );
    }

    #[test]
    fn ended_pod_finishes_the_sandbox() {
        let sb = sandbox(json!({}));
        let failed = pod(json!({"phase": "Failed", "reason": "SandboxLeaseExpired"}));
        let s = compute_status(&sb, Some(&failed), None, now());
        assert_eq!(triple(&s, READY), t("False", "PodFailed", "Pod failed"));
        assert_eq!(triple(&s, FINISHED), t("True", "PodFailed", "Pod failed"));
        let done = pod(json!({"phase": "Succeeded"}));
        let s = compute_status(&sb, Some(&done), None, now());
        assert_eq!(
            triple(&s, FINISHED),
            t("True", "PodSucceeded", "Pod completed successfully")
        );
    }

    #[test]
    fn no_pod_suspension_and_expiry() {
        let sb = sandbox(json!({}));
        let s = compute_status(&sb, None, None, now());
        assert_eq!(
            triple(&s, READY),
            t("False", "DependenciesNotReady", "Pod does not exist")
        );
        assert!(s.condition(POD_SCHEDULED).is_none() && s.selector.is_none());
        assert!(s.pod_ips.is_empty() && s.node_name.is_none());

        let s = compute_status(&sb, None, Some(&Blocker::Rejected("no".into())), now());
        assert_eq!(triple(&s, READY), t("False", "PodRejected", "no"));

        let sb = sandbox(json!({"operatingMode": "Suspended"}));
        let s = compute_status(&sb, None, None, now());
        assert_eq!(
            triple(&s, READY),
            t("False", "SandboxSuspended", "Sandbox is suspended")
        );
        assert_eq!(get(&s, SUSPENDED).reason, "PodTerminated");
        let s = compute_status(&sb, Some(&running(true, &["10.0.0.5"])), None, now());
        assert_eq!(get(&s, SUSPENDED).reason, "PodTerminating");
        assert_eq!(get(&s, READY).message, "Sandbox is suspending");

        // Expired: Ready says so, live fields and PodScheduled go, Finished stays.
        let mut sb = sandbox(json!({}));
        let failed = pod(
            json!({"phase": "Failed", "conditions": [{"type": "PodScheduled", "status": "True"}]}),
        );
        sb.status = Some(compute_status(&sb, Some(&failed), None, now()));
        let s = compute_status(&sb, None, Some(&Blocker::Expired), now());
        assert_eq!(
            triple(&s, READY),
            t("False", "SandboxExpired", "Sandbox has expired")
        );
        assert!(s.condition(POD_SCHEDULED).is_none());
        assert_eq!(get(&s, FINISHED).reason, "PodFailed");
        assert!(s.selector.is_none() && s.pod_ips.is_empty());
    }

    #[test]
    fn transition_time_is_kept_while_status_is_unchanged() {
        let mut sb = sandbox(json!({}));
        let first = compute_status(&sb, None, None, now());
        sb.status = Some(first.clone());
        let later: Timestamp = "2030-01-01T00:05:00Z".parse().expect("ts");
        let again = compute_status(&sb, Some(&running(false, &[])), None, later);
        assert_eq!(
            get(&again, READY).last_transition_time,
            get(&first, READY).last_transition_time
        );
        let ready = compute_status(&sb, Some(&running(true, &["1.2.3.4"])), None, later);
        assert_eq!(get(&ready, READY).last_transition_time, Time(later));
        sb.status = Some(ready.clone());
        assert_eq!(
            compute_status(&sb, Some(&running(true, &["1.2.3.4"])), None, later),
            ready
        );
        // The selector stays once set.
        assert!(compute_status(&sb, None, None, later).selector.is_some());
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
            Some(2)
        );
    }
}
