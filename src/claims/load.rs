//! Loading the claims state at start-up: the one reader
//! ([`super::read`]), its problems as the daemon's errors, and what it
//! found in the log. Touches nothing on disk.

use std::collections::BTreeMap;

use jiff::Timestamp;
use tracing::{info, warn};

use super::paths::StatePaths;
use super::read;
use super::types::Claim;
use crate::error::{Error, Result};

/// Read the snapshot and replay the journal(s) that continue it.
pub(super) fn load(paths: &StatePaths, now: Timestamp) -> Result<BTreeMap<String, Claim>> {
    let view = read::read(paths, now).map_err(|e| Error::State {
        path: e.path().to_path_buf(),
        problem: e.problem(),
    })?;
    let loaded = view.loaded;
    for (file, bytes) in &loaded.torn_tails {
        warn!(
            journal = %paths.of(*file).display(),
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
        snapshot_found = view.snapshot_found,
        snapshot_rows = loaded.snapshot_rows,
        journal_frames = loaded.frames,
        rows = loaded.rows.len(),
        "claims state loaded; every row is quarantined until sandboxd vouches for it"
    );
    Ok(loaded.rows)
}
