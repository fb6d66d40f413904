//! `make bench`: vk-sandbox measured end to end on the local control plane
//! (e2e/cluster.sh) with the sandboxd simulator in this process, plus the
//! claims-store medians Criterion left in target/criterion. Prints one
//! table and writes it into docs/benchmarks.md (between the
//! `bench:begin`/`bench:end` markers; the prose around them is kept).
//!
//! Inputs (benches/run.sh sets them):
//! - `VK_TEST_KUBECONFIG`: the admin kubeconfig of the local plane;
//! - `BENCH_AUDIT`: `"<url> <audit log>"` of `e2e/cluster.sh audit-apiserver
//!   up` (apiserver load is measured only when set);
//! - `BENCH_SCALE` (default 1): multiplies Pod counts and repetitions;
//! - `BENCH_DOC` (default docs/benchmarks.md; `-` to skip writing);
//! - `BENCH_VK_BIN`: the vk-sandbox binary to measure (default: the
//!   release build cargo made for this bench; e.g. the static musl build);
//! - `BENCH_FLEET` (default `1,50,200`): the fleet sizes of the `fleet` part;
//! - `BENCH_FLEET_PODS` (default 10): the fleet's Pods per node (2000 at
//!   200 nodes);
//! - `BENCH_TRACE_PODS`: print each Pod's first seen/bound/Running watch
//!   event with its wall-clock time (to line up with vk-sandbox's log).
//! - `BENCH_VK_LOG`: RUST_LOG for the vk-sandbox processes (default info;
//!   their logs are under target/bench-cluster/<node>/);
//! - `BENCH_ONLY`: a comma list of `claim`, `memory`, `startup`, `load`,
//!   `fleet`, `stream`, `lifecycle`, `podnet`, `kubelet` to run only those parts (to study one
//!   figure; the doc is then not written unless `BENCH_DOC` names a file);
//! - `BENCH_STREAM_MIB` (default 256): MiB per port-forward run of the
//!   `stream` part; 0 skips the port-forwards (exec round trips only);
//! - `BENCH_BURSTS`: a comma list of burst sizes to run instead of the
//!   plan's (then without the sandboxd-delay bursts).
//!
//! Only `cargo bench` runs it (it is skipped without `--bench`, so `cargo
//! test --all-targets` does not start a cluster run).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use kube::runtime::watcher;
use kube::{Api, Client};
use sandboxd_sim::SimHandle;
use sandboxd_sim::config::{ConfigPatch, SimConfig};
use serde_json::{Value, json};

/// The tests' helpers: the cluster, vk-sandbox as a process, the sandboxd
/// simulator and the Sandbox controller (upstream agent-sandbox; the
/// stand-in only where it cannot be fetched) are set up as the tests do.
#[path = "../tests/support/mod.rs"]
mod support;

/// The table the run ends with (under cluster/, so that cargo does not take
/// it for a bench target of its own).
#[path = "cluster/report.rs"]
mod report;

/// `BENCH_ONLY=fleet`: many vk-sandbox processes on one apiserver.
#[path = "cluster/fleet.rs"]
mod fleet;

/// The node Lease's renewals, timed during the bursts.
#[path = "cluster/lease.rs"]
mod lease;

/// `BENCH_ONLY=stream`: exec round trips and port-forward throughput.
#[path = "cluster/stream.rs"]
mod stream;

/// The stream part's floor: a kubelet API that does nothing, in a child.
#[path = "cluster/null_kubelet.rs"]
mod null_kubelet;

/// The stream part's relay reference: the guest agent relay driven from a
/// child process, as vk-sandbox drives it.
#[path = "cluster/agent_client.rs"]
mod agent_client;

/// `BENCH_ONLY=lifecycle`: suspend → hibernated, resume → Running.
#[path = "cluster/lifecycle.rs"]
mod lifecycle;

/// `BENCH_ONLY=podnet`: a Pod's own address against the `/ports` relay.
#[path = "cluster/podnet.rs"]
mod podnet;

/// `BENCH_ONLY=kubelet`: side by side with a real kubelet on the same plane.
#[path = "cluster/kubelet_side.rs"]
mod kubelet_side;

use report::Report;
use support::TestCluster;
use support::controller;
use support::process::{VkProcess, free_port};
use support::progress::Progress;

const TOKEN: &str = "bench-root-token";
const TEMPLATE: &str = "base:24.04";
const SA_USER: &str = "system:serviceaccount:sandbox-system:vk-sandbox";
const MIB: f64 = 1024.0 * 1024.0;

// ------------------------------------------------------------------ setup

/// vk-sandbox processes started here, stopped by [`die`] too (exiting
/// skips destructors).
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn die(what: &str) -> ! {
    eprintln!("bench: {what}");
    for pid in lock(&CHILDREN).drain(..) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    std::process::exit(1)
}

/// (VmRSS, VmHWM) in bytes from a [`Vk::status_kib`] reader.
fn rss_hwm(kib: &impl Fn(&str) -> f64) -> (f64, f64) {
    (kib("VmRSS:") * 1024.0, kib("VmHWM:") * 1024.0)
}

fn env_scale() -> f64 {
    std::env::var("BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|k| *k > 0.0)
        .unwrap_or(1.0)
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `BENCH_BURSTS=500,1000`: only these bursts (without sandboxd delay).
fn bursts() -> Option<Vec<usize>> {
    let v = std::env::var("BENCH_BURSTS").ok()?;
    let sizes: Vec<usize> = v
        .split(',')
        .map(|p| {
            p.trim()
                .parse()
                .unwrap_or_else(|_| die(&format!("BENCH_BURSTS: {p:?} is not a Pod count")))
        })
        .collect();
    Some(sizes)
}

/// Counts for one run. The default stops at 1000-Pod bursts (not 2000) so
/// the whole run stays within about five minutes on two cores;
/// `BENCH_SCALE=2` runs the 2000-Pod burst and start-up.
struct Plan {
    idle: usize,
    repeats: usize,
    bursts: Vec<usize>,
    delayed_bursts: Vec<usize>,
    /// The burst whose Pods the memory figures are taken with.
    hold: usize,
    startup: usize,
    lifecycle: usize,
    idle_window: Duration,
    /// Each fleet size idles this long, then runs this many Pods per node.
    fleet_idle: Duration,
    fleet_pods_per_node: usize,
}

/// The steps of `plan` with the parts `wants` picks, as `run` takes them.
fn planned_steps(plan: &Plan) -> usize {
    let mut total = 0;
    if !wants("claim") && wants("memory") {
        total += 1;
    }
    if wants("claim") {
        total += plan.repeats + plan.bursts.len() * 3 + 1 + plan.delayed_bursts.len();
    }
    total
        + usize::from(wants("startup"))
        + usize::from(wants("load"))
        + usize::from(wants("fleet"))
        + usize::from(wants("stream"))
        + usize::from(wants("lifecycle"))
        + usize::from(wants("podnet"))
        + usize::from(wants("kubelet"))
}

impl Plan {
    fn new(k: f64) -> Plan {
        let n = |base: f64| ((base * k).round() as usize).max(1);
        Plan {
            idle: n(20.0).min(200),
            repeats: (3.0 * k).round().clamp(1.0, 9.0) as usize,
            // 100 and 500 at every scale; the largest is 1000, or 2000
            // with BENCH_SCALE=2.
            bursts: bursts().unwrap_or_else(|| vec![100, 500, n(1000.0)]),
            delayed_bursts: if bursts().is_some() {
                Vec::new()
            } else {
                vec![100, 500]
            },
            hold: n(1000.0),
            startup: n(1000.0),
            lifecycle: n(20.0).min(200),
            idle_window: Duration::from_secs_f64(60.0 * k.min(1.0)),
            fleet_idle: Duration::from_secs_f64(60.0 * k.min(2.0)),
            fleet_pods_per_node: fleet::pods_per_node(),
        }
    }
}

struct Env {
    /// The admin client and kubeconfig.
    cluster: TestCluster,
    sa_kubeconfig: PathBuf,
    audit: Option<(String, PathBuf)>,
    dir: PathBuf,
}

fn run_script(args: &[&str]) -> Result<String, String> {
    let out = Command::new(repo().join("e2e/cluster.sh"))
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("e2e/cluster.sh {args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("e2e/cluster.sh {args:?} failed: {}", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A copy of `src` whose cluster server is `server`.
fn with_server(src: &Path, server: &str, out: &Path) -> Result<PathBuf, String> {
    let mut kc = Kubeconfig::read_from(src).map_err(|e| e.to_string())?;
    for c in &mut kc.clusters {
        if let Some(cluster) = c.cluster.as_mut() {
            cluster.server = Some(server.to_string());
        }
    }
    let yaml = serde_saphyr::to_string(&kc).map_err(|e| e.to_string())?;
    std::fs::write(out, yaml).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(out.to_path_buf())
}

impl Env {
    async fn new() -> Env {
        vk_sandbox::crypto::install_provider();
        let kubeconfig = match std::env::var_os("VK_TEST_KUBECONFIG") {
            Some(p) => PathBuf::from(p),
            None => PathBuf::from(
                run_script(&["up"]).unwrap_or_else(|e| die(&format!("start the cluster: {e}"))),
            ),
        };
        let client = support::client_for(&kubeconfig)
            .await
            .unwrap_or_else(|e| die(&format!("admin kubeconfig {}: {e}", kubeconfig.display())));
        let cluster = TestCluster { client, kubeconfig };
        let dir = repo().join("target/bench-cluster");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| die(&format!("{}: {e}", dir.display())));
        let sa = support::rbac::service_account_kubeconfig(
            &cluster.client,
            &cluster.kubeconfig,
            &dir.join("vk-sandbox.kubeconfig"),
        )
        .await
        .unwrap_or_else(|e| die(&format!("ServiceAccount kubeconfig: {e}")));
        let audit = std::env::var("BENCH_AUDIT").ok().and_then(|v| {
            let (url, log) = v.trim().split_once(' ')?;
            Some((url.to_string(), PathBuf::from(log)))
        });
        eprintln!("bench: {}", controller::describe(controller::kind()));
        controller::install_crds(&cluster.client, &cluster.kubeconfig).await;
        Env {
            cluster,
            sa_kubeconfig: sa,
            audit,
            dir,
        }
    }
}

async fn start_sim(delay_us: u64) -> SimHandle {
    start_sim_with(delay_us, 5000).await
}

/// A simulator whose one pool keeps `warm` sandboxes ready.
async fn start_sim_with(delay_us: u64, warm: usize) -> SimHandle {
    start_sim_cfg(SimConfig {
        refill_delay_ms: 10,
        claim_delay_us: delay_us,
        ..support::sim::config(TOKEN, &[&format!("{TEMPLATE}={warm}")])
    })
    .await
}

/// The simulator of `cfg`, on a runtime thread of its own.
async fn start_sim_cfg(cfg: SimConfig) -> SimHandle {
    // sandboxd is a daemon of its own: the simulator gets its own runtime
    // thread, so the bench's watch and Pod creation do not delay its replies
    // inside one scheduler (they still share the machine's cores).
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    let rt = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sandboxd-sim")
            .enable_all()
            .build()
            .unwrap_or_else(|e| die(&format!("simulator runtime: {e}")))
    });
    rt.spawn(sandboxd_sim::start_local(cfg))
        .await
        .unwrap_or_else(|e| die(&format!("simulator start task: {e}")))
        .unwrap_or_else(|e| die(&format!("start the sandboxd simulator: {e}")))
}

// ------------------------------------------------------------------ vk-sandbox

struct Vk {
    node: String,
    process: VkProcess,
    log: PathBuf,
    args: Vec<String>,
    kubeconfig: PathBuf,
    /// When the current process was spawned.
    started: Instant,
    /// The node's Lease renewals.
    lease: lease::LeaseWatch,
}

impl Vk {
    /// Starts vk-sandbox for node `node` against `sim`, optionally with a
    /// seeded state file.
    fn start(
        env: &Env,
        node: &str,
        sim: &SimHandle,
        kubeconfig: &Path,
        state: Option<&[u8]>,
    ) -> Vk {
        Vk::start_with(env, node, sim, kubeconfig, state, &[])
    }

    /// [`Vk::start`] with `extra` flags.
    fn start_with(
        env: &Env,
        node: &str,
        sim: &SimHandle,
        kubeconfig: &Path,
        state: Option<&[u8]>,
        extra: &[String],
    ) -> Vk {
        let dir = env.dir.join(node);
        std::fs::create_dir_all(dir.join("state"))
            .unwrap_or_else(|e| die(&format!("{}: {e}", dir.display())));
        let token = support::sim::token_file(&dir, TOKEN);
        let state_path = dir.join("state/claims.json");
        if let Some(bytes) = state {
            std::fs::write(&state_path, bytes).unwrap_or_else(|e| die(&format!("seed state: {e}")));
        }
        let mut args = support::vk::node_args(node, &state_path);
        args.extend(support::sim::vk_args(sim, Some(&token)));
        args.extend_from_slice(extra);
        let mut vk = Vk {
            node: node.to_string(),
            process: VkProcess::none(),
            log: dir.join("vk-sandbox.log"),
            args,
            kubeconfig: kubeconfig.to_path_buf(),
            started: Instant::now(),
            lease: lease::LeaseWatch::start(&env.cluster.client, node),
        };
        vk.spawn();
        vk
    }

    /// Starts the process on fresh ports: `BENCH_VK_BIN`, or the release
    /// build cargo made for this bench, logging at `BENCH_VK_LOG` (info).
    fn spawn(&mut self) {
        let bin = std::env::var_os("BENCH_VK_BIN")
            .map_or_else(|| PathBuf::from(support::process::BIN), PathBuf::from);
        let rust_log = std::env::var("BENCH_VK_LOG").unwrap_or_else(|_| "info".into());
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.started = Instant::now();
        self.process = VkProcess::start_binary(
            &bin,
            &self.kubeconfig,
            &args,
            self.log.clone(),
            (free_port(), free_port()),
            &rust_log,
        );
        lock(&CHILDREN).push(self.process.pid());
    }

    /// A reader of this process's `/proc/<pid>/status` fields, in KiB
    /// (NaN when absent), read once.
    fn status_kib(&self) -> impl Fn(&str) -> f64 {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.process.pid()))
            .unwrap_or_default();
        move |field: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        }
    }

    /// (VmRSS, VmHWM) in bytes.
    fn memory(&self) -> (f64, f64) {
        rss_hwm(&self.status_kib())
    }

    /// [`Self::memory`] for the table, and on stderr the resident set's
    /// parts (heap and stacks vs the binary's own pages), which say
    /// whether a rise is allocation or code touched.
    fn memory_at(&self, label: &str) -> (f64, f64) {
        let kib = self.status_kib();
        let mib = |field: &str| kib(field) / 1024.0;
        eprintln!(
            "memory: {label}: RSS {:.1} MiB = anonymous {:.1} + file {:.1}",
            mib("VmRSS:"),
            mib("RssAnon:"),
            mib("RssFile:")
        );
        rss_hwm(&kib)
    }

    /// The `/metrics` text; empty when the process does not answer.
    async fn metrics(&self) -> String {
        self.process.metrics().await.unwrap_or_default()
    }

    /// Waits for the Node's Ready condition; returns the time since the
    /// process was spawned.
    async fn wait_ready(&self, client: &Client, timeout: Duration) -> Duration {
        let start = self.started;
        let nodes: Api<Node> = Api::all(client.clone());
        loop {
            if let Ok(Some(n)) = nodes.get_opt(&self.node).await
                && support::vk::node_condition(&n, "Ready").as_deref() == Some("True")
            {
                return start.elapsed();
            }
            if start.elapsed() > timeout {
                die(&format!(
                    "Node {} not Ready after {timeout:?}; see {}",
                    self.node,
                    self.log.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// SIGTERM (compacts the claims store into a Go claims.json), then
    /// wait; killed when not gone within 20 s.
    fn stop(&mut self) {
        lock(&CHILDREN).retain(|p| *p != self.process.pid());
        self.process.signal(nix::sys::signal::Signal::SIGTERM);
        self.process.wait_exit(Duration::from_secs(20));
        // Dropping the handle kills a process still running.
        self.process = VkProcess::none();
    }

    async fn delete_node(&self, client: &Client) {
        let _ = Api::<Node>::all(client.clone())
            .delete(&self.node, &DeleteParams::default())
            .await;
    }
}

impl Drop for Vk {
    fn drop(&mut self) {
        self.stop();
    }
}

// ------------------------------------------------------------------ Pods

/// A sandbox Pod bound to `node` at creation (spec.nodeName set, so the
/// scheduler is not involved and creation is the binding).
fn pod(name: &str, node: &str, owner_uid: Option<&str>) -> Pod {
    let owners = owner_uid.map_or(json!([]), |uid| {
        json!([{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "name": name,
                "uid": uid, "controller": true, "blockOwnerDeletion": true}])
    });
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {
                "sandbox.cocoonstack.io/runtime": "sandboxd",
                "sandbox.cocoonstack.io/template": TEMPLATE,
            },
            "ownerReferences": owners,
        },
        "spec": {
            "nodeName": node,
            "tolerations": [controller::provider_toleration()],
            "containers": [{"name": "agent", "image": TEMPLATE}]
        }
    }))
    .unwrap_or_else(|e| die(&format!("pod json: {e}")))
}

/// Apiserver answers worth retrying (overload, timeouts).
fn transient(code: u16) -> bool {
    matches!(code, 429 | 500 | 503 | 504)
}

/// Deletes the named Pods, `concurrency` at a time, as their owners'
/// controllers would (one `deletecollection` of 2000 Pods outlives the
/// apiserver's 60 s request timeout on two cores). Transport errors and
/// timeouts are retried; NotFound is done.
async fn delete_pods(api: &Api<Pod>, names: &[String], concurrency: usize, tag: &str) {
    futures::stream::iter(names)
        .map(|name| async move {
            let what = format!("{tag}: delete Pod {name}");
            let dp = DeleteParams::default();
            match retried(&what, || api.delete(name, &dp)).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => die(&format!("{what}: {e}")),
            }
        })
        .buffer_unordered(concurrency)
        .collect::<()>()
        .await
}

/// `call` until it succeeds, fails for good, or five attempts failed on a
/// transport error or a [`transient`] answer.
async fn retried<T, F, Fut>(what: &str, mut call: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        match call().await {
            Err(kube::Error::Api(s)) if !transient(s.code) => return Err(kube::Error::Api(s)),
            Err(e) if attempt < 5 => {
                eprintln!("bench: {what} (attempt {attempt}): {e}; retrying");
                tokio::time::sleep(Duration::from_millis(500 * attempt)).await;
            }
            done => return done,
        }
    }
}

/// Creates the Sandboxes `objects` (JSON), `concurrency` at a time,
/// retried on passing errors; one that exists already is fine.
async fn create_sandboxes(api: &Api<DynamicObject>, objects: Vec<Value>, concurrency: usize) {
    futures::stream::iter(objects)
        .map(|sb| async move {
            let obj: DynamicObject =
                serde_json::from_value(sb).unwrap_or_else(|e| die(&format!("sandbox json: {e}")));
            let what = format!(
                "create Sandbox {}",
                obj.metadata.name.as_deref().unwrap_or("")
            );
            let pp = PostParams::default();
            match retried(&what, || api.create(&pp, &obj)).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => die(&format!("{what}: {e}")),
            }
        })
        .buffer_unordered(concurrency)
        .collect::<()>()
        .await;
}

/// Creates the Pods, `concurrency` requests in flight; returns their UIDs.
async fn create_pods(
    api: &Api<Pod>,
    pods: Vec<Pod>,
    concurrency: usize,
) -> HashMap<String, String> {
    futures::stream::iter(pods)
        .map(|p| async move {
            let name = p.metadata.name.clone().unwrap_or_default();
            let what = format!("create Pod {name}");
            let pp = PostParams::default();
            let created = match retried(&what, || api.create(&pp, &p)).await {
                Ok(c) => c,
                // A retried attempt did land (its answer was lost); each
                // run's namespace is new, so the name is this run's Pod.
                Err(kube::Error::Api(s)) if s.code == 409 => api
                    .get(&name)
                    .await
                    .unwrap_or_else(|e| die(&format!("get Pod {name}: {e}"))),
                Err(e) => die(&format!("{what}: {e}")),
            };
            (name, created.metadata.uid.unwrap_or_default())
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

#[derive(Default, Clone, Copy)]
struct Times {
    seen: Option<Instant>,
    /// The first event with `spec.nodeName` set (= `seen` for the Pods
    /// created bound).
    bound: Option<Instant>,
    running: Option<Instant>,
    gone: Option<Instant>,
}

/// Timestamps from a watch on one namespace's Pods.
#[derive(Clone)]
struct Recorder {
    pods: Arc<Mutex<HashMap<String, Times>>>,
    task: Arc<tokio::task::JoinHandle<()>>,
}

impl Recorder {
    async fn start(client: &Client, ns: &str) -> Recorder {
        let pods: Arc<Mutex<HashMap<String, Times>>> = Arc::default();
        let synced = Arc::new(tokio::sync::Notify::new());
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let (p, s) = (pods.clone(), synced.clone());
        let trace = std::env::var_os("BENCH_TRACE_PODS").is_some();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default()).boxed();
            while let Ok(Some(ev)) = stream
                .try_next()
                .await
                .map_err(|e| eprintln!("bench: watch: {e}"))
            {
                let now = Instant::now();
                match ev {
                    watcher::Event::InitDone => s.notify_one(),
                    watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                        let name = pod.metadata.name.clone().unwrap_or_default();
                        let running = pod.status.as_ref().and_then(|st| st.phase.as_deref())
                            == Some("Running");
                        let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
                        let mut map = lock(&p);
                        let t = map.entry(name.clone()).or_default();
                        if trace {
                            // Wall-clock times, to line up with
                            // vk-sandbox's log (BENCH_TRACE_PODS=1).
                            let wall = jiff::Timestamp::now();
                            if t.seen.is_none() {
                                eprintln!("bench: trace: {name} seen {wall}");
                            }
                            if bound && t.bound.is_none() {
                                eprintln!("bench: trace: {name} bound {wall}");
                            }
                            if running && t.running.is_none() {
                                eprintln!("bench: trace: {name} running {wall}");
                            }
                        }
                        t.seen.get_or_insert(now);
                        if bound {
                            t.bound.get_or_insert(now);
                        }
                        if running {
                            t.running.get_or_insert(now);
                        }
                    }
                    watcher::Event::Delete(pod) => {
                        let name = pod.metadata.name.clone().unwrap_or_default();
                        lock(&p).entry(name).or_default().gone.get_or_insert(now);
                    }
                    watcher::Event::Init => {}
                }
            }
        });
        if tokio::time::timeout(Duration::from_secs(30), synced.notified())
            .await
            .is_err()
        {
            die(&format!("the Pod watch on {ns} did not sync in 30 s"));
        }
        Recorder {
            pods,
            task: Arc::new(task),
        }
    }

    fn snapshot(&self, names: &[String]) -> Vec<Times> {
        let map = lock(&self.pods);
        names
            .iter()
            .map(|n| map.get(n).copied().unwrap_or_default())
            .collect()
    }

    /// Waits until `pred` holds for every named Pod; `false` on timeout.
    async fn wait_all(
        &self,
        names: &[String],
        timeout: Duration,
        pred: impl Fn(&Times) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.snapshot(names).iter().all(&pred) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

// ------------------------------------------------------------------ statistics

#[derive(Clone, Copy, Default)]
struct Quantiles {
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

fn quantiles(mut v: Vec<f64>) -> Quantiles {
    if v.is_empty() {
        return Quantiles::default();
    }
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[(((v.len() as f64) * p).ceil() as usize).clamp(1, v.len()) - 1];
    Quantiles {
        p50: q(0.50),
        p90: q(0.90),
        p99: q(0.99),
        max: v[v.len() - 1],
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Cumulative buckets `(le, count)` of a Prometheus histogram.
fn histogram(text: &str, name: &str) -> Vec<(f64, f64)> {
    series_histogram(text, name, "")
}

/// The buckets of one series; `labels` are the ones before `le`, each
/// followed by a comma (`endpoint="claim",`).
fn series_histogram(text: &str, name: &str, labels: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{{labels}le=\"");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// `histogram_quantile` over the difference of two scrapes: linear inside
/// the bucket; the +Inf bucket answers its lower bound. Also the bucket.
fn hist_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<(f64, f64, f64)> {
    let diff: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, c)| {
            let b = before
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0.0, |(_, c)| *c);
            (*le, c - b)
        })
        .collect();
    let total = diff.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lo, mut below) = (0.0, 0.0);
    for (le, c) in diff {
        if c >= rank {
            if le.is_infinite() {
                return Some((lo, lo, le));
            }
            let frac = if c > below {
                (rank - below) / (c - below)
            } else {
                1.0
            };
            return Some((lo + (le - lo) * frac, lo, le));
        }
        (lo, below) = (le, c);
    }
    None
}

// ------------------------------------------------------------------ claim path

/// Reconcile start → status write sent: vk-sandbox's own share.
const CLAIM_HIST: &str = "vk_sandbox_claim_provider_seconds";
/// What the provider's share is made of: the sandboxd claim call and the
/// claims-store batch (write + fsync) it waits for.
const SANDBOXD_HIST: (&str, &str) = (
    "vk_sandbox_sandboxd_request_duration_seconds",
    "endpoint=\"claim\",",
);
const STORE_HIST: (&str, &str) = (
    "vk_sandbox_claims_store_write_duration_seconds",
    "result=\"success\",",
);

/// (value, bucket low, bucket high) in seconds.
type HistQ = Option<(f64, f64, f64)>;

/// p50 and p99 of one histogram over a run (from two scrapes).
#[derive(Clone, Copy, Default)]
struct Split {
    p50: HistQ,
    p99: HistQ,
}

impl Split {
    fn between(before: &str, after: &str, name: &str, labels: &str) -> Split {
        let (b, a) = (
            series_histogram(before, name, labels),
            series_histogram(after, name, labels),
        );
        Split {
            p50: hist_quantile(&b, &a, 0.50),
            p99: hist_quantile(&b, &a, 0.99),
        }
    }
}

struct BurstResult {
    n: usize,
    e2e: Quantiles,
    provider_p50: HistQ,
    provider_p99: HistQ,
    /// `vk_sandbox_claim_own_seconds`: the provider share less the sandboxd
    /// call and the commit.
    own: Split,
    sandboxd: Split,
    store: Split,
    running_per_s: f64,
    releases_per_s: f64,
    /// vk-sandbox's `pods/status` writes (result `written`) per Pod, from
    /// creation to every Pod gone.
    writes_per_pod: f64,
    /// vk-sandbox's CPU time (user + system) per Pod lifecycle, ms: claim →
    /// Running → release → gone.
    cpu_ms_per_pod: f64,
    /// Lease renewals issued between the first create and the last Pod
    /// Running: ms from `renewTime` to stored.
    lease_ms: Vec<f64>,
}

const WRITTEN: &str = "vk_sandbox_pod_status_writes_total{result=\"written\"}";
const CPU: &str = "process_cpu_seconds_total";
const OWN_HIST: &str = "vk_sandbox_claim_own_seconds";

/// The difference of one series between two scrapes (NaN when missing).
fn delta(before: &str, after: &str, series: &str) -> f64 {
    match (
        support::metric(before, series),
        support::metric(after, series),
    ) {
        (b, Some(a)) => a - b.unwrap_or(0.0),
        _ => f64::NAN,
    }
}

/// Where a burst reports the process's memory (while all its Pods run and
/// after they are gone), if it should.
type MemoryLog<'a> = Option<&'a mut Vec<(String, f64, f64)>>;

/// Creates `n` bare Pods at once on `vk`'s node, waits for all Running,
/// deletes them all and waits for all releases and the objects gone.
#[allow(clippy::too_many_arguments)]
async fn burst(
    env: &Env,
    vk: &Vk,
    sim: &SimHandle,
    ns: &str,
    rec: &Recorder,
    n: usize,
    tag: &str,
    mut memory: MemoryLog<'_>,
) -> BurstResult {
    let api: Api<Pod> = Api::namespaced(env.cluster.client.clone(), ns);
    let names: Vec<String> = (0..n).map(|i| format!("{tag}-{i:05}")).collect();
    // The next Lease renewal is issued about a second into the burst.
    vk.lease.before_next_renewal(Duration::from_secs(1)).await;
    let before = vk.metrics().await;
    sim.sim().clear_requests();
    let start = Instant::now();
    let wall_start = jiff::Timestamp::now();
    let pods = names.iter().map(|name| pod(name, &vk.node, None)).collect();
    create_pods(&api, pods, 64).await;
    let timeout = Duration::from_secs(60) + Duration::from_millis(100 * n as u64);
    if !rec.wait_all(&names, timeout, |t| t.running.is_some()).await {
        let running = rec
            .snapshot(&names)
            .iter()
            .filter(|t| t.running.is_some())
            .count();
        die(&format!(
            "{tag}: only {running}/{n} Pods Running after {timeout:?}; see {}",
            vk.log.display()
        ));
    }
    let lease_ms = vk.lease.latencies_ms(wall_start, jiff::Timestamp::now());
    let after = vk.metrics().await;
    let times = rec.snapshot(&names);
    let lat: Vec<f64> = times
        .iter()
        .filter_map(|t| Some(t.running?.duration_since(t.seen?).as_secs_f64() * 1e3))
        .collect();
    let first_seen = times.iter().filter_map(|t| t.seen).min().unwrap_or(start);
    let last_running = times
        .iter()
        .filter_map(|t| t.running)
        .max()
        .unwrap_or(start);
    let span = last_running
        .duration_since(first_seen)
        .as_secs_f64()
        .max(1e-3);
    let (hb, ha) = (
        histogram(&before, CLAIM_HIST),
        histogram(&after, CLAIM_HIST),
    );
    if let Some(m) = memory.as_deref_mut() {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let label = format!("holding {n} Running Pods");
        let (rss, hwm) = vk.memory_at(&label);
        m.push((label, rss, hwm));
    }

    // Releases: a bare Pod's deletion releases its sandbox.
    let (releases_per_s, _) = delete_and_count_releases(&api, sim, rec, &names, n, tag).await;
    let end = vk.metrics().await;
    if let Some(m) = memory {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let label = format!("after those {n} Pods are deleted and released");
        let (rss, hwm) = vk.memory_at(&label);
        m.push((label, rss, hwm));
    }
    BurstResult {
        n,
        e2e: quantiles(lat),
        provider_p50: hist_quantile(&hb, &ha, 0.50),
        provider_p99: hist_quantile(&hb, &ha, 0.99),
        own: Split::between(&before, &after, OWN_HIST, ""),
        sandboxd: Split::between(&before, &after, SANDBOXD_HIST.0, SANDBOXD_HIST.1),
        store: Split::between(&before, &after, STORE_HIST.0, STORE_HIST.1),
        running_per_s: n as f64 / span,
        releases_per_s,
        writes_per_pod: delta(&before, &end, WRITTEN) / n as f64,
        cpu_ms_per_pod: delta(&before, &end, CPU) * 1e3 / n as f64,
        lease_ms,
    }
}

/// Successful releases so far.
fn releases(sim: &SimHandle) -> usize {
    support::sim::releases(sim)
        .iter()
        .filter(|r| r.status.is_some_and(|s| s < 300))
        .count()
}

/// Deletes every Pod of the namespace in one call; returns releases per
/// second (first delete call to the last release) and the seconds taken.
async fn delete_and_count_releases(
    api: &Api<Pod>,
    sim: &SimHandle,
    rec: &Recorder,
    names: &[String],
    n: usize,
    tag: &str,
) -> (f64, f64) {
    sim.sim().clear_requests();
    let start = Instant::now();
    delete_pods(api, names, 64, tag).await;
    let timeout = Duration::from_secs(60) + Duration::from_millis(100 * n as u64);
    let mut last = start;
    let mut count = 0;
    while count < n {
        let c = releases(sim);
        if c > count {
            count = c;
            last = Instant::now();
        }
        if start.elapsed() > timeout {
            die(&format!(
                "{tag}: only {count}/{n} releases after {timeout:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if !rec.wait_all(names, timeout, |t| t.gone.is_some()).await {
        die(&format!("{tag}: Pods not gone after {timeout:?}"));
    }
    let secs = last.duration_since(start).as_secs_f64().max(1e-3);
    (n as f64 / secs, secs)
}

/// One Pod at a time: create, wait Running; all deleted at the end.
async fn idle(
    env: &Env,
    vk: &Vk,
    sim: &SimHandle,
    ns: &str,
    rec: &Recorder,
    n: usize,
    tag: &str,
) -> BurstResult {
    let api: Api<Pod> = Api::namespaced(env.cluster.client.clone(), ns);
    let before = vk.metrics().await;
    let mut names = Vec::new();
    let mut lat = Vec::new();
    let start = Instant::now();
    for i in 0..n {
        let name = format!("{tag}-{i:03}");
        api.create(&PostParams::default(), &pod(&name, &vk.node, None))
            .await
            .unwrap_or_else(|e| die(&format!("create {name}: {e}")));
        let one = [name.clone()];
        if !rec
            .wait_all(&one, Duration::from_secs(30), |t| t.running.is_some())
            .await
        {
            die(&format!(
                "{name} not Running in 30 s; see {}",
                vk.log.display()
            ));
        }
        let t = rec.snapshot(&one)[0];
        if let (Some(s), Some(r)) = (t.seen, t.running) {
            lat.push(r.duration_since(s).as_secs_f64() * 1e3);
        }
        names.push(name);
        // Let the follow-up writes (Event) settle: one Pod at a time.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let span = start.elapsed().as_secs_f64();
    let after = vk.metrics().await;
    let (hb, ha) = (
        histogram(&before, CLAIM_HIST),
        histogram(&after, CLAIM_HIST),
    );
    delete_and_count_releases(&api, sim, rec, &names, n, tag).await;
    let end = vk.metrics().await;
    BurstResult {
        n,
        e2e: quantiles(lat),
        provider_p50: hist_quantile(&hb, &ha, 0.50),
        provider_p99: hist_quantile(&hb, &ha, 0.99),
        own: Split::between(&before, &after, OWN_HIST, ""),
        sandboxd: Split::between(&before, &after, SANDBOXD_HIST.0, SANDBOXD_HIST.1),
        store: Split::between(&before, &after, STORE_HIST.0, STORE_HIST.1),
        running_per_s: n as f64 / span,
        releases_per_s: f64::NAN,
        writes_per_pod: delta(&before, &end, WRITTEN) / n as f64,
        cpu_ms_per_pod: delta(&before, &end, CPU) * 1e3 / n as f64,
        // Pods one at a time: nothing to time the Lease against.
        lease_ms: Vec::new(),
    }
}

/// One status write round trip: patch_status of a Pod that no kubelet
/// serves (its nodeSelector matches no node), median of `n`.
async fn status_rtt(env: &Env, ns: &str, n: usize) -> Quantiles {
    let api: Api<Pod> = Api::namespaced(env.cluster.client.clone(), ns);
    let p: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "rtt"},
        "spec": {"nodeSelector": {"bench.cocoonstack.io/nowhere": "true"},
                 "containers": [{"name": "c", "image": "none"}]}
    }))
    .unwrap_or_else(|e| die(&format!("pod json: {e}")));
    api.create(&PostParams::default(), &p)
        .await
        .unwrap_or_else(|e| die(&format!("create the rtt Pod: {e}")));
    let mut v = Vec::new();
    for i in 0..n {
        let patch = json!({"status": {"message": format!("bench {i}")}});
        let start = Instant::now();
        api.patch_status("rtt", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| die(&format!("patch_status: {e}")));
        v.push(start.elapsed().as_secs_f64() * 1e3);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = api
        .delete(
            "rtt",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await;
    quantiles(v)
}

// ------------------------------------------------------------------ start-up

struct Startup {
    n: usize,
    ready_s: f64,
    running_s: f64,
    sandboxd_lists: f64,
    /// The usual restart (SIGTERM, start again; the Pods Running
    /// already): to `/readyz` ok, to every Pod reconciled, and the
    /// `pods/status` writes the apiserver counted meanwhile.
    restart_ready_s: f64,
    restart_resumed_s: f64,
    restart_status_writes: f64,
    /// A Pod created while vk-sandbox was down: process start → its Running
    /// status stored.
    restart_new_pod_s: f64,
    /// sandboxd listings from the restart until every Pod was reconciled.
    restart_lists: f64,
}

/// The simulator's `GET /v1/sandboxes` calls since its requests were cleared.
fn sandboxd_lists(sim: &SimHandle) -> f64 {
    sim.sim()
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.starts_with("/v1/sandboxes"))
        .count() as f64
}

/// What the usual restart measured.
struct Restart {
    ready_s: f64,
    resumed_s: f64,
    status_writes: f64,
    new_pod_s: f64,
    lists: f64,
}

/// The apiserver's count of `PATCH pods/status` (every client).
async fn status_patches(env: &Env) -> f64 {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .unwrap_or_else(|e| die(&format!("metrics request: {e}")));
    let text = env
        .cluster
        .client
        .request_text(req)
        .await
        .unwrap_or_else(|e| die(&format!("apiserver /metrics: {e}")));
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{")
                && l.contains("resource=\"pods\"")
                && l.contains("subresource=\"status\"")
                && l.contains("verb=\"PATCH\"")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Restarts `vk` over `n` Pods that are Running already (the usual
/// restart), with one new Pod `new` created while it was down, and times
/// `/readyz`, the new Pod's Running and every Pod's first reconcile.
async fn restart_over_running(
    env: &Env,
    vk: &mut Vk,
    n: usize,
    sim: &SimHandle,
    rec: &Recorder,
    api: &Api<Pod>,
    new: &str,
) -> Restart {
    vk.stop();
    api.create(&PostParams::default(), &pod(new, &vk.node, None))
        .await
        .unwrap_or_else(|e| die(&format!("create {new}: {e}")));
    let before = status_patches(env).await;
    sim.sim().clear_requests();
    vk.spawn();
    let start = vk.started;
    let timeout = Duration::from_secs(120);
    let mut ready_s = None;
    let one = [new.to_string()];
    loop {
        if ready_s.is_none() {
            let url = format!("http://127.0.0.1:{}/readyz", vk.process.admin_port);
            if reqwest::get(&url)
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                ready_s = Some(start.elapsed().as_secs_f64());
            }
        }
        let done = support::metric(
            &vk.metrics().await,
            "vk_sandbox_reconcile_duration_seconds_count{controller=\"pods\"}",
        );
        if let (Some(r), Some(d)) = (ready_s, done)
            && d >= (n + 1) as f64
        {
            let resumed_s = start.elapsed().as_secs_f64();
            let lists = sandboxd_lists(sim);
            if !rec
                .wait_all(&one, Duration::from_secs(30), |t| t.running.is_some())
                .await
            {
                die(&format!("restart: {new} not Running in 30 s"));
            }
            let new_pod_s = rec.snapshot(&one)[0]
                .running
                .map_or(f64::NAN, |t| t.duration_since(start).as_secs_f64());
            // Writes still in flight when the count is reached land now.
            tokio::time::sleep(Duration::from_secs(2)).await;
            return Restart {
                ready_s: r,
                resumed_s,
                // The new Pod's Running write is not a re-publish.
                status_writes: status_patches(env).await - before - 1.0,
                new_pod_s,
                lists,
            };
        }
        if start.elapsed() > timeout {
            die(&format!(
                "restart: not every Pod reconciled after {timeout:?}; see {}",
                vk.log.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `n` claims held by sandboxd and persisted in a Go claims.json, their
/// Pods existing (no status yet): from process start to Node Ready and to
/// every Pod Running.
async fn startup(env: &Env, sim: &SimHandle, n: usize) -> Startup {
    let ns = env.cluster.namespace("bench-startup").await;
    let node = format!("bench-startup-{}", support::suffix());
    let rec = Recorder::start(&env.cluster.client, &ns).await;
    let api: Api<Pod> = Api::namespaced(env.cluster.client.clone(), &ns);
    let names: Vec<String> = (0..n).map(|i| format!("s-{i:05}")).collect();
    eprintln!("bench: start-up: creating {n} Pods bound to {node} (not running yet)");
    let uids = create_pods(
        &api,
        names.iter().map(|m| pod(m, &node, None)).collect(),
        64,
    )
    .await;
    let auth = format!("Bearer {TOKEN}");
    let mut rows = serde_json::Map::new();
    for name in &names {
        let key = format!("{ns}/{name}");
        let body = json!({"template": TEMPLATE, "claim_ref": key}).to_string();
        let out = sim.sim().claim(Some(&auth), body.as_bytes()).await;
        let sandboxd_sim::sim::Body::Json(reply) = out.body else {
            die("simulator claim: not JSON");
        };
        rows.insert(
            key,
            json!({
                "id": reply["id"], "token": reply["token"], "address": reply["owner_addr"],
                "podUID": uids.get(name).cloned().unwrap_or_default(),
            }),
        );
    }
    let state = serde_json::to_vec(&json!({"claims": rows}))
        .unwrap_or_else(|e| die(&format!("claims.json: {e}")));
    sim.sim().clear_requests();
    let start = Instant::now();
    let mut vk = Vk::start(env, &node, sim, &env.sa_kubeconfig, Some(&state));
    let ready_s = vk
        .wait_ready(&env.cluster.client, Duration::from_secs(120))
        .await
        .as_secs_f64();
    let timeout = Duration::from_secs(120) + Duration::from_millis(50 * n as u64);
    if !rec.wait_all(&names, timeout, |t| t.running.is_some()).await {
        die(&format!(
            "start-up: not every Pod Running after {timeout:?}; see {}",
            vk.log.display()
        ));
    }
    let running_s = start.elapsed().as_secs_f64();
    let lists = sandboxd_lists(sim);
    eprintln!("bench: start-up: restart over the {n} Running Pods, one new Pod waiting");
    let restart = restart_over_running(env, &mut vk, n, sim, &rec, &api, "s-new").await;
    eprintln!("bench: start-up: cleaning up");
    let mut names = names;
    names.push("s-new".into());
    delete_and_count_releases(&api, sim, &rec, &names, n + 1, "startup").await;
    vk.stop();
    vk.delete_node(&env.cluster.client).await;
    env.cluster.drop_namespace(&ns).await;
    Startup {
        n,
        ready_s,
        running_s,
        sandboxd_lists: lists,
        restart_ready_s: restart.ready_s,
        restart_resumed_s: restart.resumed_s,
        restart_status_writes: restart.status_writes,
        restart_new_pod_s: restart.new_pod_s,
        restart_lists: restart.lists,
    }
}

// ------------------------------------------------------------------ apiserver load

#[derive(Default)]
struct Load {
    lifecycles: usize,
    per_pod: BTreeMap<String, f64>,
    writes_per_pod: f64,
    idle_per_min: BTreeMap<String, f64>,
    idle_total_per_min: f64,
    idle_minutes: f64,
    lists_after_start: usize,
    lists_at_start: usize,
}

struct AuditEvent {
    at: jiff::Timestamp,
    verb: String,
    resource: String,
    /// objectRef name, empty for collections and non-resource requests.
    name: String,
    /// The request's path and query (selectors show here).
    uri: String,
}

/// The events of `user` in the audit log from byte `offset`, one per request.
fn audit_events(path: &Path, offset: u64, user: &str) -> Vec<AuditEvent> {
    let Ok(mut f) = File::open(path) else {
        return Vec::new();
    };
    if f.seek(SeekFrom::Start(offset)).is_err() {
        return Vec::new();
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for line in BufReader::new(f).lines().map_while(Result::ok) {
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if v["user"]["username"] != user {
            continue;
        }
        let id = v["auditID"].as_str().unwrap_or_default().to_string();
        if !seen.insert(id) {
            continue;
        }
        let Some(at) = v["requestReceivedTimestamp"]
            .as_str()
            .and_then(|s| s.parse().ok())
        else {
            continue;
        };
        let r = &v["objectRef"];
        let mut resource = r["resource"]
            .as_str()
            .unwrap_or("(non-resource)")
            .to_string();
        if let Some(sub) = r["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        out.push(AuditEvent {
            at,
            verb: v["verb"].as_str().unwrap_or_default().to_string(),
            resource,
            name: r["name"].as_str().unwrap_or_default().to_string(),
            uri: v["requestURI"].as_str().unwrap_or_default().to_string(),
        });
    }
    out
}

fn now_ts() -> jiff::Timestamp {
    jiff::Timestamp::try_from(SystemTime::now()).unwrap_or_else(|e| die(&format!("clock: {e}")))
}

fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

/// vk-sandbox against the audit apiserver: LISTs at start-up, idle
/// requests per minute while the other phases run elsewhere, then
/// `lifecycles` Sandboxes created (the Sandbox controller makes their Pods) → Running → Sandbox deleted →
/// released → Pod gone, requests per Pod by verb and resource.
struct LoadProbe {
    vk: Vk,
    log: PathBuf,
    offset: u64,
    ready: jiff::Timestamp,
}

async fn load_probe_start(env: &Env, sim: &SimHandle) -> Option<LoadProbe> {
    let (url, log) = env.audit.clone()?;
    let kc = with_server(
        &env.sa_kubeconfig,
        &url,
        &env.dir.join("vk-sandbox-audit.kubeconfig"),
    )
    .unwrap_or_else(|e| die(&format!("audit kubeconfig: {e}")));
    let offset = std::fs::metadata(&log).map_or(0, |m| m.len());
    let node = format!("bench-load-{}", support::suffix());
    let vk = Vk::start(env, &node, sim, &kc, None);
    vk.wait_ready(&env.cluster.client, Duration::from_secs(60))
        .await;
    // Past the initial syncs (watch lists, discovery).
    tokio::time::sleep(Duration::from_secs(3)).await;
    Some(LoadProbe {
        vk,
        log,
        offset,
        ready: now_ts(),
    })
}

async fn load_probe_finish(env: &Env, sim: &SimHandle, mut probe: LoadProbe, n: usize) -> Load {
    let idle_end = now_ts();
    let ns = env.cluster.namespace("bench-load").await;
    let rec = Recorder::start(&env.cluster.client, &ns).await;
    let sandboxes: Api<DynamicObject> = Api::namespaced_with(
        env.cluster.client.clone(),
        &ns,
        &controller::resource("Sandbox"),
    );
    let names: Vec<String> = (0..n).map(|i| format!("l-{i:03}")).collect();
    // The Sandbox controller makes each Pod (named after its Sandbox).
    let _controller = controller::start(&env.cluster.client, &env.cluster.kubeconfig, &ns).await;
    let t0 = now_ts();
    for name in &names {
        let obj: DynamicObject = serde_json::from_value(controller::contract_sandbox(
            name,
            TEMPLATE,
            Some(&probe.vk.node),
        ))
        .unwrap_or_else(|e| die(&format!("sandbox json: {e}")));
        sandboxes
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| die(&format!("create Sandbox {name}: {e}")));
    }
    if !rec
        .wait_all(&names, Duration::from_secs(60), |t| t.running.is_some())
        .await
    {
        die("load: Pods not Running in 60 s");
    }
    sim.sim().clear_requests();
    for name in &names {
        let _ = sandboxes.delete(name, &DeleteParams::background()).await;
    }
    // The garbage collector deletes the Pods; vk-sandbox releases.
    let deadline = Instant::now() + Duration::from_secs(120);
    while releases(sim) < n || !rec.snapshot(&names).iter().all(|t| t.gone.is_some()) {
        if Instant::now() > deadline {
            die(&format!("load: {} of {n} released in 120 s", releases(sim)));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Follow-up writes (Events) land within a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t1 = now_ts();
    probe.vk.stop();
    probe.vk.delete_node(&env.cluster.client).await;
    env.cluster.drop_namespace(&ns).await;

    let events = audit_events(&probe.log, probe.offset, SA_USER);
    let idle_resources = ["leases", "nodes", "nodes/status", "nodeinventories"];
    let mut load = Load {
        lifecycles: n,
        ..Default::default()
    };
    let idle_min = (idle_end.as_second() - probe.ready.as_second()) as f64 / 60.0;
    load.idle_minutes = idle_min;
    let node_scoped = ["leases", "nodes", "nodes/status"];
    for e in &events {
        // Only this probe's Node and Lease: another vk-sandbox with the same
        // ServiceAccount on this apiserver must not count.
        if node_scoped.contains(&e.resource.as_str())
            && !e.name.is_empty()
            && e.name != probe.vk.node
        {
            continue;
        }
        let key = format!("{} {}", e.verb, e.resource);
        if e.verb == "list" {
            if e.at < probe.ready {
                load.lists_at_start += 1;
            } else {
                load.lists_after_start += 1;
            }
        }
        if e.at >= probe.ready && e.at < idle_end {
            *load.idle_per_min.entry(key.clone()).or_default() += 1.0 / idle_min;
            load.idle_total_per_min += 1.0 / idle_min;
        }
        if e.at >= t0 && e.at <= t1 && !idle_resources.contains(&e.resource.as_str()) {
            *load.per_pod.entry(key).or_default() += 1.0 / n as f64;
            if is_write(&e.verb) {
                load.writes_per_pod += 1.0 / n as f64;
            }
        }
    }
    load
}

// ------------------------------------------------------------------ main

/// The parts `BENCH_ONLY` picks, or `None` for all.
fn only() -> Option<Vec<String>> {
    let v = std::env::var("BENCH_ONLY").ok()?;
    let parts: Vec<String> = v.split(',').map(|p| p.trim().to_string()).collect();
    for p in &parts {
        if ![
            "claim",
            "memory",
            "startup",
            "load",
            "fleet",
            "stream",
            "lifecycle",
            "podnet",
            "kubelet",
        ]
        .contains(&p.as_str())
        {
            die(&format!(
                "BENCH_ONLY: unknown part {p:?} (choose from claim, memory, startup, load, fleet, stream, lifecycle, podnet, kubelet)"
            ));
        }
    }
    Some(parts)
}

fn wants(part: &str) -> bool {
    only().is_none_or(|o| o.iter().any(|p| p == part))
}

async fn run() -> Report {
    let k = env_scale();
    let plan = Plan::new(k);
    let env = Env::new().await;
    let t0 = Instant::now();
    let mut progress = Progress::new("bench", planned_steps(&plan), t0);
    let sim = start_sim(0).await;

    // The load probe idles (on its own apiserver) while the rest runs.
    let probe = if wants("load") {
        load_probe_start(&env, &sim).await
    } else {
        None
    };
    let probe_ready = Instant::now();
    if probe.is_none() && wants("load") {
        progress.total -= 1;
    }

    let ns = env.cluster.namespace("bench").await;
    let rtt = status_rtt(&env, &ns, 20).await;
    let rec = Recorder::start(&env.cluster.client, &ns).await;
    let node = format!("bench-{}", support::suffix());
    let vk = Vk::start(&env, &node, &sim, &env.sa_kubeconfig, None);
    // Process start → Node Ready with an empty state.
    let ready_empty_s = vk
        .wait_ready(&env.cluster.client, Duration::from_secs(60))
        .await
        .as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut memory = Vec::new();
    let label = "idle (Node Ready, no Pods)".to_string();
    let (rss, hwm) = vk.memory_at(&label);
    memory.push((label, rss, hwm));

    let mut rows: Vec<(String, Vec<BurstResult>)> = Vec::new();
    if !wants("claim") && wants("memory") {
        progress.step(&format!("memory only: one burst of {}", plan.hold));
        let r = burst(
            &env,
            &vk,
            &sim,
            &ns,
            &rec,
            plan.hold,
            "m",
            Some(&mut memory),
        )
        .await;
        rows.push(("burst, sandboxd 0 µs".into(), vec![r]));
    }
    let claim_runs: &[(u64, &str)] = if wants("claim") {
        &[(0, "0 µs"), (500, "500 µs")]
    } else {
        &[]
    };
    for &(delay, label) in claim_runs {
        sim.sim().patch_config(ConfigPatch {
            claim_delay_us: Some(delay),
            ..Default::default()
        });
        let repeats = if delay == 0 { plan.repeats } else { 1 };
        let mut rs = Vec::new();
        for i in 0..repeats {
            progress.step(&format!(
                "idle, sandboxd delay {label}, run {}/{repeats} ({} Pods one at a time)",
                i + 1,
                plan.idle
            ));
            rs.push(
                idle(
                    &env,
                    &vk,
                    &sim,
                    &ns,
                    &rec,
                    plan.idle,
                    &format!("i{delay}-{i}"),
                )
                .await,
            );
        }
        rows.push((format!("idle, sandboxd {label}"), rs));
        let bursts = if delay == 0 {
            &plan.bursts
        } else {
            &plan.delayed_bursts
        };
        for &n in bursts {
            // Medians of three runs; one with the simulator's delay.
            let reps = if delay == 0 { 3 } else { 1 };
            let mut rs = Vec::new();
            for i in 0..reps {
                progress.step(&format!(
                    "burst of {n}, sandboxd delay {label}, run {}/{reps}",
                    i + 1
                ));
                let hold = delay == 0 && n == plan.hold && i == 0;
                let tag = format!("b{delay}-{n}-{i}");
                let mem = hold.then_some(&mut memory);
                rs.push(burst(&env, &vk, &sim, &ns, &rec, n, &tag, mem).await);
            }
            rows.push((format!("burst, sandboxd {label}"), rs));
        }
    }
    let label = "end of the claim-path runs".to_string();
    let (rss, hwm) = vk.memory_at(&label);
    memory.push((label, rss, hwm));
    drop(vk);

    sim.sim().patch_config(ConfigPatch {
        claim_delay_us: Some(0),
        ..Default::default()
    });
    let startup = if wants("startup") {
        progress.step(&format!("start-up with {} claims", plan.startup));
        Some(startup(&env, &sim, plan.startup).await)
    } else {
        None
    };

    let load = match probe {
        Some(p) => {
            let idle_left = plan.idle_window.saturating_sub(probe_ready.elapsed());
            if !idle_left.is_zero() {
                eprintln!("bench: idle window of the load probe: {idle_left:?} more");
                tokio::time::sleep(idle_left).await;
            }
            progress.step(&format!("apiserver load, {} lifecycles", plan.lifecycle));
            Some(load_probe_finish(&env, &sim, p, plan.lifecycle).await)
        }
        None => None,
    };
    let fleet = if wants("fleet") {
        progress.step(&format!(
            "fleet: {:?} vk-sandbox processes on one apiserver",
            fleet::sizes()
        ));
        fleet::run(&env, plan.fleet_idle, plan.fleet_pods_per_node).await
    } else {
        None
    };
    let stream = if wants("stream") {
        let n = ((50.0 * k).round() as usize).clamp(10, 500);
        progress.step(&format!(
            "streaming: {n} exec round trips per path, 256 MiB port-forwards"
        ));
        let mib = std::env::var("BENCH_STREAM_MIB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256);
        Some(stream::run(&env, n, mib).await)
    } else {
        None
    };
    let lifecycle = if wants("lifecycle") {
        let n = ((100.0 * k).round() as usize).clamp(10, 1000);
        progress.step(&format!(
            "lifecycle: {n} Sandboxes suspended at once, then resumed at once"
        ));
        lifecycle::run(&env, n).await
    } else {
        None
    };
    let podnet = if wants("podnet") {
        let n = ((200.0 * k).round() as usize).clamp(20, 2000);
        progress.step(&format!(
            "Pod address: {n} connections per path, 64 MiB one way"
        ));
        podnet::run(&env, n, 64).await
    } else {
        None
    };
    let kubelet = if wants("kubelet") {
        let n = ((100.0 * k).round() as usize).clamp(10, 100);
        let execs = ((200.0 * k).round() as usize).clamp(20, 1000);
        progress.step(&format!(
            "a real kubelet side by side: bursts of {n}, {execs} execs each, port-forwards"
        ));
        let mib = match std::env::var("BENCH_KUBELET_MIB") {
            Err(_) => 64,
            Ok(v) => v.parse().ok().filter(|m| *m > 0).unwrap_or_else(|| {
                die(&format!(
                    "BENCH_KUBELET_MIB={v:?}: give the port-forward size in MiB, a whole number above 0"
                ))
            }),
        };
        kubelet_side::run(&env, n, execs, mib).await
    } else {
        None
    };
    env.cluster.drop_namespace(&ns).await;
    Api::<Node>::all(env.cluster.client.clone())
        .delete(&node, &DeleteParams::default())
        .await
        .ok();
    eprintln!(
        "bench: cluster benchmarks done: {} of {} steps in {}",
        progress.step,
        progress.total,
        progress.elapsed()
    );
    Report {
        rtt,
        ready_empty_s,
        rows,
        memory,
        startup,
        load,
        fleet,
        stream,
        lifecycle,
        podnet,
        kubelet,
    }
}

fn main() {
    if std::env::var_os(null_kubelet::MODE_VAR).is_some() {
        null_kubelet::serve();
        return;
    }
    if std::env::var_os(agent_client::MODE_VAR).is_some() {
        agent_client::serve();
        return;
    }
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("benches/cluster: skipped (run it with `make bench`)");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| die(&format!("tokio runtime: {e}")));
    let report = rt.block_on(run());
    let table = report::render(&report);
    println!("{table}");
    report::write_doc(&table);
}
