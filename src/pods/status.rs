//! The Pod statuses vk-sandbox publishes (docs/pod-contract.md), as JSON merge
//! patches of `pods/status`. Pure. Fields we clear are sent as `null`, so
//! the patch replaces the status we own without a read-modify-write.

use super::pod::Pod;
use jiff::Timestamp;
use serde_json::{Value, json};

use super::annotations::CLAIM_ID;

/// What a published status is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimView<'a> {
    pub id: &'a str,
    /// The Pod IP from `owner_addr`, when it has a usable one.
    pub ip: Option<String>,
    pub claimed_at: Timestamp,
    pub deadline: Option<Timestamp>,
}

fn containers(pod: &Pod) -> Vec<(String, String)> {
    pod.spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

/// Second precision, truncated, UTC: the claims store keeps claim times
/// at whole seconds (truncated) and the apiserver stores metav1.Time at
/// seconds, so the time sent, the time stored and the time read back after
/// a restart are the same text (no second write to move it by a second).
fn ts(t: Timestamp) -> String {
    crate::claims::format::format_time(t)
}

/// Running: the claim is settled and its lease has not ended.
pub fn running(pod: &Pod, c: &ClaimView) -> Value {
    let started = ts(c.claimed_at);
    let statuses: Vec<Value> = containers(pod)
        .into_iter()
        .map(|(name, image)| {
            json!({
                "name": name, "ready": true, "started": true, "restartCount": 0,
                "image": image, "imageID": format!("sandboxd://{}", c.id),
                "state": {"running": {"startedAt": started}},
            })
        })
        .collect();
    let ip = c.ip.clone();
    let ips = ip.as_ref().map(|ip| json!([{"ip": ip}]));
    json!({
        "metadata": {"annotations": {CLAIM_ID: c.id}},
        "status": {
            "phase": "Running",
            "reason": null,
            "message": null,
            "hostIP": ip,
            "hostIPs": ips,
            "podIP": ip,
            "podIPs": ips,
            "startTime": started,
            "conditions": [
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": statuses,
        }
    })
}

/// Lease expired (`SandboxLeaseExpired`): sandboxd no longer lists the
/// claim and its deadline has passed. Terminal. The dead VM's address and
/// the Running conditions are removed (sent as `null`).
pub fn expired(pod: &Pod, c: &ClaimView, deadline: Timestamp) -> Value {
    let message = format!(
        "sandbox lease ended at {}; the microVM is reaped at the deadline",
        ts(deadline)
    );
    ended(pod, c, deadline, "SandboxLeaseExpired", &message)
}

/// The VM is gone for good (its lease ended, or it was released because
/// its owner is gone while the Pod stayed): `Failed` with `reason`, each
/// container terminated at `at`, the address and conditions removed.
pub fn ended(pod: &Pod, c: &ClaimView, at: Timestamp, reason: &str, message: &str) -> Value {
    let ended = ts(at);
    let statuses: Vec<Value> = containers(pod)
        .into_iter()
        .map(|(name, image)| {
            json!({
                "name": name, "ready": false, "started": false, "restartCount": 0,
                "image": image, "imageID": format!("sandboxd://{}", c.id),
                "state": {"terminated": {
                    "exitCode": 1, "reason": reason,
                    "startedAt": ts(c.claimed_at), "finishedAt": ended,
                }},
            })
        })
        .collect();
    json!({
        "metadata": {"annotations": {CLAIM_ID: c.id}},
        "status": {
            "phase": "Failed",
            "reason": reason,
            "message": message,
            "startTime": ts(c.claimed_at),
            // The VM is gone: its address is no longer the Pod's.
            "hostIP": null,
            "hostIPs": null,
            "podIP": null,
            "podIPs": null,
            "conditions": null,
            "containerStatuses": statuses,
        }
    })
}

/// A failed create: `Pending` (retried) or `Failed` when the Pod will never
/// restart. Other status fields are left as they are.
pub fn create_failed(terminal: bool, reason: &str, message: &str) -> Value {
    json!({
        "status": {
            "phase": if terminal { "Failed" } else { "Pending" },
            "reason": reason,
            "message": message,
        }
    })
}

/// Whether applying `patch` would change the Pod as the apiserver has it:
/// compares against the server's object, never a cache of what was sent.
/// Only what the patch says counts: fields the apiserver fills in itself
/// (`lastState: {}` on container statuses, `qosClass`, …) are not drift,
/// or every echo of our own write would be written again.
pub fn changes(pod: &Pod, patch: &Value) -> bool {
    match serde_json::to_value(pod) {
        Ok(current) => !covers(Some(&current), patch),
        Err(_) => true,
    }
}

/// Whether `current` already says everything `patch` says, under JSON merge
/// patch rules: `null` means absent, objects merge key by key, anything
/// else (arrays included) must be equal — except that array elements, like
/// objects, may carry fields the patch does not name.
fn covers(current: Option<&Value>, patch: &Value) -> bool {
    match (current, patch) {
        (cur, Value::Null) => cur.is_none_or(Value::is_null),
        (cur, Value::Object(fields)) => {
            let cur = cur.and_then(Value::as_object);
            fields
                .iter()
                .all(|(k, v)| covers(cur.and_then(|c| c.get(k)), v))
        }
        (Some(Value::Array(cur)), Value::Array(want)) => {
            cur.len() == want.len() && cur.iter().zip(want).all(|(c, w)| covers(Some(c), w))
        }
        (Some(cur), want) => cur == want,
        (None, _) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "a", "image": "base:24.04"}, {"name": "b", "image": "x"}]},
        }))
        .unwrap()
    }

    fn view() -> ClaimView<'static> {
        ClaimView {
            id: "sb_1",
            ip: Some("10.0.0.5".into()),
            claimed_at: "2026-01-01T00:00:00.6Z".parse().unwrap(),
            deadline: Some("2026-01-02T00:00:00Z".parse().unwrap()),
        }
    }

    #[test]
    fn running_shape() {
        let v = running(&pod(), &view());
        let s = &v["status"];
        assert_eq!(s["phase"], "Running");
        assert_eq!(s["podIP"], "10.0.0.5");
        assert_eq!(s["hostIP"], "10.0.0.5");
        assert_eq!(s["podIPs"], json!([{"ip": "10.0.0.5"}]));
        // Truncated, as the claims store keeps it (rounding it up made a
        // second write follow for about half of all claims).
        assert_eq!(s["startTime"], "2026-01-01T00:00:00Z");
        assert_eq!(
            s["containerStatuses"][0]["state"]["running"]["startedAt"],
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(s["containerStatuses"].as_array().unwrap().len(), 2);
        assert_eq!(s["containerStatuses"][0]["imageID"], "sandboxd://sb_1");
        assert_eq!(s["containerStatuses"][1]["image"], "x");
        assert_eq!(v["metadata"]["annotations"][CLAIM_ID], "sb_1");
        assert!(!v.to_string().contains("token"));
        // Applying it to the Pod yields a typed Running Pod.
        let mut p = serde_json::to_value(pod()).unwrap();
        json_patch::merge(&mut p, &v);
        let typed: Pod = serde_json::from_value(p).unwrap();
        assert_eq!(typed.status.unwrap().phase.as_deref(), Some("Running"));
    }

    #[test]
    fn running_without_address_omits_ips() {
        let mut c = view();
        c.ip = None;
        let v = running(&pod(), &c);
        assert!(v["status"]["podIP"].is_null());
        assert!(v["status"]["podIPs"].is_null());
    }

    #[test]
    fn expired_shape() {
        let c = view();
        let v = expired(&pod(), &c, c.deadline.unwrap());
        let s = &v["status"];
        assert_eq!(s["phase"], "Failed");
        assert_eq!(s["reason"], "SandboxLeaseExpired");
        let t = &s["containerStatuses"][0]["state"]["terminated"];
        assert_eq!(t["exitCode"], 1);
        assert_eq!(t["reason"], "SandboxLeaseExpired");
        assert_eq!(t["finishedAt"], "2026-01-02T00:00:00Z");
        for gone in ["podIP", "podIPs", "hostIP", "hostIPs", "conditions"] {
            assert!(
                s.get(gone).is_some_and(Value::is_null),
                "{gone} must be cleared: {s}"
            );
        }
        // Applied over a Running Pod, nothing of the VM's address is left.
        let mut p = serde_json::to_value(pod()).unwrap();
        json_patch::merge(&mut p, &running(&pod(), &c));
        json_patch::merge(&mut p, &v);
        let typed: Pod = serde_json::from_value(p).unwrap();
        let st = typed.status.unwrap();
        assert_eq!(
            (st.pod_ip, st.host_ip, st.pod_ips, st.conditions),
            (None, None, None, None)
        );
    }

    /// One conversion of the claim time everywhere: the status carries the
    /// second the claims store keeps (and a restart reads back).
    #[test]
    fn start_time_is_the_stored_second() {
        for raw in [
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00.4Z",
            "2026-01-01T00:00:00.5Z",
            "2026-01-01T00:00:00.999999999Z",
        ] {
            let t: Timestamp = raw.parse().unwrap();
            let stored = crate::claims::format::to_second(t);
            let mut c = view();
            c.claimed_at = t;
            let from_fresh = running(&pod(), &c);
            c.claimed_at = stored;
            let from_stored = running(&pod(), &c);
            assert_eq!(from_fresh, from_stored, "{raw}");
            assert_eq!(from_fresh["status"]["startTime"], "2026-01-01T00:00:00Z");
        }
    }

    #[test]
    fn change_detection_against_server_object() {
        let v = running(&pod(), &view());
        assert!(changes(&pod(), &v));
        let mut applied = serde_json::to_value(pod()).unwrap();
        json_patch::merge(&mut applied, &v);
        let applied: Pod = serde_json::from_value(applied).unwrap();
        assert!(!changes(&applied, &v));
        // Someone (e.g. the node lifecycle controller) flipped Ready: rewrite.
        let mut drifted = applied.clone();
        for c in drifted
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
        {
            if c.type_ == "Ready" {
                c.status = "False".into();
            }
        }
        assert!(changes(&drifted, &v));
    }

    /// The apiserver answers our Running write with defaults added
    /// (`lastState: {}`, `qosClass`): that echo is not drift. Before this,
    /// every Pod's status was written twice.
    #[test]
    fn server_defaults_are_not_drift() {
        let v = running(&pod(), &view());
        let mut echoed = serde_json::to_value(pod()).unwrap();
        json_patch::merge(&mut echoed, &v);
        echoed["status"]["qosClass"] = json!("BestEffort");
        for cs in echoed["status"]["containerStatuses"]
            .as_array_mut()
            .unwrap()
        {
            cs["lastState"] = json!({});
        }
        let echoed: Pod = serde_json::from_value(echoed).unwrap();
        assert!(!changes(&echoed, &v));
        // What the patch names still counts: a cleared field we set, a
        // field we clear that reappeared, a container status gone.
        let mut no_ip = echoed.clone();
        no_ip.status.as_mut().unwrap().pod_ip = None;
        assert!(changes(&no_ip, &v));
        let mut with_reason = echoed.clone();
        with_reason.status.as_mut().unwrap().reason = Some("Evicted".into());
        assert!(changes(&with_reason, &v));
        let mut fewer = echoed.clone();
        fewer
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()
            .pop();
        assert!(changes(&fewer, &v));
        let mut other_id = echoed;
        other_id
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(CLAIM_ID.into(), "sb_2".into());
        assert!(changes(&other_id, &v));
    }

    #[test]
    fn failed_create_pending_or_terminal() {
        assert_eq!(
            create_failed(false, "ProviderFailed", "x")["status"]["phase"],
            "Pending"
        );
        assert_eq!(
            create_failed(true, "NoWarmCapacity", "x")["status"]["phase"],
            "Failed"
        );
    }
}
