//! How the kubelet API reaches the sandbox behind a Pod: which sandbox (the
//! Pod must be bound to this node and hold a settled claim), and sandboxd's
//! data plane for it (the guest agent relay, a guest port relay, stats),
//! authenticated with the claim's own token, which never leaves this
//! process.

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::claims::{ClaimState, ClaimsStore};
use crate::pods::pod::Pod;
use crate::pods::source::PodSource;
use crate::sandboxd::Secret;

/// An upgraded relay: bytes to and from the guest.
pub trait RelayIo: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> RelayIo for T {}
pub type Relay = Box<dyn RelayIo>;

/// The sandbox serving a Pod.
#[derive(Clone, Debug)]
pub struct SandboxRef {
    /// sandboxd's sandbox id.
    pub id: String,
    /// The claim's token (authenticates `/agent` and `/ports`).
    pub token: Secret,
}

/// Why a relay could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    /// sandboxd does not know the sandbox (404), or refuses it (409).
    #[error("sandboxd no longer serves the sandbox ({status}: {message})")]
    Gone { status: u16, message: String },
    /// The guest side is unreachable (502): nothing listens on the guest
    /// port, or the guest agent does not answer.
    #[error("{0}")]
    Unreachable(String),
    /// Any other answer.
    #[error("sandboxd answered {status}: {message}")]
    Status { status: u16, message: String },
    /// sandboxd could not be reached, or the upgrade failed.
    #[error("sandboxd: {0}")]
    Transport(String),
    /// The session's Pod no longer holds the sandbox it was opened on
    /// (deleted, being deleted, another claim): nothing is asked of
    /// sandboxd, whose relays would wake a hibernated VM.
    #[error("{0}")]
    Withdrawn(String),
}

/// sandboxd's memory figures for one sandbox (`GET …/stats`, node token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxStats {
    /// The VMM's resident set; `None` when there is no VMM to measure
    /// (hibernated): not a zero.
    pub mem_used_bytes: Option<u64>,
    /// The size tier's memory (an allocation).
    pub mem_total_bytes: u64,
    pub hibernated: bool,
    pub measured_at: Option<jiff::Timestamp>,
}

/// sandboxd's data plane.
pub trait DataPlane: Send + Sync {
    /// `GET /v1/sandboxes/{id}/agent`, upgraded: the guest agent's frames.
    fn agent<'a>(&'a self, sandbox: &'a SandboxRef) -> BoxFuture<'a, Result<Relay, RelayError>>;
    /// `GET /v1/sandboxes/{id}/ports/{port}`, upgraded: a TCP stream to the
    /// guest's loopback `port`.
    fn port<'a>(
        &'a self,
        sandbox: &'a SandboxRef,
        port: u16,
    ) -> BoxFuture<'a, Result<Relay, RelayError>>;
    /// `GET /v1/sandboxes/{id}/stats` with the node token.
    fn stats<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<SandboxStats, RelayError>>;
}

/// Why a Pod's sandbox cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// No such Pod is bound to this node (or its UID differs).
    NoPod,
    /// The Pod is here but holds no usable claim; the text says why.
    NoSandbox(String),
}

/// Finds the sandbox behind a Pod.
pub trait Sandboxes: Send + Sync {
    /// The sandbox serving Pod `ns/name` (and `uid`, when the request names
    /// one).
    fn lookup(&self, ns: &str, name: &str, uid: Option<&str>) -> Result<SandboxRef, Unavailable>;
    /// Every Pod of this node running in a sandbox, with it.
    fn running(&self) -> Vec<(Pod, SandboxRef)>;
}

/// The Pods of this node and the claims store.
pub struct ClaimedSandboxes {
    pods: Arc<dyn PodSource>,
    claims: Arc<ClaimsStore>,
}

impl ClaimedSandboxes {
    pub fn new(pods: Arc<dyn PodSource>, claims: Arc<ClaimsStore>) -> ClaimedSandboxes {
        ClaimedSandboxes { pods, claims }
    }
}

impl Sandboxes for ClaimedSandboxes {
    fn lookup(&self, ns: &str, name: &str, uid: Option<&str>) -> Result<SandboxRef, Unavailable> {
        let pod = self.pods.node_pod(ns, name).ok_or(Unavailable::NoPod)?;
        let pod_uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if uid.is_some_and(|u| u != pod_uid) {
            return Err(Unavailable::NoPod);
        }
        let key = format!("{ns}/{name}");
        // A Pod being deleted may be a suspend: its VM is being (or was)
        // hibernated, and a relay would wake it again.
        if pod.metadata.deletion_timestamp.is_some() {
            return Err(Unavailable::NoSandbox(format!(
                "pod {key} is being deleted: its sandbox is no longer reached through the \
                 kubelet API (a suspended Sandbox's VM stays hibernated until its Pod is back)"
            )));
        }
        let (claim, state) = self.claims.get(&key).ok_or_else(|| {
            Unavailable::NoSandbox(format!(
                "pod {key} has no sandbox: vk-sandbox holds no claim for it (it may be \
                 waiting for warm capacity, or failed; see its events)"
            ))
        })?;
        let tracked = self
            .pods
            .running_pod(ns, name)
            .map(|p| p.metadata.uid.as_deref().unwrap_or_default() == pod_uid);
        decide(state, tracked).map_err(|why| Unavailable::NoSandbox(format!("pod {key} {why}")))?;
        let token = claim.token.as_ref().ok_or_else(|| {
            Unavailable::NoSandbox(format!(
                "pod {key}'s sandbox {} was recovered without its own token, which sandboxd's \
                 relays require",
                claim.id
            ))
        })?;
        Ok(SandboxRef {
            id: claim.id.clone(),
            token: Secret::clone(token),
        })
    }

    fn running(&self) -> Vec<(Pod, SandboxRef)> {
        self.pods
            .running_pods()
            .into_iter()
            .filter_map(|pod| match self.claims.get(&pod.key()) {
                Some((claim, ClaimState::Settled)) => {
                    let token = claim.token.as_deref().cloned().unwrap_or_default();
                    Some((
                        pod,
                        SandboxRef {
                            id: claim.id,
                            token,
                        },
                    ))
                }
                _ => None,
            })
            .collect()
    }
}

/// Whether a claim in `state` serves the Pod: it must be settled and the
/// provider must track this very Pod (`tracked_same_uid`: `None` = not
/// tracked). Pure.
pub fn decide(state: ClaimState, tracked_same_uid: Option<bool>) -> Result<(), &'static str> {
    match (state, tracked_same_uid) {
        (ClaimState::Settled, Some(true)) => Ok(()),
        (ClaimState::Settled, Some(false)) => Err(
            "has a sandbox held for an earlier Pod of the same name; it is handed over once this \
             Pod is adopted",
        ),
        (ClaimState::Settled, None) => Err("is not running on this node yet"),
        (ClaimState::Tentative, _) => {
            Err("is being claimed for; its sandbox is not recorded yet, try again in a moment")
        }
        (ClaimState::Quarantined, _) => Err(
            "has a sandbox from before vk-sandbox restarted that sandboxd has not confirmed yet; \
             try again in a moment",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_settled_claim_of_the_tracked_pod_serves() {
        assert_eq!(decide(ClaimState::Settled, Some(true)), Ok(()));
        for (state, tracked) in [
            (ClaimState::Settled, Some(false)),
            (ClaimState::Settled, None),
            (ClaimState::Tentative, Some(true)),
            (ClaimState::Quarantined, Some(true)),
            (ClaimState::Tentative, None),
        ] {
            assert!(decide(state, tracked).is_err(), "{state:?} {tracked:?}");
        }
    }
}
