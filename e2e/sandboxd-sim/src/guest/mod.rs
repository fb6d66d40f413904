//! The guests: what runs "inside" each simulated microVM. The simulator
//! stands in for the in-guest agent (silkd) by REALLY running commands as
//! local processes, each VM in a scratch directory of its own under the
//! simulator's state or temp directory (created on first use, removed when
//! the sandbox is released or reaped). A hibernated VM's processes are
//! stopped (SIGSTOP) and continue on wake, as a memory snapshot keeps them.
//!
//! - [`frames`]: the agent's newline-delimited JSON frames;
//! - [`agent`]: one agent connection (exec, stdin, pty, resize, kill, ps);
//! - [`process`]: spawning a command the way the agent does;
//! - [`pty`]: pseudo-terminals for the shell.

pub mod agent;
pub mod frames;
pub mod process;
pub mod pty;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use rustix::process::{Pid, Signal};
use serde_json::{Value, json};
use tracing::{debug, warn};

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

fn signal_group(pid: u32, sig: Signal) -> std::io::Result<()> {
    let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return Err(std::io::Error::other(format!("bad pid {pid}")));
    };
    // Each command runs in a process group of its own (a session for a
    // shell), so the signal reaches what it started too.
    match rustix::process::kill_process_group(p, sig) {
        Ok(()) => Ok(()),
        Err(_) => rustix::process::kill_process(p, sig).map_err(std::io::Error::from),
    }
}

impl Vm {
    fn procs(&self) -> MutexGuard<'_, BTreeMap<u32, Proc>> {
        self.procs.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn register(&self, pid: u32, argv: Vec<String>, pty: Option<Arc<PtyMaster>>) {
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

    /// `kill{pid, signal}`: SIGKILL when no signal is given.
    pub fn kill(&self, pid: u32, signal: Option<i32>) -> Result<(), PidError> {
        let sig = match signal {
            None => Signal::KILL,
            Some(n) => Signal::from_named_raw(n).ok_or(PidError::BadSignal(n))?,
        };
        if !self.procs().contains_key(&pid) {
            return Err(PidError::NotFound(pid));
        }
        signal_group(pid, sig).map_err(|e| PidError::Os(e.to_string()))
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

    fn signal_all(&self, sig: Signal) {
        let pids: Vec<u32> = self.procs().keys().copied().collect();
        for pid in pids {
            if let Err(e) = signal_group(pid, sig) {
                debug!(vm = %self.id, pid, error = %e, "sandboxd-sim: signal failed");
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
    /// system's temp directory (removed when the simulator goes).
    pub fn new(root: Option<PathBuf>) -> Guests {
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

    /// The VM's guest side, its scratch directory created on first use.
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
        let vm = vms.entry(id.to_string()).or_insert_with(|| {
            Arc::new(Vm {
                id: id.to_string(),
                scratch,
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

impl Drop for Guests {
    fn drop(&mut self) {
        let ids: Vec<String> = self.vms().keys().cloned().collect();
        for id in ids {
            self.destroy(&id);
        }
        if self.own_root
            && let Err(e) = std::fs::remove_dir_all(&self.root)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(root = %self.root.display(), error = %e, "sandboxd-sim: removing the scratch root failed");
        }
    }
}
