//! The values of the claims store: a claim, its state, counts and options.

use jiff::Timestamp;

use super::lifecycle::Lifecycle;
use crate::sandboxd::Token;

/// One claim: the sandbox a Pod key holds and the credential to release it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Claim {
    /// sandboxd's sandbox id (`sb_…`).
    pub id: String,
    /// The release credential; `None` for a claim recovered without it
    /// (released with the node token).
    pub token: Option<Token>,
    /// sandboxd's `owner_addr` (may be empty).
    pub address: String,
    /// UID of the Pod the claim was made or last adopted for (forensics; the
    /// stale-UID guard never reads it).
    pub pod_uid: String,
    /// When the claim was made (or first seen without a time).
    pub claimed_at: Timestamp,
    /// The lease deadline; `None` = no expiry. Renewals move it.
    pub deadline: Option<Timestamp>,
    /// The owner it serves, what was done to its VM, its lease length
    /// (empty for a row the Go build wrote). Boxed: most rows have none,
    /// and a claim is moved around a lot.
    pub lifecycle: Box<Lifecycle>,
}

/// Where a row stands: settled, tentative (claimed, not yet durable) or
/// quarantined (loaded, not yet vouched for by sandboxd).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ClaimState {
    /// Durable and vouched for: may be adopted and reported Running.
    Settled,
    /// Recorded in memory, not (yet) durable: a fresh claim being committed,
    /// or one whose commit failed and whose undo has not removed it yet.
    /// Never adopted or reported Running; releasable.
    Tentative,
    /// Loaded from disk and not yet vouched for by a sandboxd listing. Never
    /// adopted or reported Running; releasable.
    Quarantined,
}

/// Row counts per state.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ClaimCounts {
    pub settled: usize,
    pub tentative: usize,
    pub quarantined: usize,
}

/// What [`ClaimsStore::apply_verification`] did.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct VerifyReport {
    /// Keys whose quarantine was lifted (listed by sandboxd).
    pub lifted: Vec<String>,
    /// Keys whose row was dropped (not listed, not tentative), with the id
    /// that was dropped.
    pub dropped: Vec<(String, String)>,
    /// Keys that took sandboxd's listed deadline (the row had none).
    pub deadlines_taken: Vec<String>,
    /// Snapshotted pairs not judged: the row was removed or replaced since
    /// the snapshot.
    pub unjudged: usize,
    /// Snapshotted rows that were not listed but are tentative (kept).
    pub kept_tentative: usize,
    /// Rows still quarantined after this verification (the verification
    /// loop stops when this is 0).
    pub remaining_quarantined: usize,
}

/// Tuning of the store.
#[derive(Clone, Copy, Debug)]
pub struct StoreOptions {
    /// The journal is never compacted below this many bytes.
    pub compact_min_bytes: u64,
    /// Above `compact_min_bytes`, the journal is compacted (the snapshot
    /// rewritten) when it holds more than this many times the snapshot's
    /// bytes.
    pub compact_ratio: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            compact_min_bytes: 1 << 20,
            compact_ratio: 4,
        }
    }
}

/// Counters of the writer, for metrics and tests.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct StoreStats {
    /// Batches written (each: one journal append + fdatasync, or a rewrite).
    pub batches: u64,
    /// Requests served by those batches (`requests / batches` is the group
    /// commit factor).
    pub requests: u64,
    pub journal_appends: u64,
    /// Snapshot rewrites, start-up and compactions included.
    pub rewrites: u64,
    /// Batches whose write failed.
    pub failures: u64,
    /// Current journal size.
    pub journal_bytes: u64,
}
