//! Prometheus metrics: the `prometheus` crate with an explicit registry (not
//! the global default, so tests build their own) and its process collector.
//!
//! One [`Metrics`] is built in `main` and shared as `Arc<Metrics>`. Every
//! metric is named `vk_sandbox_…`, counters end in `_total`, units are in the
//! name. To add a metric: add a field, build it in [`Metrics::with_registry`]
//! with [`register`], and document it in the field's comment.

use std::sync::Arc;

use prometheus::{Encoder, Gauge, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

use crate::error::{Error, Result};

pub use build::register;
use build::{API_BUCKETS, FINE_BUCKETS, counter_vec, histogram, histogram_vec, metric_error};

/// Times one reconcile: dropping it records the duration.
pub type Timer = prometheus::HistogramTimer;

/// The controllers whose reconciles are counted (the `controller` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    Pods,
    Node,
    Inventory,
}

impl Controller {
    pub fn label(self) -> &'static str {
        match self {
            Controller::Pods => "pods",
            Controller::Node => "node",
            Controller::Inventory => "inventory",
        }
    }
}

/// Content type of the text exposition format served on `/metrics`.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The metrics of one process.
pub struct Metrics {
    registry: Registry,
    /// `vk_sandbox_kubelet_requests_total{route,code}`: kubelet API requests
    /// by matched route template and HTTP status code.
    kubelet_requests: IntCounterVec,
    /// `vk_sandbox_kubelet_auth_failures_total{reason}`: refused kubelet API
    /// requests; reason is one of `unauthenticated`, `authentication_error`,
    /// `forbidden`, `authorization_error`.
    kubelet_auth_failures: IntCounterVec,
    /// `vk_sandbox_kubelet_cert_reloads_total{result}`: serving certificate
    /// reloads (`success` / `error`).
    kubelet_cert_reloads: IntCounterVec,
    /// `vk_sandbox_lease_renewals_total{result}`: node Lease renewals
    /// (`success` / `error`).
    lease_renewals: IntCounterVec,
    /// `vk_sandbox_lease_last_success_timestamp_seconds`: Unix time of the
    /// last successful Lease renewal.
    lease_last_success: Gauge,
    /// `vk_sandbox_reconcile_runs_total{controller}`.
    reconcile_runs: IntCounterVec,
    /// `vk_sandbox_reconcile_failures_total{controller,error}`: failures by
    /// error kind (`Error::metric_label`).
    reconcile_failures: IntCounterVec,
    /// `vk_sandbox_reconcile_duration_seconds{controller}`.
    reconcile_duration: prometheus::HistogramVec,
    /// `vk_sandbox_claim_duration_seconds`: from the reconcile that first
    /// sees a Pod to its Running status written (claims and adoptions).
    claim_duration: prometheus::Histogram,
    /// `vk_sandbox_claim_provider_seconds`: the same start to the moment
    /// the Running status write is sent — vk-sandbox's own share (sandboxd
    /// claim and claims-store commit included, the apiserver's answer not).
    claim_provider: prometheus::Histogram,
    /// `vk_sandbox_claim_own_seconds`: the part of `claim_provider` that is
    /// neither the sandboxd claim call nor the claims-store commit (fresh
    /// claims only): vk-sandbox's own code and its queueing for a CPU.
    claim_own: prometheus::Histogram,
    /// `vk_sandbox_resume_own_seconds`: the same for a Pod whose claim's VM
    /// was woken (its Sandbox resumed), less the wake call and the commit.
    resume_own: prometheus::Histogram,
    /// `vk_sandbox_sandboxd_requests_total{endpoint,status}`: sandboxd calls
    /// by endpoint (`claim`, `release`, `list`, `info`) and outcome: `ok`,
    /// the HTTP status of a refusal, or the error kind (`timeout`,
    /// `transport`, `decode`, `capacity_miss`, …).
    sandboxd_requests: IntCounterVec,
    /// `vk_sandbox_sandboxd_request_duration_seconds{endpoint}`.
    sandboxd_request_duration: prometheus::HistogramVec,
    /// `vk_sandbox_claims_store_write_duration_seconds{result}`: one batch of
    /// the claims store (write + fsync of file and directory).
    claims_store_write_duration: prometheus::HistogramVec,
    /// `vk_sandbox_inventory_applies_total{result}`: NodeInventory applies
    /// (`success` / `error`).
    inventory_applies: IntCounterVec,
    /// `vk_sandbox_inventory_skips_total{reason}`: ticks that applied
    /// nothing: `unchanged`, `list_failed`, `info_failed`.
    inventory_skips: IntCounterVec,
    /// `vk_sandbox_inventory_stale{group}`: 1 while a NodeInventory named
    /// after this node exists in a known group vk-sandbox does not publish
    /// in (nobody updates it), 0 once checked and absent.
    inventory_stale: IntGaugeVec,
    /// `vk_sandbox_node_sandboxd_taint{taint}`: 1 while the Node carries
    /// that sandboxd taint (`sandbox.cocoonstack.io/…`, src/fleet), 0 once
    /// written without it.
    node_sandboxd_taint: IntGaugeVec,
    /// `vk_sandbox_orphan_audit_sandboxes{verdict}`: sandboxes per verdict of
    /// the last successful orphan scan (`orphan`, `external`, `stray`,
    /// `stale`).
    orphan_audit: IntGaugeVec,
    /// `vk_sandbox_orphan_audit_scans_total{result}`: `success` / `skipped`.
    orphan_scans: IntCounterVec,
    /// `vk_sandbox_pod_status_writes_total{result}`: `pods/status` writes
    /// sent: `written`, `conflict` (the Pod changed or was replaced since it
    /// was read; re-read, never overwritten), `gone`, `error`. Writes found
    /// unnecessary (the Pod already shows the status) are not sent or counted.
    pod_status_writes: IntCounterVec,
    /// `vk_sandbox_pod_status_write_duration_seconds{result}`: each sent
    /// write's round trip as this process sees it (queueing in its client
    /// included), by the same results.
    pod_status_write_duration: prometheus::HistogramVec,
    /// `vk_sandbox_claim_renewals_total{result}`: sandboxd lease renewals
    /// (`renewed`, `failed`, `archived`, `gone`, `no_credential`).
    claim_renewals: IntCounterVec,
    /// `vk_sandbox_claim_transitions_total{action,result}`: hibernates and
    /// wakes (`hibernate`/`wake`; `ok`, `refused`, `failed`, `gone`,
    /// `no_credential`).
    claim_transitions: IntCounterVec,
    /// `vk_sandbox_claim_observed_total{state}`: records corrected to what
    /// sandboxd's listing shows (`running`, `hibernated`, `archived`): a VM
    /// woken by a relay, hibernated or archived by sandboxd's idle tiers.
    claim_observed: IntCounterVec,
    /// `vk_sandbox_pods_handed_back_total{how}` (src/pods/handback.rs).
    pods_handed_back: IntCounterVec,
    /// `vk_sandbox_claim_lease_remaining_min_seconds`: time left on the
    /// nearest lease vk-sandbox renews (none held: not set).
    claim_lease_remaining_min: Gauge,
    /// The kubelet API's streaming sessions, read at scrape time
    /// ([`streaming`]): `vk_sandbox_streaming_refusals_total{reason}`,
    /// `vk_sandbox_streaming_closes_total{reason}`,
    /// `vk_sandbox_streaming_sessions`, `vk_sandbox_streaming_spdy_streams`,
    /// `vk_sandbox_streaming_queued_bytes`.
    streaming: Arc<crate::stream_stats::StreamStats>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
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
                process::Process::for_self().map_err(metric_error)?,
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
        register(&registry, build_info)?
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
        let claim_duration = histogram(
            &registry,
            "vk_sandbox_claim_duration_seconds",
            "From a sandbox Pod's reconcile to its Running status written (claim or adoption).",
            &API_BUCKETS,
        )?;

        let claim_provider = histogram(
            &registry,
            "vk_sandbox_claim_provider_seconds",
            "From a sandbox Pod's reconcile to its Running status write sent: vk-sandbox's own cost (sandboxd claim and claims-store commit included, the apiserver's answer not).",
            &FINE_BUCKETS,
        )?;

        let claim_own = histogram(
            &registry,
            "vk_sandbox_claim_own_seconds",
            "A fresh claim's path from reconcile start to its Running status write sent, minus the sandboxd claim call and the claims-store commit: vk-sandbox's own share.",
            &FINE_BUCKETS,
        )?;

        let resume_own = histogram(
            &registry,
            "vk_sandbox_resume_own_seconds",
            "A resume's path (its claim's VM woken) from reconcile start to its Running status write sent, minus the sandboxd wake call and the claims-store commit: vk-sandbox's own share.",
            &FINE_BUCKETS,
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
        let inventory_stale = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "vk_sandbox_inventory_stale",
                    "1 while a NodeInventory named after this node exists in a group vk-sandbox \
                     does not publish in (left over, never updated), by group.",
                ),
                &["group"],
            )
            .map_err(metric_error)?,
        )?;
        let node_sandboxd_taint = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "vk_sandbox_node_sandboxd_taint",
                    "1 while the Node carries this sandboxd taint (sandbox.cocoonstack.io/unreachable, \
                     draining, at-capacity: NoSchedule; no-warm-capacity: PreferNoSchedule), by taint.",
                ),
                &["taint"],
            )
            .map_err(metric_error)?,
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
        let pod_status_write_duration = histogram_vec(
            &registry,
            "vk_sandbox_pod_status_write_duration_seconds",
            "Pod status writes: from sent to answered, by result (written, conflict, gone, error).",
            &["result"],
            API_BUCKETS.to_vec(),
        )?;

        let claim_renewals = counter_vec(
            &registry,
            "vk_sandbox_claim_renewals_total",
            "sandboxd lease renewals of claims, by result (renewed, failed, archived, gone, no_credential).",
            &["result"],
        )?;
        let claim_transitions = counter_vec(
            &registry,
            "vk_sandbox_claim_transitions_total",
            "Hibernates and wakes of claims' VMs, by action and result (ok, refused, failed, gone, no_credential).",
            &["action", "result"],
        )?;
        let claim_observed = counter_vec(
            &registry,
            "vk_sandbox_claim_observed_total",
            "Claims whose recorded VM state was corrected to what sandboxd lists, by the state seen (running, hibernated, archived).",
            &["state"],
        )?;
        let pods_handed_back = counter_vec(
            &registry,
            "vk_sandbox_pods_handed_back_total",
            "Pods handed back after waiting past --hand-back-after for capacity, by how (deleted for their Sandbox to re-create, failed for their controller to replace).",
            &["how"],
        )?;
        let claim_lease_remaining_min = register(
            &registry,
            Gauge::with_opts(Opts::new(
                "vk_sandbox_claim_lease_remaining_min_seconds",
                "Seconds left on the nearest sandboxd lease vk-sandbox renews (negative: already past).",
            ))
            .map_err(metric_error)?,
        )?;

        let streaming = Arc::new(crate::stream_stats::StreamStats::default());
        registry
            .register(Box::new(streaming::Streaming::new(Arc::clone(&streaming))?))
            .map_err(|e| Error::Internal(format!("registering a metric: {e}")))?;

        Ok(Arc::new(Metrics {
            streaming,
            claim_renewals,
            claim_transitions,
            claim_observed,
            pods_handed_back,
            claim_lease_remaining_min,
            pod_status_writes,
            pod_status_write_duration,
            sandboxd_requests,
            sandboxd_request_duration,
            claims_store_write_duration,
            inventory_applies,
            inventory_skips,
            inventory_stale,
            node_sandboxd_taint,
            orphan_audit,
            orphan_scans,
            reconcile_runs,
            reconcile_failures,
            reconcile_duration,
            claim_duration,
            claim_provider,
            claim_own,
            resume_own,
            registry,
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

    /// What the streaming sessions count into (`vk_sandbox_streaming_*`).
    pub fn streaming(&self) -> Arc<crate::stream_stats::StreamStats> {
        Arc::clone(&self.streaming)
    }

    /// The current value of the series `name` whose labels include
    /// `labels`: a counter's or gauge's value, a histogram's sample count;
    /// `None` when no such series was recorded. For tests and diagnostics;
    /// components record through the typed methods.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        use prometheus::proto::MetricType;
        let family = self
            .registry
            .gather()
            .into_iter()
            .find(|f| f.name() == name)?;
        let kind = family.get_field_type();
        family
            .get_metric()
            .iter()
            .find(|m| {
                labels.iter().all(|(k, v)| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == *k && l.value() == *v)
                })
            })
            .map(|m| match kind {
                MetricType::COUNTER => m.get_counter().get_value(),
                MetricType::GAUGE => m.get_gauge().get_value(),
                MetricType::HISTOGRAM => m.get_histogram().get_sample_count() as f64,
                _ => f64::NAN,
            })
    }

    /// Everything in the text exposition format.
    /// Register a [`SampledGauge`].
    pub fn register_sampled(&self, gauge: SampledGauge) -> Result<()> {
        self.registry
            .register(Box::new(gauge))
            .map_err(|e| Error::Internal(format!("registering a metric: {e}")))
    }

    pub fn encode(&self) -> Result<String> {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .map_err(|e| Error::Internal(format!("encoding metrics: {e}")))?;
        String::from_utf8(out).map_err(|e| Error::Internal(format!("encoding metrics: {e}")))
    }
}

mod build;
#[cfg(target_os = "linux")]
mod process;
mod record;
mod sampled;
pub mod streaming;
#[cfg(test)]
mod tests;

pub use sampled::SampledGauge;
