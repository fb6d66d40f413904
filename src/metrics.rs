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

/// Content type of the text exposition format served on `/metrics`.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

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
        .map_err(|e| Error::Config(format!("registering a metric: {e}")))?;
    Ok(collector)
}

fn metric_error(e: prometheus::Error) -> Error {
    Error::Config(format!("building a metric: {e}"))
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
            .map_err(|e| Error::Config(format!("registering the process collector: {e}")))?;

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

        Ok(Arc::new(Metrics {
            reconcile_runs,
            reconcile_failures,
            reconcile_duration,
            claim_duration,
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

    /// Everything in the text exposition format.
    pub fn encode(&self) -> Result<String> {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .map_err(|e| Error::Config(format!("encoding metrics: {e}")))?;
        String::from_utf8(out).map_err(|e| Error::Config(format!("encoding metrics: {e}")))
    }
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
    fn registries_are_independent() {
        let a = Metrics::new().unwrap();
        let b = Metrics::new().unwrap();
        a.lease_renewed(true);
        assert_eq!(b.lease_renewals.with_label_values(&["success"]).get(), 0);
    }
}
