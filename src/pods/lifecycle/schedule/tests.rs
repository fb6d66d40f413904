use super::*;

fn ts(s: &str) -> Timestamp {
    s.parse().expect("ts")
}

fn lease<'a>(id: &'a str, deadline: &str, ttl: Option<u64>, granted: Option<u64>) -> Lease<'a> {
    Lease {
        id,
        deadline: Some(ts(deadline)),
        ttl_seconds: ttl,
        granted_seconds: granted,
    }
}

const HOUR: Duration = Duration::from_secs(3600);

#[test]
fn a_day_lease_is_renewed_when_the_margin_is_left_spread_by_a_quarter() {
    let l = lease("sb_1", "2026-12-03T00:00:00Z", Some(86_400), Some(86_400));
    let at = renew_at(&l, 12 * HOUR).expect("due some time");
    let latest = ts("2026-12-02T12:00:00Z");
    let earliest = ts("2026-12-02T09:00:00Z");
    assert!(at <= latest && at > earliest, "{at}");
    // Stable per claim; another claim lands elsewhere in the quarter.
    assert_eq!(renew_at(&l, 12 * HOUR), Some(at));
    let spread: std::collections::BTreeSet<Timestamp> = (0..50)
        .map(|i| format!("sb_{i}"))
        .filter_map(|id| {
            renew_at(
                &Lease {
                    id: &id,
                    ..l.clone()
                },
                12 * HOUR,
            )
        })
        .collect();
    assert!(spread.len() > 40, "renewals spread: {}", spread.len());
    assert!(spread.iter().all(|t| *t <= latest && *t > earliest));
}

/// FNV-1a's published 64-bit vectors: the spread is that hash, so a
/// claim's renewal time is the same in every process and version.
#[test]
fn the_spread_is_fnv_1a() {
    assert_eq!(spread_of(""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(spread_of("a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(spread_of("foobar"), 0x8594_4171_f739_67e8);
}

#[test]
fn a_short_lease_is_renewed_half_way() {
    // The test simulator's 20 s maximum lease: asked a day, granted 20 s.
    let l = lease("sb_1", "2026-12-02T00:00:20Z", Some(86_400), Some(20));
    let at = renew_at(&l, 12 * HOUR).expect("due");
    assert!(
        at <= ts("2026-12-02T00:00:10Z") && at > ts("2026-12-02T00:00:07.5Z"),
        "{at}"
    );
    // A small margin wins over half the lease.
    let l = lease("sb_1", "2026-12-03T00:00:00Z", Some(86_400), Some(86_400));
    let at = renew_at(&l, HOUR).expect("due");
    assert!(
        at <= ts("2026-12-02T23:00:00Z") && at > ts("2026-12-02T22:45:00Z"),
        "{at}"
    );
    // Unknown granted length: what was asked; a granted 0 is unknown.
    for granted in [None, Some(0)] {
        let l = lease("sb_1", "2026-12-03T00:00:00Z", Some(3600), granted);
        let at = renew_at(&l, 12 * HOUR).expect("due");
        assert!(
            at <= ts("2026-12-02T23:30:00Z") && at > ts("2026-12-02T23:22:30Z"),
            "{granted:?}: {at}"
        );
    }
}

#[test]
fn never_when_nothing_ends_or_renewal_is_off() {
    let forever = Lease {
        id: "sb_1",
        deadline: None,
        ttl_seconds: Some(86_400),
        granted_seconds: None,
    };
    assert_eq!(renew_at(&forever, 12 * HOUR), None);
    let l = lease("sb_1", "2026-12-03T00:00:00Z", None, None);
    assert_eq!(renew_at(&l, Duration::ZERO), None);
}

#[test]
fn the_ttl_is_explicit_never_zero_and_never_shortens() {
    let now = ts("2026-12-02T12:00:00Z");
    let ttl = |l: &Lease<'_>, shutdown: Option<&str>| {
        renew_ttl(l, shutdown.map(ts), now).map(NonZeroU64::get)
    };
    let day = lease("sb_1", "2026-12-02T20:00:00Z", None, None);
    assert_eq!(ttl(&day, None), Some(86_400), "absent annotation: a day");
    let hour = lease("sb_1", "2026-12-02T12:20:00Z", Some(3600), None);
    assert_eq!(ttl(&hour, None), Some(3600));
    // ttl-seconds 0 got sandboxd's default: ask for that, explicitly.
    let dflt = lease("sb_1", "2026-12-02T12:02:00Z", Some(0), None);
    assert_eq!(ttl(&dflt, None), Some(300));
    // More than sandboxd grants is asked as its cap.
    let big = lease("sb_1", "2026-12-02T20:00:00Z", Some(1_000_000), None);
    assert_eq!(ttl(&big, None), Some(86_400));
    // A renewal that would not move the end later is not made.
    assert_eq!(ttl(&hour, None).map(|_| ()), Some(()));
    let long = lease("sb_1", "2026-12-02T14:00:00Z", Some(3600), None);
    assert_eq!(ttl(&long, None), None, "an hour from now is before 14:00");
    let exact = lease("sb_1", "2026-12-02T13:00:00Z", Some(3600), None);
    assert_eq!(ttl(&exact, None), None, "the same end is no renewal");
    // A deadline already past (vk-sandbox was down): renewed.
    let past = lease("sb_1", "2026-12-02T11:00:00Z", Some(3600), None);
    assert_eq!(ttl(&past, None), Some(3600));
}

#[test]
fn shutdown_time_caps_the_lease() {
    let now = ts("2026-12-02T12:00:00Z");
    let l = lease("sb_1", "2026-12-02T12:30:00Z", None, None);
    let capped = renew_ttl(&l, Some(ts("2026-12-02T14:00:00Z")), now).map(NonZeroU64::get);
    assert_eq!(
        capped,
        Some(2 * 3600 + 120),
        "to shutdownTime plus the slack"
    );
    // Already reaching it: nothing to renew.
    let reaching = lease("sb_1", "2026-12-02T14:02:00Z", None, None);
    assert_eq!(
        renew_ttl(&reaching, Some(ts("2026-12-02T14:00:00Z")), now),
        None
    );
    // Past: nothing.
    assert_eq!(renew_ttl(&l, Some(ts("2026-12-02T11:00:00Z")), now), None);
    assert_eq!(
        renew_ttl(&l, Some(now), now),
        None,
        "at shutdownTime the owner has expired"
    );
    // Close to it: a last short renewal, to the slack past it.
    let ending = lease("sb_1", "2026-12-02T12:01:00Z", None, None);
    let last = renew_ttl(&ending, Some(ts("2026-12-02T12:00:30Z")), now).map(NonZeroU64::get);
    assert_eq!(last, Some(150));
    // A far shutdownTime does not lengthen past sandboxd's cap.
    let far = renew_ttl(&l, Some(ts("2026-12-09T00:00:00Z")), now).map(NonZeroU64::get);
    assert_eq!(far, Some(86_400));
}

fn facts<'a>(lease: Lease<'a>, vm: &'a VmState, pod: PodHere) -> Facts<'a> {
    Facts {
        lease,
        vm,
        pod,
        owner_recorded: true,
        reference_unserved: false,
        retry_at: None,
        recheck_at: None,
        renewal_waits_until: None,
    }
}

#[test]
fn due_table() {
    let now = ts("2026-12-02T12:00:00Z");
    let since = ts("2026-12-02T10:00:00Z");
    let running = VmState::Running;
    let hibernated = VmState::Hibernated {
        why: "suspended".into(),
        since,
    };
    let pending = VmState::Hibernating {
        why: "suspended".into(),
        since,
    };
    let due_soon = || lease("sb_1", "2026-12-02T14:00:00Z", None, Some(86_400));
    let fresh = || lease("sb_1", "2026-12-03T10:00:00Z", None, Some(86_400));
    let margin = 12 * HOUR;
    let d = |f: Facts<'_>| due(&f, margin, now);
    assert_eq!(
        d(facts(due_soon(), &running, PodHere::Running)),
        Some(Due::Renewal)
    );
    assert_eq!(d(facts(fresh(), &running, PodHere::Running)), None);
    assert_eq!(
        d(facts(due_soon(), &hibernated, PodHere::No)),
        Some(Due::Renewal)
    );
    assert_eq!(
        d(facts(fresh(), &hibernated, PodHere::No)),
        Some(Due::NoPodHere)
    );
    assert_eq!(
        d(facts(fresh(), &pending, PodHere::No)),
        Some(Due::PendingHibernate)
    );
    assert_eq!(
        d(facts(fresh(), &pending, PodHere::Running)),
        None,
        "a pending hibernate under a Pod here (being woken) is its reconcile's"
    );
    assert_eq!(
        d(facts(due_soon(), &pending, PodHere::Running)),
        Some(Due::Renewal)
    );
    assert_eq!(
        d(facts(due_soon(), &running, PodHere::Deleting)),
        None,
        "a Pod being deleted is its reconcile's"
    );
    let unknown_owner = Facts {
        owner_recorded: false,
        ..facts(fresh(), &running, PodHere::No)
    };
    assert_eq!(d(unknown_owner), None, "no one to ask");
    let unserved = Facts {
        reference_unserved: true,
        ..facts(fresh(), &running, PodHere::Running)
    };
    assert_eq!(d(unserved.clone()), Some(Due::UnservedReference));
    // A back-off holds everything back, a renewal included.
    let later = Some(ts("2026-12-02T12:00:01Z"));
    for f in [
        facts(due_soon(), &running, PodHere::Running),
        facts(fresh(), &pending, PodHere::No),
        unserved.clone(),
    ] {
        let held = Facts {
            retry_at: later,
            ..f
        };
        assert_eq!(d(held), None);
    }
    let reached = Facts {
        retry_at: Some(now),
        ..facts(fresh(), &pending, PodHere::No)
    };
    assert_eq!(d(reached), Some(Due::PendingHibernate), "at its time");
    let recheck_reached = Facts {
        recheck_at: Some(now),
        ..facts(fresh(), &hibernated, PodHere::No)
    };
    assert_eq!(d(recheck_reached), Some(Due::NoPodHere), "at its cadence");
    // The cadence holds back only the owner's recheck: a renewal (of a
    // hibernated claim, asked about every 5 min) or a pending
    // hibernate comes at its own time.
    fn recheck(f: Facts<'_>) -> Facts<'_> {
        Facts {
            recheck_at: Some(ts("2026-12-02T12:00:01Z")),
            ..f
        }
    }
    assert_eq!(d(recheck(facts(fresh(), &hibernated, PodHere::No))), None);
    assert_eq!(d(recheck(unserved)), None);
    assert_eq!(
        d(recheck(facts(due_soon(), &hibernated, PodHere::No))),
        Some(Due::Renewal)
    );
    assert_eq!(
        d(recheck(facts(fresh(), &pending, PodHere::No))),
        Some(Due::PendingHibernate)
    );
    // A due renewal that decided to wait is held back until its wait
    // ends (not every turn), and only the renewal is.
    let waiting = |f: Facts<'_>, until: &str| -> Option<Due> {
        d(Facts {
            renewal_waits_until: Some(ts(until)),
            ..f
        })
    };
    assert_eq!(
        waiting(
            facts(due_soon(), &running, PodHere::Running),
            "2026-12-02T12:00:01Z"
        ),
        None
    );
    assert_eq!(
        waiting(facts(due_soon(), &running, PodHere::Running), NOW_S),
        Some(Due::Renewal),
        "at the end of its wait"
    );
    assert_eq!(
        waiting(
            facts(due_soon(), &hibernated, PodHere::No),
            "2026-12-02T12:00:01Z"
        ),
        Some(Due::NoPodHere),
        "the owner's recheck still comes at its cadence"
    );
    assert_eq!(
        waiting(
            facts(due_soon(), &pending, PodHere::No),
            "2026-12-02T12:00:01Z"
        ),
        Some(Due::PendingHibernate)
    );
    // Renewal off: only the rest.
    assert_eq!(
        due(
            &facts(due_soon(), &running, PodHere::Running),
            Duration::ZERO,
            now
        ),
        None
    );
}

const NOW_S: &str = "2026-12-02T12:00:00Z";

#[test]
fn a_waiting_renewal_is_asked_about_more_often_as_its_end_nears() {
    let now = ts(NOW_S);
    let at = |s: &str| renewal_wait(Some(ts(s)), now);
    assert_eq!(at("2026-12-02T22:00:00Z"), RENEWAL_WAIT_MAX, "10 h left");
    assert_eq!(at("2026-12-02T12:20:00Z"), RENEWAL_WAIT_MAX, "20 min left");
    assert_eq!(at("2026-12-02T12:10:00Z"), Duration::from_secs(150));
    assert_eq!(at("2026-12-02T12:00:40Z"), Duration::from_secs(10));
    assert_eq!(at("2026-12-02T12:00:04Z"), RENEWAL_WAIT_MIN, "4 s left");
    assert_eq!(at("2026-12-02T11:00:00Z"), RENEWAL_WAIT_MIN, "past");
    assert_eq!(renewal_wait(None, now), RENEWAL_WAIT_MAX, "no end");
}

#[test]
fn cadence_follows_what_the_vm_costs() {
    let since = ts("2026-12-02T10:00:00Z");
    let hibernated = VmState::Hibernated {
        why: "suspended".into(),
        since,
    };
    let archived = VmState::Archived { since };
    let pending = VmState::Hibernating {
        why: "suspended".into(),
        since,
    };
    assert_eq!(
        cadence(&VmState::Running, PodHere::No, false),
        Some(RECHECK_RUNNING)
    );
    assert_eq!(cadence(&pending, PodHere::No, false), Some(RECHECK_RUNNING));
    assert_eq!(
        cadence(&hibernated, PodHere::No, false),
        Some(RECHECK_HIBERNATED)
    );
    assert_eq!(
        cadence(&archived, PodHere::No, false),
        Some(RECHECK_HIBERNATED)
    );
    assert_eq!(cadence(&VmState::Running, PodHere::Running, false), None);
    assert_eq!(
        cadence(&VmState::Running, PodHere::Running, true),
        Some(RECHECK_UNSERVED_REFERENCE)
    );
    assert_eq!(cadence(&VmState::Running, PodHere::Deleting, true), None);
}
