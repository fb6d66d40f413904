//! How an upkeep turn went for a claim, and whether it held the key's lock:
//! shared by the loop (upkeep.rs) and what its decisions do (acts.rs).

/// How a claim's turn went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Went {
    /// Done (or nothing to do): look again at its cadence.
    Through,
    /// Decided to wait (nothing was done): as [`Went::Through`], and a due
    /// renewal is not looked at again before its wait ends.
    Waited,
    /// Could not decide or act: back off.
    Failed,
    /// The key's row or Pod changed while its owner was asked: nothing was
    /// decided from the answers; look again on the next turn.
    Changed,
}

/// Whether a turn holds its key's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    Yes,
    /// The key stayed busy past `RENEWAL_LOCK_WAIT` (upkeep.rs): a due
    /// lease is renewed anyway; anything else waits for the key.
    No,
}
