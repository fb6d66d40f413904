//! Wire types of the lifecycle and data-plane calls: hibernate, wake,
//! renew, the single-sandbox read, stats, the owner probe and the buffered
//! exec (docs/architecture.md#sandboxd-api).
//!
//! Replies are decoded leniently (unknown fields ignored), as the listing.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::lease_deadline::Deadline;
use super::types::{MAX_TTL_SECONDS, PoolKey, SandboxState, Secret};

/// Which credential a sandbox-scoped verb (hibernate, wake, renew) carries.
#[derive(Debug, Clone, Copy)]
pub enum SandboxAuth<'a> {
    /// The claim's own token, as vk-sandbox holds it in its claims file.
    Token(&'a Secret),
    /// The node (root) token: sandboxd's operator path acts on any id
    /// (recovered claims whose token was lost).
    Node,
}

/// `GET /v1/sandboxes/{id}` (root): one row as the listing shows it, plus
/// what only this read carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfo {
    pub id: String,
    pub key: PoolKey,
    pub deadline: Deadline,
    pub hibernated: bool,
    pub archived: bool,
    /// Empty when absent.
    pub claim_ref: String,
    /// Late builds: why the VMM is down and was not restarted (a failed
    /// sandbox still lists as neither hibernated nor archived).
    pub failed: Option<String>,
    /// Late builds hand the sandbox token to the root token here: the way
    /// back for a claim whose token was lost.
    pub token: Option<Secret>,
}

impl SandboxInfo {
    pub fn state(&self) -> SandboxState {
        if self.archived {
            SandboxState::Archived
        } else if self.hibernated {
            SandboxState::Hibernated
        } else {
            SandboxState::Running
        }
    }

    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }
}

/// The single-sandbox read as sent. `deadline` is kept raw so its shapes go
/// through [`Deadline::parse`] like the listing's.
#[derive(Debug, Deserialize)]
pub(crate) struct SandboxInfoReply {
    pub id: String,
    #[serde(default)]
    pub key: PoolKey,
    #[serde(default)]
    pub deadline: Option<serde_json::Value>,
    #[serde(default)]
    pub hibernated: bool,
    #[serde(default)]
    pub archived: bool,
    #[serde(default)]
    pub claim_ref: Option<String>,
    #[serde(default)]
    pub failed: Option<serde_json::Value>,
    #[serde(default)]
    pub token: Option<String>,
}

/// A JSON deadline value as the listing reads it: a string parses (zero
/// time, empty → never), `null`/absent is never, anything else is kept as
/// unparseable text.
pub(crate) fn deadline_from_json(value: Option<&serde_json::Value>) -> Deadline {
    match value {
        None | Some(serde_json::Value::Null) => Deadline::Never,
        Some(serde_json::Value::String(s)) => Deadline::parse(Some(s)),
        Some(other) => Deadline::Unparseable(other.to_string()),
    }
}

impl From<SandboxInfoReply> for SandboxInfo {
    fn from(r: SandboxInfoReply) -> SandboxInfo {
        let failed = match r.failed {
            Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s),
            Some(serde_json::Value::Bool(true)) => Some("failed".to_string()),
            _ => None,
        };
        SandboxInfo {
            deadline: deadline_from_json(r.deadline.as_ref()),
            id: r.id,
            key: r.key,
            hibernated: r.hibernated,
            archived: r.archived,
            claim_ref: r.claim_ref.unwrap_or_default(),
            failed,
            token: r.token.filter(|t| !t.is_empty()).map(Secret::new),
        }
    }
}

/// `GET /v1/sandboxes/{id}/stats` (root): the VM's allocation and the host
/// VMM process's resident memory. sandboxd reports no CPU usage at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxStats {
    pub id: String,
    /// The size tier's vCPUs (an allocation, not usage).
    pub cpu_count: u64,
    /// The size tier's memory (an allocation, not usage).
    pub mem_total_bytes: u64,
    /// The VMM process's resident set: guest memory touched plus VMM
    /// overhead. `None` when sandboxd did not measure it (no VMM process:
    /// hibernated, or its pid unknown) — never read that as zero.
    pub mem_used_bytes: Option<u64>,
    pub hibernated: bool,
    /// When sandboxd measured; `None` when absent or not a time.
    pub measured_at: Option<Timestamp>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct StatsReply {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub cpu_count: u64,
    #[serde(default)]
    pub mem_total_bytes: u64,
    #[serde(default)]
    pub mem_used_bytes: u64,
    #[serde(default)]
    pub mem_used_measured: bool,
    #[serde(default)]
    pub hibernated: bool,
    #[serde(default)]
    pub measured_at: Option<String>,
}

impl From<StatsReply> for SandboxStats {
    fn from(r: StatsReply) -> SandboxStats {
        SandboxStats {
            id: r.id,
            cpu_count: r.cpu_count,
            mem_total_bytes: r.mem_total_bytes,
            mem_used_bytes: r.mem_used_measured.then_some(r.mem_used_bytes),
            hibernated: r.hibernated,
            measured_at: r.measured_at.and_then(|t| t.trim().parse().ok()),
        }
    }
}

/// `GET /v1/sandboxes/{id}/owner`: does this node own the sandbox, for
/// this token? It neither wakes a paused sandbox nor counts as activity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerProbe {
    /// `200`: owned here; `owner_addr` is sandboxd's advertised address (a
    /// `host:port`, or an origin), empty when absent.
    Owned { owner_addr: String },
    /// sandboxd's JSON `404` ("not owned here"): not on this node, gone, or
    /// not this token's.
    NotOwnedHere,
}

#[derive(Debug, Deserialize)]
pub(crate) struct OwnerReply {
    #[serde(default)]
    pub owner_addr: Option<serde_json::Value>,
}

/// `POST /v1/sandboxes/{id}/renew` body. `ttl_seconds` is always explicit:
/// sandboxd reads 0 (or an empty body, in some builds a 400) as its
/// 5-minute default, which can cut a long lease short.
#[derive(Debug, Serialize)]
pub(crate) struct RenewBody {
    pub ttl_seconds: u64,
}

impl RenewBody {
    /// Clamped to sandboxd's 24 h cap, as it would clamp it.
    pub fn new(ttl_seconds: std::num::NonZeroU64) -> RenewBody {
        RenewBody {
            ttl_seconds: ttl_seconds.get().min(MAX_TTL_SECONDS),
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct RenewReply {
    #[serde(default)]
    pub deadline: Option<serde_json::Value>,
}

/// `POST /v1/sandboxes/{id}/exec`: a buffered command (no stdin, no
/// terminal, no streaming; use the agent relay for those).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecRequest {
    /// Required, non-empty.
    pub argv: Vec<String>,
    /// Working directory in the guest; sandboxd's default when `None`.
    pub cwd: Option<String>,
    /// Added to the guest's cleared environment (`PATH`, `TERM`, proxy).
    pub env: BTreeMap<String, String>,
    /// sandboxd kills the command and answers `504` after this long; 0 sets
    /// no limit (the client's request timeout still applies).
    pub timeout_seconds: u64,
}

/// The body sent: sandboxd decodes it strictly (an unknown field is a 400),
/// so only its four fields, and the optional ones only when set.
#[derive(Debug, Serialize)]
pub(crate) struct ExecBody<'a> {
    pub argv: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<&'a str>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "is_zero")]
    pub timeout_seconds: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl<'a> From<&'a ExecRequest> for ExecBody<'a> {
    fn from(r: &'a ExecRequest) -> ExecBody<'a> {
        ExecBody {
            argv: &r.argv,
            cwd: r.cwd.as_deref(),
            env: &r.env,
            timeout_seconds: r.timeout_seconds,
        }
    }
}

/// A buffered exec's result. Output that was not UTF-8 arrives with
/// U+FFFD in its place.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ExecOutput {
    pub exit_code: i32,
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use super::*;

    #[test]
    fn renew_body_is_explicit_and_clamped() {
        let one = NonZeroU64::new(1).expect("non-zero");
        assert_eq!(
            serde_json::to_string(&RenewBody::new(one)).expect("json"),
            r#"{"ttl_seconds":1}"#
        );
        let huge = NonZeroU64::new(10_000_000_000).expect("non-zero");
        assert_eq!(RenewBody::new(huge).ttl_seconds, MAX_TTL_SECONDS);
    }

    #[test]
    fn exec_body_sends_only_what_is_set() {
        let mut req = ExecRequest {
            argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&ExecBody::from(&req)).expect("json"),
            r#"{"argv":["sh","-c","echo hi"]}"#
        );
        req.cwd = Some("/tmp".into());
        req.env.insert("A".into(), "1".into());
        req.timeout_seconds = 5;
        assert_eq!(
            serde_json::to_string(&ExecBody::from(&req)).expect("json"),
            r#"{"argv":["sh","-c","echo hi"],"cwd":"/tmp","env":{"A":"1"},"timeout_seconds":5}"#
        );
    }

    #[test]
    fn stats_without_a_measurement_have_no_memory_figure() {
        let r: StatsReply = serde_json::from_str(
            r#"{"id":"sb_1","cpu_count":1,"mem_total_bytes":536870912,"mem_used_bytes":0,
                "mem_used_measured":false,"hibernated":true,"measured_at":"2026-07-06T00:00:00Z"}"#,
        )
        .expect("stats");
        let s = SandboxStats::from(r);
        assert_eq!(s.mem_used_bytes, None);
        assert!(s.hibernated);
        assert!(s.measured_at.is_some());
    }

    #[test]
    fn info_fields() {
        let r: SandboxInfoReply = serde_json::from_str(
            r#"{"id":"sb_1","key":{"template":"t","net":"none","size":"small"},
                "deadline":"0001-01-01T00:00:00Z","hibernated":false,"archived":true,
                "failed":"vmm exited","token":"abc","x":1}"#,
        )
        .expect("info");
        let info = SandboxInfo::from(r);
        assert_eq!(info.state(), SandboxState::Archived);
        assert_eq!(info.deadline, Deadline::Never);
        assert_eq!(info.failed.as_deref(), Some("vmm exited"));
        assert!(info.is_failed());
        assert_eq!(info.token.as_ref().map(Secret::expose), Some("abc"));
        assert_eq!(
            deadline_from_json(Some(&serde_json::json!(5))),
            Deadline::Unparseable("5".into())
        );
    }
}
