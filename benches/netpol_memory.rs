//! What the NetworkPolicy watches (`src/netpol/`) cost in memory, on the
//! local control plane (docs/benchmarks.md#networkpolicy-watches):
//!
//! 1. 10 000 Pods elsewhere in the cluster that no peer selects, and a
//!    policy selecting this node's Pod whose peer selects Pods of a
//!    namespace holding none: the watches hold no Pod.
//! 2. The same, with 1 000 Pods (each with an address) the peer selects.
//! 3. For comparison, what the design avoids: one watch of every Pod of
//!    the cluster (the same lean decoding).
//!
//! Each is measured in a child process of its own (this binary again),
//! against a child that only made its client: the difference of their
//! VmRSS once the watches have listed is the watches' cost.
//!
//!   VK_TEST_KUBECONFIG=<admin kubeconfig> cargo bench --profile dev --bench netpol_memory
//!
//! (`--profile dev` spares the release build; the figures in
//! docs/benchmarks.md were taken so).
//!
//! `NETPOL_MEM_ELSEWHERE` and `NETPOL_MEM_PEERS` change the counts. The
//! namespaces it makes (`np-mem-*`) are deleted at the end. Only `cargo
//! bench` runs it (`--bench`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use vk_sandbox::netpol::NetworkPolicies;
use vk_sandbox::netpol::selector::Labels;
use vk_sandbox::netpol::watches::WatchedPod;

const MODE: &str = "NETPOL_MEM_CHILD";
const TARGET_NS: &str = "np-mem-target";
const PEER_NS: &str = "np-mem-peers";
const ELSEWHERE_NS: &str = "np-mem-elsewhere";

fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn client() -> Client {
    let path = PathBuf::from(std::env::var_os("VK_TEST_KUBECONFIG").expect("VK_TEST_KUBECONFIG"));
    let kc = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

fn vm_rss_kib(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The child: makes its client, then (by mode) starts nothing, the
/// NetworkPolicy watches, or a watch of every Pod; prints `ready <pods>`
/// once they have listed and waits to be killed.
async fn child(mode: &str) {
    let client = client().await;
    // A first request, so the connection's buffers count in every mode.
    Api::<Namespace>::all(client.clone())
        .get(TARGET_NS)
        .await
        .expect("read the target namespace");
    let held = match mode {
        "idle" => 0,
        "netpol" => {
            let local = vec![(
                TARGET_NS.to_string(),
                Labels::from([("app".to_string(), "sandbox".to_string())]),
            )];
            let np = NetworkPolicies::new(Arc::new(move || local.clone()));
            tokio::spawn(Arc::clone(&np).run(client, "bench".into(), CancellationToken::new()));
            loop {
                let watches = np.peer_watches();
                if np.policies_known().is_some()
                    && !watches.is_empty()
                    && watches.iter().all(|w| w.2)
                {
                    break watches.iter().map(|w| w.1).sum();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        "all-pods" => {
            let api: Api<WatchedPod> = Api::all(client);
            let (reader, writer) = kube::runtime::reflector::store();
            let stream = watcher(api, watcher::Config::default()).reflect(writer);
            tokio::spawn(stream.for_each(|_| futures::future::ready(())));
            reader.wait_until_ready().await.expect("listed");
            reader.state().len()
        }
        other => panic!("unknown mode {other}"),
    };
    // Let the list's transient buffers go before the reading.
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!("ready {held}");
    std::future::pending::<()>().await;
}

/// One child's VmRSS (KiB) once ready, and what it holds.
fn measure(mode: &str) -> (u64, usize) {
    use std::io::BufRead;
    let exe = std::env::current_exe().expect("current exe");
    let mut c = Command::new(exe)
        .env(MODE, mode)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let mut line = String::new();
    std::io::BufReader::new(c.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the child's ready line");
    let held = line
        .trim()
        .strip_prefix("ready ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("child {mode} said {line:?}"));
    let rss = vm_rss_kib(c.id());
    let _ = c.kill();
    let _ = c.wait();
    (rss, held)
}

/// The median of three runs of `mode`.
fn median(mode: &str) -> (u64, usize) {
    let mut runs: Vec<(u64, usize)> = (0..3).map(|_| measure(mode)).collect();
    runs.sort();
    runs[1]
}

async fn namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create namespace {name}: {e}"),
    }
    // Pods are admitted once the namespace's ServiceAccount exists.
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), name);
    let start = Instant::now();
    while sas.get_opt("default").await.ok().flatten().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no default ServiceAccount in {name}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `n` Pods in `ns` labelled `role`, never scheduled; with `address`, each
/// gets an address in its status as a kubelet would write it.
async fn pods(client: &Client, ns: &str, n: usize, role: &str, address: bool) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let have = api
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .len();
    futures::stream::iter(have..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("p{i}");
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {"role": role, "app": "bench"}},
                    "spec": {"schedulerName": "netpol-bench-nobody",
                             "containers": [{"name": "c", "image": "registry.invalid/none",
                                             "ports": [{"name": "http", "containerPort": 8080}]}]},
                }))
                .unwrap();
                api.create(&PostParams::default(), &pod).await?;
                if address {
                    let ip = format!("10.253.{}.{}", i / 250, i % 250 + 1);
                    let status = json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}]}});
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await?;
                }
                Ok::<_, kube::Error>(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .unwrap_or_else(|e| panic!("create Pods in {ns}: {e}"));
}

async fn policy(client: &Client) {
    let api: Api<NetworkPolicy> = Api::namespaced(client.clone(), TARGET_NS);
    let np: NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "from-clients"},
        "spec": {"podSelector": {"matchLabels": {"app": "sandbox"}},
                 "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": PEER_NS}},
                                        "podSelector": {"matchLabels": {"role": "client"}}}]}]},
    }))
    .unwrap();
    api.patch(
        "from-clients",
        &PatchParams::apply("netpol-bench").force(),
        &Patch::Apply(&np),
    )
    .await
    .expect("apply the policy");
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn delta(kib: u64, base: u64) -> String {
    format!("{:+.1} MiB", (kib as f64 - base as f64) / 1024.0)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    vk_sandbox::crypto::install_provider();
    if let Ok(mode) = std::env::var(MODE) {
        rt.block_on(child(&mode));
        return;
    }
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("benches/netpol_memory: skipped (cargo bench --bench netpol_memory)");
        return;
    }
    let elsewhere = count("NETPOL_MEM_ELSEWHERE", 10_000);
    let peers = count("NETPOL_MEM_PEERS", 1_000);
    let client = rt.block_on(client());
    rt.block_on(async {
        for ns in [TARGET_NS, PEER_NS, ELSEWHERE_NS] {
            namespace(&client, ns).await;
        }
        policy(&client).await;
        let start = Instant::now();
        pods(&client, ELSEWHERE_NS, elsewhere, "other", false).await;
        eprintln!(
            "netpol memory: {elsewhere} Pods elsewhere in {:?}",
            start.elapsed()
        );
    });
    let (idle, _) = median("idle");
    let (quiet, held_quiet) = median("netpol");
    let (all_quiet, all_held_quiet) = median("all-pods");
    rt.block_on(async {
        let start = Instant::now();
        pods(&client, PEER_NS, peers, "client", true).await;
        eprintln!("netpol memory: {peers} peer Pods in {:?}", start.elapsed());
    });
    let (busy, held_busy) = median("netpol");
    let (all_busy, all_held_busy) = median("all-pods");
    println!("| cluster | watched | Pods held | VmRSS | over a client alone |");
    println!("|---|---|---|---|---|");
    println!("| a client alone | nothing | 0 | {} | |", mib(idle));
    let row = |what: &str, watched: &str, held: usize, rss: u64| {
        println!(
            "| {what} | {watched} | {held} | {} | {} |",
            mib(rss),
            delta(rss, idle)
        );
    };
    let quiet_cluster = format!("{elsewhere} Pods elsewhere");
    let busy_cluster = format!("{elsewhere} elsewhere + {peers} selected");
    row(&quiet_cluster, "NetworkPolicy watches", held_quiet, quiet);
    row(&busy_cluster, "NetworkPolicy watches", held_busy, busy);
    row(
        &quiet_cluster,
        "every Pod (avoided)",
        all_held_quiet,
        all_quiet,
    );
    row(
        &busy_cluster,
        "every Pod (avoided)",
        all_held_busy,
        all_busy,
    );
    rt.block_on(async {
        let api: Api<Namespace> = Api::all(client.clone());
        for ns in [TARGET_NS, PEER_NS, ELSEWHERE_NS] {
            let _ = api.delete(ns, &DeleteParams::background()).await;
        }
    });
}
