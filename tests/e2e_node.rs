//! The virtual node on the real local control plane, with vk-sandbox running
//! as the ServiceAccount of manifests/rbac.yaml: refusals before the Node is
//! registered, the Node, its Lease and heartbeats, re-registration, graceful
//! and silent exits, and the kubelet API reached through the apiserver (the
//! refusals without a cluster are in tests/config_cli.rs, the kubelet API
//! in-process in tests/kubelet_*.rs).

mod support;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use support::process::run_to_exit;
use support::vk::{VkUnderTest, node_condition, tail};
use support::wait_for;

fn pod_json(name: &str, node: &str, tolerate: bool) -> Pod {
    let mut tolerations = vec![];
    if tolerate {
        tolerations.push(
            json!({"key": "virtual-kubelet.io/provider", "operator": "Exists",
                                "effect": "NoSchedule"}),
        );
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": tolerations,
            "containers": [{"name": "agent", "image": "base:24.04"}]
        }
    }))
    .expect("pod json")
}

#[tokio::test]
async fn no_credentials_refuses_to_start() {
    let home = support::vk::test_dir("nohome");
    std::fs::create_dir_all(home.join(".kube")).expect("mkdir");
    let state = home.join("state/claims.json");
    let (status, out) = run_to_exit(
        &[&format!("--state-path={}", state.display())],
        &[
            ("HOME", home.to_str().expect("utf8")),
            ("KUBERNETES_SERVICE_HOST", ""),
        ],
    );
    assert!(!status.success(), "started without credentials: {out}");
    assert!(
        out.contains("--kubeconfig"),
        "message should name the fix: {out}"
    );
}

/// Start-up refusals (state path, listen address, quantity, token file)
/// happen before the Node is registered.
#[tokio::test]
async fn bad_configuration_refuses_before_registering_the_node() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let kubeconfig = support::vk::sa_kubeconfig(&cluster).await;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let dir = support::vk::test_dir("refuse");
    let state = format!("--state-path={}", dir.join("s/claims.json").display());
    let kc = format!("--kubeconfig={}", kubeconfig.display());
    let cases: Vec<(&str, Vec<String>)> = vec![
        ("empty state path", vec!["--state-path=".into()]),
        (
            "listen addr without colon",
            vec![state.clone(), "--listen-addr=10260".into()],
        ),
        (
            "listen port 0",
            vec![state.clone(), "--listen-addr=:0".into()],
        ),
        (
            "listen port too big",
            vec![state.clone(), "--listen-addr=:70000".into()],
        ),
        (
            "listen port by name",
            vec![state.clone(), "--listen-addr=:http".into()],
        ),
        ("bad cpu", vec![state.clone(), "--node-cpu=abc".into()]),
        (
            "unreadable token file",
            vec![
                state.clone(),
                "--sandboxd-token-file=/nonexistent/token".into(),
            ],
        ),
    ];
    for (what, args) in cases {
        let node = format!("refuse-{}", support::suffix());
        let mut all = vec![kc.clone(), format!("--node-name={node}")];
        all.extend(args);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let (status, out) = run_to_exit(&all, &[]);
        assert!(!status.success(), "{what}: started anyway: {out}");
        assert!(
            nodes.get_opt(&node).await.expect("get node").is_none(),
            "{what}: Node {node} was registered before the refusal"
        );
    }
}

#[tokio::test]
async fn refuses_to_adopt_a_physical_node() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let name = format!("physical-{}", support::suffix());
    // Deleted at the end, or when the test fails.
    let _node_cleanup = support::nodes::NodeCleanup::new(cluster.kubeconfig.clone(), &name);
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}))
            .expect("node"),
        )
        .await
        .expect("create physical node");
    let kubeconfig = support::vk::sa_kubeconfig(&cluster).await;
    let dir = support::vk::test_dir(&name);
    let port = support::process::free_port();
    let admin = support::process::free_port();
    let (status, out2) = run_to_exit(
        &[
            &format!("--kubeconfig={}", kubeconfig.display()),
            &format!("--node-name={name}"),
            &format!("--state-path={}", dir.join("claims.json").display()),
            &format!("--listen-addr=127.0.0.1:{port}"),
            &format!("--admin-addr=127.0.0.1:{admin}"),
        ],
        &[],
    );
    assert!(!status.success(), "adopted a physical node: {out2}");
    assert!(
        out2.contains("--node-name") && out2.contains(&name),
        "refusal should name the node and the flag: {out2}"
    );
    let after = nodes.get(&name).await.expect("node still there");
    let taints = after.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        !taints
            .iter()
            .any(|t| t.key == "virtual-kubelet.io/provider"),
        "physical node was tainted: {taints:?}"
    );
    let labels = after.metadata.labels.unwrap_or_default();
    assert!(
        !labels.contains_key("type"),
        "physical node was relabelled: {labels:?}"
    );
    let _ = nodes.delete(&name, &DeleteParams::default()).await;
}

/// A Node deleted while vk-sandbox runs is registered again (the Node is
/// reconciled, not only registered at start), and the Lease follows the new
/// Node: it is owned by the new UID, so garbage collection leaves it.
#[tokio::test]
async fn deleted_node_is_registered_again() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let client = cluster.client.clone();
    let vk = VkUnderTest::start(&cluster, "vk-renode", &["--node-status-interval=2s"]).await;
    let first = vk.wait_ready(&client, Duration::from_secs(30)).await;
    let first_uid = first.metadata.uid.clone().expect("uid");
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .delete(&vk.node, &DeleteParams::default())
        .await
        .expect("delete the Node");
    let again = wait_for(
        "the Node registered again",
        Duration::from_secs(60),
        || async {
            match nodes.get_opt(&vk.node).await.map_err(|e| e.to_string())? {
                Some(n) if n.metadata.uid.as_deref() != Some(first_uid.as_str()) => {
                    match node_condition(&n, "Ready").as_deref() {
                        Some("True") => Ok(n),
                        other => Err(format!("Ready={other:?}")),
                    }
                }
                Some(_) => Err("the old Node is still there".into()),
                None => Err("no Node".into()),
            }
        },
    )
    .await;
    let new_uid = again.metadata.uid.clone().expect("uid");
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    wait_for(
        "the Lease owned by the new Node",
        Duration::from_secs(60),
        || async {
            let lease = leases
                .get_opt(&vk.node)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no Lease")?;
            let owners: Vec<String> = lease
                .metadata
                .owner_references
                .unwrap_or_default()
                .into_iter()
                .map(|o| o.uid)
                .collect();
            if owners == vec![new_uid.clone()] {
                Ok(())
            } else {
                Err(format!("owners {owners:?}, want {new_uid}"))
            }
        },
    )
    .await;
    assert!(
        vk.logs().contains("registering it again"),
        "{}",
        tail(&vk.logs(), 20)
    );
    vk.delete_node(&client).await;
}

/// With the default intervals (Lease every 10 s, Node status every 60 s),
/// a Node deleted right after its registration is back before PodGC acts:
/// PodGC force-deletes the Pods of a missing node about 40 s after it went,
/// and the status heartbeat alone registered the Node again only after up
/// to 60 s. The Lease loop notices (its Lease goes with the Node) and has
/// the Node registered again at once, so a Pod bound to the node is still
/// the same Pod well past PodGC's quarantine.
#[tokio::test]
async fn a_deleted_node_is_back_before_podgc_acts() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let client = cluster.client.clone();
    let ns = cluster.namespace("renode-gc").await;
    let vk = VkUnderTest::start(&cluster, "vk-renode-gc", &[]).await;
    let first = vk.wait_ready(&client, Duration::from_secs(30)).await;
    let first_uid = first.metadata.uid.clone().expect("uid");
    // Bound at creation (no scheduler): PodGC looks only at spec.nodeName.
    let mut pod = pod_json("bound", &vk.node, true);
    pod.spec.as_mut().expect("spec").node_name = Some(vk.node.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("create the Pod");
    let pod_uid = pod.metadata.uid.clone().expect("uid");
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .delete(&vk.node, &DeleteParams::default())
        .await
        .expect("delete the Node");
    // Past PodGC's 40 s quarantine and its 20 s period.
    tokio::time::sleep(Duration::from_secs(75)).await;
    let again = nodes
        .get_opt(&vk.node)
        .await
        .expect("get the Node")
        .expect("the Node registered again");
    assert_ne!(again.metadata.uid.as_deref(), Some(first_uid.as_str()));
    let still = pods
        .get_opt("bound")
        .await
        .expect("get the Pod")
        .unwrap_or_else(|| {
            panic!(
                "PodGC deleted the Pod; vk-sandbox log:\n{}",
                tail(&vk.logs(), 30)
            )
        });
    assert_eq!(still.metadata.uid.as_deref(), Some(pod_uid.as_str()));
    assert!(
        still.metadata.deletion_timestamp.is_none(),
        "PodGC is deleting the Pod; vk-sandbox log:\n{}",
        tail(&vk.logs(), 30)
    );
    assert!(
        vk.logs().contains("the node Lease was gone"),
        "{}",
        tail(&vk.logs(), 30)
    );
    vk.delete_node(&client).await;
    cluster.drop_namespace(&ns).await;
}

/// One process per state path: a second vk-sandbox on the same
/// `--state-path` refuses to start, naming the first one's PID, and the
/// first keeps running.
#[tokio::test]
async fn second_process_on_the_same_state_path_refuses() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let client = cluster.client.clone();
    let mut vk = VkUnderTest::start(&cluster, "vk-lock", &[]).await;
    vk.wait_ready(&client, Duration::from_secs(30)).await;
    let (status, out) = run_to_exit(
        &[
            &format!("--kubeconfig={}", vk.kubeconfig.display()),
            &format!("--node-name={}-twin", vk.node),
            &format!("--state-path={}", vk.state_path.display()),
            &format!("--listen-addr=127.0.0.1:{}", support::process::free_port()),
            &format!("--admin-addr=127.0.0.1:{}", support::process::free_port()),
        ],
        &[],
    );
    assert!(!status.success(), "a second process started: {out}");
    let pid = vk.process.pid();
    assert!(
        out.contains(&format!("in use by process {pid}")) && out.contains("--state-path"),
        "the refusal names the holder and the flag: {out}"
    );
    let nodes: Api<Node> = Api::all(client.clone());
    assert!(
        nodes
            .get_opt(&format!("{}-twin", vk.node))
            .await
            .expect("get")
            .is_none(),
        "the refused process registered a Node"
    );
    assert!(
        vk.process.wait_exit(Duration::from_millis(200)).is_none(),
        "the first process stopped"
    );
    vk.delete_node(&client).await;
}

/// The registered Node (labels, taint, addresses, port, capacity, only
/// Ready true), its Lease and heartbeats, the scheduler binding only Pods
/// that tolerate the taint, and a SIGTERM that leaves Node and Lease.
#[tokio::test]
async fn registers_node_lease_and_heartbeats() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let client = cluster.client.clone();
    let vk = VkUnderTest::start(&cluster, "vk-node", &["--node-status-interval=5s"]).await;
    let node = vk.wait_ready(&client, Duration::from_secs(30)).await;

    // Labels, taint, addresses, port, capacity.
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("type").map(String::as_str),
        Some("virtual-kubelet")
    );
    assert_eq!(
        labels.get("kubernetes.io/role").map(String::as_str),
        Some("agent")
    );
    assert_eq!(labels.get("kubernetes.io/hostname"), Some(&vk.node));
    assert_eq!(
        labels
            .get("sandbox.cocoonstack.io/runtime")
            .map(String::as_str),
        Some("sandboxd")
    );
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let ours: Vec<_> = taints
        .iter()
        .filter(|t| t.key == "virtual-kubelet.io/provider")
        .collect();
    assert_eq!(ours.len(), 1, "taints: {taints:?}");
    assert_eq!(ours[0].value.as_deref(), Some("sandboxd"));
    assert_eq!(ours[0].effect, "NoSchedule");
    let status = node.status.clone().expect("status");
    let addrs: Vec<(String, String)> = status
        .addresses
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert_eq!(
        addrs,
        vec![
            ("InternalIP".to_string(), "127.0.0.1".to_string()),
            ("Hostname".to_string(), vk.node.clone())
        ]
    );
    assert_eq!(
        status
            .daemon_endpoints
            .and_then(|d| d.kubelet_endpoint)
            .map(|e| e.port),
        Some(i32::from(vk.process.kubelet_port))
    );
    let cap = status.capacity.clone().expect("capacity");
    assert_eq!(cap["cpu"].0, "4k");
    assert_eq!(cap["memory"].0, "8Ti");
    assert_eq!(cap["pods"].0, "2k");
    assert_eq!(status.capacity, status.allocatable);
    // Of the kubelet's conditions only Ready is True (sandboxd's own,
    // `Sandboxd*`, say how sandboxd is: docs/operations.md).
    for c in status.conditions.clone().unwrap_or_default() {
        if c.type_ == "Ready" {
            assert_eq!(c.reason.as_deref(), Some("KubeletReady"));
        } else if !c.type_.starts_with("Sandboxd") {
            assert_ne!(c.status, "True", "{} is True", c.type_);
        }
    }
    assert!(
        !status
            .node_info
            .expect("nodeInfo")
            .kubelet_version
            .is_empty(),
        "kubectl get nodes should show a version"
    );

    // The Lease, owned by the Node, renewed.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let first = wait_for("the node Lease", Duration::from_secs(20), || async {
        leases
            .get_opt(&vk.node)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "no Lease yet".to_string())
    })
    .await;
    let spec = first.spec.clone().expect("lease spec");
    assert_eq!(spec.holder_identity.as_deref(), Some(vk.node.as_str()));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    let owners = first.metadata.owner_references.clone().expect("owner refs");
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].kind, "Node");
    assert_eq!(Some(owners[0].uid.clone()), node.metadata.uid);
    let t0 = spec.renew_time.expect("renewTime").0;
    wait_for(
        "the Lease renewTime to advance",
        Duration::from_secs(15),
        || async {
            let l = leases.get(&vk.node).await.map_err(|e| e.to_string())?;
            let t = l.spec.and_then(|s| s.renew_time).map(|t| t.0);
            match t {
                Some(t) if t > t0 => Ok(()),
                other => Err(format!("renewTime still {other:?}")),
            }
        },
    )
    .await;

    // With a 5 s status interval: heartbeats advance, transition stays.
    let nodes: Api<Node> = Api::all(client.clone());
    let ready = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .expect("Ready condition")
    };
    let before = ready(&node);
    wait_for(
        "Ready lastHeartbeatTime to advance",
        Duration::from_secs(20),
        || async {
            let n = nodes.get(&vk.node).await.map_err(|e| e.to_string())?;
            let c = ready(&n);
            if c.last_heartbeat_time > before.last_heartbeat_time {
                assert_eq!(c.last_transition_time, before.last_transition_time);
                Ok(())
            } else {
                Err(format!("heartbeat still {:?}", c.last_heartbeat_time))
            }
        },
    )
    .await;

    // The scheduler binds a tolerating Pod here, and not an intolerant one.
    let ns = cluster.namespace("vk-node").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.create(&PostParams::default(), &pod_json("fits", &vk.node, true))
        .await
        .expect("create pod");
    pods.create(
        &PostParams::default(),
        &pod_json("no-toleration", &vk.node, false),
    )
    .await
    .expect("create pod");
    wait_for(
        "the tolerating Pod to be bound to the node",
        Duration::from_secs(30),
        || async {
            let p = pods.get("fits").await.map_err(|e| e.to_string())?;
            match p.spec.and_then(|s| s.node_name) {
                Some(n) if n == vk.node => Ok(()),
                other => Err(format!("nodeName {other:?}")),
            }
        },
    )
    .await;
    wait_for(
        "the intolerant Pod to be Unschedulable",
        Duration::from_secs(30),
        || async {
            let p = pods.get("no-toleration").await.map_err(|e| e.to_string())?;
            if p.spec.as_ref().and_then(|s| s.node_name.clone()).is_some() {
                panic!("a Pod without the toleration was bound to the virtual node");
            }
            let unsched = p
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.reason.as_deref() == Some("Unschedulable"));
            if unsched {
                Ok(())
            } else {
                Err("not yet marked".into())
            }
        },
    )
    .await;

    // SIGTERM exits 0 and leaves Node and Lease in place.
    vk.process.signal(nix::sys::signal::Signal::SIGTERM);
    let mut vk = vk;
    let st = vk
        .process
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no exit within 10 s of SIGTERM:\n{}", tail(&vk.logs(), 40)));
    assert!(
        st.success(),
        "exit status {st:?}:\n{}",
        tail(&vk.logs(), 40)
    );
    assert!(
        nodes.get_opt(&vk.node).await.expect("get").is_some(),
        "Node removed on shutdown"
    );
    assert!(
        leases.get_opt(&vk.node).await.expect("get").is_some(),
        "Lease removed on shutdown"
    );

    cluster.drop_namespace(&ns).await;
    vk.delete_node(&client).await;
}

/// Stopped longer than the node monitor grace period, the node goes
/// NotReady/Unknown; restarted, it is Ready again on the same Node object.
#[tokio::test]
async fn lifecycle_controller_marks_a_silent_node_and_restart_recovers() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let client = cluster.client.clone();
    let mut vk = VkUnderTest::start(&cluster, "vk-silent", &[]).await;
    let node = vk.wait_ready(&client, Duration::from_secs(30)).await;
    let uid = node.metadata.uid.clone();
    vk.process.signal(nix::sys::signal::Signal::SIGKILL);
    vk.process.wait_exit(Duration::from_secs(5));
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for(
        "the node lifecycle controller to mark the silent node not Ready",
        Duration::from_secs(90),
        || async {
            let n = nodes.get(&vk.node).await.map_err(|e| e.to_string())?;
            match node_condition(&n, "Ready").as_deref() {
                Some("Unknown") | Some("False") => Ok(()),
                other => Err(format!("Ready = {other:?}")),
            }
        },
    )
    .await;
    vk.restart(&[]);
    let again = vk.wait_ready(&client, Duration::from_secs(30)).await;
    assert_eq!(again.metadata.uid, uid, "the Node object was replaced");
    vk.delete_node(&client).await;
}

/// The kubelet API through the apiserver against the real binary: kubectl
/// logs and attach say why a sandbox has neither, exec runs in the sandbox,
/// an anonymous caller is refused, and /metrics passes promtool.
#[tokio::test]
async fn kubelet_api_through_the_apiserver() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let client = cluster.client.clone();
    let sim = support::sim::start(support::sim::config("", &["base:24.04=2"])).await;
    let vk = VkUnderTest::start(
        &cluster,
        "vk-kapi",
        &[&format!("--sandboxd-url={}", sim.base_url())],
    )
    .await;
    vk.wait_ready(&client, Duration::from_secs(30)).await;
    let ns = cluster.namespace("vk-kapi").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut pod = pod_json("p", &vk.node, true);
    pod.metadata.annotations = Some(
        [(
            "sandbox.cocoonstack.io/template".to_string(),
            "base:24.04".to_string(),
        )]
        .into(),
    );
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    // kubectl port-forward insists on a Running Pod.
    wait_for(
        "the Pod to run on a sandbox",
        Duration::from_secs(30),
        || async {
            let p = pods.get("p").await.map_err(|e| e.to_string())?;
            match p.status.and_then(|s| s.phase) {
                Some(ph) if ph == "Running" => Ok(()),
                other => Err(format!("phase {other:?}")),
            }
        },
    )
    .await;
    // logs and attach say why a sandbox has neither; exec runs in it.
    for (args, want) in [
        (["logs", "p"].as_slice(), "has no container log"),
        (&["attach", "p"], "no container process to attach to"),
    ] {
        let args = [&["-n", ns.as_str()], args].concat();
        let (ok, out) = support::kubectl::run(&cluster.kubeconfig, &args).await;
        assert!(!ok, "kubectl {args:?} succeeded: {out}");
        assert!(
            out.contains(want),
            "kubectl {args:?} should say {want:?}: {out}\nvk-sandbox log:\n{}",
            tail(&vk.logs(), 20)
        );
    }
    let (ok, out) = support::kubectl::run(
        &cluster.kubeconfig,
        &["-n", &ns, "exec", "p", "--", "echo", "in"],
    )
    .await;
    assert!(
        ok && out.trim() == "in",
        "kubectl exec: {out}\nvk-sandbox log:\n{}",
        tail(&vk.logs(), 20)
    );
    // The kubelet port refuses anonymous callers.
    let anon = std::process::Command::new("curl")
        .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!(
            "https://127.0.0.1:{}/pods",
            vk.process.kubelet_port
        ))
        .output()
        .expect("curl");
    let code = String::from_utf8_lossy(&anon.stdout).to_string();
    assert!(
        code == "401" || code == "403",
        "anonymous /pods answered {code}"
    );
    // /metrics on the admin port passes promtool.
    let metrics = vk.metrics().await;
    assert!(
        metrics.contains("vk_sandbox_lease_renewals_total"),
        "{metrics}"
    );
    let (ok, out) = support::prometheus::promtool(&["check", "metrics"], &metrics);
    assert!(ok, "promtool check metrics failed: {out}");
    cluster.drop_namespace(&ns).await;
    vk.delete_node(&client).await;
}

/// A restart adopts its own Node and writes only what changed: a new Node
/// is created Ready in one request; the first restart applies the labels
/// once (the create owned them as an update); the next finds labels and
/// taint in place and writes neither; a removed taint is restored, a
/// changed `--node-labels` applied, and a label dropped from it removed.
#[tokio::test]
async fn restart_adopts_its_node_and_writes_only_what_changed() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let client = cluster.client.clone();
    let nodes: Api<Node> = Api::all(client.clone());
    let quiet = "--node-status-interval=60s";
    let mut vk = VkUnderTest::start(&cluster, "vk-adopt", &[quiet, "--node-labels=team=a"]).await;
    let created = vk.wait_ready(&client, Duration::from_secs(30)).await;
    assert!(
        vk.logs().contains("registered Node"),
        "{}",
        tail(&vk.logs(), 20)
    );
    let labels = |n: &Node| n.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels(&created).get("team").map(String::as_str), Some("a"));

    let restart = |vk: &mut VkUnderTest, args: &[&str]| {
        vk.process.signal(nix::sys::signal::Signal::SIGTERM);
        assert!(
            vk.process.wait_exit(Duration::from_secs(20)).is_some(),
            "SIGTERM ignored"
        );
        vk.restart(args);
    };
    let adopted_in_place = "adopted existing Node (labels and taint in place)";
    restart(&mut vk, &[quiet, "--node-labels=team=a"]);
    vk.wait_ready(&client, Duration::from_secs(30)).await;
    wait_for("adopted", Duration::from_secs(20), || async {
        let l = vk.logs();
        if l.matches("adopted existing Node").count() >= 1 {
            Ok(())
        } else {
            Err(tail(&l, 10))
        }
    })
    .await;
    assert!(
        !vk.logs().contains(adopted_in_place),
        "the first restart applies the labels once"
    );

    restart(&mut vk, &[quiet, "--node-labels=team=a"]);
    wait_for("adopted in place", Duration::from_secs(30), || async {
        let l = vk.logs();
        if l.contains(adopted_in_place) {
            Ok(())
        } else {
            Err(tail(&l, 10))
        }
    })
    .await;
    let node = vk.wait_ready(&client, Duration::from_secs(30)).await;
    assert_eq!(node.metadata.uid, created.metadata.uid);

    // Someone removes the taint: the next start puts it back, with the new
    // label value.
    let patch: json_patch::Patch =
        serde_json::from_value(json!([{"op": "remove", "path": "/spec/taints"}])).expect("patch");
    nodes
        .patch(
            &vk.node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::<()>::Json(patch),
        )
        .await
        .expect("remove the taint");
    restart(&mut vk, &[quiet, "--node-labels=team=b"]);
    let node = wait_for(
        "taint restored, label changed",
        Duration::from_secs(30),
        || async {
            let n = nodes.get(&vk.node).await.map_err(|e| e.to_string())?;
            let tainted = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == "virtual-kubelet.io/provider"));
            if tainted && labels(&n).get("team").map(String::as_str) == Some("b") {
                Ok(n)
            } else {
                Err(format!(
                    "taints {:?}, labels {:?}",
                    n.spec.as_ref().and_then(|s| s.taints.clone()),
                    labels(&n)
                ))
            }
        },
    )
    .await;
    assert_eq!(node.metadata.uid, created.metadata.uid);

    // Dropped from --node-labels: removed by the next apply.
    restart(&mut vk, &[quiet]);
    wait_for("label removed", Duration::from_secs(30), || async {
        let n = nodes.get(&vk.node).await.map_err(|e| e.to_string())?;
        if labels(&n).contains_key("team") {
            Err(format!("labels {:?}", labels(&n)))
        } else {
            Ok(())
        }
    })
    .await;
    vk.wait_ready(&client, Duration::from_secs(30)).await;
    vk.delete_node(&client).await;
}

/// A test's Node is deleted when the test is over, also when it fails: the
/// vk-sandbox under test is dropped while the test panics, and with it the
/// Node (a Node left NotReady on the shared plane would be listed by every
/// later `kubectl get nodes`, the demo's included).
#[tokio::test]
async fn a_failed_tests_node_is_deleted_with_it() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let client = cluster.client.clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<String>();
    let failed = {
        let cluster = support::TestCluster {
            client: client.clone(),
            kubeconfig: cluster.kubeconfig.clone(),
        };
        tokio::spawn(async move {
            let vk = VkUnderTest::start(&cluster, "vk-failing", &[]).await;
            vk.wait_ready(&cluster.client, Duration::from_secs(30))
                .await;
            let _ = tx.send(vk.node.clone());
            panic!("a test failing with its vk-sandbox running");
        })
        .await
    };
    assert!(failed.is_err_and(|e| e.is_panic()));
    let node = rx.await.expect("the Node was Ready before the panic");
    let nodes: Api<Node> = Api::all(client);
    wait_for(
        "the failed test's Node deleted",
        Duration::from_secs(30),
        || async {
            match nodes.get_opt(&node).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(_) => Err(format!("Node {node} still there")),
            }
        },
    )
    .await;
}

/// Which Nodes a later run sweeps: test-named, not Ready, silent for
/// longer than the bound (the demo's and users' Nodes never).
#[test]
fn leftover_test_nodes_are_told_apart() {
    use support::nodes::{LEFTOVER_AFTER, is_leftover, is_test_name};
    for name in [
        "vk-renode-0a1b2c3d",
        "smoke-node-deadbeef",
        "vk-lock-01234567-twin",
    ] {
        assert!(is_test_name(name), "{name}");
    }
    for name in [
        "demo-sandboxd",
        "node-a-sandboxd",
        "deadbeef",
        "vk-0a1b2c3",
        "vk-0a1b2c3g",
    ] {
        assert!(!is_test_name(name), "{name}");
    }
    let now: jiff::Timestamp = "2026-12-05T12:00:00Z".parse().expect("time");
    let ago = |minutes: i64| {
        now.checked_sub(jiff::SignedDuration::from_mins(minutes))
            .expect("time")
    };
    let node = |name: &str, ready: &str, created: jiff::Timestamp| -> Node {
        support::from_json(json!({
            "metadata": {"name": name, "creationTimestamp": created.to_string()},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}
        }))
    };
    let lease = |renewed: jiff::Timestamp| -> Lease {
        support::from_json(json!({
            "metadata": {"name": "x"},
            "spec": {"renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}
        }))
    };
    let old = node("vk-a-0a1b2c3d", "Unknown", ago(60));
    assert!(is_leftover(&old, None, now, LEFTOVER_AFTER));
    assert!(is_leftover(
        &old,
        Some(&lease(ago(30))),
        now,
        LEFTOVER_AFTER
    ));
    // Its Lease was renewed lately: a test of another binary still runs it.
    assert!(!is_leftover(
        &old,
        Some(&lease(ago(1))),
        now,
        LEFTOVER_AFTER
    ));
    // Made lately, no Lease yet.
    let young = node("vk-a-0a1b2c3d", "Unknown", ago(2));
    assert!(!is_leftover(&young, None, now, LEFTOVER_AFTER));
    // Ready, or not a test's.
    let ready = node("vk-a-0a1b2c3d", "True", ago(60));
    assert!(!is_leftover(&ready, None, now, LEFTOVER_AFTER));
    let demo = node("demo-sandboxd", "Unknown", ago(600));
    assert!(!is_leftover(&demo, None, now, LEFTOVER_AFTER));
}

/// A process stopped past the node lifecycle controller's grace (SIGSTOP:
/// a hung agent) finds its Node marked not Ready when it resumes; its
/// first renewal sees the Lease lapsed and the Node is written Ready at
/// once, not at the next heartbeat (60 s here), so the unreachable taints
/// go and new Pods can bind again.
#[tokio::test]
async fn a_node_resumed_after_a_hang_is_ready_again_at_its_first_renewal() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let client = cluster.client.clone();
    let nodes: Api<Node> = Api::all(client.clone());
    let vk = VkUnderTest::start(&cluster, "vk-hang", &["--node-status-interval=60s"]).await;
    vk.wait_ready(&client, Duration::from_secs(30)).await;
    let ready = || async {
        let n = nodes.get(&vk.node).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(node_condition(&n, "Ready").unwrap_or_default())
    };
    vk.process.signal(nix::sys::signal::Signal::SIGSTOP);
    // The plane's grace is 20 s (e2e/cluster.sh), its monitor period 2 s.
    wait_for(
        "the node lifecycle controller marks the stopped Node not Ready",
        Duration::from_secs(90),
        || async {
            match ready().await? {
                s if s == "True" => Err("still Ready".to_string()),
                other => Ok(other),
            }
        },
    )
    .await;
    vk.process.signal(nix::sys::signal::Signal::SIGCONT);
    let resumed = std::time::Instant::now();
    wait_for(
        "Ready again after the resume",
        Duration::from_secs(90),
        || async {
            match ready().await? {
                s if s == "True" => Ok(()),
                other => Err(format!("Ready={other}")),
            }
        },
    )
    .await;
    let took = resumed.elapsed();
    println!("node hang: Ready again {took:?} after the resume");
    let logs = vk.logs();
    assert!(
        logs.contains("the node Lease had lapsed"),
        "the first renewal saw the lapse:\n{}",
        tail(&logs, 20)
    );
    // The heartbeat (60 s after the start, a few seconds before the stop)
    // was still more than 30 s away when the process resumed.
    assert!(
        took < Duration::from_secs(20),
        "Ready again only after {took:?}: at the heartbeat, not at the first renewal"
    );
    vk.delete_node(&client).await;
}
