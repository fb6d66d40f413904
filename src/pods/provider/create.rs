//! Create: adopt a held claim or claim a new sandbox for a Pod.

use std::sync::Arc;

use crate::pods::pod::Pod;
use tracing::warn;

use jiff::Timestamp;

use super::{CreateFailure, Created, Provider, uid, view};
use crate::claims::{Claim, ClaimState};
use crate::pods::annotations::{self, key};
use crate::pods::{claim_ref, status};

impl Provider {
    /// Create: adopt a held claim or claim a new sandbox.
    pub async fn create(&self, pod: &Arc<Pod>) -> Result<Created, CreateFailure> {
        let k = key(pod);
        // 1. Runtime gate.
        annotations::runtime_gate(pod).map_err(CreateFailure::provider)?;

        // 2. A claim from a previous run must be vouched for by sandboxd.
        if let Some((_, ClaimState::Quarantined)) = self.claims.get(&k) {
            self.refresh().await.map_err(|e| {
                CreateFailure::provider(format!(
                    "a claim from a previous run is unverified and sandboxd cannot be listed; \
                     refusing to claim over a possibly live sandbox: {e}"
                ))
            })?;
        }

        // 3. A settled claim past its cached deadline: sandboxd decides.
        if let Some((claim, ClaimState::Settled)) = self.claims.get(&k)
            && claim.deadline.is_some_and(|d| d <= Timestamp::now())
        {
            let listing = self.list().await.map_err(|e| {
                CreateFailure::provider(format!(
                    "the claim for {k} is past its cached deadline and sandboxd cannot be \
                     listed; refusing to replace it: {e}"
                ))
            })?;
            match listing.iter().find(|r| r.id == claim.id) {
                Some(row) => self.take_listed_deadline(&k, &claim, row).await,
                None => {
                    let _ = self.claims.remove(&k, &claim.id).await;
                }
            }
        }

        // 4. Adopt in place: the VM outlived its previous Pod (or this
        // process restarted under the same Pod).
        if let Some((claim, ClaimState::Settled)) = self.claims.get(&k) {
            let same_pod = !claim.pod_uid.is_empty() && claim.pod_uid == uid(pod);
            if let Err(e) = self.claims.rebind(&k, &claim.id, uid(pod)).await {
                warn!(pod = %k, error = %e, "adoption not persisted; the claim is kept in memory");
            }
            self.track(pod);
            let claim = self.claims.get(&k).map(|(c, _)| c).unwrap_or(claim);
            let (id, status) = (claim.id.clone(), status::running(pod, &view(&claim)));
            return Ok(if same_pod {
                Created::Resumed { id, status }
            } else {
                Created::Adopted { id, status }
            });
        }

        // 5. A stranded claim (an earlier commit and undo both failed). One
        // without a credential is a recovered claim whose commit failed: it
        // is the Pod's running sandbox, not ours to return; drop the row and
        // recover it again below.
        if let Some((claim, ClaimState::Tentative)) = self.claims.get(&k)
            && claim.token.is_empty()
        {
            let _ = self.claims.remove(&k, &claim.id).await;
        }
        if let Some((claim, ClaimState::Tentative)) = self.claims.get(&k) {
            self.undo_release(&claim).await.map_err(|e| {
                CreateFailure::provider(format!(
                    "a previous sandbox {} for {k} could not be returned and its credential \
                     is only in memory: {e}",
                    claim.id
                ))
            })?;
            let _ = self.claims.remove(&k, &claim.id).await;
        }

        // A Pod already running on a sandbox no claim holds: the claims
        // state was lost or replaced while its VM kept serving. Adopt it
        // (released later with the node token) rather than return it as a
        // stray or claim a second one.
        if let Some(adopted) = self.recover_lost_claim(pod, &k).await? {
            return Ok(adopted);
        }

        // 6–7. What to claim.
        let request = annotations::claim_request(pod).map_err(CreateFailure::provider)?;

        // Return strays of this Pod's earlier claims whose reply was lost.
        if self.suspect(&k) {
            self.return_strays(&k, uid(pod), None).await.map_err(|e| {
                CreateFailure::provider(format!(
                    "cannot check for, or return, a sandbox an earlier claim for {k} may \
                     have left behind; refusing to claim twice: {e}"
                ))
            })?;
        }

        // 8. Claim. The sandboxd call and the commit below are timed so
        // the provider's own share of the claim path can be told apart
        // from the waits on sandboxd and the disk.
        let waiting = std::time::Instant::now();
        let granted = match self.sandboxd.claim(&request).await {
            Ok(c) => c,
            Err(e) => {
                if e.is_outcome_unknown() {
                    self.note_unknown_outcome(&k, uid(pod));
                }
                let reason = if e.is_capacity_miss() {
                    "NoWarmCapacity"
                } else {
                    "ProviderFailed"
                };
                return Err(CreateFailure {
                    reason,
                    message: format!("claim sandbox for {k} (template {}): {e}", request.template),
                });
            }
        };

        // 9. Durable before it counts.
        let claim = Claim {
            id: granted.id.clone(),
            token: granted.token.expose().to_string(),
            address: granted.owner_addr.clone(),
            pod_uid: uid(pod).to_string(),
            claimed_at: Timestamp::now(),
            deadline: granted.deadline.expires_at(),
        };
        let claimed = waiting.elapsed();
        let committing = std::time::Instant::now();
        let committed = self.claims.commit(&k, claim.clone()).await;
        let waited = claimed + committing.elapsed();
        if let Err(persist) = committed {
            // 10. Undo: return the sandbox rather than hold an unrecorded credential.
            return match self.undo_release(&claim).await {
                Ok(()) => {
                    let _ = self.claims.remove(&k, &claim.id).await;
                    Err(CreateFailure::provider(format!(
                        "persist claim for {k}: {persist}"
                    )))
                }
                Err(undo) => Err(CreateFailure::provider(format!(
                    "persist claim for {k}: {persist}; returning sandbox {} also failed: {undo}",
                    claim.id
                ))),
            };
        }
        self.track(pod);
        // 11. Running, from the row as stored (times at the store's
        // precision), so a later re-publish computes the same status.
        let claim = self.claims.get(&k).map(|(c, _)| c).unwrap_or(claim);
        Ok(Created::Claimed {
            id: claim.id.clone(),
            status: status::running(pod, &view(&claim)),
            waited,
        })
    }

    /// The Pod names (claim-id annotation) a sandbox sandboxd lists under
    /// this Pod's key, and no stored claim holds it: its credential is gone
    /// but the VM is the Pod's. Recorded with an empty token, which
    /// [`Provider::delete`] releases with the node token.
    async fn recover_lost_claim(
        &self,
        pod: &Arc<Pod>,
        k: &str,
    ) -> Result<Option<Created>, CreateFailure> {
        let Some(id) = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::CLAIM_ID))
            .filter(|id| !id.is_empty())
        else {
            return Ok(None);
        };
        if self.claims.held_ids().contains(id) {
            return Ok(None);
        }
        let listing = self.list().await.map_err(|e| {
            CreateFailure::provider(format!(
                "{k} ran on sandbox {id}, which no stored claim holds, and sandboxd cannot be \
                 listed to check whether it lives; refusing to claim a second one: {e}"
            ))
        })?;
        let Some(row) = listing
            .iter()
            .find(|r| r.id == *id && claim_ref::names_key(&r.claim_ref, k))
        else {
            return Ok(None);
        };
        let address = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default();
        let claim = Claim {
            id: id.clone(),
            token: String::new(),
            address,
            pod_uid: uid(pod).to_string(),
            claimed_at: Timestamp::now(),
            deadline: row.deadline.expires_at(),
        };
        if let Err(e) = self.claims.commit(k, claim.clone()).await {
            // Nothing to undo (the sandbox is the Pod's, and there is no
            // credential to lose): drop the row so the next try recovers it
            // again instead of finding a stranded claim it cannot return.
            let _ = self.claims.remove(k, id).await;
            return Err(CreateFailure::provider(format!(
                "persist the recovered claim of {k} on sandbox {id}: {e}"
            )));
        }
        warn!(
            pod = %k,
            sandbox = %id,
            "adopted a running sandbox whose release credential was not in the claims state \
             (state file lost or replaced?); it will be released with the node token"
        );
        self.track(pod);
        Ok(Some(Created::Adopted {
            id: claim.id.clone(),
            status: status::running(pod, &view(&claim)),
        }))
    }
}
