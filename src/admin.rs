//! The plain-HTTP admin port (`--admin-addr`, default `:10261`): `/metrics`,
//! `/livez`, `/readyz`, apart from the kubelet API so scraping and probes
//! need no certificates or kubelet authorization. What `/livez` and
//! `/readyz` answer is [`Health`]'s.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::ListenAddr;
use crate::error::{Error, Result};
use crate::health::Health;
use crate::metrics::{Metrics, TEXT_CONTENT_TYPE};

#[derive(Clone)]
struct AdminState {
    health: Arc<Health>,
    metrics: Arc<Metrics>,
}

/// The admin routes: `/metrics`, `/livez`, `/readyz` (GET; anything else 404).
pub fn router(health: Arc<Health>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(AdminState { health, metrics })
}

async fn metrics_handler(State(s): State<AdminState>) -> Response {
    match s.metrics.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, TEXT_CONTENT_TYPE)], body).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "encoding /metrics failed");
            (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
    }
}

async fn livez(State(s): State<AdminState>) -> Response {
    match s.health.liveness() {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(stalled) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not alive: {}\n", stalled.join("; ")),
        )
            .into_response(),
    }
}

async fn readyz(State(s): State<AdminState>) -> Response {
    match s.health.readiness() {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(missing) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", missing.join("; ")),
        )
            .into_response(),
    }
}

/// Binds the admin port (`--admin-addr`).
pub async fn bind(addr: &ListenAddr) -> Result<TcpListener> {
    addr.bind().await.map_err(|e| {
        Error::io(
            format!(
                "bind the admin port --admin-addr (env VK_ADMIN_ADDR)={addr}; free the port or \
                 choose another"
            ),
            e,
        )
    })
}

/// Serve `router` (from [`router`]) on `listener` until `stop` is
/// cancelled; in-flight requests finish first.
pub async fn serve(listener: TcpListener, router: Router, stop: CancellationToken) -> Result<()> {
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(addr = %local, "admin server listening (/metrics, /livez, /readyz)");
    axum::serve(listener, router)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
        .map_err(|e| Error::io(format!("admin server on {local}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use std::time::Duration;
    use tower::ServiceExt;

    async fn get_path(router: &Router, path: &str) -> (StatusCode, String, Option<String>) {
        let resp = router
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let ct = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string());
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap(), ct)
    }

    #[tokio::test]
    async fn readyz_needs_watch_and_lease() {
        let health = Health::new();
        let r = router(health.clone(), Metrics::new().unwrap());
        let (code, body, _) = get_path(&r, "/readyz").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("Pod watch has not synced"), "{body}");
        assert!(body.contains("Lease renewal"), "{body}");

        health.mark_pod_watch_synced();
        let (code, body, _) = get_path(&r, "/readyz").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!body.contains("Pod watch"), "{body}");
        assert!(body.contains("Lease renewal"), "{body}");

        health.set_lease_ok(true);
        assert_eq!(get_path(&r, "/readyz").await.0, StatusCode::OK);
        health.set_lease_ok(false);
        assert_eq!(
            get_path(&r, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[tokio::test]
    async fn livez_fails_when_a_loop_stalls() {
        let health = Health::new();
        let r = router(health.clone(), Metrics::new().unwrap());
        assert_eq!(get_path(&r, "/livez").await.0, StatusCode::OK);
        let hb = health.register_loop("lease", Duration::from_millis(50));
        hb.beat();
        assert_eq!(get_path(&r, "/livez").await.0, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(120)).await;
        let (code, body, _) = get_path(&r, "/livez").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("lease loop silent"), "{body}");
        hb.beat();
        assert_eq!(get_path(&r, "/livez").await.0, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(120)).await;
        health.deregister_loop("lease");
        assert_eq!(get_path(&r, "/livez").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn livez_fails_while_work_overruns_its_bound() {
        let health = Health::new();
        let r = router(health.clone(), Metrics::new().unwrap());
        let quick = health.working("Pod reconcile", Duration::from_secs(60));
        let hung = health.working("Pod reconcile", Duration::from_millis(30));
        assert_eq!(get_path(&r, "/livez").await.0, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(80)).await;
        let (code, body, _) = get_path(&r, "/livez").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("1 Pod reconcile running for"), "{body}");
        drop(hung);
        assert_eq!(get_path(&r, "/livez").await.0, StatusCode::OK);
        drop(quick);
        assert_eq!(get_path(&r, "/livez").await.0, StatusCode::OK);
    }

    /// A Pod watch whose reply went silent after one event (no event, no
    /// bookmark) fails `/livez` once it has been silent longer than the
    /// server's watch timeout; it passed for ever before.
    #[tokio::test(start_paused = true)]
    async fn livez_fails_when_the_pod_watch_makes_no_progress() {
        use crate::kube_client::progress::tests::{get, silent_after_one_event};
        use crate::kube_client::progress::{ProgressLayer, STALL_LIMIT, WatchProgress};
        use http_body_util::BodyExt;
        use tower::{Layer, Service};

        let health = Health::new();
        let watches = WatchProgress::new();
        watches.report_to(&health, STALL_LIMIT);
        let r = router(health.clone(), Metrics::new().unwrap());
        let mut client = ProgressLayer::new(watches).layer(silent_after_one_event());
        let watch = client
            .call(get(
                "/api/v1/pods?fieldSelector=spec.nodeName%3Dn&watch=true",
            ))
            .await
            .expect("watch");
        let mut body = watch.into_body();
        body.frame().await.expect("one event").expect("ok");
        tokio::time::advance(Duration::from_secs(200)).await;
        assert_eq!(get_path(&r, "/livez").await.0, StatusCode::OK);
        tokio::time::advance(STALL_LIMIT).await;
        let (code, text, _) = get_path(&r, "/livez").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(text.contains("Pod watch made no progress"), "{text}");
        // Ended (the watcher gives up on it and watches again): live.
        drop(body);
        assert_eq!(get_path(&r, "/livez").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn metrics_endpoint_serves_text_format() {
        let metrics = Metrics::new().unwrap();
        metrics.lease_renewed(true);
        let r = router(Health::new(), metrics);
        let (code, body, ct) = get_path(&r, "/metrics").await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(ct.as_deref(), Some(TEXT_CONTENT_TYPE));
        assert!(body.contains("vk_sandbox_lease_renewals_total{result=\"success\"} 1"));
        assert_eq!(get_path(&r, "/nope").await.0, StatusCode::NOT_FOUND);
    }

    /// `promtool check metrics` (Debian package `prometheus`) accepts the
    /// exposition; skipped where promtool is not installed.
    #[test]
    fn promtool_accepts_the_exposition() {
        use std::io::Write;
        let metrics = Metrics::new().unwrap();
        metrics.lease_renewed(true);
        metrics.lease_renewed(false);
        metrics.kubelet_request("/pods", "200");
        metrics.kubelet_refused("forbidden");
        metrics.cert_reloaded(true);
        let text = metrics.encode().unwrap();
        let child = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn();
        let Ok(mut child) = child else {
            eprintln!("SKIPPED: promtool is not installed");
            return;
        };
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "promtool: {report}\n{text}");
        assert!(report.trim().is_empty(), "promtool warnings: {report}");
    }

    #[tokio::test]
    async fn serves_over_tcp_and_shuts_down() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let health = Health::new();
        let task = tokio::spawn(serve(
            listener,
            router(health, Metrics::new().unwrap()),
            stop.clone(),
        ));
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut buf = String::new();
        stream.read_to_string(&mut buf).await.unwrap();
        assert!(buf.starts_with("HTTP/1.1 200"), "{buf}");
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("shutdown in time")
            .unwrap()
            .unwrap();
    }
}
