//! What the simulator holds under its state lock: the configuration, the
//! pools' live numbers and the claims.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::{PoolConfig, SimConfig};
use crate::model::{ClaimRecord, PoolKey};

/// A pool's live numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolState {
    pub warm: u32,
    pub target: u32,
    pub golden: bool,
    pub refilling: u32,
    pub archive_on_expire: bool,
    pub archive_retention_seconds: u64,
}

#[derive(Debug)]
pub(super) struct State {
    pub(super) cfg: SimConfig,
    pub(super) pools: BTreeMap<PoolKey, PoolState>,
    pub(super) claims: BTreeMap<String, ClaimRecord>,
    /// What was last persisted (the file's content, or the in-memory stand-in
    /// when no state file is configured).
    pub(super) persisted: Vec<ClaimRecord>,
}

pub(super) fn pool_state(p: &PoolConfig) -> PoolState {
    PoolState {
        warm: p.warm,
        target: p.target.unwrap_or(p.warm),
        golden: p.golden,
        refilling: 0,
        archive_on_expire: p.archive_on_expire,
        archive_retention_seconds: p.archive_retention_seconds,
    }
}

pub(super) fn pools_from(cfg: &SimConfig) -> Result<BTreeMap<PoolKey, PoolState>, String> {
    let mut pools = BTreeMap::new();
    for p in &cfg.pools {
        let key = PoolKey::new(&p.template, &p.net, &p.size)
            .map_err(|e| format!("pool {:?}: {e}", p.template))?;
        pools.insert(key, pool_state(p));
    }
    Ok(pools)
}
