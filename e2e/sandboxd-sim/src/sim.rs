//! The simulated sandboxd: its state and the behaviour of its endpoints,
//! as plain replies. Transport faults (a status instead of the work, a
//! reply late, dropped or cut) are the HTTP edge's business
//! (`server/faults.rs`); the model acts out only what happens inside
//! sandboxd: a decision taken late (`persist_late`), a failed transition
//! (`fail`), a failed release (`release_fail_*`).
//!
//! By concern: `state` (what is held), `auth`, `claims` (claim and
//! release), `reads` (list, info) and `wire` (their JSON shapes),
//! `lifecycle` (hibernate, wake, renew, get, stats, owner),
//! `data_plane` (relays, exec), `pools` (refill, running slots),
//! `reaper` (deadlines, idle sweep), `persist` (state file, restart),
//! `admin` (the `/_sim` operations), `request_log`, `metrics`.

mod admin;
mod auth;
mod claims;
mod data_plane;
mod lifecycle;
mod metrics;
mod persist;
mod pools;
mod reads;
mod reaper;
mod request_log;
mod state;
mod wire;

pub use admin::{ClaimPatch, ClockPatch};
pub use claims::ReleaseFailure;
pub use data_plane::RelayGrant;
pub use lifecycle::TransitionFault;
pub use metrics::CONTENT_TYPE as METRICS_CONTENT_TYPE;
pub use request_log::{ReapRecord, RequestRecord};
pub use state::PoolState;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use jiff::Timestamp;
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::clock::Clock;
use crate::config::{GuestNetworkMode, SimConfig};
use crate::faults::Faults;
use crate::guest::Guests;
use crate::guest::netns::{self, GuestNetwork};
use crate::model::ClaimRecord;
use persist::read_state_file;
use request_log::RequestLog;
use state::{State, pools_from};

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

/// A request the model refused before doing any work (a bad token or
/// body, an unknown id). Its reply goes out as it is, whatever delivery
/// fault is armed: `slow`, `drop_after` and `truncate` act on the reply of
/// work done.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused(pub Reply);

impl From<Reply> for Refused {
    fn from(reply: Reply) -> Refused {
        Refused(reply)
    }
}

/// The model's answer to an API request: the reply of the work done, or
/// the refusal that came first.
pub type Answer = Result<Reply, Refused>;

pub struct Sim {
    state: Mutex<State>,
    /// The armed faults: the edge takes them; the model only the wake's
    /// (a relay's implicit wake, see `lifecycle`).
    faults: Mutex<Faults>,
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
            }),
            faults: Mutex::new(Faults::default()),
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
            sim.refill_all(&mut st);
        }
        Ok(sim)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn log_lock(&self) -> MutexGuard<'_, RequestLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The armed faults, for the edge (and a relay's implicit wake).
    pub(crate) fn armed(&self) -> MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
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
}
