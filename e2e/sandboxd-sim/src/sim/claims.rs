//! `POST /v1/claim` (a warm VM, a provisioned one, a redirect, or a
//! refusal) and `POST /v1/sandboxes/{id}/release`.

use std::sync::Arc;
use std::time::Duration;

use jiff::SignedDuration;
use serde_json::{Value, json};
use tracing::info;

use super::auth::{Principal, unknown};
use super::state::State;
use super::{Answer, Reply, Sim, metrics};
use crate::config::SimConfig;
use crate::model::{
    ClaimBody, ClaimRecord, PoolKey, bearer, clamp_ttl, ct_eq, decode_claim_body, new_id, new_token,
};

/// The release faults: persisting the removal fails inside sandboxd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseFailure {
    /// `release_fail_keep`: the removal is rolled back, the claim stays.
    Keep,
    /// `release_fail_drop`: the claim is dropped and persisted, but the VM
    /// survived its removal.
    Drop,
}

impl Sim {
    // ----- POST /v1/claim -------------------------------------------------

    /// The `persist_late` fault, the one transport-looking fault the model
    /// must act out itself: the claim is decided after `delay` on a task of
    /// its own, so it completes (and persists) even when the client hangs
    /// up and the connection's handler is dropped, as sandboxd's Go handler
    /// runs on after its client has gone. The edge cannot do this by
    /// delaying its call: a dropped handler would never make the claim.
    pub async fn claim_late(
        self: &Arc<Self>,
        auth: Option<&str>,
        body: &[u8],
        delay: Duration,
    ) -> Reply {
        let sim = Arc::clone(self);
        let auth = auth.map(str::to_string);
        let body = body.to_vec();
        let task = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let reply = sim.claim(auth.as_deref(), &body).await;
            info!(
                status = reply.status,
                ?delay,
                "sandboxd-sim: late claim decided"
            );
            reply
        });
        task.await
            .unwrap_or_else(|_| Reply::error(500, "provisioning failed"))
    }

    /// A claim: a warm VM, a provisioned one, a redirect or a refusal. Its
    /// refusals, unlike other endpoints', are delivered like its successes
    /// (a `slow` claim is slow whatever it answers), so it returns a plain
    /// reply rather than an [`Answer`].
    pub async fn claim(self: &Arc<Self>, auth: Option<&str>, body: &[u8]) -> Reply {
        let started = std::time::Instant::now();
        let delay_us = self.lock().cfg.claim_delay_us;
        if delay_us > 0 {
            // tokio's timer has millisecond granularity; a blocking-pool
            // thread sleeps to the microsecond without stalling the runtime.
            let delay = Duration::from_micros(delay_us);
            if tokio::task::spawn_blocking(move || std::thread::sleep(delay))
                .await
                .is_err()
            {
                return Reply::error(500, "claim delay failed");
            }
        }
        let (req, key, tenant, provision, tier) = {
            let mut st = self.lock();
            let tenant = match Self::auth_node(&st, auth) {
                Ok(Principal::Tenant(name)) => Some(name),
                Ok(_) => None,
                Err(reply) => return reply,
            };
            let Ok(req) = decode_claim_body(body) else {
                return Reply::error(400, "invalid request body");
            };
            let key = match PoolKey::new(&req.template, &req.net, &req.size) {
                Ok(key) => key,
                Err(e) => return Reply::error(400, format!("invalid pool key: {e}")),
            };
            if key.net == "egress" && !st.cfg.egress {
                return Reply::error(409, "node has no egress attachment (bridge or network)");
            }
            let redirect_ok = !st.cfg.peers.is_empty() && !req.no_redirect;
            if let Some(reason) = Self::quota_reason(&st, tenant.as_deref()) {
                return if redirect_ok {
                    Reply::json(200, json!({ "redirect": st.cfg.peers }))
                } else {
                    Reply::error(429, format!("node claim quota reached: {reason}"))
                };
            }
            let took_warm = match st.pools.get_mut(&key) {
                Some(pool) if pool.warm > 0 => {
                    pool.warm -= 1;
                    true
                }
                _ => false,
            };
            if took_warm {
                self.top_up(&mut st, &key);
                let reply = self.create_claim(&mut st, &req, key, tenant);
                self.counters
                    .claimed(metrics::Tier::Warm, started.elapsed());
                return reply;
            }
            if redirect_ok {
                return Reply::json(200, json!({ "redirect": st.cfg.peers }));
            }
            if !Self::has_free_slot(&st) {
                // No room to boot another VM (max_running).
                return Reply::error(500, "provisioning failed");
            }
            let provision = (
                Duration::from_millis(st.cfg.provision_delay_ms),
                st.cfg.provision_survives_disconnect,
            );
            // A clone of the pool's golden snapshot, or a cold boot.
            let tier = if st.pools.get(&key).is_some_and(|p| p.golden) {
                metrics::Tier::Golden
            } else {
                metrics::Tier::Cold
            };
            (req, key, tenant, provision, tier)
        };
        // Warm miss without a redirect: provision synchronously.
        let (delay, survives) = provision;
        let sim = Arc::clone(self);
        let build = async move {
            tokio::time::sleep(delay).await;
            let mut st = sim.lock();
            let reply = sim.create_claim(&mut st, &req, key, tenant);
            sim.counters.claimed(tier, started.elapsed());
            reply
        };
        if survives {
            tokio::spawn(build)
                .await
                .unwrap_or_else(|_| Reply::error(500, "provisioning failed"))
        } else {
            build.await
        }
    }

    fn quota_reason(st: &State, tenant: Option<&str>) -> Option<String> {
        if st.cfg.draining {
            return Some("node draining".to_string());
        }
        let live = st.claims.len();
        let cap = st.cfg.max_claims as usize;
        if cap > 0 && live >= cap {
            return Some(format!("{live} live claims, cap {cap}"));
        }
        let name = tenant?;
        let cap = st.cfg.tenants.iter().find(|t| t.name == name)?.max_claims as usize;
        let live = st
            .claims
            .values()
            .filter(|c| c.tenant.as_deref() == Some(name))
            .count();
        (cap > 0 && live >= cap).then(|| format!("tenant {name} at {live} live claims, cap {cap}"))
    }

    fn create_claim(
        &self,
        st: &mut State,
        req: &ClaimBody,
        key: PoolKey,
        tenant: Option<String>,
    ) -> Reply {
        let ttl = clamp_ttl(req.ttl_seconds);
        let now = self.clock.now();
        let deadline = now.checked_add(SignedDuration::from_secs(ttl)).ok();
        let mut id = new_id();
        while st.claims.contains_key(&id) {
            id = new_id();
        }
        let record = ClaimRecord {
            id: id.clone(),
            key,
            token: new_token(),
            deadline,
            claim_ref: req.claim_ref.clone(),
            hibernated: false,
            archived: false,
            tenant,
            ttl_seconds: ttl,
            claimed_at: now,
            failed: None,
            volumes: Vec::new(),
            on_expire: String::new(),
            last_activity: Some(now),
            mem_used_bytes: None,
        };
        let reply = Self::claim_reply(&st.cfg, &record);
        info!(id = %record.id, claim_ref = %record.claim_ref, "sandboxd-sim: claimed");
        st.claims.insert(id, record);
        // sandboxd commits the claim before it writes the reply.
        self.persist(st);
        Reply::json(200, reply)
    }

    fn claim_reply(cfg: &SimConfig, c: &ClaimRecord) -> Value {
        let mut v = json!({ "id": c.id, "token": c.token });
        if let Some(d) = Self::deadline_json(&cfg.quirks, c.deadline, false) {
            v["deadline"] = d;
        }
        if let Some(addr) = Self::owner_addr(cfg) {
            v["owner_addr"] = Value::from(addr);
        }
        if cfg.quirks.extra_fields {
            v["net_route"] = Value::from("direct");
            v["x_sim_unknown"] = json!({ "nested": [1, 2, 3] });
        }
        v
    }

    // ----- POST /v1/sandboxes/{id}/release --------------------------------

    /// The sandbox's own token, or root for any id. A missing bearer, an
    /// unknown id or another token is refused; `failure` is the armed
    /// release fault.
    pub fn release(
        self: &Arc<Self>,
        auth: Option<&str>,
        id: &str,
        failure: Option<ReleaseFailure>,
    ) -> Answer {
        let Some(token) = bearer(auth) else {
            return Err(Reply::error(401, "missing bearer token").into());
        };
        let mut st = self.lock();
        let is_root = !st.cfg.api_token.is_empty() && ct_eq(token, &st.cfg.api_token);
        let owned = st
            .claims
            .get(id)
            .is_some_and(|c| is_root || ct_eq(token, &c.token));
        if !owned {
            return Err(unknown().into());
        }
        if failure == Some(ReleaseFailure::Keep) {
            // Persisting the removal failed: rolled back, still live.
            return Ok(Reply::error(500, "release failed"));
        }
        st.claims.remove(id);
        self.persist(&mut st);
        self.guests.destroy(id);
        self.forget_transition(id);
        self.refill_all(&mut st);
        self.counters.released();
        info!(id, "sandboxd-sim: released");
        if failure == Some(ReleaseFailure::Drop) {
            // Dropped and persisted, but the VM survived removal.
            return Ok(Reply::error(500, "release failed"));
        }
        Ok(Reply::empty(204))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::config::PoolConfig;

    async fn timed_claim(sim: &Arc<Sim>) -> (u16, Duration) {
        let start = Instant::now();
        let reply = sim
            .claim(None, br#"{"template":"base:24.04","claim_ref":"ns/p"}"#)
            .await;
        (reply.status, start.elapsed())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn claim_delay_us_delays_every_claim() {
        let cfg = SimConfig {
            pools: vec![PoolConfig::parse_spec("base:24.04=4").expect("pool")],
            refill_delay_ms: 60_000,
            ..Default::default()
        };
        let sim = Sim::new(cfg).expect("sim");
        let (status, fast) = timed_claim(&sim).await;
        assert_eq!(status, 200);
        assert!(
            fast < Duration::from_millis(20),
            "undelayed claim took {fast:?}"
        );

        sim.lock().cfg.claim_delay_us = 30_000;
        let (status, slow) = timed_claim(&sim).await;
        assert_eq!(status, 200, "a warm hit is delayed, then succeeds");
        assert!(
            slow >= Duration::from_micros(30_000),
            "delayed claim took {slow:?}"
        );
        assert!(slow < Duration::from_secs(2), "delayed claim took {slow:?}");

        // Sub-millisecond values are honoured (not rounded to 0 or to 1 ms
        // by a millisecond timer): 700 µs is at least 700 µs.
        sim.lock().cfg.claim_delay_us = 700;
        let (status, short) = timed_claim(&sim).await;
        assert_eq!(status, 200);
        assert!(
            short >= Duration::from_micros(700),
            "700 µs claim took {short:?}"
        );
    }
}
