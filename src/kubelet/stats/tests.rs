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
    let text = resource_metrics(&Scrape {
        pods: pods.to_vec(),
        left_out: 0,
    });
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
    let failed = resource_metrics(&Scrape {
        pods: vec![with(pod("ns", "c"), None)],
        left_out: 0,
    });
    assert!(failed.contains("scrape_error 1\n"));
    let partial = resource_metrics(&Scrape {
        pods: pods.to_vec(),
        left_out: 1,
    });
    assert!(partial.contains("scrape_error 1\n"), "a Pod left out");
    assert!(partial.contains("pod=\"a\""), "the others still served");
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

/// Twenty running sandbox Pods, `sb_0` … `sb_19`.
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

/// A sandboxd whose stats calls take `delay` (`slow` ones `slow_delay`),
/// `sb_3` answering 404.
#[derive(Default)]
struct Counting {
    calls: AtomicUsize,
    in_flight: AtomicUsize,
    most: Mutex<usize>,
    slow: Vec<String>,
    slow_delay: Duration,
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
            let delay = if self.slow.iter().any(|s| s == id) {
                self.slow_delay
            } else {
                Duration::from_millis(5)
            };
            tokio::time::sleep(delay).await;
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
    assert_eq!(a.pods.len(), 19);
    assert_eq!(b.pods.len(), 19);
    assert_eq!(
        plane.calls.load(Ordering::SeqCst),
        20,
        "one refresh serves both scrapes"
    );
    assert!(*plane.most.lock().unwrap() <= FAN_OUT);
    assert!(*plane.most.lock().unwrap() > 1, "fetched concurrently");
    // The failed one is left out, never a zero.
    assert!(a.pods.iter().all(|p| p.name != "p3"));
    assert_eq!(a.left_out, 1);
    assert!(a.pods.iter().all(|p| p.stats.is_some()));
    // Cached within the TTL; a sandbox missing from the cache (its fetch
    // failed) is asked again, alone.
    let again = source.pods().await;
    assert_eq!(again.left_out, 1);
    assert_eq!(plane.calls.load(Ordering::SeqCst), 21);
}

#[tokio::test(start_paused = true)]
async fn figures_are_reused_within_the_ttl_and_fetched_after() {
    struct Healthy;
    impl Sandboxes for Healthy {
        fn lookup(&self, _: &str, _: &str, _: Option<&str>) -> Result<SandboxRef, Unavailable> {
            Err(Unavailable::NoPod)
        }
        fn running(&self) -> Vec<(Pod, SandboxRef)> {
            Two.running()
                .into_iter()
                .filter(|(_, s)| s.id != "sb_3")
                .collect()
        }
    }
    let plane = Arc::new(Counting::default());
    let source = StatsSource::new(Arc::new(Healthy), plane.clone());
    assert_eq!(source.pods().await.pods.len(), 19);
    assert_eq!(source.pods().await.pods.len(), 19);
    assert_eq!(plane.calls.load(Ordering::SeqCst), 19, "cached");
    tokio::time::sleep(CACHE_TTL).await;
    assert_eq!(source.pods().await.pods.len(), 19);
    assert_eq!(
        plane.calls.load(Ordering::SeqCst),
        38,
        "fetched again after the TTL"
    );
}

/// The review's lower note: a slow sandboxd made `/stats/summary` never
/// answer (one lock across the whole fan-out, restarted by every scrape
/// its client gave up on). Now a scrape answers within [`SCRAPE_WAIT`]
/// with the figures in, the slow ones left out; the refresh goes on and
/// the next scrape serves them, without asking again.
#[tokio::test(start_paused = true)]
async fn a_slow_sandboxd_gives_partial_answers_in_time() {
    let plane = Arc::new(Counting {
        slow: vec!["sb_7".into(), "sb_8".into()],
        slow_delay: CALL_TIMEOUT - Duration::from_millis(500) + SCRAPE_WAIT,
        ..Counting::default()
    });
    // (slow_delay is over the call timeout: those two time out.)
    let source = Arc::new(StatsSource::new(Arc::new(Two), plane.clone()));
    let started = tokio::time::Instant::now();
    let first = source.pods().await;
    let took = started.elapsed();
    assert!(took <= CALL_TIMEOUT, "answered in {took:?}");
    assert_eq!(first.pods.len(), 17);
    assert_eq!(first.left_out, 3, "sb_3 failed, sb_7 and sb_8 timed out");
    // A scrape its client gives up on does not stop the refresh.
    let plane2 = Arc::new(Counting {
        slow: (0..20).map(|i| format!("sb_{i}")).collect(),
        slow_delay: Duration::from_secs(2),
        ..Counting::default()
    });
    let source2 = Arc::new(StatsSource::new(Arc::new(Two), plane2.clone()));
    let given_up = tokio::time::timeout(Duration::from_millis(100), source2.pods()).await;
    assert!(given_up.is_err());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = source2.pods().await;
    assert_eq!(
        later.pods.len(),
        19,
        "the refresh finished without a scrape"
    );
    assert_eq!(
        plane2.calls.load(Ordering::SeqCst),
        20,
        "and the next scrape did not start over"
    );
}

#[tokio::test(start_paused = true)]
async fn a_scrape_waits_at_most_its_bound() {
    // Every call just under its timeout: the first FAN_OUT are in after
    // 2.9 s, the other four would take as long again.
    let plane = Arc::new(Counting {
        slow: (0..20).map(|i| format!("sb_{i}")).collect(),
        slow_delay: Duration::from_millis(2900),
        ..Counting::default()
    });
    let source = StatsSource::new(Arc::new(Two), plane);
    let started = tokio::time::Instant::now();
    let scrape = source.pods().await;
    assert_eq!(started.elapsed(), SCRAPE_WAIT, "answered at the bound");
    assert_eq!(
        scrape.pods.len(),
        FAN_OUT - 1,
        "the first round, sb_3 failed"
    );
    assert_eq!(scrape.left_out, 20 - (FAN_OUT - 1));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let next = source.pods().await;
    assert_eq!(
        (next.pods.len(), next.left_out),
        (19, 1),
        "the rest arrived"
    );
}

#[test]
fn what_to_fetch() {
    let now = tokio::time::Instant::now();
    let ids = ["a", "b", "c"];
    let cached = |id: &str| id != "b";
    let all = ["a", "b", "c"].map(String::from).to_vec();
    assert_eq!(
        to_fetch(ids.into_iter(), cached, None, now),
        all,
        "never fetched"
    );
    assert_eq!(
        to_fetch(ids.into_iter(), cached, Some(now), now),
        ["b"],
        "fresh: only the missing"
    );
    let old = now.checked_sub(CACHE_TTL).unwrap();
    assert_eq!(
        to_fetch(ids.into_iter(), cached, Some(old), now),
        all,
        "stale at the TTL"
    );
    let young = now
        .checked_sub(CACHE_TTL - Duration::from_millis(1))
        .unwrap();
    assert_eq!(
        to_fetch(ids.into_iter(), |_| true, Some(young), now),
        Vec::<String>::new()
    );
}
