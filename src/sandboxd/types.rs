//! Wire types of the four calls vk-sandbox makes
//! (docs/architecture.md#sandboxd-api).
//!
//! Replies are decoded leniently: unknown fields (newer builds' extras,
//! `engine` inside `key`) are ignored.

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::lease_deadline::{Deadline, deserialize_deadline};
use super::owner_addr::{NoUsableAddress, OwnerAddr, pod_ip_from_owner_addr};

/// The longest lease sandboxd grants; the client clamps requests to it.
pub const MAX_TTL_SECONDS: u64 = 86_400;

/// A secret (a sandbox token, or the node token). Its `Debug` and `Display`
/// never show the value.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself, for the Authorization header or the claims file.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("Secret(<empty>)")
        } else {
            f.write_str("Secret(<redacted>)")
        }
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A sandbox's release credential: a [`Secret`] that is never empty. A
/// claim reply without one is refused; a claim recovered without its
/// credential has none (`Option<Token>`).
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Secret);

impl Token {
    /// `None` for an empty string: no credential.
    pub fn new(value: impl Into<String>) -> Option<Token> {
        let value = value.into();
        (!value.is_empty()).then(|| Token(Secret::new(value)))
    }
}

/// A token is used wherever a secret is (a release request, the claims
/// file's `expose`).
impl std::ops::Deref for Token {
    type Target = Secret;

    fn deref(&self) -> &Secret {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// `POST /v1/claim` request. `template` is always sent;
/// `net`, `size`, `ttl_seconds` and `claim_ref` only when non-empty/non-zero;
/// `no_redirect` never.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimRequest {
    pub template: String,
    pub net: String,
    pub size: String,
    /// Requested lease in seconds; 0 means "server default" (5 min). Values
    /// above [`MAX_TTL_SECONDS`] are clamped before sending.
    pub ttl_seconds: u64,
    /// `"<namespace>/<podName>"`.
    pub claim_ref: String,
}

/// The body actually sent; built from a [`ClaimRequest`].
#[derive(Debug, Serialize)]
pub struct ClaimBody<'a> {
    template: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    net: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    size: &'a str,
    #[serde(skip_serializing_if = "is_zero")]
    ttl_seconds: u64,
    #[serde(skip_serializing_if = "str::is_empty")]
    claim_ref: &'a str,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl<'a> From<&'a ClaimRequest> for ClaimBody<'a> {
    fn from(r: &'a ClaimRequest) -> Self {
        ClaimBody {
            template: &r.template,
            net: &r.net,
            size: &r.size,
            ttl_seconds: r.ttl_seconds.min(MAX_TTL_SECONDS),
            claim_ref: &r.claim_ref,
        }
    }
}

/// A granted claim: sandboxd's reply to `POST /v1/claim` (`200` with a
/// non-empty `id`). The stored row is [`crate::claims::Claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    pub id: String,
    /// The sandbox credential; returned only in this reply.
    pub token: Token,
    pub deadline: Deadline,
    /// The raw `owner_addr` (empty when absent). See [`Granted::owner`].
    pub owner_addr: String,
    pub from_checkpoint: Option<String>,
}

impl Granted {
    /// `owner_addr` classified into its shapes.
    pub fn owner(&self) -> OwnerAddr {
        OwnerAddr::parse(Some(&self.owner_addr))
    }

    /// The Pod IP to publish, or why there is none.
    pub fn pod_ip(&self) -> Result<IpAddr, NoUsableAddress> {
        pod_ip_from_owner_addr(&self.owner_addr)
    }
}

/// Raw claim reply, decoded leniently.
#[derive(Debug, Deserialize)]
pub(crate) struct ClaimReply {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default, deserialize_with = "deserialize_deadline")]
    pub deadline: Deadline,
    #[serde(default)]
    pub owner_addr: Option<serde_json::Value>,
    #[serde(default)]
    pub from_checkpoint: Option<serde_json::Value>,
    #[serde(default)]
    pub redirect: Option<serde_json::Value>,
}

/// Outcome of a successful release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// `204`: released now.
    Released,
    /// `404` with sandboxd's JSON error: unknown id, wrong token, or already
    /// released or reaped. Counts as success.
    AlreadyGone,
}

/// A pool key. `engine` is sent by some builds only;
/// it is carried onto the NodeInventory and otherwise ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolKey {
    #[serde(default)]
    pub template: String,
    #[serde(default)]
    pub net: String,
    #[serde(default)]
    pub size: String,
    /// Empty when absent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub engine: String,
}

/// Derived state of a listed sandbox (sandboxd has no `phase` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    Running,
    Hibernated,
    Archived,
}

/// One row of `GET /v1/sandboxes`. Tokens never appear here.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SandboxRow {
    pub id: String,
    #[serde(default)]
    pub key: PoolKey,
    #[serde(default, deserialize_with = "deserialize_deadline")]
    pub deadline: Deadline,
    #[serde(default)]
    pub hibernated: bool,
    #[serde(default)]
    pub archived: bool,
    /// Empty when absent.
    #[serde(default)]
    pub claim_ref: String,
}

impl SandboxRow {
    /// A running row with no deadline, for tests.
    #[cfg(test)]
    pub(crate) fn for_test(id: &str, claim_ref: &str) -> SandboxRow {
        SandboxRow {
            id: id.into(),
            key: PoolKey::default(),
            deadline: Deadline::Never,
            hibernated: false,
            archived: false,
            claim_ref: claim_ref.into(),
        }
    }

    pub fn state(&self) -> SandboxState {
        if self.archived {
            SandboxState::Archived
        } else if self.hibernated {
            SandboxState::Hibernated
        } else {
            SandboxState::Running
        }
    }
}

/// `GET /v1/sandboxes` reply. `sandboxes` is required: a reply without it
/// is a decode error, never an empty list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct ListReply {
    pub sandboxes: Vec<SandboxRow>,
}

/// One pool in `GET /v1/info`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PoolInfo {
    #[serde(default)]
    pub key: PoolKey,
    #[serde(default)]
    pub warm: u64,
    #[serde(default)]
    pub refilling: u64,
    #[serde(default)]
    pub target: u64,
    #[serde(default)]
    pub golden: bool,
}

/// `GET /v1/info` reply. `pools` is required; the rest defaults.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NodeInfo {
    pub pools: Vec<PoolInfo>,
    #[serde(default)]
    pub claimed: u64,
    #[serde(default)]
    pub hibernated: u64,
    #[serde(default)]
    pub archived: u64,
    #[serde(default)]
    pub draining: bool,
    #[serde(default)]
    pub peers: Vec<String>,
    /// Newer builds, only while refills are parked for lack of room on the
    /// host (`max_running`): warm VMs still serve claims, but a warm miss
    /// cannot be provisioned.
    #[serde(default)]
    pub at_capacity: bool,
    #[serde(default)]
    pub at_capacity_reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_body_omits_empty_fields_and_clamps_ttl() {
        let req = ClaimRequest {
            template: "base:24.04".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&ClaimBody::from(&req)).expect("json"),
            r#"{"template":"base:24.04"}"#
        );
        let req = ClaimRequest {
            template: "base:24.04".into(),
            net: "egress".into(),
            size: "medium".into(),
            ttl_seconds: 10_000_000_000,
            claim_ref: "team-a/worker-0".into(),
        };
        assert_eq!(
            serde_json::to_string(&ClaimBody::from(&req)).expect("json"),
            r#"{"template":"base:24.04","net":"egress","size":"medium","ttl_seconds":86400,"claim_ref":"team-a/worker-0"}"#
        );
    }

    #[test]
    fn secrets_are_redacted() {
        let s = Secret::new("tok-123");
        assert!(!format!("{s:?}").contains("tok-123"));
        assert!(!format!("{s}").contains("tok-123"));
        assert_eq!(s.expose(), "tok-123");
    }

    #[test]
    fn row_state() {
        let row: SandboxRow = serde_json::from_str(
            r#"{"id":"sb_1","key":{"template":"t","net":"none","size":"small","engine":"ch"},
                "deadline":"0001-01-01T00:00:00Z","hibernated":false,"archived":true}"#,
        )
        .expect("row");
        assert_eq!(row.state(), SandboxState::Archived);
        assert_eq!(row.deadline, Deadline::Never);
        assert_eq!(row.key.template, "t");
    }
}
