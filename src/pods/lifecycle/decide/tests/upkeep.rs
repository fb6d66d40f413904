//! The upkeep's table: what a held claim needs next, by the VM recorded, the lease and the owner.

use super::*;

/// A claim whose lease ends at `deadline`, granted a day, asked a day.
fn lease(deadline: &str) -> Lease<'static> {
    Lease {
        id: "sb_1",
        deadline: Some(ts(deadline)),
        ttl_seconds: Some(86_400),
        granted_seconds: Some(86_400),
    }
}

/// Due: 2 h left of a day lease with a 12 h margin.
const DUE: &str = "2026-12-02T14:00:00Z";
/// Not due: 20 h left.
const FRESH: &str = "2026-12-03T08:00:00Z";

fn settings() -> Settings {
    Settings {
        hibernate_on_suspend: true,
        renew_margin: Duration::from_secs(12 * 3600),
    }
}

fn hibernating() -> VmState {
    VmState::Hibernating {
        why: "suspended".into(),
        since: ts("2026-12-02T10:00:00Z"),
    }
}

fn archived() -> VmState {
    VmState::Archived {
        since: ts("2026-12-02T10:00:00Z"),
    }
}

struct Case {
    what: &'static str,
    pod_here: bool,
    owner: OwnerState,
    vm: VmState,
    refused: bool,
    deadline: &'static str,
    whereabouts: Whereabouts,
    want: &'static str,
}

fn case(
    what: &'static str,
    pod_here: bool,
    owner: OwnerState,
    vm: VmState,
    deadline: &'static str,
    want: &'static str,
) -> Case {
    Case {
        what,
        pod_here,
        owner,
        vm,
        refused: false,
        deadline,
        whereabouts: Whereabouts::NotElsewhere,
        want,
    }
}

fn kind(u: &Upkeep) -> &'static str {
    match u {
        Upkeep::Renew(_) => "renew",
        Upkeep::Hibernate(_) => "hibernate",
        Upkeep::Release(_) => "release",
        Upkeep::ReleaseMoved(_) => "release-moved",
        Upkeep::ReleaseOwnerGone(_) => "release+fail",
        Upkeep::AskWhereabouts => "ask",
        Upkeep::Wait(_) => "wait",
    }
}

#[test]
fn upkeep_table() {
    use OwnerState::*;
    let alive = || Alive(running());
    let mut cases = vec![
        // A Pod runs here.
        case("bare Pod, due", true, None, VmState::Running, DUE, "renew"),
        case(
            "bare Pod, fresh",
            true,
            None,
            VmState::Running,
            FRESH,
            "wait",
        ),
        case(
            "doubt, due: the Pod is proof of life",
            true,
            Doubt("503".into()),
            VmState::Running,
            DUE,
            "renew",
        ),
        case("alive, due", true, alive(), VmState::Running, DUE, "renew"),
        case(
            "alive, fresh",
            true,
            alive(),
            VmState::Running,
            FRESH,
            "wait",
        ),
        case(
            "alive and idle-hibernated by sandboxd, due",
            true,
            alive(),
            VmState::Running,
            DUE,
            "renew",
        ),
        case(
            "suspending, Pod not gone yet, due",
            true,
            Alive(suspended()),
            VmState::Running,
            DUE,
            "renew",
        ),
        case(
            "expired, Pod not deleted yet",
            true,
            Alive(marked_expired()),
            VmState::Running,
            DUE,
            "wait",
        ),
        case(
            "owner gone, Pod left behind",
            true,
            Gone("deleted".into()),
            VmState::Running,
            FRESH,
            "release+fail",
        ),
        case(
            "shutdownTime far, due",
            true,
            Alive(shutdown("2026-12-09T00:00:00Z")),
            VmState::Running,
            DUE,
            "renew",
        ),
        case(
            "lease already reaches shutdownTime",
            true,
            Alive(shutdown("2026-12-02T13:00:00Z")),
            VmState::Running,
            DUE,
            "wait",
        ),
        // No Pod here.
        case("no owner known", false, None, VmState::Running, DUE, "wait"),
        case(
            "doubt, due: renewed (reversible), never released",
            false,
            Doubt("503".into()),
            hibernated(),
            DUE,
            "renew",
        ),
        case(
            "doubt, fresh: wait",
            false,
            Doubt("503".into()),
            hibernated(),
            FRESH,
            "wait",
        ),
        case(
            "owner gone",
            false,
            Gone("deleted".into()),
            hibernated(),
            FRESH,
            "release",
        ),
        case(
            "owner expired while suspended",
            false,
            Alive(Intent {
                suspended: true,
                marked_expired: true,
                shutdown_time: Option::None,
            }),
            hibernated(),
            FRESH,
            "release",
        ),
        case(
            "owner past shutdownTime",
            false,
            Alive(shutdown("2026-12-02T11:00:00Z")),
            VmState::Running,
            FRESH,
            "release",
        ),
        case(
            "suspended, VM running: hibernate",
            false,
            Alive(suspended()),
            VmState::Running,
            FRESH,
            "hibernate",
        ),
        case(
            "suspended, hibernate pending: again",
            false,
            Alive(suspended()),
            hibernating(),
            FRESH,
            "hibernate",
        ),
        case(
            "suspended, hibernate pending, due: renewed first",
            false,
            Alive(suspended()),
            hibernating(),
            DUE,
            "renew",
        ),
        case(
            "suspended, VM running, due: renewed first",
            false,
            Alive(suspended()),
            VmState::Running,
            DUE,
            "renew",
        ),
        case(
            "suspended, hibernated, due: renewed without waking",
            false,
            Alive(suspended()),
            hibernated(),
            DUE,
            "renew",
        ),
        case(
            "suspended, hibernated, fresh",
            false,
            Alive(suspended()),
            hibernated(),
            FRESH,
            "wait",
        ),
        case(
            "suspended, archived: not renewable",
            false,
            Alive(suspended()),
            archived(),
            DUE,
            "wait",
        ),
        case(
            "running owner, hibernated VM, Pod not back yet, due",
            false,
            alive(),
            hibernated(),
            DUE,
            "renew",
        ),
        case(
            "running owner, Pod elsewhere unknown",
            false,
            alive(),
            VmState::Running,
            FRESH,
            "ask",
        ),
    ];
    if let Some(last) = cases.last_mut() {
        last.whereabouts = Whereabouts::Unknown;
    }
    let mut extra = vec![
        Case {
            refused: true,
            ..case(
                "suspended, hibernate refused, due",
                false,
                Alive(suspended()),
                VmState::Running,
                DUE,
                "renew",
            )
        },
        Case {
            refused: true,
            ..case(
                "suspended, hibernate refused, fresh",
                false,
                Alive(suspended()),
                VmState::Running,
                FRESH,
                "wait",
            )
        },
        Case {
            whereabouts: Whereabouts::Elsewhere("node-b".into()),
            ..case(
                "moved",
                false,
                alive(),
                VmState::Running,
                FRESH,
                "release-moved",
            )
        },
        Case {
            whereabouts: Whereabouts::Elsewhere("node-b".into()),
            ..case(
                "moved while hibernated",
                false,
                alive(),
                hibernated(),
                FRESH,
                "release-moved",
            )
        },
        Case {
            whereabouts: Whereabouts::Elsewhere("node-b".into()),
            ..case(
                "suspended: no Pod anywhere, whereabouts not read",
                false,
                Alive(suspended()),
                hibernated(),
                FRESH,
                "wait",
            )
        },
        case(
            "not elsewhere, due",
            false,
            alive(),
            VmState::Running,
            DUE,
            "renew",
        ),
        // A Pod here is never asked about elsewhere.
        Case {
            whereabouts: Whereabouts::Unknown,
            ..case(
                "Pod here, whereabouts unknown",
                true,
                alive(),
                VmState::Running,
                FRESH,
                "wait",
            )
        },
    ];
    cases.append(&mut extra);
    let now = ts(NOW);
    for c in &cases {
        let t = Turn {
            pod_here: c.pod_here,
            owner: &c.owner,
            vm: &c.vm,
            hibernate_refused: c.refused,
            lease: lease(c.deadline),
            whereabouts: c.whereabouts.clone(),
            now,
            settings: settings(),
        };
        let got = upkeep(&t);
        assert_eq!(kind(&got), c.want, "{}: {got:?}", c.what);
    }
}

#[test]
fn hibernate_on_suspend_off_renews_instead() {
    let owner = OwnerState::Alive(suspended());
    let t = Turn {
        pod_here: false,
        owner: &owner,
        vm: &VmState::Running,
        hibernate_refused: false,
        lease: lease(DUE),
        whereabouts: Whereabouts::NotElsewhere,
        now: ts(NOW),
        settings: Settings {
            hibernate_on_suspend: false,
            ..settings()
        },
    };
    assert!(matches!(upkeep(&t), Upkeep::Renew(_)), "{:?}", upkeep(&t));
}

#[test]
fn renewal_off_renews_nothing() {
    let owner = OwnerState::Alive(running());
    let t = Turn {
        pod_here: true,
        owner: &owner,
        vm: &VmState::Running,
        hibernate_refused: false,
        lease: lease("2026-12-02T12:00:01Z"),
        whereabouts: Whereabouts::NotElsewhere,
        now: ts(NOW),
        settings: Settings {
            renew_margin: Duration::ZERO,
            ..settings()
        },
    };
    assert_eq!(kind(&upkeep(&t)), "wait");
}

#[test]
fn the_renewal_asks_the_claims_ttl_capped_by_shutdown_time() {
    let owner = OwnerState::Alive(shutdown("2026-12-02T16:00:00Z"));
    let t = Turn {
        pod_here: true,
        owner: &owner,
        vm: &VmState::Running,
        hibernate_refused: false,
        lease: lease(DUE),
        whereabouts: Whereabouts::NotElsewhere,
        now: ts(NOW),
        settings: settings(),
    };
    assert_eq!(
        upkeep(&t),
        Upkeep::Renew(NonZeroU64::new(4 * 3600 + 120).expect("non-zero"))
    );
    let owner = OwnerState::Alive(running());
    let t = Turn { owner: &owner, ..t };
    assert_eq!(
        upkeep(&t),
        Upkeep::Renew(NonZeroU64::new(86_400).expect("non-zero"))
    );
}
