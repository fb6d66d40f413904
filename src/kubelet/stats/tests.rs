use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::BoxFuture;

use super::*;
use crate::kubelet::sandbox::{Relay, RelayError, SandboxRef, Unavailable};
use crate::sandboxd::Secret;

fn pod(ns: &str, name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "main"}]},
        "status": {"startTime": "2026-12-01T10:00:00Z"}
    }))
    .unwrap()
}

fn stats(used: u64, measured: bool) -> SandboxStats {
    SandboxStats {
        mem_used_bytes: measured.then_some(used),
        mem_total_bytes: 1 << 30,
        hibernated: !measured,
        measured_at: Some("2026-12-01T10:05:00Z".parse().unwrap()),
    }
}

fn with(p: Pod, s: Option<SandboxStats>) -> PodStats {
    pod_stats(&p, s)
}

#[test]
fn the_summary_has_memory_where_measured_and_no_cpu() {
    let pods = [
        with(pod("ns", "a"), Some(stats(123_456, true))),
        with(pod("ns", "b"), Some(stats(0, false))),
        with(pod("ns", "c"), None),
    ];
    let s = summary("node-a", &pods);
    assert_eq!(s["node"]["nodeName"], "node-a");
    let a = &s["pods"][0];
    assert_eq!(
        a["podRef"],
        json!({"name": "a", "namespace": "ns", "uid": "uid-a"})
    );
    assert_eq!(a["memory"]["workingSetBytes"], 123_456);
    assert_eq!(a["memory"]["time"], "2026-12-01T10:05:00Z");
    assert_eq!(a["memory"]["availableBytes"], (1u64 << 30) - 123_456);
    assert_eq!(a["containers"][0]["name"], "main");
    assert_eq!(a["containers"][0]["memory"]["workingSetBytes"], 123_456);
    assert_eq!(a["containers"][0]["startTime"], "2026-12-01T10:00:00Z");
    assert!(a.get("cpu").is_none() && a["containers"][0].get("cpu").is_none());
    // Hibernated or unknown: listed, with no memory (not a zero).
    for i in [1, 2] {
        let p = &s["pods"][i];
        assert!(p.get("memory").is_none(), "{p}");
        assert!(p["containers"][0].get("memory").is_none());
    }
}

#[test]
fn resource_metrics_as_metrics_server_reads_them() {
    let pods = [
        with(pod("ns", "a"), Some(stats(2048, true))),
        with(pod("ns", "b"), Some(stats(0, false))),
    ];
    let text = resource_metrics(&pods);
    let ts = 1_796_119_500_000i64; // 2026-12-01T10:05:00Z in ms
    assert!(text.contains(&format!(
        "container_memory_working_set_bytes{{container=\"main\",namespace=\"ns\",pod=\"a\"}} 2048 {ts}\n"
    )), "{text}");
    assert!(text.contains(&format!(
        "container_cpu_usage_seconds_total{{container=\"main\",namespace=\"ns\",pod=\"a\"}} 1e-6 {ts}\n"
    )), "{text}");
    assert!(text.contains("container_start_time_seconds{container=\"main\",namespace=\"ns\",pod=\"a\"} 1796119200 "), "{text}");
    assert!(text.contains("pod_memory_working_set_bytes{namespace=\"ns\",pod=\"a\"} 2048"));
    assert!(!text.contains("pod=\"b\""), "not measured: not reported");
    assert!(text.contains("scrape_error 0\n"));
    let failed = resource_metrics(&[with(pod("ns", "c"), None)]);
    assert!(failed.contains("scrape_error 1\n"));
    // Each family is typed once.
    assert_eq!(
        text.matches("# TYPE container_memory_working_set_bytes gauge")
            .count(),
        1
    );
}

#[test]
fn label_values_are_escaped() {
    assert_eq!(label(r#"a"b\c"#), r#"a\"b\\c"#);
    assert_eq!(label("x\ny"), r"x\ny");
}

struct Two;

impl Sandboxes for Two {
    fn lookup(&self, _: &str, _: &str, _: Option<&str>) -> Result<SandboxRef, Unavailable> {
        Err(Unavailable::NoPod)
    }
    fn running(&self) -> Vec<(Pod, SandboxRef)> {
        (0..20)
            .map(|i| {
                (
                    pod("ns", &format!("p{i}")),
                    SandboxRef {
                        id: format!("sb_{i}"),
                        token: Secret::new("t"),
                    },
                )
            })
            .collect()
    }
}

#[derive(Default)]
struct Counting {
    calls: AtomicUsize,
    in_flight: AtomicUsize,
    most: Mutex<usize>,
}

impl DataPlane for Counting {
    fn agent<'a>(&'a self, _: &'a SandboxRef) -> BoxFuture<'a, Result<Relay, RelayError>> {
        Box::pin(async { Err(RelayError::Transport("none".into())) })
    }
    fn port<'a>(&'a self, _: &'a SandboxRef, _: u16) -> BoxFuture<'a, Result<Relay, RelayError>> {
        Box::pin(async { Err(RelayError::Transport("none".into())) })
    }
    fn stats<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<SandboxStats, RelayError>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            {
                let mut most = self.most.lock().unwrap();
                *most = (*most).max(now);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            if id == "sb_3" {
                return Err(RelayError::Status {
                    status: 404,
                    message: "unknown sandbox".into(),
                });
            }
            Ok(stats(1000, true))
        })
    }
}

#[tokio::test]
async fn figures_are_cached_shared_and_fetched_with_bounded_fan_out() {
    let plane = Arc::new(Counting::default());
    let source = Arc::new(StatsSource::new(Arc::new(Two), plane.clone()));
    let (a, b) = tokio::join!(source.pods(), source.pods());
    assert_eq!(a.len(), 20);
    assert_eq!(b.len(), 20);
    assert_eq!(
        plane.calls.load(Ordering::SeqCst),
        20,
        "one refresh serves both scrapes"
    );
    assert!(*plane.most.lock().unwrap() <= FAN_OUT);
    assert!(*plane.most.lock().unwrap() > 1, "fetched concurrently");
    assert!(a.iter().find(|p| p.name == "p3").unwrap().stats.is_none());
    assert_eq!(a.iter().filter(|p| p.stats.is_some()).count(), 19);
    let _ = source.pods().await;
    assert_eq!(
        plane.calls.load(Ordering::SeqCst),
        20,
        "cached within the TTL"
    );
}
