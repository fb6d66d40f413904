//! The client's error taxonomy.

use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

use super::refusal::Refusal;

/// Which sandboxd call an error or an observation belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Claim,
    Release,
    List,
    Info,
    /// `POST /v1/sandboxes/{id}/hibernate`.
    Hibernate,
    /// `POST /v1/sandboxes/{id}/wake`.
    Wake,
    /// `POST /v1/sandboxes/{id}/renew`.
    Renew,
    /// `GET /v1/sandboxes/{id}` (root).
    Get,
    /// `GET /v1/sandboxes/{id}/stats` (root).
    Stats,
    /// `GET /v1/sandboxes/{id}/owner`.
    Owner,
    /// `POST /v1/sandboxes/{id}/exec` (buffered).
    Exec,
    /// `GET /v1/sandboxes/{id}/agent` (upgrade; observed until the `101`).
    Agent,
    /// `GET /v1/sandboxes/{id}/ports/{port}` (upgrade; observed until the
    /// `101`).
    Port,
    /// `POST /v1/drain` (root; operator-only).
    Drain,
    /// `DELETE /v1/drain` (root; operator-only).
    Undrain,
}

impl Op {
    /// A short, stable name (`claim`, `release`, `list`, `info`,
    /// `hibernate`, `wake`, `renew`, `get`, `stats`, `owner`, `exec`,
    /// `agent`, `port`, `drain`, `undrain`), usable as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Claim => "claim",
            Op::Release => "release",
            Op::List => "list",
            Op::Info => "info",
            Op::Hibernate => "hibernate",
            Op::Wake => "wake",
            Op::Renew => "renew",
            Op::Get => "get",
            Op::Stats => "stats",
            Op::Owner => "owner",
            Op::Exec => "exec",
            Op::Agent => "agent",
            Op::Port => "port",
            Op::Drain => "drain",
            Op::Undrain => "undrain",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything a sandboxd call can fail with.
#[derive(Debug, Error)]
pub enum SandboxdError {
    /// A claim delivered nothing on this node: a `429`, or a `200` without an
    /// `id` (an empty body or a redirect, which is never followed). No claim
    /// was created.
    #[error("sandboxd claim: node at capacity or draining{}", suffix(message))]
    CapacityMiss { message: String },

    /// sandboxd (or something in front of it) answered with a failure status.
    /// `message` is the decoded `{"error": …}` field, or empty.
    #[error("sandboxd {op}: unexpected status {status}{}", suffix(message))]
    Http {
        op: Op,
        status: u16,
        message: String,
    },

    /// A lifecycle or data-plane call (hibernate, wake, renew, get, stats,
    /// owner, exec, agent, port) refused with a failure status; `reason`
    /// tells the statuses apart (a JSON `404` "unknown sandbox" from the
    /// router's plain-text `404` of a build without the route, a `409`
    /// state conflict, a `502` unreachable guest …). `message` is
    /// sandboxd's `error` field, or empty.
    #[error("sandboxd {op}: {reason} (status {status}){}", suffix(message))]
    Refused {
        op: Op,
        status: u16,
        reason: Refusal,
        message: String,
    },

    /// The request did not complete: connection refused or reset, timeout, or
    /// a reply body cut short. On a claim the outcome is unknown: sandboxd may
    /// have created and persisted the claim (see [`Self::is_outcome_unknown`]).
    #[error(
        "sandboxd {op}: {}: {}{}",
        transport_kind(*timeout),
        chain(source),
        outcome_note(*op, source)
    )]
    Transport {
        op: Op,
        timeout: bool,
        #[source]
        source: reqwest::Error,
    },

    /// A reply with a success status whose body could not be understood.
    #[error("sandboxd {op}: decode (status {status}): {message}")]
    Decode {
        op: Op,
        status: u16,
        message: String,
    },

    /// The call was refused locally, before anything was sent.
    #[error("sandboxd {op}: {message}")]
    InvalidRequest { op: Op, message: String },

    /// The client could not be built (bad base URL, TLS set-up).
    #[error("sandboxd client: {0}")]
    Config(String),

    /// A call did not finish within the caller's own deadline (beyond the
    /// client's per-request timeout, e.g. a detached compensating release).
    #[error("sandboxd {op}: no answer within {after:?}")]
    Timeout { op: Op, after: std::time::Duration },

    /// A release by id answered sandboxd's JSON `404` ("unknown sandbox")
    /// while the listing still shows the sandbox: the node token may not
    /// release by id. That is the answer a tenant token gets, and any token
    /// when sandboxd runs without `api_token`. Not proof that it is gone.
    #[error(
        "sandboxd release of {id}: answered 404 \"unknown sandbox\" but sandboxd still lists it; \
         the node token cannot release sandboxes by id (give vk-sandbox sandboxd's root api_token \
         in --sandboxd-token-file, not a tenant token)"
    )]
    NotReleased { id: String },

    /// The node token file could not be read.
    #[error("cannot read the sandboxd token file {}: {source}", path.display())]
    TokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn suffix(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

/// The error and its causes, `a: b: c` (reqwest's own text omits them).
fn chain(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

fn outcome_note(op: Op, source: &reqwest::Error) -> &'static str {
    if op == Op::Claim && !source.is_connect() {
        " (outcome unknown: sandboxd may have created the claim)"
    } else {
        ""
    }
}

fn transport_kind(timeout: bool) -> &'static str {
    if timeout {
        "request timed out"
    } else {
        "transport error"
    }
}

impl SandboxdError {
    /// A short, stable label for metrics (`error` label of failure counters).
    pub fn metric_label(&self) -> &'static str {
        match self {
            SandboxdError::CapacityMiss { .. } => "sandboxd_capacity_miss",
            SandboxdError::Http { .. } => "sandboxd_http",
            SandboxdError::Refused { .. } => "sandboxd_refused",
            SandboxdError::Transport { timeout: true, .. } => "sandboxd_timeout",
            SandboxdError::Transport { .. } => "sandboxd_transport",
            SandboxdError::Decode { .. } => "sandboxd_decode",
            SandboxdError::InvalidRequest { .. } => "sandboxd_invalid_request",
            SandboxdError::Config(_) => "sandboxd_config",
            SandboxdError::Timeout { .. } => "sandboxd_timeout",
            SandboxdError::NotReleased { .. } => "sandboxd_not_released",
            SandboxdError::TokenFile { .. } => "sandboxd_token_file",
        }
    }

    /// The call this error came from, when it came from one.
    pub fn op(&self) -> Option<Op> {
        match self {
            SandboxdError::CapacityMiss { .. } => Some(Op::Claim),
            SandboxdError::Http { op, .. }
            | SandboxdError::Refused { op, .. }
            | SandboxdError::Transport { op, .. }
            | SandboxdError::Decode { op, .. }
            | SandboxdError::InvalidRequest { op, .. }
            | SandboxdError::Timeout { op, .. } => Some(*op),
            SandboxdError::NotReleased { .. } => Some(Op::Release),
            SandboxdError::Config(_) | SandboxdError::TokenFile { .. } => None,
        }
    }

    /// True when a claim may have been created and persisted by sandboxd even
    /// though the caller got no usable reply: a transport error or timeout on
    /// a claim, or a `200` claim reply whose body could not be decoded. The
    /// caller must look for a stray row under its `claim_ref` rather than
    /// assume nothing happened (sandboxd persists a claim before replying).
    ///
    /// The same holds for hibernate, wake and renew: sandboxd finishes a
    /// started transition even when its client hangs up, so a transport
    /// error or timeout there may have paused, woken or renewed the sandbox
    /// (all three are safe to retry; renew moves the deadline again).
    ///
    /// A connection that could not be established (refused, unreachable)
    /// carried no request, so its outcome is known: nothing was created.
    pub fn is_outcome_unknown(&self) -> bool {
        match self {
            SandboxdError::Transport {
                op: Op::Claim | Op::Hibernate | Op::Wake | Op::Renew,
                source,
                ..
            } => !source.is_connect(),
            SandboxdError::Decode {
                op: Op::Claim | Op::Renew,
                ..
            } => true,
            _ => false,
        }
    }

    /// True for a `429`-or-redirect capacity miss on a claim.
    pub fn is_capacity_miss(&self) -> bool {
        matches!(self, SandboxdError::CapacityMiss { .. })
    }

    /// The HTTP status of an [`SandboxdError::Http`],
    /// [`SandboxdError::Refused`] or [`SandboxdError::Decode`] error.
    pub fn status(&self) -> Option<u16> {
        match self {
            SandboxdError::Http { status, .. }
            | SandboxdError::Refused { status, .. }
            | SandboxdError::Decode { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The kind of a [`SandboxdError::Refused`] error.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            SandboxdError::Refused { reason, .. } => Some(*reason),
            _ => None,
        }
    }

    /// True when the sandbox is gone for this token: sandboxd's JSON `404`
    /// on a lifecycle or data-plane call (never the router's plain-text
    /// `404`, which means the build lacks the route).
    pub fn is_unknown_sandbox(&self) -> bool {
        self.refusal() == Some(Refusal::UnknownSandbox)
    }
}
