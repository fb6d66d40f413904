//! Times as the state file holds them: whole seconds, UTC.

use jiff::Timestamp;

use crate::claims::types::Claim;
use crate::sandboxd::Deadline;

/// Truncate to whole seconds: the precision of the state file.
pub fn to_second(ts: Timestamp) -> Timestamp {
    Timestamp::from_second(ts.as_second()).unwrap_or(ts)
}

/// A deadline as the file holds it: whole seconds, and Go's zero time
/// (`0001-01-01T00:00:00Z`, which the file reads as "no expiry") is `None`.
pub fn to_file_deadline(ts: Timestamp) -> Option<Timestamp> {
    let ts = to_second(ts);
    (!matches!(Deadline::parse(Some(&format_time(ts))), Deadline::Never)).then_some(ts)
}

/// A `claimedAt` at or before the Unix epoch counts as unset (Go's zero time
/// and `Timestamp::default()` both fall there; no real claim predates 1970).
pub fn is_unset(ts: Timestamp) -> bool {
    ts <= Timestamp::UNIX_EPOCH
}

/// RFC 3339, second precision, UTC (`2026-01-01T00:00:00Z`).
pub fn format_time(ts: Timestamp) -> String {
    to_second(ts).to_string()
}

/// `claim` with its times truncated to whole seconds (the file's
/// precision) and an unset `claimed_at` stamped with `now`.
pub fn normalised(mut claim: Claim, now: Timestamp) -> Claim {
    // Truncate first: a time within the epoch's first second becomes the
    // epoch, which the file cannot tell from unset.
    let claimed_at = to_second(claim.claimed_at);
    claim.claimed_at = if is_unset(claimed_at) {
        to_second(now)
    } else {
        claimed_at
    };
    claim.deadline = claim.deadline.and_then(to_file_deadline);
    claim
}
