//! sandboxd's data model: pool keys, claim records, the lenient claim
//! decoder, TTL clamping and the wire formats of ids, tokens and deadlines.

use jiff::Timestamp;
use jiff::tz::Offset;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Request bodies above this get `400 invalid request body`, as sandboxd's.
pub const MAX_BODY: usize = 1024 * 1024;
/// Default lease for `ttl_seconds` ≤ 0 or absent.
pub const DEFAULT_TTL_SECONDS: i64 = 300;
/// Silent hard cap on leases.
pub const MAX_TTL_SECONDS: i64 = 86_400;
/// Go's zero `time.Time` as sandboxd writes it.
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

pub const NETS: &[&str] = &["none", "egress"];
pub const SIZES: &[&str] = &["small", "medium", "large", "xlarge", "2xlarge"];

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PoolKey {
    pub template: String,
    pub net: String,
    pub size: String,
}

impl PoolKey {
    /// Fill defaults (`none`, `small`), then validate. The error is the text
    /// after `invalid pool key: `.
    pub fn new(template: &str, net: &str, size: &str) -> Result<PoolKey, String> {
        let net = if net.is_empty() { "none" } else { net };
        let size = if size.is_empty() { "small" } else { size };
        if template.is_empty() {
            return Err("template must not be empty".to_string());
        }
        if !NETS.contains(&net) {
            return Err(format!("unknown net {net:?}"));
        }
        if !SIZES.contains(&size) {
            return Err(format!("unknown size {size:?}"));
        }
        Ok(PoolKey {
            template: template.to_string(),
            net: net.to_string(),
            size: size.to_string(),
        })
    }

    pub fn to_json(&self, engine: bool) -> Value {
        let mut v = serde_json::json!({
            "template": self.template, "net": self.net, "size": self.size,
        });
        if engine {
            v["engine"] = Value::from("ch");
        }
        v
    }
}

/// A live claim as sandboxd keeps (and persists) it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
    pub id: String,
    pub key: PoolKey,
    pub token: String,
    /// `None`: never expires (written as the zero time).
    pub deadline: Option<Timestamp>,
    #[serde(default)]
    pub claim_ref: String,
    #[serde(default)]
    pub hibernated: bool,
    #[serde(default)]
    pub archived: bool,
    #[serde(default)]
    pub tenant: Option<String>,
    pub ttl_seconds: i64,
    pub claimed_at: Timestamp,
    /// Late builds: the VMM died and was not restarted (the reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// Volumes attached (set through the admin API): such a claim cannot
    /// hibernate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
    /// `"archive"` (set by a renew) archives the claim at its deadline.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub on_expire: String,
    /// Last data-plane activity on the simulated clock (claim, wake, renew,
    /// relay): the idle-hibernation and archive clocks run from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_activity: Option<Timestamp>,
    /// What `/stats` reports as the VMM's resident memory; absent = a
    /// quarter of the size tier's memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_used_bytes: Option<u64>,
}

impl ClaimRecord {
    /// Running: neither hibernated, archived nor failed.
    pub fn is_running(&self) -> bool {
        !self.hibernated && !self.archived && self.failed.is_none()
    }

    /// An egress-lane claim or one with volumes cannot hibernate (nor be
    /// archived).
    pub fn cannot_hibernate(&self) -> Option<&'static str> {
        if self.key.net == "egress" {
            Some("sandbox on the egress lane cannot hibernate")
        } else if !self.volumes.is_empty() {
            Some("sandbox with volumes attached cannot hibernate")
        } else {
            None
        }
    }

    /// Archive: checkpointed to the store, the local VM dropped; the
    /// deadline becomes the retention window (`0` = kept for ever, the zero
    /// deadline).
    pub fn archive(&mut self, now: Timestamp, retention_seconds: u64) {
        self.hibernated = false;
        self.archived = true;
        self.deadline = i64::try_from(retention_seconds)
            .ok()
            .filter(|r| *r > 0)
            .and_then(|r| now.checked_add(jiff::SignedDuration::from_secs(r)).ok());
    }

    /// Idle since (the claim time when nothing happened since).
    pub fn idle_since(&self) -> Timestamp {
        self.last_activity.unwrap_or(self.claimed_at)
    }
}

/// A size tier's allocation: vCPUs and memory in bytes.
pub fn size_tier(size: &str) -> (u64, u64) {
    const MIB: u64 = 1024 * 1024;
    match size {
        "medium" => (2, 1024 * MIB),
        "large" => (4, 4096 * MIB),
        "xlarge" => (4, 8192 * MIB),
        "2xlarge" => (8, 16384 * MIB),
        _ => (1, 512 * MIB),
    }
}

/// The fields of a claim request sandboxd reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimBody {
    pub template: String,
    pub net: String,
    pub size: String,
    pub ttl_seconds: i64,
    pub claim_ref: String,
    pub no_redirect: bool,
}

/// A claim body sandboxd answers with `400 invalid request body`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid request body")]
pub struct InvalidBody;

/// Decode a claim body the way Go's `encoding/json` does for sandboxd:
/// only the first JSON value is read, field names match case-insensitively,
/// unknown fields are ignored, `null` leaves a field at its zero value, and
/// a mistyped field fails the whole decode.
pub fn decode_claim_body(bytes: &[u8]) -> Result<ClaimBody, InvalidBody> {
    if bytes.len() > MAX_BODY {
        return Err(InvalidBody);
    }
    let mut values = serde_json::Deserializer::from_slice(bytes).into_iter::<Value>();
    let map = match values.next() {
        Some(Ok(Value::Object(map))) => map,
        Some(Ok(Value::Null)) => return Ok(ClaimBody::default()),
        _ => return Err(InvalidBody),
    };
    let mut body = ClaimBody::default();
    for (name, value) in map {
        if value.is_null() {
            continue;
        }
        let string = |v: &Value| v.as_str().map(str::to_string).ok_or(InvalidBody);
        match name.to_lowercase().as_str() {
            "template" => body.template = string(&value)?,
            "net" => body.net = string(&value)?,
            "size" => body.size = string(&value)?,
            "claim_ref" => body.claim_ref = string(&value)?,
            "ttl_seconds" => body.ttl_seconds = value.as_i64().ok_or(InvalidBody)?,
            "no_redirect" => body.no_redirect = value.as_bool().ok_or(InvalidBody)?,
            _ => {}
        }
    }
    Ok(body)
}

/// The fields of a renew request sandboxd reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenewBody {
    pub ttl_seconds: i64,
    /// `destroy`, `archive`, or `None` to keep the claim's expiry action.
    pub on_expire: Option<String>,
}

/// Decode a renew body: like the claim decoder (first value, names in any
/// case, unknown fields ignored), except that an empty body is refused, as
/// the server code read does (the late doc says it means `ttl_seconds: 0`).
pub fn decode_renew_body(bytes: &[u8]) -> Result<RenewBody, InvalidBody> {
    if bytes.len() > MAX_BODY || bytes.trim_ascii().is_empty() {
        return Err(InvalidBody);
    }
    let mut values = serde_json::Deserializer::from_slice(bytes).into_iter::<Value>();
    let map = match values.next() {
        Some(Ok(Value::Object(map))) => map,
        _ => return Err(InvalidBody),
    };
    let mut body = RenewBody::default();
    for (name, value) in map {
        if value.is_null() {
            continue;
        }
        match name.to_lowercase().as_str() {
            "ttl_seconds" => body.ttl_seconds = value.as_i64().ok_or(InvalidBody)?,
            "on_expire" => body.on_expire = Some(value.as_str().ok_or(InvalidBody)?.to_string()),
            _ => {}
        }
    }
    Ok(body)
}

/// ≤ 0 → 5 min; above 24 h → 24 h.
pub fn clamp_ttl(requested: i64) -> i64 {
    if requested <= 0 {
        DEFAULT_TTL_SECONDS
    } else {
        requested.min(MAX_TTL_SECONDS)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `sb_` + 16 lowercase hex characters.
pub fn new_id() -> String {
    format!("sb_{}", hex(&rand::random::<[u8; 8]>()))
}

/// 32 lowercase hex characters.
pub fn new_token() -> String {
    hex(&rand::random::<[u8; 16]>())
}

/// RFC 3339 as Go writes `time.Time`: fraction with trailing zeros dropped,
/// `Z` for UTC or `±hh:mm` for another offset.
pub fn format_deadline(ts: Timestamp, offset_minutes: i32) -> String {
    if offset_minutes == 0 {
        return ts.to_string();
    }
    match Offset::from_seconds(offset_minutes.saturating_mul(60)) {
        Ok(offset) => ts.display_with_offset(offset).to_string(),
        Err(_) => ts.to_string(),
    }
}

/// Constant-time string comparison, as sandboxd compares tokens.
pub fn ct_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of an `Authorization: Bearer <token>` header: exact-case
/// prefix, non-empty token.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    header
        .and_then(|h| h.strip_prefix("Bearer "))
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_default_then_validate() {
        let k = PoolKey::new("base:24.04", "", "").expect("key");
        assert_eq!((k.net.as_str(), k.size.as_str()), ("none", "small"));
        assert_eq!(
            PoolKey::new("", "", "").expect_err("empty"),
            "template must not be empty"
        );
        assert_eq!(
            PoolKey::new("t", "", "huge").expect_err("size"),
            "unknown size \"huge\""
        );
        assert!(PoolKey::new("t", "wifi", "").is_err());
    }

    #[test]
    fn claim_body_is_decoded_like_go() {
        let b = decode_claim_body(
            br#"{"Template":"t","NET":"egress","ttl_seconds":-5,"claim_ref":"a/b","unknown":{"x":1}} trailing"#,
        )
        .expect("body");
        assert_eq!(b.template, "t");
        assert_eq!(b.net, "egress");
        assert_eq!(b.ttl_seconds, -5);
        assert_eq!(b.claim_ref, "a/b");
        for bad in [
            &b""[..],
            b"[]",
            b"{",
            br#"{"template":1}"#,
            br#"{"ttl_seconds":1.5}"#,
            br#"{"no_redirect":"yes"}"#,
        ] {
            assert!(
                decode_claim_body(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn renew_body_needs_a_value() {
        assert_eq!(
            decode_renew_body(br#"{"TTL_Seconds":60,"x":1}"#).expect("body"),
            RenewBody {
                ttl_seconds: 60,
                on_expire: None
            }
        );
        assert_eq!(
            decode_renew_body(br#"{"on_expire":"archive"}"#)
                .expect("body")
                .on_expire
                .as_deref(),
            Some("archive")
        );
        assert_eq!(
            decode_renew_body(b"{}").expect("empty object").ttl_seconds,
            0
        );
        for bad in [
            &b""[..],
            b"  \n",
            b"null",
            b"[]",
            br#"{"ttl_seconds":"60"}"#,
        ] {
            assert!(
                decode_renew_body(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn ttl_rules() {
        assert_eq!(clamp_ttl(0), 300);
        assert_eq!(clamp_ttl(-7), 300);
        assert_eq!(clamp_ttl(60), 60);
        assert_eq!(clamp_ttl(10_000_000_000), 86_400);
    }

    #[test]
    fn ids_tokens_and_deadlines() {
        let id = new_id();
        assert!(id.starts_with("sb_") && id.len() == 19, "{id}");
        assert_eq!(new_token().len(), 32);
        let ts: Timestamp = "2026-07-06T00:05:00.120Z".parse().expect("ts");
        assert_eq!(format_deadline(ts, 0), "2026-07-06T00:05:00.12Z");
        assert_eq!(format_deadline(ts, 480), "2026-07-06T08:05:00.12+08:00");
        let whole: Timestamp = "2026-07-06T00:05:00Z".parse().expect("ts");
        assert_eq!(format_deadline(whole, 0), "2026-07-06T00:05:00Z");
    }

    #[test]
    fn bearer_prefix_is_exact() {
        assert_eq!(bearer(Some("Bearer tok")), Some("tok"));
        assert_eq!(bearer(Some("bearer tok")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(Some("Bearertok")), None);
        assert_eq!(bearer(None), None);
        assert!(ct_eq("abc", "abc") && !ct_eq("abc", "abd") && !ct_eq("abc", "ab"));
    }
}
