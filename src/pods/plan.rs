//! What one Pod reconcile does, decided from the observed Pod, the
//! provider's tracked generation for its key and whether a claim is stored
//! for it; and which claims the lease watch must confirm. Pure.

use super::pod::Pod;

use crate::claims::{Claim, ClaimState};

/// What one reconcile does, decided from the observed Pod and the
/// provider's tracked generation for its key. Pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// A different generation is tracked under this key: it is gone, so
    /// run provider Delete for it first, then handle this Pod as new.
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

/// What the provider tracks under a Pod's key, seen from that Pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracked {
    /// Nothing (a new Pod, or any Pod after a restart).
    Nothing,
    /// This Pod (same UID).
    ThisPod,
    /// An earlier Pod of the same name, replaced since.
    AnotherPod,
}

impl Tracked {
    pub fn of(tracked: Option<&Pod>, pod: &Pod) -> Tracked {
        match tracked {
            None => Tracked::Nothing,
            Some(t) if t.metadata.uid == pod.metadata.uid => Tracked::ThisPod,
            Some(_) => Tracked::AnotherPod,
        }
    }
}

/// `holds_claim`: the claims store holds a claim for the Pod's key. A
/// terminating Pod with one goes through the provider even when no
/// container runs (claimed, then the process died or the status write
/// failed before Running was published): deleting it alone would leak it.
pub fn plan(pod: &Pod, tracked: Tracked, holds_claim: bool) -> Plan {
    let retire_tracked = tracked == Tracked::AnotherPod;
    let still_tracked = tracked == Tracked::ThisPod;
    let step = if pod.metadata.deletion_timestamp.is_some() {
        if pod.has_running_container() || holds_claim {
            Step::DeleteAfterProvider
        } else {
            Step::DeleteNow
        }
    } else if pod.terminal() {
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
            token: crate::sandboxd::Token::new("t"),
            address: String::new(),
            pod_uid: "u".into(),
            claimed_at: "2026-01-01T00:00:00Z".parse().expect("ts"),
            deadline: deadline.map(|d| d.parse().expect("ts")),
            lifecycle: Default::default(),
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
            // (pod, tracked under its key, retire old, step)
            (
                pod("u", false, None, false),
                Tracked::Nothing,
                false,
                Create,
            ),
            (
                pod("u", false, Some("Pending"), false),
                Tracked::ThisPod,
                false,
                Republish,
            ),
            (
                pod("u", false, Some("Running"), true),
                Tracked::ThisPod,
                false,
                Republish,
            ),
            (
                pod("u2", false, None, false),
                Tracked::AnotherPod,
                true,
                Create,
            ),
            (
                pod("u", true, Some("Running"), true),
                Tracked::ThisPod,
                false,
                DeleteAfterProvider,
            ),
            // After a restart nothing is tracked: still authorized release/preserve.
            (
                pod("u", true, Some("Running"), true),
                Tracked::Nothing,
                false,
                DeleteAfterProvider,
            ),
            (
                pod("u", true, Some("Pending"), false),
                Tracked::Nothing,
                false,
                DeleteNow,
            ),
            (
                pod("u2", true, None, false),
                Tracked::AnotherPod,
                true,
                DeleteNow,
            ),
            (
                pod("u", false, Some("Failed"), false),
                Tracked::ThisPod,
                false,
                Leave,
            ),
            (
                pod("u", false, Some("Succeeded"), false),
                Tracked::Nothing,
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
        assert_eq!(plan(&p, Tracked::Nothing, false).step, Step::DeleteNow);
        assert_eq!(
            plan(&p, Tracked::Nothing, true).step,
            Step::DeleteAfterProvider
        );
        let done = pod("u", false, Some("Failed"), false);
        assert_eq!(plan(&done, Tracked::Nothing, true).step, Step::Leave);
    }

    #[test]
    fn tracked_compares_uids() {
        let p = pod("u", false, None, false);
        assert_eq!(Tracked::of(None, &p), Tracked::Nothing);
        assert_eq!(Tracked::of(Some(&p), &p), Tracked::ThisPod);
        let old = pod("u0", false, Some("Running"), true);
        assert_eq!(Tracked::of(Some(&old), &p), Tracked::AnotherPod);
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
