//! The one reader of a claims state, shared by the daemon's start-up load,
//! preflight and the claims CLI: the snapshot and the journals that
//! continue it, read without writing anything, consistent even while a
//! running daemon appends and compacts, with one wording per problem.
//!
//! # Consistency
//! The daemon's writer only ever appends to `<state-path>.journal` or
//! replaces files by renaming new ones into place (a compaction renames the
//! journal to `.journal.old`, the new snapshot over the state path, then
//! unlinks `.journal.old` and later starts a new journal). So a read is
//! consistent when every file it read is still the file at its path when
//! the read ends: the same inode (or still absent), and for the snapshot
//! and `.journal.old` the same size. A journal that grew meanwhile was read
//! up to some frame, which is the state as of that frame; a frame caught
//! half-written is an incomplete last line, ignored exactly as after a
//! crash ([`format::load_state`]). The files stay open until the check, so
//! an inode cannot be reused meanwhile. When a compaction came in between,
//! the read starts again. (The daemon itself holds the state lock while it
//! loads: its read is consistent at the first attempt.)

use std::fmt;
use std::fs::{self, File};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::Timestamp;

use super::format::{self, LoadError, Loaded, StateBytes};
use super::paths::StatePaths;

/// How often a read is started again when a compaction changed the files.
const ATTEMPTS: usize = 50;

/// Advice shared by every problem with the state's contents.
const KEPT: &str = "it holds release credentials and was left as it is";

/// A consistent read of the state.
#[derive(Debug, Clone)]
pub struct StateView {
    pub loaded: Loaded,
    pub snapshot_found: bool,
    pub journal_found: bool,
    /// Reads started (1 unless a compaction came in between).
    pub attempts: usize,
}

/// Why a claims state cannot be read. Its text names the file, the problem
/// and what to do, in the same words wherever it is reported.
#[derive(Debug)]
pub enum ReadError {
    /// A file exists and cannot be read.
    Unreadable {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A directory where a file of the state belongs.
    Directory { path: PathBuf },
    /// A file does not decode (the decoder's problem).
    Malformed { path: PathBuf, problem: String },
    /// `<state-path>.journal` continues another snapshot than the one on
    /// disk.
    JournalDoesNotContinue { journal: PathBuf, snapshot: PathBuf },
    /// A compaction replaced the files during every attempt.
    KeptChanging { snapshot: PathBuf },
}

impl ReadError {
    /// The file the problem is with.
    pub fn path(&self) -> &Path {
        match self {
            ReadError::Unreadable { path, .. }
            | ReadError::Directory { path }
            | ReadError::Malformed { path, .. } => path,
            ReadError::JournalDoesNotContinue { journal, .. } => journal,
            ReadError::KeptChanging { snapshot } => snapshot,
        }
    }

    /// What is wrong with [`ReadError::path`] and what to do about it.
    pub fn problem(&self) -> String {
        match self {
            ReadError::Unreadable { error, .. } => {
                let fix = if error.kind() == ErrorKind::PermissionDenied {
                    "it is readable by the daemon's user only: run as that user (or with sudo), \
                     or fix its permissions or --state-path"
                } else {
                    "fix it or --state-path (env VK_STATE_PATH)"
                };
                format!("cannot be read: {error}; {fix} ({KEPT})")
            }
            ReadError::Directory { path } => format!(
                "cannot be read: it is a directory; --state-path (env VK_STATE_PATH) names the \
                 claims file, e.g. {}/claims.json",
                path.display()
            ),
            ReadError::Malformed { problem, .. } => format!(
                "{problem}; {KEPT}: repair or restore it, and never discard it while the \
                 sandboxes it names are live (vk-sandbox refuses to start on it until then)"
            ),
            ReadError::JournalDoesNotContinue { snapshot, .. } => format!(
                "does not continue {}: the snapshot was replaced since the journal was started \
                 (restored from a backup, edited, or written by another program such as the Go \
                 vk-sandbox after a rollback). The journal may hold release credentials the \
                 snapshot lacks: merge them by hand, or move the journal aside if the snapshot \
                 is authoritative (vk-sandbox refuses to start on it until then)",
                snapshot.display()
            ),
            ReadError::KeptChanging { .. } => format!(
                "its files were replaced during each of {ATTEMPTS} reads (a daemon compacting \
                 them continuously?); try again"
            ),
        }
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path().display(), self.problem())
    }
}

impl std::error::Error for ReadError {}

/// Identity of what was at a path: `None` when absent.
type Identity = Option<(u64, u64, u64)>;

fn identity(m: &fs::Metadata) -> (u64, u64, u64) {
    (m.dev(), m.ino(), m.len())
}

/// One file, opened, read and kept open.
struct Opened {
    bytes: Option<Vec<u8>>,
    id: Identity,
    _file: Option<File>,
}

fn open_read(path: &Path) -> Result<Opened, ReadError> {
    let unreadable = |error| ReadError::Unreadable {
        path: path.to_path_buf(),
        error,
    };
    let mut file = match File::open(path) {
        Ok(f) => f,
        // A parent that is not a directory: the file cannot exist either
        // (the daemon's start-up write then says why the state is not
        // writable).
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            return Ok(Opened {
                bytes: None,
                id: None,
                _file: None,
            });
        }
        Err(e) => return Err(unreadable(e)),
    };
    let meta = file.metadata().map_err(unreadable)?;
    if meta.is_dir() {
        return Err(ReadError::Directory {
            path: path.to_path_buf(),
        });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.read_to_end(&mut bytes).map_err(unreadable)?;
    Ok(Opened {
        bytes: Some(bytes),
        id: Some(identity(&meta)),
        _file: Some(file),
    })
}

fn current(path: &Path) -> Identity {
    fs::metadata(path).ok().map(|m| identity(&m))
}

/// Whether what was read is still what the path holds. The journal may
/// only have grown (appends): its size is not compared.
fn unchanged(read: &Opened, path: &Path, appended: bool) -> bool {
    match (read.id, current(path)) {
        (None, None) => true,
        (Some(a), Some(b)) if appended => (a.0, a.1) == (b.0, b.1),
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// Read the state at `paths` as the daemon's start-up load does (see the
/// module docs). A row without `claimedAt` gets `now` (the daemon passes
/// the time; the claims CLI the Unix epoch, to show it unset as the file
/// has it).
pub fn read(paths: &StatePaths, now: Timestamp) -> Result<StateView, ReadError> {
    for attempt in 1..=ATTEMPTS {
        let snapshot = open_read(&paths.snapshot)?;
        let journal_old = open_read(&paths.journal_old)?;
        let journal = open_read(&paths.journal)?;
        let stable = unchanged(&snapshot, &paths.snapshot, false)
            && unchanged(&journal_old, &paths.journal_old, false)
            && unchanged(&journal, &paths.journal, true);
        if !stable {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let files = StateBytes {
            snapshot: snapshot.bytes.as_deref(),
            journal_old: journal_old.bytes.as_deref(),
            journal: journal.bytes.as_deref(),
        };
        let loaded = format::load_state(files, now).map_err(|e| match e {
            LoadError::Malformed(file, problem) => ReadError::Malformed {
                path: paths.of(file).to_path_buf(),
                problem,
            },
            LoadError::JournalDoesNotContinue => ReadError::JournalDoesNotContinue {
                journal: paths.journal.clone(),
                snapshot: paths.snapshot.clone(),
            },
        })?;
        return Ok(StateView {
            loaded,
            snapshot_found: snapshot.bytes.is_some(),
            journal_found: journal.bytes.is_some(),
            attempts: attempt,
        });
    }
    Err(ReadError::KeptChanging {
        snapshot: paths.snapshot.clone(),
    })
}

#[cfg(test)]
mod tests;
