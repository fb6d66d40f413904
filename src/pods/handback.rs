//! Handing back a Pod this node cannot serve (docs/operations.md, "A Pod
//! handed back"). A Pod bound here whose claim keeps failing for a capacity
//! reason — sandboxd at its claim cap or draining (`429`, a redirect), no
//! warm VM, sandboxd unreachable — would wait here for as long as that
//! lasts while another node has room. Past a grace period it is given back
//! so that its owner re-creates it and the scheduler places the new Pod
//! (the node is tainted by then, or cordoned):
//!
//! - a Pod whose controller is a `Sandbox` is **deleted**: agent-sandbox
//!   re-creates a deleted Pod, while a Pod marked `Failed` ends the Sandbox
//!   (its `Finished` condition) — so the kubelet's own way, below, would
//!   lose it;
//! - a Pod of any other controller is marked **`Failed`**, as the kubelet
//!   rejects a Pod it cannot admit; ReplicaSets, StatefulSets and Jobs
//!   replace it;
//! - a bare Pod (no controller) is never handed back: nobody would make
//!   another, so it waits here for capacity.
//!
//! Nothing is held for a Pod handed back: it is only considered while no
//! claim is stored under its key and it never ran on a sandbox. A claim
//! reply that may have been lost (a timeout) is the vanished sweep's to
//! return once the Pod is gone, as for any Pod deleted while Pending. Pure.

use std::time::Duration;

use jiff::Timestamp;

use super::annotations::CLAIM_ID;
use super::authority::controller_ref;
use super::owner::{SANDBOX_GROUP, SANDBOX_KIND};
use super::pod::Pod;

/// The Event reason (and, for a Pod marked `Failed`, the status reason).
pub const REASON: &str = "HandedBack";

/// Why a claim failed for want of capacity on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortfall {
    /// sandboxd refused the claim for capacity: at its claim cap, draining,
    /// no warm VM (`429`, a redirect, an empty reply).
    NoCapacity,
    /// sandboxd did not answer (refused, reset, timed out).
    Unreachable,
}

/// How a Pod is handed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// Deleted (UID precondition): its owner re-creates it.
    Delete,
    /// Marked `Failed`: its controller replaces it.
    Fail,
}

/// What to do with a Pod whose create just failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not a case for handing back (why, for the log).
    Stay(&'static str),
    /// A case, not yet past the grace: look again within this.
    Wait(Duration),
    /// Hand it back now; it has waited this long.
    Now(How, Duration),
}

/// The Warning Event's note for a Pod handed back `how` after waiting
/// `waited` on `node` for capacity (`why`: the last failure).
pub fn note(node: &str, how: How, waited: Duration, why: &str) -> String {
    let then = match how {
        How::Delete => {
            "the Pod is deleted so that its Sandbox re-creates it and the scheduler places it \
             on a node with room"
        }
        How::Fail => {
            "the Pod is marked Failed, as a kubelet rejects a Pod it cannot admit, so that its \
             controller replaces it"
        }
    };
    format!(
        "{REASON}: no sandbox could be claimed on node {node} for {}s ({why}); {then}",
        waited.as_secs()
    )
}

/// When the Pod came to this node: its `PodScheduled=True` condition (the
/// apiserver sets it on binding), else its creation.
pub fn bound_at(pod: &Pod) -> Option<Timestamp> {
    let scheduled = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "True")
        })
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0);
    scheduled.or_else(|| pod.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// How a Pod is handed back, from its controller; `None` for a bare Pod.
pub fn how(pod: &Pod) -> Option<How> {
    let owner = controller_ref(pod)?;
    let group = owner.api_version.split('/').next().unwrap_or_default();
    Some(if owner.kind == SANDBOX_KIND && group == SANDBOX_GROUP {
        How::Delete
    } else {
        How::Fail
    })
}

/// The decision for `pod`, whose create failed with `shortfall` (`None`:
/// not for capacity); `holds_claim`: a claim is stored under its key;
/// `grace`: `--hand-back-after` (`None`: off).
pub fn decide(
    pod: &Pod,
    shortfall: Option<Shortfall>,
    holds_claim: bool,
    grace: Option<Duration>,
    now: Timestamp,
) -> Verdict {
    let Some(grace) = grace else {
        return Verdict::Stay("handing back is off");
    };
    if shortfall.is_none() {
        return Verdict::Stay("not a capacity failure");
    }
    if holds_claim || pod.annotation(CLAIM_ID).is_some() {
        return Verdict::Stay("a sandbox is held here for it");
    }
    let Some(how) = how(pod) else {
        return Verdict::Stay("no controller would re-create it");
    };
    let waited = bound_at(pod)
        .and_then(|t| now.duration_since(t).try_into().ok())
        .unwrap_or(Duration::ZERO);
    if waited >= grace {
        Verdict::Now(how, waited)
    } else {
        Verdict::Wait(grace - waited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const T0: &str = "2026-12-06T10:00:00Z";

    fn pod(owner: Option<(&str, &str)>, scheduled: Option<&str>, claim_id: bool) -> Pod {
        let mut v = json!({"metadata": {
            "name": "p", "namespace": "ns", "uid": "u",
            "creationTimestamp": "2026-12-06T09:59:00Z",
        }});
        if let Some((api_version, kind)) = owner {
            v["metadata"]["ownerReferences"] = json!([{
                "apiVersion": api_version, "kind": kind, "name": "o", "uid": "ou",
                "controller": true,
            }]);
        }
        if let Some(t) = scheduled {
            v["status"] = json!({"conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": t},
            ]});
        }
        if claim_id {
            v["metadata"]["annotations"] = json!({CLAIM_ID: "sb-1"});
        }
        serde_json::from_value(v).expect("pod")
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn the_decision_table() {
        let sandbox = Some(("agents.x-k8s.io/v1beta1", "Sandbox"));
        let old_sandbox = Some(("agents.x-k8s.io/v1alpha1", "Sandbox"));
        let rs = Some(("apps/v1", "ReplicaSet"));
        let other_sandbox = Some(("example.com/v1", "Sandbox"));
        let grace = Some(Duration::from_secs(10));
        let no = Some(Shortfall::NoCapacity);
        let down = Some(Shortfall::Unreachable);
        let bound = Some(T0);
        let s = |secs: u64| Duration::from_secs(secs);
        let cases = [
            (
                "off",
                pod(sandbox, bound, false),
                no,
                false,
                None,
                "2026-12-06T10:01:00Z",
                Verdict::Stay("handing back is off"),
            ),
            (
                "not a capacity failure",
                pod(sandbox, bound, false),
                None,
                false,
                grace,
                "2026-12-06T10:01:00Z",
                Verdict::Stay("not a capacity failure"),
            ),
            (
                "a claim is stored under its key",
                pod(sandbox, bound, false),
                no,
                true,
                grace,
                "2026-12-06T10:01:00Z",
                Verdict::Stay("a sandbox is held here for it"),
            ),
            (
                "it ran on a sandbox",
                pod(sandbox, bound, true),
                no,
                false,
                grace,
                "2026-12-06T10:01:00Z",
                Verdict::Stay("a sandbox is held here for it"),
            ),
            (
                "a bare Pod",
                pod(None, bound, false),
                down,
                false,
                grace,
                "2026-12-06T10:01:00Z",
                Verdict::Stay("no controller would re-create it"),
            ),
            (
                "within the grace",
                pod(sandbox, bound, false),
                no,
                false,
                grace,
                "2026-12-06T10:00:04Z",
                Verdict::Wait(s(6)),
            ),
            (
                "at the grace: a Sandbox's Pod is deleted",
                pod(sandbox, bound, false),
                no,
                false,
                grace,
                "2026-12-06T10:00:10Z",
                Verdict::Now(How::Delete, s(10)),
            ),
            (
                "an older Sandbox version too",
                pod(old_sandbox, bound, false),
                down,
                false,
                grace,
                "2026-12-06T10:00:30Z",
                Verdict::Now(How::Delete, s(30)),
            ),
            (
                "another controller's Pod is marked Failed",
                pod(rs, bound, false),
                down,
                false,
                grace,
                "2026-12-06T10:00:11Z",
                Verdict::Now(How::Fail, s(11)),
            ),
            (
                "a Sandbox kind of another group is another controller",
                pod(other_sandbox, bound, false),
                no,
                false,
                grace,
                "2026-12-06T10:00:11Z",
                Verdict::Now(How::Fail, s(11)),
            ),
            (
                "not scheduled yet: from its creation",
                pod(sandbox, None, false),
                no,
                false,
                grace,
                "2026-12-06T09:59:05Z",
                Verdict::Wait(s(5)),
            ),
            (
                "a clock behind the binding waits the whole grace",
                pod(sandbox, bound, false),
                no,
                false,
                grace,
                "2026-12-06T09:59:50Z",
                Verdict::Wait(s(10)),
            ),
        ];
        for (name, p, shortfall, holds, grace, now, want) in cases {
            assert_eq!(decide(&p, shortfall, holds, grace, at(now)), want, "{name}");
        }
    }

    #[test]
    fn bound_at_prefers_the_binding_to_the_creation() {
        let sandbox = Some(("agents.x-k8s.io/v1beta1", "Sandbox"));
        assert_eq!(bound_at(&pod(sandbox, Some(T0), false)), Some(at(T0)));
        assert_eq!(
            bound_at(&pod(sandbox, None, false)),
            Some(at("2026-12-06T09:59:00Z"))
        );
        let mut unscheduled = pod(sandbox, Some(T0), false);
        if let Some(c) = unscheduled
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
        {
            c[0].status = "False".into();
        }
        assert_eq!(bound_at(&unscheduled), Some(at("2026-12-06T09:59:00Z")));
    }
}
