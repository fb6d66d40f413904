//! What one Pod reconcile does, decided from the observed Pod, the
//! provider's tracked generation for its key and whether a claim is stored
//! for it; and which claims the lease watch must confirm. Pure.

use super::pod::Pod;

use crate::claims::{Claim, ClaimState};

/// Whether the apiserver already removes the object on its own: grace 0
/// was set (by our earlier delete, or `kubectl delete --force`), so it goes
/// as soon as no finalizer holds it. A second delete would only repeat
/// that; skipping it saves one write per Pod (our grace-0 delete echoes
/// back as an update before the object is gone).
pub fn removal_pending(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        && pod.metadata.deletion_grace_period_seconds == Some(0)
}

/// A container is "running" unless every status is terminated or waiting.
pub fn has_running_container(pod: &Pod) -> bool {
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

pub fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed") | Some("Succeeded")
    )
}

pub fn never_restarts(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never")
}

/// What one reconcile does, decided from the observed Pod and the
/// provider's tracked generation for its key. Pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// A different generation is tracked under this key: it is gone, so
    /// run provider Delete for it first, then handle this Pod as new (the Go
    /// build, seeing the key still tracked, never created the new Pod).
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

/// Claims the lease watch must confirm with sandboxd: settled, with a
/// known deadline at or before `now`, for a key with a tracked Pod. A claim
/// without a deadline never expires.
pub fn expiry_candidates(
    all: Vec<(String, Claim, ClaimState)>,
    now: jiff::Timestamp,
    tracked: impl Fn(&str) -> bool,
) -> Vec<(String, Claim, ClaimState)> {
    all.into_iter()
        .filter(|(k, c, s)| {
            *s == ClaimState::Settled && c.deadline.is_some_and(|d| d <= now) && tracked(k)
        })
        .collect()
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
