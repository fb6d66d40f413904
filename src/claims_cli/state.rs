//! Whether a daemon runs on the state the claims CLI reads, said for
//! people. The state itself is read by [`crate::claims::read`].

use std::path::Path;

pub use crate::claims::state_lock::Daemon;

impl Daemon {
    /// One line for people.
    pub fn describe(&self, lock: &Path) -> String {
        match self {
            Daemon::Running { pid: Some(pid) } => {
                format!("daemon running (pid {pid}); reading a live state")
            }
            Daemon::Running { pid: None } => {
                "daemon running (it holds the state lock); reading a live state".to_string()
            }
            Daemon::NotRunning => "no daemon running on this state".to_string(),
            Daemon::NoLockFile => format!(
                "no state lock at {}: no daemon of this build runs on it (the Go vk-sandbox \
                 and builds before the lock take none, so one of those might)",
                lock.display()
            ),
            Daemon::Unknown(why) => format!("whether a daemon runs is unknown: {why}"),
        }
    }
}

pub use crate::claims::state_lock::probe as probe_daemon;

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::{self, File};

    #[test]
    fn lock_held_exclusively_reports_the_pid_shared_probe_releases() {
        let dir = tempfile::tempdir().expect("tempdir");
        let lock = dir.path().join("claims.json.lock");
        fs::write(&lock, b"4242\n").expect("write");
        assert_eq!(probe_daemon(&lock), Daemon::NotRunning);
        let holder = File::open(&lock).expect("open");
        holder.try_lock().expect("exclusive");
        assert_eq!(probe_daemon(&lock), Daemon::Running { pid: Some(4242) });
        holder.unlock().expect("unlock");
        // The probe left no lock behind: an exclusive lock is free again.
        assert_eq!(probe_daemon(&lock), Daemon::NotRunning);
        let again = File::open(&lock).expect("open");
        again
            .try_lock()
            .expect("the probe released its shared lock");
    }
}
