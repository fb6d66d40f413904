use super::*;
use crate::pods::authority::{OwnerLookup, decide as owner_state};
use crate::pods::owner::Intent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

fn ts(s: &str) -> Timestamp {
    s.parse().expect("ts")
}

const NOW: &str = "2026-12-02T12:00:00Z";

fn reference(uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "agents.x-k8s.io/v1beta1".into(),
        kind: "Sandbox".into(),
        name: "sb".into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn found(uid: &str, deleting: bool, intent: Intent) -> OwnerLookup {
    OwnerLookup::Found {
        deleting,
        uid: uid.into(),
        intent,
    }
}

fn running() -> Intent {
    Intent::default()
}

fn suspended() -> Intent {
    Intent {
        suspended: true,
        ..Default::default()
    }
}

fn shutdown(at: &str) -> Intent {
    Intent {
        shutdown_time: Some(ts(at)),
        ..Default::default()
    }
}

fn marked_expired() -> Intent {
    Intent {
        marked_expired: true,
        ..Default::default()
    }
}

#[test]
fn owner_state_follows_delete_authorization() {
    let r = reference("u1");
    let cases = [
        (None, OwnerLookup::NoControllerRef, "none"),
        (Some(&r), OwnerLookup::BadRef("x".into()), "doubt"),
        (
            Some(&r),
            OwnerLookup::NotFound {
                details_name: Some("sb".into()),
            },
            "gone",
        ),
        (
            Some(&r),
            OwnerLookup::NotFound { details_name: None },
            "doubt",
        ),
        (Some(&r), OwnerLookup::Failed("503".into()), "doubt"),
        (Some(&r), found("u1", true, running()), "gone"),
        (Some(&r), found("u2", false, suspended()), "gone"),
        (Some(&r), found("u1", false, suspended()), "alive"),
    ];
    for (reference, lookup, want) in cases {
        let got = owner_state(reference, &lookup);
        let kind = match &got {
            OwnerState::None => "none",
            OwnerState::Gone(_) => "gone",
            OwnerState::Alive(_) => "alive",
            OwnerState::Doubt(_) => "doubt",
        };
        assert_eq!(kind, want, "{lookup:?} -> {got:?}");
    }
    assert_eq!(
        owner_state(Some(&r), &found("u1", false, suspended())),
        OwnerState::Alive(suspended()),
        "the intent is carried"
    );
}

#[test]
fn on_delete_table() {
    let now = ts(NOW);
    let cases = [
        (OwnerState::None, true, "release"),
        (OwnerState::Gone("deleted".into()), true, "release"),
        (OwnerState::Doubt("503".into()), true, "preserve"),
        (OwnerState::Alive(running()), true, "preserve"),
        (OwnerState::Alive(suspended()), true, "hibernate"),
        (OwnerState::Alive(suspended()), false, "preserve"),
        // Expired, by the clock or by its controller, whatever its policy
        // and even while suspended.
        (
            OwnerState::Alive(shutdown("2026-12-02T11:59:59Z")),
            true,
            "release",
        ),
        (OwnerState::Alive(shutdown(NOW)), true, "release"),
        (
            OwnerState::Alive(shutdown("2026-12-02T12:00:01Z")),
            true,
            "preserve",
        ),
        (OwnerState::Alive(marked_expired()), true, "release"),
        (
            OwnerState::Alive(Intent {
                suspended: true,
                shutdown_time: Some(ts("2026-12-02T11:00:00Z")),
                marked_expired: false,
            }),
            true,
            "release",
        ),
        (
            OwnerState::Alive(Intent {
                suspended: true,
                shutdown_time: Some(ts("2026-12-02T13:00:00Z")),
                marked_expired: false,
            }),
            true,
            "hibernate",
        ),
    ];
    for (owner, flag, want) in cases {
        let got = on_delete(&owner, &Lifecycle::default(), now, flag);
        assert_eq!(
            on_delete_kind(&got),
            want,
            "{owner:?} (hibernate_on_suspend {flag}) -> {got:?}"
        );
    }
}

fn on_delete_kind(d: &OnDelete) -> &'static str {
    match d {
        OnDelete::Release(_) => "release",
        OnDelete::Hibernate(_) => "hibernate",
        OnDelete::Preserve(_) => "preserve",
        OnDelete::Keep(_) => "keep",
    }
}

/// What the claims store records of the VM decides whether sandboxd is
/// asked to hibernate it (once per suspend: a repeated delete of the same
/// Pod, or one after a restart mid-delete, asks nothing again).
#[test]
fn on_delete_by_the_vm_recorded() {
    let now = ts(NOW);
    let since = ts("2026-12-02T11:00:00Z");
    let held = |vm: VmState, refused: bool| Lifecycle {
        vm,
        hibernate_refused: refused,
        ..Default::default()
    };
    let pending = VmState::Hibernating {
        why: "suspended".into(),
        since,
    };
    let archived = VmState::Archived { since };
    let cases = [
        // (owner, recorded, hibernate_on_suspend, decision)
        (
            suspended(),
            held(VmState::Running, false),
            true,
            "hibernate",
        ),
        (suspended(), held(VmState::Running, true), true, "preserve"),
        (suspended(), held(hibernated(), false), true, "keep"),
        (suspended(), held(hibernated(), true), true, "keep"),
        (suspended(), held(pending.clone(), false), true, "keep"),
        (suspended(), held(archived.clone(), false), true, "keep"),
        // The flag off, or the owner running: its VM is preserved as is.
        (suspended(), held(hibernated(), false), false, "preserve"),
        (suspended(), held(VmState::Running, true), false, "preserve"),
        (running(), held(hibernated(), false), true, "preserve"),
        (running(), held(VmState::Running, true), true, "preserve"),
        // Expired: released, whatever was done to the VM.
        (marked_expired(), held(hibernated(), false), true, "release"),
        (marked_expired(), held(pending, false), true, "release"),
    ];
    for (intent, held, flag, want) in cases {
        let owner = OwnerState::Alive(intent);
        let got = on_delete(&owner, &held, now, flag);
        assert_eq!(
            on_delete_kind(&got),
            want,
            "{owner:?} {held:?} ({flag}) -> {got:?}"
        );
    }
    for owner in [OwnerState::None, OwnerState::Gone("deleted".into())] {
        let got = on_delete(&owner, &held(hibernated(), true), now, true);
        assert_eq!(on_delete_kind(&got), "release", "{owner:?} -> {got:?}");
    }
    let doubt = OwnerState::Doubt("503".into());
    let got = on_delete(&doubt, &held(VmState::Running, false), now, true);
    assert_eq!(on_delete_kind(&got), "preserve", "{got:?}");
}

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

fn hibernated() -> VmState {
    VmState::Hibernated {
        why: "suspended".into(),
        since: ts("2026-12-02T10:00:00Z"),
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
