//! What a failed create does to the Pod's status, decided from why it
//! failed and what the Pod shows. Pure.
//!
//! A failure of vk-sandbox's own (it could not list sandboxd to vouch for
//! a claim or look for strays, it could not record a claim) is never the
//! Pod's: it is retried with back-off, never reported `Failed` whatever
//! the restart policy, and a Pod already Running on a sandbox is left
//! exactly as it is (docs/reliability.md, "A failed verification").

use super::pod::Pod;

/// Why a create did not produce a Running Pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The Pod can never be claimed for as it is (another runtime, or
    /// annotations that make no claim request).
    Pod,
    /// sandboxd did not grant the claim (no warm capacity, an error).
    Claim,
    /// vk-sandbox could not make sure claiming is safe, or could not
    /// record the claim: its own trouble, retried.
    Ours,
}

/// The status a failed create writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedStatus {
    /// None: the Pod keeps what it shows.
    Untouched,
    /// `Pending` with the reason, retried.
    Pending,
    /// `Failed`, never retried.
    Failed,
}

/// The status for `pod` after a create failed for `cause`.
pub fn failed_status(pod: &Pod, cause: Cause) -> FailedStatus {
    match cause {
        Cause::Ours if pod.phase() == Some("Running") => FailedStatus::Untouched,
        Cause::Ours => FailedStatus::Pending,
        Cause::Pod | Cause::Claim if pod.never_restarts() => FailedStatus::Failed,
        Cause::Pod | Cause::Claim => FailedStatus::Pending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: Option<&str>, never: bool) -> Pod {
        let mut v = serde_json::json!({"metadata": {"name": "p", "uid": "u"}});
        if let Some(ph) = phase {
            v["status"] = serde_json::json!({"phase": ph});
        }
        if never {
            v["spec"] = serde_json::json!({"restartPolicy": "Never"});
        }
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn failed_status_table() {
        use Cause::*;
        use FailedStatus::*;
        let cases = [
            (pod(Some("Running"), true), Ours, Untouched),
            (pod(Some("Running"), false), Ours, Untouched),
            (pod(Some("Pending"), true), Ours, Pending),
            (pod(None, true), Ours, Pending),
            (pod(None, false), Ours, Pending),
            (pod(None, true), Pod, Failed),
            (pod(None, false), Pod, Pending),
            (pod(None, true), Claim, Failed),
            (pod(Some("Pending"), false), Claim, Pending),
            (pod(Some("Running"), true), Claim, Failed),
            (pod(Some("Running"), false), Pod, Pending),
        ];
        for (i, (p, cause, want)) in cases.into_iter().enumerate() {
            assert_eq!(failed_status(&p, cause), want, "case {i}: {cause:?}");
        }
    }
}
