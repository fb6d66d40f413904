//! How a metric is built and registered: the bucket sets and the
//! constructors every field of [`super::Metrics`] goes through.

use prometheus::core::Collector;
use prometheus::{IntCounterVec, Opts, Registry};

use crate::error::{Error, Result};

/// Buckets for the sub-millisecond paths (sandboxd calls, claims-store
/// fsyncs, the provider's share of a claim): fine around 1–2 ms, where
/// sandboxd (0.2–0.7 ms) and a local fsync land, then up to 10 s.
pub(super) const FINE_BUCKETS: [f64; 19] = [
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Buckets for apiserver round trips: a few ms idle, hundreds under a
/// burst on a busy control plane; fine enough between 50 ms and 1 s to
/// compare one write with a whole claim or resume (make bench).
pub(super) const API_BUCKETS: [f64; 19] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5, 10.0,
];

/// Register `collector` in `registry` and hand it back.
pub fn register<C: Collector + Clone + 'static>(registry: &Registry, collector: C) -> Result<C> {
    registry
        .register(Box::new(collector.clone()))
        .map_err(|e| Error::Internal(format!("registering a metric: {e}")))?;
    Ok(collector)
}

pub(super) fn metric_error(e: prometheus::Error) -> Error {
    Error::Internal(format!("building a metric: {e}"))
}

pub(super) fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec> {
    let vec = IntCounterVec::new(Opts::new(name, help), labels).map_err(metric_error)?;
    register(registry, vec)
}

pub(super) fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
) -> Result<prometheus::Histogram> {
    let h = prometheus::Histogram::with_opts(
        prometheus::HistogramOpts::new(name, help).buckets(buckets.to_vec()),
    )
    .map_err(metric_error)?;
    register(registry, h)
}

pub(super) fn histogram_vec(
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
