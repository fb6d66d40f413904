//! `/stats/summary` and `/metrics/resource`: each running sandbox Pod's
//! memory from sandboxd's `GET /v1/sandboxes/{id}/stats`
//! (docs/streaming.md#top), for `kubectl top` through metrics-server.
//!
//! What sandboxd measures is the VM's memory: the VMM process's resident
//! set (guest memory touched plus VMM overhead). A hibernated sandbox has
//! no VMM, so nothing is measured: its Pod is listed without memory rather
//! than with a zero. sandboxd measures no CPU at all: the summary carries
//! none; `/metrics/resource` must carry a CPU counter or metrics-server
//! drops the Pod entirely (`checkContainerMetrics` in its
//! `pkg/scraper/client/resource/decode.go` drops a container whose
//! cumulative CPU is 0), so it carries a constant 1 µs, which
//! metrics-server reads as 0 cores — `kubectl top` shows the memory and
//! `0m` CPU, documented as not measured.
//!
//! Figures are cached for [`CACHE_TTL`] (metrics-server scrapes every 15 s;
//! one refresh serves concurrent scrapes) and fetched at most [`FAN_OUT`]
//! at a time, each call bounded by [`CALL_TIMEOUT`]. A refresh runs in a
//! task of its own: a scrape waits for it at most [`SCRAPE_WAIT`] and then
//! answers with what has arrived, and a scrape given up by its client
//! (metrics-server's 10 s timeout) leaves the refresh going for the next
//! one. A sandbox whose figures could not be fetched is left out of the
//! answer (and logged), never reported as a zero; `/metrics/resource`
//! then says `scrape_error 1`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::kubelet::sandbox::{DataPlane, SandboxRef, SandboxStats, Sandboxes};
use crate::pods::pod::Pod;

/// How long fetched figures are reused.
pub const CACHE_TTL: Duration = Duration::from_secs(10);
/// sandboxd stats calls in flight at once.
pub const FAN_OUT: usize = 16;
/// Longest a single stats call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest a scrape waits for a refresh before answering with what it has.
pub const SCRAPE_WAIT: Duration = Duration::from_secs(5);
/// Figures older than this are not served (a sandbox whose last fetches
/// failed drops out rather than show an old figure).
pub const SERVE_AT_MOST: Duration = Duration::from_secs(60);
/// The CPU counter reported for every container (seconds): see the module
/// documentation.
pub const CPU_PLACEHOLDER_SECONDS: f64 = 1e-6;

/// One sandbox Pod's figures.
#[derive(Debug, Clone)]
pub struct PodStats {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub containers: Vec<String>,
    /// RFC 3339 start of the Pod (its `status.startTime`).
    pub start_time: Option<String>,
    /// `None` when sandboxd could not be asked.
    pub stats: Option<SandboxStats>,
}

/// A scrape's answer: the Pods with figures, and how many running sandbox
/// Pods were left out because theirs could not be fetched.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    pub pods: Vec<PodStats>,
    pub left_out: usize,
}

/// Figures by sandbox id, each with when it was fetched.
#[derive(Default)]
struct Cache {
    by_id: HashMap<String, (Instant, SandboxStats)>,
    /// When the last refresh started.
    refreshed: Option<Instant>,
    /// The refresh in flight: true once done.
    running: Option<watch::Receiver<bool>>,
}

/// Serves the figures, cached.
pub struct StatsSource {
    sandboxes: Arc<dyn Sandboxes>,
    plane: Arc<dyn DataPlane>,
    cache: Arc<Mutex<Cache>>,
}

/// Which sandboxes to ask: every running one when the figures are older
/// than [`CACHE_TTL`] (or were never fetched), else those the cache lacks
/// (new, or failed last time). Pure.
fn to_fetch<'a>(
    running: impl Iterator<Item = &'a str>,
    cached: impl Fn(&str) -> bool,
    refreshed: Option<Instant>,
    now: Instant,
) -> Vec<String> {
    let stale = refreshed.is_none_or(|t| now.duration_since(t) >= CACHE_TTL);
    running
        .filter(|id| stale || !cached(id))
        .map(str::to_string)
        .collect()
}

impl StatsSource {
    pub fn new(sandboxes: Arc<dyn Sandboxes>, plane: Arc<dyn DataPlane>) -> StatsSource {
        StatsSource {
            sandboxes,
            plane,
            cache: Arc::default(),
        }
    }

    fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The refresh to wait for: the one in flight, or a new one when the
    /// figures are due; `None` when they are fresh.
    fn refresh(&self, running: &[(Pod, SandboxRef)]) -> Option<watch::Receiver<bool>> {
        let mut cache = self.cache();
        if let Some(rx) = &cache.running {
            return Some(rx.clone());
        }
        let now = Instant::now();
        let fetch = to_fetch(
            running.iter().map(|(_, s)| s.id.as_str()),
            |id| cache.by_id.contains_key(id),
            cache.refreshed,
            now,
        );
        if fetch.is_empty() {
            return None;
        }
        if fetch.len() == running.len() {
            cache.refreshed = Some(now);
        }
        let (done, rx) = watch::channel(false);
        cache.running = Some(rx.clone());
        drop(cache);
        let ids: Vec<String> = running.iter().map(|(_, s)| s.id.clone()).collect();
        let plane = Arc::clone(&self.plane);
        let shared = Arc::clone(&self.cache);
        tokio::spawn(async move {
            let mut fetched = futures::stream::iter(fetch.into_iter().map(|id| {
                let plane = Arc::clone(&plane);
                async move {
                    let got = tokio::time::timeout(CALL_TIMEOUT, plane.stats(&id)).await;
                    (id, got)
                }
            }))
            .buffer_unordered(FAN_OUT);
            while let Some((id, got)) = fetched.next().await {
                let got = match got {
                    Ok(Ok(s)) => Some(s),
                    Ok(Err(e)) => {
                        tracing::info!(sandbox = %id, error = %e, "sandbox stats: left out of this scrape");
                        None
                    }
                    Err(_) => {
                        tracing::info!(sandbox = %id, timeout = ?CALL_TIMEOUT, "sandbox stats timed out: left out of this scrape");
                        None
                    }
                };
                let mut cache = shared.lock().unwrap_or_else(|e| e.into_inner());
                match got {
                    // Each figure lands as it comes: a scrape that stops
                    // waiting serves what has arrived.
                    Some(s) => {
                        cache.by_id.insert(id, (Instant::now(), s));
                    }
                    None => {
                        cache.by_id.remove(&id);
                    }
                }
            }
            let mut cache = shared.lock().unwrap_or_else(|e| e.into_inner());
            // Sandboxes no longer running are forgotten.
            cache.by_id.retain(|id, _| ids.contains(id));
            cache.running = None;
            drop(cache);
            let _ = done.send(true);
        });
        Some(rx)
    }

    /// Every running sandbox Pod whose figures are known (fetched if the
    /// cache is older than [`CACHE_TTL`] or lacks a sandbox, waiting at
    /// most [`SCRAPE_WAIT`] for them).
    pub async fn pods(&self) -> Scrape {
        let running = self.sandboxes.running();
        if let Some(mut done) = self.refresh(&running) {
            let waited = tokio::time::timeout(SCRAPE_WAIT, done.wait_for(|d| *d)).await;
            if waited.is_err() {
                tracing::info!(wait = ?SCRAPE_WAIT, "sandbox stats still coming: answering with those in");
            }
        }
        let cache = self.cache();
        let now = Instant::now();
        let mut scrape = Scrape::default();
        for (pod, sandbox) in running {
            match cache.by_id.get(&sandbox.id) {
                Some((at, s)) if now.duration_since(*at) <= SERVE_AT_MOST => {
                    scrape.pods.push(pod_stats(&pod, Some(s.clone())));
                }
                _ => scrape.left_out += 1,
            }
        }
        scrape
    }
}

fn pod_stats(pod: &Pod, stats: Option<SandboxStats>) -> PodStats {
    PodStats {
        namespace: pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        containers: pod
            .spec
            .as_ref()
            .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default(),
        start_time: pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0.to_string()),
        stats,
    }
}

/// The measured memory (bytes, and when), if any.
fn measured(p: &PodStats) -> Option<(u64, &SandboxStats)> {
    let s = p.stats.as_ref()?;
    Some((s.mem_used_bytes?, s))
}

/// The stats summary (the kubelet's `stats/v1alpha1` `Summary`). Pure.
pub fn summary(node: &str, pods: &[PodStats]) -> Value {
    let pods: Vec<Value> = pods
        .iter()
        .map(|p| {
            let memory = measured(p).map(|(used, s)| {
                let mut m = json!({
                    "workingSetBytes": used,
                    "usageBytes": used,
                    "rssBytes": used,
                });
                if let Some(t) = &s.measured_at {
                    m["time"] = json!(t.to_string());
                }
                if s.mem_total_bytes >= used && s.mem_total_bytes > 0 {
                    m["availableBytes"] = json!(s.mem_total_bytes - used);
                }
                m
            });
            let containers: Vec<Value> = p
                .containers
                .iter()
                .map(|c| {
                    let mut v = json!({"name": c, "startTime": p.start_time});
                    if let Some(m) = &memory {
                        v["memory"] = m.clone();
                    }
                    v
                })
                .collect();
            let mut v = json!({
                "podRef": {"name": p.name, "namespace": p.namespace, "uid": p.uid},
                "startTime": p.start_time,
                "containers": containers,
            });
            if let Some(m) = memory {
                v["memory"] = m;
            }
            v
        })
        .collect();
    json!({"node": {"nodeName": node, "startTime": null}, "pods": pods})
}

fn rfc3339_millis(t: &str) -> Option<i64> {
    crate::sandboxd::lease_deadline::parse_rfc3339(t).map(|ts| ts.as_millisecond())
}

fn label(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// `/metrics/resource` in the Prometheus text format, as metrics-server
/// reads it; `scrape_error` is 1 when some Pod's figures are missing. Pure.
pub fn resource_metrics(scrape: &Scrape) -> String {
    let pods = &scrape.pods;
    let mut mem = String::new();
    let mut cpu = String::new();
    let mut start = String::new();
    let mut pod_mem = String::new();
    for p in pods {
        let Some((used, s)) = measured(p) else {
            continue;
        };
        let ts = s
            .measured_at
            .map(|t| format!(" {}", t.as_millisecond()))
            .unwrap_or_default();
        let (ns, name) = (label(&p.namespace), label(&p.name));
        for c in &p.containers {
            let c = label(c);
            let labels = format!("container=\"{c}\",namespace=\"{ns}\",pod=\"{name}\"");
            let _ = writeln!(
                mem,
                "container_memory_working_set_bytes{{{labels}}} {used}{ts}"
            );
            let _ = writeln!(
                cpu,
                "container_cpu_usage_seconds_total{{{labels}}} {CPU_PLACEHOLDER_SECONDS:e}{ts}"
            );
            if let Some(st) = p.start_time.as_deref().and_then(rfc3339_millis) {
                let secs = st as f64 / 1000.0;
                let _ = writeln!(start, "container_start_time_seconds{{{labels}}} {secs}{ts}");
            }
        }
        let _ = writeln!(
            pod_mem,
            "pod_memory_working_set_bytes{{namespace=\"{ns}\",pod=\"{name}\"}} {used}{ts}"
        );
    }
    let mut out = String::new();
    out.push_str("# HELP container_cpu_usage_seconds_total Not measured: sandboxd reports no CPU usage. A constant placeholder so that metrics-server keeps the Pod's memory.\n");
    out.push_str("# TYPE container_cpu_usage_seconds_total counter\n");
    out.push_str(&cpu);
    out.push_str("# HELP container_memory_working_set_bytes Memory of the sandbox's VM (the VMM process's resident set), in bytes.\n");
    out.push_str("# TYPE container_memory_working_set_bytes gauge\n");
    out.push_str(&mem);
    out.push_str("# HELP container_start_time_seconds Start time of the container since unix epoch in seconds.\n");
    out.push_str("# TYPE container_start_time_seconds gauge\n");
    out.push_str(&start);
    out.push_str("# HELP pod_memory_working_set_bytes Memory of the sandbox's VM (the VMM process's resident set), in bytes.\n");
    out.push_str("# TYPE pod_memory_working_set_bytes gauge\n");
    out.push_str(&pod_mem);
    out.push_str("# HELP scrape_error 1 if there was an error while getting container metrics, 0 otherwise\n");
    out.push_str("# TYPE scrape_error gauge\n");
    let error = scrape.left_out > 0 || pods.iter().any(|p| p.stats.is_none());
    let _ = writeln!(out, "scrape_error {}", u8::from(error));
    out
}

#[cfg(test)]
mod tests;
