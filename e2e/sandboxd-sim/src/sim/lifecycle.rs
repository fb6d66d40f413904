//! The lifecycle verbs (hibernate, wake, renew), the single-sandbox read,
//! stats and the owner probe, as sandboxd's contract describes them
//! (docs/architecture.md#sandboxd-api; e2e/README.md lists the state ×
//! endpoint behaviour).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use jiff::SignedDuration;
use serde_json::{Value, json};
use tracing::info;

use super::auth::{Actor, Principal, unknown};
use super::state::State;
use super::{Answer, Reply, Sim};
use crate::faults::{Endpoint, FaultKind};
use crate::model::{bearer, clamp_ttl, ct_eq, decode_renew_body, size_tier};

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

/// The faults a transition acts out itself, because they happen inside
/// sandboxd: extra time before the work (`persist_late`: a slow hibernate
/// or wake, a late renew) and a failure after it (`fail`). The work runs on
/// a task of its own that outlives the client's hang-up, so delaying or
/// failing the reply at the edge could not model them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransitionFault {
    pub late: Duration,
    pub fail: bool,
}

impl TransitionFault {
    /// What an armed fault asks of a transition (nothing, for the others).
    pub fn of(kind: Option<&FaultKind>) -> TransitionFault {
        match kind {
            Some(FaultKind::PersistLate { ms }) => TransitionFault {
                late: Duration::from_millis(*ms),
                fail: false,
            },
            Some(FaultKind::Fail) => TransitionFault {
                late: Duration::ZERO,
                fail: true,
            },
            _ => TransitionFault::default(),
        }
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

    pub async fn hibernate(
        self: &Arc<Self>,
        auth: Option<&str>,
        id: &str,
        fault: TransitionFault,
    ) -> Answer {
        Self::auth_verb(&self.lock(), auth, id)?;
        let sim = Arc::clone(self);
        let id = id.to_string();
        let reply = detached(async move { sim.do_hibernate(&id, fault).await }).await;
        Ok(reply)
    }

    async fn do_hibernate(self: &Arc<Self>, id: &str, fault: TransitionFault) -> Reply {
        let lock = self.transition_lock(id);
        let _held = lock.lock().await;
        tokio::time::sleep(fault.late).await;
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
        if fault.fail {
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

    pub async fn wake(
        self: &Arc<Self>,
        auth: Option<&str>,
        id: &str,
        fault: TransitionFault,
    ) -> Answer {
        Self::auth_verb(&self.lock(), auth, id)?;
        let sim = Arc::clone(self);
        let id = id.to_string();
        let reply = detached(async move { sim.do_wake(&id, fault).await }).await;
        Ok(reply)
    }

    /// The wake of a relay call: transparent, taking only the wake faults
    /// that model the restore (`fail`, `persist_late`). `None` when the
    /// sandbox was not paused. The model takes these itself: whether a
    /// relay wakes is known only after its checks, and a wake fault must
    /// stay armed for the relays that find the sandbox running.
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
        let kind = self.armed().take_if(Endpoint::Wake, |k| {
            matches!(k, FaultKind::Fail | FaultKind::PersistLate { .. })
        });
        let fault = TransitionFault::of(kind.as_ref());
        let sim = Arc::clone(self);
        let id = id.to_string();
        Some(detached(async move { sim.do_wake(&id, fault).await }).await)
    }

    async fn do_wake(self: &Arc<Self>, id: &str, fault: TransitionFault) -> Reply {
        let started = std::time::Instant::now();
        let lock = self.transition_lock(id);
        let _held = lock.lock().await;
        tokio::time::sleep(fault.late).await;
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
        if fault.fail {
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

    pub async fn renew(
        self: &Arc<Self>,
        auth: Option<&str>,
        id: &str,
        body: &[u8],
        fault: TransitionFault,
    ) -> Answer {
        let actor = Self::auth_verb(&self.lock(), auth, id)?;
        let Ok(req) = decode_renew_body(body) else {
            return Err(Reply::error(400, "invalid request body").into());
        };
        if let Some(action) = &req.on_expire
            && !matches!(action.as_str(), "" | "destroy" | "archive")
        {
            return Err(Reply::error(400, format!("invalid on_expire {action:?}")).into());
        }
        let sim = Arc::clone(self);
        let id = id.to_string();
        let reply = detached(async move {
            tokio::time::sleep(fault.late).await;
            sim.do_renew(&id, actor, req.ttl_seconds, req.on_expire, fault.fail)
        })
        .await;
        Ok(reply)
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

    pub fn get(&self, auth: Option<&str>, id: &str) -> Answer {
        let st = self.lock();
        let principal = match Self::auth_node(&st, auth) {
            Ok(Principal::Tenant(_)) => {
                return Err(Reply::error(403, "operator token required").into());
            }
            Ok(p) => p,
            Err(reply) => return Err(reply.into()),
        };
        let Some(c) = st.claims.get(id) else {
            return Err(unknown().into());
        };
        let mut row = Self::row_json(&st.cfg.quirks, c);
        if matches!(principal, Principal::Root) && !st.cfg.quirks.no_token_in_get {
            row["token"] = Value::from(c.token.clone());
        }
        Ok(Reply::json(200, row))
    }

    // ----- GET /v1/sandboxes/{id}/stats -------------------------------------

    pub fn stats(&self, auth: Option<&str>, id: &str) -> Answer {
        let st = self.lock();
        Self::auth_root(&st, auth)?;
        let Some(c) = st.claims.get(id) else {
            return Err(unknown().into());
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
        Ok(Reply::json(200, v))
    }

    // ----- GET /v1/sandboxes/{id}/owner -------------------------------------

    /// Sandbox token only; neither wakes nor counts as activity.
    pub fn owner(&self, auth: Option<&str>, id: &str) -> Answer {
        let Some(token) = bearer(auth) else {
            return Err(Reply::error(401, "missing bearer token").into());
        };
        let st = self.lock();
        if !st.claims.get(id).is_some_and(|c| ct_eq(token, &c.token)) {
            return Err(Reply::error(404, "not owned here").into());
        }
        let mut v = json!({});
        if let Some(addr) = Self::owner_addr(&st.cfg) {
            v["owner_addr"] = Value::from(addr);
        }
        Ok(Reply::json(200, v))
    }
}
