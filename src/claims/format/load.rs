//! Loading the state files: the snapshot, then the journals that continue it.

use jiff::Timestamp;
use std::collections::BTreeMap;

use super::journal::{Journal, JournalOp, decode_journal, replay, snapshot_base};
use super::snapshot::decode_snapshot;
use crate::claims::types::Claim;

/// One of the state files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFile {
    /// `--state-path`.
    Snapshot,
    /// `<state-path>.journal.old` (only while a rewrite replaces the snapshot).
    JournalOld,
    /// `<state-path>.journal`.
    Journal,
}

/// The bytes of the state files as read; `None`: the file does not exist.
#[derive(Debug, Default, Clone, Copy)]
pub struct StateBytes<'a> {
    pub snapshot: Option<&'a [u8]>,
    pub journal_old: Option<&'a [u8]>,
    pub journal: Option<&'a [u8]>,
}

/// Why state files do not load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// The file does not decode (the problem).
    Malformed(StateFile, String),
    /// `<state-path>.journal` continues another snapshot than the one on
    /// disk (the snapshot was replaced since the journal started).
    JournalDoesNotContinue,
}

/// The table the state files hold, as the store's start-up load builds it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub rows: BTreeMap<String, Claim>,
    /// Rows in the snapshot alone.
    pub snapshot_rows: usize,
    /// Complete journal frames replayed.
    pub frames: usize,
    /// Incomplete last lines ignored: the journal and its bytes.
    pub torn_tails: Vec<(StateFile, usize)>,
    /// `<state-path>.journal.old` was present but already folded into the
    /// snapshot (a rewrite was interrupted after its rename), so skipped.
    pub skipped_journal_old: bool,
    /// Keys some replayed journal record named (the rest of the rows are
    /// as the snapshot has them).
    pub journal_keys: std::collections::BTreeSet<String>,
}

/// Load state files: the snapshot, then `<path>.journal.old` if it
/// continues the snapshot, then `<path>.journal`, which must continue it.
///
/// A rewrite moves the journal to `.journal.old` before renaming the new
/// snapshot into place. If a crash came before that rename, the old journal
/// still continues this snapshot and is replayed; after it, the snapshot
/// already holds everything the old journal did (the writer's memory is a
/// superset of what it journaled) and it is skipped. Pure: the caller reads
/// the files (and decides what a missing one means).
pub fn load_state(files: StateBytes<'_>, now: Timestamp) -> Result<Loaded, LoadError> {
    let mut rows = match files.snapshot {
        Some(bytes) => decode_snapshot(bytes, now)
            .map_err(|problem| LoadError::Malformed(StateFile::Snapshot, problem))?,
        None => BTreeMap::new(),
    };
    let base = files.snapshot.map(snapshot_base);
    let mut loaded = Loaded {
        snapshot_rows: rows.len(),
        ..Loaded::default()
    };
    let mut apply = |loaded: &mut Loaded, file: StateFile, j: Journal| {
        if j.torn_tail_bytes > 0 {
            loaded.torn_tails.push((file, j.torn_tail_bytes));
        }
        loaded.frames += j.frames;
        loaded.journal_keys.extend(j.ops.iter().map(|op| match op {
            JournalOp::Put { key, .. } | JournalOp::Del { key } => key.clone(),
        }));
        replay(&mut rows, j.ops);
    };
    if let Some(bytes) = files.journal_old {
        let j = decode_journal(bytes, now)
            .map_err(|problem| LoadError::Malformed(StateFile::JournalOld, problem))?;
        if j.base.is_some() && j.base == base {
            apply(&mut loaded, StateFile::JournalOld, j);
        } else {
            loaded.skipped_journal_old = true;
        }
    }
    if let Some(bytes) = files.journal {
        let j = decode_journal(bytes, now)
            .map_err(|problem| LoadError::Malformed(StateFile::Journal, problem))?;
        if j.base.is_some() && j.base != base {
            return Err(LoadError::JournalDoesNotContinue);
        }
        apply(&mut loaded, StateFile::Journal, j);
    }
    loaded.rows = rows;
    Ok(loaded)
}
