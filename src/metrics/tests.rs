use super::*;
use crate::sandboxd::{Observer, Op, SandboxdError};
use std::time::Duration;

#[test]
fn exposition_has_every_family_and_process_metrics() {
    let m = Metrics::new().unwrap();
    m.kubelet_requests
        .with_label_values(&["/pods", "200"])
        .inc();
    m.kubelet_auth_failures
        .with_label_values(&["unauthenticated"])
        .inc();
    m.kubelet_cert_reloads.with_label_values(&["success"]).inc();
    m.lease_renewed(true);
    m.lease_renewed(false);
    let text = m.encode().unwrap();
    for needle in [
        "# TYPE vk_sandbox_kubelet_requests_total counter",
        "vk_sandbox_kubelet_requests_total{code=\"200\",route=\"/pods\"} 1",
        "vk_sandbox_kubelet_auth_failures_total{reason=\"unauthenticated\"} 1",
        "vk_sandbox_lease_renewals_total{result=\"success\"} 1",
        "vk_sandbox_lease_renewals_total{result=\"error\"} 1",
        "# TYPE vk_sandbox_lease_last_success_timestamp_seconds gauge",
        "vk_sandbox_build_info{",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    assert!(m.lease_last_success.get() > 1.0e9);
}

#[test]
fn sandboxd_calls_sampled_gauges_and_reconciles_are_exposed() {
    let m = Metrics::new().unwrap();
    let ms = std::time::Duration::from_millis(3);
    m.observe(Op::Claim, ms, Ok(()));
    let refused = SandboxdError::Http {
        op: Op::Release,
        status: 500,
        message: String::new(),
    };
    m.observe(Op::Release, ms, Err(&refused));
    m.observe(
        Op::Claim,
        ms,
        Err(&SandboxdError::CapacityMiss {
            message: String::new(),
        }),
    );
    m.register_sampled(
        SampledGauge::new("vk_sandbox_test_things", "Things.", "state", || {
            vec![("b".into(), 2), ("a".into(), 1)]
        })
        .unwrap(),
    )
    .unwrap();
    m.reconciled(Controller::Node, ms, &Ok(()));
    m.reconciled(
        Controller::Inventory,
        ms,
        &Err::<(), _>(Error::Config("x".into())),
    );
    let text = m.encode().unwrap();
    for needle in [
        "vk_sandbox_sandboxd_requests_total{endpoint=\"claim\",status=\"ok\"} 1",
        "vk_sandbox_sandboxd_requests_total{endpoint=\"release\",status=\"500\"} 1",
        "vk_sandbox_sandboxd_requests_total{endpoint=\"claim\",status=\"capacity_miss\"} 1",
        "vk_sandbox_sandboxd_request_duration_seconds_count{endpoint=\"claim\"} 2",
        "# TYPE vk_sandbox_test_things gauge",
        "vk_sandbox_test_things{state=\"a\"} 1\nvk_sandbox_test_things{state=\"b\"} 2",
        "vk_sandbox_reconcile_runs_total{controller=\"node\"} 1",
        "vk_sandbox_reconcile_failures_total{controller=\"inventory\",error=\"config\"} 1",
        "vk_sandbox_orphan_audit_sandboxes{verdict=\"orphan\"} 0",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
}

#[test]
fn registries_are_independent() {
    let a = Metrics::new().unwrap();
    let b = Metrics::new().unwrap();
    a.lease_renewed(true);
    assert_eq!(b.lease_renewals.with_label_values(&["success"]).get(), 0);
}

#[test]
fn value_reads_one_series_by_its_labels() {
    let m = Metrics::new().unwrap();
    m.pod_status_write("written", Duration::from_millis(4));
    m.pod_status_write("written", Duration::from_millis(4));
    m.pod_status_write("conflict", Duration::from_millis(4));
    m.claim_written(Duration::from_millis(1), Duration::from_millis(3));
    let writes = |r: &str| m.value("vk_sandbox_pod_status_writes_total", &[("result", r)]);
    assert_eq!(writes("written"), Some(2.0));
    assert_eq!(writes("conflict"), Some(1.0));
    assert_eq!(writes("gone"), None, "never recorded");
    assert_eq!(m.value("vk_sandbox_claim_duration_seconds", &[]), Some(1.0));
    assert_eq!(m.value("vk_sandbox_no_such_metric", &[]), None);
    m.orphan_scanned([("stray", 3), ("orphan", 0)]);
    assert_eq!(
        m.value("vk_sandbox_orphan_audit_sandboxes", &[("verdict", "stray")]),
        Some(3.0)
    );
}

#[test]
fn a_status_writes_round_trip_lands_in_its_bucket_by_result() {
    let m = Metrics::new().unwrap();
    m.pod_status_write("written", Duration::from_millis(180));
    m.pod_status_write("written", Duration::from_millis(4));
    m.pod_status_write("gone", Duration::from_millis(80));
    let text = m.encode().unwrap();
    let h = "vk_sandbox_pod_status_write_duration_seconds";
    for (needle, want) in [
        (
            format!("{h}_bucket{{result=\"written\",le=\"0.005\"}} "),
            "1",
        ),
        (
            format!("{h}_bucket{{result=\"written\",le=\"0.15\"}} "),
            "1",
        ),
        (format!("{h}_bucket{{result=\"written\",le=\"0.2\"}} "), "2"),
        (format!("{h}_bucket{{result=\"gone\",le=\"0.075\"}} "), "0"),
        (format!("{h}_bucket{{result=\"gone\",le=\"0.1\"}} "), "1"),
        (format!("{h}_count{{result=\"written\"}} "), "2"),
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&needle))
            .unwrap_or_else(|| panic!("no {needle} in:\n{text}"));
        assert_eq!(line.trim_start_matches(&needle), want, "{line}");
    }
}

#[test]
fn own_shares_land_in_their_fine_buckets() {
    let m = Metrics::new().unwrap();
    m.claim_own(Duration::from_micros(300));
    m.resume_own(Duration::from_micros(1200));
    let text = m.encode().unwrap();
    for (needle, want) in [
        ("vk_sandbox_claim_own_seconds_bucket{le=\"0.00025\"} ", "0"),
        ("vk_sandbox_claim_own_seconds_bucket{le=\"0.0005\"} ", "1"),
        ("vk_sandbox_claim_own_seconds_count ", "1"),
        ("vk_sandbox_resume_own_seconds_bucket{le=\"0.001\"} ", "0"),
        ("vk_sandbox_resume_own_seconds_bucket{le=\"0.0015\"} ", "1"),
        ("vk_sandbox_resume_own_seconds_count ", "1"),
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(needle))
            .unwrap_or_else(|| panic!("missing {needle:?} in\n{text}"));
        assert_eq!(&line[needle.len()..], want, "{line}");
    }
}

#[cfg(target_os = "linux")]
#[test]
fn cpu_ticks_are_read_after_the_command_name() {
    use super::process::cpu_ticks;
    // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
    // majflt cmajflt utime stime ...
    let stat = "42 (vk (sand) box) S 1 42 42 0 -1 4194560 10 0 0 0 123 45 0 0 20 0 4 0";
    assert_eq!(cpu_ticks(stat), Some(168));
    assert_eq!(cpu_ticks("42 (x) S 1 2"), None);
    assert_eq!(cpu_ticks("no parenthesis"), None);
}

#[cfg(target_os = "linux")]
#[test]
fn process_cpu_seconds_are_not_whole_seconds() {
    let m = Metrics::new().expect("metrics");
    let read = |m: &Metrics| {
        let text = m.encode().expect("encode");
        text.lines()
            .find_map(|l| l.strip_prefix("process_cpu_seconds_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .expect("process_cpu_seconds_total")
    };
    let before = read(&m);
    // Spin until this process has used at least 50 ms more CPU (bounded).
    let start = std::time::Instant::now();
    let mut x = 0u64;
    while read(&m) < before + 0.05 && start.elapsed() < std::time::Duration::from_secs(10) {
        for i in 0..100_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
    }
    let used = read(&m) - before;
    // A whole-second counter moves by 0 or 1. (The subtraction may land a
    // rounding error below the 0.05 the loop waited for.)
    assert!(
        used >= 0.05 - 1e-9 && (used - used.round()).abs() > 1e-6,
        "process CPU moved by {used}"
    );
}

#[test]
fn streaming_sessions_are_exposed_from_their_counts() {
    use crate::stream_stats::{Close, Refusal};
    let m = Metrics::new().unwrap();
    let s = m.streaming();
    s.refused(Refusal::PodSessions);
    s.refused(Refusal::SessionStreams);
    s.refused(Refusal::SessionStreams);
    s.closed(Close::HangUp);
    s.session_opened();
    s.stream_opened();
    s.stream_opened();
    s.queued(4096);
    let text = m.encode().unwrap();
    for needle in [
        "# TYPE vk_sandbox_streaming_refusals_total counter",
        "vk_sandbox_streaming_refusals_total{reason=\"node_sessions\"} 0",
        "vk_sandbox_streaming_refusals_total{reason=\"pod_sessions\"} 1",
        "vk_sandbox_streaming_refusals_total{reason=\"session_streams\"} 2",
        "# TYPE vk_sandbox_streaming_closes_total counter",
        "vk_sandbox_streaming_closes_total{reason=\"hang_up\"} 1",
        "vk_sandbox_streaming_closes_total{reason=\"idle_timeout\"} 0",
        "# TYPE vk_sandbox_streaming_sessions gauge",
        "vk_sandbox_streaming_sessions 1",
        "vk_sandbox_streaming_spdy_streams 2",
        "vk_sandbox_streaming_queued_bytes 4096",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    assert_eq!(
        m.value(
            "vk_sandbox_streaming_refusals_total",
            &[("reason", "session_streams")]
        ),
        Some(2.0)
    );
}
