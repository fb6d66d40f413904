use super::*;
use crate::sandboxd::{PoolInfo, PoolKey};

fn pool(template: &str, size: &str, warm: u64) -> PoolInfo {
    PoolInfo {
        key: PoolKey {
            template: template.into(),
            net: "none".into(),
            size: size.into(),
            engine: String::new(),
        },
        warm,
        refilling: 0,
        target: 4,
        golden: true,
    }
}

fn info(pools: Vec<PoolInfo>, claimed: u64) -> NodeInfo {
    NodeInfo {
        pools,
        claimed,
        hibernated: 0,
        archived: 0,
        draining: false,
        peers: vec![],
        at_capacity: false,
        at_capacity_reason: None,
    }
}

fn on(max_claims: Option<u64>) -> FleetSettings {
    FleetSettings {
        capacity: true,
        conditions: true,
        taints: true,
        max_claims,
    }
}

fn status_of(v: &Verdict, type_: &str) -> (&'static str, &'static str) {
    let c = v
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} in {v:?}"));
    (c.status, c.reason)
}

fn keys(v: &Verdict) -> Vec<(&'static str, &'static str)> {
    let mut k: Vec<_> = v.taints.iter().map(|t| (t.key, t.effect)).collect();
    k.sort();
    k
}

#[test]
fn each_state_gives_its_conditions_and_taints() {
    let warm = || info(vec![pool("base", "small", 3)], 5);
    let draining = NodeInfo {
        draining: true,
        ..warm()
    };
    let empty = info(vec![pool("base", "small", 0)], 5);
    let host_full = NodeInfo {
        at_capacity: true,
        at_capacity_reason: Some("node at max_running (8 VMs running)".into()),
        ..empty.clone()
    };
    let host_full_warm_left = NodeInfo {
        at_capacity: true,
        ..warm()
    };
    let some_empty = info(vec![pool("base", "small", 2), pool("rt", "small", 0)], 0);
    let fail = |kind, consecutive| Reading::Failed {
        kind,
        message: "boom".into(),
        consecutive,
        last: Some(warm()),
    };
    type Row = (
        &'static str,
        Reading,
        Option<u64>,
        [(&'static str, &'static str); 4],
        Vec<(&'static str, &'static str)>,
    );
    let rows: Vec<Row> = vec![
        (
            "healthy",
            Reading::Read(warm()),
            Some(10),
            [
                ("True", "InfoRead"),
                ("False", "NotDraining"),
                ("False", "HasRoom"),
                ("True", "PoolsWarm"),
            ],
            vec![],
        ),
        (
            "draining",
            Reading::Read(draining),
            None,
            [
                ("True", "InfoRead"),
                ("True", "Draining"),
                ("False", "HasRoom"),
                ("True", "PoolsWarm"),
            ],
            vec![(TAINT_DRAINING, "NoSchedule")],
        ),
        (
            "claim cap reached",
            Reading::Read(warm()),
            Some(5),
            [
                ("True", "InfoRead"),
                ("False", "NotDraining"),
                ("True", "ClaimCapReached"),
                ("True", "PoolsWarm"),
            ],
            vec![(TAINT_AT_CAPACITY, "NoSchedule")],
        ),
        (
            "cap unknown: never at the cap",
            Reading::Read(info(vec![pool("base", "small", 3)], 5000)),
            None,
            [
                ("True", "InfoRead"),
                ("False", "NotDraining"),
                ("False", "HasRoom"),
                ("True", "PoolsWarm"),
            ],
            vec![],
        ),
        (
            "pool emptied: prefer other nodes, provisioning still works",
            Reading::Read(empty),
            Some(10),
            [
                ("True", "InfoRead"),
                ("False", "NotDraining"),
                ("False", "HasRoom"),
                ("False", "PoolsEmpty"),
            ],
            vec![(TAINT_NO_WARM, "PreferNoSchedule")],
        ),
        (
            "host full and no warm VM: cannot take a claim",
            Reading::Read(host_full),
            None,
            [
                ("True", "InfoRead"),
                ("False", "NotDraining"),
                ("True", "HostAtCapacity"),
                ("False", "PoolsEmpty"),
            ],
            vec![
                (TAINT_AT_CAPACITY, "NoSchedule"),
                (TAINT_NO_WARM, "PreferNoSchedule"),
            ],
        ),
        (
            "host full but warm VMs left: still serves",
            Reading::Read(host_full_warm_left),
            None,
            [
                ("True", "InfoRead"),
                ("False", "NotDraining"),
                ("False", "WarmVMsLeft"),
                ("True", "PoolsWarm"),
            ],
            vec![],
        ),
        (
            "one pool of two empty: said, not tainted",
            Reading::Read(some_empty),
            None,
            [
                ("True", "InfoRead"),
                ("False", "NotDraining"),
                ("False", "HasRoom"),
                ("False", "SomePoolsEmpty"),
            ],
            vec![],
        ),
        (
            "no pools at all",
            Reading::Read(info(vec![], 0)),
            None,
            [
                ("True", "InfoRead"),
                ("False", "NotDraining"),
                ("False", "HasRoom"),
                ("False", "NoPools"),
            ],
            vec![],
        ),
        (
            "not read yet: unknown, no taint",
            Reading::NotYet,
            Some(10),
            [("Unknown", "NotReadYet"); 4],
            vec![],
        ),
        (
            "one failed read: unreachable said, not yet tainted",
            fail(FailureKind::Unreachable, 1),
            Some(10),
            [
                ("False", "Unreachable"),
                ("Unknown", "InfoFailed"),
                ("Unknown", "InfoFailed"),
                ("Unknown", "InfoFailed"),
            ],
            vec![],
        ),
        (
            "failing reads: unknown, never empty; tainted unreachable",
            fail(FailureKind::Unreachable, 2),
            Some(10),
            [
                ("False", "Unreachable"),
                ("Unknown", "InfoFailed"),
                ("Unknown", "InfoFailed"),
                ("Unknown", "InfoFailed"),
            ],
            vec![(TAINT_UNREACHABLE, "NoSchedule")],
        ),
        (
            "5xx replies count as failing",
            fail(FailureKind::Failing, 3),
            None,
            [
                ("False", "InfoFailed"),
                ("Unknown", "InfoFailed"),
                ("Unknown", "InfoFailed"),
                ("Unknown", "InfoFailed"),
            ],
            vec![(TAINT_UNREACHABLE, "NoSchedule")],
        ),
        (
            "a refused token: unknown, no taint (claims may well work)",
            fail(FailureKind::Refused, 9),
            None,
            [("Unknown", "InfoRefused"); 4],
            vec![],
        ),
    ];
    for (name, reading, cap, conds, taints) in rows {
        let v = decide(&reading, &on(cap));
        let got = [
            status_of(&v, COND_REACHABLE),
            status_of(&v, COND_DRAINING),
            status_of(&v, COND_AT_CAPACITY),
            status_of(&v, COND_POOLS_WARM),
        ];
        assert_eq!(got, conds, "{name}");
        let mut want = taints.clone();
        want.sort();
        assert_eq!(keys(&v), want, "{name}");
        assert!(
            v.taints.iter().all(|t| t.effect != "NoExecute"),
            "{name}: never NoExecute"
        );
        assert!(
            v.conditions.iter().all(|c| c.type_ != "Ready"),
            "{name}: Ready is not ours to set"
        );
    }
}

#[test]
fn capacity_is_the_cap_in_sandboxes_of_the_largest_size() {
    let v = decide(
        &Reading::Read(info(vec![pool("a", "small", 1), pool("b", "medium", 1)], 0)),
        &on(Some(40)),
    );
    assert_eq!(
        v.capacity,
        Derived {
            cpu: Some("80".into()),
            memory: Some("40960Mi".into()),
            pods: Some("40".into()),
        }
    );
    // Unknown sizes count as small; no cap known: the static values stay.
    assert_eq!(
        capacity_for(3, &[pool("a", "huge", 1)]).cpu.as_deref(),
        Some("3")
    );
    let v = decide(
        &Reading::Read(info(vec![pool("a", "small", 1)], 0)),
        &on(None),
    );
    assert_eq!(v.capacity, Derived::default());
}

#[test]
fn a_failed_read_keeps_the_last_capacity_never_zero() {
    let last = info(vec![pool("a", "large", 2)], 3);
    let failing = Reading::Read(last.clone())
        .next(Err((FailureKind::Unreachable, "refused".into())))
        .next(Err((FailureKind::Unreachable, "refused".into())));
    assert_eq!(failing.last_good(), Some(&last));
    let v = decide(&failing, &on(Some(10)));
    assert_eq!(v.capacity, capacity_for(10, &last.pools));
    assert_eq!(v.capacity.cpu.as_deref(), Some("40"));
    // Never read: the cap alone, at the smallest size.
    let v = decide(&Reading::NotYet, &on(Some(10)));
    assert_eq!(v.capacity.pods.as_deref(), Some("10"));
}

#[test]
fn consecutive_failures_count_up_and_a_good_read_resets_them() {
    let r = Reading::NotYet.next(Err((FailureKind::Failing, "500".into())));
    let r = r.next(Err((FailureKind::Unreachable, "refused".into())));
    assert!(matches!(
        r,
        Reading::Failed {
            consecutive: 2,
            kind: FailureKind::Unreachable,
            ..
        }
    ));
    let good = info(vec![], 0);
    let r = r.next(Ok(good.clone()));
    assert_eq!(r, Reading::Read(good));
    let r = r.next(Err((FailureKind::Failing, "500".into())));
    assert!(matches!(r, Reading::Failed { consecutive: 1, .. }));
}

#[test]
fn each_part_turns_off_on_its_own() {
    let reading = Reading::Read(NodeInfo {
        draining: true,
        ..info(vec![pool("a", "small", 1)], 0)
    });
    let all = decide(&reading, &on(Some(5)));
    assert!(!all.conditions.is_empty() && !all.taints.is_empty() && all.capacity.pods.is_some());
    let s = FleetSettings {
        conditions: false,
        ..on(Some(5))
    };
    let v = decide(&reading, &s);
    assert!(v.conditions.is_empty());
    assert_eq!(v.taints, all.taints);
    let s = FleetSettings {
        taints: false,
        ..on(Some(5))
    };
    let v = decide(&reading, &s);
    assert!(v.taints.is_empty());
    assert_eq!(v.conditions, all.conditions);
    let s = FleetSettings {
        capacity: false,
        ..on(Some(5))
    };
    assert_eq!(decide(&reading, &s).capacity, Derived::default());
    let off = FleetSettings {
        capacity: false,
        conditions: false,
        taints: false,
        max_claims: Some(5),
    };
    assert!(!off.any());
    assert_eq!(decide(&reading, &off), Verdict::default());
}

#[test]
fn messages_say_what_an_operator_needs() {
    let v = decide(
        &Reading::Read(info(vec![pool("base", "small", 0)], 7)),
        &on(Some(7)),
    );
    let msg = |t: &str| {
        v.conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| c.message.clone())
            .unwrap_or_default()
    };
    assert!(
        msg(COND_AT_CAPACITY).contains("7 live claims, cap 7"),
        "{v:?}"
    );
    assert!(msg(COND_POOLS_WARM).contains("base/none/small"), "{v:?}");
    let v = decide(
        &Reading::NotYet.next(Err((FailureKind::Refused, "status 403".into()))),
        &on(None),
    );
    assert!(v.conditions[0].message.contains("root token"), "{v:?}");
}

#[test]
fn counts_that_move_with_every_claim_change_nothing_while_the_state_holds() {
    let a = info(vec![pool("base", "small", 3)], 5);
    let b = info(vec![pool("base", "small", 1)], 9);
    assert_eq!(
        decide(&Reading::Read(a), &on(Some(40))),
        decide(&Reading::Read(b), &on(Some(40))),
        "a Node write per claim"
    );
    let parked = |warm| NodeInfo {
        at_capacity: true,
        at_capacity_reason: Some("node at max_running".into()),
        ..info(vec![pool("base", "small", warm)], 3)
    };
    assert_eq!(
        decide(&Reading::Read(parked(2)), &on(None)),
        decide(&Reading::Read(parked(1)), &on(None))
    );
}
