//! The files of one claims state, named once for the daemon, preflight and
//! the claims CLI.

use std::path::{Path, PathBuf};

use super::format::StateFile;

/// The files beside `--state-path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatePaths {
    /// `--state-path`: the snapshot (a Go `claims.json`).
    pub snapshot: PathBuf,
    /// `<state-path>.journal`: changes since the snapshot.
    pub journal: PathBuf,
    /// `<state-path>.journal.old`: the journal while a rewrite replaces
    /// the snapshot it continues.
    pub journal_old: PathBuf,
    /// `<state-path>.tmp`: a rewrite's new snapshot before its rename.
    pub tmp: PathBuf,
    /// `<state-path>.lock`: held by the running daemon (holds its PID).
    pub lock: PathBuf,
    /// The directory holding them (`.` for a bare file name).
    pub dir: PathBuf,
}

impl StatePaths {
    pub fn new(state_path: &Path) -> StatePaths {
        let with_suffix = |suffix: &str| {
            let mut s = state_path.as_os_str().to_owned();
            s.push(suffix);
            PathBuf::from(s)
        };
        let dir = match state_path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        StatePaths {
            snapshot: state_path.to_path_buf(),
            journal: with_suffix(".journal"),
            journal_old: with_suffix(".journal.old"),
            tmp: with_suffix(".tmp"),
            lock: with_suffix(".lock"),
            dir,
        }
    }

    /// The path of one of the files the loader reads.
    pub fn of(&self, file: StateFile) -> &Path {
        match file {
            StateFile::Snapshot => &self.snapshot,
            StateFile::JournalOld => &self.journal_old,
            StateFile::Journal => &self.journal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_sits_beside_the_state_path() {
        let p = StatePaths::new(Path::new("/var/lib/vk/claims.json"));
        assert_eq!(p.journal, Path::new("/var/lib/vk/claims.json.journal"));
        assert_eq!(
            p.journal_old,
            Path::new("/var/lib/vk/claims.json.journal.old")
        );
        assert_eq!(p.tmp, Path::new("/var/lib/vk/claims.json.tmp"));
        assert_eq!(p.lock, Path::new("/var/lib/vk/claims.json.lock"));
        assert_eq!(p.dir, Path::new("/var/lib/vk"));
        assert_eq!(
            p.of(StateFile::Snapshot),
            Path::new("/var/lib/vk/claims.json")
        );
        assert_eq!(p.of(StateFile::Journal), p.journal);
        assert_eq!(p.of(StateFile::JournalOld), p.journal_old);
        assert_eq!(
            StatePaths::new(Path::new("claims.json")).dir,
            Path::new(".")
        );
    }
}
