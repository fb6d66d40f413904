//! `BENCH_ONLY=fleet`: a fleet of vk-sandbox processes on one apiserver.
//!
//! vk-sandbox runs one process per sandboxd node, so a cluster holds tens
//! to thousands of them. For each fleet size (1, 10 and 50 by default,
//! `BENCH_FLEET=1,10,50`) this starts that many processes (each its own
//! node name, state path, ports and simulator with a small pool) against
//! the audit apiserver, lets them idle, then spreads Pods over them. From
//! the audit log and the apiserver's own `/metrics` it reports, per node:
//! requests per minute idle, writes per Pod, the process's RSS; and the
//! apiserver's CPU and memory as the fleet grows, against a window with no
//! fleet at all. Requests whose cost grows with the cluster (a LIST or
//! WATCH without a field selector on a cluster-scoped or many-node
//! resource) are counted separately: there should be none.

use super::*;

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
}

pub struct Fleet {
    /// The audit apiserver with no fleet on it: cores and RSS.
    pub baseline_cores: f64,
    pub baseline_rss: f64,
    pub sizes: Vec<FleetSize>,
}

/// Fleet sizes from `BENCH_FLEET` (default 1,10,50).
pub fn sizes() -> Vec<usize> {
    let v = std::env::var("BENCH_FLEET").unwrap_or_else(|_| "1,10,50".into());
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
        vks.push(Vk::start(env, &format!("{prefix}-{i:03}"), &sim, kc, None));
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
    eprintln!("bench: fleet of {n}: {pods} Pods spread over the nodes, Running, then deleted");
    let ns = env.cluster.namespace(&format!("bench-fleet{n}")).await;
    let rec = Recorder::start(&env.cluster.client, &ns).await;
    let api: Api<Pod> = Api::namespaced(env.cluster.client.clone(), &ns);
    let names: Vec<(String, &str)> = (0..pods)
        .map(|i| (format!("f-{i:04}"), vks[i % n].node.as_str()))
        .collect();
    let only_names: Vec<String> = names.iter().map(|(m, _)| m.clone()).collect();
    let t0 = now_ts();
    create_pods(
        &api,
        names.iter().map(|(m, node)| pod(m, node, None)).collect(),
        64,
    )
    .await;
    let timeout = Duration::from_secs(60) + Duration::from_millis(100 * pods as u64);
    if !rec
        .wait_all(&only_names, timeout, |t| t.running.is_some())
        .await
    {
        die(&format!("fleet of {n}: Pods not Running after {timeout:?}"));
    }
    delete_pods(&api, &only_names, 64, "fleet").await;
    let released = || sims.iter().map(releases).sum::<usize>();
    let deadline = Instant::now() + timeout;
    while released() < pods || !rec.snapshot(&only_names).iter().all(|t| t.gone.is_some()) {
        if Instant::now() > deadline {
            die(&format!("fleet of {n}: {} of {pods} released", released()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Follow-up writes (Events) land within a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t1 = now_ts();
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
    };
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
        if e.at >= t0
            && e.at <= t1
            && !node_scoped.contains(&e.resource.as_str())
            && is_write(&e.verb)
        {
            size.writes_per_pod += 1.0 / pods as f64;
        }
    }
    drop(sims);
    size
}
