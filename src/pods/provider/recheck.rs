//! Preserved claims whose key has no Pod here: their owners are asked
//! again, so a claim whose owner goes away while its replacement never
//! reaches this node (unschedulable, deleted while Pending) is still
//! released. Only claims with no owner recorded: the others are the
//! lifecycle upkeep's.

use std::time::Instant;

use tracing::{info, warn};

use super::{Provider, lock};
use crate::periodic::Beat;
use crate::pods::authority::OwnerState;

impl Provider {
    /// Asks the owner of every preserved claim due at `now` whose key has
    /// no Pod here; one that is now gone or tearing down releases the
    /// claim as the Pod's deletion would have. Each key is worked on under
    /// its lock, and `beat` is beaten per owner asked. Failures are logged
    /// and retried on a later call.
    pub async fn recheck_preserved(&self, beat: &Beat, now: Instant) {
        let due: Vec<String> = lock(&self.preserved)
            .iter()
            .filter(|(_, p)| p.due(now))
            .map(|(k, _)| k.clone())
            .collect();
        // Those the upkeep looks after leave without waiting for their key.
        let due: Vec<String> = due
            .into_iter()
            .filter(|k| {
                let upkeep = self
                    .claims
                    .get(k)
                    .is_some_and(|(c, _)| c.lifecycle.owner.is_some());
                if upkeep {
                    lock(&self.preserved).remove(k);
                }
                !upkeep
            })
            .collect();
        for k in due {
            beat.beat();
            let _key = self.lock_key(&k).await;
            let Some(entry) = lock(&self.preserved).get(&k).cloned() else {
                continue;
            };
            let row = self.claims.get(&k).filter(|(c, _)| c.id == entry.id);
            let held = row.is_some();
            // A claim with its owner recorded is the lifecycle upkeep's
            // (pods/upkeep.rs): it asks that owner, also after a restart.
            let owner_recorded = row.is_some_and(|(c, _)| c.lifecycle.owner.is_some());
            if !held || owner_recorded || self.tracked(&k).is_some() {
                lock(&self.preserved).remove(&k);
                continue;
            }
            let reason = match self.owners.of_pod(&entry.pod).await.state() {
                OwnerState::Gone(why) => why,
                OwnerState::None => "the Pod has no controller owner".to_string(),
                OwnerState::Alive(_) | OwnerState::Doubt(_) => {
                    if let Some(p) = lock(&self.preserved).get_mut(&k) {
                        p.asked(Instant::now());
                    }
                    continue;
                }
            };
            info!(pod = %k, sandbox = %entry.id, %reason,
                  "the owner of a preserved sandbox went away with no Pod of its key on this node");
            if let Err(e) = self.delete(&entry.pod).await {
                warn!(pod = %k, sandbox = %entry.id, error = %e,
                      "releasing a preserved sandbox failed; retried later");
            }
        }
    }
}
