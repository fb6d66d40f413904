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

mod upkeep;

fn hibernated() -> VmState {
    VmState::Hibernated {
        why: "suspended".into(),
        since: ts("2026-12-02T10:00:00Z"),
    }
}
