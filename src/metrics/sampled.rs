//! Gauges computed at scrape time.

use prometheus::core::Collector;

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
        .map_err(|e| Error::Internal(format!("building a metric: {e}")))?;
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
