//! Loading the claims state at start-up: the snapshot and the journals
//! that continue it, read without touching anything on disk.

use std::collections::BTreeMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use tracing::{info, warn};

use super::Claim;
use super::format::{self, LoadError, StateFile};
use crate::error::{Error, Result};

/// The files of one store.
#[derive(Debug, Clone)]
pub(super) struct Paths {
    pub snapshot: PathBuf,
    pub journal: PathBuf,
    /// The journal while a rewrite replaces the snapshot it continues.
    pub journal_old: PathBuf,
    pub tmp: PathBuf,
    pub dir: PathBuf,
}

impl Paths {
    pub fn new(snapshot: &Path) -> Paths {
        let with_suffix = |suffix: &str| {
            let mut s = snapshot.as_os_str().to_owned();
            s.push(suffix);
            PathBuf::from(s)
        };
        let dir = match snapshot.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Paths {
            snapshot: snapshot.to_path_buf(),
            journal: with_suffix(".journal"),
            journal_old: with_suffix(".journal.old"),
            tmp: with_suffix(".tmp"),
            dir,
        }
    }
}

const FIX: &str = "it holds release credentials and was left as it is: repair or restore it, \
                   then restart (move it aside only once every sandbox it names is released)";

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        // A parent that is not a directory: the file cannot exist either
        // (the start-up write then reports why the state is not writable).
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(None),
        Err(e) => Err(Error::State {
            path: path.to_path_buf(),
            problem: format!(
                "cannot be read: {e}; fix its permissions or --state-path and restart \
                 (the file holds release credentials and was left as it is)"
            ),
        }),
    }
}

/// Read the snapshot and replay the journal(s) that continue it
/// ([`format::load_state`]). Touches nothing on disk.
pub(super) fn load(paths: &Paths, now: Timestamp) -> Result<BTreeMap<String, Claim>> {
    let snapshot = read_optional(&paths.snapshot)?;
    let journal = read_optional(&paths.journal)?;
    let journal_old = read_optional(&paths.journal_old)?;
    let files = format::StateBytes {
        snapshot: snapshot.as_deref(),
        journal_old: journal_old.as_deref(),
        journal: journal.as_deref(),
    };
    let path_of = |file: StateFile| match file {
        StateFile::Snapshot => paths.snapshot.clone(),
        StateFile::JournalOld => paths.journal_old.clone(),
        StateFile::Journal => paths.journal.clone(),
    };
    let loaded = format::load_state(files, now).map_err(|e| match e {
        LoadError::Malformed(file, problem) => Error::State {
            path: path_of(file),
            problem: format!("{problem}; {FIX}"),
        },
        LoadError::JournalDoesNotContinue => Error::State {
            path: paths.journal.clone(),
            problem: format!(
                "does not continue {}: that file was replaced since the journal was \
                 started (restored from a backup, edited, or written by another program \
                 such as the Go vk-sandbox after a rollback). The journal may hold release \
                 credentials the snapshot lacks: merge them by hand, or move the journal \
                 aside if the snapshot is authoritative, then restart",
                paths.snapshot.display()
            ),
        },
    })?;
    for (file, bytes) in &loaded.torn_tails {
        warn!(
            journal = %path_of(*file).display(),
            bytes,
            "claims journal ends in an incomplete record (a write cut short by a crash, \
             never acknowledged); ignoring it"
        );
    }
    if loaded.skipped_journal_old {
        info!(
            journal = %paths.journal_old.display(),
            "skipping a journal already folded into the snapshot (a rewrite was interrupted)"
        );
    }
    info!(
        path = %paths.snapshot.display(),
        snapshot_found = snapshot.is_some(),
        snapshot_rows = loaded.snapshot_rows,
        journal_frames = loaded.frames,
        rows = loaded.rows.len(),
        "claims state loaded; every row is quarantined until sandboxd vouches for it"
    );
    Ok(loaded.rows)
}
