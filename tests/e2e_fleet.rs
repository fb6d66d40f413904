//! A fleet of three sandboxd nodes (issue 39): three vk-sandbox processes,
//! each with its own sandboxd simulator, on the local plane, and the
//! Sandbox controller (upstream agent-sandbox; the stand-in only where it
//! cannot run). The default scheduler places the Sandboxes.
//!
//! - Three equal nodes: 60 Sandboxes land 15–25 a node (allocatable sized
//!   by the claim cap makes a fuller node score lower).
//! - One node's pool emptied, its claim cap reached, its sandboxd drained,
//!   its sandboxd stopped: within 5 s the Node carries the matching
//!   condition and taint; the next 20 Sandboxes all go Running on the
//!   other nodes; its Running sandboxes stay Running and Ready with no
//!   write to their Pods; within 5 s of recovery the taint is gone.
//! - A Sandbox's, a warm pool's and a claim's Pod bound to a full node are
//!   handed back and end Running on another node within 30 s, leaving
//!   nothing in either sandboxd.
//!
//! One test, the scenarios in turn, so the fleet is set up once (a few
//! minutes in all).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::{Api, ResourceExt};
use sandboxd_sim::PoolConfig;
use serde_json::json;
use support::fleet::{CAP, FOLLOW, Fleet, TEMPLATE};
use support::vk::tail;
use support::wait_for;

/// What a node's Node says about sandboxd.
fn condition(n: &Node, type_: &str) -> Option<(String, String)> {
    support::vk::node_condition_of(n, type_)
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

fn taint_effect(n: &Node, key: &str) -> Option<String> {
    n.spec
        .as_ref()?
        .taints
        .as_ref()?
        .iter()
        .find(|t| t.key == key)
        .map(|t| t.effect.clone())
}

/// The fleet with this test's steering helpers.
struct Steered(Fleet);

impl std::ops::Deref for Steered {
    type Target = Fleet;
    fn deref(&self) -> &Fleet {
        &self.0
    }
}

impl Steered {
    /// Waits (up to 20 s, to report a slow one well) until node `i`'s Node
    /// matches; returns how long it took from `since`.
    async fn wait_node(
        &self,
        i: usize,
        what: &str,
        since: Instant,
        check: impl Fn(&Node) -> bool,
    ) -> Duration {
        let nodes: Api<Node> = Api::all(self.client());
        let name = self.node(i).to_string();
        wait_for(
            &format!("Node {name}: {what}"),
            Duration::from_secs(20),
            || async {
                let n = nodes.get(&name).await.map_err(|e| e.to_string())?;
                if check(&n) {
                    Ok(())
                } else {
                    Err(format!(
                        "taints {:?}; conditions {:?}",
                        n.spec.as_ref().and_then(|s| s.taints.clone()),
                        n.status
                            .as_ref()
                            .and_then(|s| s.conditions.clone())
                            .map(|cs| cs
                                .into_iter()
                                .filter(|c| c.type_.starts_with("Sandboxd"))
                                .map(|c| (c.type_, c.status, c.reason))
                                .collect::<Vec<_>>())
                    ))
                }
            },
        )
        .await;
        since.elapsed()
    }

    /// Waits until node `i`'s `vk_sandbox_node_sandboxd_taint{taint}` is
    /// `want` (the alert reads it).
    async fn wait_taint_metric(&self, i: usize, taint: &str, want: f64) {
        let vk = &self.members[i].vk;
        let series = format!("vk_sandbox_node_sandboxd_taint{{taint=\"{taint}\"}}");
        wait_for(
            &format!("{series} = {want}"),
            Duration::from_secs(5),
            || async {
                let got = support::metric(&vk.metrics().await, &series);
                if got == Some(want) {
                    Ok(())
                } else {
                    Err(format!("{got:?}"))
                }
            },
        )
        .await;
    }

    fn set_pool(&self, i: usize, spec: &str) {
        let pool = PoolConfig::parse_spec(spec).expect("pool spec");
        self.members[i].sim.sim().set_pool(pool).expect("set pool");
    }
}

#[derive(Debug, Clone, Copy)]
enum Trouble {
    PoolEmptied,
    ClaimCapReached,
    Drained,
    Stopped,
}

impl Trouble {
    /// The condition (type, status, reason) and taint (key, effect) it
    /// shows as.
    fn shows(
        self,
    ) -> (
        (&'static str, &'static str, &'static str),
        (&'static str, &'static str),
    ) {
        match self {
            Trouble::PoolEmptied => (
                ("SandboxdPoolsWarm", "False", "PoolsEmpty"),
                (
                    "sandbox.cocoonstack.io/no-warm-capacity",
                    "PreferNoSchedule",
                ),
            ),
            Trouble::ClaimCapReached => (
                ("SandboxdAtCapacity", "True", "ClaimCapReached"),
                ("sandbox.cocoonstack.io/at-capacity", "NoSchedule"),
            ),
            Trouble::Drained => (
                ("SandboxdDraining", "True", "Draining"),
                ("sandbox.cocoonstack.io/draining", "NoSchedule"),
            ),
            Trouble::Stopped => (
                ("SandboxdReachable", "False", "Unreachable"),
                ("sandbox.cocoonstack.io/unreachable", "NoSchedule"),
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_of_three_spreads_and_steers_around_a_node_that_cannot_serve() {
    let Some(fleet) = support::fleet::setup(|_| Vec::new()).await.map(Steered) else {
        return;
    };
    let nodes: Vec<String> = (0..3).map(|i| fleet.node(i).to_string()).collect();
    // Allocatable follows the claim cap.
    let api: Api<Node> = Api::all(fleet.client());
    for n in &nodes {
        let node = api.get(n).await.expect("node");
        let alloc = node
            .status
            .and_then(|s| s.allocatable)
            .expect("allocatable");
        assert_eq!(alloc["pods"].0, CAP.to_string(), "{n}: {alloc:?}");
    }

    // Three equal nodes: 60 Sandboxes spread 15-25 a node.
    let started = Instant::now();
    let first = fleet.create("spread", 60).await;
    let placed = fleet.wait_running(&first, Duration::from_secs(180)).await;
    let mut per_node: BTreeMap<&str, usize> = nodes.iter().map(|n| (n.as_str(), 0)).collect();
    for node in placed.values() {
        *per_node
            .get_mut(node.as_str())
            .unwrap_or_else(|| panic!("placed on {node}")) += 1;
    }
    println!(
        "60 Sandboxes Running in {:?}: {per_node:?}",
        started.elapsed()
    );
    for (node, count) in &per_node {
        assert!(
            (15..=25).contains(count),
            "{node} got {count} of 60: {per_node:?}"
        );
    }

    for (round, trouble) in [
        Trouble::PoolEmptied,
        Trouble::ClaimCapReached,
        Trouble::Drained,
        Trouble::Stopped,
    ]
    .into_iter()
    .enumerate()
    {
        let ((ctype, cstatus, creason), (tkey, teffect)) = trouble.shows();
        let before = fleet.pods_on(0).await;
        assert!(!before.is_empty(), "{trouble:?}: node 0 runs Sandboxes");
        let since = Instant::now();
        let extra = match trouble {
            Trouble::PoolEmptied => {
                fleet.set_pool(0, &format!("{TEMPLATE}=0/0"));
                vec![]
            }
            Trouble::ClaimCapReached => fleet.fill(0).await,
            Trouble::Drained => {
                fleet.drain(0, true).await;
                vec![]
            }
            Trouble::Stopped => {
                fleet.members[0].sim.sim().set_accepting(false);
                vec![]
            }
        };
        let took = fleet
            .wait_node(
                0,
                &format!("{ctype}={cstatus} and taint {tkey}"),
                since,
                |n| {
                    condition(n, ctype).is_some_and(|(s, r)| s == cstatus && r == creason)
                        && taint_effect(n, tkey).as_deref() == Some(teffect)
                },
            )
            .await;
        println!("{trouble:?}: condition and taint on the Node after {took:?}");
        assert!(
            took <= FOLLOW,
            "{trouble:?}: the Node followed after {took:?}"
        );
        fleet.wait_taint_metric(0, tkey, 1.0).await;

        // The next 20 all go Running elsewhere.
        let next = fleet.create(&format!("r{round}"), 20).await;
        let placed = fleet.wait_running(&next, Duration::from_secs(120)).await;
        let on_it: Vec<&String> = placed
            .iter()
            .filter(|(_, n)| **n == nodes[0])
            .map(|(k, _)| k)
            .collect();
        assert!(
            on_it.is_empty(),
            "{trouble:?}: placed on the troubled node: {on_it:?}"
        );

        // The Node stays Ready (a sandboxd fault is no node fault) and
        // carries no NoExecute taint.
        let node0 = api.get(&nodes[0]).await.expect("node 0");
        assert_eq!(
            condition(&node0, "Ready").map(|(s, _)| s).as_deref(),
            Some("True"),
            "{trouble:?}: the Node went not Ready"
        );
        let taints = node0.spec.and_then(|s| s.taints).unwrap_or_default();
        assert!(
            taints.iter().all(|t| t.effect != "NoExecute"),
            "{trouble:?}: {taints:?}"
        );

        // Its Running sandboxes: still Running and Ready, not written to.
        let after = fleet.pods_on(0).await;
        assert_eq!(
            after,
            before,
            "{trouble:?}: node 0's Running Pods changed (a status write or a Pod gone); log:\n{}",
            tail(&fleet.members[0].vk.logs(), 20)
        );

        // Recovery: schedulable again within 5 s.
        let since = Instant::now();
        match trouble {
            Trouble::PoolEmptied => fleet.set_pool(0, &format!("{TEMPLATE}=30")),
            Trouble::ClaimCapReached => fleet.release(0, &extra).await,
            Trouble::Drained => fleet.drain(0, false).await,
            Trouble::Stopped => fleet.members[0].sim.sim().set_accepting(true),
        }
        let took = fleet
            .wait_node(0, &format!("no taint {tkey}"), since, |n| {
                taint_effect(n, tkey).is_none()
                    && condition(n, ctype).is_some_and(|(s, _)| s != cstatus)
            })
            .await;
        println!("{trouble:?}: recovered; taint gone after {took:?}");
        assert!(
            took <= FOLLOW,
            "{trouble:?}: schedulable again only after {took:?}"
        );
        fleet.wait_taint_metric(0, tkey, 0.0).await;
        fleet.delete(&next).await;
    }
    // Nobody else's taints were touched, and never NoExecute.
    for n in &nodes {
        let node = api.get(n).await.expect("node");
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        assert!(
            taints.iter().all(|t| t.effect != "NoExecute"),
            "{n}: {taints:?}"
        );
        assert!(
            taints
                .iter()
                .any(|t| t.key == "virtual-kubelet.io/provider"),
            "{n}: {taints:?}"
        );
    }
    fleet.delete(&first).await;
    hand_back_to_another_node(&fleet).await;
    fleet.cluster.drop_namespace(&fleet.ns).await;
}

/// A Pod bound to a node that cannot serve it ends Running on another: a
/// Sandbox, a warm pool's Sandbox and a claim's (cold) Sandbox, each with
/// the upstream controller. Node 0 is full (its claim cap reached, its
/// `at-capacity` taint on) and the other two are cordoned; the Pods
/// tolerate the taint, standing in for a scheduler that bound them a moment
/// before the node filled. Node 0 is then cordoned (standing in for the
/// taint the new Pods would not tolerate) and the others uncordoned: past
/// `--hand-back-after` (10 s, the default) node 0 deletes each Pod, its
/// Sandbox makes a new one, and it runs elsewhere within 30 s of the
/// binding. Node 0's sandboxd holds nothing of theirs; each has exactly
/// one sandbox on the node it runs on.
async fn hand_back_to_another_node(fleet: &Steered) {
    use support::controller as ctl;
    let ns = fleet.ns.clone();
    // The Sandboxes deleted before are released first, or their VMs would
    // make room on node 0 after it is filled.
    for i in 0..3 {
        let sim = fleet.members[i].sim.sim();
        wait_for(
            &format!("node {i}'s sandboxd holds nothing"),
            Duration::from_secs(60),
            || async {
                match sim.claims().len() {
                    0 => Ok(()),
                    n => Err(format!("{n} claims")),
                }
            },
        )
        .await;
    }
    let filled = fleet.fill(0).await;
    let (tkey, teffect) = Trouble::ClaimCapReached.shows().1;
    fleet
        .wait_node(0, "at-capacity taint", Instant::now(), |n| {
            taint_effect(n, tkey).as_deref() == Some(teffect)
        })
        .await;
    fleet.cordon(1, true).await;
    fleet.cordon(2, true).await;

    let mut pod_template = fleet.sandbox("x").spec.pod_template;
    pod_template.spec.tolerations.get_or_insert_default().push(
        serde_json::from_value(json!({"key": tkey, "operator": "Exists", "effect": teffect}))
            .expect("toleration"),
    );
    let pod_template = serde_json::to_value(&pod_template).expect("template json");
    let dynamic = |kind: &str| -> Api<DynamicObject> {
        Api::namespaced_with(fleet.client(), &ns, &ctl::resource(kind))
    };
    let post = |kind: &'static str, body: serde_json::Value| {
        let api = dynamic(kind);
        async move {
            let obj: DynamicObject = serde_json::from_value(body).expect("object");
            api.create(&PostParams::default(), &obj)
                .await
                .unwrap_or_else(|e| panic!("create {kind}: {e}"));
        }
    };
    let mut template = ctl::contract_template("hb-template", TEMPLATE, None);
    template["spec"]["podTemplate"] = pod_template.clone();
    post("SandboxTemplate", template).await;
    post(
        "Sandbox",
        json!({
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": "hb-direct"},
            "spec": {"podTemplate": pod_template},
        }),
    )
    .await;
    post(
        "SandboxWarmPool",
        ctl::warm_pool("hb-pool", "hb-template", 1),
    )
    .await;
    post(
        "SandboxWarmPool",
        ctl::warm_pool("hb-cold", "hb-template", 0),
    )
    .await;
    post("SandboxClaim", ctl::sandbox_claim("hb-claim", "hb-cold")).await;

    // Three Pods (one per Sandbox) bound to node 0 and waiting there.
    let pods = fleet.pods();
    let node0 = fleet.node(0).to_string();
    let first: BTreeMap<String, String> = wait_for(
        "three Pods bound to the full node, Pending",
        Duration::from_secs(60),
        || async {
            let list = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let bound: BTreeMap<String, String> = list
                .items
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&node0))
                .filter(|p| {
                    p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("NoWarmCapacity")
                })
                .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
                .collect();
            if bound.len() == 3 {
                Ok(bound)
            } else {
                Err(format!(
                    "{} of {} Pods: {bound:?}",
                    bound.len(),
                    list.items.len()
                ))
            }
        },
    )
    .await;
    let bound = Instant::now();
    fleet.cordon(0, true).await;
    fleet.cordon(1, false).await;
    fleet.cordon(2, false).await;

    // Each Sandbox's Pod: a new one (same name, another UID), Running and
    // Ready on node 1 or 2.
    let names: Vec<String> = first.keys().cloned().collect();
    let placed = fleet.wait_running(&names, Duration::from_secs(60)).await;
    for p in pods.list(&ListParams::default()).await.expect("pods").items {
        if let Some(uid) = first.get(&p.name_any()) {
            assert_ne!(
                p.uid().as_ref(),
                Some(uid),
                "{}: the first Pod",
                p.name_any()
            );
        }
    }
    let took = bound.elapsed();
    println!("handed back and Running elsewhere {took:?} after binding: {placed:?}");
    assert!(
        placed.values().all(|n| *n != node0),
        "a Pod ran on the full node: {placed:?}"
    );
    assert!(
        took <= Duration::from_secs(30),
        "Running elsewhere only after {took:?} (grace included)"
    );

    // Told: a Warning on each first Pod, counted.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(fleet.client(), &ns);
    let handed: BTreeSet<String> = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("HandedBack"))
        .filter_map(|e| e.involved_object.uid)
        .collect();
    for (name, uid) in &first {
        assert!(
            handed.contains(uid),
            "no HandedBack Event on {name}: {handed:?}"
        );
    }
    let vk0 = &fleet.members[0].vk;
    assert_eq!(
        support::metric(
            &vk0.metrics().await,
            "vk_sandbox_pods_handed_back_total{how=\"deleted\"}"
        ),
        Some(3.0)
    );

    // Nothing left behind: node 0 holds none of theirs; each runs on
    // exactly one sandbox.
    let mine = |i: usize| -> Vec<String> {
        fleet.members[i]
            .sim
            .sim()
            .claims()
            .into_iter()
            .filter(|c| c.claim_ref.starts_with(&format!("{ns}/hb-")))
            .map(|c| c.claim_ref)
            .collect()
    };
    assert!(mine(0).is_empty(), "node 0's sandboxd holds {:?}", mine(0));
    let mut elsewhere: Vec<String> = [mine(1), mine(2)].concat();
    elsewhere.sort();
    assert_eq!(elsewhere.len(), 3, "{elsewhere:?}");
    for name in first.keys() {
        let key = format!("{ns}/{name}");
        assert_eq!(
            elsewhere.iter().filter(|r| r.starts_with(&key)).count(),
            1,
            "{key}: {elsewhere:?}"
        );
    }

    fleet.cordon(0, false).await;
    fleet.release(0, &filled).await;
}
