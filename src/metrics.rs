//! Prometheus metrics (decisions.md D1: the `prometheus` crate with an
//! explicit registry, plus its Linux process collector).
//!
//! One [`Metrics`] is built in `main` and shared as `Arc<Metrics>`. Every
//! metric is named `vk_sandbox_…`, counters end in `_total`, units are in the
//! name. To add a metric: add a field, build it in [`Metrics::with_registry`]
//! with [`register`], and document it in the field's comment.

use std::sync::Arc;

use prometheus::core::Collector;
use prometheus::{Encoder, Gauge, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

use crate::error::{Error, Result};
use crate::sandboxd::{Observer, Op, SandboxdError};

/// Content type of the text exposition format served on `/metrics`.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Buckets for the sub-millisecond paths (sandboxd calls, claims-store
/// fsyncs, the provider's share of a claim): fine around 1–2 ms, where
/// sandboxd (0.2–0.7 ms) and a local fsync land, then up to 10 s.
const FINE_BUCKETS: [f64; 19] = [
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The metrics of one process.
pub struct Metrics {
    registry: Registry,
    /// `vk_sandbox_build_info{version,revision}` = 1.
    pub build_info: IntGaugeVec,
    /// `vk_sandbox_kubelet_requests_total{route,code}`: kubelet API requests
    /// by matched route template and HTTP status code.
    pub kubelet_requests: IntCounterVec,
    /// `vk_sandbox_kubelet_auth_failures_total{reason}`: refused kubelet API
    /// requests; reason is one of `unauthenticated`, `authentication_error`,
    /// `forbidden`, `authorization_error`.
    pub kubelet_auth_failures: IntCounterVec,
    /// `vk_sandbox_kubelet_cert_reloads_total{result}`: serving certificate
    /// reloads (`success` / `error`).
    pub kubelet_cert_reloads: IntCounterVec,
    /// `vk_sandbox_lease_renewals_total{result}`: node Lease renewals
    /// (`success` / `error`).
    pub lease_renewals: IntCounterVec,
    /// `vk_sandbox_lease_last_success_timestamp_seconds`: Unix time of the
    /// last successful Lease renewal.
    pub lease_last_success: Gauge,
    /// `vk_sandbox_reconcile_runs_total{controller}`.
    pub reconcile_runs: IntCounterVec,
    /// `vk_sandbox_reconcile_failures_total{controller,error}`: failures by
    /// error kind (`Error::metric_label`).
    pub reconcile_failures: IntCounterVec,
    /// `vk_sandbox_reconcile_duration_seconds{controller}`.
    pub reconcile_duration: prometheus::HistogramVec,
    /// `vk_sandbox_claim_duration_seconds`: from the reconcile that first
    /// sees a Pod to its Running status written (claims and adoptions).
    pub claim_duration: prometheus::Histogram,
    /// `vk_sandbox_claim_provider_seconds`: the same start to the moment
    /// the Running status write is sent — vk-sandbox's own share (sandboxd
    /// claim and claims-store commit included, the apiserver's answer not).
    pub claim_provider: prometheus::Histogram,
    /// `vk_sandbox_sandboxd_requests_total{endpoint,status}`: sandboxd calls
    /// by endpoint (`claim`, `release`, `list`, `info`) and outcome: `ok`,
    /// the HTTP status of a refusal, or the error kind (`timeout`,
    /// `transport`, `decode`, `capacity_miss`, …).
    pub sandboxd_requests: IntCounterVec,
    /// `vk_sandbox_sandboxd_request_duration_seconds{endpoint}`.
    pub sandboxd_request_duration: prometheus::HistogramVec,
    /// `vk_sandbox_claims_store_write_duration_seconds{result}`: one batch of
    /// the claims store (write + fsync of file and directory).
    pub claims_store_write_duration: prometheus::HistogramVec,
    /// `vk_sandbox_inventory_applies_total{result}`: NodeInventory applies
    /// (`success` / `error`).
    pub inventory_applies: IntCounterVec,
    /// `vk_sandbox_inventory_skips_total{reason}`: ticks that applied
    /// nothing: `unchanged`, `list_failed`, `info_failed`.
    pub inventory_skips: IntCounterVec,
    /// `vk_sandbox_orphan_audit_sandboxes{verdict}`: sandboxes per verdict of
    /// the last successful orphan scan (`orphan`, `external`, `stray`,
    /// `stale`).
    pub orphan_audit: IntGaugeVec,
    /// `vk_sandbox_orphan_audit_scans_total{result}`: `success` / `skipped`.
    pub orphan_scans: IntCounterVec,
    /// `vk_sandbox_pod_status_writes_total{result}`: `pods/status` writes
    /// sent: `written`, `conflict` (the Pod changed or was replaced since it
    /// was read; re-read, never overwritten), `gone`, `error`. Writes found
    /// unnecessary (the Pod already shows the status) are not sent or counted.
    pub pod_status_writes: IntCounterVec,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Register `collector` in `registry` and hand it back.
pub fn register<C: Collector + Clone + 'static>(registry: &Registry, collector: C) -> Result<C> {
    registry
        .register(Box::new(collector.clone()))
        .map_err(|e| Error::Internal(format!("registering a metric: {e}")))?;
    Ok(collector)
}

fn metric_error(e: prometheus::Error) -> Error {
    Error::Internal(format!("building a metric: {e}"))
}

fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec> {
    let vec = IntCounterVec::new(Opts::new(name, help), labels).map_err(metric_error)?;
    register(registry, vec)
}

fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> Result<prometheus::HistogramVec> {
    let vec = prometheus::HistogramVec::new(
        prometheus::HistogramOpts::new(name, help).buckets(buckets),
        labels,
    )
    .map_err(metric_error)?;
    register(registry, vec)
}

impl Metrics {
    /// A fresh registry with the process collector and every metric.
    pub fn new() -> Result<Arc<Metrics>> {
        Self::with_registry(Registry::new())
    }

    /// Every metric registered into `registry` (plus, on Linux, the process
    /// collector: `process_cpu_seconds_total`, `process_resident_memory_bytes`, …).
    pub fn with_registry(registry: Registry) -> Result<Arc<Metrics>> {
        #[cfg(target_os = "linux")]
        registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .map_err(|e| Error::Internal(format!("registering the process collector: {e}")))?;

        let build_info = IntGaugeVec::new(
            Opts::new(
                "vk_sandbox_build_info",
                "Build of the running binary (value is always 1).",
            ),
            &["version", "revision"],
        )
        .map_err(metric_error)?;
        let build_info = register(&registry, build_info)?;
        build_info
            .with_label_values(&[crate::build_info::VERSION, env!("VK_REVISION")])
            .set(1);

        let kubelet_requests = counter_vec(
            &registry,
            "vk_sandbox_kubelet_requests_total",
            "Kubelet API requests by route template and HTTP status code.",
            &["route", "code"],
        )?;
        let kubelet_auth_failures = counter_vec(
            &registry,
            "vk_sandbox_kubelet_auth_failures_total",
            "Kubelet API requests refused by authentication or authorization, by reason.",
            &["reason"],
        )?;
        let kubelet_cert_reloads = counter_vec(
            &registry,
            "vk_sandbox_kubelet_cert_reloads_total",
            "Reloads of the kubelet API serving certificate from --tls-cert/--tls-key, by result.",
            &["result"],
        )?;
        let lease_renewals = counter_vec(
            &registry,
            "vk_sandbox_lease_renewals_total",
            "Node Lease renewals by result (success or error).",
            &["result"],
        )?;
        let lease_last_success = register(
            &registry,
            Gauge::with_opts(Opts::new(
                "vk_sandbox_lease_last_success_timestamp_seconds",
                "Unix time of the last successful node Lease renewal.",
            ))
            .map_err(metric_error)?,
        )?;

        let reconcile_runs = counter_vec(
            &registry,
            "vk_sandbox_reconcile_runs_total",
            "Reconcile runs by controller.",
            &["controller"],
        )?;
        let reconcile_failures = counter_vec(
            &registry,
            "vk_sandbox_reconcile_failures_total",
            "Failed reconciles by controller and error kind.",
            &["controller", "error"],
        )?;
        let reconcile_duration = register(
            &registry,
            prometheus::HistogramVec::new(
                prometheus::HistogramOpts::new(
                    "vk_sandbox_reconcile_duration_seconds",
                    "Reconcile duration by controller.",
                )
                .buckets(vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ]),
                &["controller"],
            )
            .map_err(metric_error)?,
        )?;
        let claim_duration = register(
            &registry,
            prometheus::Histogram::with_opts(
                prometheus::HistogramOpts::new(
                    "vk_sandbox_claim_duration_seconds",
                    "From a sandbox Pod's reconcile to its Running status written (claim or adoption).",
                )
                .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0]),
            )
            .map_err(metric_error)?,
        )?;

        let claim_provider = register(
            &registry,
            prometheus::Histogram::with_opts(
                prometheus::HistogramOpts::new(
                    "vk_sandbox_claim_provider_seconds",
                    "From a sandbox Pod's reconcile to its Running status write sent: vk-sandbox's own cost (sandboxd claim and claims-store commit included, the apiserver's answer not).",
                )
                .buckets(FINE_BUCKETS.to_vec()),
            )
            .map_err(metric_error)?,
        )?;

        let sandboxd_requests = counter_vec(
            &registry,
            "vk_sandbox_sandboxd_requests_total",
            "sandboxd API calls by endpoint and outcome (ok, the HTTP status of a refusal, or the error kind).",
            &["endpoint", "status"],
        )?;
        let sandboxd_request_duration = histogram_vec(
            &registry,
            "vk_sandbox_sandboxd_request_duration_seconds",
            "sandboxd API call latency by endpoint.",
            &["endpoint"],
            FINE_BUCKETS.to_vec(),
        )?;
        let claims_store_write_duration = histogram_vec(
            &registry,
            "vk_sandbox_claims_store_write_duration_seconds",
            "Claims store batch writes (journal append or snapshot rewrite, fsync included), by result.",
            &["result"],
            FINE_BUCKETS.to_vec(),
        )?;
        let inventory_applies = counter_vec(
            &registry,
            "vk_sandbox_inventory_applies_total",
            "NodeInventory server-side applies by result.",
            &["result"],
        )?;
        let inventory_skips = counter_vec(
            &registry,
            "vk_sandbox_inventory_skips_total",
            "NodeInventory ticks that applied nothing, by reason (unchanged, list_failed, info_failed).",
            &["reason"],
        )?;
        let orphan_audit = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "vk_sandbox_orphan_audit_sandboxes",
                    "Sandboxes per verdict of the last successful orphan audit scan (report only).",
                ),
                &["verdict"],
            )
            .map_err(metric_error)?,
        )?;
        for verdict in ["orphan", "external", "stray", "stale"] {
            orphan_audit.with_label_values(&[verdict]).set(0);
        }
        let orphan_scans = counter_vec(
            &registry,
            "vk_sandbox_orphan_audit_scans_total",
            "Orphan audit scans by result (success, or skipped when sandboxd could not be listed).",
            &["result"],
        )?;

        let pod_status_writes = counter_vec(
            &registry,
            "vk_sandbox_pod_status_writes_total",
            "Pod status writes sent to the apiserver, by result (written, conflict, gone, error).",
            &["result"],
        )?;

        Ok(Arc::new(Metrics {
            pod_status_writes,
            sandboxd_requests,
            sandboxd_request_duration,
            claims_store_write_duration,
            inventory_applies,
            inventory_skips,
            orphan_audit,
            orphan_scans,
            reconcile_runs,
            reconcile_failures,
            reconcile_duration,
            claim_duration,
            claim_provider,
            registry,
            build_info,
            kubelet_requests,
            kubelet_auth_failures,
            kubelet_cert_reloads,
            lease_renewals,
            lease_last_success,
        }))
    }

    /// The registry, for modules that register their own metrics.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Record one Lease renewal outcome (and its time when it succeeded).
    pub fn lease_renewed(&self, ok: bool) {
        let result = if ok { "success" } else { "error" };
        self.lease_renewals.with_label_values(&[result]).inc();
        if ok {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            self.lease_last_success.set(now);
        }
    }

    /// Record one reconcile of `controller` that is not run by a
    /// kube-runtime `Controller` (node status, inventory).
    pub fn reconciled(&self, controller: &str, elapsed: std::time::Duration, result: &Result<()>) {
        self.reconcile_runs.with_label_values(&[controller]).inc();
        self.reconcile_duration
            .with_label_values(&[controller])
            .observe(elapsed.as_secs_f64());
        if let Err(e) = result {
            self.reconcile_failures
                .with_label_values(&[controller, e.metric_label()])
                .inc();
        }
    }

    /// Everything in the text exposition format.
    pub fn encode(&self) -> Result<String> {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .map_err(|e| Error::Internal(format!("encoding metrics: {e}")))?;
        String::from_utf8(out).map_err(|e| Error::Internal(format!("encoding metrics: {e}")))
    }
}

/// The `status` label of one sandboxd call.
fn sandboxd_status(outcome: Result<(), &SandboxdError>) -> String {
    match outcome {
        Ok(()) => "ok".to_string(),
        Err(SandboxdError::Http { status, .. }) => status.to_string(),
        Err(SandboxdError::CapacityMiss { .. }) => "capacity_miss".to_string(),
        Err(SandboxdError::Transport { timeout: true, .. }) => "timeout".to_string(),
        Err(SandboxdError::Transport { .. }) => "transport".to_string(),
        Err(SandboxdError::Decode { .. }) => "decode".to_string(),
        Err(e) => e.metric_label().trim_start_matches("sandboxd_").to_string(),
    }
}

impl Observer for Metrics {
    fn observe(&self, op: Op, elapsed: std::time::Duration, outcome: Result<(), &SandboxdError>) {
        let status = sandboxd_status(outcome);
        self.sandboxd_requests
            .with_label_values(&[op.as_str(), status.as_str()])
            .inc();
        self.sandboxd_request_duration
            .with_label_values(&[op.as_str()])
            .observe(elapsed.as_secs_f64());
    }
}

/// Gauges read at scrape time from a closure (claims by state, Pods by
/// phase): no loop keeps them up to date, and they cannot go stale.
pub struct SampledGauge {
    desc: prometheus::core::Desc,
    label: String,
    sample: Box<dyn Fn() -> Vec<(String, i64)> + Send + Sync>,
}

impl SampledGauge {
    /// A gauge family `name` with one label `label`; `sample` returns the
    /// (label value, value) pairs at each scrape.
    pub fn new(
        name: &str,
        help: &str,
        label: &str,
        sample: impl Fn() -> Vec<(String, i64)> + Send + Sync + 'static,
    ) -> Result<SampledGauge> {
        let desc = prometheus::core::Desc::new(
            name.to_string(),
            help.to_string(),
            vec![label.to_string()],
            Default::default(),
        )
        .map_err(metric_error)?;
        Ok(SampledGauge {
            desc,
            label: label.to_string(),
            sample: Box::new(sample),
        })
    }
}

impl Collector for SampledGauge {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut family = prometheus::proto::MetricFamily::default();
        family.set_name(self.desc.fq_name.clone());
        family.set_help(self.desc.help.clone());
        family.set_field_type(prometheus::proto::MetricType::GAUGE);
        let mut samples = (self.sample)();
        samples.sort();
        for (value, n) in samples {
            let mut label = prometheus::proto::LabelPair::default();
            label.set_name(self.label.clone());
            label.set_value(value);
            let mut gauge = prometheus::proto::Gauge::default();
            gauge.set_value(n as f64);
            let mut m = prometheus::proto::Metric::default();
            m.set_label(vec![label]);
            m.set_gauge(gauge);
            family.mut_metric().push(m);
        }
        vec![family]
    }
}

impl Metrics {
    /// Register a [`SampledGauge`].
    pub fn register_sampled(&self, gauge: SampledGauge) -> Result<()> {
        self.registry
            .register(Box::new(gauge))
            .map_err(|e| Error::Internal(format!("registering a metric: {e}")))
    }
}

/// `vk_sandbox_pods_pending_oldest_seconds{reason}`: for each Pod status
/// reason among the Pending Pods bound to this node (`none` when the Pod
/// has none yet, e.g. `NoWarmCapacity` while it waits for a warm VM), how
/// long the oldest of them has been Pending: since it was bound to the node
/// (its `PodScheduled` condition), else since it was created. Pods being
/// deleted are not counted. No series when no Pod is Pending.
pub const PODS_PENDING_OLDEST: &str = "vk_sandbox_pods_pending_oldest_seconds";

/// The samples of [`PODS_PENDING_OLDEST`] for `pods` at `now`.
pub fn pending_oldest<'a>(
    pods: impl IntoIterator<Item = &'a k8s_openapi::api::core::v1::Pod>,
    now: jiff::Timestamp,
) -> Vec<(String, i64)> {
    let mut oldest: std::collections::BTreeMap<String, i64> = Default::default();
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let status = pod.status.as_ref();
        if status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending") != "Pending" {
            continue;
        }
        let bound = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "True")
            })
            .and_then(|c| c.last_transition_time.as_ref());
        let Some(since) = bound.or(pod.metadata.creation_timestamp.as_ref()) else {
            continue;
        };
        let age = (now.as_second() - since.0.as_second()).max(0);
        let reason = status
            .and_then(|s| s.reason.clone())
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "none".to_string());
        let entry = oldest.entry(reason).or_insert(age);
        *entry = (*entry).max(age);
    }
    oldest.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        m.reconciled("node", ms, &Ok(()));
        m.reconciled("inventory", ms, &Err(Error::Config("x".into())));
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
    fn pending_oldest_by_reason() {
        use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let at = |s: &str| Time(s.parse().expect("ts"));
        let pod =
            |phase: Option<&str>, reason: Option<&str>, created: &str, bound: Option<&str>| {
                let mut p = Pod::default();
                p.metadata.creation_timestamp = Some(at(created));
                p.status = Some(PodStatus {
                    phase: phase.map(Into::into),
                    reason: reason.map(Into::into),
                    conditions: bound.map(|b| {
                        vec![PodCondition {
                            type_: "PodScheduled".into(),
                            status: "True".into(),
                            last_transition_time: Some(at(b)),
                            ..Default::default()
                        }]
                    }),
                    ..Default::default()
                });
                p
            };
        let mut deleting = pod(Some("Pending"), None, "2026-01-01T00:00:00Z", None);
        deleting.metadata.deletion_timestamp = Some(at("2026-01-01T00:00:01Z"));
        let pods = [
            // Waiting for capacity since binding 10 min ago (created earlier).
            pod(
                Some("Pending"),
                Some("NoWarmCapacity"),
                "2026-01-01T00:00:00Z",
                Some("2026-01-01T00:50:00Z"),
            ),
            pod(
                Some("Pending"),
                Some("NoWarmCapacity"),
                "2026-01-01T00:55:00Z",
                Some("2026-01-01T00:55:00Z"),
            ),
            // No status yet: Pending since created.
            pod(None, None, "2026-01-01T00:59:00Z", None),
            pod(Some("Running"), None, "2026-01-01T00:00:00Z", None),
            deleting,
        ];
        let now: jiff::Timestamp = "2026-01-01T01:00:00Z".parse().expect("ts");
        assert_eq!(
            pending_oldest(&pods, now),
            vec![
                ("NoWarmCapacity".to_string(), 600),
                ("none".to_string(), 60)
            ]
        );
        assert!(pending_oldest(&pods[3..], now).is_empty());
    }

    #[test]
    fn registries_are_independent() {
        let a = Metrics::new().unwrap();
        let b = Metrics::new().unwrap();
        a.lease_renewed(true);
        assert_eq!(b.lease_renewals.with_label_values(&["success"]).get(), 0);
    }
}
