//! The admin operations behind `/_sim`: faults, configuration, pools,
//! claims, the clock, the listener, and the state snapshot; and the drain
//! switch of sandboxd's operator surface.

use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::state::{PoolState, pool_state};
use super::{Reply, Sim};
use crate::config::{ConfigPatch, PoolConfig, SimConfig};
use crate::faults::{ArmedFault, Fault};
use crate::model::{ClaimRecord, PoolKey, ZERO_TIME};

/// Run-time changes to one claim (hibernate/archive hooks).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClaimPatch {
    pub hibernated: Option<bool>,
    pub archived: Option<bool>,
    /// RFC 3339, or `"zero"`/`""` for "never expires".
    pub deadline: Option<String>,
    /// Deadline as seconds from the simulated now (may be negative).
    pub deadline_in_seconds: Option<i64>,
    /// Mark the VM failed with this reason (late builds); `""` clears it.
    pub failed: Option<String>,
    /// Attach these volumes (such a claim cannot hibernate); `[]` detaches.
    pub volumes: Option<Vec<String>>,
    /// What `/stats` reports as the VMM's resident memory.
    pub mem_used_bytes: Option<u64>,
    /// Last activity this many seconds before the simulated now (for the
    /// idle-hibernation and archive clocks).
    pub idle_seconds: Option<i64>,
}

/// Clock changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClockPatch {
    pub advance_seconds: Option<i64>,
    pub advance_ms: Option<i64>,
    pub set: Option<Timestamp>,
    pub frozen: Option<bool>,
}

impl Sim {
    pub fn arm_fault(&self, fault: Fault) -> Result<u64, String> {
        fault.validate()?;
        Ok(self.armed().arm(fault))
    }

    pub fn faults(&self) -> Vec<ArmedFault> {
        self.armed().list()
    }

    pub fn clear_faults(&self) {
        self.armed().clear();
    }

    /// The configured peers (a `redirect` fault's default).
    pub fn peers(&self) -> Vec<String> {
        self.lock().cfg.peers.clone()
    }

    /// `POST`/`DELETE /v1/drain`: root only; `204`.
    pub fn set_draining(&self, auth: Option<&str>, draining: bool) -> Reply {
        let mut st = self.lock();
        if let Err(reply) = Self::auth_root(&st, auth) {
            return reply;
        }
        st.cfg.draining = draining;
        Reply::empty(204)
    }

    pub fn patch_config(&self, patch: ConfigPatch) -> SimConfig {
        let mut st = self.lock();
        patch.apply(&mut st.cfg);
        st.cfg.clone()
    }

    pub fn config(&self) -> SimConfig {
        self.lock().cfg.clone()
    }

    /// Add or replace a pool, then refill it towards its target.
    pub fn set_pool(self: &Arc<Self>, pool: PoolConfig) -> Result<(), String> {
        let key = PoolKey::new(&pool.template, &pool.net, &pool.size)?;
        let mut st = self.lock();
        let refilling = st.pools.get(&key).map_or(0, |p| p.refilling);
        let mut state = pool_state(&pool);
        state.refilling = refilling;
        st.pools.insert(key.clone(), state);
        st.cfg
            .pools
            .retain(|p| PoolKey::new(&p.template, &p.net, &p.size).ok().as_ref() != Some(&key));
        st.cfg.pools.push(pool);
        self.top_up(&mut st, &key);
        Ok(())
    }

    pub fn pools(&self) -> Vec<(PoolKey, PoolState)> {
        self.lock()
            .pools
            .iter()
            .map(|(k, p)| (k.clone(), p.clone()))
            .collect()
    }

    pub fn claims(&self) -> Vec<ClaimRecord> {
        self.lock().claims.values().cloned().collect()
    }

    pub fn claims_by_ref(&self, claim_ref: &str) -> Vec<ClaimRecord> {
        self.lock()
            .claims
            .values()
            .filter(|c| c.claim_ref == claim_ref)
            .cloned()
            .collect()
    }

    pub fn patch_claim(&self, id: &str, patch: ClaimPatch) -> Result<ClaimRecord, String> {
        let now = self.clock.now();
        let mut st = self.lock();
        let claim = st
            .claims
            .get_mut(id)
            .ok_or_else(|| format!("unknown sandbox {id:?}"))?;
        if let Some(h) = patch.hibernated {
            claim.hibernated = h;
        }
        if let Some(a) = patch.archived {
            claim.archived = a;
            if a {
                claim.hibernated = false;
            }
        }
        if let Some(d) = patch.deadline {
            claim.deadline = match d.trim() {
                "" | "zero" | ZERO_TIME => None,
                t => Some(
                    t.parse::<Timestamp>()
                        .map_err(|e| format!("deadline {t:?}: {e}"))?,
                ),
            };
        }
        if let Some(secs) = patch.deadline_in_seconds {
            claim.deadline = now.checked_add(SignedDuration::from_secs(secs)).ok();
        }
        if let Some(reason) = patch.failed {
            claim.failed = (!reason.is_empty()).then_some(reason);
        }
        if let Some(volumes) = patch.volumes {
            claim.volumes = volumes;
        }
        if let Some(bytes) = patch.mem_used_bytes {
            claim.mem_used_bytes = Some(bytes);
        }
        if let Some(secs) = patch.idle_seconds {
            claim.last_activity = now.checked_sub(SignedDuration::from_secs(secs)).ok();
        }
        let claim = claim.clone();
        self.persist(&mut st);
        // A paused or failed VM's processes do not run.
        self.guests.freeze(id, !claim.is_running());
        Ok(claim)
    }

    pub fn patch_clock(&self, patch: ClockPatch) -> Timestamp {
        if let Some(f) = patch.frozen {
            self.clock.freeze(f);
        }
        if let Some(t) = patch.set {
            self.clock.set(t);
        }
        if let Some(s) = patch.advance_seconds {
            self.clock.advance(SignedDuration::from_secs(s));
        }
        if let Some(ms) = patch.advance_ms {
            self.clock.advance(SignedDuration::from_millis(ms));
        }
        self.clock.now()
    }

    /// Stop (or resume) accepting API connections. Stopping also closes
    /// every open API connection, so clients see "connection refused".
    pub fn set_accepting(&self, accepting: bool) {
        self.accepting.send_replace(accepting);
        if !accepting {
            self.kill_connections();
        }
    }

    pub fn is_accepting(&self) -> bool {
        *self.accepting.borrow()
    }

    /// Close every open API connection.
    pub fn kill_connections(&self) {
        self.kill.send_modify(|g| *g += 1);
    }

    pub fn snapshot(&self) -> Value {
        let faults = self.armed().list();
        let st = self.lock();
        let pools: Vec<Value> = st
            .pools
            .iter()
            .map(|(k, p)| json!({ "key": k, "state": p }))
            .collect();
        json!({
            "now": self.clock.now().to_string(),
            "clock_frozen": self.clock.is_frozen(),
            "accepting": *self.accepting.borrow(),
            "guest_network": self.guests.network().describe(),
            "config": st.cfg,
            "pools": pools,
            "claims": st.claims.values().collect::<Vec<_>>(),
            "faults": faults,
        })
    }
}
