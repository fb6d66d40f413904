//! What a claim's record becomes when sandboxd's listing shows its VM in
//! another state (pure). Things other than vk-sandbox change a VM's state:
//! a relay (`kubectl exec`, `port-forward`) wakes a hibernated or archived
//! VM, sandboxd's idle tiers hibernate and archive a running one, a wake
//! whose reply was lost still ends the sleep. A record that stays behind
//! decides wrongly: `Archived` is never renewed (the woken VM is reaped
//! under a living owner), `Hibernated` is never hibernated again (the VM
//! runs through its Sandbox's suspension). The upkeep lists sandboxd every
//! [`crate::pods::upkeep`] observation period and corrects such records;
//! its next decision then acts on what is true (defect review 2026-12-b,
//! finding 1, and finding 2's backstop).

use std::time::Duration;

use crate::claims::VmState;
use crate::sandboxd::SandboxState;

/// The longest time between two looks at sandboxd's listing.
pub const OBSERVE_AT_MOST_EVERY: Duration = Duration::from_secs(30);
/// The shortest.
const OBSERVE_AT_LEAST_EVERY: Duration = Duration::from_secs(2);

/// How often the listing is compared with the records: every 30 s, or a
/// quarter of the shortest lease sandboxd granted a claim here (at least
/// 2 s). A VM woken from the archive gets a fresh lease of that length
/// while the record still says archived (nothing renews it): the look must
/// come well before that lease ends (the reliability suite's 30 s leases
/// ended under a living owner with a 30 s period).
pub fn period(shortest_lease_seconds: Option<u64>) -> Duration {
    shortest_lease_seconds.map_or(OBSERVE_AT_MOST_EVERY, |s| {
        (Duration::from_secs(s) / 4).clamp(OBSERVE_AT_LEAST_EVERY, OBSERVE_AT_MOST_EVERY)
    })
}

/// The state a record is corrected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Correction {
    /// The VM runs: renewed while its owner lives, hibernated again while
    /// it is suspended.
    Running,
    /// sandboxd hibernated it (its idle tier): renewed, woken for the next
    /// Pod of its key.
    Hibernated,
    /// sandboxd archived it: not renewable; its deadline is the archive's.
    Archived,
}

impl Correction {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Correction::Running => "running",
            Correction::Hibernated => "hibernated",
            Correction::Archived => "archived",
        }
    }
}

/// What `recorded` becomes, `seen` being sandboxd's listing; `None` when
/// they agree, or when the record is a transition vk-sandbox has under way
/// (`Hibernating`: a hibernate pending or a wake being sent; its own retry
/// settles it, and a listing taken mid-way must not undo it).
pub fn correction(recorded: &VmState, seen: SandboxState) -> Option<Correction> {
    match (recorded, seen) {
        (VmState::Hibernating { .. }, _) => None,
        (VmState::Running, SandboxState::Running)
        | (VmState::Hibernated { .. }, SandboxState::Hibernated)
        | (VmState::Archived { .. }, SandboxState::Archived) => None,
        (_, SandboxState::Running) => Some(Correction::Running),
        (_, SandboxState::Hibernated) => Some(Correction::Hibernated),
        (_, SandboxState::Archived) => Some(Correction::Archived),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::Timestamp;

    #[test]
    fn each_record_against_each_listed_state() {
        let since = Timestamp::UNIX_EPOCH;
        let why = || "suspended".to_string();
        let running = VmState::Running;
        let pending = VmState::Hibernating { why: why(), since };
        let hibernated = VmState::Hibernated { why: why(), since };
        let archived = VmState::Archived { since };
        use Correction as C;
        use SandboxState as S;
        let table: [(&VmState, S, Option<C>, &str); 12] = [
            (&running, S::Running, None, "agree"),
            (
                &running,
                S::Hibernated,
                Some(C::Hibernated),
                "idle-hibernated",
            ),
            (&running, S::Archived, Some(C::Archived), "idle-archived"),
            (&pending, S::Running, None, "hibernate pending"),
            (&pending, S::Hibernated, None, "hibernate pending, done"),
            (&pending, S::Archived, None, "wake under way"),
            (
                &hibernated,
                S::Running,
                Some(C::Running),
                "woken by a relay",
            ),
            (&hibernated, S::Hibernated, None, "agree"),
            (
                &hibernated,
                S::Archived,
                Some(C::Archived),
                "archived at its deadline",
            ),
            (
                &archived,
                S::Running,
                Some(C::Running),
                "woken from the archive",
            ),
            (
                &archived,
                S::Hibernated,
                Some(C::Hibernated),
                "woken, idle again",
            ),
            (&archived, S::Archived, None, "agree"),
        ];
        for (recorded, seen, want, case) in table {
            assert_eq!(
                correction(recorded, seen),
                want,
                "{case}: {recorded:?} vs {seen:?}"
            );
        }
    }

    #[test]
    fn short_leases_are_looked_at_within_a_quarter_of_their_length() {
        let s = Duration::from_secs;
        assert_eq!(period(None), s(30));
        assert_eq!(period(Some(86_400)), s(30));
        assert_eq!(period(Some(120)), s(30));
        assert_eq!(period(Some(100)), s(25));
        assert_eq!(period(Some(30)), Duration::from_millis(7500));
        assert_eq!(period(Some(4)), s(2));
        assert_eq!(period(Some(0)), s(2));
    }

    #[test]
    fn labels_name_the_state_seen() {
        assert_eq!(Correction::Running.label(), "running");
        assert_eq!(Correction::Hibernated.label(), "hibernated");
        assert_eq!(Correction::Archived.label(), "archived");
    }
}
