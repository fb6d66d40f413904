//! The guests: what runs "inside" each simulated microVM. The simulator
//! stands in for the in-guest agent (silkd) by REALLY running commands as
//! local processes, each VM in a scratch directory of its own under the
//! simulator's state or temp directory (created on first use, removed when
//! the sandbox is released or reaped). A hibernated VM's processes are
//! stopped (SIGSTOP) and continue on wake, as a memory snapshot keeps them.
//! Each VM has a guest network of its own ([`netns`]) where the simulator
//! may make network namespaces, the host's loopback otherwise.
//!
//! A VM's processes are everything its commands started, as in a VM: a
//! process an exec left running in the background outlives the exec (only
//! the exec's own process is signalled when its client hangs up), and all
//! of them are stopped on hibernate, continued on wake and killed when the
//! VM is destroyed. With a namespace they are found by it (every process
//! in it); on the host's loopback by the process groups the commands were
//! started in (a daemon that made a session of its own escapes those).
//!
//! - [`frames`]: the agent's newline-delimited JSON frames;
//! - [`agent`]: one agent connection (exec, stdin, pty, resize, kill, ps);
//! - [`process`]: spawning a command the way the agent does;
//! - [`pty`]: pseudo-terminals for the shell;
//! - [`netns`]: the guest network.

pub mod agent;
pub mod frames;
pub mod netns;
pub mod process;
pub mod pty;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use rustix::process::{Pid, Signal};
use serde_json::{Value, json};
use tracing::{debug, warn};

use self::netns::{GuestNetwork, NetNs};
use self::pty::PtyMaster;

/// One process in a VM's table.
struct Proc {
    argv: Vec<String>,
    started_at_epoch_secs: u64,
    /// The pseudo-terminal of a shell opened with `pty_open`.
    pty: Option<Arc<PtyMaster>>,
}

/// One simulated VM's guest side.
pub struct Vm {
    pub id: String,
    pub scratch: PathBuf,
    /// Its network namespace; `None` where guests share the host's
    /// loopback.
    net: Option<NetNs>,
    /// The process groups its commands were started in (each command leads
    /// one, a shell a session): how its processes are found without a
    /// namespace.
    groups: Mutex<BTreeSet<u32>>,
    /// The commands the agent runs for a client (foreground execs, shells).
    procs: Mutex<BTreeMap<u32, Proc>>,
    /// Open relays (agent, ports): they hold the VM against idle
    /// hibernation.
    relays: AtomicUsize,
    started: Instant,
}

impl std::fmt::Debug for Vm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm")
            .field("id", &self.id)
            .field("scratch", &self.scratch)
            .finish_non_exhaustive()
    }
}

/// Why a pid-addressed request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PidError {
    NotFound(u32),
    BadSignal(i32),
    NotATerminal(u32),
    Os(String),
}

impl std::fmt::Display for PidError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PidError::NotFound(pid) => write!(f, "no process {pid}"),
            PidError::BadSignal(s) => write!(f, "unknown signal {s}"),
            PidError::NotATerminal(pid) => write!(f, "process {pid} has no terminal"),
            PidError::Os(e) => f.write_str(e),
        }
    }
}

fn pid(raw: u32) -> std::io::Result<Pid> {
    i32::try_from(raw)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| std::io::Error::other(format!("bad pid {raw}")))
}

impl Vm {
    fn procs(&self) -> MutexGuard<'_, BTreeMap<u32, Proc>> {
        self.procs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn groups(&self) -> MutexGuard<'_, BTreeSet<u32>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The VM's network namespace, if guests have their own.
    pub fn net(&self) -> Option<&NetNs> {
        self.net.as_ref()
    }

    /// The path naming its network namespace while the simulator runs.
    pub fn netns_path(&self) -> Option<String> {
        self.net.as_ref().map(NetNs::path)
    }

    /// Connect to the guest's `127.0.0.1:port`: inside its namespace, or
    /// the host's loopback without one.
    pub async fn dial(&self, port: u16) -> std::io::Result<tokio::net::TcpStream> {
        match &self.net {
            Some(net) => net.dial(port).await,
            None => tokio::net::TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port)).await,
        }
    }

    /// A command started in its own process group (or session), `pid`
    /// leading it, belongs to this VM; `argv` lists it in `ps` until
    /// [`Vm::unregister`].
    pub(crate) fn register(&self, pid: u32, argv: Vec<String>, pty: Option<Arc<PtyMaster>>) {
        self.groups().insert(pid);
        let started_at_epoch_secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.procs().insert(
            pid,
            Proc {
                argv,
                started_at_epoch_secs,
                pty,
            },
        );
    }

    pub(crate) fn unregister(&self, pid: u32) {
        self.procs().remove(&pid);
    }

    /// `kill{pid, signal}`: SIGKILL when no signal is given, to that
    /// process alone (what it started in the background runs on, as in a
    /// VM).
    pub fn kill(&self, pid: u32, signal: Option<i32>) -> Result<(), PidError> {
        let sig = match signal {
            None => Signal::KILL,
            Some(n) => Signal::from_named_raw(n).ok_or(PidError::BadSignal(n))?,
        };
        if !self.procs().contains_key(&pid) {
            return Err(PidError::NotFound(pid));
        }
        let target = self::pid(pid).map_err(|e| PidError::Os(e.to_string()))?;
        rustix::process::kill_process(target, sig).map_err(|e| PidError::Os(e.to_string()))
    }

    /// `pty_resize{pid, cols, rows}`: the shell's terminal gets the new
    /// size (and its foreground job a SIGWINCH, from the kernel).
    pub fn resize(&self, pid: u32, cols: u16, rows: u16) -> Result<(), PidError> {
        let pty = match self.procs().get(&pid) {
            None => return Err(PidError::NotFound(pid)),
            Some(p) => p.pty.clone().ok_or(PidError::NotATerminal(pid))?,
        };
        pty.resize(cols, rows)
            .map_err(|e| PidError::Os(format!("resize: {e}")))
    }

    /// `ps`: every process of this VM.
    pub fn ps(&self) -> Vec<Value> {
        self.procs()
            .iter()
            .map(|(pid, p)| {
                json!({
                    "pid": pid, "argv": p.argv, "detached": false, "state": "running",
                    "started_at_epoch_secs": p.started_at_epoch_secs,
                })
            })
            .collect()
    }

    pub fn proc_count(&self) -> usize {
        self.procs().len()
    }

    pub fn uptime_secs(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// Signal every process of the VM: those in its namespace, or without
    /// one every process group its commands started (a group with nobody
    /// left is forgotten).
    fn signal_all(&self, sig: Signal) {
        if let Some(net) = &self.net {
            let n = net.signal_all(sig);
            debug!(vm = %self.id, ?sig, processes = n, "sandboxd-sim: signalled the VM's processes");
            return;
        }
        let groups: Vec<u32> = self.groups().iter().copied().collect();
        for group in groups {
            let sent = self::pid(group)
                .and_then(|g| rustix::process::kill_process_group(g, sig).map_err(Into::into));
            match sent {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => {
                    self.groups().remove(&group);
                }
                Err(e) => debug!(vm = %self.id, group, error = %e, "sandboxd-sim: signal failed"),
            }
        }
    }

    /// An open relay: holds the VM against idle hibernation until dropped.
    pub fn hold(self: &Arc<Self>) -> RelayHold {
        self.relays.fetch_add(1, Ordering::SeqCst);
        RelayHold(Arc::clone(self))
    }

    pub fn open_relays(&self) -> usize {
        self.relays.load(Ordering::SeqCst)
    }
}

/// Counts one open relay on its VM while alive.
#[derive(Debug)]
pub struct RelayHold(Arc<Vm>);

impl Drop for RelayHold {
    fn drop(&mut self) {
        self.0.relays.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Every VM's guest side, keyed by sandbox id.
pub struct Guests {
    root: PathBuf,
    network: GuestNetwork,
    /// The root was made for this simulator and goes with it.
    own_root: bool,
    vms: Mutex<HashMap<String, Arc<Vm>>>,
}

impl std::fmt::Debug for Guests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guests")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl Guests {
    /// Scratch directories go under `root`, or a fresh directory in the
    /// system's temp directory (removed when the simulator goes); each VM
    /// gets a network namespace if `network` says so.
    pub fn new(root: Option<PathBuf>, network: GuestNetwork) -> Guests {
        let (root, own_root) = match root {
            Some(r) => (r, false),
            None => (
                std::env::temp_dir().join(format!(
                    "sandboxd-sim-{}-{:016x}",
                    std::process::id(),
                    rand::random::<u64>()
                )),
                true,
            ),
        };
        Guests {
            root,
            network,
            own_root,
            vms: Mutex::new(HashMap::new()),
        }
    }

    fn vms(&self) -> MutexGuard<'_, HashMap<String, Arc<Vm>>> {
        self.vms.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the guests' networks are.
    pub fn network(&self) -> &GuestNetwork {
        &self.network
    }

    /// The VM's guest side, its scratch directory (and network namespace)
    /// made on first use.
    pub fn vm(&self, id: &str) -> std::io::Result<Arc<Vm>> {
        if let Some(vm) = self.vms().get(id) {
            return Ok(Arc::clone(vm));
        }
        // Ids are `sb_` + hex, but a restored state file could hold anything:
        // keep the directory name to safe characters.
        let name: String = id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let scratch = self.root.join(name);
        std::fs::create_dir_all(&scratch)?;
        let mut vms = self.vms();
        if let Some(vm) = vms.get(id) {
            return Ok(Arc::clone(vm));
        }
        let net = match self.network {
            GuestNetwork::Namespaces => Some(NetNs::create()?),
            GuestNetwork::HostLoopback(_) => None,
        };
        let vm = vms.entry(id.to_string()).or_insert_with(|| {
            Arc::new(Vm {
                id: id.to_string(),
                scratch,
                net,
                groups: Mutex::new(BTreeSet::new()),
                procs: Mutex::new(BTreeMap::new()),
                relays: AtomicUsize::new(0),
                started: Instant::now(),
            })
        });
        Ok(Arc::clone(vm))
    }

    /// The VM if it was ever used.
    pub fn existing(&self, id: &str) -> Option<Arc<Vm>> {
        self.vms().get(id).cloned()
    }

    /// The VM is destroyed: its processes are killed and its scratch
    /// directory removed.
    pub fn destroy(&self, id: &str) {
        let Some(vm) = self.vms().remove(id) else {
            return;
        };
        vm.signal_all(Signal::CONT);
        vm.signal_all(Signal::KILL);
        if let Err(e) = std::fs::remove_dir_all(&vm.scratch)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(vm = %id, error = %e, "sandboxd-sim: removing the scratch directory failed");
        }
    }

    /// A cold boot: the VM's processes are gone, its disk stays.
    pub fn kill_all(&self, id: &str) {
        if let Some(vm) = self.existing(id) {
            vm.signal_all(Signal::CONT);
            vm.signal_all(Signal::KILL);
        }
    }

    /// Hibernation stops the VM's processes; a wake continues them.
    pub fn freeze(&self, id: &str, frozen: bool) {
        if let Some(vm) = self.existing(id) {
            vm.signal_all(if frozen { Signal::STOP } else { Signal::CONT });
        }
    }

    /// Open relays on this VM.
    pub fn open_relays(&self, id: &str) -> usize {
        self.existing(id).map_or(0, |vm| vm.open_relays())
    }
}

impl Guests {
    /// Every VM is destroyed (the simulator stops): nothing it ran is left
    /// running on the host.
    pub fn destroy_all(&self) {
        let ids: Vec<String> = self.vms().keys().cloned().collect();
        for id in ids {
            self.destroy(&id);
        }
    }
}

impl Drop for Guests {
    fn drop(&mut self) {
        self.destroy_all();
        if self.own_root
            && let Err(e) = std::fs::remove_dir_all(&self.root)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(root = %self.root.display(), error = %e, "sandboxd-sim: removing the scratch root failed");
        }
    }
}
