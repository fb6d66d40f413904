//! `vk_sandbox_streaming_*`: the kubelet API's exec, attach and
//! port-forward sessions, read at scrape time from the atomics the sessions
//! update ([`StreamStats`]): no loop keeps them, none can go stale.

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use crate::error::{Error, Result};
use crate::stream_stats::{Close, Refusal, StreamStats};

pub const REFUSALS: &str = "vk_sandbox_streaming_refusals_total";
pub const CLOSES: &str = "vk_sandbox_streaming_closes_total";
pub const SESSIONS: &str = "vk_sandbox_streaming_sessions";
pub const STREAMS: &str = "vk_sandbox_streaming_spdy_streams";
pub const QUEUED: &str = "vk_sandbox_streaming_queued_bytes";

/// The collector of one process's [`StreamStats`].
pub struct Streaming {
    stats: Arc<StreamStats>,
    descs: Vec<Desc>,
}

fn desc(name: &str, help: &str, labels: &[&str]) -> Result<Desc> {
    Desc::new(
        name.to_string(),
        help.to_string(),
        labels.iter().map(|l| l.to_string()).collect(),
        Default::default(),
    )
    .map_err(|e| Error::Internal(format!("building a metric: {e}")))
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_string());
    f.set_help(help.to_string());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

fn gauge(value: i64) -> Metric {
    let mut g = Gauge::default();
    g.set_value(value as f64);
    let mut m = Metric::default();
    m.set_gauge(g);
    m
}

fn counter(label: &str, value: &str, n: u64) -> Metric {
    let mut c = Counter::default();
    c.set_value(n as f64);
    let mut l = LabelPair::default();
    l.set_name(label.to_string());
    l.set_value(value.to_string());
    let mut m = Metric::default();
    m.set_label(vec![l]);
    m.set_counter(c);
    m
}

const REFUSALS_HELP: &str = "Streaming requests and SPDY streams refused by a limit, by reason: node_sessions (--max-streaming-sessions), pod_sessions (--max-streaming-sessions-per-pod), session_streams (--max-streams-per-session).";
const CLOSES_HELP: &str = "Streaming sessions ended by vk-sandbox, by reason: idle_timeout (--streaming-idle-timeout), hang_up (the client's connection closed or failed while the session was busy), shutdown (the kubelet API stopped).";
const SESSIONS_HELP: &str = "exec, attach and port-forward sessions open.";
const STREAMS_HELP: &str = "SPDY streams open in streaming sessions.";
const QUEUED_HELP: &str =
    "Bytes of clients' data held by SPDY sessions: queued, or handed on and not yet written.";

impl Streaming {
    pub fn new(stats: Arc<StreamStats>) -> Result<Streaming> {
        Ok(Streaming {
            stats,
            descs: vec![
                desc(REFUSALS, REFUSALS_HELP, &["reason"])?,
                desc(CLOSES, CLOSES_HELP, &["reason"])?,
                desc(SESSIONS, SESSIONS_HELP, &[])?,
                desc(STREAMS, STREAMS_HELP, &[])?,
                desc(QUEUED, QUEUED_HELP, &[])?,
            ],
        })
    }
}

impl Collector for Streaming {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let s = &self.stats;
        let refusals = Refusal::ALL
            .iter()
            .map(|r| counter("reason", r.label(), s.refusals(*r)))
            .collect();
        let closes = Close::ALL
            .iter()
            .map(|c| counter("reason", c.label(), s.closes(*c)))
            .collect();
        vec![
            family(REFUSALS, REFUSALS_HELP, MetricType::COUNTER, refusals),
            family(CLOSES, CLOSES_HELP, MetricType::COUNTER, closes),
            family(
                SESSIONS,
                SESSIONS_HELP,
                MetricType::GAUGE,
                vec![gauge(s.sessions())],
            ),
            family(
                STREAMS,
                STREAMS_HELP,
                MetricType::GAUGE,
                vec![gauge(s.streams())],
            ),
            family(
                QUEUED,
                QUEUED_HELP,
                MetricType::GAUGE,
                vec![gauge(s.queued_bytes())],
            ),
        ]
    }
}
