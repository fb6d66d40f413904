//! Gauges computed at scrape time.

use prometheus::core::Collector;

use super::{Metrics, metric_error};
use crate::error::{Error, Result};

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
    pods: impl IntoIterator<Item = &'a crate::pods::pod::Pod>,
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
