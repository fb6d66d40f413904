//! One process per state path: the daemon holds an exclusive `flock` on
//! `<state-path>.lock` for as long as it runs, with its PID written in the
//! file. A second vk-sandbox on the same `--state-path` would append to the
//! same journal and release the same claims; it refuses to start instead,
//! naming the holder. The lock is released by the kernel when the process
//! ends, however it ends (a `kill -9` leaves no stale lock behind).
//!
//! Read-only tools (`vk-sandbox claims …`) never take it exclusively; they
//! may take it shared to learn whether a daemon runs.
//!
//! The lock is a lock on one file: if the state directory is deleted while
//! the daemon runs, the claims writer recreates the directory and its files,
//! and a second process could then lock a new `.lock` of its own. So the
//! writer holds the lock and re-asserts it ([`StateLock::reassert`]) before
//! it writes into a recreated directory: it locks the new file, or, when
//! another process got there first, refuses to write.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::paths::StatePaths;
use crate::error::{Error, Result};

/// The held lock; dropping it releases the lock.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
    path: PathBuf,
    /// (device, inode) of the locked file.
    id: (u64, u64),
}

impl StateLock {
    /// Takes the lock for `state_path`, or says who holds it.
    pub fn acquire(state_path: &Path) -> Result<StateLock> {
        let path = StatePaths::new(state_path).lock;
        Self::lock_file(state_path, path)
    }

    /// Locks the file at `path` (created if missing) and writes our PID in it.
    fn lock_file(state_path: &Path, path: PathBuf) -> Result<StateLock> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io(format!("open the state lock {}", path.display()), e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let holder = read_pid(&mut file)
                    .map(|pid| format!("process {pid}"))
                    .unwrap_or_else(|| "another process".into());
                return Err(Error::Config(format!(
                    "the claims state {} is in use by {holder} (lock {}): only one vk-sandbox \
                     may run per --state-path (env VK_STATE_PATH); stop the other one, or give \
                     this one its own state path",
                    state_path.display(),
                    path.display()
                )));
            }
            Err(TryLockError::Error(e)) => {
                return Err(Error::io(format!("lock {}", path.display()), e));
            }
        }
        // Ours now: record who holds it, for the next one's message.
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)).map(drop))
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .and_then(|()| file.flush())
            .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
        Ok(StateLock {
            _file: file,
            path,
            id: (meta.dev(), meta.ino()),
        })
    }

    /// Whether the lock path still names the file this process locked.
    pub fn intact(&self) -> bool {
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id)
    }

    /// Makes sure this process holds the lock at its path again after the
    /// file was removed or replaced (the state directory deleted): locks
    /// the file now there (created if missing). `Err` when another process
    /// holds it: two processes on one state path, so nothing may be
    /// written.
    pub fn reassert(&mut self, state_path: &Path) -> std::result::Result<(), String> {
        if self.intact() {
            return Ok(());
        }
        let again = Self::lock_file(state_path, self.path.clone()).map_err(|e| {
            format!(
                "the state lock {} was removed while running and {e}; refusing to write the \
                 claims state",
                self.path.display()
            )
        })?;
        tracing::warn!(
            lock = %self.path.display(),
            "the state lock file was removed while running; locked it again"
        );
        // The old file's lock goes with its descriptor; nobody can reach it.
        *self = again;
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Whether a daemon holds a state lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Daemon {
    /// The lock is held; the PID written in the lock file, if readable.
    Running { pid: Option<u32> },
    /// The lock file exists and nobody holds it.
    NotRunning,
    /// No lock file: no daemon has run on this state path yet, or one built
    /// before the state lock existed (which cannot be detected).
    NoLockFile,
    /// The lock could not be probed.
    Unknown(String),
}

/// Probes the lock file `lock` without ever holding it: opened read-only
/// (never created), a shared lock tried and released at once (one held for
/// longer would keep a daemon from starting).
pub fn probe(lock: &Path) -> Daemon {
    let mut file = match File::open(lock) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Daemon::NoLockFile,
        Err(e) => return Daemon::Unknown(format!("cannot open {}: {e}", lock.display())),
    };
    match file.try_lock_shared() {
        Ok(()) => {
            let _ = file.unlock();
            Daemon::NotRunning
        }
        Err(TryLockError::WouldBlock) => Daemon::Running {
            pid: read_pid(&mut file),
        },
        Err(TryLockError::Error(e)) => {
            Daemon::Unknown(format!("cannot lock {}: {e}", lock.display()))
        }
    }
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("claims.json");
        let lock = StatePaths::new(&state).lock;
        assert_eq!(probe(&lock), Daemon::NoLockFile);
        let first = StateLock::acquire(&state).expect("first");
        assert_eq!(first.path(), dir.path().join("claims.json.lock"));
        let pid = std::process::id();
        assert_eq!(probe(&lock), Daemon::Running { pid: Some(pid) });
        // flock locks belong to the open file: a second open in the same
        // process conflicts as a second process would.
        let err = StateLock::acquire(&state).expect_err("second").to_string();
        assert!(err.contains(&format!("process {pid}")), "{err}");
        assert!(err.contains("--state-path"), "{err}");
        drop(first);
        assert_eq!(probe(&lock), Daemon::NotRunning);
        let again = StateLock::acquire(&state).expect("free again");
        drop(again);
    }
}
