//! Ingress NetworkPolicy at the Pod-IP relay, end to end
//! (docs/networkpolicy.md): the vk-sandbox binary with `--pod-cidr` and
//! `--pod-netns` (as the ServiceAccount of manifests/rbac.yaml), the
//! sandboxd simulator, a client in a network namespace of the test's (as
//! in tests/e2e_pod_network.rs: no private-range address is a target in
//! the host's own namespace). A policy selecting the sandbox's Pod closes
//! its address to the client, a change that allows the client's address
//! opens it, an `except` closes it again, and deleting the policy opens
//! it: each within 5 s of the change.

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use support::netns::{TestNetns, naming_server};
use support::vk::{VkUnderTest, tail};
use support::wait_for;

const TOKEN: &str = "root-token-netpol";
const RANGE: &str = "10.250.9.0/24";
const FLIP_LIMIT: Duration = Duration::from_secs(5);

/// Until `addr` answers (`open`) or refuses, polled from `net`; how long
/// since `start` (before the change was sent) is printed.
async fn until(
    net: &TestNetns,
    (addr, open): (SocketAddr, bool),
    what: &str,
    vk: &VkUnderTest,
    start: Instant,
) {
    loop {
        let got = net.ask(addr);
        if got.is_ok() == open {
            eprintln!(
                "netpol e2e: {what}: {} after {:?} ({got:?})",
                if open { "open" } else { "closed" },
                start.elapsed()
            );
            return;
        }
        assert!(
            start.elapsed() < FLIP_LIMIT,
            "{what}: {addr} still {got:?} after {FLIP_LIMIT:?}; vk-sandbox log:\n{}",
            tail(&vk.logs(), 30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_policy_selecting_the_pod_decides_who_reaches_its_address() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let Some(net) = TestNetns::make_or_skip("vknp", RANGE) else {
        return;
    };
    let prefix = "vk-podnet-np";
    support::controller::install_crds(&cluster.client, &cluster.kubeconfig).await;
    let sim = support::sim::start(support::sim::config(
        TOKEN,
        &["base:24.04=2", "base:24.04@egress=1"],
    ))
    .await;
    let token_file = support::sim::token_file(&support::vk::test_dir(prefix), TOKEN);
    let mut args = support::sim::vk_args(&sim, Some(&token_file));
    args.push(format!("--pod-cidr={RANGE}"));
    args.push(format!("--pod-netns={}", net.path().display()));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let vk = VkUnderTest::start(&cluster, prefix, &argv).await;
    vk.wait_ready(&cluster.client, Duration::from_secs(30))
        .await;
    let ns = cluster.namespace(prefix).await;

    // A Sandbox and its Pod, as the agent-sandbox controller makes them.
    let sandboxes: Api<DynamicObject> = Api::namespaced_with(
        cluster.client.clone(),
        &ns,
        &support::controller::resource("Sandbox"),
    );
    let sandbox: DynamicObject = support::from_json(json!({
        "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
        "metadata": {"name": "p"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "agent", "image": "base:24.04"}]}}}
    }));
    let uid = sandboxes
        .create(&PostParams::default(), &sandbox)
        .await
        .expect("create Sandbox")
        .metadata
        .uid
        .expect("uid");
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    let pod: Pod = support::from_json(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "guarded"},
            "annotations": {"sandbox.cocoonstack.io/runtime": "sandboxd",
                            "sandbox.cocoonstack.io/template": "base:24.04"},
            "ownerReferences": [{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                "name": "p", "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": vk.node},
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "agent", "image": "base:24.04",
                "ports": [{"containerPort": 8080, "name": "http"}]}]
        }
    }));
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create Pod");
    let log = || format!("; log:\n{}", tail(&vk.logs(), 20));
    let (id, ip): (String, Ipv4Addr) =
        support::running_address(&pods, "p", Duration::from_secs(30), log).await;
    sim.sim()
        .map_port(
            sandboxd_sim::config::PortMapping {
                sandbox: Some(id),
                template: None,
                guest_port: 8080,
                target: naming_server("vm-p").await,
            },
            false,
        )
        .expect("map the guest port");
    let addr = SocketAddr::from((ip, 8080));
    wait_for(
        &format!("{addr} answers"),
        Duration::from_secs(15),
        || async { net.ask(addr) },
    )
    .await;

    // The client connects from inside the namespace, where the whole
    // range is local: its source address is in the range.
    let policies: Api<NetworkPolicy> = Api::namespaced(cluster.client.clone(), &ns);
    let apply = PatchParams::apply("netpol-e2e").force();
    let policy = |ingress: serde_json::Value| -> NetworkPolicy {
        support::from_json(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "guard"},
            "spec": {"podSelector": {"matchLabels": {"app": "guarded"}},
                     "policyTypes": ["Ingress"], "ingress": ingress},
        }))
    };
    let set = |ingress: serde_json::Value| {
        let (policies, apply, p) = (policies.clone(), apply.clone(), policy(ingress));
        async move {
            policies
                .patch("guard", &apply, &Patch::Apply(&p))
                .await
                .expect("apply the policy");
        }
    };
    let t = Instant::now();
    set(json!([])).await;
    until(&net, (addr, false), "a policy allowing nothing", &vk, t).await;
    let t = Instant::now();
    set(json!([{"from": [{"ipBlock": {"cidr": RANGE}}], "ports": [{"port": "http"}]}])).await;
    until(
        &net,
        (addr, true),
        "the range allowed to the named port",
        &vk,
        t,
    )
    .await;
    assert_eq!(net.ask(addr).as_deref(), Ok("vm-p"));
    let this = format!("{ip}/32");
    let t = Instant::now();
    set(json!([{"from": [{"ipBlock": {"cidr": RANGE, "except": [this]}}]}])).await;
    until(&net, (addr, false), "the client's address excepted", &vk, t).await;
    let t = Instant::now();
    policies
        .delete("guard", &Default::default())
        .await
        .expect("delete the policy");
    until(&net, (addr, true), "the policy deleted", &vk, t).await;
    let logs = vk.logs();
    assert!(
        logs.contains("none allows"),
        "the refusals name the policy's verdict:\n{}",
        tail(&logs, 30)
    );

    // Egress is sandboxd's lane: a policy limiting it is reported on the
    // Pod whose VM has a NIC ("egress" lane), not on p (no NIC).
    let mut q = pod.clone();
    q.metadata.name = Some("q".into());
    q.metadata
        .annotations
        .get_or_insert_default()
        .insert("sandbox.cocoonstack.io/net".into(), "egress".into());
    pods.create(&PostParams::default(), &q)
        .await
        .expect("create Pod q");
    let outbound: NetworkPolicy = support::from_json(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "outbound"},
        "spec": {"podSelector": {"matchLabels": {"app": "guarded"}},
                 "policyTypes": ["Egress"],
                 "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}]}]},
    }));
    policies
        .create(&PostParams::default(), &outbound)
        .await
        .expect("create the egress policy");
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(cluster.client.clone(), &ns);
    let egress_events = || async {
        let all = events
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(
            all.items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("EgressNotEnforced"))
                .map(|e| {
                    let about = e.regarding.and_then(|r| r.name).unwrap_or_default();
                    (about, e.note.unwrap_or_default())
                })
                .collect::<Vec<_>>(),
        )
    };
    let told = wait_for(
        "a Warning Event EgressNotEnforced on Pod q",
        Duration::from_secs(15),
        || async {
            let got = egress_events().await?;
            if got.is_empty() {
                Err("none yet".to_string())
            } else {
                Ok(got)
            }
        },
    )
    .await;
    assert_eq!(told.len(), 1, "one Event, on q only: {told:?}");
    assert_eq!(told[0].0, "q", "{told:?}");
    assert!(
        told[0].1.contains("NetworkPolicy") && told[0].1.contains("/outbound limits"),
        "the Event names the policy: {told:?}"
    );
    cluster.drop_namespace(&ns).await;
    vk.delete_node(&cluster.client).await;
}
