//! The warm pools' refill and the node's running slots (`max_running`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use tracing::warn;

use super::Sim;
use super::state::State;
use crate::model::PoolKey;

impl Sim {
    /// VMs using a running slot: warm, refilling, and claims that are
    /// neither hibernated, archived nor failed.
    pub(super) fn running_vms(st: &State) -> usize {
        let pooled: u32 = st.pools.values().map(|p| p.warm + p.refilling).sum();
        pooled as usize + st.claims.values().filter(|c| c.is_running()).count()
    }

    /// Whether another VM can start (`max_running`).
    pub(super) fn has_free_slot(st: &State) -> bool {
        st.cfg.max_running == 0 || Self::running_vms(st) < st.cfg.max_running as usize
    }

    /// Refill every pool (a slot may have come free).
    pub(super) fn refill_all(self: &Arc<Self>, st: &mut State) {
        let keys: Vec<PoolKey> = st.pools.keys().cloned().collect();
        for key in keys {
            self.top_up(st, &key);
        }
    }

    /// Schedule refills until warm + refilling reaches the target (or the
    /// node has no running slot left: the refill parks).
    pub(super) fn top_up(self: &Arc<Self>, st: &mut State, key: &PoolKey) {
        let delay = Duration::from_millis(st.cfg.refill_delay_ms);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            warn!("sandboxd-sim: no async runtime, pools will not refill");
            return;
        };
        loop {
            let free = Self::has_free_slot(st);
            let Some(pool) = st.pools.get_mut(key) else {
                return;
            };
            if pool.warm + pool.refilling >= pool.target || !free {
                return;
            }
            pool.refilling += 1;
            let weak: Weak<Sim> = Arc::downgrade(self);
            let key = key.clone();
            runtime.spawn(async move {
                tokio::time::sleep(delay).await;
                if let Some(sim) = weak.upgrade() {
                    let mut st = sim.lock();
                    if let Some(pool) = st.pools.get_mut(&key) {
                        pool.refilling = pool.refilling.saturating_sub(1);
                        if pool.warm < pool.target {
                            pool.warm += 1;
                        }
                    }
                }
            });
        }
    }
}
