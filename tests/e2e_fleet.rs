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
//!
//! One test, the scenarios in turn, so the fleet is set up once (a few
//! minutes in all).

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use sandbox_controller::Sandbox;
use sandboxd_sim::{PoolConfig, SimHandle};
use serde_json::json;
use support::vk::{VkUnderTest, tail};
use support::{TestCluster, wait_for};

const TOKEN: &str = "fleet-root-token";
const TEMPLATE: &str = "base:24.04";
/// sandboxd's `max_claims` on every node, and `--sandboxd-max-claims`.
const CAP: usize = 80;
/// The label the three Nodes share and the Sandboxes select (other tests'
/// virtual nodes may share the cluster).
const GROUP_LABEL: &str = "fleet.vk-sandbox.test/group";
/// How soon the Node follows sandboxd (the figure).
const FOLLOW: Duration = Duration::from_secs(5);

struct Member {
    sim: SimHandle,
    vk: VkUnderTest,
}

struct Fleet {
    cluster: TestCluster,
    members: Vec<Member>,
    ns: String,
    group: String,
    _controller: support::controller::SandboxController,
}

async fn setup() -> Option<Fleet> {
    let cluster = support::cluster().await?;
    support::controller::install_crds(&cluster.client, &cluster.kubeconfig).await;
    let group = support::suffix();
    let mut members = Vec::new();
    for i in 0..3 {
        let mut cfg = support::sim::config(TOKEN, &[&format!("{TEMPLATE}=30")]);
        cfg.max_claims = CAP as u32;
        cfg.refill_delay_ms = 20;
        cfg.provision_delay_ms = 10;
        let sim = support::sim::start(cfg).await;
        let prefix = format!("fleet{i}");
        let token_file = support::sim::token_file(&support::vk::test_dir(&prefix), TOKEN);
        let mut args = support::sim::vk_args(&sim, Some(&token_file));
        args.extend([
            format!("--node-labels=sandbox.cocoonstack.io/runtime=sandboxd,{GROUP_LABEL}={group}"),
            "--node-taints-from-sandboxd=true".into(),
            format!("--sandboxd-max-claims={CAP}"),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let vk = VkUnderTest::start(&cluster, &prefix, &args).await;
        members.push(Member { sim, vk });
    }
    for m in &members {
        m.vk.wait_ready(&cluster.client, Duration::from_secs(60))
            .await;
    }
    let ns = cluster.namespace("fleet").await;
    let controller = support::controller::start(&cluster.client, &cluster.kubeconfig, &ns).await;
    Some(Fleet {
        cluster,
        members,
        ns,
        group,
        _controller: controller,
    })
}

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

fn running_and_ready(p: &Pod) -> bool {
    let st = p.status.as_ref();
    let phase = st.and_then(|s| s.phase.as_deref()) == Some("Running");
    let ready = st
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    phase && ready && p.metadata.deletion_timestamp.is_none()
}

impl Fleet {
    fn client(&self) -> Client {
        self.cluster.client.clone()
    }

    fn node(&self, i: usize) -> &str {
        &self.members[i].vk.node
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client(), &self.ns)
    }

    /// A Sandbox whose Pod carries the contract and selects the fleet's
    /// Nodes (not one of them: the scheduler chooses).
    fn sandbox(&self, name: &str) -> Sandbox {
        let tmpl = json!({
            "metadata": {"annotations": {
                "sandbox.cocoonstack.io/runtime": "sandboxd",
                "sandbox.cocoonstack.io/template": TEMPLATE,
            }},
            "spec": {
                "nodeSelector": {
                    "sandbox.cocoonstack.io/runtime": "sandboxd",
                    GROUP_LABEL: self.group,
                },
                "tolerations": [support::controller::provider_toleration()],
                "containers": [{"name": "agent", "image": TEMPLATE}],
            }
        });
        serde_json::from_value(json!({
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": name},
            "spec": {"podTemplate": tmpl},
        }))
        .expect("sandbox json")
    }

    /// Creates `n` Sandboxes `<prefix>-<k>`, a few at a time; returns their
    /// names.
    async fn create(&self, prefix: &str, n: usize) -> Vec<String> {
        let api: Api<Sandbox> = Api::namespaced(self.client(), &self.ns);
        let names: Vec<String> = (0..n).map(|k| format!("{prefix}-{k}")).collect();
        futures::stream::iter(names.clone())
            .map(|name| {
                let api = api.clone();
                let sb = self.sandbox(&name);
                async move {
                    api.create(&PostParams::default(), &sb)
                        .await
                        .unwrap_or_else(|e| panic!("create Sandbox {name}: {e}"));
                }
            })
            .buffer_unordered(4)
            .collect::<Vec<()>>()
            .await;
        names
    }

    async fn delete(&self, names: &[String]) {
        let api: Api<Sandbox> = Api::namespaced(self.client(), &self.ns);
        for name in names {
            let _ = api.delete(name, &DeleteParams::default()).await;
        }
    }

    /// Waits until every named Sandbox's Pod is Running and Ready; returns
    /// name → node.
    async fn wait_running(&self, names: &[String], timeout: Duration) -> BTreeMap<String, String> {
        let pods = self.pods();
        wait_for(
            &format!("{} Sandbox Pods Running and Ready", names.len()),
            timeout,
            || async {
                let list = pods
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let by_name: BTreeMap<String, &Pod> = list
                    .items
                    .iter()
                    .map(|p| (p.metadata.name.clone().unwrap_or_default(), p))
                    .collect();
                let mut placed = BTreeMap::new();
                let mut waiting = Vec::new();
                for name in names {
                    match by_name.get(name) {
                        Some(p) if running_and_ready(p) => {
                            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                            placed.insert(name.clone(), node.unwrap_or_default());
                        }
                        Some(p) => waiting.push(format!(
                            "{name} on {:?}: {:?}",
                            p.spec.as_ref().and_then(|s| s.node_name.clone()),
                            p.status
                                .as_ref()
                                .and_then(|s| s.reason.clone().or(s.phase.clone()))
                        )),
                        None => waiting.push(format!("{name}: no Pod")),
                    }
                }
                if waiting.is_empty() {
                    Ok(placed)
                } else {
                    Err(format!(
                        "{} waiting, e.g. {:?}",
                        waiting.len(),
                        &waiting[..waiting.len().min(3)]
                    ))
                }
            },
        )
        .await
    }

    /// The Running Pods on node `i`: name → resourceVersion.
    async fn pods_on(&self, i: usize) -> BTreeMap<String, String> {
        let list = self
            .pods()
            .list(&ListParams::default())
            .await
            .expect("list pods");
        list.items
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.node(i)))
            .filter(|p| running_and_ready(p))
            .map(|p| {
                (
                    p.metadata.name.clone().unwrap_or_default(),
                    p.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

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

    fn http(&self) -> reqwest::Client {
        reqwest::Client::new()
    }

    /// Another client of node `i`'s sandboxd claims until it is at its cap;
    /// returns the ids claimed.
    async fn fill(&self, i: usize) -> Vec<String> {
        let sim = &self.members[i].sim;
        let claimed = sim.sim().claims().len();
        let mut ids = Vec::new();
        for k in claimed..CAP {
            let r = self
                .http()
                .post(format!("{}/v1/claim", sim.base_url()))
                .bearer_auth(TOKEN)
                .json(&json!({"template": TEMPLATE, "claim_ref": format!("other-client/{k}")}))
                .send()
                .await
                .expect("claim");
            assert!(r.status().is_success(), "claim {k}: {}", r.status());
            let body: serde_json::Value = r.json().await.expect("claim body");
            ids.push(body["id"].as_str().expect("id").to_string());
        }
        ids
    }

    async fn release(&self, i: usize, ids: &[String]) {
        let sim = &self.members[i].sim;
        for id in ids {
            let r = self
                .http()
                .post(format!("{}/v1/sandboxes/{id}/release", sim.base_url()))
                .bearer_auth(TOKEN)
                .send()
                .await
                .expect("release");
            assert_eq!(r.status().as_u16(), 204, "release {id}");
        }
    }

    async fn drain(&self, i: usize, on: bool) {
        let sim = &self.members[i].sim;
        let method = if on {
            reqwest::Method::POST
        } else {
            reqwest::Method::DELETE
        };
        let r = self
            .http()
            .request(method, format!("{}/v1/drain", sim.base_url()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("drain");
        assert_eq!(r.status().as_u16(), 204);
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
    let Some(fleet) = setup().await else {
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
    fleet.cluster.drop_namespace(&fleet.ns).await;
}
