//! The Helm chart installed as users install it, on a real node: agent-sandbox
//! v1.0.3 from its own chart (the `helm/` folder of its Go module; its
//! controller image built offline from the module's source, as the product
//! image is), then vk-sandbox from `charts/vk-sandbox`, both with helm v4
//! (e2e/helm-tools.sh) on the kubelet + containerd of e2e/real-node.sh, the
//! sandboxd simulator as the node's sandboxd. A Sandbox, a warm pool and a
//! claim go Running on the virtual Node; then `helm upgrade` to a new image
//! tag, an upgrade that changes only the chart's version, `helm rollback`,
//! and `helm uninstall` followed by a fresh `helm install`: after each, the
//! same Pods Running on the same claims, nothing released, no new claim,
//! and two vk-sandbox processes never alive at once. `helm install` with a
//! value of the wrong type is refused by the schema.
//!
//! `VK_REAL_NODE_CHART=<dir>` runs the scenario on another copy of the
//! chart: one whose Pod template carries the chart's version fails at the
//! chart-only upgrade ("a chart-only upgrade changed the DaemonSet's spec").
//!
//! What differs from a user's install, because this node has neither a Pod
//! network nor kube-proxy: both controllers run on the host network with
//! the apiserver's loopback address (`KUBERNETES_SERVICE_HOST/PORT`), for
//! vk-sandbox through the chart's `extraEnv`, for agent-sandbox's chart
//! (which has no such values) by a patch of its Deployment after the
//! install; ports are free ones. Other tests apply manifests/rbac.yaml into
//! the same namespace (the same names): the first install takes them over
//! with `--take-ownership`, as the README says for an install made from
//! manifests/.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use kube::{Api, Client};
use sandboxd_sim::SimHandle;
use support::controller as ctl;
use support::real_node::{self, OverlapWatch, RealNode};
use support::vk::tail;
use support::{TestCluster, wait_for};

const VK_NS: &str = "sandbox-system";
const VK_RELEASE: &str = "vk-sandbox";
const AS_NS: &str = "agent-sandbox-system";
const AS_RELEASE: &str = "agent-sandbox";
const AS_IMAGE: &str = "vk-sandbox.test/agent-sandbox-controller";
const TOKEN: &str = "real-node-helm-root-token";
const LABEL: &str = "app.kubernetes.io/name=vk-sandbox";
const CLAIM_ID: &str = "sandbox.cocoonstack.io/claim-id";
const RUN_LABEL: &str = "vk-sandbox.test/real-node";
/// A Sandbox, a warm pool of 2 and a claim of one of them: the pool refills,
/// so 4 Sandboxes, each a Pod on a VM.
const PODS: usize = 4;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The chart under test: charts/vk-sandbox, or `VK_REAL_NODE_CHART=<dir>`
/// (another copy, e.g. one broken on purpose to see the scenario fail).
fn chart_dir() -> String {
    std::env::var_os("VK_REAL_NODE_CHART")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("charts/vk-sandbox"))
        .display()
        .to_string()
}

/// helm v4 (e2e/helm-tools.sh), or a skip (a failure under
/// VK_REQUIRE_REAL_NODE=1, as the real node itself).
fn helm_or_skip() -> Option<PathBuf> {
    let out = Command::new(repo().join("e2e/helm-tools.sh"))
        .args(["which", "helm"])
        .stdin(Stdio::null())
        .output()
        .expect("run e2e/helm-tools.sh");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() {
        return Some(PathBuf::from(text));
    }
    if std::env::var("VK_REQUIRE_REAL_NODE").is_ok_and(|v| v == "1") {
        panic!("the chart's real-node test needs helm: {text}");
    }
    eprintln!("SKIPPED: the Helm chart on a real node: {text}");
    None
}

/// The folder of agent-sandbox's chart: `helm/` of its Go module at the
/// release the tests run (already in Go's module cache: e2e/agent-sandbox.sh
/// fetched it to build the controller).
fn agent_sandbox_chart(release: &str) -> PathBuf {
    let out = Command::new("go")
        .args([
            "mod",
            "download",
            "-json",
            &format!("sigs.k8s.io/agent-sandbox@{release}"),
        ])
        .current_dir("/")
        .stdin(Stdio::null())
        .output()
        .expect("run go mod download");
    assert!(
        out.status.success(),
        "go mod download sigs.k8s.io/agent-sandbox@{release}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("go mod download -json");
    let dir = PathBuf::from(v["Dir"].as_str().expect("Dir")).join("helm");
    assert!(
        dir.join("Chart.yaml").is_file(),
        "no chart in {}",
        dir.display()
    );
    dir
}

/// The agent-sandbox controller binary e2e/agent-sandbox.sh built.
fn agent_sandbox_binary() -> PathBuf {
    let out = Command::new(repo().join("e2e/agent-sandbox.sh"))
        .arg("build")
        .env("VK_REQUIRE_REAL_CONTROLLER", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run e2e/agent-sandbox.sh build");
    assert!(
        out.status.success(),
        "e2e/agent-sandbox.sh build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// What a run leaves on the cluster, removed however the test ends.
struct Cleanup {
    helm: PathBuf,
    kubeconfig: PathBuf,
    ns: String,
    vnode: String,
}

impl Cleanup {
    fn run(&self, program: &Path, args: &[&str]) {
        let _ = Command::new(program)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::null())
            .output();
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let kubectl = support::kubectl::path();
        // The Sandboxes' namespace first, while vk-sandbox still runs to
        // release their VMs.
        self.run(
            &kubectl,
            &[
                "delete",
                "namespace",
                &self.ns,
                "--ignore-not-found",
                "--timeout=90s",
            ],
        );
        for (release, ns) in [(VK_RELEASE, VK_NS), (AS_RELEASE, AS_NS)] {
            self.run(
                &self.helm,
                &[
                    "uninstall",
                    release,
                    "--namespace",
                    ns,
                    "--ignore-not-found",
                    "--wait",
                    "--timeout=120s",
                ],
            );
        }
        self.run(
            &kubectl,
            &[
                "-n",
                VK_NS,
                "delete",
                "secret",
                "sandboxd-token",
                "--ignore-not-found",
            ],
        );
        // agent-sandbox's namespace (sandbox-system stays: other tests use it).
        self.run(
            &kubectl,
            &[
                "delete",
                "namespace",
                AS_NS,
                "--ignore-not-found",
                "--timeout=90s",
            ],
        );
        self.run(
            &kubectl,
            &["delete", "node", &self.vnode, "--ignore-not-found"],
        );
    }
}

struct Scenario {
    cluster: TestCluster,
    helm: PathBuf,
    sim: SimHandle,
    node: String,
    vnode: String,
    ns: String,
    values: PathBuf,
}

impl Scenario {
    fn client(&self) -> Client {
        self.cluster.client.clone()
    }

    async fn kubectl(&self, args: &[&str]) -> String {
        let (ok, out) = support::kubectl::run(&self.cluster.kubeconfig, args).await;
        assert!(ok, "kubectl {args:?}: {out}");
        out
    }

    /// helm with the test cluster's kubeconfig and a scratch home; (ok, output).
    fn helm_try(&self, args: &[&str]) -> (bool, String) {
        let home = support::vk::test_dir("helm-home");
        let out = Command::new(&self.helm)
            .arg("--kubeconfig")
            .arg(&self.cluster.kubeconfig)
            .args(args)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .stdin(Stdio::null())
            .output()
            .expect("run helm");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    fn helm(&self, args: &[&str]) -> String {
        let (ok, out) = self.helm_try(args);
        assert!(ok, "helm {args:?}:\n{out}");
        eprintln!("real node (helm): helm {}", args.join(" "));
        out
    }

    /// `helm install` of this repository's chart with the test's values
    /// (`--take-ownership` of what an install from manifests/ left).
    fn install_vk(&self, take_ownership: bool) -> String {
        let chart = chart_dir();
        let values = self.values.display().to_string();
        let mut args = vec![
            "install",
            VK_RELEASE,
            &chart,
            "--namespace",
            VK_NS,
            "-f",
            &values,
        ];
        if take_ownership {
            args.push("--take-ownership");
        }
        self.helm(&args)
    }

    /// The DaemonSet's Pod on the real node once Ready (not a terminating
    /// one, not the container `not_container`), running `image`.
    async fn wait_daemon_ready(&self, what: &str, not_container: Option<&str>, image: &str) -> Pod {
        let pods: Api<Pod> = Api::namespaced(self.client(), VK_NS);
        let lp = ListParams::default()
            .labels(LABEL)
            .fields(&format!("spec.nodeName={}", self.node));
        wait_for(
            &format!("the chart's vk-sandbox Pod Ready ({what})"),
            Duration::from_secs(180),
            || async {
                let list = pods.list(&lp).await.map_err(|e| e.to_string())?;
                let mut seen = Vec::new();
                for p in list.items {
                    let ready = p
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| {
                            c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        });
                    let container = main_container_id(&p);
                    let img = p
                        .spec
                        .as_ref()
                        .and_then(|s| s.containers[0].image.clone())
                        .unwrap_or_default();
                    if ready
                        && p.metadata.deletion_timestamp.is_none()
                        && !container.is_empty()
                        && Some(container.as_str()) != not_container
                        && img == image
                    {
                        return Ok(p);
                    }
                    seen.push(format!(
                        "{} image {img} ready {ready} phase {:?}",
                        p.metadata.name.clone().unwrap_or_default(),
                        p.status.as_ref().and_then(|s| s.phase.clone())
                    ));
                }
                Err(seen.join("; "))
            },
        )
        .await
    }

    async fn wait_vnode_ready(&self) {
        let nodes: Api<Node> = Api::all(self.client());
        wait_for(
            &format!("the virtual Node {} Ready", self.vnode),
            Duration::from_secs(60),
            || async {
                let n = nodes
                    .get_opt(&self.vnode)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("not registered")?;
                match support::vk::node_condition(&n, "Ready").as_deref() {
                    Some("True") => Ok(()),
                    other => Err(format!("Ready = {other:?}")),
                }
            },
        )
        .await
    }

    fn api(&self, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client(), &self.ns, &ctl::resource(kind))
    }

    async fn create(&self, kind: &str, v: serde_json::Value) -> DynamicObject {
        let obj: DynamicObject = serde_json::from_value(v).expect("object json");
        self.api(kind)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("create {kind}: {e}"))
    }

    /// (Pod name, uid, claim id) of every Pod of the Sandboxes, once all
    /// `n` are Running with a claim.
    async fn pods_running(&self, what: &str, n: usize) -> Vec<(String, String, String)> {
        let pods: Api<Pod> = Api::namespaced(self.client(), &self.ns);
        wait_for(
            &format!("{n} Sandbox Pods Running with claims ({what})"),
            Duration::from_secs(120),
            || async {
                let list = pods
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let mut out = Vec::new();
                let mut seen = Vec::new();
                for p in list.items {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                    let id = p
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(CLAIM_ID).cloned())
                        .unwrap_or_default();
                    seen.push(format!("{name} {phase:?} {id:?}"));
                    if phase.as_deref() == Some("Running")
                        && !id.is_empty()
                        && p.metadata.deletion_timestamp.is_none()
                    {
                        out.push((name, p.metadata.uid.clone().unwrap_or_default(), id));
                    }
                }
                if out.len() == n && seen.len() == n {
                    out.sort();
                    Ok(out)
                } else {
                    Err(seen.join("; "))
                }
            },
        )
        .await
    }

    fn claim_posts(&self) -> usize {
        self.sim
            .sim()
            .requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path == "/v1/claim")
            .count()
    }

    /// The claims state on the hostPath, read with vk-sandbox's own tool.
    fn state_claims(&self, step: &str) -> String {
        let (status, state) = support::process::run_to_exit(
            &[
                "claims",
                "list",
                "--state-path=/var/lib/vk-sandbox/claims.json",
                "--output=json",
            ],
            &[],
        );
        assert!(status.success(), "{step}: vk-sandbox claims list: {state}");
        state
    }

    /// The claims kept: in sandboxd and on the hostPath, no release, no new
    /// claim request.
    fn assert_claims_kept(&self, step: &str, before: &[(String, String, String)], posts: usize) {
        let releases = support::sim::releases(&self.sim);
        assert!(
            releases.is_empty(),
            "{step}: sandboxd got release requests: {releases:?}"
        );
        assert_eq!(
            self.claim_posts(),
            posts,
            "{step}: sandboxd got new claim requests"
        );
        let rows: Vec<String> = self.sim.sim().claims().into_iter().map(|c| c.id).collect();
        let state = self.state_claims(step);
        for (_, _, id) in before {
            assert!(
                rows.contains(id),
                "{step}: claim {id} is not live in sandboxd: {rows:?}"
            );
            assert!(
                state.contains(id.as_str()),
                "{step}: the claims state on the hostPath lacks claim {id}: {state}"
            );
        }
    }

    /// After an upgrade, rollback or reinstall: the same Pods Running on
    /// the same claims, nothing released, nothing claimed anew.
    async fn assert_survived(&self, step: &str, before: &[(String, String, String)], posts: usize) {
        self.wait_vnode_ready().await;
        let now = self.pods_running(step, before.len()).await;
        assert_eq!(
            now, before,
            "{step}: the Sandboxes' Pods (name, uid, claim id) changed"
        );
        self.assert_claims_kept(step, before, posts);
        eprintln!(
            "real node (helm): {step}: {} Pods Running on the same claims, nothing released, no new claim",
            before.len()
        );
    }

    fn assert_process(&self, step: &str) -> u32 {
        let pids = real_node::daemon_pids();
        assert_eq!(
            pids.len(),
            1,
            "{step}: vk-sandbox processes on the node: {pids:?}"
        );
        let (uid, capeff, nnp, root) = real_node::process_facts(pids[0]);
        assert_eq!(uid, "65532 65532 65532 65532", "{step}: Uid");
        assert_eq!(capeff, "0000000000000000", "{step}: CapEff");
        assert_eq!(nnp, "1", "{step}: NoNewPrivs");
        assert!(
            root.split(',').any(|o| o == "ro"),
            "{step}: root mounted {root}"
        );
        pids[0]
    }

    fn assert_no_overlap(&self, step: &str, seen: &real_node::Overlap, old: u32) {
        assert!(
            seen.max_at_once <= 1,
            "{step}: {} vk-sandbox processes ran at once: {seen:?}",
            seen.max_at_once
        );
        assert!(
            seen.pids.contains(&old),
            "{step}: the watch never saw the old process {old}: {seen:?}"
        );
    }

    async fn daemonset(&self) -> DaemonSet {
        Api::<DaemonSet>::namespaced(self.client(), VK_NS)
            .get(VK_RELEASE)
            .await
            .expect("get the chart's DaemonSet")
    }

    async fn rollout_status(&self) {
        self.kubectl(&[
            "-n",
            VK_NS,
            "rollout",
            "status",
            &format!("daemonset/{VK_RELEASE}"),
            "--timeout=180s",
        ])
        .await;
    }
}

fn main_container_id(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == "vk-sandbox"))
        .and_then(|c| c.container_id.clone())
        .unwrap_or_default()
}

/// Namespaces of earlier runs that died (the other real-node test's too).
async fn remove_earlier_runs(cluster: &TestCluster, vnode: &str) {
    let (_, out) = support::kubectl::run(
        &cluster.kubeconfig,
        &["get", "namespaces", "-l", RUN_LABEL, "-o", "name"],
    )
    .await;
    let old: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("namespace/"))
        .collect();
    if old.is_empty() {
        return;
    }
    eprintln!("real node (helm): removing the namespaces of earlier runs: {old:?}");
    let _ = Api::<Node>::all(cluster.client.clone())
        .delete(vnode, &DeleteParams::default())
        .await;
    for ns in &old {
        let _ = support::kubectl::run(&cluster.kubeconfig, &["delete", ns, "--wait=false"]).await;
    }
    wait_for(
        "the namespaces of earlier runs gone",
        Duration::from_secs(180),
        || async {
            let (_, out) = support::kubectl::run(
                &cluster.kubeconfig,
                &["get", "namespaces", "-l", RUN_LABEL, "-o", "name"],
            )
            .await;
            if out.lines().any(|l| l.starts_with("namespace/")) {
                Err(out)
            } else {
                Ok(())
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn daemonset_on_a_real_node_from_the_helm_chart_upgrade_rollback_uninstall_reinstall() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let Some(helm) = helm_or_skip() else {
        return;
    };
    if !ctl::upstream_or_skip("the Helm chart on a real node (agent-sandbox's own chart)") {
        return;
    }
    let started = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(1);
    let Some(node) = RealNode::up_or_skip("the Helm chart on a real node") else {
        return;
    };
    eprintln!(
        "real node (helm): the scenario runs on Node {} (kubelet + containerd on this machine)",
        node.name
    );

    // Images, made here, imported, never pulled: vk-sandbox twice (two tags
    // of one binary, for the upgrade), busybox for the init container, and
    // agent-sandbox's controller from its Go module's source.
    let release = ctl::release();
    let images = support::vk::test_dir("real-node-helm-images");
    let bin = images.join("vk-sandbox");
    let strip = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&bin)
        .arg(real_node::static_binary())
        .status()
        .expect("run strip (binutils)");
    assert!(strip.success(), "strip --strip-debug: {strip}");
    let (a, b, bb, asc) = (
        images.join("vk-sandbox-a.tar"),
        images.join("vk-sandbox-b.tar"),
        images.join("busybox.tar"),
        images.join("agent-sandbox.tar"),
    );
    for (tar, tag) in [(&a, "e2e-a"), (&b, "e2e-b")] {
        real_node::build_image(
            &[
                "product",
                &tar.display().to_string(),
                &format!("vk-sandbox:{tag}"),
                &format!("org.opencontainers.image.version={tag}"),
            ],
            &[("VK_IMAGE_BINARY", &bin)],
        );
    }
    real_node::build_image(
        &[
            "busybox",
            &bb.display().to_string(),
            "vk-sandbox.test/busybox:debian",
        ],
        &[],
    );
    let as_bin = images.join("agent-sandbox-controller");
    let strip = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&as_bin)
        .arg(agent_sandbox_binary())
        .status()
        .expect("run strip (binutils)");
    assert!(
        strip.success(),
        "strip the agent-sandbox controller: {strip}"
    );
    real_node::build_image(
        &[
            "agent-sandbox",
            &asc.display().to_string(),
            &format!("{AS_IMAGE}:{release}"),
            &as_bin.display().to_string(),
        ],
        &[],
    );
    node.import(&[&a, &b, &bb, &asc]);

    let sim = support::sim::start(support::sim::config(TOKEN, &["base:24.04=8"])).await;
    let api_port: u16 = kube::config::Kubeconfig::read_from(&cluster.kubeconfig)
        .ok()
        .and_then(|kc| kc.clusters.first()?.cluster.as_ref()?.server.clone())
        .and_then(|s| s.rsplit(':').next()?.trim_end_matches('/').parse().ok())
        .expect("the apiserver's port in the admin kubeconfig");
    let vnode = format!("{}-sandboxd", node.name);
    remove_earlier_runs(&cluster, &vnode).await;
    let ns = cluster.namespace("real-node-helm").await;
    let (ok, out) = support::kubectl::run(
        &cluster.kubeconfig,
        &["label", "namespace", &ns, &format!("{RUN_LABEL}=true")],
    )
    .await;
    assert!(ok, "label namespace {ns}: {out}");
    let _cleanup = Cleanup {
        helm: helm.clone(),
        kubeconfig: cluster.kubeconfig.clone(),
        ns: ns.clone(),
        vnode: vnode.clone(),
    };
    let values = support::vk::test_dir("real-node-helm-values").join("values.yaml");
    let sc = Scenario {
        helm,
        node: node.name.clone(),
        vnode,
        sim,
        ns,
        values,
        cluster,
    };
    let client = sc.client();
    let _ = Api::<Node>::all(client.clone())
        .delete(&sc.vnode, &DeleteParams::default())
        .await;

    // 1. agent-sandbox from its own chart, as its README installs it (the
    // extensions on, for warm pools and claims; into a namespace helm
    // creates), on the real node.
    let (m, h) = (support::process::free_port(), support::process::free_port());
    let as_chart = agent_sandbox_chart(&release);
    sc.helm(&[
        "install",
        AS_RELEASE,
        &as_chart.display().to_string(),
        "--namespace",
        AS_NS,
        "--create-namespace",
        "--set",
        &format!("image.repository={AS_IMAGE}"),
        "--set",
        &format!("image.tag={release}"),
        "--set",
        "controller.extensions=true",
        // The namespace made by helm, not by the chart: with the chart's own
        // Namespace object, `helm uninstall` deletes the namespace holding
        // the release record and fails ("Failed to purge the release").
        "--set",
        "namespace.create=false",
        "--set-json",
        r#"tolerations=[{"key":"node.vk-sandbox.test/real-node","operator":"Exists"}]"#,
        "--set-json",
        &format!(r#"nodeSelector={{"kubernetes.io/hostname":"{}"}}"#, sc.node),
        "--set-json",
        &format!(
            r#"controller.extraArgs=["--metrics-bind-address=:{m}","--health-probe-bind-address=:{h}"]"#
        ),
    ]);
    // This node's lack of a Pod network and kube-proxy (see the header).
    let patch = serde_json::json!([
        {"op": "add", "path": "/spec/template/spec/hostNetwork", "value": true},
        {"op": "add", "path": "/spec/template/spec/dnsPolicy", "value": "ClusterFirstWithHostNet"},
        {"op": "add", "path": "/spec/template/spec/containers/0/env", "value": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": api_port.to_string()},
        ]},
        {"op": "replace", "path": "/spec/template/spec/containers/0/ports", "value": [
            {"name": "metrics", "containerPort": m, "protocol": "TCP"},
            {"name": "healthz", "containerPort": h, "protocol": "TCP"},
        ]},
    ]);
    sc.kubectl(&[
        "-n",
        AS_NS,
        "patch",
        "deployment",
        "agent-sandbox-controller",
        "--type=json",
        "-p",
        &patch.to_string(),
    ])
    .await;
    sc.kubectl(&[
        "-n",
        AS_NS,
        "rollout",
        "status",
        "deployment/agent-sandbox-controller",
        "--timeout=180s",
    ])
    .await;
    for kind in [
        "Sandbox",
        "SandboxTemplate",
        "SandboxWarmPool",
        "SandboxClaim",
    ] {
        support::crds::wait_served(&client, &ctl::resource(kind)).await;
    }
    eprintln!(
        "real node (helm): agent-sandbox {release} installed from its chart ({}), controller Ready on {}",
        as_chart.display(),
        sc.node
    );

    // 2. vk-sandbox from this repository's chart, the README's steps: the
    // namespace at Pod Security `privileged`, the sandboxd node labelled,
    // the token Secret, helm install.
    // (It may exist: other tests apply the RBAC into it.)
    let _ = support::kubectl::run(&sc.cluster.kubeconfig, &["create", "namespace", VK_NS]).await;
    sc.kubectl(&[
        "label",
        "--overwrite",
        "namespace",
        VK_NS,
        "pod-security.kubernetes.io/enforce=privileged",
    ])
    .await;
    sc.kubectl(&[
        "label",
        "--overwrite",
        "node",
        &sc.node,
        "sandbox.cocoonstack.io/sandboxd=true",
    ])
    .await;
    let token_file = support::vk::test_dir("real-node-helm-token").join("token");
    std::fs::write(&token_file, TOKEN).expect("write the token file");
    let _ = support::kubectl::run(
        &sc.cluster.kubeconfig,
        &[
            "-n",
            VK_NS,
            "delete",
            "secret",
            "sandboxd-token",
            "--ignore-not-found",
        ],
    )
    .await;
    sc.kubectl(&[
        "-n",
        VK_NS,
        "create",
        "secret",
        "generic",
        "sandboxd-token",
        &format!("--from-file=token={}", token_file.display()),
    ])
    .await;
    let (k, adm) = (support::process::free_port(), support::process::free_port());
    let values = format!(
        r#"image: {{registry: "", repository: vk-sandbox, tag: e2e-a}}
stateDirInit:
  image: {{registry: "", repository: vk-sandbox.test/busybox, tag: debian}}
ports: {{kubelet: {k}, admin: {adm}}}
sandboxd:
  url: http://127.0.0.1:{sim}
extraEnv:
  - {{name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}}
  - {{name: KUBERNETES_SERVICE_PORT, value: "{api_port}"}}
"#,
        sim = sc.sim.addr().port()
    );
    std::fs::write(&sc.values, values).expect("write the values file");
    // The schema refuses a wrong type before anything is made.
    let chart = chart_dir();
    let (ok, out) = sc.helm_try(&[
        "install",
        VK_RELEASE,
        &chart,
        "--namespace",
        VK_NS,
        "-f",
        &sc.values.display().to_string(),
        "--set-json",
        r#"metrics.serviceMonitor.enabled="yes""#,
    ]);
    assert!(
        !ok && out.contains("values don't meet the specifications of the schema")
            && out.contains("/metrics/serviceMonitor/enabled")
            && out.contains("want boolean"),
        "helm install with metrics.serviceMonitor.enabled=\"yes\": {out}"
    );
    eprintln!(
        "real node (helm): helm install refused metrics.serviceMonitor.enabled: \"yes\": {}",
        out.lines()
            .find(|l| l.contains("serviceMonitor"))
            .unwrap_or_default()
            .trim()
    );
    let notes = sc.install_vk(true);
    assert!(
        notes.contains("helm uninstall") && notes.contains("adopts"),
        "NOTES: {notes}"
    );
    let pod = sc
        .wait_daemon_ready("install", None, "vk-sandbox:e2e-a")
        .await;
    sc.wait_vnode_ready().await;
    let mut pid = sc.assert_process("install");
    eprintln!(
        "real node (helm): vk-sandbox Pod {} Ready, virtual Node {} Ready, process {pid} as 65532",
        pod.metadata.name.clone().unwrap_or_default(),
        sc.vnode
    );

    // 3. A Sandbox, a warm pool of 2 and a claim, through the in-cluster
    // agent-sandbox controller.
    let vn = Some(sc.vnode.as_str());
    sc.create("Sandbox", ctl::contract_sandbox("helm-a", "base:24.04", vn))
        .await;
    sc.create(
        "SandboxTemplate",
        ctl::contract_template("helm-tmpl", "base:24.04", vn),
    )
    .await;
    sc.create(
        "SandboxWarmPool",
        ctl::warm_pool("helm-pool", "helm-tmpl", 2),
    )
    .await;
    sc.pods_running("the Sandbox and the warm pool", 3).await;
    let claim = sc
        .create(
            "SandboxClaim",
            ctl::sandbox_claim("helm-claim", "helm-pool"),
        )
        .await;
    let claim_uid = claim.metadata.uid.clone().expect("claim uid");
    let sandboxes = sc.api("Sandbox");
    wait_for(
        "the claim to adopt a warm Sandbox",
        Duration::from_secs(90),
        || async {
            let list = sandboxes
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .iter()
                .find(|s| {
                    ctl::controller_of(&s.metadata)
                        .is_some_and(|(k, _, u)| k == "SandboxClaim" && u == claim_uid)
                })
                .map(|_| ())
                .ok_or(format!("{} Sandboxes, none the claim's", list.items.len()))
        },
    )
    .await;
    let running = sc.pods_running("Sandbox, pool and claim", PODS).await;
    let posts = sc.claim_posts();
    assert_eq!(posts, PODS, "one claim to sandboxd per Sandbox");
    sc.assert_claims_kept("install", &running, posts);
    eprintln!(
        "real node (helm): a Sandbox, a warm pool and a claim Running: {:?}",
        running
            .iter()
            .map(|(n, _, id)| format!("{n}={id}"))
            .collect::<Vec<_>>()
    );

    // 4. helm upgrade to a new image: rolls the DaemonSet.
    let watch = OverlapWatch::start();
    sc.helm(&[
        "upgrade",
        VK_RELEASE,
        &chart,
        "--namespace",
        VK_NS,
        "--reuse-values",
        "--set",
        "image.tag=e2e-b",
    ]);
    sc.rollout_status().await;
    let prev = main_container_id(&pod);
    let pod = sc
        .wait_daemon_ready("upgrade to e2e-b", Some(&prev), "vk-sandbox:e2e-b")
        .await;
    sc.assert_no_overlap("upgrade", &watch.finish(), pid);
    pid = sc.assert_process("upgrade");
    sc.assert_survived("helm upgrade (image e2e-b)", &running, posts)
        .await;

    // 5. A chart-only change (the chart's version, same values) does not
    // roll it: the Pod template is the same, so is the Pod.
    let generation = sc.daemonset().await.metadata.generation;
    let bumped = support::vk::test_dir("real-node-helm-chart").join("vk-sandbox");
    let cp = Command::new("cp")
        .args(["-r", &chart, &bumped.display().to_string()])
        .status()
        .expect("cp the chart");
    assert!(cp.success());
    let chart_yaml = bumped.join("Chart.yaml");
    let text = std::fs::read_to_string(&chart_yaml).expect("Chart.yaml");
    std::fs::write(
        &chart_yaml,
        text.replacen("\nversion: ", "\nversion: 99.0.0-chart-only+was-", 1),
    )
    .expect("write Chart.yaml");
    sc.helm(&[
        "upgrade",
        VK_RELEASE,
        &bumped.display().to_string(),
        "--namespace",
        VK_NS,
        "--reuse-values",
    ]);
    let ds = sc.daemonset().await;
    assert!(
        ds.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("helm.sh/chart"))
            .is_some_and(|v| v.starts_with("vk-sandbox-99.0.0-chart-only")),
        "the chart-only upgrade did not reach the DaemonSet: {:?}",
        ds.metadata.labels
    );
    assert_eq!(
        ds.metadata.generation, generation,
        "a chart-only upgrade changed the DaemonSet's spec (it would roll)"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let same = sc
        .wait_daemon_ready("chart-only upgrade", None, "vk-sandbox:e2e-b")
        .await;
    assert_eq!(
        same.metadata.uid, pod.metadata.uid,
        "a chart-only upgrade replaced the Pod"
    );
    assert_eq!(sc.assert_process("chart-only upgrade"), pid);
    eprintln!(
        "real node (helm): a chart-only upgrade (version 99.0.0-chart-only) left the DaemonSet's generation {generation:?} and its Pod as they were"
    );

    // 6. helm rollback to the first revision (image e2e-a).
    let watch = OverlapWatch::start();
    sc.helm(&["rollback", VK_RELEASE, "1", "--namespace", VK_NS]);
    sc.rollout_status().await;
    let prev = main_container_id(&pod);
    sc.wait_daemon_ready("rollback to e2e-a", Some(&prev), "vk-sandbox:e2e-a")
        .await;
    sc.assert_no_overlap("rollback", &watch.finish(), pid);
    pid = sc.assert_process("rollback");
    sc.assert_survived("helm rollback (revision 1, image e2e-a)", &running, posts)
        .await;

    // 7. helm uninstall: the DaemonSet and its process go; the claims state
    // on the host, the VMs in sandboxd and the virtual Node stay.
    let watch = OverlapWatch::start();
    sc.helm(&[
        "uninstall",
        VK_RELEASE,
        "--namespace",
        VK_NS,
        "--wait",
        "--timeout=120s",
    ]);
    wait_for(
        "the vk-sandbox process gone after helm uninstall",
        Duration::from_secs(60),
        || async {
            let pids = real_node::daemon_pids();
            if pids.is_empty() {
                Ok(())
            } else {
                Err(format!("{pids:?}"))
            }
        },
    )
    .await;
    let seen = watch.finish();
    assert!(seen.pids.contains(&pid), "uninstall: {seen:?}");
    let (ok, out) = support::kubectl::run(
        &sc.cluster.kubeconfig,
        &["-n", VK_NS, "get", "daemonset", VK_RELEASE],
    )
    .await;
    assert!(
        !ok,
        "the DaemonSet is still there after helm uninstall: {out}"
    );
    assert!(
        Api::<Node>::all(client.clone())
            .get_opt(&sc.vnode)
            .await
            .expect("get the virtual Node")
            .is_some(),
        "helm uninstall: the virtual Node {} is gone",
        sc.vnode
    );
    sc.assert_claims_kept("helm uninstall", &running, posts);
    eprintln!(
        "real node (helm): helm uninstall left the claims state on the hostPath, the VMs in sandboxd and the virtual Node {}",
        sc.vnode
    );

    // 8. helm install again: adopts them all.
    let watch = OverlapWatch::start();
    sc.install_vk(false);
    sc.wait_daemon_ready("reinstall", None, "vk-sandbox:e2e-a")
        .await;
    let seen = watch.finish();
    assert!(
        seen.max_at_once <= 1,
        "reinstall: two processes at once: {seen:?}"
    );
    sc.assert_process("reinstall");
    sc.assert_survived("helm uninstall + helm install", &running, posts)
        .await;

    let pulls: Vec<String> = Api::<Event>::all(client.clone())
        .list(&ListParams::default().fields("reason=Pulling"))
        .await
        .expect("list Events")
        .items
        .into_iter()
        .filter(|e| e.last_timestamp.as_ref().is_some_and(|t| t.0 >= started))
        .map(|e| e.message.unwrap_or_default())
        .collect();
    assert!(pulls.is_empty(), "images were pulled: {pulls:?}");

    // Clean-up: the claim, pool and Sandbox (released now), both releases,
    // the virtual Node, then the node, checked to leave the host as found.
    for (kind, name) in [
        ("SandboxClaim", "helm-claim"),
        ("SandboxWarmPool", "helm-pool"),
        ("Sandbox", "helm-a"),
    ] {
        let _ = sc.api(kind).delete(name, &DeleteParams::default()).await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &sc.ns);
    wait_for(
        "the Sandboxes' Pods gone (released by the chart's vk-sandbox)",
        Duration::from_secs(120),
        || async {
            let left = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} left"))
            }
        },
    )
    .await;
    sc.cluster.drop_namespace(&sc.ns).await;
    for (rel, ns) in [(VK_RELEASE, VK_NS), (AS_RELEASE, AS_NS)] {
        sc.helm(&[
            "uninstall",
            rel,
            "--namespace",
            ns,
            "--wait",
            "--timeout=120s",
        ]);
    }
    let _ = Api::<Node>::all(client.clone())
        .delete(&sc.vnode, &DeleteParams::default())
        .await;
    drop(_cleanup);
    let (ok, report) = node.down();
    eprintln!("{report}");
    assert!(
        ok,
        "the real node's teardown did not leave the host as found:\n{}",
        tail(&report, 40)
    );
}
