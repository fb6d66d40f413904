//! Every sandbox a network endpoint (docs/pod-network.md), end to end: the
//! real local control plane, the sandboxd simulator and the vk-sandbox
//! binary with `--pod-cidr` and `--pod-netns`. The Pod range lives in a
//! network namespace this test makes (and removes): vk-sandbox answers
//! Pod addresses there, and the test's clients connect from there, so no
//! private-range address is ever a target in the host's own namespace.
//! Each sandbox's guest port 8080 leads (the simulator's port map) to a
//! loopback server of the test that names the sandbox.

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use kube::{Api, Client};
use sandboxd_sim::SimHandle;
use serde_json::json;
use support::netns::{TestNetns, naming_server};
use support::vk::{VkUnderTest, tail};
use support::{TestCluster, wait_for};

const TOKEN: &str = "root-token-podnet";
const RANGE: &str = "10.250.7.0/24";

struct Env {
    cluster: TestCluster,
    sim: SimHandle,
    vk: VkUnderTest,
    ns: String,
    net: TestNetns,
    args: Vec<String>,
}

async fn setup(prefix: &str) -> Option<Env> {
    let cluster = support::cluster().await?;
    let net = TestNetns::make_or_skip("vkpod", RANGE)?;
    support::controller::install_crds(&cluster.client, &cluster.kubeconfig).await;
    let sim = support::sim::start(support::sim::config(TOKEN, &["base:24.04=4"])).await;
    let token_file = support::sim::token_file(&support::vk::test_dir(prefix), TOKEN);
    let mut args = support::sim::vk_args(&sim, Some(&token_file));
    args.push(format!("--pod-cidr={RANGE}"));
    args.push(format!("--pod-netns={}", net.path().display()));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let vk = VkUnderTest::start(&cluster, prefix, &argv).await;
    vk.wait_ready(&cluster.client, Duration::from_secs(30))
        .await;
    let ns = cluster.namespace(prefix).await;
    Some(Env {
        cluster,
        sim,
        vk,
        ns,
        net,
        args,
    })
}

impl Env {
    fn client(&self) -> Client {
        self.cluster.client.clone()
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client(), &self.ns)
    }

    async fn create_sandbox(&self, name: &str) -> String {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client(),
            &self.ns,
            &support::controller::resource("Sandbox"),
        );
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": name},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "agent", "image": "base:24.04"}]}}}
        }))
        .expect("sandbox json");
        api.create(&PostParams::default(), &obj)
            .await
            .expect("create Sandbox")
            .metadata
            .uid
            .expect("uid")
    }

    /// A Pod as the agent-sandbox controller makes it, bound here,
    /// declaring TCP port 8080 (and 9090, whose guest side nothing
    /// listens on).
    async fn create_pod(&self, name: &str, owner: &str) -> Pod {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "podnet"},
                "annotations": {"sandbox.cocoonstack.io/runtime": "sandboxd",
                                "sandbox.cocoonstack.io/template": "base:24.04"},
                "ownerReferences": [{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                    "name": name, "uid": owner, "controller": true, "blockOwnerDeletion": true}]},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": self.vk.node},
                "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "agent", "image": "base:24.04",
                    "ports": [{"containerPort": 8080, "name": "http"}, {"containerPort": 9090}]}]
            }
        }))
        .expect("pod json");
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .expect("create Pod")
    }

    /// The Pod Running: its claim id and Pod address.
    async fn running(&self, name: &str) -> (String, Ipv4Addr) {
        let log = || format!("; log:\n{}", tail(&self.vk.logs(), 20));
        support::running_address(&self.pods(), name, Duration::from_secs(30), log).await
    }

    /// The sandbox's guest port 8080 leads to `target`.
    fn map_8080(&self, id: &str, target: SocketAddr) {
        support::sim::lead_sandbox_port(&self.sim, id, 8080, target);
    }

    /// Until `PODIP:port` answers `want` (listeners are made within a
    /// second of a Pod's change).
    async fn answers(&self, ip: Ipv4Addr, port: u16, want: &str) {
        let addr = SocketAddr::from((ip, port));
        wait_for(
            &format!("{addr} answers {want}"),
            Duration::from_secs(15),
            || async {
                match self.net.ask(addr) {
                    Ok(got) if got == want => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await
    }

    /// Until `PODIP:port` refuses (no listener) or resets.
    async fn refuses(&self, ip: Ipv4Addr, port: u16) -> String {
        let addr = SocketAddr::from((ip, port));
        wait_for(
            &format!("{addr} refuses"),
            Duration::from_secs(15),
            || async {
                match self.net.ask(addr) {
                    Ok(got) => Err(format!("answered {got:?}")),
                    Err(e) => Ok(e),
                }
            },
        )
        .await
    }

    fn sandboxes(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client(),
            &self.ns,
            &support::controller::resource("Sandbox"),
        )
    }

    /// Sets the Sandbox's `spec.operatingMode` (`Suspended`, `Running`).
    async fn set_mode(&self, name: &str, mode: &str) {
        support::controller::set_operating_mode(&self.sandboxes(), name, mode).await
    }

    /// Until the simulator holds sandbox `id` hibernated (or awake).
    async fn wait_hibernated(&self, id: &str, hibernated: bool) {
        wait_for(
            &format!("sandbox {id} hibernated={hibernated}"),
            Duration::from_secs(60),
            || async {
                let row = self.sim.sim().claims().into_iter().find(|c| c.id == id);
                match row {
                    Some(c) if c.hibernated == hibernated => Ok(()),
                    other => Err(format!(
                        "hibernated {:?}; log:\n{}",
                        other.map(|c| c.hibernated),
                        tail(&self.vk.logs(), 10)
                    )),
                }
            },
        )
        .await
    }

    async fn finish(self) {
        self.cluster.drop_namespace(&self.ns).await;
        self.vk.delete_node(&self.cluster.client).await;
    }
}

/// Two sandboxes get two addresses of the range; each address reaches its
/// own VM; a port the Pod does not declare has no listener; a declared
/// port nothing listens on in the guest is refused at once; a Service
/// selecting both Pods lists both addresses in its EndpointSlices.
#[tokio::test(flavor = "multi_thread")]
async fn each_sandbox_answers_on_its_own_pod_address() {
    let Some(env) = setup("vk-podnet").await else {
        return;
    };
    let (a_uid, b_uid) = (env.create_sandbox("a").await, env.create_sandbox("b").await);
    env.create_pod("a", &a_uid).await;
    env.create_pod("b", &b_uid).await;
    let (a_id, a_ip) = env.running("a").await;
    let (b_id, b_ip) = env.running("b").await;
    // Listening before the Pod is reported Running: a connection made as
    // soon as the address is read is accepted (and reset by the relay, as
    // nothing serves the guest port yet), not refused by the kernel.
    let first = env.net.ask(SocketAddr::from((b_ip, 8080)));
    assert!(
        !format!("{first:?}").contains("Connection refused"),
        "{b_ip}:8080 refused right after the Pod was reported Running: {first:?}"
    );
    assert_ne!(a_ip, b_ip, "two sandboxes, one address");
    let range = vk_sandbox::podnet::range::PodRange::parse(RANGE).expect("range");
    assert!(
        range.contains(a_ip) && range.contains(b_ip),
        "{a_ip} {b_ip}"
    );
    env.map_8080(&a_id, naming_server("vm-a").await);
    env.map_8080(&b_id, naming_server("vm-b").await);
    env.answers(a_ip, 8080, "vm-a").await;
    env.answers(b_ip, 8080, "vm-b").await;
    // Undeclared: the kernel refuses (nothing listens there).
    let why = env.refuses(a_ip, 7070).await;
    assert!(why.contains("refused"), "{why}");
    // Declared, nothing listening in the guest: reset at once, not hung.
    let started = std::time::Instant::now();
    let why = env.refuses(a_ip, 9090).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}: {why}",
        started.elapsed()
    );

    // A Service over both Pods: both addresses in its EndpointSlices.
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "podnet"},
        "spec": {"selector": {"app": "podnet"}, "ports": [{"port": 80, "targetPort": 8080}]}
    }))
    .expect("service json");
    Api::<Service>::namespaced(env.client(), &env.ns)
        .create(&PostParams::default(), &svc)
        .await
        .expect("create Service");
    let slices: Api<EndpointSlice> = Api::namespaced(env.client(), &env.ns);
    let want = {
        let mut v = vec![a_ip.to_string(), b_ip.to_string()];
        v.sort();
        v
    };
    wait_for(
        "the Service's EndpointSlices",
        Duration::from_secs(30),
        || async {
            let list = slices
                .list(&ListParams::default().labels("kubernetes.io/service-name=podnet"))
                .await
                .map_err(|e| e.to_string())?;
            let mut got: Vec<String> = list
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter())
                .flat_map(|e| e.addresses.iter().cloned())
                .collect();
            got.sort();
            if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        },
    )
    .await;
    env.finish().await;
}

/// The address is the claim's: the same across delete-and-adopt,
/// suspend/resume and a `kill -9` of vk-sandbox; once the sandbox is released (its owner
/// gone), the address refuses.
#[tokio::test(flavor = "multi_thread")]
async fn the_address_follows_the_claim_and_goes_with_it() {
    let Some(mut env) = setup("vk-podnet-keep").await else {
        return;
    };
    let uid = env.create_sandbox("k").await;
    let first = env.create_pod("k", &uid).await;
    let (id, ip) = env.running("k").await;
    env.map_8080(&id, naming_server("vm-k").await);
    env.answers(ip, 8080, "vm-k").await;

    // The Pod deleted while its Sandbox lives (preserved), then made again
    // by the controller: the same sandbox, the same address.
    env.pods()
        .delete("k", &DeleteParams::default())
        .await
        .expect("delete");
    let old = first.metadata.uid.clone().unwrap_or_default();
    let pods = env.pods();
    wait_for("the old Pod gone", Duration::from_secs(30), || async {
        match pods.get_opt("k").await.map_err(|e| e.to_string())? {
            Some(p) if p.metadata.uid.as_deref() == Some(old.as_str()) => Err("still there".into()),
            _ => Ok(()),
        }
    })
    .await;
    env.create_pod("k", &uid).await;
    let (again_id, again_ip) = env.running("k").await;
    assert_eq!(
        (again_id.as_str(), again_ip),
        (id.as_str(), ip),
        "adopted elsewhere"
    );
    env.answers(ip, 8080, "vm-k").await;

    // Suspended (the Pod deleted as agent-sandbox deletes it, the VM
    // hibernated), then resumed: the woken VM answers at the same address,
    // and while it sleeps with no Pod nothing answers there.
    env.set_mode("k", "Suspended").await;
    env.pods()
        .delete("k", &DeleteParams::default())
        .await
        .expect("delete the suspended Sandbox's Pod");
    env.wait_hibernated(&id, true).await;
    support::wait_pod_gone(&env.pods(), "k", || tail(&env.vk.logs(), 10)).await;
    let asleep = env.refuses(ip, 8080).await;
    env.set_mode("k", "Running").await;
    env.create_pod("k", &uid).await;
    let (woken_id, woken_ip) = env.running("k").await;
    assert_eq!(
        (woken_id.as_str(), woken_ip),
        (id.as_str(), ip),
        "resumed on another sandbox or address (asleep: {asleep})"
    );
    env.wait_hibernated(&id, false).await;
    env.answers(ip, 8080, "vm-k").await;

    // kill -9 and a restart: the address is durable with the claim.
    env.vk.process.signal(nix::sys::signal::Signal::SIGKILL);
    env.vk.process.wait_exit(Duration::from_secs(10));
    let argv: Vec<&str> = env.args.iter().map(String::as_str).collect();
    env.vk.restart(&argv);
    env.answers(ip, 8080, "vm-k").await;
    assert!(
        env.vk.logs().contains("Pod address listening"),
        "{}",
        tail(&env.vk.logs(), 20)
    );

    // The owner gone: the sandbox is released and its address refuses.
    env.sandboxes()
        .delete("k", &DeleteParams::default())
        .await
        .expect("delete the Sandbox");
    env.pods()
        .delete("k", &DeleteParams::default())
        .await
        .expect("delete the Pod");
    wait_for("the sandbox released", Duration::from_secs(30), || async {
        if env.sim.sim().claims().iter().any(|c| c.id == id) {
            Err("still claimed".to_string())
        } else {
            Ok(())
        }
    })
    .await;
    // Reset while the Pod goes (its lookup fails), then no listener at all.
    let addr = SocketAddr::from((ip, 8080));
    wait_for(
        &format!("{addr} closed"),
        Duration::from_secs(15),
        || async {
            match env.net.ask(addr) {
                Err(e) if e.contains("refused") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    env.finish().await;
}
