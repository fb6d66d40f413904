//! The claims store's single writer thread, which makes mutations durable
//! (loading at start-up is in `load.rs`).
//!
//! Every mutation of the in-memory table enqueues a [`Request`] while the
//! table lock is held, so the order of requests is the order of mutations.
//! The writer takes the first request, then — holding the table lock —
//! drains everything else queued and reads the current rows of the keys
//! named. A batch is persisted either by appending one journal frame and
//! `fdatasync`ing it, or, when a rewrite is due, by writing a new snapshot
//! (see [`Writer::rewrite`] for the crash-safe order). Only then are the batch's tentative
//! rows marked settled and the waiters answered: concurrent commits share
//! one write and one sync (group commit), and the cost of a batch does not
//! depend on the size of the table.
//!
//! A rewrite is due at start-up, on [`super::ClaimsStore::compact`], when
//! the journal outgrows its threshold, after any failed write (the journal's
//! contents are then unknown), and when the snapshot or the journal is no
//! longer the file this writer wrote (deleted directory, file replaced): the
//! directory is recreated (0700) and the table written from memory.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::format::{self, JournalOp};
use super::paths::StatePaths;
use super::state_lock::StateLock;
use super::types::{Claim, ClaimState, StoreOptions, StoreStats};
use crate::error::{Error, Result};

/// The outcome sent to a waiter: the problem text on failure.
pub(super) type Outcome = std::result::Result<(), String>;

/// A request to the writer.
pub(super) enum Request {
    /// Persist the current rows of `keys`; `commit` names the (key, id) of a
    /// tentative row to include and settle.
    Persist {
        keys: Vec<String>,
        commit: Option<(String, String)>,
        done: oneshot::Sender<Outcome>,
    },
    /// Rewrite the snapshot and remove the journal.
    Compact { done: oneshot::Sender<Outcome> },
}

/// One row of the table.
#[derive(Clone)]
pub(super) struct Entry {
    pub claim: Claim,
    pub state: ClaimState,
}

/// The in-memory table.
#[derive(Default)]
pub(super) struct Table {
    pub rows: BTreeMap<String, Entry>,
}

/// Lock the table. A poisoned lock (a panic elsewhere while it was held)
/// still guards a consistent table: every mutation is a single insert or
/// remove, so the data is used as is.
pub(super) fn lock(table: &Mutex<Table>) -> MutexGuard<'_, Table> {
    table
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Counters shared with the store handle.
#[derive(Default)]
pub(super) struct Counters {
    pub batches: AtomicU64,
    pub requests: AtomicU64,
    pub journal_appends: AtomicU64,
    pub rewrites: AtomicU64,
    pub failures: AtomicU64,
    pub journal_bytes: AtomicU64,
    /// Called with each batch's write time (fsync included) and success.
    pub on_write: std::sync::OnceLock<WriteObserver>,
}

/// See [`super::ClaimsStore::on_write`].
pub type WriteObserver = Box<dyn Fn(std::time::Duration, bool) + Send + Sync>;

impl Counters {
    pub fn snapshot(&self) -> StoreStats {
        StoreStats {
            batches: self.batches.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            journal_appends: self.journal_appends.load(Ordering::Relaxed),
            rewrites: self.rewrites.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            journal_bytes: self.journal_bytes.load(Ordering::Relaxed),
        }
    }
}

type FileId = (u64, u64);

fn file_id(m: &fs::Metadata) -> FileId {
    (m.dev(), m.ino())
}

fn same_file(path: &Path, id: FileId) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| file_id(&m) == id)
}

fn sync_dir(dir: &Path) -> Outcome {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("fsync directory {}: {e}", dir.display()))
}

/// The writer thread's state.
pub(super) struct Writer {
    paths: StatePaths,
    options: StoreOptions,
    table: Arc<Mutex<Table>>,
    counters: Arc<Counters>,
    /// The open journal and its identity; `None` until the first append
    /// after a rewrite.
    journal: Option<(File, FileId)>,
    /// Identity of the snapshot this writer last renamed into place.
    snapshot_id: Option<FileId>,
    journal_bytes: u64,
    snapshot_bytes: u64,
    /// [`format::snapshot_base`] of the snapshot this writer last wrote.
    snapshot_base: String,
    /// The next batch must rewrite the snapshot.
    need_rewrite: bool,
    /// The daemon's state lock, re-asserted before writing into a
    /// directory that was deleted and recreated (`None` in tests and
    /// tools that take no lock).
    lock: Option<StateLock>,
}

/// What one batch writes.
enum Plan {
    Append(Vec<JournalOp>),
    Rewrite(BTreeMap<String, Claim>),
}

impl Writer {
    pub fn new(
        paths: StatePaths,
        options: StoreOptions,
        table: Arc<Mutex<Table>>,
        counters: Arc<Counters>,
    ) -> Writer {
        Writer {
            paths,
            options,
            table,
            counters,
            journal: None,
            snapshot_id: None,
            journal_bytes: 0,
            snapshot_bytes: 0,
            snapshot_base: String::new(),
            need_rewrite: true,
            lock: None,
        }
    }

    /// Holds `lock` for as long as the writer runs.
    pub fn with_lock(mut self, lock: Option<StateLock>) -> Writer {
        self.lock = lock;
        self
    }

    /// The start-up write: the whole table as a snapshot, journal removed.
    pub fn startup(&mut self) -> Result<()> {
        let rows: BTreeMap<String, Claim> = lock(&self.table)
            .rows
            .iter()
            .map(|(k, e)| (k.clone(), e.claim.clone()))
            .collect();
        self.rewrite(&rows).map_err(|problem| Error::StateWrite {
            path: self.paths.snapshot.clone(),
            problem,
        })?;
        self.need_rewrite = false;
        Ok(())
    }

    /// Serve requests until every sender is gone.
    pub fn run(mut self, mut rx: mpsc::UnboundedReceiver<Request>) {
        while let Some(first) = rx.blocking_recv() {
            self.batch(first, &mut rx);
        }
        debug!(path = %self.paths.snapshot.display(), "claims writer stopped");
    }

    fn files_intact(&self) -> bool {
        let snapshot_ok = self
            .snapshot_id
            .is_some_and(|id| same_file(&self.paths.snapshot, id));
        let journal_ok = match &self.journal {
            Some((_, id)) => same_file(&self.paths.journal, *id),
            None => true,
        };
        snapshot_ok && journal_ok
    }

    fn journal_too_big(&self) -> bool {
        self.journal_bytes > self.options.compact_min_bytes
            && self.journal_bytes
                > self
                    .options
                    .compact_ratio
                    .saturating_mul(self.snapshot_bytes)
    }

    fn batch(&mut self, first: Request, rx: &mut mpsc::UnboundedReceiver<Request>) {
        let intact = self.files_intact() && self.lock.as_ref().is_none_or(StateLock::intact);
        let mut rewrite = self.need_rewrite || self.journal_too_big();
        if !rewrite && !intact {
            warn!(
                path = %self.paths.snapshot.display(),
                "claims state files were deleted or replaced while running; \
                 rewriting them from memory"
            );
            rewrite = true;
        }

        let mut requests = vec![first];
        let plan = {
            let table = lock(&self.table);
            // Requests are enqueued under this lock, so after draining, the
            // batch names every mutation the table reflects.
            while let Ok(r) = rx.try_recv() {
                requests.push(r);
            }
            let mut keys = BTreeSet::new();
            let mut commits = HashSet::new();
            for r in &requests {
                match r {
                    Request::Persist {
                        keys: ks, commit, ..
                    } => {
                        keys.extend(ks.iter().map(String::as_str));
                        if let Some((k, id)) = commit {
                            commits.insert((k.as_str(), id.as_str()));
                        }
                    }
                    Request::Compact { .. } => rewrite = true,
                }
            }
            let durable = |key: &str, e: &Entry| {
                e.state != ClaimState::Tentative || commits.contains(&(key, e.claim.id.as_str()))
            };
            if rewrite {
                Plan::Rewrite(
                    table
                        .rows
                        .iter()
                        .filter(|(k, e)| durable(k, e))
                        .map(|(k, e)| (k.clone(), e.claim.clone()))
                        .collect(),
                )
            } else {
                Plan::Append(
                    keys.into_iter()
                        .map(|key| match table.rows.get(key) {
                            Some(e) if durable(key, e) => JournalOp::Put {
                                key: key.to_string(),
                                claim: e.claim.clone(),
                            },
                            // Absent, or tentative and not committed here (a
                            // failed commit): no durable row.
                            _ => JournalOp::Del {
                                key: key.to_string(),
                            },
                        })
                        .collect(),
                )
            }
        };

        let started = std::time::Instant::now();
        let outcome = match &plan {
            Plan::Append(ops) => self.append(ops),
            Plan::Rewrite(rows) => self.rewrite(rows),
        };
        if let Some(observe) = self.counters.on_write.get() {
            observe(started.elapsed(), outcome.is_ok());
        }
        self.counters.batches.fetch_add(1, Ordering::Relaxed);
        self.counters
            .requests
            .fetch_add(requests.len() as u64, Ordering::Relaxed);
        match &outcome {
            Ok(()) => {
                self.need_rewrite = false;
                let mut table = lock(&self.table);
                for r in &requests {
                    if let Request::Persist {
                        commit: Some((key, id)),
                        ..
                    } = r
                        && let Some(e) = table.rows.get_mut(key)
                        && e.claim.id == *id
                        && e.state == ClaimState::Tentative
                    {
                        e.state = ClaimState::Settled;
                    }
                }
            }
            Err(problem) => {
                self.need_rewrite = true;
                self.journal = None;
                self.counters.failures.fetch_add(1, Ordering::Relaxed);
                warn!(
                    path = %self.paths.snapshot.display(),
                    error = %problem,
                    requests = requests.len(),
                    "claims state write failed; the next write rewrites the whole file"
                );
            }
        }
        debug!(
            requests = requests.len(),
            rewrite = matches!(plan, Plan::Rewrite(_)),
            ok = outcome.is_ok(),
            "claims batch persisted"
        );
        for r in requests {
            let done = match r {
                Request::Persist { done, .. } | Request::Compact { done } => done,
            };
            // A waiter that went away (its future dropped) needs no answer.
            let _ = done.send(outcome.clone());
        }
    }

    /// Create the directory (0700, with parents) if it is missing.
    fn ensure_dir(&self) -> Outcome {
        let dir = &self.paths.dir;
        if dir.is_dir() {
            return Ok(());
        }
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("create directory {}: {e}", dir.display()))?;
        warn!(dir = %dir.display(), "claims state directory was missing; created it (mode 0700)");
        match dir.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent),
            _ => Ok(()),
        }
    }

    fn append(&mut self, ops: &[JournalOp]) -> Outcome {
        let journal_path = &self.paths.journal;
        // A new journal names the snapshot it continues in its first frame.
        let frame = format::encode_frame(
            ops,
            self.journal
                .is_none()
                .then_some(self.snapshot_base.as_str()),
        );
        if self.journal.is_none() {
            let file = OpenOptions::new()
                .append(true)
                .create_new(true)
                .mode(0o600)
                .open(journal_path)
                .map_err(|e| format!("create {}: {e}", journal_path.display()))?;
            let meta = file
                .metadata()
                .map_err(|e| format!("stat {}: {e}", journal_path.display()))?;
            // The new directory entry must be durable before anything
            // written to the file counts.
            sync_dir(&self.paths.dir)?;
            self.journal = Some((file, file_id(&meta)));
            self.journal_bytes = 0;
        }
        let Some((file, _)) = self.journal.as_mut() else {
            return Err(format!("{} is not open", journal_path.display()));
        };
        file.write_all(&frame)
            .map_err(|e| format!("write {}: {e}", journal_path.display()))?;
        file.sync_data()
            .map_err(|e| format!("fdatasync {}: {e}", journal_path.display()))?;
        self.journal_bytes += frame.len() as u64;
        self.counters
            .journal_bytes
            .store(self.journal_bytes, Ordering::Relaxed);
        self.counters
            .journal_appends
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Write `rows` as the new snapshot and retire the journal. Order, each
    /// step durable before the next:
    /// 1. `<path>.tmp` written (0600) and `fsync`ed;
    /// 2. `<path>.journal` renamed to `<path>.journal.old`, directory `fsync`ed
    ///    (a crash here: old snapshot + the journal continuing it);
    /// 3. `<path>.tmp` renamed over `<path>`, directory `fsync`ed (a crash
    ///    here: the new snapshot, which holds everything the old journal did;
    ///    the old journal no longer matches it and is skipped);
    /// 4. `<path>.journal.old` unlinked, directory `fsync`ed.
    fn rewrite(&mut self, rows: &BTreeMap<String, Claim>) -> Outcome {
        self.journal = None;
        self.ensure_dir()?;
        if let Some(lock) = self.lock.as_mut() {
            lock.reassert(&self.paths.snapshot)?;
        }
        let bytes = format::encode_snapshot(rows);
        let StatePaths {
            snapshot,
            journal,
            journal_old,
            tmp,
            dir,
            ..
        } = &self.paths;
        match fs::remove_file(tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(format!("remove stale {}: {e}", tmp.display())),
        }
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)
            .map_err(|e| format!("create {}: {e}", tmp.display()))?;
        file.write_all(&bytes)
            .map_err(|e| format!("write {}: {e}", tmp.display()))?;
        file.sync_all()
            .map_err(|e| format!("fsync {}: {e}", tmp.display()))?;
        drop(file);
        match fs::rename(journal, journal_old) {
            Ok(()) => sync_dir(dir)?,
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => {
                return Err(format!(
                    "rename {} to {}: {e}",
                    journal.display(),
                    journal_old.display()
                ));
            }
        }
        fs::rename(tmp, snapshot)
            .map_err(|e| format!("rename {} to {}: {e}", tmp.display(), snapshot.display()))?;
        sync_dir(dir)?;
        match fs::remove_file(journal_old) {
            Ok(()) => sync_dir(dir)?,
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(format!("remove {}: {e}", journal_old.display())),
        }
        let meta = fs::symlink_metadata(snapshot)
            .map_err(|e| format!("stat {}: {e}", snapshot.display()))?;
        self.snapshot_id = Some(file_id(&meta));
        self.snapshot_bytes = bytes.len() as u64;
        self.snapshot_base = format::snapshot_base(&bytes);
        self.journal_bytes = 0;
        self.counters.journal_bytes.store(0, Ordering::Relaxed);
        self.counters.rewrites.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
