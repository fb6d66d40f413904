//! The periodic jobs: the reaper (claims past their deadline are
//! destroyed or archived) and the idle sweep (idle claims hibernated,
//! long-hibernated ones archived).

use std::sync::Arc;

use tracing::info;

use super::Sim;
use super::request_log::ReapRecord;
use crate::model::ClaimRecord;

impl Sim {
    /// Drop claims whose deadline has strictly passed (destroying their VM,
    /// hibernated or not); hibernated claims of an archiving pool, and
    /// claims renewed with `on_expire: archive`, are archived instead.
    /// Returns the ids affected.
    pub fn reap(self: &Arc<Self>) -> Vec<String> {
        let now = self.clock.now();
        let mut st = self.lock();
        let mut touched = Vec::new();
        let mut ended = Vec::new();
        let expired: Vec<String> = st
            .claims
            .values()
            .filter(|c| c.deadline.is_some_and(|d| d < now))
            .map(|c| c.id.clone())
            .collect();
        for id in expired {
            let Some(claim) = st.claims.get(&id) else {
                continue;
            };
            let pool = st.pools.get(&claim.key);
            let archive_policy = if claim.archived {
                None
            } else if claim.on_expire == "archive" && claim.cannot_hibernate().is_none() {
                Some(pool.map_or(st.cfg.archive_delete_after_seconds, |p| {
                    p.archive_retention_seconds
                }))
            } else {
                pool.filter(|p| p.archive_on_expire && claim.hibernated)
                    .map(|p| p.archive_retention_seconds)
            };
            let archived = archive_policy.is_some();
            let was_archived = claim.archived;
            match archive_policy {
                Some(retention) => {
                    if let Some(c) = st.claims.get_mut(&id) {
                        c.archive(now, retention);
                    }
                    self.counters.archived(1);
                }
                None => {
                    self.counters.reaped(was_archived);
                    st.claims.remove(&id);
                    self.guests.destroy(&id);
                    self.forget_transition(&id);
                }
            }
            // Archived or destroyed, the VM no longer runs.
            self.guests.freeze(&id, true);
            ended.push((id.clone(), archived));
            touched.push(id);
        }
        if !touched.is_empty() {
            self.persist(&mut st);
            self.refill_all(&mut st);
            info!(?touched, "sandboxd-sim: reaped");
        }
        drop(st);
        let mut log = self.log_lock();
        let after_seq = log.next_seq;
        log.reaped
            .extend(ended.into_iter().map(|(id, archived)| ReapRecord {
                id,
                after_seq,
                archived,
            }));
        touched
    }

    // ----- idle hibernation and the archive tier --------------------------

    /// One sweep: running claims idle for `idle_hibernate_seconds` (no open
    /// relay, not egress, no volumes, no transition in flight) are
    /// hibernated; hibernated claims idle for `archive_after_seconds` are
    /// archived. Returns the ids changed.
    pub fn sweep(self: &Arc<Self>) -> Vec<String> {
        let now = self.clock.now();
        let mut st = self.lock();
        let idle = st.cfg.idle_hibernate_seconds;
        let archive_after = st.cfg.archive_after_seconds;
        if idle == 0 && archive_after == 0 {
            return Vec::new();
        }
        let retention = st.cfg.archive_delete_after_seconds;
        let idle_for = |c: &ClaimRecord| now.duration_since(c.idle_since()).as_secs().max(0) as u64;
        let mut hibernate = Vec::new();
        let mut archive = Vec::new();
        for c in st.claims.values() {
            if self.in_transition(&c.id) || self.guests.open_relays(&c.id) > 0 {
                continue;
            }
            if idle > 0 && c.is_running() && c.cannot_hibernate().is_none() && idle_for(c) >= idle {
                hibernate.push(c.id.clone());
            } else if archive_after > 0
                && c.hibernated
                && !c.archived
                && idle_for(c) >= archive_after
            {
                archive.push(c.id.clone());
            }
        }
        for id in &hibernate {
            if let Some(c) = st.claims.get_mut(id) {
                c.hibernated = true;
            }
            self.guests.freeze(id, true);
        }
        for id in &archive {
            if let Some(c) = st.claims.get_mut(id) {
                c.archive(now, retention);
            }
        }
        self.counters.hibernated(hibernate.len());
        self.counters.archived(archive.len());
        let touched: Vec<String> = hibernate.into_iter().chain(archive).collect();
        if !touched.is_empty() {
            self.persist(&mut st);
            self.refill_all(&mut st);
            info!(?touched, "sandboxd-sim: idle sweep");
        }
        touched
    }
}
