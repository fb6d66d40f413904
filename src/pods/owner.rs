//! The owner of a Pod as read from the apiserver: what a living owner asks
//! of its VM (suspended, expiry), which only the lifecycle acts on, and the
//! served version to read it at (docs/pod-contract.md, "Owner references in
//! any served version"). Pure.

use jiff::Timestamp;
use serde_json::Value;

/// agent-sandbox's API group and kind: the only owner whose state (suspended,
/// expiry) vk-sandbox reads. A living owner of any other kind is "running".
pub const SANDBOX_GROUP: &str = "agents.x-k8s.io";
pub const SANDBOX_KIND: &str = "Sandbox";
/// The `Ready` condition reason agent-sandbox sets when `shutdownTime` has
/// passed, before it deletes the Pod.
pub const EXPIRED_REASON: &str = "SandboxExpired";

/// What a living owner asks of its VM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Intent {
    /// `spec.operatingMode: Suspended` (v1beta1) or `spec.replicas: 0`
    /// (v1alpha1).
    pub suspended: bool,
    /// `spec.shutdownTime`: the owner expires then.
    pub shutdown_time: Option<Timestamp>,
    /// The owner's controller already marked it expired (`Ready=False`,
    /// reason `SandboxExpired`), whatever this node's clock says.
    pub marked_expired: bool,
}

impl Intent {
    /// Why the owner counts as expired at `now`, if it does.
    pub fn expired(&self, now: Timestamp) -> Option<String> {
        match self.shutdown_time {
            Some(t) if t <= now => Some(format!("the owner reached its shutdownTime {t}")),
            _ if self.marked_expired => {
                Some(format!("the owner is marked expired ({EXPIRED_REASON})"))
            }
            _ => None,
        }
    }
}

/// Reads the intent of an owner of `group`/`kind` from its object (the
/// fields beside `metadata`: `spec`, `status`). Fields that are absent or
/// malformed read as "running, no expiry": only what is clearly said
/// suspends or expires.
pub fn intent(group: &str, kind: &str, object: &Value) -> Intent {
    if group != SANDBOX_GROUP || kind != SANDBOX_KIND {
        return Intent::default();
    }
    let spec = &object["spec"];
    let suspended =
        spec["operatingMode"].as_str() == Some("Suspended") || spec["replicas"].as_i64() == Some(0);
    let shutdown_time = spec["shutdownTime"]
        .as_str()
        .and_then(|s| s.parse::<Timestamp>().ok());
    let marked_expired = object["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c["type"].as_str() == Some("Ready")
                    && c["status"].as_str() == Some("False")
                    && c["reason"].as_str() == Some(EXPIRED_REASON)
            })
        });
    Intent {
        suspended,
        shutdown_time,
        marked_expired,
    }
}

/// One version of a group, as discovery lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedVersion {
    pub version: String,
    /// The kinds this version serves.
    pub kinds: Vec<String>,
}

/// The version to read an owner of `kind` at: the reference's own
/// (`wanted`) when it is served with that kind, else the group's preferred
/// version when it serves the kind, else the first version (discovery's
/// priority order) that does. `None`: no served version has the kind — a
/// doubt, never "the owner is gone".
pub fn choose_version(
    wanted: &str,
    kind: &str,
    preferred: Option<&str>,
    served: &[ServedVersion],
) -> Option<String> {
    let serves = |v: &ServedVersion| v.kinds.iter().any(|k| k == kind);
    let find = |name: &str| served.iter().find(|v| v.version == name && serves(v));
    find(wanted)
        .or_else(|| preferred.and_then(find))
        .or_else(|| served.iter().find(|v| serves(v)))
        .map(|v| v.version.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("ts")
    }

    #[test]
    fn a_sandboxs_intent_in_either_version() {
        let cases = [
            (
                json!({"spec": {"operatingMode": "Running"}}),
                Intent::default(),
            ),
            (
                json!({"spec": {"operatingMode": "Suspended"}}),
                Intent {
                    suspended: true,
                    ..Default::default()
                },
            ),
            // v1alpha1.
            (
                json!({"spec": {"replicas": 0}}),
                Intent {
                    suspended: true,
                    ..Default::default()
                },
            ),
            (json!({"spec": {"replicas": 1}}), Intent::default()),
            (
                json!({"spec": {"shutdownTime": "2026-12-02T07:30:43Z", "shutdownPolicy": "Retain"}}),
                Intent {
                    shutdown_time: Some(ts("2026-12-02T07:30:43Z")),
                    ..Default::default()
                },
            ),
            (
                json!({"spec": {}, "status": {"conditions": [
                    {"type": "Suspended", "status": "False", "reason": "NotSuspended"},
                    {"type": "Ready", "status": "False", "reason": "SandboxExpired"}]}}),
                Intent {
                    marked_expired: true,
                    ..Default::default()
                },
            ),
            // Not expired: another reason, or Ready=True.
            (
                json!({"status": {"conditions": [
                    {"type": "Ready", "status": "False", "reason": "SandboxSuspended"},
                    {"type": "Finished", "status": "False", "reason": "SandboxExpired"}]}}),
                Intent::default(),
            ),
            // Malformed fields read as "running, no expiry".
            (
                json!({"spec": {"operatingMode": 3, "replicas": "0", "shutdownTime": "soon"},
                       "status": {"conditions": "none"}}),
                Intent::default(),
            ),
            (json!(null), Intent::default()),
        ];
        for (object, want) in cases {
            assert_eq!(
                intent(SANDBOX_GROUP, SANDBOX_KIND, &object),
                want,
                "{object}"
            );
        }
    }

    #[test]
    fn other_kinds_have_no_intent() {
        let scaled_to_zero = json!({"spec": {"replicas": 0, "operatingMode": "Suspended"}});
        assert_eq!(
            intent("apps", "ReplicaSet", &scaled_to_zero),
            Intent::default()
        );
        assert_eq!(
            intent("example.com", SANDBOX_KIND, &scaled_to_zero),
            Intent::default()
        );
        assert_eq!(
            intent(SANDBOX_GROUP, "SandboxClaim", &scaled_to_zero),
            Intent::default()
        );
    }

    #[test]
    fn expiry_by_the_clock_or_by_the_owners_controller() {
        let now = ts("2026-12-02T08:00:00Z");
        let at = |t: &str| Intent {
            shutdown_time: Some(ts(t)),
            ..Default::default()
        };
        assert!(at("2026-12-02T07:59:59Z").expired(now).is_some());
        assert!(
            at("2026-12-02T08:00:00Z").expired(now).is_some(),
            "at the second"
        );
        assert!(at("2026-12-02T08:00:01Z").expired(now).is_none());
        assert!(Intent::default().expired(now).is_none());
        let marked = Intent {
            marked_expired: true,
            shutdown_time: Some(ts("2026-12-02T09:00:00Z")),
            ..Default::default()
        };
        let why = marked.expired(now).expect("the controller's word wins");
        assert!(why.contains(EXPIRED_REASON), "{why}");
    }

    fn v(version: &str, kinds: &[&str]) -> ServedVersion {
        ServedVersion {
            version: version.into(),
            kinds: kinds.iter().map(|k| k.to_string()).collect(),
        }
    }

    #[test]
    fn the_version_read_is_one_that_serves_the_kind() {
        let both = [v("v1beta1", &["Sandbox"]), v("v1alpha1", &["Sandbox"])];
        let beta_only = [v("v1beta1", &["Sandbox"])];
        let alpha_only = [v("v1alpha1", &["Sandbox"])];
        type Case<'a> = (
            &'a str,
            Option<&'a str>,
            &'a [ServedVersion],
            Option<&'a str>,
        );
        let cases: [Case<'_>; 8] = [
            // The reference's own version, when served.
            ("v1alpha1", Some("v1beta1"), &both, Some("v1alpha1")),
            ("v1beta1", Some("v1beta1"), &both, Some("v1beta1")),
            // agent-sandbox 1.0: v1alpha1 no longer served.
            ("v1alpha1", Some("v1beta1"), &beta_only, Some("v1beta1")),
            // And the other way round.
            ("v1beta1", Some("v1alpha1"), &alpha_only, Some("v1alpha1")),
            // The preferred version does not serve the kind: the next that does.
            (
                "v2",
                Some("v1"),
                &[v("v1", &["Other"]), v("v1beta1", &["Sandbox"])],
                Some("v1beta1"),
            ),
            ("v2", None, &both, Some("v1beta1")),
            // No version serves it: a doubt.
            (
                "v1beta1",
                Some("v1beta1"),
                &[v("v1beta1", &["Other"])],
                None,
            ),
            ("v1beta1", None, &[], None),
        ];
        for (wanted, preferred, served, want) in cases {
            assert_eq!(
                choose_version(wanted, "Sandbox", preferred, served).as_deref(),
                want,
                "{wanted} {preferred:?} {served:?}"
            );
        }
    }
}
