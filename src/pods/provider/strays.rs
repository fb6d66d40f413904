//! Sandboxes this node may have claimed without learning their credential
//! (lost claim replies), and their return. Only rows whose `claim_ref`
//! carries this node's tag for the Pod in question are ever returned
//! (docs/reliability.md, "Lost claim replies among neighbours").

use std::collections::HashSet;

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

    pub(super) fn note_unknown_outcome(&self, k: &str, uid: &str) {
        if self.can_release_by_id() {
            lock(&self.suspects).note_unknown(k, uid);
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
    /// holds: lost claim replies of that Pod. `running_on` (the Pod's
    /// claim-id annotation) is never touched. Only called when the Pod is
    /// known to run on none of them: right before claiming for it, or when
    /// it goes away without having run. Rows of other clients (no tag) and
    /// of other Pods are never touched.
    pub async fn return_strays(
        &self,
        k: &str,
        uid: &str,
        running_on: Option<&str>,
    ) -> Result<(), SandboxdError> {
        if !self.can_release_by_id() {
            lock(&self.suspects).forget(k);
            return Ok(());
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
        lock(&self.suspects).settled(k, uid);
        Ok(())
    }

    /// A Pod that goes away without ever having run (deleted while
    /// Pending, or vanished untracked): return what its lost claim replies
    /// left behind, if it had any. Best effort: on failure the strays stay
    /// listed and are retried by the vanished sweep.
    pub async fn forget_never_ran(&self, pod: &Pod) -> Result<(), SandboxdError> {
        let k = pod.key();
        if !self.suspect(&k) {
            return Ok(());
        }
        let running_on = pod.annotation(annotations::CLAIM_ID);
        self.return_strays(&k, pod.uid(), running_on).await
    }
}
