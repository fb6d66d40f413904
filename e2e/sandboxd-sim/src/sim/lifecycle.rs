//! The lifecycle verbs (hibernate, wake, renew), the single-sandbox read,
//! stats, the owner probe, and the idle-hibernation and archive sweep, as
//! sandboxd's contract describes them (docs/architecture.md#sandboxd-api;
//! e2e/README.md lists the state × endpoint behaviour).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use jiff::SignedDuration;
use serde_json::{Value, json};
use tracing::info;

use super::{Outcome, Principal, Reply, Sim, State};
use crate::faults::{Endpoint, FaultKind};
use crate::model::{bearer, clamp_ttl, ct_eq, decode_renew_body, size_tier};

/// Who acts on a sandbox-scoped verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Actor {
    /// The node's root token: the operator path, any id.
    Root,
    /// The claim's own token.
    Own,
}

/// What a wake has to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WakeKind {
    /// Restore the memory snapshot; the deadline stays.
    Restore,
    /// Restore from the archive; a fresh lease of the granted length.
    Unarchive,
    /// Cold-boot a failed VM from its disk; its memory is lost.
    ColdBoot,
}

pub(super) fn unknown() -> Reply {
    Reply::error(404, "unknown sandbox")
}

/// The transition faults: extra time first (`persist_late`), and whether
/// the operation fails (`fail`).
pub(super) fn transition_faults(fault: &Option<FaultKind>) -> (Duration, bool) {
    match fault {
        Some(FaultKind::PersistLate { ms }) => (Duration::from_millis(*ms), false),
        Some(FaultKind::Fail) => (Duration::ZERO, true),
        _ => (Duration::ZERO, false),
    }
}

/// Run a transition on a task of its own: sandboxd detaches it from the
/// request, so it completes even when the client hangs up.
async fn detached(work: impl Future<Output = Reply> + Send + 'static) -> Reply {
    tokio::spawn(work)
        .await
        .unwrap_or_else(|_| Reply::error(500, "internal error"))
}

impl Sim {
    /// Sandbox-scoped verbs (hibernate, wake, renew): the root token acts
    /// by id, otherwise the bearer must be the claim's own token. No bearer
    /// is 401; anything else 404, like an unknown id.
    pub(super) fn auth_verb(st: &State, header: Option<&str>, id: &str) -> Result<Actor, Reply> {
        let Some(token) = bearer(header) else {
            return Err(Reply::error(401, "missing bearer token"));
        };
        let Some(claim) = st.claims.get(id) else {
            return Err(unknown());
        };
        if !st.cfg.api_token.is_empty() && ct_eq(token, &st.cfg.api_token) {
            return Ok(Actor::Root);
        }
        if ct_eq(token, &claim.token) {
            Ok(Actor::Own)
        } else {
            Err(unknown())
        }
    }

    pub(super) fn transition_lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.transitions.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(map.entry(id.to_string()).or_default())
    }

    pub(super) fn forget_transition(&self, id: &str) {
        let mut map = self.transitions.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(id);
    }

    /// A hibernate or wake of this sandbox is running.
    pub(super) fn in_transition(&self, id: &str) -> bool {
        let map = self.transitions.lock().unwrap_or_else(|e| e.into_inner());
        map.get(id).is_some_and(|m| m.try_lock().is_err())
    }

    /// Data-plane activity: restarts the idle clocks.
    pub(super) fn touch(st: &mut State, id: &str, now: jiff::Timestamp) {
        if let Some(c) = st.claims.get_mut(id) {
            c.last_activity = Some(now);
        }
    }

    // ----- POST /v1/sandboxes/{id}/hibernate ------------------------------

    pub async fn hibernate(self: &Arc<Self>, auth: Option<&str>, id: &str) -> Outcome {
        let fault = self.take_fault(Endpoint::Hibernate);
        if let Some(outcome) = self.pre_fault(&fault) {
            return outcome;
        }
        if let Err(reply) = Self::auth_verb(&self.lock(), auth, id) {
            return reply.into();
        }
        let (late, fail) = transition_faults(&fault);
        let sim = Arc::clone(self);
        let id = id.to_string();
        let reply = detached(async move { sim.do_hibernate(&id, late, fail).await }).await;
        Self::post_fault(&fault, reply)
    }

    pub(super) async fn do_hibernate(
        self: &Arc<Self>,
        id: &str,
        late: Duration,
        fail: bool,
    ) -> Reply {
        let lock = self.transition_lock(id);
        let _held = lock.lock().await;
        tokio::time::sleep(late).await;
        let delay = {
            let mut st = self.lock();
            let Some(c) = st.claims.get(id) else {
                return unknown();
            };
            if c.hibernated || c.archived {
                // Idempotent: nothing to do but flush the claims journal.
                self.persist(&mut st);
                return Reply::empty(204);
            }
            if let Some(why) = c.cannot_hibernate() {
                return Reply::error(409, why);
            }
            if c.failed.is_some() {
                return Reply::error(409, "sandbox failed: its VM is not running");
            }
            Duration::from_millis(st.cfg.hibernate_delay_ms)
        };
        tokio::time::sleep(delay).await;
        if fail {
            return Reply::error(500, "hibernate failed");
        }
        let mut st = self.lock();
        let Some(c) = st.claims.get_mut(id) else {
            return unknown();
        };
        c.hibernated = true;
        self.persist(&mut st);
        self.guests.freeze(id, true);
        self.counters.hibernated(1);
        // Its memory is freed: a parked refill may go on.
        self.refill_all(&mut st);
        info!(id, "sandboxd-sim: hibernated");
        Reply::empty(204)
    }

    // ----- POST /v1/sandboxes/{id}/wake -----------------------------------

    pub async fn wake(self: &Arc<Self>, auth: Option<&str>, id: &str) -> Outcome {
        let fault = self.take_fault(Endpoint::Wake);
        if let Some(outcome) = self.pre_fault(&fault) {
            return outcome;
        }
        if let Err(reply) = Self::auth_verb(&self.lock(), auth, id) {
            return reply.into();
        }
        let (late, fail) = transition_faults(&fault);
        let sim = Arc::clone(self);
        let id = id.to_string();
        let reply = detached(async move { sim.do_wake(&id, late, fail).await }).await;
        Self::post_fault(&fault, reply)
    }

    /// The wake of a relay call: transparent, taking only the wake faults
    /// that model the restore (`fail`, `persist_late`). `None` when the
    /// sandbox was not paused.
    pub(super) async fn implicit_wake(self: &Arc<Self>, id: &str) -> Option<Reply> {
        let paused = {
            let st = self.lock();
            st.claims
                .get(id)
                .is_some_and(|c| c.hibernated || c.archived)
        };
        if !paused {
            return None;
        }
        let fault = self.lock().faults.take_if(Endpoint::Wake, |k| {
            matches!(k, FaultKind::Fail | FaultKind::PersistLate { .. })
        });
        let (late, fail) = transition_faults(&fault);
        let sim = Arc::clone(self);
        let id = id.to_string();
        Some(detached(async move { sim.do_wake(&id, late, fail).await }).await)
    }

    pub(super) async fn do_wake(self: &Arc<Self>, id: &str, late: Duration, fail: bool) -> Reply {
        let started = std::time::Instant::now();
        let lock = self.transition_lock(id);
        let _held = lock.lock().await;
        tokio::time::sleep(late).await;
        let (kind, delay) = {
            let mut st = self.lock();
            let now = self.clock.now();
            let Some(c) = st.claims.get(id) else {
                return unknown();
            };
            let kind = if c.failed.is_some() {
                if let Some(why) = c.cannot_hibernate() {
                    return Reply::error(409, format!("failed sandbox cannot be restarted: {why}"));
                }
                WakeKind::ColdBoot
            } else if c.archived {
                WakeKind::Unarchive
            } else if c.hibernated {
                WakeKind::Restore
            } else {
                // Idempotent on a running sandbox; it still counts as activity.
                Self::touch(&mut st, id, now);
                return Reply::empty(204);
            };
            if !Self::has_free_slot(&st) {
                return Reply::error(500, "wake failed");
            }
            (kind, Duration::from_millis(st.cfg.wake_delay_ms))
        };
        tokio::time::sleep(delay).await;
        if fail {
            return Reply::error(500, "wake failed");
        }
        let now = self.clock.now();
        let mut st = self.lock();
        let Some(c) = st.claims.get_mut(id) else {
            return unknown();
        };
        match kind {
            WakeKind::Restore => c.hibernated = false,
            WakeKind::Unarchive => {
                c.archived = false;
                c.hibernated = false;
                c.deadline = now
                    .checked_add(SignedDuration::from_secs(c.ttl_seconds))
                    .ok();
            }
            WakeKind::ColdBoot => {
                c.failed = None;
                c.hibernated = false;
            }
        }
        c.last_activity = Some(now);
        self.persist(&mut st);
        drop(st);
        self.counters
            .woken(started.elapsed(), kind == WakeKind::Unarchive);
        if kind == WakeKind::ColdBoot {
            // Memory is lost: the processes are gone, the disk stays.
            self.guests.kill_all(id);
        } else {
            self.guests.freeze(id, false);
        }
        info!(id, ?kind, "sandboxd-sim: woken");
        Reply::empty(204)
    }

    // ----- POST /v1/sandboxes/{id}/renew ----------------------------------

    pub async fn renew(self: &Arc<Self>, auth: Option<&str>, id: &str, body: &[u8]) -> Outcome {
        let fault = self.take_fault(Endpoint::Renew);
        if let Some(outcome) = self.pre_fault(&fault) {
            return outcome;
        }
        let actor = match Self::auth_verb(&self.lock(), auth, id) {
            Ok(a) => a,
            Err(reply) => return reply.into(),
        };
        let Ok(req) = decode_renew_body(body) else {
            return Reply::error(400, "invalid request body").into();
        };
        if let Some(action) = &req.on_expire
            && !matches!(action.as_str(), "" | "destroy" | "archive")
        {
            return Reply::error(400, format!("invalid on_expire {action:?}")).into();
        }
        let (late, fail) = transition_faults(&fault);
        let sim = Arc::clone(self);
        let id = id.to_string();
        let reply = detached(async move {
            tokio::time::sleep(late).await;
            sim.do_renew(&id, actor, req.ttl_seconds, req.on_expire, fail)
        })
        .await;
        Self::post_fault(&fault, reply)
    }

    fn do_renew(
        &self,
        id: &str,
        actor: Actor,
        ttl_seconds: i64,
        on_expire: Option<String>,
        fail: bool,
    ) -> Reply {
        let now = self.clock.now();
        let mut st = self.lock();
        let tenant_gone = {
            let Some(c) = st.claims.get(id) else {
                return unknown();
            };
            if c.archived {
                return Reply::error(409, "sandbox is archived: wake it first");
            }
            if on_expire.as_deref() == Some("archive")
                && let Some(why) = c.cannot_hibernate()
            {
                return Reply::error(409, why);
            }
            c.tenant
                .as_ref()
                .is_some_and(|t| !st.cfg.tenants.iter().any(|x| &x.name == t))
        };
        if tenant_gone && actor == Actor::Own {
            return Reply::error(403, "tenant removed");
        }
        if fail {
            // Persisting failed: the in-memory change is rolled back.
            return Reply::error(500, "renew failed");
        }
        let ttl = clamp_ttl(ttl_seconds);
        let deadline = now.checked_add(SignedDuration::from_secs(ttl)).ok();
        let q = st.cfg.quirks.clone();
        let Some(c) = st.claims.get_mut(id) else {
            return unknown();
        };
        c.deadline = deadline;
        // The new length is also what a wake from the archive grants.
        c.ttl_seconds = ttl;
        c.last_activity = Some(now);
        if let Some(action) = on_expire {
            c.on_expire = if action == "destroy" {
                String::new()
            } else {
                action
            };
        }
        self.persist(&mut st);
        info!(id, ttl, "sandboxd-sim: renewed");
        let mut v = json!({});
        if let Some(d) = Self::deadline_json(&q, deadline, false) {
            v["deadline"] = d;
        }
        Reply::json(200, v)
    }

    // ----- GET /v1/sandboxes/{id} -------------------------------------------

    pub fn get(&self, auth: Option<&str>, id: &str) -> Outcome {
        let fault = self.take_fault(Endpoint::Get);
        if let Some(outcome) = self.pre_fault(&fault) {
            return outcome;
        }
        let st = self.lock();
        let principal = match Self::auth_node(&st, auth) {
            Ok(Principal::Tenant(_)) => {
                return Reply::error(403, "operator token required").into();
            }
            Ok(p) => p,
            Err(reply) => return reply.into(),
        };
        let Some(c) = st.claims.get(id) else {
            return unknown().into();
        };
        let mut row = Self::row_json(&st.cfg.quirks, c);
        if matches!(principal, Principal::Root) && !st.cfg.quirks.no_token_in_get {
            row["token"] = Value::from(c.token.clone());
        }
        Self::post_fault(&fault, Reply::json(200, row))
    }

    // ----- GET /v1/sandboxes/{id}/stats -------------------------------------

    pub fn stats(&self, auth: Option<&str>, id: &str) -> Outcome {
        let fault = self.take_fault(Endpoint::Stats);
        if let Some(outcome) = self.pre_fault(&fault) {
            return outcome;
        }
        let st = self.lock();
        if let Err(reply) = Self::auth_root(&st, auth) {
            return reply.into();
        }
        let Some(c) = st.claims.get(id) else {
            return unknown().into();
        };
        let (cpus, mem_total) = size_tier(&c.key.size);
        // No VMM process while paused or failed: nothing to measure.
        let measured = c.is_running();
        let used = if measured {
            c.mem_used_bytes.unwrap_or(mem_total / 4)
        } else {
            0
        };
        let v = json!({
            "id": c.id, "cpu_count": cpus, "mem_total_bytes": mem_total,
            "mem_used_bytes": used, "mem_used_measured": measured,
            "hibernated": c.hibernated, "measured_at": self.clock.now().to_string(),
        });
        Self::post_fault(&fault, Reply::json(200, v))
    }

    // ----- GET /v1/sandboxes/{id}/owner -------------------------------------

    /// Sandbox token only; neither wakes nor counts as activity.
    pub fn owner(&self, auth: Option<&str>, id: &str) -> Outcome {
        let fault = self.take_fault(Endpoint::Owner);
        if let Some(outcome) = self.pre_fault(&fault) {
            return outcome;
        }
        let Some(token) = bearer(auth) else {
            return Reply::error(401, "missing bearer token").into();
        };
        let st = self.lock();
        if !st.claims.get(id).is_some_and(|c| ct_eq(token, &c.token)) {
            return Reply::error(404, "not owned here").into();
        }
        let mut v = json!({});
        if let Some(addr) = Self::owner_addr(&st.cfg) {
            v["owner_addr"] = Value::from(addr);
        }
        Self::post_fault(&fault, Reply::json(200, v))
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
        let idle_for = |c: &crate::model::ClaimRecord| {
            now.duration_since(c.idle_since()).as_secs().max(0) as u64
        };
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
