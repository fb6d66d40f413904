//! sandboxd-sim: a simulator of sandboxd's HTTP API as vk-sandbox uses it
//! (docs/architecture.md#sandboxd-api; e2e/README.md), with fault injection,
//! an injectable clock, a request log and an admin API. Run it as the
//! `sandboxd-sim` binary, or in-process with [`start`] / [`start_local`].

pub mod admin;
pub mod clock;
pub mod config;
pub mod ctl;
pub mod faults;
pub mod guest;
pub mod model;
pub mod server;
pub mod sim;

use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use config::{
    ConfigPatch, DeadlineQuirk, GuestNetworkMode, OwnerAddrMode, PoolConfig, PortMapping, Quirks,
    SimConfig, TenantConfig, TenantList,
};
pub use faults::{Endpoint, Fault, FaultKind};
pub use guest::netns::GuestNetwork;
pub use model::{ClaimRecord, PoolKey};
pub use sim::{ClaimPatch, ClockPatch, ReapRecord, RequestRecord, Sim, SimError};

/// A running simulator. Dereferences to [`Sim`] for direct admin calls
/// (`handle.arm_fault(…)`, `handle.requests()`, `handle.reap()` …). Dropping
/// it stops the servers and closes their connections.
pub struct SimHandle {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    sim: Arc<Sim>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for SimHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimHandle")
            .field("addr", &self.addr)
            .field("admin_addr", &self.admin_addr)
            .finish_non_exhaustive()
    }
}

impl SimHandle {
    /// The API (and `/_sim` admin) address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`: what vk-sandbox's `--sandboxd-url` should be.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The separate admin listener, if configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    pub fn sim(&self) -> &Arc<Sim> {
        &self.sim
    }
}

impl Deref for SimHandle {
    type Target = Arc<Sim>;

    fn deref(&self) -> &Arc<Sim> {
        &self.sim
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        self.sim.kill_connections();
    }
}

fn io_err(context: String) -> impl FnOnce(std::io::Error) -> SimError {
    move |source| SimError::Io { context, source }
}

/// Start the simulator as configured (`listen` defaults to
/// `127.0.0.1:7777`).
pub async fn start(cfg: SimConfig) -> Result<SimHandle, SimError> {
    let listen = cfg
        .listen
        .unwrap_or_else(|| SocketAddr::from((Ipv4Addr::LOCALHOST, 7777)));
    let admin_listen = cfg.admin_listen;
    let reap_interval = Duration::from_millis(cfg.reap_interval_ms);
    let sim = Sim::new(cfg)?;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(io_err(format!("listen on {listen}")))?;
    let addr = listener
        .local_addr()
        .map_err(io_err("read the listen address".into()))?;
    let mut tasks = vec![tokio::spawn(server::serve_api(
        sim.clone(),
        listener,
        server::router(sim.clone()),
    ))];
    let mut admin_addr = None;
    if let Some(a) = admin_listen {
        let l = TcpListener::bind(a)
            .await
            .map_err(io_err(format!("listen on {a} (admin)")))?;
        admin_addr = Some(
            l.local_addr()
                .map_err(io_err("read the admin address".into()))?,
        );
        tasks.push(tokio::spawn(server::serve_admin(sim.clone(), l)));
    }
    if !reap_interval.is_zero() {
        let weak = Arc::downgrade(&sim);
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(reap_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                match weak.upgrade() {
                    Some(sim) => {
                        sim.reap();
                        sim.sweep();
                    }
                    None => return,
                }
            }
        }));
    }
    Ok(SimHandle {
        addr,
        admin_addr,
        sim,
        tasks,
    })
}

/// Start in-process on `127.0.0.1:0` (no separate admin port), for tests.
pub async fn start_local(mut cfg: SimConfig) -> Result<SimHandle, SimError> {
    cfg.listen = Some(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
    cfg.admin_listen = None;
    start(cfg).await
}
