//! Per-test setup for running vk-sandbox against the shared cluster with the
//! shipped RBAC: a ServiceAccount kubeconfig (made once per test binary), a
//! private state folder, and the process itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::DeleteParams;
use kube::{Api, Client};
use tokio::sync::OnceCell;

use super::nodes::NodeCleanup;
use super::process::{DEFAULT_RUST_LOG, VkProcess, free_port};
use super::{TestCluster, sim, wait_for};

static SA_KUBECONFIG: OnceCell<PathBuf> = OnceCell::const_new();

/// A folder that outlives the test binary's run only when kept for
/// debugging (VK_KEEP_TEST_DIRS=1).
pub fn test_dir(prefix: &str) -> PathBuf {
    let base = std::env::temp_dir().join("vk-sandbox-tests");
    std::fs::create_dir_all(&base).expect("create test base dir");
    let d = tempfile::Builder::new()
        .prefix(&format!("{prefix}-"))
        .tempdir_in(&base)
        .expect("create test dir");
    d.keep()
}

/// The kubeconfig of the `vk-sandbox` ServiceAccount (manifests/rbac.yaml).
pub async fn sa_kubeconfig(cluster: &TestCluster) -> PathBuf {
    SA_KUBECONFIG
        .get_or_init(|| async {
            let dir = test_dir("sa");
            let out = dir.join("vk-sandbox.kubeconfig");
            super::rbac::service_account_kubeconfig(&cluster.client, &cluster.kubeconfig, &out)
                .await
                .unwrap_or_else(|e| panic!("service account kubeconfig: {e}"))
        })
        .await
        .clone()
}

pub struct VkUnderTest {
    pub node: String,
    pub dir: PathBuf,
    pub state_path: PathBuf,
    pub kubeconfig: PathBuf,
    pub process: VkProcess,
    rust_log: String,
    /// Deletes the Node when this is dropped, the test failed or not
    /// (after the process is stopped: a running vk-sandbox would register
    /// it again).
    node_cleanup: NodeCleanup,
}

impl Drop for VkUnderTest {
    fn drop(&mut self) {
        if let Some(mut c) = self.process.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // `node_cleanup` is dropped next: the Node goes.
    }
}

/// Options of [`VkUnderTest::start_with`].
#[derive(Default)]
pub struct StartOpts<'a> {
    /// Written to the state path first (a Go `claims.json`).
    pub state: Option<&'a str>,
    /// `RUST_LOG` of the process (default `info,vk_sandbox=debug`).
    pub rust_log: Option<&'a str>,
}

impl VkUnderTest {
    /// Starts vk-sandbox for a fresh node `<prefix>-<random>` with the
    /// shipped RBAC, node IP 127.0.0.1, a private state path, plus `extra`.
    pub async fn start(cluster: &TestCluster, prefix: &str, extra: &[&str]) -> VkUnderTest {
        Self::start_with(cluster, prefix, extra, StartOpts::default()).await
    }

    /// [`VkUnderTest::start`] with options.
    pub async fn start_with(
        cluster: &TestCluster,
        prefix: &str,
        extra: &[&str],
        opts: StartOpts<'_>,
    ) -> VkUnderTest {
        let node = format!("{prefix}-{}", super::suffix());
        let kubeconfig = sa_kubeconfig(cluster).await;
        let dir = test_dir(&node);
        let state_path = dir.join("state").join("claims.json");
        if let Some(state) = opts.state {
            std::fs::create_dir_all(dir.join("state")).expect("create the state dir");
            std::fs::write(&state_path, state).expect("seed the state file");
        }
        let rust_log = opts.rust_log.unwrap_or(DEFAULT_RUST_LOG).to_string();
        let node_cleanup = NodeCleanup::new(cluster.kubeconfig.clone(), &node);
        let mut vk = VkUnderTest {
            node,
            dir,
            state_path,
            kubeconfig,
            process: VkProcess::none(),
            rust_log,
            node_cleanup,
        };
        vk.process = vk.spawn(extra, None);
        vk
    }

    fn spawn(&self, extra: &[&str], ports: Option<(u16, u16)>) -> VkProcess {
        let mut args = node_args(&self.node, &self.state_path);
        // Many tests run no sandboxd, or stop it on purpose, and still want
        // their Pods bound here: sandboxd's taints only where a test asks
        // for them (tests/e2e_fleet.rs). Conditions and capacity stay on.
        if !extra
            .iter()
            .any(|a| a.starts_with("--node-taints-from-sandboxd"))
        {
            args.push("--node-taints-from-sandboxd=false".into());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (k, a) = ports.unwrap_or_else(|| (free_port(), free_port()));
        VkProcess::start_with_ports_log(
            &self.kubeconfig,
            &args,
            self.dir.join(format!("{}.log", self.node)),
            k,
            a,
            &self.rust_log,
        )
    }

    /// Starts the process again with the same node, state and ports.
    pub fn restart(&mut self, extra: &[&str]) {
        let ports = (self.process.kubelet_port, self.process.admin_port);
        self.process = self.spawn(extra, Some(ports));
        self.node_cleanup.pending();
    }

    pub fn logs(&self) -> String {
        self.process.logs()
    }

    /// The admin port's `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.process
            .metrics()
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", tail(&self.logs(), 30)))
    }

    /// Waits until the Node reports Ready=True.
    pub async fn wait_ready(&self, client: &Client, timeout: Duration) -> Node {
        let nodes: Api<Node> = Api::all(client.clone());
        let logs = || self.logs();
        wait_for(&format!("Node {} Ready", self.node), timeout, || async {
            let n = nodes
                .get_opt(&self.node)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("no Node yet; vk-sandbox log:\n{}", tail(&logs(), 30)))?;
            if node_condition(&n, "Ready").as_deref() == Some("True") {
                Ok(n)
            } else {
                Err(format!(
                    "Ready = {:?}; vk-sandbox log:\n{}",
                    node_condition(&n, "Ready"),
                    tail(&logs(), 30)
                ))
            }
        })
        .await
    }

    /// Stops the process (a running vk-sandbox registers a deleted Node
    /// again), then deletes the Node (its Lease goes with it through the
    /// owner reference).
    pub async fn delete_node(&self, client: &Client) {
        if self.process.child.is_some() {
            self.process.signal(nix::sys::signal::Signal::SIGKILL);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let deleted = Api::<Node>::all(client.clone())
            .delete(&self.node, &DeleteParams::default())
            .await;
        if deleted.is_ok() {
            self.node_cleanup.done();
        }
    }
}

/// The flags that make vk-sandbox the virtual node `node` on 127.0.0.1,
/// its claims state at `state_path`.
pub fn node_args(node: &str, state_path: &Path) -> Vec<String> {
    vec![
        format!("--node-name={node}"),
        "--node-ip=127.0.0.1".into(),
        format!("--state-path={}", state_path.display()),
    ]
}

pub fn node_condition(n: &Node, type_: &str) -> Option<String> {
    node_condition_of(n, type_).map(|c| c.status.clone())
}

/// The Node's condition of type `type_`, whole.
pub fn node_condition_of<'a>(
    n: &'a Node,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::NodeCondition> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

pub fn tail(text: &str, lines: usize) -> String {
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// A sandboxd simulator (one warm pool `base:24.04=8`, root token `token`)
/// and vk-sandbox started against it for a fresh node `<prefix>-<random>`,
/// Ready; returns both and the token file.
pub async fn with_simulator(
    cluster: &TestCluster,
    prefix: &str,
    token: &str,
) -> (sandboxd_sim::SimHandle, VkUnderTest, PathBuf) {
    let sim = sim::start(sim::config(token, &["base:24.04=8"])).await;
    let token_file = sim::token_file(&test_dir(prefix), token);
    let args = sim::vk_args(&sim, Some(&token_file));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let vk = VkUnderTest::start(cluster, prefix, &args).await;
    vk.wait_ready(&cluster.client, Duration::from_secs(30))
        .await;
    (sim, vk, token_file)
}
