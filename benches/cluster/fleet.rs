//! `BENCH_ONLY=fleet`: a fleet of vk-sandbox processes on one apiserver.
//!
//! vk-sandbox runs one process per sandboxd node, so a cluster holds tens
//! to thousands of them. For each fleet size (1, 50 and 200 by default,
//! `BENCH_FLEET=1,50,200`) this starts that many processes (each its own
//! node name, state path, ports and simulator with a small pool) against
//! the audit apiserver, lets them idle, then spreads Pods over them. From
//! the audit log and the apiserver's own `/metrics` it reports, per node:
//! requests per minute idle, writes per Pod, the process's RSS; and the
//! apiserver's CPU and memory as the fleet grows, against a window with no
//! fleet at all. Requests whose cost grows with the cluster (a LIST or
//! WATCH without a field selector on a cluster-scoped or many-node
//! resource) are counted separately: there should be none.
//!
//! With the upstream agent-sandbox controller the Pods are made from
//! Sandboxes that select the fleet's Nodes by label and name none, so the
//! scheduler spreads them (each Node's capacity as it sees it); the same
//! number per node at every size, so the per-node figures compare. After
//! the Pods are gone the plane the fleet talks to restarts: its apiserver
//! stopped, etcd restarted, down past the node monitor's grace (the
//! controller-manager marks the Nodes not Ready), then started again; the
//! figure is the apiserver's start to every Node of the fleet Ready with
//! its Lease renewed after the restart.

use k8s_openapi::api::coordination::v1::Lease;

use super::*;

/// The label the fleet's Nodes carry and its Sandboxes select.
const FLEET_LABEL: &str = "bench.vk-sandbox.dev/fleet";
/// How long the plane is down at the restart: past the node monitor's
/// grace (`VK_NODE_MONITOR_GRACE`, 20 s in e2e/cluster.sh) with room for
/// the controller-manager to mark every Node (its client is rate-limited).
const PLANE_DOWN: Duration = Duration::from_secs(45);

/// What one fleet size measured.
pub struct FleetSize {
    pub nodes: usize,
    /// Process start → every Node Ready (s).
    pub ready_s: f64,
    pub idle_minutes: f64,
    /// Requests per node per minute while idle, and by request.
    pub per_node_per_min: f64,
    pub per_node_by_request: BTreeMap<String, f64>,
    pub pods: usize,
    /// Writes (create/update/patch/delete) per Pod lifecycle, Node and
    /// Lease traffic left out.
    pub writes_per_pod: f64,
    /// VmRSS of the processes after the idle window: mean and max (bytes).
    pub rss_mean: f64,
    pub rss_max: f64,
    /// The audit apiserver's CPU (cores, i.e. CPU-seconds per second) and
    /// RSS over the idle window.
    pub apiserver_cores: f64,
    pub apiserver_rss: f64,
    /// LIST/WATCH requests with no field selector and no name: their cost
    /// grows with the cluster. Each kind, with its count.
    pub cluster_wide: BTreeMap<String, usize>,
    /// Whether the Pods came from Sandboxes placed by the scheduler (else
    /// Pods created bound, one node after another).
    pub scheduled: bool,
    /// The first create → every Pod Running (s).
    pub burst_running_s: f64,
    /// Pods per node as they ran: fewest and most.
    pub spread: (usize, usize),
    /// Requests per node per minute from the first create until every Pod
    /// was released (the window's length follows the Sandbox controller's
    /// and the scheduler's pace, so this does not compare across sizes)...
    pub burst_per_node_per_min: f64,
    /// ...and the requests per Pod in that window, Node and Lease traffic
    /// left out (this does).
    pub requests_per_pod: f64,
    pub restart: Option<Restart>,
}

/// The plane restart.
pub struct Restart {
    /// The fleet's Nodes not Ready when the apiserver started again.
    pub not_ready: usize,
    /// The apiserver's start → it answers `/readyz` (s).
    pub serving_s: f64,
    /// The apiserver's start → every Node Ready, its Lease renewed (s).
    pub all_ready_s: f64,
}

pub struct Fleet {
    /// The audit apiserver with no fleet on it: cores and RSS.
    pub baseline_cores: f64,
    pub baseline_rss: f64,
    pub sizes: Vec<FleetSize>,
}

/// Pods per node from `BENCH_FLEET_PODS` (default 10: 2000 at 200 nodes).
pub fn pods_per_node() -> usize {
    match std::env::var("BENCH_FLEET_PODS") {
        Err(_) => 10,
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=50).contains(n))
            .unwrap_or_else(|| die(&format!("BENCH_FLEET_PODS: {v:?} is not 1..=50"))),
    }
}

/// Fleet sizes from `BENCH_FLEET` (default 1,50,200).
pub fn sizes() -> Vec<usize> {
    let v = std::env::var("BENCH_FLEET").unwrap_or_else(|_| "1,50,200".into());
    v.split(',')
        .map(|p| {
            p.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=200).contains(n))
                .unwrap_or_else(|| {
                    die(&format!("BENCH_FLEET: {p:?} is not a fleet size (1..=200)"))
                })
        })
        .collect()
}

/// The apiserver's own `process_cpu_seconds_total` and
/// `process_resident_memory_bytes`.
async fn apiserver_process(client: &Client) -> (f64, f64) {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .unwrap_or_else(|e| die(&format!("metrics request: {e}")));
    let text = client
        .request_text(req)
        .await
        .unwrap_or_else(|e| die(&format!("audit apiserver /metrics: {e}")));
    (
        support::metric(&text, "process_cpu_seconds_total").unwrap_or(f64::NAN),
        support::metric(&text, "process_resident_memory_bytes").unwrap_or(f64::NAN),
    )
}

/// Cores the apiserver used over `window`, and its RSS at the end.
async fn apiserver_over(client: &Client, window: Duration) -> (f64, f64) {
    let (cpu0, _) = apiserver_process(client).await;
    tokio::time::sleep(window).await;
    let (cpu1, rss) = apiserver_process(client).await;
    ((cpu1 - cpu0) / window.as_secs_f64(), rss)
}

/// Whether a LIST/WATCH request's cost grows with the cluster: no field
/// selector, no single name, and not confined to one namespace's few
/// objects (a namespaced request names its namespace in the path).
fn cluster_wide(e: &AuditEvent) -> bool {
    (e.verb == "list" || e.verb == "watch")
        && !e.uri.contains("fieldSelector=")
        && e.name.is_empty()
        && !e.uri.contains("/namespaces/")
}

pub async fn run(env: &Env, idle: Duration, per_node: usize) -> Option<Fleet> {
    let Some((url, log)) = env.audit.clone() else {
        eprintln!("bench: fleet: skipped (no audit apiserver: run it through `make bench`)");
        return None;
    };
    let kc = with_server(
        &env.sa_kubeconfig,
        &url,
        &env.dir.join("vk-sandbox-fleet.kubeconfig"),
    )
    .unwrap_or_else(|e| die(&format!("fleet kubeconfig: {e}")));
    let admin_kc = with_server(
        &env.cluster.kubeconfig,
        &url,
        &env.dir.join("admin-audit.kubeconfig"),
    )
    .unwrap_or_else(|e| die(&format!("audit admin kubeconfig: {e}")));
    let audit_admin = support::client_for(&admin_kc)
        .await
        .unwrap_or_else(|e| die(&format!("audit admin client: {e}")));
    eprintln!("bench: fleet: the apiserver with no fleet, {idle:?}");
    let (baseline_cores, baseline_rss) = apiserver_over(&audit_admin, idle / 2).await;
    let mut out = Vec::new();
    let upstream = controller::kind().is_upstream();
    if !upstream {
        eprintln!(
            "bench: fleet: Pods created bound (the Sandbox-and-scheduler burst needs the upstream agent-sandbox controller)"
        );
    }
    for n in sizes() {
        out.push(one_size(env, &kc, &audit_admin, &log, n, idle, per_node).await);
    }
    Some(Fleet {
        baseline_cores,
        baseline_rss,
        sizes: out,
    })
}

async fn one_size(
    env: &Env,
    kc: &Path,
    audit_admin: &Client,
    log: &Path,
    n: usize,
    idle: Duration,
    per_node: usize,
) -> FleetSize {
    let offset = std::fs::metadata(log).map_or(0, |m| m.len());
    let prefix = format!("fleet{n}-{}", support::suffix());
    eprintln!(
        "bench: fleet of {n}: starting {n} vk-sandbox processes, each with its own simulator"
    );
    let mut sims = Vec::new();
    let mut vks = Vec::new();
    let start = Instant::now();
    for i in 0..n {
        let sim = start_sim_with(0, 2 * per_node.max(2)).await;
        let labels =
            format!("--node-labels=sandbox.cocoonstack.io/runtime=sandboxd,{FLEET_LABEL}={prefix}");
        // Allocatable sized by the claim cap (docs/operations.md, "Fleet:
        // capacity, conditions and taints"), so the scheduler's resource
        // scoring sees a fuller node score lower. With the static default
        // every node scores the same, and the scheduler, which breaks ties
        // in node order, packs one node.
        let cap = format!("--sandboxd-max-claims={}", 4 * per_node);
        vks.push(Vk::start_with(
            env,
            &format!("{prefix}-{i:03}"),
            &sim,
            kc,
            None,
            &[labels, cap],
        ));
        sims.push(sim);
    }
    for vk in &vks {
        vk.wait_ready(&env.cluster.client, Duration::from_secs(120))
            .await;
    }
    let ready_s = start.elapsed().as_secs_f64();
    // Past the initial syncs (watch lists, discovery).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_start = now_ts();
    eprintln!("bench: fleet of {n}: idle for {idle:?}");
    let (apiserver_cores, apiserver_rss) = apiserver_over(audit_admin, idle).await;
    let idle_end = now_ts();
    let rss: Vec<f64> = vks.iter().map(|v| v.memory().0).collect();

    let pods = n * per_node;
    let upstream = controller::kind().is_upstream();
    eprintln!(
        "bench: fleet of {n}: {pods} {} spread over the nodes, Running, then deleted",
        if upstream { "Sandboxes" } else { "Pods" }
    );
    let ns = env.cluster.namespace(&format!("bench-fleet{n}")).await;
    let rec = Recorder::start(&env.cluster.client, &ns).await;
    let api: Api<Pod> = Api::namespaced(env.cluster.client.clone(), &ns);
    let sandboxes: Api<DynamicObject> = Api::namespaced_with(
        env.cluster.client.clone(),
        &ns,
        &controller::resource("Sandbox"),
    );
    let _controller = if upstream {
        Some(controller::start(&env.cluster.client, &env.cluster.kubeconfig, &ns).await)
    } else {
        None
    };
    let names: Vec<String> = (0..pods).map(|i| format!("f-{i:04}")).collect();
    let t0 = now_ts();
    let started = Instant::now();
    if upstream {
        create_sandboxes(&sandboxes, fleet_sandboxes(&names, &prefix), 64).await;
    } else {
        let bound = names
            .iter()
            .enumerate()
            .map(|(i, m)| pod(m, &vks[i % n].node, None))
            .collect();
        create_pods(&api, bound, 64).await;
    }
    let timeout = Duration::from_secs(60) + Duration::from_millis(100 * pods as u64);
    if !rec.wait_all(&names, timeout, |t| t.running.is_some()).await {
        die(&format!("fleet of {n}: Pods not Running after {timeout:?}"));
    }
    let burst_running_s = started.elapsed().as_secs_f64();
    let spread = spread(&api, &vks).await;
    eprintln!(
        "bench: fleet of {n}: every Pod Running after {burst_running_s:.1} s, {}–{} per node",
        spread.0, spread.1
    );
    if upstream {
        delete_all(&names, |name| {
            let sandboxes = &sandboxes;
            async move { sandboxes.delete(&name, &DeleteParams::background()).await }
        })
        .await;
    } else {
        delete_pods(&api, &names, 64, "fleet").await;
    }
    let released = || sims.iter().map(releases).sum::<usize>();
    let deadline = Instant::now() + timeout;
    while released() < pods || !rec.snapshot(&names).iter().all(|t| t.gone.is_some()) {
        if Instant::now() > deadline {
            die(&format!("fleet of {n}: {} of {pods} released", released()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Follow-up writes (Events) land within a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t1 = now_ts();
    let restart = Some(plane_restart(&env.cluster.client, &prefix, n).await);
    for vk in &mut vks {
        vk.stop();
        vk.delete_node(&env.cluster.client).await;
    }
    env.cluster.drop_namespace(&ns).await;

    let events = audit_events(log, offset, SA_USER);
    let idle_min = (idle_end.as_second() - idle_start.as_second()) as f64 / 60.0;
    let node_scoped = ["leases", "nodes", "nodes/status", "nodeinventories"];
    let mut size = FleetSize {
        nodes: n,
        ready_s,
        idle_minutes: idle_min,
        per_node_per_min: 0.0,
        per_node_by_request: BTreeMap::new(),
        pods,
        writes_per_pod: 0.0,
        rss_mean: rss.iter().sum::<f64>() / n as f64,
        rss_max: rss.iter().copied().fold(0.0, f64::max),
        apiserver_cores,
        apiserver_rss,
        cluster_wide: BTreeMap::new(),
        scheduled: upstream,
        burst_running_s,
        spread,
        burst_per_node_per_min: 0.0,
        requests_per_pod: 0.0,
        restart,
    };
    let burst_min = (t1.as_millisecond() - t0.as_millisecond()) as f64 / 60_000.0;
    for e in &events {
        // Only this fleet's Nodes and Leases.
        if node_scoped.contains(&e.resource.as_str())
            && !e.name.is_empty()
            && !e.name.starts_with(&prefix)
        {
            continue;
        }
        if cluster_wide(e) {
            *size
                .cluster_wide
                .entry(format!("{} {}", e.verb, e.resource))
                .or_default() += 1;
        }
        if e.at >= idle_start && e.at < idle_end {
            let per = 1.0 / idle_min / n as f64;
            *size
                .per_node_by_request
                .entry(format!("{} {}", e.verb, e.resource))
                .or_default() += per;
            size.per_node_per_min += per;
        }
        if e.at >= t0 && e.at <= t1 {
            size.burst_per_node_per_min += 1.0 / burst_min / n as f64;
            if !node_scoped.contains(&e.resource.as_str()) {
                size.requests_per_pod += 1.0 / pods as f64;
                if is_write(&e.verb) {
                    size.writes_per_pod += 1.0 / pods as f64;
                }
            }
        }
    }
    drop(sims);
    size
}

/// A Sandbox per name whose Pod selects this fleet's Nodes (by
/// [`FLEET_LABEL`]) and names none: the scheduler places it.
fn fleet_sandboxes(names: &[String], fleet: &str) -> Vec<Value> {
    names
        .iter()
        .map(|name| {
            let mut sb = controller::contract_sandbox(name, TEMPLATE, None);
            sb["spec"]["podTemplate"]["spec"]["nodeSelector"][FLEET_LABEL] = json!(fleet);
            sb
        })
        .collect()
}

/// Runs `delete` for every name, 64 at a time; a name already gone is
/// fine.
async fn delete_all<F, Fut, T>(names: &[String], delete: F)
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    futures::stream::iter(names)
        .map(|name| {
            let call = delete(name.clone());
            async move {
                match call.await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => die(&format!("fleet: delete {name}: {e}")),
                }
            }
        })
        .buffer_unordered(64)
        .collect::<()>()
        .await;
}

/// The fewest and the most Pods on one of `vks`' Nodes.
async fn spread(api: &Api<Pod>, vks: &[Vk]) -> (usize, usize) {
    let list = api
        .list(&Default::default())
        .await
        .unwrap_or_else(|e| die(&format!("fleet: list Pods: {e}")));
    let mut per: HashMap<&str, usize> = vks.iter().map(|v| (v.node.as_str(), 0)).collect();
    for p in &list.items {
        let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
        if let Some(c) = node.and_then(|n| per.get_mut(n)) {
            *c += 1;
        }
    }
    (
        per.values().copied().min().unwrap_or(0),
        per.values().copied().max().unwrap_or(0),
    )
}

/// `e2e/cluster.sh <args>` off the runtime's threads; dies on failure.
async fn cluster_sh(args: &'static [&'static str]) {
    tokio::task::spawn_blocking(move || run_script(args))
        .await
        .unwrap_or_else(|e| die(&format!("e2e/cluster.sh {args:?}: {e}")))
        .unwrap_or_else(|e| die(&e));
}

/// How many of the fleet's Nodes are Ready, and how many of its Leases
/// were renewed at or after `since`; `None` when the apiserver does not
/// answer.
async fn fleet_state(
    client: &Client,
    prefix: &str,
    since: jiff::Timestamp,
) -> Option<(usize, usize)> {
    let nodes: Api<Node> = Api::all(client.clone());
    let lp = kube::api::ListParams::default().labels(&format!("{FLEET_LABEL}={prefix}"));
    let ready = nodes
        .list(&lp)
        .await
        .ok()?
        .items
        .iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renewed = leases
        .list(&Default::default())
        .await
        .ok()?
        .items
        .iter()
        .filter(|l| {
            l.metadata
                .name
                .as_deref()
                .is_some_and(|m| m.starts_with(prefix))
        })
        .filter(|l| {
            l.spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .is_some_and(|t| t.0 >= since)
        })
        .count();
    Some((ready, renewed))
}

/// Restarts the plane the fleet talks to (module doc) and times its
/// Nodes' return; `client` is the main apiserver's, which stays up.
async fn plane_restart(client: &Client, prefix: &str, n: usize) -> Restart {
    eprintln!(
        "bench: fleet of {n}: plane restart (the fleet's apiserver down, etcd restarted, {PLANE_DOWN:?} down)"
    );
    let down = Instant::now();
    cluster_sh(&["audit-apiserver", "down"]).await;
    cluster_sh(&["restart", "etcd", "0"]).await;
    tokio::time::sleep(PLANE_DOWN.saturating_sub(down.elapsed())).await;
    let not_ready = loop {
        if let Some((ready, _)) = fleet_state(client, prefix, now_ts()).await {
            break n.saturating_sub(ready);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let since = now_ts();
    let start = Instant::now();
    cluster_sh(&["audit-apiserver", "up"]).await;
    let serving_s = start.elapsed().as_secs_f64();
    let deadline = start + Duration::from_secs(180);
    loop {
        if let Some((ready, renewed)) = fleet_state(client, prefix, since).await
            && ready == n
            && renewed == n
        {
            break;
        }
        if Instant::now() > deadline {
            let state = fleet_state(client, prefix, since).await;
            die(&format!(
                "fleet of {n}: after the plane restart, (Ready, Leases renewed) = {state:?} of {n} in 180 s"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let all_ready_s = start.elapsed().as_secs_f64();
    eprintln!(
        "bench: fleet of {n}: {not_ready} Nodes not Ready at the restart; apiserver serving after {serving_s:.1} s, every Node Ready and renewed after {all_ready_s:.1} s"
    );
    Restart {
        not_ready,
        serving_s,
        all_ready_s,
    }
}
