//! "The Sandbox controller" for everything that runs Sandboxes on a cluster
//! (the e2e tests, the reliability suite, the benchmarks): the upstream
//! kubernetes-sigs/agent-sandbox controller at the release of
//! `e2e/agent-sandbox-version` (or `VK_AGENT_SANDBOX`, e.g. `pre-1.0`),
//! fetched, built and run by `e2e/agent-sandbox.sh`, or — only where it
//! cannot be fetched or built and `VK_REQUIRE_REAL_CONTROLLER` is not 1 —
//! the stand-in of `e2e/sandbox-controller`, named as such in the output.
//!
//! The upstream controller watches every namespace, so one process per
//! test binary serves all of its tests; it runs with leader election, so
//! binaries (or the demo) sharing a cluster never reconcile at once, and it
//! is stopped (SIGTERM, releasing the Lease) when the binary exits. The
//! stand-in runs in-process, one per namespace, as before.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};
use serde_json::{Value, json};

/// The Lease the upstream controller's leader election holds.
pub const LEASE_NAMESPACE: &str = "kube-system";
pub const LEASE_NAME: &str = "a3317529.agent-sandbox.x-k8s.io";

/// The Sandbox CRD's name (the same for upstream and the stand-in).
pub const SANDBOX_CRD: &str = "sandboxes.agents.x-k8s.io";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// kubernetes-sigs/agent-sandbox at `release`, built by e2e/agent-sandbox.sh.
    Upstream { binary: PathBuf, release: String },
    /// e2e/sandbox-controller, where upstream cannot run.
    StandIn { why: String },
}

/// The pre-1.0 tree's release name (`VK_AGENT_SANDBOX=pre-1.0`).
pub const PRE_1_0: &str = "pre-1.0";

/// The agent-sandbox release this process runs: `VK_AGENT_SANDBOX`, else
/// the version pinned in `e2e/agent-sandbox-version` (as the script reads
/// them).
pub fn release() -> String {
    std::env::var("VK_AGENT_SANDBOX")
        .ok()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| {
            let pin = repo().join("e2e/agent-sandbox-version");
            std::fs::read_to_string(&pin)
                .unwrap_or_else(|e| panic!("read {}: {e}", pin.display()))
                .trim()
                .to_string()
        })
}

/// True when the upstream controller of a 1.0 (or later) release runs,
/// not the pre-1.0 tree.
pub fn is_release_1_0(kind: &Kind) -> bool {
    matches!(kind, Kind::Upstream { release, .. } if release != PRE_1_0)
}

impl Kind {
    pub fn is_upstream(&self) -> bool {
        matches!(self, Kind::Upstream { .. })
    }
}

/// One line saying which controller runs and, for the stand-in, why.
pub fn describe(kind: &Kind) -> String {
    match kind {
        Kind::Upstream { binary, release } => format!(
            "Sandbox controller: upstream kubernetes-sigs/agent-sandbox {release} ({})",
            binary.display()
        ),
        Kind::StandIn { why } => format!(
            "Sandbox controller: STAND-IN e2e/sandbox-controller, not the upstream controller ({why})"
        ),
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn script() -> PathBuf {
    repo().join("e2e/agent-sandbox.sh")
}

static KIND: OnceLock<Kind> = OnceLock::new();

/// Which Sandbox controller this checkout runs, decided once per process by
/// `e2e/agent-sandbox.sh build` (which fetches and builds it when the cache
/// is cold). Panics when the build fails, or when upstream cannot run and
/// `VK_REQUIRE_REAL_CONTROLLER=1`.
pub fn kind() -> &'static Kind {
    KIND.get_or_init(|| {
        let out = Command::new(script())
            .arg("build")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", script().display()));
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let kind = match out.status.code() {
            Some(0) => Kind::Upstream {
                binary: PathBuf::from(stdout.lines().last().unwrap_or_default()),
                release: release(),
            },
            Some(3) => Kind::StandIn {
                why: stdout
                    .split_once(": ")
                    .map_or(stdout.clone(), |(_, why)| why.to_string()),
            },
            _ => panic!(
                "e2e/agent-sandbox.sh build failed ({}):\n{stderr}\n{stdout}",
                out.status
            ),
        };
        eprintln!("{}", describe(&kind));
        kind
    })
}

/// Whether a test needing upstream may skip: not where
/// `VK_REQUIRE_REAL_CONTROLLER=1` (CI and `make test` set it).
fn skipping_allowed() -> bool {
    std::env::var("VK_REQUIRE_REAL_CONTROLLER").as_deref() != Ok("1")
}

/// True when the upstream controller runs; otherwise says why `what` is
/// skipped. Panics instead where `VK_REQUIRE_REAL_CONTROLLER=1`: such a
/// test never passes by skipping there (the stand-in then only runs when
/// asked for with `VK_SANDBOX_CONTROLLER=stand-in`, which that forbids too).
pub fn upstream_or_skip(what: &str) -> bool {
    match kind() {
        Kind::Upstream { .. } => true,
        Kind::StandIn { why } if skipping_allowed() => {
            eprintln!("SKIPPED: {what} needs the upstream agent-sandbox controller: {why}");
            false
        }
        Kind::StandIn { why } => panic!(
            "{what} needs the upstream agent-sandbox controller, and VK_REQUIRE_REAL_CONTROLLER=1 \
             forbids skipping it: {why}"
        ),
    }
}

// ------------------------------------------------------------------ upstream

/// A running upstream controller process, restarted when it exits (as its
/// Deployment would: with leader election it exits when it cannot renew
/// its Lease, e.g. through an apiserver outage).
pub struct Upstream {
    sup: Arc<Mutex<Supervised>>,
    pub log: PathBuf,
}

#[derive(Default)]
struct Supervised {
    pid: Option<u32>,
    stopping: bool,
    /// Exits so far, with their status.
    exits: Vec<String>,
}

fn lock(m: &Mutex<Supervised>) -> std::sync::MutexGuard<'_, Supervised> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Upstream {
    /// Starts `e2e/agent-sandbox.sh run <kubeconfig>` (CRDs applied and
    /// Established first), its output appended to `log`, and keeps it
    /// running. The process gets SIGTERM when this process exits (it is
    /// forked from a thread that lives as long as the process). Returns once
    /// the CRDs serve and some controller holds the leader Lease.
    pub async fn spawn(client: &Client, kubeconfig: &Path, log: &Path) -> Result<Upstream, String> {
        let sup = Arc::new(Mutex::new(Supervised::default()));
        let (tx, rx) = std::sync::mpsc::channel();
        let (kubeconfig_owned, log_owned, sup2) =
            (kubeconfig.to_path_buf(), log.to_path_buf(), sup.clone());
        std::thread::Builder::new()
            .name("agent-sandbox-controller".into())
            .spawn(move || {
                // The parent of PR_SET_PDEATHSIG is this thread: it lives
                // until the process exits, spawning each incarnation.
                let mut first = Some(tx);
                loop {
                    if lock(&sup2).stopping {
                        std::thread::park();
                        continue;
                    }
                    let child = spawn_once(&kubeconfig_owned, &log_owned);
                    let mut child = match child {
                        Ok(c) => c,
                        Err(e) => {
                            if let Some(tx) = first.take() {
                                let _ = tx.send(Err(e));
                            }
                            std::thread::park();
                            continue;
                        }
                    };
                    lock(&sup2).pid = Some(child.id());
                    if let Some(tx) = first.take() {
                        let _ = tx.send(Ok(()));
                    }
                    let status = child
                        .wait()
                        .map_or_else(|e| e.to_string(), |s| s.to_string());
                    let mut st = lock(&sup2);
                    st.pid = None;
                    st.exits.push(status);
                    let stopping = st.stopping;
                    drop(st);
                    if !stopping {
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        rx.recv().map_err(|e| e.to_string())??;
        let up = Upstream {
            sup,
            log: log.to_path_buf(),
        };
        up.wait_serving(client, Duration::from_secs(180)).await?;
        Ok(up)
    }

    /// How often it exited (and was restarted) so far.
    pub fn restarts(&self) -> usize {
        lock(&self.sup).exits.len()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let v: Vec<&str> = text.lines().collect();
        v[v.len().saturating_sub(lines)..].join("\n")
    }

    async fn wait_serving(&self, client: &Client, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let exits = lock(&self.sup).exits.clone();
            if exits.len() >= 3 {
                return Err(format!(
                    "the agent-sandbox controller exited {} times before serving ({}); {}:\n{}",
                    exits.len(),
                    exits.join(", "),
                    self.log.display(),
                    self.log_tail(30)
                ));
            }
            let last = match lease_holder(client).await {
                Ok(Some(_)) if crd_established(client, SANDBOX_CRD).await => return Ok(()),
                Ok(Some(_)) => "the Sandbox CRD is not Established yet".to_string(),
                Ok(None) => "no controller holds the leader Lease yet".to_string(),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "the agent-sandbox controller is not serving after {timeout:?} ({last}); {}:\n{}",
                    self.log.display(),
                    self.log_tail(30)
                ));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// SIGTERM (the controller releases its Lease), then waits for the exit;
    /// it is not restarted.
    pub fn stop(&self) {
        let pid = {
            let mut st = lock(&self.sup);
            st.stopping = true;
            st.pid
        };
        let Some(pid) = pid else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if lock(&self.sup).pid.is_none() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
}

/// One incarnation of `e2e/agent-sandbox.sh run`.
fn spawn_once(kubeconfig: &Path, log: &Path) -> Result<Child, String> {
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(script());
    cmd.arg("run")
        .arg(kubeconfig)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe; nothing else
    // runs between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                .map_err(std::io::Error::from)
        });
    }
    cmd.spawn()
        .map_err(|e| format!("spawn {}: {e}", script().display()))
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The holder of the leader Lease when it is held and fresh.
pub async fn lease_holder(client: &Client) -> Result<Option<String>, String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let Some(lease) = leases
        .get_opt(LEASE_NAME)
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let Some(spec) = lease.spec else {
        return Ok(None);
    };
    let holder = spec.holder_identity.filter(|h| !h.is_empty());
    let fresh = match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(t), Some(d)) => {
            t.0 + jiff::SignedDuration::from_secs(i64::from(d)) > jiff::Timestamp::now()
        }
        _ => false,
    };
    Ok(holder.filter(|_| fresh))
}

async fn crd_established(client: &Client, name: &str) -> bool {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.get_opt(name).await.ok().flatten().is_some_and(|c| {
        c.status.and_then(|s| s.conditions).is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
    })
}

/// Where the shared controller's output goes: beside the control plane's
/// logs when the run has them (so failures print its tail), else a
/// temporary folder.
fn log_path() -> PathBuf {
    let dir = std::env::var_os("VK_CLUSTER_LOGS")
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(|| {
            let d = std::env::temp_dir().join("vk-sandbox-tests");
            let _ = std::fs::create_dir_all(&d);
            d
        });
    dir.join("agent-sandbox-controller.log")
}

static SHARED: tokio::sync::OnceCell<Result<Upstream, String>> = tokio::sync::OnceCell::const_new();

/// The upstream controller this process shares across its tests, started
/// on first use.
pub async fn shared_upstream(client: &Client, kubeconfig: &Path) -> &'static Upstream {
    let r = SHARED
        .get_or_init(|| async { Upstream::spawn(client, kubeconfig, &log_path()).await })
        .await;
    match r {
        Ok(u) => u,
        Err(e) => panic!("{e}"),
    }
}

// ------------------------------------------------------------------ either

/// What a test holds while it needs the Sandbox controller.
pub struct SandboxController {
    pub kind: Kind,
    _stand_in: Option<sandbox_controller::ControllerHandle>,
}

impl SandboxController {
    pub fn is_upstream(&self) -> bool {
        self.kind.is_upstream()
    }
}

/// Makes sure a Sandbox controller serves namespace `ns`: the shared
/// upstream process, or a stand-in for `ns` alone (its CRD installed only
/// when no Sandbox CRD is there, so upstream's is never replaced).
pub async fn start(client: &Client, kubeconfig: &Path, ns: &str) -> SandboxController {
    let kind = kind().clone();
    match &kind {
        Kind::Upstream { .. } => {
            shared_upstream(client, kubeconfig).await;
            SandboxController {
                kind,
                _stand_in: None,
            }
        }
        Kind::StandIn { .. } => {
            let handle = start_stand_in(client, ns, false).await;
            SandboxController {
                kind,
                _stand_in: Some(handle),
            }
        }
    }
}

/// Installs the CRDs of the chosen controller without running it (for
/// tests that play the controller themselves): upstream's four, applied by
/// `e2e/agent-sandbox.sh crds`, or the stand-in's Sandbox CRD when no
/// Sandbox CRD is there. Returns once their kinds are served.
pub async fn install_crds(client: &Client, kubeconfig: &Path) {
    let kinds: &[&str] = match kind() {
        Kind::Upstream { .. } => {
            let out = Command::new(script())
                .arg("crds")
                .arg(kubeconfig)
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("run {}: {e}", script().display()));
            assert!(
                out.status.success(),
                "e2e/agent-sandbox.sh crds: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            &[
                "Sandbox",
                "SandboxTemplate",
                "SandboxWarmPool",
                "SandboxClaim",
            ]
        }
        Kind::StandIn { .. } => {
            install_stand_in_crd(client).await;
            &["Sandbox"]
        }
    };
    for kind in kinds {
        super::crds::wait_served(client, &resource(kind)).await;
    }
}

async fn install_stand_in_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let present = crds
        .get_opt(SANDBOX_CRD)
        .await
        .unwrap_or_else(|e| panic!("read CRD {SANDBOX_CRD}: {e}"))
        .is_some();
    if !present || !crd_established(client, SANDBOX_CRD).await {
        sandbox_controller::crd::install(client, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("install the stand-in's Sandbox CRD: {e}"));
    }
}

/// The stand-in for `ns` (with sandbox-operator's runtime mutator when
/// `runtime_mutator`), its CRD installed if no Sandbox CRD is there yet.
pub async fn start_stand_in(
    client: &Client,
    ns: &str,
    runtime_mutator: bool,
) -> sandbox_controller::ControllerHandle {
    install_stand_in_crd(client).await;
    sandbox_controller::spawn(
        client.clone(),
        sandbox_controller::Options {
            namespace: Some(ns.to_string()),
            runtime_mutator,
            ..Default::default()
        },
    )
}

// ------------------------------------------------------------------ objects

/// The toleration of the vk-sandbox node's taint.
pub fn provider_toleration() -> Value {
    json!({"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"})
}

/// A `podTemplate` carrying the whole Pod contract (docs/pod-contract.md):
/// the runtime and template annotations, the sandboxd nodeSelector and the
/// provider toleration — what a SandboxTemplate must carry with upstream
/// agent-sandbox, which adds none of it. `node` (when given) pins the Pod
/// to one virtual node by hostname: tests sharing a cluster each run their
/// own sandboxd node.
pub fn contract_pod_template(template: &str, node: Option<&str>) -> Value {
    let mut selector = json!({"sandbox.cocoonstack.io/runtime": "sandboxd"});
    if let Some(n) = node {
        selector["kubernetes.io/hostname"] = json!(n);
    }
    json!({
        "metadata": {"annotations": {
            "sandbox.cocoonstack.io/runtime": "sandboxd",
            "sandbox.cocoonstack.io/template": template,
        }},
        "spec": {
            "nodeSelector": selector,
            "tolerations": [provider_toleration()],
            "containers": [{"name": "agent", "image": template}],
        }
    })
}

/// A Sandbox named `name` whose Pod carries the contract (see
/// [`contract_pod_template`]).
pub fn contract_sandbox(name: &str, template: &str, node: Option<&str>) -> Value {
    json!({
        "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": contract_pod_template(template, node)},
    })
}

/// The API resource of an agent-sandbox kind (`Sandbox`, or the extensions'
/// `SandboxTemplate`, `SandboxWarmPool`, `SandboxClaim`), v1beta1.
/// Sets a Sandbox's `spec.operatingMode` (`Suspended`, `Running`).
pub async fn set_operating_mode<K>(sandboxes: &Api<K>, name: &str, mode: &str)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    sandboxes
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"operatingMode": mode}})),
        )
        .await
        .unwrap_or_else(|e| panic!("set Sandbox {name} {mode}: {e}"));
}

pub fn resource(kind: &str) -> kube::discovery::ApiResource {
    let group = if kind == "Sandbox" {
        "agents.x-k8s.io"
    } else {
        "extensions.agents.x-k8s.io"
    };
    kube::discovery::ApiResource {
        group: group.into(),
        version: "v1beta1".into(),
        api_version: format!("{group}/v1beta1"),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()).replace("sandboxs", "sandboxes"),
    }
}

/// A SandboxTemplate carrying the Pod contract (see [`contract_pod_template`]).
pub fn contract_template(name: &str, template: &str, node: Option<&str>) -> Value {
    json!({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
        "metadata": {"name": name},
        "spec": {"podTemplate": contract_pod_template(template, node)},
    })
}

/// A SandboxWarmPool of `replicas` Sandboxes of the SandboxTemplate `template`.
pub fn warm_pool(name: &str, template: &str, replicas: i32) -> Value {
    json!({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}},
    })
}

/// A SandboxClaim taking a Sandbox from the SandboxWarmPool `pool`.
pub fn sandbox_claim(name: &str, pool: &str) -> Value {
    json!({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"warmPoolRef": {"name": pool}},
    })
}

/// The kind and name of `obj`'s controller ownerReference.
pub fn controller_of(meta: &kube::api::ObjectMeta) -> Option<(String, String, String)> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.kind.clone(), o.name.clone(), o.uid.clone()))
}
