//! Sandbox Pods' own addresses (docs/pod-network.md) reached from
//! containers on a real node (a kubelet with containerd, e2e/real-node.sh):
//! Pods with the addresses their CNI gave them, not stand-ins.
//!
//! The real node's Pod network lives in a network namespace it makes (the
//! CNI bridge plugin runs in there); vk-sandbox answers its Pod range in
//! that same namespace (`--pod-netns`, the range routed locally there as
//! the node's operator routes it), so a container's packets to a sandbox
//! address go: container → bridge → vk-sandbox → sandboxd's `/ports` →
//! the guest. No private-range address is a target in the host's own
//! namespace; the test reaches the router Pod through a loopback
//! forwarder, and the SDK's Pod reaches the apiserver through one made
//! inside that Pod's namespace.
//!
//! 1. Two Sandboxes, two addresses: from a busybox container, each
//!    `PODIP:8080` reaches that VM's own listener; a released sandbox's
//!    address then refuses.
//! 2. agent-sandbox's default managed NetworkPolicy: the same container
//!    (outside `agent-sandbox-system`) is refused by the guarded sandbox
//!    while the open one answers it; agent-sandbox v1.0.3's sandbox-router
//!    as a Pod labelled `app=sandbox-router` in `agent-sandbox-system`
//!    forwards a request carrying `X-Sandbox-ID` to the runtime, and the Go
//!    SDK in its router mode runs a command and moves a file through it.
//! 3. `networkPolicyManagement: Unmanaged`: the Go SDK in
//!    `in-cluster-pod-ip` mode, run in the container, does the same
//!    dialling the Pod's address itself.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, DynamicObject, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use support::controller as ctl;
use support::guests::{Guests, ROUTER_NS, TEMPLATE};
use support::netns::{forward, naming_server};
use support::real_node::{self, RealNode};
use support::upstream;
use support::vk::tail;
use support::{TestCluster, wait_for};

/// The sandboxes' range: apart from the real node's CNI range.
const RANGE: &str = "10.250.41.0/24";
const BUSYBOX: &str = "vk-sandbox.test/busybox:debian";

/// The real node's Pod network: its namespace's path and name.
fn pod_network() -> (PathBuf, String) {
    let (ok, _, out, err) = real_node::run(&["pod-network"]);
    assert!(ok, "e2e/real-node.sh pod-network: {err}");
    let path = PathBuf::from(out.split_whitespace().next().unwrap_or_default());
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| panic!("no namespace in {out:?}"));
    (path, name)
}

fn ip(args: &[&str]) {
    let ok = std::process::Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "ip {args:?} failed");
}

/// A busybox container on the real node (not hostNetwork: its address
/// is the CNI's) with the folder `ext` (agent-sandbox's binaries) at /ext.
fn container_pod(name: &str, labels: Value, node: &str, ext: &Path, command: &[&str]) -> Pod {
    support::from_json(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": command,
                "volumeMounts": [{"name": "ext", "mountPath": "/ext", "readOnly": true}]}],
            "volumes": [{"name": "ext", "hostPath": {"path": ext.display().to_string(), "type": "Directory"}}],
        },
    }))
}

/// The Pod Running: its CNI address and its container's PID on the host.
async fn running(client: &Client, ns: &str, name: &str) -> (IpAddr, u32) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let (ip, container) = wait_for(
        &format!("Pod {ns}/{name} Running on the real node"),
        Duration::from_secs(90),
        || async {
            let p = pods.get(name).await.map_err(|e| e.to_string())?;
            let st = p.status.clone().unwrap_or_default();
            let container = st
                .container_statuses
                .as_ref()
                .and_then(|c| c.first())
                .and_then(|c| c.container_id.clone());
            match (st.phase.as_deref(), st.pod_ip.as_deref(), container) {
                (Some("Running"), Some(ip), Some(id)) => Ok((
                    ip.parse::<IpAddr>().map_err(|e| e.to_string())?,
                    id.trim_start_matches("containerd://").to_string(),
                )),
                other => Err(format!("{other:?} {:?}", st.conditions)),
            }
        },
    )
    .await;
    let (ok, _, tasks, err) = real_node::run(&["ctr", "tasks", "ls"]);
    assert!(ok, "ctr tasks ls: {err}");
    let pid = tasks
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            (f.next()? == container).then_some(f.next()?.parse().ok()?)
        })
        .next()
        .unwrap_or_else(|| panic!("no task {container} in:\n{tasks}"));
    (ip, pid)
}

/// What `sh -c script` in the container printed (stdout and stderr).
async fn in_container(cluster: &TestCluster, ns: &str, pod: &str, script: &str) -> String {
    let (_, out) = support::kubectl::run(
        &cluster.kubeconfig,
        &["-n", ns, "exec", pod, "--", "sh", "-c", script],
    )
    .await;
    out.trim().to_string()
}

/// What `who` to `addr` answers from the container (the simulator's guest
/// port leads to a server that names its VM).
async fn who(cluster: &TestCluster, ns: &str, pod: &str, addr: SocketAddr) -> String {
    let (host, port) = (addr.ip(), addr.port());
    in_container(
        cluster,
        ns,
        pod,
        &format!("echo who | nc -w 5 {host} {port}"),
    )
    .await
}

/// The HTTP status line the runtime's health answers from the container,
/// or what went wrong.
async fn health(cluster: &TestCluster, ns: &str, pod: &str, ip: IpAddr) -> String {
    let script =
        format!("printf 'GET /v1/health HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {ip} 8080 | head -1");
    in_container(cluster, ns, pod, &script).await
}

#[tokio::test(flavor = "multi_thread")]
async fn sandbox_pod_addresses_on_a_real_node_from_containers_the_router_and_the_sdk() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    if !ctl::upstream_or_skip("sandbox Pod addresses from a real node's containers") {
        return;
    }
    let Some(node) = RealNode::up_or_skip("sandbox Pod addresses from a real node's containers")
    else {
        return;
    };
    let (netns, netns_name) = pod_network();
    ip(&[
        "-n",
        &netns_name,
        "route",
        "add",
        "local",
        RANGE,
        "dev",
        "lo",
    ]);
    let images = support::vk::test_dir("rn-podnet-images");
    let busybox = images.join("busybox.tar");
    real_node::build_image(&["busybox", &busybox.display().to_string(), BUSYBOX], &[]);
    node.import(&[&busybox]);

    let guests = Guests::start(&cluster, "vk-rn-podnet", RANGE, &netns).await;
    let (vk, ns) = (&guests.vk, guests.ns.clone());
    // The binaries the containers run, in a folder of their own.
    let ext = support::vk::test_dir("rn-podnet-ext");
    for (from, to) in [
        (&guests.driver, "sdk-driver"),
        (&guests.router_bin, "sandbox-router"),
    ] {
        std::fs::copy(from, ext.join(to)).unwrap_or_else(|e| panic!("copy {to}: {e}"));
    }

    // Two Sandboxes of their own (no template, no policy selects them).
    let sandboxes: Api<DynamicObject> =
        Api::namespaced_with(cluster.client.clone(), &ns, &ctl::resource("Sandbox"));
    for name in ["a", "b"] {
        let mut sb = ctl::contract_sandbox(name, TEMPLATE, Some(&vk.node));
        sb["spec"]["podTemplate"]["spec"]["containers"][0]["ports"] =
            json!([{"containerPort": 8080}]);
        let sb: DynamicObject = serde_json::from_value(sb).expect("sandbox json");
        sandboxes
            .create(&PostParams::default(), &sb)
            .await
            .unwrap_or_else(|e| panic!("create Sandbox {name}: {e}"));
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    let log = || format!("; log:\n{}", tail(&vk.logs(), 20));
    let (a_id, a_ip): (String, IpAddr) =
        support::running_address(&pods, "a", Duration::from_secs(60), log).await;
    let (b_id, b_ip): (String, IpAddr) =
        support::running_address(&pods, "b", Duration::from_secs(60), log).await;
    assert_ne!(a_ip, b_ip, "two sandboxes, one address");
    for (id, name) in [(&a_id, "vm-a"), (&b_id, "vm-b")] {
        let target = naming_server(name).await;
        support::sim::lead_sandbox_port(&guests.sim, id, 8080, target);
    }

    // The container outside agent-sandbox-system, and the router inside.
    let pod_api =
        |namespace: &str| -> Api<Pod> { Api::namespaced(cluster.client.clone(), namespace) };
    let client_pod = container_pod(
        "client",
        json!({"app": "client"}),
        &node.name,
        &ext,
        &["sleep", "3600"],
    );
    pod_api(&ns)
        .create(&PostParams::default(), &client_pod)
        .await
        .expect("create the client Pod");
    let router_name = format!("sandbox-router-{}", support::suffix());
    let router_pod = container_pod(
        &router_name,
        json!({"app": "sandbox-router"}),
        &node.name,
        &ext,
        &[
            "/ext/sandbox-router",
            "--http-bind-address=0.0.0.0:8080",
            "--metrics-bind-address=127.0.0.1:9091",
            "--health-probe-bind-address=127.0.0.1:9092",
        ],
    );
    pod_api(ROUTER_NS)
        .create(&PostParams::default(), &router_pod)
        .await
        .expect("create the router Pod");
    let (client_ip, client_pid) = running(&cluster.client, &ns, "client").await;
    let (router_ip, _) = running(&cluster.client, ROUTER_NS, &router_name).await;
    println!(
        "real-node podnet: client at {client_ip}, router at {router_ip}, sandboxes a {a_ip}, b {b_ip}"
    );

    // 1. Each address reaches its own VM.
    for (ip, want) in [(a_ip, "vm-a"), (b_ip, "vm-b")] {
        let addr = SocketAddr::new(ip, 8080);
        wait_for(
            &format!("{addr} answers {want} from the container"),
            Duration::from_secs(20),
            || async {
                let got = who(&cluster, &ns, "client", addr).await;
                (got == want).then_some(()).ok_or(format!("{got:?}"))
            },
        )
        .await;
    }
    assert!(
        vk.logs().contains(&format!(
            "source={client_ip} port=8080 why=no NetworkPolicy selects the Pod"
        )),
        "the connections came from the container's CNI address:\n{}",
        tail(&vk.logs(), 20)
    );

    // 2. The managed policy: the container is refused by the guarded
    // sandbox, answered by the open one.
    let (sandbox, guarded_ip) = guests.pool_pod(&cluster, "guarded-pool").await;
    let (_, open_ip) = guests.pool_pod(&cluster, "open-pool").await;
    let control = wait_for(
        "the open sandbox's runtime answers the container",
        Duration::from_secs(20),
        || async {
            let got = health(&cluster, &ns, "client", open_ip).await;
            got.contains(" 200").then_some(got.clone()).ok_or(got)
        },
    )
    .await;
    let refused = health(&cluster, &ns, "client", guarded_ip).await;
    assert!(
        !refused.contains("HTTP/"),
        "a Pod outside {ROUTER_NS} reached the guarded sandbox: {refused:?} (the open one: {control:?})"
    );
    assert!(
        vk.logs()
            .contains(&format!("none allows {client_ip} to TCP port 8080")),
        "the managed policy refused the container's address:\n{}",
        tail(&vk.logs(), 20)
    );
    println!("real-node podnet: open sandbox {control:?}; guarded refused ({refused:?})");

    // Through the router Pod (reached from the test through a forwarder).
    let front = forward(None, Some(netns.clone()), SocketAddr::new(router_ip, 8080)).await;
    let through = guests
        .health_through_router(front, &sandbox, guarded_ip)
        .await;
    println!("real-node podnet: health through the router Pod: {through}");
    guests.sdk_through_router(&cluster, front, router_ip).await;

    // 3. The SDK in the container, dialling Pod addresses itself; the
    // apiserver reached through a forwarder inside the container's network.
    let api_port = upstream::apiserver_port(&cluster.kubeconfig);
    let inner = forward(
        Some(PathBuf::from(format!("/proc/{client_pid}/ns/net"))),
        None,
        SocketAddr::from(([127, 0, 0, 1], api_port)),
    )
    .await;
    let text = std::fs::read_to_string(&cluster.kubeconfig).expect("read the kubeconfig");
    std::fs::write(
        ext.join("kubeconfig"),
        text.replace(
            &format!("127.0.0.1:{api_port}"),
            &format!("127.0.0.1:{inner}"),
        ),
    )
    .expect("write the container's kubeconfig");
    let steps = upstream::drive(
        tokio::process::Command::new(support::kubectl::path())
            .arg("--kubeconfig")
            .arg(&cluster.kubeconfig)
            .args(["-n", &ns, "exec", "client", "--"])
            .args([
                "env",
                "KUBECONFIG=/ext/kubeconfig",
                "HOME=/tmp",
                "/ext/sdk-driver",
            ])
            .args(["open-pool", &ns, "in-cluster-pod-ip"]),
        vk,
        "the SDK in in-cluster-pod-ip mode in a container",
    )
    .await;
    upstream::ran_and_moved_a_file(&steps);
    for port in [8080, 9090] {
        assert!(
            vk.logs().contains(&format!(
                "source={client_ip} port={port} why=no NetworkPolicy selects the Pod"
            )),
            "the SDK dialled the open Pod's {port} from the container:\n{}",
            tail(&vk.logs(), 20)
        );
    }

    // A released sandbox's address refuses.
    sandboxes
        .delete("b", &DeleteParams::default())
        .await
        .expect("delete Sandbox b");
    let after = wait_for(
        "the released sandbox's address refuses",
        Duration::from_secs(30),
        || async {
            let got = who(&cluster, &ns, "client", SocketAddr::new(b_ip, 8080)).await;
            got.contains("Connection refused")
                .then_some(got.clone())
                .ok_or(got)
        },
    )
    .await;
    println!("real-node podnet: {b_ip}:8080 after release: {after:?}");
    assert_eq!(
        who(&cluster, &ns, "client", SocketAddr::new(a_ip, 8080)).await,
        "vm-a",
        "the other sandbox still answers"
    );

    let _ = pod_api(ROUTER_NS)
        .delete(&router_name, &DeleteParams::default())
        .await;
    cluster.drop_namespace(&ns).await;
    vk.delete_node(&cluster.client).await;
    drop(guests);
    // The binaries' copies (145 MiB); kept when the test fails, to look at.
    let _ = std::fs::remove_dir_all(&ext);
    let (ok, report) = node.down();
    eprintln!("{report}");
    assert!(
        ok,
        "the real node's teardown left the host changed:\n{report}"
    );
}
