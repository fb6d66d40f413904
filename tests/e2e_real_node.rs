//! The in-cluster installation on a real node: `manifests/rbac.yaml` and
//! `manifests/daemonset.yaml` as shipped (only image names and ports
//! changed, by a kustomize overlay over manifests/, as a user would), the
//! image built from the repository's Dockerfile (e2e/image/build.sh), run by
//! a real kubelet and containerd (e2e/real-node.sh) with the sandboxd
//! simulator as the node's sandboxd on loopback. The virtual Node
//! `<node>-sandboxd` registers through the Pod's ServiceAccount token;
//! Sandboxes made by the agent-sandbox controller go Running on it. Then the
//! Pod is deleted (restart), rolled out to a new image (upgrade), rolled
//! back, and the node rebooted: each time the claims survive on the
//! hostPath, the Sandboxes' Pods stay Running on the same VMs, nothing is
//! released, and two vk-sandbox processes never run at once.
//!
//! `VK_REAL_NODE_MANIFESTS=<dir>` runs the scenario on another copy of the
//! manifests (a folder with rbac.yaml, daemonset.yaml and a
//! kustomization.yaml), e.g. an older daemonset.yaml to show it fail.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use sandbox_controller::Sandbox;
use sandboxd_sim::SimHandle;
use support::real_node::{self, OverlapWatch, RealNode};
use support::vk::tail;
use support::{TestCluster, wait_for};

const NS: &str = "sandbox-system";
const TOKEN: &str = "real-node-root-token";
const LABEL: &str = "app.kubernetes.io/name=vk-sandbox";
const CLAIM_ID: &str = "sandbox.cocoonstack.io/claim-id";
const SANDBOXES: [&str; 2] = ["rn-a", "rn-b"];
/// On the namespaces of this test's Sandboxes: an earlier run that died
/// before its clean-up is recognised by it.
const RUN_LABEL: &str = "vk-sandbox.test/real-node";

/// What a run leaves on the cluster, removed when the test ends however it
/// ends (before the node goes: the DaemonSet's vk-sandbox releases the
/// Sandboxes' VMs as their namespace goes).
struct ClusterCleanup {
    kubeconfig: PathBuf,
    ns: String,
    vnode: String,
}

impl ClusterCleanup {
    fn kubectl(&self, args: &[&str]) {
        let _ = std::process::Command::new(support::kubectl::path())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output();
    }
}

impl Drop for ClusterCleanup {
    fn drop(&mut self) {
        self.kubectl(&[
            "delete",
            "namespace",
            &self.ns,
            "--ignore-not-found",
            "--timeout=90s",
        ]);
        self.kubectl(&[
            "-n",
            NS,
            "delete",
            "daemonset",
            "vk-sandbox",
            "--ignore-not-found",
            "--timeout=90s",
        ]);
        self.kubectl(&[
            "-n",
            NS,
            "delete",
            "secret",
            "sandboxd-token",
            "--ignore-not-found",
        ]);
        self.kubectl(&["delete", "node", &self.vnode, "--ignore-not-found"]);
    }
}

/// Namespaces of earlier runs that died: deleted, and waited for, before
/// the virtual Node comes back (it would adopt and claim their Pods). With
/// no vk-sandbox running, their Pods go once the Node is gone (Pod GC).
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
    eprintln!("real node: removing the namespaces of earlier runs: {old:?}");
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

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `from` relative to the folder `base` (kustomize refuses absolute bases).
fn relative(base: &Path, to: &Path) -> PathBuf {
    let up = base.components().count() - 1;
    let mut p = PathBuf::new();
    for _ in 0..up {
        p.push("..");
    }
    p.join(to.strip_prefix("/").unwrap_or(to))
}

/// The containerID of the Pod's vk-sandbox container ("" before it runs).
fn main_container_id(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == "vk-sandbox"))
        .and_then(|c| c.container_id.clone())
        .unwrap_or_default()
}

struct Scenario {
    cluster: TestCluster,
    sim: SimHandle,
    node: String,
    vnode: String,
    overlay: PathBuf,
    ns: String,
    /// The apiserver's port on loopback (the Pod's in-cluster address: no
    /// kube-proxy runs on this node to serve the Service IP).
    api_port: u16,
    ports: (u16, u16),
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

    /// The overlay a user writes: the shipped base, the image names and
    /// the ports (kubelet API, admin, sandboxd's URL, the apiserver's).
    fn write_overlay(&self, tag: &str) {
        let base = std::env::var_os("VK_REAL_NODE_MANIFESTS")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo().join("manifests"));
        let (k, a) = self.ports;
        let sim_port = self.sim.addr().port();
        let text = format!(
            r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {base}
images:
  - name: vk-sandbox
    newName: vk-sandbox
    newTag: {tag}
  - name: busybox
    newName: vk-sandbox.test/busybox
    newTag: debian
patches:
  - target: {{kind: DaemonSet, name: vk-sandbox}}
    patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {{name: vk-sandbox}}
      spec:
        template:
          spec:
            containers:
              - name: vk-sandbox
                env:
                  - {{name: VK_LISTEN_ADDR, value: ":{k}"}}
                  - {{name: VK_ADMIN_ADDR, value: ":{a}"}}
                  - {{name: SANDBOXD_URL, value: "http://127.0.0.1:{sim_port}"}}
                  - {{name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}}
                  - {{name: KUBERNETES_SERVICE_PORT, value: "{api}"}}
                livenessProbe: {{httpGet: {{port: {a}}}}}
                readinessProbe: {{httpGet: {{port: {a}}}}}
  - target: {{kind: DaemonSet, name: vk-sandbox}}
    patch: |-
      - {{op: replace, path: /spec/template/spec/containers/0/ports, value: [{{name: kubelet, containerPort: {k}, protocol: TCP}}, {{name: admin, containerPort: {a}, protocol: TCP}}]}}
"#,
            base = relative(&self.overlay, &base).display(),
            api = self.api_port,
        );
        std::fs::write(self.overlay.join("kustomization.yaml"), text).expect("write the overlay");
    }

    async fn apply(&self, tag: &str) {
        self.write_overlay(tag);
        let dir = self.overlay.display().to_string();
        self.kubectl(&["apply", "--server-side", "--force-conflicts", "-k", &dir])
            .await;
    }

    fn daemon_pods(&self) -> Api<Pod> {
        Api::namespaced(self.client(), NS)
    }

    /// The DaemonSet's Pod on the real node once it is Ready (and not a
    /// terminating one), with its image.
    async fn wait_daemon_ready(&self, what: &str, not_container: Option<&str>, image: &str) -> Pod {
        let pods = self.daemon_pods();
        let lp = ListParams::default()
            .labels(LABEL)
            .fields(&format!("spec.nodeName={}", self.node));
        wait_for(
            &format!("the vk-sandbox Pod on Node {} Ready ({what})", self.node),
            Duration::from_secs(180),
            || async {
                let list = pods.list(&lp).await.map_err(|e| e.to_string())?;
                let mut seen = Vec::new();
                for p in list.items {
                    let uid = p.metadata.uid.clone().unwrap_or_default();
                    let st = p.status.clone().unwrap_or_default();
                    let container = main_container_id(&p);
                    let ready = st
                        .conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    let img = p
                        .spec
                        .as_ref()
                        .map(|s| s.containers[0].image.clone().unwrap_or_default())
                        .unwrap_or_default();
                    if ready
                        && p.metadata.deletion_timestamp.is_none()
                        && !container.is_empty()
                        && Some(container.as_str()) != not_container
                        && img.ends_with(image)
                    {
                        return Ok(p);
                    }
                    seen.push(format!(
                        "{} uid {uid} image {img} phase {:?} ready {ready} init {:?}",
                        p.metadata.name.clone().unwrap_or_default(),
                        st.phase,
                        st.init_container_statuses
                            .iter()
                            .flatten()
                            .map(|s| format!(
                                "{:?} (last {:?}) restarts {}",
                                s.state, s.last_state, s.restart_count
                            ))
                            .collect::<Vec<_>>()
                    ));
                }
                Err(seen.join("; "))
            },
        )
        .await
    }

    /// Logs of the init container (the restart bug shows there).
    async fn init_logs(&self, pod: &str) -> String {
        let (_, out) = support::kubectl::run(
            &self.cluster.kubeconfig,
            &[
                "-n",
                NS,
                "logs",
                pod,
                "-c",
                "state-dir-owner",
                "--tail",
                "5",
            ],
        )
        .await;
        out
    }

    async fn wait_vnode_ready(&self) -> Node {
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
                    Some("True") => Ok(n),
                    other => Err(format!("Ready = {other:?}")),
                }
            },
        )
        .await
    }

    fn sandbox_pods(&self) -> Api<Pod> {
        Api::namespaced(self.client(), &self.ns)
    }

    /// (Pod UID, claim id) of each Sandbox's Pod once Running.
    async fn sandbox_running(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for name in SANDBOXES {
            let pods = self.sandbox_pods();
            out.push(
                wait_for(
                    &format!("the Pod of Sandbox {name} Running with a claim"),
                    Duration::from_secs(90),
                    || async {
                        let p = pods
                            .get_opt(name)
                            .await
                            .map_err(|e| e.to_string())?
                            .ok_or("no Pod yet")?;
                        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                        let id = p
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(CLAIM_ID).cloned())
                            .unwrap_or_default();
                        if phase.as_deref() == Some("Running") && !id.is_empty() {
                            Ok((p.metadata.uid.clone().unwrap_or_default(), id))
                        } else {
                            Err(format!("phase {phase:?}, claim id {id:?}"))
                        }
                    },
                )
                .await,
            );
        }
        out
    }

    /// After a restart, upgrade, rollback or reboot: the claims, the
    /// Sandboxes' Pods and the simulator's rows are as they were.
    /// Claim requests sandboxd has seen so far.
    fn claim_posts(&self) -> usize {
        self.sim
            .sim()
            .requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path == "/v1/claim")
            .count()
    }

    async fn assert_survived(&self, step: &str, before: &[(String, String)], posts_before: usize) {
        self.wait_vnode_ready().await;
        let now = self.sandbox_running().await;
        assert_eq!(
            now, before,
            "{step}: the Sandboxes' Pods (uid, claim id) changed"
        );
        let releases = support::sim::releases(&self.sim);
        assert!(
            releases.is_empty(),
            "{step}: sandboxd got release requests: {releases:?}"
        );
        let rows: Vec<String> = self.sim.sim().claims().into_iter().map(|c| c.id).collect();
        let claims = self.claim_posts();
        for (_, id) in before {
            assert!(
                rows.contains(id),
                "{step}: claim {id} is not live in sandboxd: {rows:?}"
            );
        }
        assert_eq!(
            claims, posts_before,
            "{step}: sandboxd got new claim requests"
        );
        // The claims state on the hostPath (snapshot + journal), read with
        // vk-sandbox's own read-only tool.
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
        for (_, id) in before {
            assert!(
                state.contains(id.as_str()),
                "{step}: the claims state on the hostPath lacks claim {id}: {state}"
            );
        }
        let meta = std::fs::metadata("/var/lib/vk-sandbox").expect("stat the hostPath");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (65532, 65532, 0o700),
            "{step}: the hostPath's owner and mode"
        );
        eprintln!(
            "real node: {step}: claims {:?} survived on the hostPath, Sandboxes Running on the same VMs, nothing released",
            before.iter().map(|(_, id)| id.as_str()).collect::<Vec<_>>()
        );
    }

    /// The running daemon's process: UID 65532, no capabilities, no new
    /// privileges, read-only root filesystem.
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
            "{step}: the root filesystem is mounted {root}"
        );
        pids[0]
    }

    /// A transition (restart, rollout, reboot) watched for two daemons at once.
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
        eprintln!(
            "real node: {step}: processes {:?} one after the other ({} samples, never two at once)",
            seen.pids, seen.samples
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn daemonset_on_a_real_node_survives_restart_upgrade_rollback_and_reboot() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    // Events of earlier runs are not this run's (Event times are seconds).
    let started = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(1);
    let Some(node) = RealNode::up_or_skip("the DaemonSet on a real node") else {
        return;
    };
    eprintln!(
        "real node: the scenario runs on Node {} (kubelet + containerd on this machine)",
        node.name
    );

    // Images, made here from the Dockerfile's final stage (two tags of one
    // binary, told apart by a label, for the rollout) and busybox for the
    // init container; imported, never pulled.
    let images = support::vk::test_dir("real-node-images");
    // Without its debug info, as the release profile strips it.
    let bin = images.join("vk-sandbox");
    let strip = std::process::Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&bin)
        .arg(real_node::static_binary())
        .status()
        .expect("run strip (binutils)");
    assert!(
        strip.success(),
        "strip --strip-debug of the static binary: {strip}"
    );
    let (a, b, bb) = (
        images.join("vk-sandbox-a.tar"),
        images.join("vk-sandbox-b.tar"),
        images.join("busybox.tar"),
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
    node.import(&[&a, &b, &bb]);

    // sandboxd: the simulator on loopback, one warm pool.
    let sim = support::sim::start(support::sim::config(TOKEN, &["base:24.04=8"])).await;
    support::controller::install_crds(&cluster.client, &cluster.kubeconfig).await;
    let api_port = kube::config::Kubeconfig::read_from(&cluster.kubeconfig)
        .ok()
        .and_then(|kc| kc.clusters.first()?.cluster.as_ref()?.server.clone())
        .and_then(|s| s.rsplit(':').next()?.trim_end_matches('/').parse().ok())
        .expect("the apiserver's port in the admin kubeconfig");
    let overlay = support::vk::test_dir("real-node-overlay");
    let vnode = format!("{}-sandboxd", node.name);
    remove_earlier_runs(&cluster, &vnode).await;
    let ns = cluster.namespace("real-node").await;
    let (ok, out) = support::kubectl::run(
        &cluster.kubeconfig,
        &["label", "namespace", &ns, &format!("{RUN_LABEL}=true")],
    )
    .await;
    assert!(ok, "label namespace {ns}: {out}");
    let cleanup = ClusterCleanup {
        kubeconfig: cluster.kubeconfig.clone(),
        ns: ns.clone(),
        vnode: vnode.clone(),
    };
    let sc = Scenario {
        vnode,
        node: node.name.clone(),
        sim,
        overlay,
        ns,
        api_port,
        ports: (support::process::free_port(), support::process::free_port()),
        cluster,
    };
    let client = sc.client();

    // The installation's steps: namespace (privileged Pod Security level),
    // label, token Secret, RBAC + DaemonSet.
    // (It may exist: other tests apply the RBAC into it.)
    let _ = support::kubectl::run(&sc.cluster.kubeconfig, &["create", "namespace", NS]).await;
    sc.kubectl(&[
        "label",
        "--overwrite",
        "namespace",
        NS,
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
    let secret: Secret = support::from_json(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "sandboxd-token", "namespace": NS},
        "stringData": {"token": TOKEN},
    }));
    Api::<Secret>::namespaced(client.clone(), NS)
        .patch(
            "sandboxd-token",
            &PatchParams::apply("vk-sandbox-tests").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("the sandboxd-token Secret");
    // A virtual Node left by an earlier run would hide the registration.
    let _ = Api::<Node>::all(client.clone())
        .delete(&sc.vnode, &DeleteParams::default())
        .await;

    sc.apply("e2e-a").await;
    let pod = sc
        .wait_daemon_ready("first start", None, "vk-sandbox:e2e-a")
        .await;
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let vnode = sc.wait_vnode_ready().await;
    let labels = vnode.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("type").map(String::as_str),
        Some("virtual-kubelet")
    );
    let addresses: Vec<String> = vnode
        .status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .map(|a| a.address)
        .collect();
    assert_eq!(
        addresses.first().map(String::as_str),
        Some("127.0.0.1"),
        "VK_NODE_IP = status.hostIP"
    );
    let mut pid = sc.assert_process("first start");
    eprintln!(
        "real node: vk-sandbox Pod {pod_name} Ready; virtual Node {} Ready; process {pid} runs as 65532, no capabilities, read-only root",
        sc.vnode
    );
    // Registered with the Pod's own ServiceAccount token (its audit entry
    // names the Pod), when this plane writes vk-sandbox's audit log.
    if let Some(dir) = std::env::var_os("VK_CLUSTER_LOGS") {
        let log = PathBuf::from(dir).join("vk-sandbox-audit.log");
        if let Ok(text) = std::fs::read_to_string(&log) {
            let created = text
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .any(|e| {
                    e["verb"] == "create"
                        && e["objectRef"]["resource"] == "nodes"
                        && e["objectRef"]["name"] == sc.vnode.as_str()
                        && e["user"]["username"]
                            == "system:serviceaccount:sandbox-system:vk-sandbox"
                        && e["user"]["extra"]["authentication.kubernetes.io/pod-name"][0]
                            == pod_name.as_str()
                });
            assert!(
                created,
                "no audit entry of Node {} created with the token of Pod {pod_name}",
                sc.vnode
            );
            eprintln!(
                "real node: Node {} was created with the ServiceAccount token of Pod {pod_name} (audit log)",
                sc.vnode
            );
        }
    }

    // Sandboxes through the agent-sandbox controller, on the virtual node.
    let _controller = support::controller::start(&client, &sc.cluster.kubeconfig, &sc.ns).await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &sc.ns);
    for name in SANDBOXES {
        let sb: Sandbox = serde_json::from_value(support::controller::contract_sandbox(
            name,
            "base:24.04",
            Some(&sc.vnode),
        ))
        .expect("sandbox json");
        sandboxes
            .create(&PostParams::default(), &sb)
            .await
            .expect("create Sandbox");
    }
    let running = sc.sandbox_running().await;
    eprintln!("real node: Sandboxes {SANDBOXES:?} Running with claims {running:?}");
    let posts = sc.claim_posts();
    sc.assert_survived("first start", &running, posts).await;

    // 1. Restart: the Pod deleted; the DaemonSet makes a new one, whose
    // init container meets the 0700 65532 directory.
    let watch = OverlapWatch::start();
    sc.kubectl(&["-n", NS, "delete", "pod", &pod_name, "--wait=false"])
        .await;
    let prev = main_container_id(&pod);
    let pod = sc
        .wait_daemon_ready("after the Pod's deletion", Some(&prev), "vk-sandbox:e2e-a")
        .await;
    assert_ne!(pod.metadata.uid, None);
    sc.assert_no_overlap("restart", &watch.finish(), pid);
    pid = sc.assert_process("restart");
    sc.assert_survived("restart", &running, posts).await;

    // 2. Upgrade: the overlay's image tag changed and applied again.
    let watch = OverlapWatch::start();
    sc.apply("e2e-b").await;
    sc.kubectl(&[
        "-n",
        NS,
        "rollout",
        "status",
        "daemonset/vk-sandbox",
        "--timeout=180s",
    ])
    .await;
    let prev = main_container_id(&pod);
    let pod = sc
        .wait_daemon_ready(
            "after the rollout to e2e-b",
            Some(&prev),
            "vk-sandbox:e2e-b",
        )
        .await;
    sc.assert_no_overlap("upgrade", &watch.finish(), pid);
    pid = sc.assert_process("upgrade");
    sc.assert_survived("upgrade", &running, posts).await;

    // 3. Rollback: kubectl rollout undo.
    let watch = OverlapWatch::start();
    sc.kubectl(&["-n", NS, "rollout", "undo", "daemonset/vk-sandbox"])
        .await;
    sc.kubectl(&[
        "-n",
        NS,
        "rollout",
        "status",
        "daemonset/vk-sandbox",
        "--timeout=180s",
    ])
    .await;
    let prev = main_container_id(&pod);
    let pod = sc
        .wait_daemon_ready(
            "after the rollback to e2e-a",
            Some(&prev),
            "vk-sandbox:e2e-a",
        )
        .await;
    sc.assert_no_overlap("rollback", &watch.finish(), pid);
    pid = sc.assert_process("rollback");
    sc.assert_survived("rollback", &running, posts).await;

    // 4. Node reboot: kubelet and containerd restarted, containers gone; the
    // same Pod starts again (its init container first).
    let watch = OverlapWatch::start();
    node.reboot();
    let prev = main_container_id(&pod);
    let same = sc
        .wait_daemon_ready("after the node's reboot", Some(&prev), "vk-sandbox:e2e-a")
        .await;
    assert_eq!(
        same.metadata.uid, pod.metadata.uid,
        "reboot: the DaemonSet's Pod is the same one"
    );
    sc.assert_no_overlap("reboot", &watch.finish(), pid);
    sc.assert_process("reboot");
    sc.assert_survived("reboot", &running, posts).await;
    let init_log = sc
        .init_logs(&same.metadata.name.clone().unwrap_or_default())
        .await;
    assert!(
        !init_log.contains("Permission denied"),
        "init container: {init_log}"
    );

    // Nothing was pulled: every image came from the node's own store.
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
    eprintln!(
        "real node: no image was pulled (no Pulling event): all came from e2e/image/build.sh"
    );

    // Clean-up: Sandboxes (released now, as designed), the DaemonSet, the
    // virtual Node, then the node itself, checked to leave the host as found.
    for name in SANDBOXES {
        let _ = sandboxes.delete(name, &DeleteParams::default()).await;
    }
    let pods = sc.sandbox_pods();
    wait_for(
        "the Sandboxes' Pods gone (released by the DaemonSet's vk-sandbox)",
        Duration::from_secs(90),
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
    sc.kubectl(&[
        "-n",
        NS,
        "delete",
        "daemonset",
        "vk-sandbox",
        "--wait=true",
        "--timeout=120s",
    ])
    .await;
    sc.kubectl(&[
        "-n",
        NS,
        "delete",
        "secret",
        "sandboxd-token",
        "--ignore-not-found",
    ])
    .await;
    let _ = Api::<Node>::all(client.clone())
        .delete(&sc.vnode, &DeleteParams::default())
        .await;
    drop(cleanup);
    let (ok, report) = node.down();
    eprintln!("{report}");
    assert!(
        ok,
        "the real node's teardown did not leave the host as found:\n{}",
        tail(&report, 40)
    );
}
