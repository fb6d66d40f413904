//! What `--drain-sandboxd-on-cordon` does next (pure): from the Node's
//! cordon, our record that we drained sandboxd for it, and sandboxd's own
//! `draining` (unknown when its last read failed).
//!
//! The record is written *before* the drain and removed *after* the
//! undrain, so a restart between the two finds it and finishes the job;
//! both sandboxd calls are idempotent. A drain sandboxd's operator made
//! (draining with no record of ours) is theirs: a cordon does not take it
//! over and an uncordon does not undo it.

/// What the cordon task sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The Node's `spec.unschedulable` (`kubectl cordon`, a drain).
    pub cordoned: bool,
    /// Our record on the Node: vk-sandbox drained sandboxd for the cordon.
    pub ours: bool,
    /// sandboxd's `draining` in `/v1/info`; `None` when unknown.
    pub draining: Option<bool>,
}

/// The next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do.
    Nothing,
    /// Cordoned, sandboxd's state unknown: wait for a reading (a drain of
    /// a sandboxd that cannot be read is not attempted blind, because an
    /// operator's drain must not become ours).
    Wait,
    /// Record, then `POST /v1/drain`.
    Drain,
    /// `DELETE /v1/drain`, then remove the record.
    Undrain,
}

/// Pure.
pub fn decide(seen: Seen) -> Step {
    match (seen.cordoned, seen.ours, seen.draining) {
        // An operator's drain: not ours to take over.
        (true, false, Some(true)) => Step::Nothing,
        (true, false, Some(false)) => Step::Drain,
        (true, false, None) => Step::Wait,
        // Ours, but sandboxd takes claims (it restarted, or someone
        // undrained it while the Node stays cordoned): the cordon wins.
        (true, true, Some(false)) => Step::Drain,
        (true, true, _) => Step::Nothing,
        // Uncordoned and ours: undrain whatever the last reading says (it
        // may predate our own drain); an unreachable sandboxd fails the
        // call, which is retried.
        (false, true, _) => Step::Undrain,
        (false, false, _) => Step::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_has_its_step() {
        let rows = [
            // cordoned, ours, draining, step
            (false, false, None, Step::Nothing),
            (false, false, Some(false), Step::Nothing),
            (false, false, Some(true), Step::Nothing), // the operator's drain stays
            (true, false, Some(false), Step::Drain),
            (true, false, Some(true), Step::Nothing), // not taken over
            (true, false, None, Step::Wait),
            (true, true, Some(true), Step::Nothing),
            (true, true, None, Step::Nothing),
            (true, true, Some(false), Step::Drain), // sandboxd lost the drain
            (false, true, Some(true), Step::Undrain),
            (false, true, Some(false), Step::Undrain), // a reading from before our drain
            (false, true, None, Step::Undrain),
        ];
        for (cordoned, ours, draining, want) in rows {
            let seen = Seen {
                cordoned,
                ours,
                draining,
            };
            assert_eq!(decide(seen), want, "{seen:?}");
        }
    }
}
