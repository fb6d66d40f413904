//! The provider's Delete: whether a Pod's deletion keeps, hibernates,
//! preserves or releases its claim, decided once from its owner's state.

use jiff::Timestamp;
use tracing::{info, warn};

use super::preserved::Preserved;
use super::{Deleted, Provider, lock};
use crate::pods::lifecycle::decide::{self, OnDelete};
use crate::pods::pod::Pod;
use crate::sandboxd::SandboxdError;

impl Provider {
    /// Provider Delete: preserve unless the owner is confirmed gone or
    /// tearing down; release with the claim's own token. Either way, other
    /// sandboxes made for this Pod (lost claim replies) go back.
    pub async fn delete(&self, pod: &Pod) -> Result<Deleted, SandboxdError> {
        let k = pod.key();
        if let Some(t) = self.tracked(&k)
            && t.uid() != pod.uid()
        {
            return Ok(Deleted::Stale);
        }
        let Some((claim, _state)) = self.claims.get(&k) else {
            self.untrack(&k, pod.uid());
            return Ok(Deleted::NothingHeld);
        };
        let owner = self.owners.of_pod(pod).await;
        // A newer Pod may have taken the key while the owner was asked.
        if let Some(t) = self.tracked(&k)
            && t.uid() != pod.uid()
        {
            return Ok(Deleted::Stale);
        }
        match decide::on_delete(
            &owner.state(),
            &claim.lifecycle,
            Timestamp::now(),
            self.lifecycle.hibernate_on_suspend,
        ) {
            OnDelete::Keep(why) => {
                info!(pod = %k, sandbox = %claim.id, %why, "owner suspended; the VM is left as it is");
                self.untrack(&k, pod.uid());
                self.return_others_of(pod, &claim.id).await;
                Ok(Deleted::Kept { id: claim.id, why })
            }
            OnDelete::Hibernate(why) => {
                // Untracked first: the kubelet API's lookup no longer hands
                // the claim's token to a relay, which would wake the VM
                // right after (or behind) the hibernate.
                self.untrack(&k, pod.uid());
                let outcome = self
                    .hibernate_claim(&k, &claim, owner.recorded(), "suspended")
                    .await;
                info!(pod = %k, sandbox = %claim.id, %why, ?outcome, "owner suspended");
                self.return_others_of(pod, &claim.id).await;
                Ok(Deleted::Hibernated {
                    id: claim.id,
                    why,
                    outcome,
                })
            }
            OnDelete::Preserve(reason) => {
                info!(pod = %k, sandbox = %claim.id, %reason,
                      "preserving sandbox: pod deletion is not VM authority");
                if let Some(owner) = owner.recorded()
                    && let Err(e) = self.record_owner(&k, &claim.id, owner).await
                {
                    warn!(pod = %k, error = %e, "the preserved claim's owner was not recorded");
                }
                lock(&self.preserved).insert(k.clone(), Preserved::new(&claim.id, pod));
                self.untrack(&k, pod.uid());
                self.return_others_of(pod, &claim.id).await;
                Ok(Deleted::Preserved {
                    id: claim.id,
                    reason,
                })
            }
            OnDelete::Release(reason) => {
                let released = self.release_claim(&claim).await?;
                lock(&self.preserved).remove(&k);
                if let Err(e) = self.claims.remove(&k, &claim.id).await {
                    warn!(pod = %k, error = %e, "release done but its record could not be removed");
                }
                self.untrack(&k, pod.uid());
                self.return_others_of(pod, &claim.id).await;
                if released {
                    info!(pod = %k, sandbox = %claim.id, %reason, "released sandbox");
                    Ok(Deleted::Released {
                        id: claim.id,
                        reason,
                    })
                } else {
                    warn!(pod = %k, sandbox = %claim.id, %reason,
                          "no credential can release this recovered claim (no node token): \
                           it ends at its deadline");
                    Ok(Deleted::LeftToExpire {
                        id: claim.id,
                        reason,
                    })
                }
            }
        }
    }
}
