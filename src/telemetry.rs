//! Logging: `RUST_LOG`-style filters (default `info`), text or JSON lines on
//! stderr (`--log-format`).
//!
//! JSON: one object per line with the fields log shippers (Fluent Bit,
//! Vector, Promtail, the Elastic agent) pick up without parsing rules:
//! `timestamp` (RFC 3339, UTC), `level` (`ERROR`…`TRACE`), `target` (the
//! module), `message`, the event's own fields beside them (e.g. `error`,
//! `pod`), `span` (the innermost span: its `name` and fields) and `spans`
//! (every enclosing span, outermost first).

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::LogFormat;

/// The subscriber for `format`, writing to `writer`.
fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    ansi: bool,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(ansi).with_target(false).finish()),
        LogFormat::Json => Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(true)
                .finish(),
        ),
    }
}

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only on a terminal: journald and log files get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // Also routes the `log` records of dependencies (rustls) into it. A
    // second init (tests) is harmless: keep the first subscriber.
    let _ = subscriber(format, filter, ansi, std::io::stderr).try_init();
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("buffer").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn capture(format: LogFormat) -> String {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let sub = subscriber(format, EnvFilter::new("debug"), false, move || {
            writer.clone()
        });
        tracing::subscriber::with_default(sub, || {
            let outer = tracing::info_span!("reconcile", node = "n1", pod = "ns/p");
            let _o = outer.enter();
            let inner = tracing::info_span!("claim", template = "base:24.04");
            let _i = inner.enter();
            tracing::warn!(error = "refused", attempt = 2, "claim failed");
            tracing::trace!("filtered out");
        });
        String::from_utf8(buffer.0.lock().expect("buffer").clone()).expect("utf8")
    }

    #[test]
    fn json_lines_carry_the_fields_log_shippers_expect() {
        let out = capture(LogFormat::Json);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).expect("one JSON object");
        let ts: jiff::Timestamp = v["timestamp"]
            .as_str()
            .expect("timestamp")
            .parse()
            .expect("RFC 3339");
        assert!(ts > jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["target"], "vk_sandbox::telemetry::tests");
        assert_eq!(v["message"], "claim failed", "message at the top level");
        assert_eq!(v["error"], "refused");
        assert_eq!(v["attempt"], 2);
        assert_eq!(v["span"]["name"], "claim");
        assert_eq!(v["span"]["template"], "base:24.04");
        assert_eq!(v["spans"][0]["name"], "reconcile");
        assert_eq!(v["spans"][0]["pod"], "ns/p");
        assert_eq!(v["spans"][1]["name"], "claim");
    }

    #[test]
    fn text_lines_are_plain() {
        let out = capture(LogFormat::Text);
        assert_eq!(out.lines().count(), 1, "{out}");
        assert!(out.contains(" WARN "), "{out}");
        assert!(
            out.contains("reconcile{node=\"n1\" pod=\"ns/p\"}:claim{template=\"base:24.04\"}"),
            "{out}"
        );
        assert!(
            out.contains("claim failed error=\"refused\" attempt=2"),
            "{out}"
        );
        assert!(!out.contains('\u{1b}'), "no colour codes: {out}");
        assert!(serde_json::from_str::<serde_json::Value>(out.trim()).is_err());
    }
}
