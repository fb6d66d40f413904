//! Sandboxes this node may have claimed without learning their credential
//! (lost claim replies), and their return. Only rows whose `claim_ref`
//! carries this node's tag for the Pod in question are ever returned
//! (docs/reliability.md, "Lost claim replies among neighbours").

use std::collections::HashSet;
use std::time::Instant;

use crate::pods::pod::Pod;
use tracing::{info, warn};

use super::{Provider, lock};
use crate::pods::annotations;
use crate::pods::claim_ref;
use crate::sandboxd::{ReleaseOutcome, SandboxRow, SandboxdError};

impl Provider {
    /// Recomputes the keys under which `listing` shows rows tagged as this
    /// node's (see [`claim_ref`]) that no stored claim holds. Rows without
    /// the tag (other clients of sandboxd, rows written by the Go
    /// implementation) never count. Nothing is marked without a node token:
    /// such strays could not be returned anyway.
    pub fn note_listing(&self, listing: &[SandboxRow]) {
        let keys: HashSet<String> = if self.can_release_by_id() {
            let held = self.claims.held_ids();
            listing
                .iter()
                .filter(|r| !held.contains(&r.id))
                .filter_map(|r| {
                    let p = claim_ref::parse(&r.claim_ref);
                    p.ours.map(|_| p.key.to_string())
                })
                .collect()
        } else {
            HashSet::new()
        };
        lock(&self.suspects).set_listed(keys);
    }

    /// Whether a stray of ours may exist under `key`.
    pub fn suspect(&self, key: &str) -> bool {
        lock(&self.suspects).suspect(key)
    }

    /// The Pods whose last claim had an unknown outcome, as (key, UID).
    pub fn unknown_outcomes(&self) -> Vec<(String, String)> {
        lock(&self.suspects).unknown()
    }

    pub(crate) fn note_unknown_outcome(&self, k: &str, uid: &str) {
        if self.can_release_by_id() {
            lock(&self.suspects).note_unknown(k, uid, Instant::now());
        } else {
            warn!(
                pod = %k,
                "the claim's outcome is unknown and no node token is configured (sandboxd open \
                 mode): a sandbox it may have created cannot be returned and ends at its deadline"
            );
        }
    }

    /// Release any sandbox by id with the node token. A `404` is proof that
    /// it is gone only once a listing no longer shows it: a tenant token, or
    /// any token against a sandboxd without `api_token`, gets the same
    /// answer for a sandbox it may not touch.
    pub(super) async fn release_by_id(&self, id: &str) -> Result<(), SandboxdError> {
        match self.sandboxd.release_as_node(id).await? {
            ReleaseOutcome::Released => Ok(()),
            ReleaseOutcome::AlreadyGone => {
                if self.list().await?.iter().any(|r| r.id == id) {
                    Err(SandboxdError::NotReleased { id: id.to_string() })
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Returns, with the node token, the sandboxes sandboxd lists as
    /// claimed by this node for the Pod (`k`, `uid`) that no stored claim
    /// holds: lost claim replies of that Pod. `running_on` (the sandbox the
    /// Pod runs on) is never touched. Rows of other clients (no tag) and of
    /// other Pods are never touched. Returns when the listing was taken. An
    /// unknown outcome of the Pod is kept (the row may not be listed yet):
    /// only [`Provider::return_strays_of_gone`] settles it.
    pub async fn return_strays(
        &self,
        k: &str,
        uid: &str,
        running_on: Option<&str>,
    ) -> Result<Instant, SandboxdError> {
        let listed_at = Instant::now();
        if !self.can_release_by_id() {
            return Ok(listed_at);
        }
        let mut listing = self.list().await?;
        let held = self.claims.held_ids();
        let strays: Vec<String> = listing
            .iter()
            .filter(|r| {
                claim_ref::made_for(&r.claim_ref, k, uid)
                    && !held.contains(&r.id)
                    && running_on != Some(r.id.as_str())
            })
            .map(|r| r.id.clone())
            .collect();
        for id in &strays {
            self.release_by_id(id).await?;
            info!(pod = %k, sandbox = %id, "returned a sandbox whose claim reply was lost");
        }
        // The listing as it stands now: the returned rows are gone.
        listing.retain(|r| !strays.contains(&r.id));
        self.note_listing(&listing);
        Ok(listed_at)
    }

    /// The Pod (`k`, `uid`) is gone: return its strays, and settle its
    /// unknown claim outcome once the listing came long enough after it
    /// (see `suspects.rs`). `Ok(false)`: not settled yet, look again later.
    pub async fn return_strays_of_gone(&self, k: &str, uid: &str) -> Result<bool, SandboxdError> {
        let listed_at = self.return_strays(k, uid, None).await?;
        Ok(lock(&self.suspects).settle(k, uid, listed_at, self.settle_after))
    }

    /// The Pod (`k`, `uid`) runs on `held`: rows made for it other than
    /// that one are lost claim replies (sandboxd persisted a claim after
    /// its reply timed out, and the Pod claimed again). Return them now,
    /// not once the Pod is gone, and settle its unknown outcome once the
    /// listing came long enough after it. `Ok(false)`: not settled yet.
    pub async fn return_strays_of_running(
        &self,
        k: &str,
        uid: &str,
        held: &str,
    ) -> Result<bool, SandboxdError> {
        let listed_at = self.return_strays(k, uid, Some(held)).await?;
        Ok(lock(&self.suspects).settle(k, uid, listed_at, self.settle_after))
    }

    /// The sandbox the Pod (`k`, `uid`) runs on: the key's settled claim,
    /// made or last adopted for that Pod.
    pub fn running_on(&self, k: &str, uid: &str) -> Option<String> {
        self.claims
            .get(k)
            .filter(|(c, state)| *state == crate::claims::ClaimState::Settled && c.pod_uid == uid)
            .map(|(c, _)| c.id)
    }

    /// A Pod that goes away without ever having run (deleted while
    /// Pending): return what its lost claim replies left behind, if it had
    /// any. Best effort: on failure, or while its outcome cannot be settled
    /// yet, the vanished sweep looks again once the Pod is gone.
    pub async fn forget_never_ran(&self, pod: &Pod) -> Result<(), SandboxdError> {
        let k = pod.key();
        if !self.suspect(&k) {
            return Ok(());
        }
        let running_on = pod.annotation(annotations::CLAIM_ID);
        let listed_at = self.return_strays(&k, pod.uid(), running_on).await?;
        lock(&self.suspects).settle(&k, pod.uid(), listed_at, self.settle_after);
        Ok(())
    }

    /// A Pod that ran is deleted: sandboxes made for it other than the one
    /// it held (`held`) go back too, if the key is suspect (a lost reply
    /// of this Pod, or an unheld row of ours listed under the key). Best
    /// effort: the vanished sweep looks again once the Pod is gone.
    pub(super) async fn return_others_of(&self, pod: &Pod, held: &str) {
        let k = pod.key();
        if !self.suspect(&k) {
            return;
        }
        if let Err(e) = self.return_strays(&k, pod.uid(), Some(held)).await {
            warn!(pod = %k, error = %e, "strays of a deleted Pod not returned yet; retried once it is gone");
        }
    }
}
