//! One reading of sandboxd's `GET /v1/info`, as the feed shares it.

use crate::sandboxd::{NodeInfo, SandboxdError};

/// Why a read failed, as far as the Node is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// No reply: connection refused or reset, timeout, a body cut short.
    Unreachable,
    /// sandboxd answered with a failure status or an unreadable body.
    Failing,
    /// `401`/`403`: the token is not sandboxd's root token. sandboxd may
    /// well serve claims; vk-sandbox cannot tell, so it says "unknown".
    Refused,
}

impl FailureKind {
    /// The kind of a failed `info` call.
    pub fn of(e: &SandboxdError) -> FailureKind {
        match e {
            SandboxdError::Transport { .. } => FailureKind::Unreachable,
            _ if matches!(e.status(), Some(401 | 403)) => FailureKind::Refused,
            _ => FailureKind::Failing,
        }
    }
}

/// The latest reading of `/v1/info`. A failed read is never an empty one:
/// it keeps the last good reply beside the failure.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    /// Nothing read yet.
    NotYet,
    /// The last read succeeded.
    Read(NodeInfo),
    /// The last `consecutive` reads failed; `last` is the last good reply.
    Failed {
        kind: FailureKind,
        message: String,
        consecutive: u32,
        last: Option<NodeInfo>,
    },
}

impl Reading {
    /// The reading after one more read.
    pub fn next(&self, read: Result<NodeInfo, (FailureKind, String)>) -> Reading {
        match read {
            Ok(info) => Reading::Read(info),
            Err((kind, message)) => {
                let (consecutive, last) = match self {
                    Reading::NotYet => (0, None),
                    Reading::Read(info) => (0, Some(info.clone())),
                    Reading::Failed {
                        consecutive, last, ..
                    } => (*consecutive, last.clone()),
                };
                Reading::Failed {
                    kind,
                    message,
                    consecutive: consecutive.saturating_add(1),
                    last,
                }
            }
        }
    }

    /// The reply of the last read, if it succeeded.
    pub fn info(&self) -> Option<&NodeInfo> {
        match self {
            Reading::Read(info) => Some(info),
            _ => None,
        }
    }

    /// The last good reply, even behind failures since.
    pub fn last_good(&self) -> Option<&NodeInfo> {
        match self {
            Reading::Read(info) => Some(info),
            Reading::Failed { last, .. } => last.as_ref(),
            Reading::NotYet => None,
        }
    }
}

/// A reading as the feed shares it: `seq` counts the reads, so a reader
/// can wait for one taken after a moment of its own (the NodeInventory
/// publisher reads its listing first, then wants an info read after it).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub seq: u64,
    pub reading: Reading,
}
