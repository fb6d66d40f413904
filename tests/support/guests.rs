//! agent-sandbox v1.0.3's in-sandbox runtimes as the guest services of the
//! sandboxd simulator, behind vk-sandbox with `--pod-cidr` and
//! `--pod-netns`: what the tests of its own clients (router, SDK) at Pod
//! addresses share. Guest port 8080 (REST) and 9090 (gRPC) lead to
//! `packages/sandboxd`, 8888 to the legacy Python runtime (the API the SDK
//! speaks through the router); two templates, `guarded` (agent-sandbox's
//! default managed NetworkPolicy) and `open` (`networkPolicyManagement:
//! Unmanaged`), each with a warm pool of one.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::api::{DynamicObject, ListParams, PostParams};
use sandboxd_sim::SimHandle;
use serde_json::{Value, json};

use super::controller::{self as ctl, SandboxController};
use super::upstream::{self, Child, Runtime};
use super::vk::{VkUnderTest, tail};
use super::{TestCluster, wait_for};

const TOKEN: &str = "router-token";
pub const TEMPLATE: &str = "base:24.04";
/// Where agent-sandbox's managed policy lets connections come from.
pub const ROUTER_NS: &str = "agent-sandbox-system";

pub struct Guests {
    pub vk: VkUnderTest,
    pub sim: SimHandle,
    pub ns: String,
    /// The SDK driver (e2e/sdk-driver) and the sandbox-router binaries.
    pub driver: PathBuf,
    pub router_bin: PathBuf,
    _runtime: Runtime,
    _legacy: Child,
    _controller: SandboxController,
}

impl Guests {
    /// The runtimes, the simulator, vk-sandbox answering Pod addresses of
    /// `range` inside the network namespace `netns`, agent-sandbox's
    /// controller, the router's namespace and the two templates with their
    /// pools (the managed policy made).
    pub async fn start(cluster: &TestCluster, prefix: &str, range: &str, netns: &Path) -> Guests {
        let (runtime_bin, driver) = upstream::sdk();
        let router_bin = upstream::built("router").remove(0);
        let runtime = Runtime::start(&runtime_bin).await;
        let (legacy, legacy_port) = upstream::legacy_runtime().await;
        let mut cfg = super::sim::config(TOKEN, &[&format!("{TEMPLATE}=4")]);
        cfg.wake_delay_ms = 0;
        super::sim::lead_template_ports(
            &mut cfg,
            TEMPLATE,
            &[
                (8080, runtime.rest),
                (9090, runtime.grpc),
                (8888, legacy_port),
            ],
        );
        let sim = super::sim::start(cfg).await;
        let token_file = super::sim::token_file(&super::vk::test_dir(prefix), TOKEN);
        let mut args = super::sim::vk_args(&sim, Some(&token_file));
        args.push(format!("--pod-cidr={range}"));
        args.push(format!("--pod-netns={}", netns.display()));
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let vk = VkUnderTest::start(cluster, prefix, &argv).await;
        vk.wait_ready(&cluster.client, Duration::from_secs(30))
            .await;
        ctl::install_crds(&cluster.client, &cluster.kubeconfig).await;
        let ns = cluster.namespace(prefix).await;
        let controller = ctl::start(&cluster.client, &cluster.kubeconfig, &ns).await;
        let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
        let router_ns: Namespace = super::from_json(json!({"metadata": {"name": ROUTER_NS}}));
        let _ = namespaces.create(&PostParams::default(), &router_ns).await;
        let guests = Guests {
            vk,
            sim,
            ns,
            driver,
            router_bin,
            _runtime: runtime,
            _legacy: legacy,
            _controller: controller,
        };
        guests.templates(cluster).await;
        guests
    }

    fn api(&self, cluster: &TestCluster, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(cluster.client.clone(), &self.ns, &ctl::resource(kind))
    }

    fn template(&self, name: &str, unmanaged: bool) -> Value {
        let mut t = ctl::contract_template(name, TEMPLATE, Some(&self.vk.node));
        t["spec"]["podTemplate"]["spec"]["containers"][0]["ports"] = json!([
            {"containerPort": 8080, "name": "rest"},
            {"containerPort": 9090, "name": "grpc"},
            {"containerPort": 8888, "name": "legacy"},
        ]);
        if unmanaged {
            t["spec"]["networkPolicyManagement"] = json!("Unmanaged");
        }
        t
    }

    async fn templates(&self, cluster: &TestCluster) {
        for (kind, obj) in [
            ("SandboxTemplate", self.template("guarded", false)),
            ("SandboxTemplate", self.template("open", true)),
            (
                "SandboxWarmPool",
                ctl::warm_pool("guarded-pool", "guarded", 1),
            ),
            ("SandboxWarmPool", ctl::warm_pool("open-pool", "open", 1)),
        ] {
            let obj: DynamicObject = serde_json::from_value(obj).expect("object json");
            self.api(cluster, kind)
                .create(&PostParams::default(), &obj)
                .await
                .unwrap_or_else(|e| panic!("create {kind}: {e}"));
        }
        let policies: Api<NetworkPolicy> = Api::namespaced(cluster.client.clone(), &self.ns);
        let managed = wait_for(
            "the managed NetworkPolicy of template guarded",
            Duration::from_secs(60),
            || async {
                let list = policies
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                list.items
                    .into_iter()
                    .next()
                    .ok_or_else(|| "none yet".to_string())
            },
        )
        .await;
        println!(
            "guests: managed policy {}",
            managed.metadata.name.unwrap_or_default()
        );
    }

    /// The runtime's health through the router at `127.0.0.1:front`, for
    /// the sandbox `sandbox` at `pod_ip` (the headers agent-sandbox's
    /// clients send): its body once it answers with a success.
    pub async fn health_through_router(&self, front: u16, sandbox: &str, pod_ip: IpAddr) -> String {
        let http = reqwest::Client::new();
        wait_for(
            "the runtime's health through the router",
            Duration::from_secs(30),
            || async {
                let r = http
                    .get(format!("http://127.0.0.1:{front}/v1/health"))
                    .header("X-Sandbox-ID", sandbox)
                    .header("X-Sandbox-Namespace", &self.ns)
                    .header("X-Sandbox-Port", "8080")
                    .header("X-Sandbox-Pod-IP", pod_ip.to_string())
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                status.is_success().then_some(body.clone()).ok_or(format!(
                    "{status}: {body}; log:\n{}",
                    tail(&self.vk.logs(), 10)
                ))
            },
        )
        .await
    }

    /// The Go SDK in its router (direct-URL) mode through the router at
    /// `127.0.0.1:front`, claiming from `guarded-pool`: it runs a command
    /// and moves a file, and vk-sandbox admitted the router's address
    /// `router_ip` to the guest's 8888 by the managed policy.
    pub async fn sdk_through_router(&self, cluster: &TestCluster, front: u16, router_ip: IpAddr) {
        let steps = upstream::drive(
            tokio::process::Command::new(&self.driver)
                .args([
                    "guarded-pool",
                    &self.ns,
                    &format!("router=http://127.0.0.1:{front}"),
                ])
                .env("KUBECONFIG", &cluster.kubeconfig),
            &self.vk,
            "the SDK through the router",
        )
        .await;
        upstream::ran_and_moved_a_file(&steps);
        let logs = self.vk.logs();
        assert!(
            logs.contains(&format!(
                "source={router_ip} port=8888 why=allowed by NetworkPolicy"
            )),
            "the SDK's requests reached the guest's 8888 through the Pod address:\n{}",
            tail(&logs, 20)
        );
    }

    /// A Pod of the warm pool `pool` Running at its address: its name (the
    /// Sandbox's) and address.
    pub async fn pool_pod(&self, cluster: &TestCluster, pool: &str) -> (String, IpAddr) {
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &self.ns);
        wait_for(
            &format!("the {pool}'s Pod Running at its address"),
            Duration::from_secs(120),
            || async {
                let list = pods
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                list.items
                    .iter()
                    .filter(|p| {
                        p.metadata
                            .name
                            .as_deref()
                            .is_some_and(|n| n.starts_with(pool))
                    })
                    .find_map(|p| {
                        let st = p.status.as_ref()?;
                        (st.phase.as_deref() == Some("Running")).then_some(())?;
                        Some((
                            p.metadata.name.clone()?,
                            st.pod_ip.as_deref()?.parse().ok()?,
                        ))
                    })
                    .ok_or(format!(
                        "{} Pods; log:\n{}",
                        list.items.len(),
                        tail(&self.vk.logs(), 10)
                    ))
            },
        )
        .await
    }
}
