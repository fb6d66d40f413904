//! The node-wide reads: `GET /v1/sandboxes` and `GET /v1/info`.

use serde_json::{Value, json};

use super::auth::Principal;
use super::state::PoolState;
use super::{Answer, Reply, Sim};
use crate::config::TenantList;
use crate::model::PoolKey;

/// A stable order with no meaning, as sandboxd sorts pools by key hash.
fn key_hash(key: &PoolKey) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("{}\0{}\0{}", key.template, key.net, key.size).bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Sim {
    // ----- GET /v1/sandboxes ----------------------------------------------

    pub fn list(&self, auth: Option<&str>) -> Answer {
        let st = self.lock();
        let only_tenant = match Self::auth_node(&st, auth) {
            Ok(Principal::Tenant(name)) => match st.cfg.tenant_list {
                TenantList::Forbidden => {
                    return Err(Reply::error(403, "operator token required").into());
                }
                TenantList::Own => Some(name),
            },
            Ok(_) => None,
            Err(reply) => return Err(reply.into()),
        };
        let rows: Vec<Value> = st
            .claims
            .values()
            .filter(|c| only_tenant.is_none() || c.tenant == only_tenant)
            .map(|c| Self::row_json(&st.cfg.quirks, c))
            .collect();
        Ok(Reply::json(200, json!({ "sandboxes": rows })))
    }

    // ----- GET /v1/info ---------------------------------------------------

    pub fn info(&self, auth: Option<&str>) -> Answer {
        let st = self.lock();
        Self::auth_root(&st, auth)?;
        let q = &st.cfg.quirks;
        let mut pools: Vec<(&PoolKey, &PoolState)> = st.pools.iter().collect();
        pools.sort_by_key(|(k, _)| key_hash(k));
        let pools: Vec<Value> = pools
            .into_iter()
            .map(|(k, p)| {
                let mut v = json!({
                    "key": k.to_json(q.engine_in_key),
                    "warm": p.warm, "refilling": p.refilling,
                    "target": p.target, "golden": p.golden,
                });
                if q.extra_fields {
                    v["warm_max"] = Value::from(p.target);
                }
                v
            })
            .collect();
        let claimed = st.claims.len();
        let hibernated = st.claims.values().filter(|c| c.hibernated).count();
        let archived = st.claims.values().filter(|c| c.archived).count();
        let failed = st.claims.values().filter(|c| c.failed.is_some()).count();
        let mut v = json!({
            "pools": pools, "claimed": claimed,
            "hibernated": hibernated, "archived": archived,
        });
        if failed > 0 {
            v["failed"] = Value::from(failed);
        }
        if st.cfg.draining {
            v["draining"] = Value::from(true);
        }
        let parked = st.pools.values().any(|p| p.warm + p.refilling < p.target);
        if parked && !Self::has_free_slot(&st) {
            v["at_capacity"] = Value::from(true);
            v["at_capacity_reason"] = Value::from(format!(
                "node at max_running ({} VMs running)",
                Self::running_vms(&st)
            ));
        }
        if !st.cfg.peers.is_empty() {
            v["peers"] = json!(st.cfg.peers);
        }
        if q.extra_fields {
            v["advertise_addr"] = Value::from(st.cfg.advertise_addr.clone());
            v["templates"] = json!([]);
        }
        Ok(Reply::json(200, v))
    }
}
