//! A fleet of three sandboxd nodes on the local plane (issue 39's test
//! tier): three vk-sandbox processes, each with its own sandboxd
//! simulator, and the Sandbox controller (upstream agent-sandbox; the
//! stand-in only where it cannot run). The default scheduler places the
//! Sandboxes. tests/e2e_fleet.rs and tests/e2e_placement.rs build on it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use sandbox_controller::Sandbox;
use sandboxd_sim::SimHandle;
use serde_json::json;

use super::vk::VkUnderTest;
use super::{TestCluster, wait_for};

pub const TOKEN: &str = "fleet-root-token";
pub const TEMPLATE: &str = "base:24.04";
/// sandboxd's `max_claims` on every node, and `--sandboxd-max-claims`.
pub const CAP: usize = 80;
/// The label the three Nodes share and the Sandboxes select (other tests'
/// virtual nodes may share the cluster).
pub const GROUP_LABEL: &str = "fleet.vk-sandbox.test/group";
/// How soon the Node follows sandboxd (the figure).
pub const FOLLOW: Duration = Duration::from_secs(5);

pub struct Member {
    pub sim: SimHandle,
    pub vk: VkUnderTest,
}

pub struct Fleet {
    pub cluster: TestCluster,
    pub members: Vec<Member>,
    pub ns: String,
    pub group: String,
    _controller: super::controller::SandboxController,
}

/// The fleet, or `None` without a cluster. `extra(i)`: more flags for
/// node `i`'s vk-sandbox.
pub async fn setup(extra: impl Fn(usize) -> Vec<String>) -> Option<Fleet> {
    let cluster = super::cluster().await?;
    super::controller::install_crds(&cluster.client, &cluster.kubeconfig).await;
    let group = super::suffix();
    let mut members = Vec::new();
    for i in 0..3 {
        let mut cfg = super::sim::config(TOKEN, &[&format!("{TEMPLATE}=30")]);
        cfg.max_claims = CAP as u32;
        cfg.refill_delay_ms = 20;
        cfg.provision_delay_ms = 10;
        let sim = super::sim::start(cfg).await;
        let prefix = format!("fleet{i}");
        let token_file = super::sim::token_file(&super::vk::test_dir(&prefix), TOKEN);
        let mut args = super::sim::vk_args(&sim, Some(&token_file));
        args.extend([
            format!("--node-labels=sandbox.cocoonstack.io/runtime=sandboxd,{GROUP_LABEL}={group}"),
            "--node-taints-from-sandboxd=true".into(),
            format!("--sandboxd-max-claims={CAP}"),
        ]);
        args.extend(extra(i));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let vk = VkUnderTest::start(&cluster, &prefix, &args).await;
        members.push(Member { sim, vk });
    }
    for m in &members {
        m.vk.wait_ready(&cluster.client, Duration::from_secs(60))
            .await;
    }
    let ns = cluster.namespace("fleet").await;
    let controller = super::controller::start(&cluster.client, &cluster.kubeconfig, &ns).await;
    Some(Fleet {
        cluster,
        members,
        ns,
        group,
        _controller: controller,
    })
}

pub fn running_and_ready(p: &Pod) -> bool {
    let st = p.status.as_ref();
    let phase = st.and_then(|s| s.phase.as_deref()) == Some("Running");
    let ready = st
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    phase && ready && p.metadata.deletion_timestamp.is_none()
}

impl Fleet {
    pub fn client(&self) -> Client {
        self.cluster.client.clone()
    }

    /// Cordons (`true`) or uncordons node `i`, as `kubectl cordon` does.
    pub async fn cordon(&self, i: usize, on: bool) {
        let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client());
        let patch = json!({"spec": {"unschedulable": on}});
        api.patch(
            self.node(i),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap_or_else(|e| panic!("cordon {} {on}: {e}", self.node(i)));
    }

    fn http(&self) -> reqwest::Client {
        reqwest::Client::new()
    }

    /// Another client of node `i`'s sandboxd claims until it is at its cap
    /// (a `429`: vk-sandbox may be claiming there at the same time);
    /// returns the ids claimed.
    pub async fn fill(&self, i: usize) -> Vec<String> {
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
            if r.status().as_u16() == 429 {
                break;
            }
            assert!(r.status().is_success(), "claim {k}: {}", r.status());
            let body: serde_json::Value = r.json().await.expect("claim body");
            ids.push(body["id"].as_str().expect("id").to_string());
        }
        ids
    }

    pub async fn release(&self, i: usize, ids: &[String]) {
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

    pub async fn drain(&self, i: usize, on: bool) {
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

    pub fn node(&self, i: usize) -> &str {
        &self.members[i].vk.node
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client(), &self.ns)
    }

    /// A Sandbox whose Pod carries the contract and selects the fleet's
    /// Nodes (not one of them: the scheduler chooses).
    pub fn sandbox(&self, name: &str) -> Sandbox {
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
                "tolerations": [super::controller::provider_toleration()],
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
    pub async fn create(&self, prefix: &str, n: usize) -> Vec<String> {
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

    pub async fn delete(&self, names: &[String]) {
        let api: Api<Sandbox> = Api::namespaced(self.client(), &self.ns);
        for name in names {
            let _ = api.delete(name, &DeleteParams::default()).await;
        }
    }

    /// Waits until every named Sandbox's Pod is Running and Ready; returns
    /// name → node.
    pub async fn wait_running(
        &self,
        names: &[String],
        timeout: Duration,
    ) -> BTreeMap<String, String> {
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
    pub async fn pods_on(&self, i: usize) -> BTreeMap<String, String> {
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
}
