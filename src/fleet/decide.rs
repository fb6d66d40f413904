//! From a reading of `/v1/info` to what the Node says (pure, no I/O):
//! conditions for sandboxd's state, taints while the node cannot take new
//! sandboxes, and allocatable sized by sandboxd's claim cap.
//!
//! Never `Ready=False` and never `NoExecute`: a sandboxd fault keeps
//! Running sandboxes where they are and the node lifecycle controller
//! evicts nothing; it only steers new Pods elsewhere.

use crate::sandboxd::{NodeInfo, PoolInfo};

use super::reading::{FailureKind, Reading};

/// The prefix of every taint this module owns.
pub const TAINT_PREFIX: &str = "sandbox.cocoonstack.io/";
/// sandboxd's `/v1/info` has failed [`UNREACHABLE_AFTER`] times in a row.
pub const TAINT_UNREACHABLE: &str = "sandbox.cocoonstack.io/unreachable";
/// sandboxd is draining (its operator's `POST /v1/drain`).
pub const TAINT_DRAINING: &str = "sandbox.cocoonstack.io/draining";
/// sandboxd cannot take a claim: its claim cap is reached, or its host has
/// no room for a VM and no warm one is left.
pub const TAINT_AT_CAPACITY: &str = "sandbox.cocoonstack.io/at-capacity";
/// Every warm pool is empty (claims would provision: slow, or a redirect).
pub const TAINT_NO_WARM: &str = "sandbox.cocoonstack.io/no-warm-capacity";
/// Every key this module may add or remove; no other taint is touched.
pub const OWNED_TAINTS: [&str; 4] = [
    TAINT_UNREACHABLE,
    TAINT_DRAINING,
    TAINT_AT_CAPACITY,
    TAINT_NO_WARM,
];

pub const COND_REACHABLE: &str = "SandboxdReachable";
pub const COND_DRAINING: &str = "SandboxdDraining";
pub const COND_AT_CAPACITY: &str = "SandboxdAtCapacity";
pub const COND_POOLS_WARM: &str = "SandboxdPoolsWarm";

/// Failed reads in a row before the node is tainted unreachable (one
/// failure is often a blip; the feed reads every couple of seconds).
pub const UNREACHABLE_AFTER: u32 = 2;

/// Which parts are on (`--node-*-from-sandboxd`) and what is known of
/// sandboxd that `/v1/info` does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetSettings {
    pub capacity: bool,
    pub conditions: bool,
    pub taints: bool,
    /// sandboxd's `max_claims` (`--sandboxd-max-claims`); `None`: not known
    /// (`/v1/info` does not carry it).
    pub max_claims: Option<u64>,
}

impl FleetSettings {
    /// Whether anything reads `/v1/info` for the Node.
    pub fn any(&self) -> bool {
        self.capacity || self.conditions || self.taints
    }
}

/// One Node condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cond {
    pub type_: &'static str,
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// One taint (`NoSchedule` or `PreferNoSchedule`, never `NoExecute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetTaint {
    pub key: &'static str,
    pub effect: &'static str,
}

/// Allocatable derived from sandboxd; `None` keeps the static value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Derived {
    pub cpu: Option<String>,
    pub memory: Option<String>,
    pub pods: Option<String>,
}

/// What the Node says about sandboxd.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    pub conditions: Vec<Cond>,
    pub taints: Vec<FleetTaint>,
    pub capacity: Derived,
}

/// A size tier's CPUs and memory (MiB), as sandboxd's pool key names it
/// (docs/architecture.md#sandboxd-api); an unknown or empty size is `small`.
pub fn size_of(size: &str) -> (u64, u64) {
    match size {
        "medium" => (2, 1024),
        "large" => (4, 4096),
        "xlarge" => (4, 8192),
        "2xlarge" => (8, 16384),
        _ => (1, 512),
    }
}

/// Allocatable for `cap` sandboxes of the largest size any pool serves:
/// `pods` is the cap, and CPU and memory are what that many VMs take, so
/// the scheduler's resource scoring sees each node fill up (and spreads
/// Pods across equal nodes) and its filter stops at the cap.
pub fn capacity_for(cap: u64, pools: &[PoolInfo]) -> Derived {
    let (cpu, mem) = pools
        .iter()
        .map(|p| size_of(&p.key.size))
        .fold(size_of(""), |(c, m), (c2, m2)| (c.max(c2), m.max(m2)));
    Derived {
        cpu: Some(cap.saturating_mul(cpu).to_string()),
        memory: Some(format!("{}Mi", cap.saturating_mul(mem))),
        pods: Some(cap.to_string()),
    }
}

fn cond(type_: &'static str, status: &'static str, reason: &'static str, message: String) -> Cond {
    Cond {
        type_,
        status,
        reason,
        message,
    }
}

fn taint(key: &'static str) -> FleetTaint {
    FleetTaint {
        key,
        effect: "NoSchedule",
    }
}

fn pool_name(p: &PoolInfo) -> String {
    format!("{}/{}/{}", p.key.template, p.key.net, p.key.size)
}

/// The Node's view of one reading.
pub fn decide(reading: &Reading, s: &FleetSettings) -> Verdict {
    let (mut conditions, mut taints) = match reading {
        Reading::NotYet => (unknown_all("NotReadYet", "sandboxd not read yet"), vec![]),
        Reading::Failed {
            kind,
            message,
            consecutive,
            ..
        } => failed(*kind, message, *consecutive),
        Reading::Read(info) => read(info, s.max_claims),
    };
    let capacity = match (s.capacity, s.max_claims, reading.last_good()) {
        (true, Some(cap), Some(info)) if cap > 0 => capacity_for(cap, &info.pools),
        (true, Some(cap), None) if cap > 0 => capacity_for(cap, &[]),
        _ => Derived::default(),
    };
    if !s.conditions {
        conditions.clear();
    }
    if !s.taints {
        taints.clear();
    }
    Verdict {
        conditions,
        taints,
        capacity,
    }
}

fn unknown_all(reason: &'static str, why: &str) -> Vec<Cond> {
    [
        COND_REACHABLE,
        COND_DRAINING,
        COND_AT_CAPACITY,
        COND_POOLS_WARM,
    ]
    .into_iter()
    .map(|t| cond(t, "Unknown", reason, why.to_string()))
    .collect()
}

fn failed(kind: FailureKind, message: &str, consecutive: u32) -> (Vec<Cond>, Vec<FleetTaint>) {
    if kind == FailureKind::Refused {
        let why = format!(
            "sandboxd refused GET /v1/info ({message}): vk-sandbox needs sandboxd's root token \
             (--sandboxd-token-file) to see its capacity"
        );
        return (unknown_all("InfoRefused", &why), vec![]);
    }
    let why = format!("GET /v1/info failed: {message}");
    let mut conditions = unknown_all("InfoFailed", &why);
    let reason = if kind == FailureKind::Unreachable {
        "Unreachable"
    } else {
        "InfoFailed"
    };
    conditions[0] = cond(COND_REACHABLE, "False", reason, why);
    let taints = if consecutive >= UNREACHABLE_AFTER {
        vec![taint(TAINT_UNREACHABLE)]
    } else {
        vec![]
    };
    (conditions, taints)
}

fn read(info: &NodeInfo, max_claims: Option<u64>) -> (Vec<Cond>, Vec<FleetTaint>) {
    let mut taints = Vec::new();
    let reachable = cond(
        COND_REACHABLE,
        "True",
        "InfoRead",
        "GET /v1/info answered".into(),
    );
    let draining = if info.draining {
        taints.push(taint(TAINT_DRAINING));
        cond(
            COND_DRAINING,
            "True",
            "Draining",
            "sandboxd is draining: new claims get 429 (or a redirect); Running sandboxes stay"
                .into(),
        )
    } else {
        cond(
            COND_DRAINING,
            "False",
            "NotDraining",
            "sandboxd takes claims".into(),
        )
    };
    let warm: u64 = info.pools.iter().map(|p| p.warm).sum();
    let empty: Vec<String> = info
        .pools
        .iter()
        .filter(|p| p.warm == 0)
        .map(pool_name)
        .collect();
    // Messages of the healthy states carry no counts that move with every
    // claim: a verdict that changes is a Node write.
    let room = match max_claims {
        Some(cap) if cap > 0 => format!("below the claim cap ({cap})"),
        _ => "no claim cap known (--sandboxd-max-claims)".to_string(),
    };
    let parked = info.at_capacity.then(|| {
        info.at_capacity_reason
            .clone()
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "no room for another VM".into())
    });
    let at_capacity = match (max_claims, &parked) {
        (Some(cap), _) if cap > 0 && info.claimed >= cap => cond(
            COND_AT_CAPACITY,
            "True",
            "ClaimCapReached",
            format!(
                "{} live claims, cap {}: new claims get 429",
                info.claimed,
                max_claims.unwrap_or_default()
            ),
        ),
        (_, Some(why)) if warm == 0 => cond(
            COND_AT_CAPACITY,
            "True",
            "HostAtCapacity",
            format!("no warm VM and refills parked ({why})"),
        ),
        (_, Some(why)) => cond(
            COND_AT_CAPACITY,
            "False",
            "WarmVMsLeft",
            format!("warm VMs left, refills parked ({why})"),
        ),
        _ => cond(COND_AT_CAPACITY, "False", "HasRoom", room),
    };
    if at_capacity.status == "True" {
        taints.push(taint(TAINT_AT_CAPACITY));
    }
    let pools_warm = if info.pools.is_empty() {
        cond(
            COND_POOLS_WARM,
            "False",
            "NoPools",
            "sandboxd has no warm pool: every claim provisions a VM".into(),
        )
    } else if empty.is_empty() {
        cond(
            COND_POOLS_WARM,
            "True",
            "PoolsWarm",
            format!("every pool ({}) has warm VMs", info.pools.len()),
        )
    } else if empty.len() == info.pools.len() {
        taints.push(FleetTaint {
            key: TAINT_NO_WARM,
            effect: "PreferNoSchedule",
        });
        cond(
            COND_POOLS_WARM,
            "False",
            "PoolsEmpty",
            format!("no warm VM in any pool: {}", empty.join(", ")),
        )
    } else {
        cond(
            COND_POOLS_WARM,
            "False",
            "SomePoolsEmpty",
            format!("no warm VM in {}", empty.join(", ")),
        )
    };
    (vec![reachable, draining, at_capacity, pools_warm], taints)
}

#[cfg(test)]
mod tests;
