//! Why sandboxd refused a lifecycle or data-plane call: one kind per status
//! its contract gives these routes (docs/architecture.md#sandboxd-api), so
//! callers match on a kind instead of on numbers.

use std::fmt;

use serde::Deserialize;

#[derive(Deserialize)]
struct ErrorBody {
    error: String,
}

/// The `error` field of sandboxd's `{"error":"…"}` body, if the body is one
/// (the Go router's own replies are plain text).
pub fn json_error_message(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<ErrorBody>(body)
        .ok()
        .map(|b| b.error)
}

/// A refusal's kind, from its status and whether the body is sandboxd's own
/// `{"error": …}` (the Go router's replies are plain text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// `400`: a malformed body or path (a bad port, an empty argv).
    BadRequest,
    /// `401`: no bearer token, or an unknown node token.
    Unauthorized,
    /// `403`: a root-only route called with a tenant token, or the claim's
    /// tenant was removed (renew).
    Forbidden,
    /// `404` with sandboxd's JSON error: unknown id or wrong token. For a
    /// sandbox whose token is right, it is gone (released or reaped).
    UnknownSandbox,
    /// `404` or `405` from the router (plain text): this sandboxd build has
    /// no such route (early builds lack wake, renew, exec, ports).
    Unsupported,
    /// `409`: not in this state — an egress-lane or volume sandbox cannot
    /// hibernate, an archived one cannot be renewed (wake it first), a
    /// failed one has no guest, a passive relay to a paused one.
    Conflict,
    /// `413`: a buffered exec's output exceeded sandboxd's cap.
    TooLarge,
    /// `426`: the upgrade header was missing or wrong.
    UpgradeRequired,
    /// `429`: over a quota.
    TooManyRequests,
    /// `500`: the operation failed in sandboxd (`hibernate failed`,
    /// `wake failed`, `renew failed`, `sandbox lookup failed`).
    Failed,
    /// `502`: the guest agent or guest port could not be reached.
    GuestUnreachable,
    /// `503`: sandboxd is busy (the buffered-exec budget); retry later.
    Busy,
    /// `504`: a buffered exec ran past its `timeout_seconds`.
    TimedOut,
    /// Any other status.
    Other,
}

impl Refusal {
    /// Classify a failure reply.
    pub fn classify(status: u16, body: &[u8]) -> Refusal {
        let from_sandboxd = json_error_message(body).is_some();
        match status {
            400 => Refusal::BadRequest,
            401 => Refusal::Unauthorized,
            403 => Refusal::Forbidden,
            404 if from_sandboxd => Refusal::UnknownSandbox,
            404 | 405 => Refusal::Unsupported,
            409 => Refusal::Conflict,
            413 => Refusal::TooLarge,
            426 => Refusal::UpgradeRequired,
            429 => Refusal::TooManyRequests,
            500 => Refusal::Failed,
            502 => Refusal::GuestUnreachable,
            503 => Refusal::Busy,
            504 => Refusal::TimedOut,
            _ => Refusal::Other,
        }
    }

    /// A short, stable name, usable as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::BadRequest => "bad_request",
            Refusal::Unauthorized => "unauthorized",
            Refusal::Forbidden => "forbidden",
            Refusal::UnknownSandbox => "unknown_sandbox",
            Refusal::Unsupported => "unsupported",
            Refusal::Conflict => "conflict",
            Refusal::TooLarge => "too_large",
            Refusal::UpgradeRequired => "upgrade_required",
            Refusal::TooManyRequests => "too_many_requests",
            Refusal::Failed => "failed",
            Refusal::GuestUnreachable => "guest_unreachable",
            Refusal::Busy => "busy",
            Refusal::TimedOut => "timed_out",
            Refusal::Other => "other",
        }
    }

    /// What it means, for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Refusal::BadRequest => "bad request",
            Refusal::Unauthorized => "unauthorized (missing or unknown token)",
            Refusal::Forbidden => "forbidden (needs the root token)",
            Refusal::UnknownSandbox => "unknown sandbox (gone, or not this token's)",
            Refusal::Unsupported => "not supported by this sandboxd build (router reply)",
            Refusal::Conflict => "not possible in the sandbox's state",
            Refusal::TooLarge => "output too large",
            Refusal::UpgradeRequired => "upgrade required",
            Refusal::TooManyRequests => "too many requests",
            Refusal::Failed => "failed in sandboxd",
            Refusal::GuestUnreachable => "guest unreachable",
            Refusal::Busy => "sandboxd busy, retry later",
            Refusal::TimedOut => "command timed out",
            Refusal::Other => "unexpected status",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_status_has_its_kind() {
        let json = br#"{"error":"x"}"#;
        for (status, want) in [
            (400, Refusal::BadRequest),
            (401, Refusal::Unauthorized),
            (403, Refusal::Forbidden),
            (404, Refusal::UnknownSandbox),
            (405, Refusal::Unsupported),
            (409, Refusal::Conflict),
            (413, Refusal::TooLarge),
            (426, Refusal::UpgradeRequired),
            (429, Refusal::TooManyRequests),
            (500, Refusal::Failed),
            (502, Refusal::GuestUnreachable),
            (503, Refusal::Busy),
            (504, Refusal::TimedOut),
            (418, Refusal::Other),
            (200, Refusal::Other),
        ] {
            assert_eq!(Refusal::classify(status, json), want, "{status}");
        }
    }

    #[test]
    fn a_router_404_is_an_unsupported_build_not_a_gone_sandbox() {
        assert_eq!(
            Refusal::classify(404, b"404 page not found\n"),
            Refusal::Unsupported
        );
        assert_eq!(Refusal::classify(404, b""), Refusal::Unsupported);
        assert_eq!(
            Refusal::classify(404, br#"{"error":"unknown sandbox"}"#),
            Refusal::UnknownSandbox
        );
        // A JSON body without sandboxd's `error` field is not sandboxd's.
        assert_eq!(
            Refusal::classify(404, br#"{"message":"nope"}"#),
            Refusal::Unsupported
        );
    }

    #[test]
    fn labels_are_distinct() {
        let all = [
            Refusal::BadRequest,
            Refusal::Unauthorized,
            Refusal::Forbidden,
            Refusal::UnknownSandbox,
            Refusal::Unsupported,
            Refusal::Conflict,
            Refusal::TooLarge,
            Refusal::UpgradeRequired,
            Refusal::TooManyRequests,
            Refusal::Failed,
            Refusal::GuestUnreachable,
            Refusal::Busy,
            Refusal::TimedOut,
            Refusal::Other,
        ];
        let labels: std::collections::BTreeSet<_> = all.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels.len(), all.len());
        let texts: std::collections::BTreeSet<_> = all.iter().map(|r| r.describe()).collect();
        assert_eq!(texts.len(), all.len());
    }
}
