//! The serving side's flag groups (the placement webhook, exec and
//! port-forward sessions), checked apart from the main walk.

use super::problems::{Problems, non_empty_path};
use crate::config::cli::RunArgs;
use crate::config::settings::{StreamingConfig, WebhookConfig};
use crate::config::values::{ListenAddr, nanos_to_duration, parse_go_duration};

/// The webhook flags, their problems recorded in `p`; `None` when it is
/// not served (or a problem was recorded).
pub(super) fn webhook(args: &RunArgs, p: &mut Problems) -> Option<WebhookConfig> {
    let a = &args.webhook;
    if a.webhook_addr.trim().is_empty() {
        return None;
    }
    let addr = ListenAddr::parse(&a.webhook_addr)
        .map_err(|why| {
            p.push(
                "webhook-addr",
                Some("VK_WEBHOOK_ADDR"),
                &a.webhook_addr,
                &format!("parse --webhook-addr: {why}"),
                "give host:port with a port in 1-65535, e.g. :10262, or leave it empty to serve no webhook",
            )
        })
        .ok();
    let cert = non_empty_path(&a.webhook_tls_cert);
    let key = non_empty_path(&a.webhook_tls_key);
    for (flag, env, value) in [
        ("webhook-tls-cert", "VK_WEBHOOK_TLS_CERT", &cert),
        ("webhook-tls-key", "VK_WEBHOOK_TLS_KEY", &key),
    ] {
        if value.is_none() {
            p.push(
                flag,
                Some(env),
                "",
                "the webhook is served (--webhook-addr) but its certificate pair is not given",
                "give the PEM files of a pair whose CA the webhook configuration's caBundle holds",
            );
        }
    }
    Some(WebhookConfig {
        addr: addr?,
        cert: cert?,
        key: key?,
        tolerations: a.webhook_tolerations,
    })
}

/// The streaming flags, their problems recorded in `p`.
pub(super) fn streaming(args: &RunArgs, p: &mut Problems) -> StreamingConfig {
    let a = &args.streaming;
    let idle_timeout = match parse_go_duration(&a.streaming_idle_timeout) {
        Ok(n) if n > 0 => Some(nanos_to_duration(n)),
        Ok(0) => None,
        Ok(_) => {
            p.push(
                "streaming-idle-timeout",
                Some("VK_STREAMING_IDLE_TIMEOUT"),
                &a.streaming_idle_timeout,
                "must not be negative",
                "give e.g. 4h (the kubelet's default), or 0 to never close an idle session",
            );
            None
        }
        Err(why) => {
            p.push(
                "streaming-idle-timeout",
                Some("VK_STREAMING_IDLE_TIMEOUT"),
                &a.streaming_idle_timeout,
                &format!("not a Go duration: {why}"),
                "give e.g. 4h (the kubelet's default), or 0 to never close an idle session",
            );
            None
        }
    };
    let min_streams = crate::config::defaults::MIN_STREAMS_PER_SESSION;
    for (flag, env, value, least, why) in [
        (
            "max-streaming-sessions",
            "VK_MAX_STREAMING_SESSIONS",
            a.max_streaming_sessions,
            1,
            "0 would refuse every exec and port-forward",
        ),
        (
            "max-streaming-sessions-per-pod",
            "VK_MAX_STREAMING_SESSIONS_PER_POD",
            a.max_streaming_sessions_per_pod,
            1,
            "0 would refuse every exec and port-forward",
        ),
        (
            "max-streams-per-session",
            "VK_MAX_STREAMS_PER_SESSION",
            a.max_streams_per_session,
            min_streams,
            "an exec over SPDY opens up to 5 streams",
        ),
    ] {
        if value < least {
            p.push(
                flag,
                Some(env),
                &value.to_string(),
                &format!("must be at least {least} ({why})"),
                &format!("give e.g. --{flag}={}", least.max(16)),
            );
        }
    }
    StreamingConfig {
        idle_timeout,
        max_sessions: a.max_streaming_sessions,
        max_sessions_per_pod: a.max_streaming_sessions_per_pod,
        max_streams_per_session: a.max_streams_per_session,
    }
}
