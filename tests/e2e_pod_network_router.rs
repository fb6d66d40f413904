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

use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use sandboxd_sim::PortMapping;
use serde_json::{Value, json};
use support::controller as ctl;
use support::netns::{TestNetns, forward};
use support::vk::{VkUnderTest, tail};
use support::wait_for;

const TOKEN: &str = "router-token";
const TEMPLATE: &str = "base:24.04";
const RANGE: &str = "10.250.31.0/24";
/// The router's Pod address, and another Pod's.
const ROUTER_IP: &str = "10.250.32.10";
const OUTSIDER_IP: &str = "10.250.32.20";
const ROUTER_NS: &str = "agent-sandbox-system";

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

/// The SDK driver's JSON lines, or a failure with everything said.
async fn drive(cmd: &mut tokio::process::Command, vk: &VkUnderTest, what: &str) -> Vec<Value> {
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        cmd.stdin(Stdio::null()).kill_on_drop(true).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{what}: the SDK driver within 5 minutes"))
    .unwrap_or_else(|e| panic!("{what}: run the SDK driver: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "{what}: the SDK driver failed:\nstdout:\n{stdout}\nstderr (last 2000 bytes):\n{}\nvk-sandbox log:\n{}",
        &stderr[stderr.len().saturating_sub(2000)..],
        tail(&vk.logs(), 20)
    );
    println!("router e2e: {what}:\n{stdout}");
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The port of the apiserver a kubeconfig names.
fn apiserver_port(kubeconfig: &std::path::Path) -> u16 {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
    let server = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .expect("the kubeconfig's server");
    server
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {server}"))
}

/// The driver ran its command (exit 4, its output) and read back the
/// file it wrote.
fn ran_and_moved_a_file(steps: &[Value]) {
    let run = step(steps, "run");
    assert_eq!(run["exit_code"], 4, "{steps:?}");
    assert_eq!(run["stdout"], "hello from the sandbox\n", "{steps:?}");
    assert_eq!(
        step(steps, "read")["content"],
        "written through vk-sandbox's port-forward\n",
        "{steps:?}"
    );
}

fn step<'a>(steps: &'a [Value], name: &str) -> &'a Value {
    steps
        .iter()
        .find(|s| s["step"] == name)
        .unwrap_or_else(|| panic!("no {name} step in {steps:?}"))
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
    let (runtime_bin, driver) = support::upstream::sdk();
    let router_bin = support::upstream::built("router").remove(0);
    let runtime = support::upstream::Runtime::start(&runtime_bin).await;
    let (rest, grpc) = (runtime.rest, runtime.grpc);
    let (_legacy, legacy_port) = support::upstream::legacy_runtime().await;

    let mut cfg = support::sim::config(TOKEN, &[&format!("{TEMPLATE}=4")]);
    cfg.wake_delay_ms = 0;
    for (guest_port, port) in [(8080, rest), (9090, grpc), (8888, legacy_port)] {
        cfg.port_map.push(PortMapping {
            sandbox: None,
            template: Some(TEMPLATE.into()),
            guest_port,
            target: ([127, 0, 0, 1], port).into(),
        });
    }
    let sim = support::sim::start(cfg).await;
    let prefix = "vk-router";
    let token_file = support::sim::token_file(&support::vk::test_dir(prefix), TOKEN);
    let mut args = support::sim::vk_args(&sim, Some(&token_file));
    args.push(format!("--pod-cidr={RANGE}"));
    args.push(format!("--pod-netns={}", net.path().display()));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let vk = VkUnderTest::start(&cluster, prefix, &argv).await;
    vk.wait_ready(&cluster.client, Duration::from_secs(30))
        .await;
    ctl::install_crds(&cluster.client, &cluster.kubeconfig).await;
    let ns = cluster.namespace(prefix).await;
    let _controller = ctl::start(&cluster.client, &cluster.kubeconfig, &ns).await;

    // The router's namespace and its Pod (as agent-sandbox installs it),
    // and a Pod elsewhere.
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    let router_ns: Namespace = support::from_json(json!({"metadata": {"name": ROUTER_NS}}));
    let _ = namespaces.create(&PostParams::default(), &router_ns).await;
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

    // Two templates declaring the runtime's ports: the default managed
    // policy, and none.
    let api = |kind: &str| -> Api<DynamicObject> {
        Api::namespaced_with(cluster.client.clone(), &ns, &ctl::resource(kind))
    };
    let template = |name: &str, unmanaged: bool| -> Value {
        let mut t = ctl::contract_template(name, TEMPLATE, Some(&vk.node));
        t["spec"]["podTemplate"]["spec"]["containers"][0]["ports"] = json!([
            {"containerPort": 8080, "name": "rest"},
            {"containerPort": 9090, "name": "grpc"},
            {"containerPort": 8888, "name": "legacy"},
        ]);
        if unmanaged {
            t["spec"]["networkPolicyManagement"] = json!("Unmanaged");
        }
        t
    };
    for (kind, obj) in [
        ("SandboxTemplate", template("guarded", false)),
        ("SandboxTemplate", template("open", true)),
        (
            "SandboxWarmPool",
            ctl::warm_pool("guarded-pool", "guarded", 1),
        ),
        ("SandboxWarmPool", ctl::warm_pool("open-pool", "open", 1)),
    ] {
        let obj: DynamicObject = serde_json::from_value(obj).expect("object json");
        api(kind)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("create {kind}: {e}"));
    }
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(cluster.client.clone(), &ns);
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
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    // The guarded pool's Pod, Running at its own address.
    let (sandbox, pod_ip): (String, IpAddr) = wait_for(
        "the guarded pool's Pod Running at its address",
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
                        .is_some_and(|n| n.starts_with("guarded-pool"))
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
                    tail(&vk.logs(), 10)
                ))
        },
    )
    .await;
    println!(
        "router e2e: managed policy {}, sandbox {sandbox} at {pod_ip}",
        managed.metadata.name.unwrap_or_default()
    );

    // The router, in the namespace, on its loopback; reached through a
    // forwarder from the host's.
    let router_port = support::process::free_port();
    let (metrics, probes) = (support::process::free_port(), support::process::free_port());
    let router = std::process::Command::new("ip")
        .args(["netns", "exec", net.name()])
        .arg(&router_bin)
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
    let http = reqwest::Client::new();
    let through_router = |port: u16, path: &str| {
        http.get(format!("http://127.0.0.1:{front}{path}"))
            .header("X-Sandbox-ID", &sandbox)
            .header("X-Sandbox-Namespace", &ns)
            .header("X-Sandbox-Port", port.to_string())
            .header("X-Sandbox-Pod-IP", pod_ip.to_string())
    };
    let health = wait_for(
        "the runtime's health through the router",
        Duration::from_secs(30),
        || async {
            let r = through_router(8080, "/v1/health")
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = r.status();
            let body = r.text().await.unwrap_or_default();
            status
                .is_success()
                .then_some(body.clone())
                .ok_or(format!("{status}: {body}; log:\n{}", tail(&vk.logs(), 10)))
        },
    )
    .await;
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
    let steps = drive(
        tokio::process::Command::new(&driver)
            .args([
                "guarded-pool",
                &ns,
                &format!("router=http://127.0.0.1:{front}"),
            ])
            .env("KUBECONFIG", &cluster.kubeconfig),
        &vk,
        "the SDK through the router",
    )
    .await;
    ran_and_moved_a_file(&steps);
    let logs = vk.logs();
    assert!(
        logs.contains(&format!(
            "source={ROUTER_IP} port=8888 why=allowed by NetworkPolicy"
        )),
        "the SDK's requests reached the guest's 8888 through the Pod address:\n{}",
        tail(&logs, 20)
    );

    // The SDK dialling Pod addresses itself (in-cluster-pod-ip), from the
    // namespace, where the apiserver is reached through a forwarder.
    let api_port = apiserver_port(&cluster.kubeconfig);
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
    let steps = drive(
        tokio::process::Command::new("ip")
            .args(["netns", "exec", net.name()])
            .arg(&driver)
            .args(["open-pool", &ns, "in-cluster-pod-ip"])
            .env("KUBECONFIG", &kubeconfig),
        &vk,
        "the SDK in in-cluster-pod-ip mode",
    )
    .await;
    ran_and_moved_a_file(&steps);
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
