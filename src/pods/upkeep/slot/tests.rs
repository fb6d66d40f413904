use std::time::{Duration, Instant};

use jiff::Timestamp;

use super::*;
use crate::pods::lifecycle::schedule::{
    RECHECK_HIBERNATED, RECHECK_RUNNING, RECHECK_UNSERVED_REFERENCE,
};

fn ts(s: &str) -> Timestamp {
    s.parse().expect("ts")
}

const NOW: &str = "2026-12-06T10:00:00Z";

fn at(secs: u64) -> Option<Timestamp> {
    later(ts(NOW), Duration::from_secs(secs))
}

fn hibernated() -> VmState {
    VmState::Hibernated {
        why: "suspended".into(),
        since: ts("2026-12-06T09:00:00Z"),
    }
}

/// A slot after three failures, with a cadence and a renewal's rest set.
fn failing() -> Slot {
    Slot {
        recheck_at: at(30),
        retry_at: at(8),
        renewal_waits_until: at(900),
        failures: 3,
    }
}

struct Row {
    name: &'static str,
    before: Slot,
    went: Went,
    why: Due,
    vm: VmState,
    here: PodHere,
    unserved: bool,
    /// The lease's end, in seconds from now.
    deadline: Option<u64>,
    after: Slot,
}

fn row(name: &'static str, went: Went, why: Due, after: Slot) -> Row {
    Row {
        name,
        before: failing(),
        went,
        why,
        vm: VmState::Running,
        here: PodHere::Running,
        unserved: false,
        deadline: Some(3600),
        after,
    }
}

#[test]
fn a_turn_moves_the_claims_schedule_as_the_table_says() {
    let rows = [
        row(
            "renewed with its Pod here: only the lease brings it back",
            Went::Through,
            Due::Renewal,
            Slot::default(),
        ),
        Row {
            here: PodHere::No,
            ..row(
                "owner asked with no Pod here, VM running: again in 30 s",
                Went::Through,
                Due::NoPodHere,
                Slot {
                    recheck_at: at(RECHECK_RUNNING.as_secs()),
                    ..Slot::default()
                },
            )
        },
        Row {
            here: PodHere::No,
            vm: hibernated(),
            ..row(
                "owner asked with no Pod here, VM hibernated: again in 5 min",
                Went::Through,
                Due::NoPodHere,
                Slot {
                    recheck_at: at(RECHECK_HIBERNATED.as_secs()),
                    ..Slot::default()
                },
            )
        },
        Row {
            unserved: true,
            ..row(
                "a Pod whose reference is unserved: again in a minute",
                Went::Through,
                Due::UnservedReference,
                Slot {
                    recheck_at: at(RECHECK_UNSERVED_REFERENCE.as_secs()),
                    ..Slot::default()
                },
            )
        },
        Row {
            deadline: Some(600),
            ..row(
                "a due renewal that waited rests a quarter of what is left (10 min -> 150 s)",
                Went::Waited,
                Due::Renewal,
                Slot {
                    renewal_waits_until: at(150),
                    ..Slot::default()
                },
            )
        },
        row(
            "... at most 5 min (1 h left)",
            Went::Waited,
            Due::Renewal,
            Slot {
                renewal_waits_until: at(schedule::RENEWAL_WAIT_MAX.as_secs()),
                ..Slot::default()
            },
        ),
        Row {
            deadline: None,
            ..row(
                "a due renewal of a lease with no end that waited rests the longest",
                Went::Waited,
                Due::Renewal,
                Slot {
                    renewal_waits_until: at(schedule::RENEWAL_WAIT_MAX.as_secs()),
                    ..Slot::default()
                },
            )
        },
        Row {
            here: PodHere::No,
            ..row(
                "a wait decided for no Pod here does not rest a later renewal",
                Went::Waited,
                Due::NoPodHere,
                Slot {
                    recheck_at: at(RECHECK_RUNNING.as_secs()),
                    ..Slot::default()
                },
            )
        },
        Row {
            before: Slot::default(),
            ..row(
                "a first failure backs off 2 s",
                Went::Failed,
                Due::Renewal,
                Slot {
                    retry_at: at(2),
                    failures: 1,
                    ..Slot::default()
                },
            )
        },
        row(
            "a fourth failure backs off 16 s; cadence and rest stay",
            Went::Failed,
            Due::NoPodHere,
            Slot {
                retry_at: at(16),
                failures: 4,
                ..failing()
            },
        ),
        Row {
            before: Slot {
                failures: 40,
                ..failing()
            },
            ..row(
                "the back-off stops at 5 min",
                Went::Failed,
                Due::Renewal,
                Slot {
                    retry_at: at(300),
                    failures: 41,
                    ..failing()
                },
            )
        },
        Row {
            before: Slot {
                failures: u32::MAX,
                ..failing()
            },
            ..row(
                "failures counted past u32::MAX stay at the cap",
                Went::Failed,
                Due::Renewal,
                Slot {
                    retry_at: at(300),
                    failures: u32::MAX,
                    ..failing()
                },
            )
        },
        row(
            "changed under the turn: looked at again next turn, failures kept",
            Went::Changed,
            Due::Renewal,
            Slot {
                failures: 3,
                ..Slot::default()
            },
        ),
    ];
    for r in rows {
        let mut slot = r.before.clone();
        let looked = Looked {
            why: r.why,
            vm: &r.vm,
            here: r.here,
            reference_unserved: r.unserved,
            deadline: r.deadline.and_then(at),
        };
        slot.after(r.went, &looked, ts(NOW));
        assert_eq!(slot, r.after, "{}", r.name);
    }
}

fn claim(id: &str) -> Claim {
    Claim {
        id: id.into(),
        token: None,
        address: String::new(),
        pod_uid: String::new(),
        claimed_at: ts(NOW),
        deadline: None,
        lifecycle: Default::default(),
    }
}

#[test]
fn only_the_slots_of_claims_still_held_are_kept() {
    let mut slots = Slots::new();
    for (key, id) in [
        ("ns/a", "sb_1"),
        ("ns/a", "sb_old"),
        ("ns/b", "sb_1"),
        ("ns/c", "sb_3"),
    ] {
        slots.insert((key.into(), id.into()), failing());
    }
    let rows = vec![
        ("ns/a".to_string(), claim("sb_1")),
        ("ns/c".to_string(), claim("sb_3")),
    ];
    keep_held(&mut slots, &rows);
    let mut kept: Vec<_> = slots.keys().cloned().collect();
    kept.sort();
    assert_eq!(
        kept,
        vec![
            ("ns/a".to_string(), "sb_1".to_string()),
            ("ns/c".to_string(), "sb_3".to_string())
        ],
        "a key's old claim and another key's claim of the same id are forgotten"
    );
    keep_held(&mut slots, &[]);
    assert!(slots.is_empty(), "nothing held, nothing kept");
}

#[test]
fn sandboxds_listing_is_compared_once_a_period() {
    let start = Instant::now();
    let period = Duration::from_secs(30);
    assert!(observe_due(None, start, period), "never compared: now");
    assert!(!observe_due(Some(start), start, period), "just compared");
    assert!(
        !observe_due(
            Some(start),
            start + period - Duration::from_millis(1),
            period
        ),
        "a millisecond short of the period"
    );
    assert!(
        observe_due(Some(start), start + period, period),
        "the period is up"
    );
    assert!(
        !observe_due(Some(start + period), start, period),
        "a last time after now (never past the period) is not due"
    );
}
