//! A claim's own schedule in the upkeep loop — when its owner is asked
//! again (its cadence), when it may be looked at again after a failure
//! (its back-off), how long a due renewal that decided to wait rests — and
//! how a turn's outcome moves it. Pure (the time is a parameter), so the
//! table below decides every row; the loop (upkeep.rs) only keeps the
//! slots and hands their times to [`schedule::due`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};

use super::turn::Went;
use crate::claims::{Claim, VmState};
use crate::pods::lifecycle::schedule::{self, Due, PodHere};

const BACKOFF_START: Duration = Duration::from_secs(2);
const BACKOFF_CAP: Duration = Duration::from_secs(300);

/// One claim's schedule.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Slot {
    pub recheck_at: Option<Timestamp>,
    pub retry_at: Option<Timestamp>,
    pub renewal_waits_until: Option<Timestamp>,
    /// Turns in a row that failed.
    pub failures: u32,
}

/// Each held claim's slot, by (key, claim id).
pub(super) type Slots = HashMap<(String, String), Slot>;

/// What a turn's outcome is judged with: the claim it looked after and
/// why its turn had come.
pub(super) struct Looked<'a> {
    pub why: Due,
    pub vm: &'a VmState,
    pub here: PodHere,
    pub reference_unserved: bool,
    pub deadline: Option<Timestamp>,
}

impl Slot {
    /// The schedule after a turn that `went` so, at `now`.
    pub fn after(&mut self, went: Went, looked: &Looked<'_>, now: Timestamp) {
        match went {
            Went::Through | Went::Waited => {
                self.failures = 0;
                self.retry_at = None;
                self.recheck_at =
                    schedule::cadence(looked.vm, looked.here, looked.reference_unserved)
                        .and_then(|c| later(now, c));
                // Only a renewal that waited rests: a wait decided for
                // another reason must not hold back a renewal due later.
                self.renewal_waits_until = (went == Went::Waited && looked.why == Due::Renewal)
                    .then(|| later(now, schedule::renewal_wait(looked.deadline, now)))
                    .flatten();
            }
            // Nothing was decided: the next turn looks again.
            Went::Changed => {
                self.retry_at = None;
                self.recheck_at = None;
                self.renewal_waits_until = None;
            }
            Went::Failed => {
                self.failures = self.failures.saturating_add(1);
                self.retry_at = later(
                    now,
                    crate::backoff::nth(BACKOFF_START, BACKOFF_CAP, self.failures),
                );
            }
        }
    }
}

/// Drops the slots of claims no longer held (released, or the key holds
/// another claim now): a new claim of the key starts with a clean slate.
pub(super) fn keep_held(slots: &mut Slots, rows: &[(String, Claim)]) {
    slots.retain(|(key, id), _| rows.iter().any(|(k, c)| k == key && c.id == *id));
}

/// Whether sandboxd's listing is compared with the records now: never
/// yet (`None`), or a `period` since the last time.
pub(super) fn observe_due(last: Option<Instant>, now: Instant, period: Duration) -> bool {
    last.is_none_or(|at| now.saturating_duration_since(at) >= period)
}

fn later(now: Timestamp, wait: Duration) -> Option<Timestamp> {
    SignedDuration::try_from(wait)
        .ok()
        .and_then(|d| now.checked_add(d).ok())
}

#[cfg(test)]
mod tests;
