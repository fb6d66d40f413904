//! The lifecycle part of a claim (docs/architecture.md, "Sandbox
//! lifecycle"): the owner the claim serves, what vk-sandbox last did to its
//! VM (hibernated, and why), and the lease length it asks for and was
//! granted. Kept in the claims file as one optional `lifecycle` object per
//! row, which the Go vk-sandbox's reader ignores; a row without lifecycle
//! state is written exactly as the Go build writes it.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// The controller owner a claim serves, as the Pod referenced it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRef {
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// What vk-sandbox last did to the VM. sandboxd may have changed it since
/// (idle hibernation, archive); its listing is the authority on that.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum VmState {
    /// Left running (or as sandboxd keeps it).
    #[default]
    Running,
    /// A hibernate was decided and has not succeeded yet: retried, and the
    /// VM is woken before its key's next Pod runs.
    Hibernating { why: String, since: Timestamp },
    /// Hibernated by vk-sandbox; woken before its key's next Pod runs.
    Hibernated { why: String, since: Timestamp },
    /// sandboxd archived it (a renewal answered 409): not renewable; woken
    /// from the archive, with a fresh lease, when its key's Pod comes back.
    Archived { since: Timestamp },
}

impl VmState {
    /// Whether the key's next Pod must wake the VM before it runs.
    pub fn needs_wake(&self) -> bool {
        !matches!(self, VmState::Running)
    }
}

/// The lifecycle part of a claim row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lifecycle {
    /// The owner the claim was made or adopted for; `None` for a bare Pod,
    /// or a row written before lifecycle state existed (owner unknown).
    pub owner: Option<OwnerRef>,
    pub vm: VmState,
    /// sandboxd refused to hibernate this VM (409: egress lane, volumes);
    /// it is never asked again.
    pub hibernate_refused: bool,
    /// The lease length asked at each renewal (the Pod's `ttl-seconds`).
    pub ttl_seconds: Option<u64>,
    /// The lease length sandboxd granted last (it clamps what it is asked).
    pub granted_seconds: Option<u64>,
    /// The sandbox's own Pod address (`--pod-cidr`), kept with the claim
    /// across Pods, suspends and restarts; freed at release.
    pub pod_ip: Option<std::net::Ipv4Addr>,
}

impl Lifecycle {
    /// Nothing to record: the row is written as the Go build writes it.
    pub fn is_empty(&self) -> bool {
        *self == Lifecycle::default()
    }
}

/// The `lifecycle` object as the file holds it (fields in this order).
#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Wire {
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<OwnerRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vm: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    since: Option<String>,
    #[serde(rename = "hibernateRefused", skip_serializing_if = "is_false")]
    hibernate_refused: bool,
    #[serde(rename = "ttlSeconds", skip_serializing_if = "Option::is_none")]
    ttl_seconds: Option<u64>,
    #[serde(rename = "grantedSeconds", skip_serializing_if = "Option::is_none")]
    granted_seconds: Option<u64>,
    /// Unknown to earlier builds, which read the rest of the row as before
    /// (serde ignores the field): a rollback keeps its claims.
    #[serde(rename = "podIP", skip_serializing_if = "Option::is_none")]
    pod_ip: Option<std::net::Ipv4Addr>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

const HIBERNATING: &str = "hibernating";
const HIBERNATED: &str = "hibernated";
const ARCHIVED: &str = "archived";

/// RFC 3339 at whole seconds, UTC: the file's precision.
fn format_time(ts: Timestamp) -> String {
    Timestamp::from_second(ts.as_second())
        .unwrap_or(ts)
        .to_string()
}

impl Lifecycle {
    /// The row's `lifecycle` object; `None` when there is nothing to record.
    pub fn to_wire(&self) -> Option<Wire> {
        if self.is_empty() {
            return None;
        }
        let (vm, why, since) = match &self.vm {
            VmState::Running => (None, None, None),
            VmState::Hibernating { why, since } => {
                (Some(HIBERNATING), Some(why.clone()), Some(*since))
            }
            VmState::Hibernated { why, since } => {
                (Some(HIBERNATED), Some(why.clone()), Some(*since))
            }
            VmState::Archived { since } => (Some(ARCHIVED), None, Some(*since)),
        };
        Some(Wire {
            owner: self.owner.clone(),
            vm: vm.map(str::to_string),
            why,
            since: since.map(format_time),
            hibernate_refused: self.hibernate_refused,
            ttl_seconds: self.ttl_seconds,
            granted_seconds: self.granted_seconds,
            pod_ip: self.pod_ip,
        })
    }

    /// The row's `lifecycle` value as JSON (tests, tools).
    pub fn to_json(&self) -> Option<serde_json::Value> {
        self.to_wire().and_then(|w| serde_json::to_value(w).ok())
    }

    /// Reads a row's `lifecycle` value (`null` or absent: empty). The error
    /// names the problem, for a message that also names the row and file.
    pub fn from_json(value: Option<&serde_json::Value>) -> Result<Lifecycle, String> {
        let Some(value) = value.filter(|v| !v.is_null()) else {
            return Ok(Lifecycle::default());
        };
        let wire: Wire = serde_json::from_value(value.clone())
            .map_err(|e| format!("field \"lifecycle\" is malformed: {e}"))?;
        let since = match wire.since.as_deref() {
            None => None,
            Some(raw) => Some(raw.parse::<Timestamp>().map_err(|_| {
                format!("field \"lifecycle\".\"since\" is {raw:?}, not an RFC 3339 time")
            })?),
        };
        let need_since = || {
            since
                .ok_or_else(|| "field \"lifecycle\" names a VM state without \"since\"".to_string())
        };
        let vm = match wire.vm.as_deref() {
            None | Some("") | Some("running") => VmState::Running,
            Some(HIBERNATING) => VmState::Hibernating {
                why: wire.why.unwrap_or_default(),
                since: need_since()?,
            },
            Some(HIBERNATED) => VmState::Hibernated {
                why: wire.why.unwrap_or_default(),
                since: need_since()?,
            },
            Some(ARCHIVED) => VmState::Archived {
                since: need_since()?,
            },
            Some(other) => {
                return Err(format!(
                    "field \"lifecycle\".\"vm\" is {other:?}, expected \"hibernating\", \
                     \"hibernated\" or \"archived\""
                ));
            }
        };
        Ok(Lifecycle {
            owner: wire.owner,
            vm,
            hibernate_refused: wire.hibernate_refused,
            ttl_seconds: wire.ttl_seconds,
            granted_seconds: wire.granted_seconds,
            pod_ip: wire.pod_ip,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("ts")
    }

    fn owner() -> OwnerRef {
        OwnerRef {
            api_version: "agents.x-k8s.io/v1beta1".into(),
            kind: "Sandbox".into(),
            name: "sb".into(),
            uid: "u1".into(),
        }
    }

    #[test]
    fn an_empty_lifecycle_is_not_written() {
        assert_eq!(Lifecycle::default().to_json(), None);
        assert!(Lifecycle::default().is_empty());
        assert_eq!(
            Lifecycle::from_json(None).expect("absent"),
            Lifecycle::default()
        );
        assert_eq!(
            Lifecycle::from_json(Some(&serde_json::Value::Null)).expect("null"),
            Lifecycle::default()
        );
    }

    #[test]
    fn each_state_round_trips_in_the_files_shape() {
        let since = ts("2026-12-02T07:30:02Z");
        let cases = [
            (
                Lifecycle {
                    owner: Some(owner()),
                    vm: VmState::Hibernated {
                        why: "suspended".into(),
                        since,
                    },
                    hibernate_refused: false,
                    ttl_seconds: Some(86400),
                    granted_seconds: Some(20),
                    pod_ip: Some(std::net::Ipv4Addr::new(10, 250, 7, 9)),
                },
                json!({"owner": {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                                 "name": "sb", "uid": "u1"},
                       "vm": "hibernated", "why": "suspended", "since": "2026-12-02T07:30:02Z",
                       "ttlSeconds": 86400, "grantedSeconds": 20, "podIP": "10.250.7.9"}),
            ),
            (
                Lifecycle {
                    vm: VmState::Hibernating {
                        why: "suspended".into(),
                        since,
                    },
                    ..Default::default()
                },
                json!({"vm": "hibernating", "why": "suspended", "since": "2026-12-02T07:30:02Z"}),
            ),
            (
                Lifecycle {
                    vm: VmState::Archived { since },
                    hibernate_refused: true,
                    ..Default::default()
                },
                json!({"vm": "archived", "since": "2026-12-02T07:30:02Z", "hibernateRefused": true}),
            ),
            (
                Lifecycle {
                    owner: Some(owner()),
                    ..Default::default()
                },
                json!({"owner": {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                                 "name": "sb", "uid": "u1"}}),
            ),
        ];
        for (lifecycle, wire) in cases {
            assert_eq!(lifecycle.to_json(), Some(wire.clone()), "{lifecycle:?}");
            assert_eq!(
                Lifecycle::from_json(Some(&wire)).expect("decodes"),
                lifecycle
            );
        }
    }

    #[test]
    fn unknown_fields_are_ignored_malformed_ones_named() {
        let read = Lifecycle::from_json(Some(&json!({"later": 1, "vm": "running"})))
            .expect("unknown fields are a later version's");
        assert_eq!(read, Lifecycle::default());
        for (bad, names) in [
            (
                json!({"vm": "asleep", "since": "2026-12-02T07:30:02Z"}),
                "\"vm\"",
            ),
            (json!({"vm": "hibernated"}), "without \"since\""),
            (
                json!({"vm": "hibernated", "since": "yesterday"}),
                "\"since\"",
            ),
            (json!({"ttlSeconds": "many"}), "lifecycle"),
            (json!([1]), "lifecycle"),
        ] {
            let e = Lifecycle::from_json(Some(&bad)).expect_err("malformed");
            assert!(e.contains(names), "{bad}: {e}");
        }
    }

    #[test]
    fn only_a_vm_left_running_needs_no_wake() {
        let since = ts("2026-12-02T07:30:02Z");
        assert!(!VmState::Running.needs_wake());
        for vm in [
            VmState::Hibernating {
                why: "suspended".into(),
                since,
            },
            VmState::Hibernated {
                why: "suspended".into(),
                since,
            },
            VmState::Archived { since },
        ] {
            assert!(vm.needs_wake(), "{vm:?}");
        }
    }
}
