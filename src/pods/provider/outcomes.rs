//! What the provider's create, hibernate and delete did, as the Pod
//! controller reads it.

use std::time::Duration;

use serde_json::Value;

use crate::pods::failure::Cause;
use crate::pods::handback::Shortfall;

/// Why a create did not produce a Running Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateFailure {
    /// `ProviderFailed` or `NoWarmCapacity` (docs/pod-contract.md).
    pub reason: &'static str,
    pub message: String,
    /// Whose trouble it is: decides what the Pod's status shows.
    pub cause: Cause,
    /// For want of capacity on this node (a capacity miss, sandboxd
    /// unreachable): past a grace the Pod is handed back.
    pub shortfall: Option<Shortfall>,
}

impl CreateFailure {
    /// vk-sandbox's own trouble (`ProviderFailed`): retried, never the Pod's.
    pub(super) fn ours(message: impl Into<String>) -> Self {
        CreateFailure {
            reason: "ProviderFailed",
            message: message.into(),
            cause: Cause::Ours,
            shortfall: None,
        }
    }

    /// The Pod cannot be claimed for as it is (`ProviderFailed`).
    pub(super) fn refused(message: impl Into<String>) -> Self {
        CreateFailure {
            cause: Cause::Pod,
            ..CreateFailure::ours(message)
        }
    }
}

/// What a successful create did.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    Claimed {
        id: String,
        status: Value,
        /// Time spent waiting on sandboxd's claim and the claims store's
        /// commit (fsync); the rest of the claim path is vk-sandbox's own.
        waited: Duration,
    },
    /// A claim kept from an earlier Pod under the same key.
    Adopted { id: String, status: Value },
    /// This same Pod's own claim, seen again after a restart: nothing
    /// changed hands, so there is nothing to announce.
    Resumed { id: String, status: Value },
    /// A claim whose VM vk-sandbox hibernated (its owner was suspended),
    /// woken for this Pod (its owner resumed).
    Woken {
        id: String,
        status: Value,
        /// Time spent waiting on sandboxd's wake and the claims store's
        /// commit; the rest of the resume's path is vk-sandbox's own.
        waited: Duration,
    },
}

/// What a hibernate did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hibernation {
    /// The VM is hibernated (sandboxd's 204), and recorded so.
    Hibernated,
    /// sandboxd refused (409: an egress-lane VM, or one with volumes): it
    /// keeps running, and is never asked again.
    Refused(String),
    /// sandboxd no longer has it (404): the claim was dropped.
    Gone,
    /// It failed (500, timeout, transport): the VM is (probably) still
    /// running; recorded as a hibernate pending, retried.
    Failed(String),
    /// A recovered claim without its token, and no node token: sandboxd
    /// cannot be asked.
    NoCredential,
}

/// What a provider delete did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deleted {
    /// A newer Pod holds the key: this request was for an old generation.
    Stale,
    /// No claim was held for the key.
    NothingHeld,
    Preserved {
        id: String,
        reason: String,
    },
    Released {
        id: String,
        reason: String,
    },
    /// The owner is suspended: the claim is kept and its VM hibernated
    /// (or, when that failed, left running with a hibernate pending).
    Hibernated {
        id: String,
        why: String,
        outcome: Hibernation,
    },
    /// The owner is suspended and the claim's VM is already as it wants
    /// it (hibernated, archived, or a hibernate pending that the upkeep
    /// retries): sandboxd was not asked, and nothing is announced again.
    Kept {
        id: String,
        why: String,
    },
    /// The owner is gone, but the claim holds no release credential (it
    /// was recovered without one) and no node token is configured (sandboxd
    /// in open mode): nothing here can release it. The row is dropped so
    /// the Pod is not held Terminating; the sandbox ends at its deadline.
    LeftToExpire {
        id: String,
        reason: String,
    },
}
