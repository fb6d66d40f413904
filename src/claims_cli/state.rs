//! Reading a claims state that a running daemon may be writing, without
//! writing anything: a consistent view of the snapshot and its journals,
//! and whether a daemon holds the state lock.
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
//! half-written is an incomplete last line, ignored exactly as the store's
//! loader ignores one left by a crash ([`format::load_state`]). The files
//! stay open until the check, so an inode cannot be reused meanwhile. When
//! a compaction came in between, the read starts again.

use std::fs::{self, File};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::Timestamp;

use crate::claims::format::{self, LoadError, Loaded, StateBytes, StateFile};

/// How often a read is started again when a compaction changed the files.
const ATTEMPTS: usize = 50;

/// `<path><suffix>`.
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The state's files.
#[derive(Debug, Clone)]
pub struct StatePaths {
    pub snapshot: PathBuf,
    pub journal_old: PathBuf,
    pub journal: PathBuf,
    /// The daemon's lock file (holds its PID).
    pub lock: PathBuf,
}

impl StatePaths {
    pub fn new(state_path: &Path) -> StatePaths {
        StatePaths {
            snapshot: state_path.to_path_buf(),
            journal_old: with_suffix(state_path, ".journal.old"),
            journal: with_suffix(state_path, ".journal"),
            lock: with_suffix(state_path, ".lock"),
        }
    }

    pub fn of(&self, file: StateFile) -> &Path {
        match file {
            StateFile::Snapshot => &self.snapshot,
            StateFile::JournalOld => &self.journal_old,
            StateFile::Journal => &self.journal,
        }
    }
}

/// A consistent read of the state.
#[derive(Debug, Clone)]
pub struct StateView {
    pub loaded: Loaded,
    pub snapshot_found: bool,
    pub journal_found: bool,
    /// Reads started (1 unless a compaction came in between).
    pub attempts: usize,
}

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

fn open_read(path: &Path) -> Result<Opened, String> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            return Ok(Opened {
                bytes: None,
                id: None,
                _file: None,
            });
        }
        Err(e) => return Err(cannot_read(path, &e)),
    };
    let meta = file.metadata().map_err(|e| cannot_read(path, &e))?;
    if meta.is_dir() {
        return Err(format!(
            "{} is a directory; --state-path names the claims file (e.g. {}/claims.json)",
            path.display(),
            path.display()
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.read_to_end(&mut bytes)
        .map_err(|e| cannot_read(path, &e))?;
    Ok(Opened {
        bytes: Some(bytes),
        id: Some(identity(&meta)),
        _file: Some(file),
    })
}

fn cannot_read(path: &Path, e: &std::io::Error) -> String {
    let hint = if e.kind() == ErrorKind::PermissionDenied {
        " (the state is readable by the daemon's user only: run as that user, or with sudo)"
    } else {
        ""
    };
    format!("cannot read {}: {e}{hint}", path.display())
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

/// Read the state at `paths` as the daemon's start-up load would, consistent
/// even while a daemon appends and compacts (see the module docs). A
/// missing `claimedAt` stays unset (the Unix epoch), as the file has it.
pub fn read(paths: &StatePaths) -> Result<StateView, String> {
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
        let loaded = format::load_state(files, Timestamp::UNIX_EPOCH).map_err(|e| match e {
            LoadError::Malformed(file, problem) => format!(
                "{}: {problem}. The daemon refuses to start on this state too; it holds \
                 release credentials: repair or restore it, never discard it while the \
                 sandboxes it names are live",
                paths.of(file).display()
            ),
            LoadError::JournalDoesNotContinue => format!(
                "{} does not continue {}: the snapshot was replaced since the journal started \
                 (restored, edited, or written by the Go vk-sandbox after a rollback); the \
                 daemon refuses to start on it. The journal may hold release credentials the \
                 snapshot lacks: merge them by hand, or move the journal aside if the \
                 snapshot is authoritative",
                paths.journal.display(),
                paths.snapshot.display()
            ),
        })?;
        return Ok(StateView {
            loaded,
            snapshot_found: snapshot.bytes.is_some(),
            journal_found: journal.bytes.is_some(),
            attempts: attempt,
        });
    }
    Err(format!(
        "the files of {} were replaced during each of {ATTEMPTS} reads (a daemon compacting \
         them continuously?); try again",
        paths.snapshot.display()
    ))
}

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
    use crate::claims::Claim;
    use crate::claims::format::{JournalOp, encode_frame, encode_snapshot, snapshot_base};
    use std::collections::BTreeMap;

    fn claim(id: &str) -> Claim {
        Claim {
            id: id.into(),
            token: format!("tok-{id}"),
            address: String::new(),
            pod_uid: "u".into(),
            claimed_at: "2026-01-01T00:00:00Z".parse().expect("ts"),
            deadline: None,
        }
    }

    fn write_state(path: &Path, rows: &[(&str, &str)], journal: &[JournalOp]) -> Vec<u8> {
        let table: BTreeMap<String, Claim> = rows
            .iter()
            .map(|(k, id)| (k.to_string(), claim(id)))
            .collect();
        let snap = encode_snapshot(&table);
        fs::write(path, &snap).expect("snapshot");
        if !journal.is_empty() {
            let base = snapshot_base(&snap);
            fs::write(
                with_suffix(path, ".journal"),
                encode_frame(journal, Some(&base)),
            )
            .expect("journal");
        }
        snap
    }

    #[test]
    fn snapshot_and_journal_fold_and_nothing_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("claims.json");
        write_state(
            &path,
            &[("ns/a", "sb_a"), ("ns/b", "sb_b")],
            &[
                JournalOp::Del { key: "ns/a".into() },
                JournalOp::Put {
                    key: "ns/c".into(),
                    claim: claim("sb_c"),
                },
            ],
        );
        let before: Vec<_> = fs::read_dir(dir.path())
            .expect("ls")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        let view = read(&StatePaths::new(&path)).expect("read");
        assert_eq!(
            view.loaded.rows.keys().collect::<Vec<_>>(),
            vec!["ns/b", "ns/c"]
        );
        assert_eq!(view.loaded.frames, 1);
        assert_eq!(view.attempts, 1);
        let after: Vec<_> = fs::read_dir(dir.path())
            .expect("ls")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(before.len(), after.len(), "no file created");
        assert_eq!(
            probe_daemon(&with_suffix(&path, ".lock")),
            Daemon::NoLockFile
        );
        assert!(!with_suffix(&path, ".lock").exists());
    }

    #[test]
    fn missing_state_is_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let view = read(&StatePaths::new(&dir.path().join("none.json"))).expect("read");
        assert!(view.loaded.rows.is_empty());
        assert!(!view.snapshot_found);
    }

    #[test]
    fn a_directory_or_malformed_state_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = read(&StatePaths::new(dir.path())).expect_err("directory");
        assert!(err.contains("is a directory"), "{err}");
        let path = dir.path().join("claims.json");
        fs::write(&path, b"{not json").expect("write");
        let err = read(&StatePaths::new(&path)).expect_err("malformed");
        assert!(err.contains("claims.json: is not valid JSON"), "{err}");
        assert_eq!(fs::read(&path).expect("read"), b"{not json");
    }

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

    #[test]
    fn unchanged_tells_appends_from_replacements() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        fs::write(&path, b"abc").expect("write");
        let read = open_read(&path).expect("read");
        assert!(unchanged(&read, &path, false));
        fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"d"))
            .expect("append");
        assert!(unchanged(&read, &path, true), "an append is fine");
        assert!(!unchanged(&read, &path, false), "not for the snapshot");
        let tmp = dir.path().join("tmp");
        fs::write(&tmp, b"abc").expect("write");
        fs::rename(&tmp, &path).expect("rename");
        assert!(!unchanged(&read, &path, true), "a replaced file");
        fs::remove_file(&path).expect("rm");
        assert!(!unchanged(&read, &path, true), "a removed file");
        let absent = open_read(&dir.path().join("nothing")).expect("absent");
        assert!(unchanged(&absent, &dir.path().join("nothing"), true));
        fs::write(dir.path().join("nothing"), b"").expect("create");
        assert!(
            !unchanged(&absent, &dir.path().join("nothing"), true),
            "a file that appeared"
        );
    }

    /// Reads racing a daemon that commits, removes and compacts all the
    /// time: every read succeeds and sees a state the daemon had. Step i
    /// commits k(i) and then removes k(i-5), so every state the daemon has
    /// is a window of consecutive keys, at most 6 long, that only moves up.
    #[test]
    fn reads_racing_commits_and_compactions_are_consistent() {
        use crate::claims::{ClaimsStore, StoreOptions};
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("claims.json");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let total = 400usize;
        let key = |i: usize| format!("ns/k{i:04}");
        let writer_path = path.clone();
        let (opened_tx, opened_rx) = std::sync::mpsc::channel();
        let writer = std::thread::spawn(move || {
            runtime.block_on(async {
                // The snapshot stays small: a compaction every few steps.
                let options = StoreOptions {
                    compact_min_bytes: 0,
                    compact_ratio: 2,
                };
                let store = ClaimsStore::open_with(&writer_path, options)
                    .await
                    .expect("open");
                let _ = opened_tx.send(());
                for i in 0..total {
                    let id = format!("sb_{i}");
                    store.commit(&key(i), claim(&id)).await.expect("commit");
                    if i >= 5 {
                        let old = format!("sb_{}", i - 5);
                        assert!(store.remove(&key(i - 5), &old).await.expect("remove"));
                    }
                }
                store.stats().rewrites
            })
        });
        opened_rx.recv().expect("store opened");
        let paths = StatePaths::new(&path);
        let (mut low, mut high) = (0, 0);
        let mut reads = 0;
        let mut retried = 0;
        while !writer.is_finished() || reads == 0 {
            let view = read(&paths).expect("every read succeeds");
            let index: Vec<usize> = view
                .loaded
                .rows
                .keys()
                .map(|k| k["ns/k".len()..].parse().expect("index"))
                .collect();
            if let (Some(&first), Some(&last)) = (index.first(), index.last()) {
                assert_eq!(
                    index,
                    (first..=last).collect::<Vec<_>>(),
                    "not a state the daemon had"
                );
                assert!(index.len() <= 6, "not a state the daemon had: {index:?}");
                assert!(
                    first >= low && last >= high,
                    "went back from {low}..={high} to {index:?}"
                );
                (low, high) = (first, last);
            }
            reads += 1;
            retried += view.attempts - 1;
        }
        let rewrites = writer.join().expect("writer");
        assert!(rewrites > 50, "only {rewrites} compactions");
        let view = read(&paths).expect("final read");
        assert_eq!(
            view.loaded.rows.keys().cloned().collect::<Vec<_>>(),
            (total - 5..total).map(key).collect::<Vec<_>>()
        );
        eprintln!("{reads} reads, {retried} restarted by a compaction, {rewrites} compactions");
    }
}
