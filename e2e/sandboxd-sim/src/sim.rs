//! The simulated sandboxd: state, the behaviour of the claim, release, list
//! and info endpoints, the reaper, persistence, and the admin operations.
//! The lifecycle verbs are in [`lifecycle`], the data-plane relays in
//! [`data_plane`].
//!
//! Endpoint methods return an [`Outcome`]: the reply plus what the
//! connection layer should do with it (send now, later, half, or never).

mod data_plane;
mod lifecycle;
mod metrics;

pub use data_plane::RelayGrant;
pub use metrics::CONTENT_TYPE as METRICS_CONTENT_TYPE;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::clock::Clock;
use crate::config::{
    ConfigPatch, DeadlineQuirk, GuestNetworkMode, OwnerAddrMode, PoolConfig, Quirks, SimConfig,
    TenantList,
};
use crate::faults::{ArmedFault, Endpoint, Fault, FaultKind, Faults};
use crate::guest::Guests;
use crate::guest::netns::{self, GuestNetwork};
use crate::model::{
    ClaimBody, ClaimRecord, PoolKey, ZERO_TIME, bearer, clamp_ttl, ct_eq, decode_claim_body,
    format_deadline, new_id, new_token,
};

/// Most requests kept in the request log (oldest dropped first).
const REQUEST_LOG_CAP: usize = 10_000;
/// Made-up peers for a redirect fault when none are configured.
const DEFAULT_FAULT_PEERS: [&str; 2] = ["10.0.0.6:7777", "10.0.0.7:7777"];

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("{0}")]
    Config(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

/// A reply body.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Json(Value),
    Empty,
    Raw {
        content_type: String,
        bytes: Vec<u8>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub body: Body,
}

impl Reply {
    pub fn json(status: u16, value: Value) -> Reply {
        Reply {
            status,
            body: Body::Json(value),
        }
    }

    pub fn error(status: u16, message: impl Into<String>) -> Reply {
        Reply::json(status, json!({ "error": message.into() }))
    }

    pub fn empty(status: u16) -> Reply {
        Reply {
            status,
            body: Body::Empty,
        }
    }
}

/// What to do with a reply on the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    Send,
    /// Send after this long (the effect is already applied).
    Delay(Duration),
    /// Close the connection without replying.
    Drop,
    /// Send the headers and half the body, then close.
    Truncate,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub reply: Reply,
    pub after: After,
}

impl From<Reply> for Outcome {
    fn from(reply: Reply) -> Outcome {
        Outcome {
            reply,
            after: After::Send,
        }
    }
}

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

/// One recorded API request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub seq: u64,
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The Authorization header verbatim, if any.
    pub authorization: Option<String>,
    /// The body, as UTF-8 (lossy).
    pub body: String,
    /// `None` while in flight, or when no reply was sent.
    pub status: Option<u16>,
    pub note: Option<String>,
}

/// A claim the reaper ended at its deadline (destroyed or archived).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReapRecord {
    pub id: String,
    /// The request log's last sequence number when it was reaped: requests
    /// up to it came before.
    pub after_seq: u64,
    /// Archived rather than destroyed.
    pub archived: bool,
}

#[derive(Debug, Default)]
struct RequestLog {
    entries: Vec<RequestRecord>,
    next_seq: u64,
    reaped: Vec<ReapRecord>,
}

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

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StateFile {
    claims: Vec<ClaimRecord>,
}

#[derive(Debug)]
struct State {
    cfg: SimConfig,
    pools: BTreeMap<PoolKey, PoolState>,
    claims: BTreeMap<String, ClaimRecord>,
    /// What was last persisted (the file's content, or the in-memory stand-in
    /// when no state file is configured).
    persisted: Vec<ClaimRecord>,
    faults: Faults,
}

enum Principal {
    Root,
    Open,
    Tenant(String),
}

pub struct Sim {
    state: Mutex<State>,
    log: Mutex<RequestLog>,
    clock: Clock,
    state_file: Option<PathBuf>,
    /// Each VM's guest side (scratch directory, processes).
    guests: Guests,
    /// Hibernate and wake of one sandbox are serialized.
    transitions: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// What `/metrics` counts.
    counters: metrics::Counters,
    pub(crate) accepting: watch::Sender<bool>,
    pub(crate) kill: watch::Sender<u64>,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("state_file", &self.state_file)
            .finish_non_exhaustive()
    }
}

fn pool_state(p: &PoolConfig) -> PoolState {
    PoolState {
        warm: p.warm,
        target: p.target.unwrap_or(p.warm),
        golden: p.golden,
        refilling: 0,
        archive_on_expire: p.archive_on_expire,
        archive_retention_seconds: p.archive_retention_seconds,
    }
}

fn pools_from(cfg: &SimConfig) -> Result<BTreeMap<PoolKey, PoolState>, String> {
    let mut pools = BTreeMap::new();
    for p in &cfg.pools {
        let key = PoolKey::new(&p.template, &p.net, &p.size)
            .map_err(|e| format!("pool {:?}: {e}", p.template))?;
        pools.insert(key, pool_state(p));
    }
    Ok(pools)
}

fn read_state_file(path: &Path) -> Result<Vec<ClaimRecord>, SimError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice::<StateFile>(&bytes)
            .map(|f| f.claims)
            .map_err(|e| SimError::Config(format!("state file {}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(SimError::Io {
            context: format!("read state file {}", path.display()),
            source,
        }),
    }
}

fn write_state_file(path: &Path, claims: &[ClaimRecord]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let bytes = serde_json::to_vec(&StateFile {
        claims: claims.to_vec(),
    })
    .map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// A stable order with no meaning, as sandboxd sorts pools by key hash.
fn key_hash(key: &PoolKey) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("{}\0{}\0{}", key.template, key.net, key.size).bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Where the guests' networks go, as configured; said at start-up.
fn guest_network(mode: GuestNetworkMode) -> Result<GuestNetwork, SimError> {
    // Whether namespaces can be made does not change while the process
    // runs: probed once (tests start many simulators).
    static PROBED: std::sync::OnceLock<GuestNetwork> = std::sync::OnceLock::new();
    let network = match mode {
        GuestNetworkMode::Host => {
            GuestNetwork::HostLoopback("guest_network: host was asked for".to_string())
        }
        GuestNetworkMode::Auto => PROBED.get_or_init(netns::probe).clone(),
        GuestNetworkMode::Namespaces => match PROBED.get_or_init(netns::probe) {
            GuestNetwork::HostLoopback(why) => {
                return Err(SimError::Config(format!(
                    "guest_network: namespaces: {why}"
                )));
            }
            ok => ok.clone(),
        },
    };
    match &network {
        GuestNetwork::HostLoopback(_) if mode == GuestNetworkMode::Auto => {
            warn!("sandboxd-sim: guest network: {}", network.describe());
        }
        _ => info!("sandboxd-sim: guest network: {}", network.describe()),
    }
    Ok(network)
}

fn default_status_message(status: u16) -> &'static str {
    match status {
        429 => "node claim quota reached: injected by sandboxd-sim",
        500 => "internal error (injected by sandboxd-sim)",
        503 => "service unavailable (injected by sandboxd-sim)",
        _ => "injected by sandboxd-sim",
    }
}

impl Sim {
    /// Build the simulator, loading persisted claims from the state file.
    pub fn new(cfg: SimConfig) -> Result<Arc<Sim>, SimError> {
        let pools = pools_from(&cfg).map_err(SimError::Config)?;
        let state_file = cfg.state_file.clone();
        let claims: Vec<ClaimRecord> = match &state_file {
            Some(path) => read_state_file(path)?,
            None => Vec::new(),
        };
        for m in &cfg.port_map {
            m.validate().map_err(SimError::Config)?;
        }
        let clock = Clock::new(cfg.clock_start, cfg.clock_frozen);
        let guests = Guests::new(cfg.scratch_dir.clone(), guest_network(cfg.guest_network)?);
        let sim = Arc::new(Sim {
            state: Mutex::new(State {
                cfg,
                pools,
                claims: claims.iter().map(|c| (c.id.clone(), c.clone())).collect(),
                persisted: claims,
                faults: Faults::default(),
            }),
            log: Mutex::new(RequestLog::default()),
            clock,
            state_file,
            guests,
            transitions: Mutex::new(HashMap::new()),
            counters: metrics::Counters::default(),
            accepting: watch::Sender::new(true),
            kill: watch::Sender::new(0),
        });
        {
            let mut st = sim.lock();
            sim.persist(&mut st);
            let keys: Vec<PoolKey> = st.pools.keys().cloned().collect();
            for key in keys {
                sim.top_up(&mut st, &key);
            }
        }
        Ok(sim)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn log_lock(&self) -> MutexGuard<'_, RequestLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The guest shell `pty_open` starts.
    pub fn agent_shell(&self) -> String {
        let configured = self.lock().cfg.agent_shell.clone();
        if !configured.is_empty() {
            configured
        } else if Path::new("/bin/bash").exists() {
            "/bin/bash".to_string()
        } else {
            "/bin/sh".to_string()
        }
    }

    /// Each VM's guest side.
    pub fn guests(&self) -> &Guests {
        &self.guests
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    // ----- persistence -------------------------------------------------

    fn persist(&self, st: &mut State) {
        st.persisted = st.claims.values().cloned().collect();
        if let Some(path) = &self.state_file
            && let Err(e) = write_state_file(path, &st.persisted)
        {
            warn!(path = %path.display(), error = %e, "sandboxd-sim: persisting claims failed");
        }
    }

    // ----- auth: root, tenant and sandbox tokens, open mode --------------

    fn auth_node(st: &State, header: Option<&str>) -> Result<Principal, Reply> {
        let cfg = &st.cfg;
        if cfg.api_token.is_empty() && cfg.tenants.is_empty() {
            return Ok(Principal::Open);
        }
        let Some(token) = bearer(header) else {
            return Err(Reply::error(401, "invalid api token"));
        };
        if !cfg.api_token.is_empty() && ct_eq(token, &cfg.api_token) {
            return Ok(Principal::Root);
        }
        for t in &cfg.tenants {
            if !t.token.is_empty() && ct_eq(token, &t.token) {
                return Ok(Principal::Tenant(t.name.clone()));
            }
        }
        Err(Reply::error(401, "invalid api token"))
    }

    fn auth_root(st: &State, header: Option<&str>) -> Result<(), Reply> {
        match Self::auth_node(st, header)? {
            Principal::Tenant(_) => Err(Reply::error(403, "operator token required")),
            Principal::Root | Principal::Open => Ok(()),
        }
    }

    // ----- faults --------------------------------------------------------

    fn take_fault(&self, endpoint: Endpoint) -> Option<FaultKind> {
        self.lock().faults.take(endpoint)
    }

    /// Faults that replace the reply outright, with no side effect.
    fn pre_fault(&self, fault: &Option<FaultKind>) -> Option<Outcome> {
        match fault.as_ref()? {
            FaultKind::Status {
                status,
                error,
                body,
                content_type,
            } => Some(
                match body {
                    Some(body) => Reply {
                        status: *status,
                        body: Body::Raw {
                            content_type: content_type
                                .clone()
                                .unwrap_or_else(|| "application/json".to_string()),
                            bytes: body.clone().into_bytes(),
                        },
                    },
                    None => Reply::error(
                        *status,
                        error
                            .clone()
                            .unwrap_or_else(|| default_status_message(*status).to_string()),
                    ),
                }
                .into(),
            ),
            FaultKind::Redirect { peers } => {
                let peers = if !peers.is_empty() {
                    peers.clone()
                } else {
                    let configured = self.lock().cfg.peers.clone();
                    if configured.is_empty() {
                        DEFAULT_FAULT_PEERS.iter().map(|p| p.to_string()).collect()
                    } else {
                        configured
                    }
                };
                Some(Reply::json(200, json!({ "redirect": peers })).into())
            }
            FaultKind::Garbage => Some(
                Reply {
                    status: 200,
                    body: Body::Raw {
                        content_type: "application/json".to_string(),
                        bytes: b"<html>sandboxd-sim: this is not JSON {".to_vec(),
                    },
                }
                .into(),
            ),
            FaultKind::DropBefore => Some(Outcome {
                reply: Reply::empty(500),
                after: After::Drop,
            }),
            _ => None,
        }
    }

    /// Faults that change how a normally processed reply is delivered.
    fn post_fault(fault: &Option<FaultKind>, reply: Reply) -> Outcome {
        let after = match fault {
            Some(FaultKind::Slow { ms }) => After::Delay(Duration::from_millis(*ms)),
            Some(FaultKind::DropAfter) => After::Drop,
            Some(FaultKind::Truncate) => After::Truncate,
            _ => After::Send,
        };
        Outcome { reply, after }
    }

    // ----- POST /v1/claim -------------------------------------------------

    pub async fn claim(self: &Arc<Self>, auth: Option<&str>, body: &[u8]) -> Outcome {
        let fault = self.take_fault(Endpoint::Claim);
        if let Some(outcome) = self.pre_fault(&fault) {
            return outcome;
        }
        if let Some(FaultKind::PersistLate { ms }) = fault {
            return self.claim_late(auth, body, Duration::from_millis(ms)).await;
        }
        let reply = self.claim_inner(auth, body).await;
        Self::post_fault(&fault, reply)
    }

    /// The `persist_late` fault: the claim is decided after `delay` on a task
    /// of its own, so it completes (and persists) even when the client hangs
    /// up and the connection's handler is dropped, as sandboxd's Go handler
    /// runs on after its client has gone.
    async fn claim_late(
        self: &Arc<Self>,
        auth: Option<&str>,
        body: &[u8],
        delay: Duration,
    ) -> Outcome {
        let sim = Arc::clone(self);
        let auth = auth.map(str::to_string);
        let body = body.to_vec();
        let task = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let reply = sim.claim_inner(auth.as_deref(), &body).await;
            info!(
                status = reply.status,
                ?delay,
                "sandboxd-sim: late claim decided"
            );
            reply
        });
        task.await
            .unwrap_or_else(|_| Reply::error(500, "provisioning failed"))
            .into()
    }

    async fn claim_inner(self: &Arc<Self>, auth: Option<&str>, body: &[u8]) -> Reply {
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

    fn owner_addr(cfg: &SimConfig) -> Option<String> {
        match cfg.owner_addr_mode {
            OwnerAddrMode::HostPort => Some(cfg.advertise_addr.clone()),
            OwnerAddrMode::HostLess => {
                let port = cfg
                    .advertise_addr
                    .rsplit_once(':')
                    .map_or("7777", |(_, p)| p);
                Some(format!(":{port}"))
            }
            OwnerAddrMode::Omit => None,
            OwnerAddrMode::Origin => Some(cfg.origin.clone()),
        }
    }

    /// The wire deadline. `in_list`: rows always carry one (zero time for
    /// "never"); a claim reply leaves a "never" deadline out.
    fn deadline_json(q: &Quirks, deadline: Option<Timestamp>, in_list: bool) -> Option<Value> {
        match q.deadline {
            DeadlineQuirk::Missing => None,
            DeadlineQuirk::Zero => Some(Value::from(ZERO_TIME)),
            DeadlineQuirk::Unparseable => Some(Value::from("not-a-time")),
            DeadlineQuirk::Normal => match deadline {
                Some(ts) => Some(Value::from(format_deadline(ts, q.deadline_offset_minutes))),
                None if in_list => Some(Value::from(ZERO_TIME)),
                None => None,
            },
        }
    }

    /// VMs using a running slot: warm, refilling, and claims that are
    /// neither hibernated, archived nor failed.
    fn running_vms(st: &State) -> usize {
        let pooled: u32 = st.pools.values().map(|p| p.warm + p.refilling).sum();
        pooled as usize + st.claims.values().filter(|c| c.is_running()).count()
    }

    /// Whether another VM can start (`max_running`).
    fn has_free_slot(st: &State) -> bool {
        st.cfg.max_running == 0 || Self::running_vms(st) < st.cfg.max_running as usize
    }

    /// Refill every pool (a slot may have come free).
    fn refill_all(self: &Arc<Self>, st: &mut State) {
        let keys: Vec<PoolKey> = st.pools.keys().cloned().collect();
        for key in keys {
            self.top_up(st, &key);
        }
    }

    /// Schedule refills until warm + refilling reaches the target (or the
    /// node has no running slot left: the refill parks).
    fn top_up(self: &Arc<Self>, st: &mut State, key: &PoolKey) {
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

    // ----- POST /v1/sandboxes/{id}/release --------------------------------

    pub fn release(self: &Arc<Self>, auth: Option<&str>, id: &str) -> Outcome {
        let fault = self.take_fault(Endpoint::Release);
        if let Some(outcome) = self.pre_fault(&fault) {
            return outcome;
        }
        let Some(token) = bearer(auth) else {
            return Reply::error(401, "missing bearer token").into();
        };
        let mut st = self.lock();
        let is_root = !st.cfg.api_token.is_empty() && ct_eq(token, &st.cfg.api_token);
        let owned = st
            .claims
            .get(id)
            .is_some_and(|c| is_root || ct_eq(token, &c.token));
        if !owned {
            return Reply::error(404, "unknown sandbox").into();
        }
        if matches!(fault, Some(FaultKind::ReleaseFailKeep)) {
            // Persisting the removal failed: rolled back, still live.
            return Reply::error(500, "release failed").into();
        }
        st.claims.remove(id);
        self.persist(&mut st);
        self.guests.destroy(id);
        self.forget_transition(id);
        self.refill_all(&mut st);
        self.counters.released();
        info!(id, "sandboxd-sim: released");
        if matches!(fault, Some(FaultKind::ReleaseFailDrop)) {
            // Dropped and persisted, but the VM survived removal.
            return Reply::error(500, "release failed").into();
        }
        let outcome = Self::post_fault(&fault, Reply::empty(204));
        if outcome.after == After::Truncate {
            // A 204 has no body to cut: lose the reply instead.
            return Outcome {
                after: After::Drop,
                ..outcome
            };
        }
        outcome
    }

    // ----- GET /v1/sandboxes ----------------------------------------------

    pub fn list(&self, auth: Option<&str>) -> Outcome {
        let fault = self.take_fault(Endpoint::List);
        if let Some(outcome) = self.pre_fault(&fault) {
            return outcome;
        }
        let st = self.lock();
        let only_tenant = match Self::auth_node(&st, auth) {
            Ok(Principal::Tenant(name)) => match st.cfg.tenant_list {
                TenantList::Forbidden => {
                    return Reply::error(403, "operator token required").into();
                }
                TenantList::Own => Some(name),
            },
            Ok(_) => None,
            Err(reply) => return reply.into(),
        };
        let rows: Vec<Value> = st
            .claims
            .values()
            .filter(|c| only_tenant.is_none() || c.tenant == only_tenant)
            .map(|c| Self::row_json(&st.cfg.quirks, c))
            .collect();
        Self::post_fault(&fault, Reply::json(200, json!({ "sandboxes": rows })))
    }

    fn row_json(q: &Quirks, c: &ClaimRecord) -> Value {
        let mut v = json!({
            "id": c.id,
            "key": c.key.to_json(q.engine_in_key),
            "hibernated": c.hibernated,
        });
        if let Some(d) = Self::deadline_json(q, c.deadline, true) {
            v["deadline"] = d;
        }
        if c.archived {
            v["archived"] = Value::from(true);
        }
        if !c.claim_ref.is_empty() {
            v["claim_ref"] = Value::from(c.claim_ref.clone());
        }
        if let Some(reason) = &c.failed {
            v["failed"] = Value::from(reason.clone());
        }
        if !c.volumes.is_empty() {
            v["volumes"] = json!(c.volumes);
        }
        if !c.on_expire.is_empty() {
            v["on_expire"] = Value::from(c.on_expire.clone());
        }
        if q.extra_fields {
            v["claimed_at"] = Value::from(c.claimed_at.to_string());
            v["restarts"] = Value::from(0);
            v["x_sim_unknown"] = json!({ "nested": true });
        }
        v
    }

    // ----- GET /v1/info ---------------------------------------------------

    pub fn info(&self, auth: Option<&str>) -> Outcome {
        let fault = self.take_fault(Endpoint::Info);
        if let Some(outcome) = self.pre_fault(&fault) {
            return outcome;
        }
        let st = self.lock();
        if let Err(reply) = Self::auth_root(&st, auth) {
            return reply.into();
        }
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
        Self::post_fault(&fault, Reply::json(200, v))
    }

    // ----- reaper: drops claims past their deadline -----------------------

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

    // ----- admin operations -----------------------------------------------

    pub fn arm_fault(&self, fault: Fault) -> Result<u64, String> {
        fault.validate()?;
        Ok(self.lock().faults.arm(fault))
    }

    pub fn faults(&self) -> Vec<ArmedFault> {
        self.lock().faults.list()
    }

    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// `POST`/`DELETE /v1/drain`: root only; `204`.
    pub fn set_draining(&self, auth: Option<&str>, draining: bool) -> Outcome {
        let mut st = self.lock();
        if let Err(reply) = Self::auth_root(&st, auth) {
            return reply.into();
        }
        st.cfg.draining = draining;
        Reply::empty(204).into()
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

    /// A simulated restart: rebuild the claims from what was persisted,
    /// silently dropping `drop_ids` (as reconcile drops claims whose VM is
    /// gone), and reset the pools to their configuration. Returns the ids
    /// that survived.
    pub fn restart(self: &Arc<Self>, drop_ids: &[String]) -> Result<Vec<String>, SimError> {
        let mut st = self.lock();
        let source = match &self.state_file {
            Some(path) => read_state_file(path)?,
            None => st.persisted.clone(),
        };
        st.claims = source
            .into_iter()
            .filter(|c| !drop_ids.contains(&c.id))
            .map(|c| (c.id.clone(), c))
            .collect();
        for id in drop_ids {
            self.guests.destroy(id);
        }
        st.pools = pools_from(&st.cfg).map_err(SimError::Config)?;
        self.persist(&mut st);
        let keys: Vec<PoolKey> = st.pools.keys().cloned().collect();
        for key in keys {
            self.top_up(&mut st, &key);
        }
        info!(dropped = ?drop_ids, "sandboxd-sim: restarted");
        Ok(st.claims.keys().cloned().collect())
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
            "faults": st.faults.list(),
        })
    }

    // ----- request log ----------------------------------------------------

    pub(crate) fn log_begin(
        &self,
        method: &str,
        path: &str,
        authorization: Option<String>,
        body: &[u8],
    ) -> u64 {
        let mut log = self.log_lock();
        log.next_seq += 1;
        let seq = log.next_seq;
        log.entries.push(RequestRecord {
            seq,
            method: method.to_string(),
            path: path.to_string(),
            authorization,
            body: String::from_utf8_lossy(body).into_owned(),
            status: None,
            note: None,
        });
        if log.entries.len() > REQUEST_LOG_CAP {
            let excess = log.entries.len() - REQUEST_LOG_CAP;
            log.entries.drain(..excess);
        }
        seq
    }

    pub(crate) fn log_finish(&self, seq: u64, status: Option<u16>, note: Option<String>) {
        let mut log = self.log_lock();
        if let Some(e) = log.entries.iter_mut().rev().find(|e| e.seq == seq) {
            e.status = status;
            if note.is_some() {
                e.note = note;
            }
        }
    }

    pub fn requests(&self) -> Vec<RequestRecord> {
        self.log_lock().entries.clone()
    }

    /// Every claim the reaper ended, in order (kept across
    /// [`Sim::clear_requests`]).
    pub fn reaped(&self) -> Vec<ReapRecord> {
        self.log_lock().reaped.clone()
    }

    pub fn clear_requests(&self) {
        self.log_lock().entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    async fn timed_claim(sim: &Arc<Sim>) -> (u16, Duration) {
        let start = Instant::now();
        let out = sim
            .claim(None, br#"{"template":"base:24.04","claim_ref":"ns/p"}"#)
            .await;
        (out.reply.status, start.elapsed())
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
