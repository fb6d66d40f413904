//! agent-sandbox v1.0.3's own ways in, to a sandbox Pod's own address
//! (docs/pod-network.md), under the template's NetworkPolicy: its Go
//! sandbox-router and its Go SDK, against vk-sandbox with `--pod-cidr`,
//! the sandboxd simulator and agent-sandbox's in-sandbox runtimes as the
//! guest services: `packages/sandboxd` behind ports 8080 (REST) and 9090
//! (gRPC), and the legacy Python runtime (the API the SDK speaks through
//! the router) behind 8888.
//!
//! Where the traffic goes: the Pod range is routed locally inside a
//! network namespace of the test's, as the node routes it; the router and
//! the in-cluster SDK run in that namespace, their connections into the
//! range coming from an address of their own there (a Pod address, as the
//! apiserver knows it from a stand-in Pod: never scheduled, its
//! `status.podIP` written as a kubelet would). The test reaches the router,
//! and the in-namespace SDK reaches the apiserver, through loopback
//! forwarders (tests/support/netns.rs). No private-range address is a
//! target in the host's own namespace.
//!
//! 1. A SandboxTemplate with agent-sandbox's default managed policy
//!    (ingress only from `app=sandbox-router` Pods in
//!    `agent-sandbox-system`): a request carrying `X-Sandbox-ID` through
//!    the router reaches the runtime; the SDK in its direct-URL (router)
//!    mode runs a command, writes a file and reads it back through the
//!    router; a connection from another Pod's address is refused.
//! 2. A template with `networkPolicyManagement: Unmanaged`: the SDK in
//!    `in-cluster-pod-ip` mode runs a command and moves a file, dialling
//!    the Pod's address itself.

mod support;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::controller as ctl;
use support::guests::{Guests, ROUTER_NS};
use support::netns::{TestNetns, forward};
use support::upstream;
use support::vk::tail;

const RANGE: &str = "10.250.31.0/24";
/// The router's Pod address, and another Pod's.
const ROUTER_IP: &str = "10.250.32.10";
const OUTSIDER_IP: &str = "10.250.32.20";

/// A Pod the apiserver knows at `ip` with `labels` in `ns`: never
/// scheduled (a scheduler nobody runs), its address written into its
/// status as a kubelet would.
async fn stand_in_pod(client: &kube::Client, ns: &str, name: &str, labels: Value, ip: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = support::from_json(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"schedulerName": "router-test-nobody",
                 "containers": [{"name": "c", "image": "none"}]},
    }));
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create stand-in Pod {ns}/{name}: {e}"));
    let status = json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap_or_else(|e| panic!("write the address of {ns}/{name}: {e}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_router_and_the_sdk_reach_a_sandbox_at_its_pod_address() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    if !ctl::upstream_or_skip("the sandbox-router and the SDK at Pod addresses") {
        return;
    }
    let Some(net) = TestNetns::make_or_skip("vkrt", RANGE) else {
        return;
    };
    net.source_for(RANGE, ROUTER_IP);
    net.ip(&["addr", "add", &format!("{OUTSIDER_IP}/32"), "dev", "lo"]);
    let guests = Guests::start(&cluster, "vk-router", RANGE, &net.path()).await;
    let (vk, ns, driver) = (&guests.vk, guests.ns.clone(), guests.driver.clone());
    let router_pod = format!("sandbox-router-{}", support::suffix());
    stand_in_pod(
        &cluster.client,
        ROUTER_NS,
        &router_pod,
        json!({"app": "sandbox-router"}),
        ROUTER_IP,
    )
    .await;
    stand_in_pod(
        &cluster.client,
        &ns,
        "outsider",
        json!({"app": "outsider"}),
        OUTSIDER_IP,
    )
    .await;
    let (sandbox, pod_ip) = guests.pool_pod(&cluster, "guarded-pool").await;
    println!("router e2e: sandbox {sandbox} at {pod_ip}");

    // The router, in the namespace, on its loopback; reached through a
    // forwarder from the host's.
    let router_port = support::process::free_port();
    let (metrics, probes) = (support::process::free_port(), support::process::free_port());
    let router = std::process::Command::new("ip")
        .args(["netns", "exec", net.name()])
        .arg(&guests.router_bin)
        .arg(format!("--http-bind-address=127.0.0.1:{router_port}"))
        .arg(format!("--metrics-bind-address=127.0.0.1:{metrics}"))
        .arg(format!("--health-probe-bind-address=127.0.0.1:{probes}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the sandbox-router");
    let _router = support::upstream::Child(router);
    let front = forward(
        None,
        Some(net.path()),
        SocketAddr::from(([127, 0, 0, 1], router_port)),
    )
    .await;
    let health = guests.health_through_router(front, &sandbox, pod_ip).await;
    println!("router e2e: health through the router: {health}");
    let logs = vk.logs();
    assert!(
        logs.contains(&format!("source={ROUTER_IP}")),
        "the connection came from the router's address:\n{}",
        tail(&logs, 20)
    );

    // Another Pod's address: the managed policy refuses it.
    let pod_addr = SocketAddr::new(pod_ip, 8080);
    let socket = vk_sandbox::podnet::netns::PodNetns::new(Some(net.path()))
        .within(|| {
            let s = tokio::net::TcpSocket::new_v4()?;
            s.bind(SocketAddr::new(
                OUTSIDER_IP.parse().map_err(std::io::Error::other)?,
                0,
            ))?;
            Ok(s)
        })
        .expect("a socket at the other Pod's address");
    let refused: Result<String, String> = async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = socket.connect(pod_addr).await.map_err(|e| e.to_string())?;
        s.write_all(b"GET /v1/health HTTP/1.0\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 64];
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(0)) => Err("closed without a byte".into()),
            Ok(Ok(n)) => Ok(String::from_utf8_lossy(&buf[..n]).to_string()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer within 5 s".into()),
        }
    }
    .await;
    assert!(
        refused.is_err(),
        "a Pod outside {ROUTER_NS} reached the guarded sandbox: {refused:?}"
    );
    println!("router e2e: another Pod's address refused: {refused:?}");

    // The SDK through the router (its direct-URL mode).
    guests
        .sdk_through_router(&cluster, front, ROUTER_IP.parse().expect("router address"))
        .await;

    // The SDK dialling Pod addresses itself (in-cluster-pod-ip), from the
    // namespace, where the apiserver is reached through a forwarder.
    let api_port = upstream::apiserver_port(&cluster.kubeconfig);
    let inner_api = forward(
        Some(net.path()),
        None,
        SocketAddr::from(([127, 0, 0, 1], api_port)),
    )
    .await;
    let kubeconfig = support::vk::test_dir("router-kubeconfig").join("kubeconfig");
    let text = std::fs::read_to_string(&cluster.kubeconfig).expect("read the kubeconfig");
    std::fs::write(
        &kubeconfig,
        text.replace(
            &format!("127.0.0.1:{api_port}"),
            &format!("127.0.0.1:{inner_api}"),
        ),
    )
    .expect("write the namespace's kubeconfig");
    let steps = upstream::drive(
        tokio::process::Command::new("ip")
            .args(["netns", "exec", net.name()])
            .arg(&driver)
            .args(["open-pool", &ns, "in-cluster-pod-ip"])
            .env("KUBECONFIG", &kubeconfig),
        vk,
        "the SDK in in-cluster-pod-ip mode",
    )
    .await;
    upstream::ran_and_moved_a_file(&steps);
    let logs = vk.logs();
    for port in [8080, 9090] {
        assert!(
            logs.contains(&format!(
                "source={ROUTER_IP} port={port} why=no NetworkPolicy selects the Pod"
            )),
            "the SDK dialled the open Pod's {port} at its address:\n{}",
            tail(&logs, 20)
        );
    }

    let _ = Api::<Pod>::namespaced(cluster.client.clone(), ROUTER_NS)
        .delete(&router_pod, &Default::default())
        .await;
    cluster.drop_namespace(&ns).await;
    vk.delete_node(&cluster.client).await;
}
