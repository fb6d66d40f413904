//! The durable claims store: which sandboxd claim (id + release token) each
//! Pod key holds (docs/architecture.md#decision-claims-store).
//!
//! # Files
//! - `--state-path`: a snapshot in the Go original's `claims.json` format
//!   ([`format`](mod@format)), so the Go file loads as is and, after [`ClaimsStore::compact`]
//!   (clean shutdown), the file is a valid Go `claims.json` again;
//! - `<state-path>.journal`: an append-only journal of changes since the
//!   snapshot, one checksummed line per group commit, naming the snapshot it
//!   continues (a journal is never replayed over another snapshot; one that
//!   does not match refuses start-up);
//! - `<state-path>.tmp`, `<state-path>.journal.old`: transient, while a
//!   rewrite replaces the snapshot (see `writer::Writer::rewrite`).
//!
//! Files are created 0600, the directory 0700. Persisting one change costs
//! one journal append and one `fdatasync`, shared by every change queued at
//! the time (group commit), whatever the size of the table; the snapshot is
//! rewritten at start-up, at clean shutdown, and when the journal grows past
//! [`StoreOptions`]' threshold (amortised: at least `compact_ratio` times the
//! snapshot's bytes of journal between two rewrites). See `writer.rs` for the
//! write path.
//!
//! # States
//! Rows loaded at start-up are [`ClaimState::Quarantined`] until a sandboxd
//! listing vouches for them; a fresh claim is [`ClaimState::Tentative`]
//! until it is durable, then [`ClaimState::Settled`]. Tentative rows are never
//! written to the snapshot (a crash forgets them); every state is visible to
//! release, the orphan scan and address lookups.
//!
//! # Times
//! Times are kept at whole seconds, the precision of the file, so what the
//! store returns is what a restart gives back.

pub mod dir;
pub mod format;
pub mod gauge;
pub mod lifecycle;
mod load;
pub mod paths;
pub mod read;
pub mod state_lock;
mod types;
mod verify;
mod writer;

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info};

use crate::error::{Error, Result};
pub use lifecycle::{Lifecycle, OwnerRef, VmState};
pub use paths::StatePaths;
use state_lock::StateLock;
pub use types::{Claim, ClaimCounts, ClaimState, StoreOptions, StoreStats, VerifyReport};
use writer::{Counters, Entry, Request, Table, Writer, lock};

struct Inner {
    table: Arc<Mutex<Table>>,
    tx: mpsc::UnboundedSender<Request>,
    counters: Arc<Counters>,
    path: PathBuf,
}

/// The claims table and its files. Cheap to clone (one `Arc`); all methods
/// take `&self`. The table lock is a std `Mutex` never held across `.await`.
/// Writes go to one writer thread, which stops when the last clone is
/// dropped (after finishing what was queued).
#[derive(Clone)]
pub struct ClaimsStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for ClaimsStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimsStore")
            .field("path", &self.inner.path)
            .field("counts", &self.counts())
            .finish()
    }
}

fn now_second() -> Timestamp {
    format::to_second(Timestamp::now())
}

impl ClaimsStore {
    /// Load the state at `path` (`--state-path`) with default options.
    ///
    /// Reads the Go `claims.json` as is (compact or indented, missing optional
    /// fields, unknown fields, `"claims": null`, no `claims` key ⇒ empty; a
    /// missing file ⇒ empty) and replays `<path>.journal` if present. Malformed
    /// or unreadable state is refused with [`Error::State`] naming the file
    /// and the problem, and nothing on disk is touched. Rows without
    /// `claimedAt` get now. Every loaded row starts
    /// [`ClaimState::Quarantined`]. Then the start-up write (the snapshot
    /// rewritten, the journal removed; directory created 0700, files 0600);
    /// its failure is fatal ([`Error::StateWrite`], "claims state is not
    /// writable: …").
    pub async fn open(path: &Path) -> Result<ClaimsStore> {
        Self::open_with(path, StoreOptions::default()).await
    }

    /// [`ClaimsStore::open`] for the daemon, which holds the state lock:
    /// the writer keeps it and locks the state again before writing into a
    /// directory deleted and recreated while running.
    pub async fn open_locked(path: &Path, lock: StateLock) -> Result<ClaimsStore> {
        Self::open_inner(path, StoreOptions::default(), Some(lock)).await
    }

    /// [`ClaimsStore::open`] with explicit options.
    pub async fn open_with(path: &Path, options: StoreOptions) -> Result<ClaimsStore> {
        Self::open_inner(path, options, None).await
    }

    async fn open_inner(
        path: &Path,
        options: StoreOptions,
        state_lock: Option<StateLock>,
    ) -> Result<ClaimsStore> {
        let paths = StatePaths::new(path);
        let table = Arc::new(Mutex::new(Table::default()));
        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = oneshot::channel::<Result<()>>();
        let mut writer = Writer::new(paths.clone(), options, table.clone(), counters.clone())
            .with_lock(state_lock);
        let thread_table = table.clone();
        std::thread::Builder::new()
            .name("claims-writer".into())
            .spawn(move || {
                let started = load::load(&paths, now_second()).and_then(|rows| {
                    lock(&thread_table).rows = rows
                        .into_iter()
                        .map(|(k, claim)| {
                            let state = ClaimState::Quarantined;
                            (k, Entry { claim, state })
                        })
                        .collect();
                    writer.startup()
                });
                let ok = started.is_ok();
                let _ = ready_tx.send(started);
                if ok {
                    writer.run(rx);
                }
            })
            .map_err(|e| Error::io("start the claims writer thread", e))?;
        let started = ready_rx.await.map_err(|_| Error::StateWrite {
            path: path.to_path_buf(),
            problem: "the claims writer thread stopped during start-up".into(),
        });
        started??;
        let store = ClaimsStore {
            inner: Arc::new(Inner {
                table,
                tx,
                counters,
                path: path.to_path_buf(),
            }),
        };
        info!(path = %path.display(), counts = ?store.counts(), "claims store open");
        Ok(store)
    }

    /// The state path this store was opened with.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// `key`'s claim and state.
    pub fn get(&self, key: &str) -> Option<(Claim, ClaimState)> {
        lock(&self.inner.table)
            .rows
            .get(key)
            .map(|e| (e.claim.clone(), e.state))
    }

    /// A snapshot of every row (any state), sorted by key.
    pub fn all(&self) -> Vec<(String, Claim, ClaimState)> {
        lock(&self.inner.table)
            .rows
            .iter()
            .map(|(k, e)| (k.clone(), e.claim.clone(), e.state))
            .collect()
    }

    /// Number of rows (any state).
    pub fn len(&self) -> usize {
        lock(&self.inner.table).rows.len()
    }

    /// Whether the table has no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows per state.
    pub fn counts(&self) -> ClaimCounts {
        let table = lock(&self.inner.table);
        let mut c = ClaimCounts::default();
        for e in table.rows.values() {
            match e.state {
                ClaimState::Settled => c.settled += 1,
                ClaimState::Tentative => c.tentative += 1,
                ClaimState::Quarantined => c.quarantined += 1,
            }
        }
        c
    }

    /// Writer counters.
    /// Observe every batch write: `f(duration, ok)` runs on the writer
    /// thread after each write + fsync. Only the first observer set counts.
    pub fn on_write(&self, f: impl Fn(std::time::Duration, bool) + Send + Sync + 'static) {
        let _ = self.inner.counters.on_write.set(Box::new(f));
    }

    pub fn stats(&self) -> StoreStats {
        self.inner.counters.snapshot()
    }

    /// Ids held by any row (any state) — for lost-reply
    /// recovery and the orphan audit.
    pub fn held_ids(&self) -> HashSet<String> {
        lock(&self.inner.table)
            .rows
            .values()
            .map(|e| e.claim.id.clone())
            .collect()
    }

    /// The (key, id) of every quarantined row, sorted by key: the snapshot a
    /// verification takes *before* listing sandboxd.
    /// Empty ⇒ verification succeeds without listing.
    pub fn quarantined(&self) -> Vec<(String, String)> {
        lock(&self.inner.table)
            .rows
            .iter()
            .filter(|(_, e)| e.state == ClaimState::Quarantined)
            .map(|(k, e)| (k.clone(), e.claim.id.clone()))
            .collect()
    }

    /// Mutate the table and enqueue the write under one lock hold (so the
    /// writer sees requests in mutation order), then wait for durability.
    async fn persist<R>(
        &self,
        mutate: impl FnOnce(&mut Table) -> (R, Option<(Vec<String>, Option<(String, String)>)>),
    ) -> Result<R> {
        let (result, rx) = {
            let mut table = lock(&self.inner.table);
            let (result, write) = mutate(&mut table);
            let Some((keys, commit)) = write else {
                return Ok(result);
            };
            let (done, rx) = oneshot::channel();
            self.inner
                .tx
                .send(Request::Persist { keys, commit, done })
                .map_err(|_| self.writer_gone())?;
            (result, rx)
        };
        self.wait(rx).await?;
        Ok(result)
    }

    async fn wait(&self, rx: oneshot::Receiver<writer::Outcome>) -> Result<()> {
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(problem)) => Err(Error::StateWrite {
                path: self.inner.path.clone(),
                problem,
            }),
            Err(_) => Err(self.writer_gone()),
        }
    }

    fn writer_gone(&self) -> Error {
        Error::StateWrite {
            path: self.inner.path.clone(),
            problem: "the claims writer thread has stopped".into(),
        }
    }

    /// Record a fresh claim for `key` as [`ClaimState::Tentative`] and make
    /// it durable (journal appended and `fdatasync`ed; a new file's directory
    /// `fsync`ed) before returning `Ok`; the row is then
    /// [`ClaimState::Settled`]. Concurrent commits share one write and sync.
    ///
    /// Times are truncated to whole seconds; an unset `claimed_at` (at or
    /// before the Unix epoch) becomes now.
    ///
    /// On `Err` the row stays tentative in memory, so the credential is never
    /// lost: the caller undoes (releases the sandbox, then calls
    /// [`ClaimsStore::remove`]).
    ///
    /// Refused with [`Error::ClaimConflict`] (nothing recorded) when `key`
    /// already holds a *different* claim id: overwriting would lose that
    /// claim's release credential. The caller releases or drops the old row
    /// first (claim, then commit; released if the commit fails). Committing the same id
    /// again replaces the row's fields.
    pub async fn commit(&self, key: &str, claim: Claim) -> Result<()> {
        let claim = format::normalised(claim, Timestamp::now());
        let id = claim.id.clone();
        self.persist(|table| {
            if let Some(held) = table.rows.get(key)
                && held.claim.id != claim.id
            {
                let err = Error::ClaimConflict {
                    key: key.to_string(),
                    held: held.claim.id.clone(),
                    offered: claim.id.clone(),
                };
                return (Err(err), None);
            }
            let state = ClaimState::Tentative;
            table.rows.insert(key.to_string(), Entry { claim, state });
            (
                Ok(()),
                Some((vec![key.to_string()], Some((key.to_string(), id)))),
            )
        })
        .await?
    }

    /// Remove `key`'s row only if it still holds claim `id` (id-guarded:
    /// never removes a replacement, never resurrects). Durable before `Ok`.
    /// Returns whether a row was removed; `Ok(false)` writes nothing. On
    /// `Err` the row is gone from memory but may survive on disk (it comes
    /// back quarantined after a restart, and verification drops it if
    /// sandboxd no longer lists it).
    pub async fn remove(&self, key: &str, id: &str) -> Result<bool> {
        self.persist(|table| match table.rows.get(key) {
            Some(e) if e.claim.id == id => {
                table.rows.remove(key);
                (true, Some((vec![key.to_string()], None)))
            }
            _ => (false, None),
        })
        .await
    }

    /// Adoption: record `pod_uid` on `key`'s row
    /// if it still holds claim `id` (and stamp `claimed_at` if unset). No
    /// state change. Writes only when something changed. The change stands
    /// in memory even on `Err` (the caller only logs it: the row is still held in memory).
    pub async fn rebind(&self, key: &str, id: &str, pod_uid: &str) -> Result<()> {
        self.rebind_with(key, id, pod_uid, |_| {}).await
    }

    /// [`ClaimsStore::rebind`], changing the row's lifecycle part in the
    /// same write (an adoption records the new Pod's owner, and a woken VM
    /// no longer hibernated, with one put).
    pub async fn rebind_with(
        &self,
        key: &str,
        id: &str,
        pod_uid: &str,
        change: impl FnOnce(&mut Lifecycle),
    ) -> Result<()> {
        let now = now_second();
        self.persist(|table| match table.rows.get_mut(key) {
            Some(e) if e.claim.id == id => {
                let before = e.claim.lifecycle.clone();
                change(&mut e.claim.lifecycle);
                let mut changed = e.claim.lifecycle != before;
                if e.claim.pod_uid != pod_uid {
                    e.claim.pod_uid = pod_uid.to_string();
                    changed = true;
                }
                if format::is_unset(e.claim.claimed_at) {
                    e.claim.claimed_at = now;
                    changed = true;
                }
                ((), changed.then(|| (vec![key.to_string()], None)))
            }
            _ => {
                debug!(
                    key,
                    id, "claims: rebind skipped, the row no longer holds this id"
                );
                ((), None)
            }
        })
        .await
    }

    /// Take sandboxd's listed deadline (`None` = no expiry, e.g. archived
    /// keep-forever rows) for `key`'s row if it still holds claim `id`.
    /// Truncated to whole seconds; writes only when it changed. The change
    /// stands in memory even on `Err`.
    pub async fn set_deadline(
        &self,
        key: &str,
        id: &str,
        deadline: Option<Timestamp>,
    ) -> Result<()> {
        let deadline = deadline.and_then(format::to_file_deadline);
        self.persist(|table| match table.rows.get_mut(key) {
            Some(e) if e.claim.id == id && e.claim.deadline != deadline => {
                e.claim.deadline = deadline;
                ((), Some((vec![key.to_string()], None)))
            }
            _ => ((), None),
        })
        .await
    }

    /// Changes the lifecycle part and the deadline of `key`'s row through
    /// `change`, if the row still holds claim `id`; writes (one journal put)
    /// only when something changed. `Ok(false)`: the row no longer holds
    /// `id` (released or replaced meanwhile), nothing changed. The change
    /// stands in memory even on `Err`.
    pub async fn update_lifecycle(
        &self,
        key: &str,
        id: &str,
        change: impl FnOnce(&mut Lifecycle, &mut Option<Timestamp>),
    ) -> Result<bool> {
        self.persist(|table| match table.rows.get_mut(key) {
            Some(e) if e.claim.id == id => {
                let (before, deadline) = (e.claim.lifecycle.clone(), e.claim.deadline);
                change(&mut e.claim.lifecycle, &mut e.claim.deadline);
                e.claim.deadline = e.claim.deadline.and_then(format::to_file_deadline);
                let changed = e.claim.lifecycle != before || e.claim.deadline != deadline;
                (true, changed.then(|| (vec![key.to_string()], None)))
            }
            _ => (false, None),
        })
        .await
    }

    /// Clean shutdown: rewrite the snapshot so the file at
    /// the state path is a valid Go `claims.json` (every non-tentative row;
    /// compact JSON, second-precision UTC times, `address` omitted when
    /// empty, `claimedAt`/`deadline` omitted when unset, `podUID` always
    /// present) and remove the journal. The store stays usable (the next
    /// change starts a new journal).
    pub async fn compact(&self) -> Result<()> {
        let (done, rx) = oneshot::channel();
        self.inner
            .tx
            .send(Request::Compact { done })
            .map_err(|_| self.writer_gone())?;
        self.wait(rx).await
    }
}

#[cfg(test)]
mod tests;
