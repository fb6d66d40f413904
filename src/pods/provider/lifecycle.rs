//! The provider's side of the Sandbox lifecycle (docs/architecture.md,
//! "Sandbox lifecycle"): hibernate, wake and renew a claim's VM against
//! sandboxd, each outcome recorded in the claims store. What to do is
//! decided by [`crate::pods::lifecycle`]; the owner is asked through
//! [`crate::pods::owners`].

use std::num::NonZeroU64;

use jiff::Timestamp;
use tracing::{info, warn};

use super::{Hibernation, Provider};
use crate::claims::{Claim, OwnerRef, VmState};
use crate::pods::lifecycle::observe::Correction;
use crate::sandboxd::{Refusal, SandboxAuth, SandboxdError};

/// What a renewal did.
#[derive(Debug)]
pub enum Renewal {
    /// The new deadline, recorded.
    Renewed(Option<Timestamp>),
    /// sandboxd archived the VM (409, confirmed by its single read): not
    /// renewable until woken; recorded.
    Archived,
    /// sandboxd no longer has it (404).
    Gone,
    /// Failed; retried.
    Failed(SandboxdError),
    NoCredential,
}

impl Provider {
    /// The credential a verb on `claim` carries: its own token, or the node
    /// token for a claim recovered without one.
    fn auth<'a>(&self, claim: &'a Claim) -> Option<SandboxAuth<'a>> {
        match &claim.token {
            Some(token) => Some(SandboxAuth::Token(token)),
            None if self.sandboxd.has_token() => Some(SandboxAuth::Node),
            None => None,
        }
    }

    /// Hibernates `claim`'s VM for `why` and records the outcome (the owner
    /// with it, so a restart can ask it again).
    pub async fn hibernate_claim(
        &self,
        key: &str,
        claim: &Claim,
        owner: Option<OwnerRef>,
        why: &str,
    ) -> Hibernation {
        let Some(auth) = self.auth(claim) else {
            return Hibernation::NoCredential;
        };
        let result = self.sandboxd.hibernate(&claim.id, auth).await;
        let now = Timestamp::now();
        let mut deadline = None;
        let (outcome, vm, refused) = match result {
            Ok(()) => (
                Hibernation::Hibernated,
                VmState::Hibernated {
                    why: why.to_string(),
                    since: now,
                },
                false,
            ),
            // A router 404: this sandboxd build cannot hibernate at all.
            Err(e) if e.refusal() == Some(Refusal::Unsupported) => {
                (Hibernation::Refused(e.to_string()), VmState::Running, true)
            }
            // 409 is several things; the row says which. Only an egress-lane
            // or volume VM is refused for good: an archived one is asleep
            // already, a failed one may hibernate once it is booted again.
            Err(e) if e.refusal() == Some(Refusal::Conflict) => {
                match self.sandboxd.get(&claim.id).await {
                    Ok(info) if info.archived => {
                        deadline = Some(info.deadline.expires_at());
                        (
                            Hibernation::Hibernated,
                            VmState::Archived { since: now },
                            false,
                        )
                    }
                    Ok(info) if info.hibernated => (
                        Hibernation::Hibernated,
                        VmState::Hibernated {
                            why: why.to_string(),
                            since: now,
                        },
                        false,
                    ),
                    Ok(info) if !info.is_failed() => {
                        (Hibernation::Refused(e.to_string()), VmState::Running, true)
                    }
                    // Failed, or unread: pending, asked again.
                    _ => (
                        Hibernation::Failed(e.to_string()),
                        VmState::Hibernating {
                            why: why.to_string(),
                            since: now,
                        },
                        false,
                    ),
                }
            }
            Err(e) if e.is_unknown_sandbox() => {
                if let Err(e) = self.claims.remove(key, &claim.id).await {
                    warn!(pod = %key, error = %e, "the gone sandbox's record could not be removed");
                }
                return Hibernation::Gone;
            }
            Err(e) => (
                Hibernation::Failed(e.to_string()),
                VmState::Hibernating {
                    why: why.to_string(),
                    since: now,
                },
                false,
            ),
        };
        let recorded = self
            .claims
            .update_lifecycle(key, &claim.id, |l, d| {
                if l.owner.is_none() {
                    l.owner = owner;
                }
                if let Some(deadline) = deadline {
                    *d = deadline;
                }
                // A pending hibernate keeps the time it was first asked.
                let pending_again = matches!(
                    (&l.vm, &vm),
                    (VmState::Hibernating { .. }, VmState::Hibernating { .. })
                );
                if !pending_again {
                    l.vm = vm;
                }
                l.hibernate_refused |= refused;
            })
            .await;
        if let Err(e) = recorded {
            warn!(pod = %key, sandbox = %claim.id, error = %e,
                  "the hibernate's outcome could not be persisted; kept in memory");
        }
        outcome
    }

    /// Wakes `claim`'s VM (sandboxd's 204, also when it was running). The
    /// caller records it, with the adoption.
    pub async fn wake_claim(&self, claim: &Claim) -> Result<(), WakeError> {
        let auth = self.auth(claim).ok_or(WakeError::NoCredential)?;
        self.sandboxd
            .wake(&claim.id, auth)
            .await
            .map_err(|e| match e.refusal() {
                Some(Refusal::UnknownSandbox) => WakeError::Gone,
                // An early build without the route: its first relay call
                // wakes the VM.
                Some(Refusal::Unsupported) => WakeError::NoCredential,
                _ => WakeError::Failed(e),
            })
    }

    /// Renews `claim`'s lease for `ttl` seconds and records the deadline
    /// sandboxd granted (and how long it was). Without the key's lock
    /// (`held` false: a wake may be under way) a 409 is only a failure: an
    /// archive read then could be recorded after the wake that ended it.
    pub async fn renew_claim(
        &self,
        key: &str,
        claim: &Claim,
        ttl: NonZeroU64,
        held: bool,
    ) -> Renewal {
        let Some(auth) = self.auth(claim) else {
            return Renewal::NoCredential;
        };
        let asked_at = Timestamp::now();
        match self.sandboxd.renew(&claim.id, auth, ttl).await {
            Ok(deadline) => {
                let deadline = deadline.expires_at();
                let granted = deadline
                    .map(|d| d.duration_since(asked_at).as_secs())
                    .and_then(|s| u64::try_from(s).ok())
                    .filter(|s| *s > 0);
                let recorded = self
                    .claims
                    .update_lifecycle(key, &claim.id, |l, d| {
                        *d = deadline;
                        l.ttl_seconds.get_or_insert(ttl.get());
                        if granted.is_some() {
                            l.granted_seconds = granted;
                        }
                    })
                    .await;
                if let Err(e) = recorded {
                    warn!(pod = %key, sandbox = %claim.id, error = %e,
                          "the renewed deadline could not be persisted; kept in memory");
                }
                Renewal::Renewed(deadline)
            }
            Err(e) if held && e.refusal() == Some(Refusal::Conflict) => {
                // Archived (or being archived): sandboxd's single read says.
                match self.sandboxd.get(&claim.id).await {
                    Ok(info) if info.archived => {
                        let since = Timestamp::now();
                        let recorded = self
                            .claims
                            .update_lifecycle(key, &claim.id, |l, d| {
                                l.vm = VmState::Archived { since };
                                *d = info.deadline.expires_at();
                            })
                            .await;
                        if let Err(e) = recorded {
                            warn!(pod = %key, error = %e, "archived state not persisted");
                        }
                        info!(pod = %key, sandbox = %claim.id,
                              "sandboxd archived this sandbox: not renewable until woken");
                        Renewal::Archived
                    }
                    _ => Renewal::Failed(e),
                }
            }
            Err(e) if e.is_unknown_sandbox() => Renewal::Gone,
            Err(e) => Renewal::Failed(e),
        }
    }

    /// Corrects `key`'s record of its VM to what sandboxd listed, if the
    /// row still holds `claim` as it was read before the listing (a
    /// transition recorded since is newer than the listing). `true`: it
    /// was corrected.
    pub async fn take_observed(
        &self,
        key: &str,
        claim: &Claim,
        seen: Correction,
        deadline: Option<Timestamp>,
    ) -> bool {
        let now = Timestamp::now();
        let recorded = claim.lifecycle.vm.clone();
        let mut taken = false;
        let written = self
            .claims
            .update_lifecycle(key, &claim.id, |l, d| {
                if l.vm != recorded {
                    return;
                }
                l.vm = match seen {
                    Correction::Running => VmState::Running,
                    Correction::Hibernated => VmState::Hibernated {
                        why: "hibernated by sandboxd (idle)".to_string(),
                        since: now,
                    },
                    Correction::Archived => VmState::Archived { since: now },
                };
                // sandboxd's deadline with it: a VM woken from the archive
                // runs on a fresh lease, and the record still held the
                // archive's (days away), so its renewal was never due and
                // sandboxd reaped it under a living owner (reliability
                // scenario 11).
                *d = deadline;
                taken = true;
            })
            .await;
        match written {
            Ok(_) => taken,
            Err(e) => {
                warn!(pod = %key, sandbox = %claim.id, error = %e,
                      "the VM state sandboxd lists could not be recorded; observed again");
                false
            }
        }
    }
}

/// Why a wake did not happen.
#[derive(Debug)]
pub enum WakeError {
    /// sandboxd no longer has the sandbox (its lease ended, or its archive
    /// was deleted).
    Gone,
    Failed(SandboxdError),
    NoCredential,
}

impl std::fmt::Display for WakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WakeError::Gone => f.write_str("sandboxd no longer has this sandbox"),
            WakeError::Failed(e) => write!(f, "{e}"),
            WakeError::NoCredential => f.write_str(
                "the claim was recovered without its token and no node token is configured",
            ),
        }
    }
}

impl Provider {
    /// The settled claims (the ones the upkeep looks after), by key.
    pub fn settled_claims(&self) -> Vec<(String, Claim)> {
        self.claims
            .all()
            .into_iter()
            .filter(|(_, _, state)| *state == crate::claims::ClaimState::Settled)
            .map(|(k, c, _)| (k, c))
            .collect()
    }

    /// Records the owner a claim serves, if none is recorded yet.
    pub async fn record_owner(
        &self,
        key: &str,
        id: &str,
        owner: OwnerRef,
    ) -> crate::error::Result<()> {
        self.claims
            .update_lifecycle(key, id, |l, _| {
                if l.owner.is_none() {
                    l.owner = Some(owner);
                }
            })
            .await
            .map(drop)
    }

    /// `key`'s row, if it is settled.
    pub fn settled_claims_of(&self, key: &str) -> Option<Claim> {
        match self.claims.get(key) {
            Some((claim, crate::claims::ClaimState::Settled)) => Some(claim),
            _ => None,
        }
    }

    /// Releases `claim` for the upkeep (its owner is gone, expired or moved)
    /// and forgets it. `Ok(false)`: no credential can release it (recovered
    /// claim, no node token); the row is dropped and the VM ends at its
    /// deadline.
    pub async fn release_held(&self, key: &str, claim: &Claim) -> Result<bool, SandboxdError> {
        if self.claims.get(key).is_none_or(|(c, _)| c.id != claim.id) {
            return Ok(true);
        }
        let released = self.release_claim(claim).await?;
        if let Err(e) = self.claims.remove(key, &claim.id).await {
            warn!(pod = %key, error = %e, "release done but its record could not be removed");
        }
        Ok(released)
    }

    /// sandboxd no longer has a claim whose Pod runs here (a renewal
    /// answered 404): its deadline becomes now, so the lease-expiry watch
    /// confirms it with the listing and reports the Pod's lease ended.
    pub async fn lease_gone(&self, key: &str, claim: &Claim) {
        let now = Timestamp::now();
        if let Err(e) = self
            .claims
            .update_lifecycle(key, &claim.id, |_, d| *d = Some(now))
            .await
        {
            warn!(pod = %key, error = %e, "the ended lease could not be recorded");
        }
    }
}
