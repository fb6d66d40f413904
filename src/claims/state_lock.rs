//! One process per state path: the daemon holds an exclusive `flock` on
//! `<state-path>.lock` for as long as it runs, with its PID written in the
//! file. A second vk-sandbox on the same `--state-path` would append to the
//! same journal and release the same claims; it refuses to start instead,
//! naming the holder. The lock is released by the kernel when the process
//! ends, however it ends (a `kill -9` leaves no stale lock behind).
//!
//! Read-only tools (`vk-sandbox claims …`) never take it exclusively; they
//! may take it shared to learn whether a daemon runs.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The lock file beside the state file.
pub fn lock_path(state_path: &Path) -> PathBuf {
    let mut name = state_path.as_os_str().to_os_string();
    name.push(".lock");
    PathBuf::from(name)
}

/// The held lock; dropping it releases the lock.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
    path: PathBuf,
}

impl StateLock {
    /// Takes the lock for `state_path`, or says who holds it.
    pub fn acquire(state_path: &Path) -> Result<StateLock> {
        let path = lock_path(state_path);
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
        Ok(StateLock { _file: file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Whether a daemon holds the lock of `state_path` now, and its PID if it
/// wrote one. Takes the lock shared for an instant; never creates the
/// file.
pub fn holder(state_path: &Path) -> Result<Option<Option<u32>>> {
    let path = lock_path(state_path);
    let mut file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("open {}", path.display()), e)),
    };
    match file.try_lock_shared() {
        Ok(()) => {
            let _ = file.unlock();
            Ok(None)
        }
        Err(TryLockError::WouldBlock) => Ok(Some(read_pid(&mut file))),
        Err(TryLockError::Error(e)) => Err(Error::io(format!("lock {}", path.display()), e)),
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
        assert_eq!(holder(&state).expect("probe"), None);
        let first = StateLock::acquire(&state).expect("first");
        assert_eq!(first.path(), dir.path().join("claims.json.lock"));
        let pid = std::process::id();
        assert_eq!(holder(&state).expect("probe"), Some(Some(pid)));
        // flock locks belong to the open file: a second open in the same
        // process conflicts as a second process would.
        let err = StateLock::acquire(&state).expect_err("second").to_string();
        assert!(err.contains(&format!("process {pid}")), "{err}");
        assert!(err.contains("--state-path"), "{err}");
        drop(first);
        assert_eq!(holder(&state).expect("probe"), None);
        let again = StateLock::acquire(&state).expect("free again");
        drop(again);
    }
}
