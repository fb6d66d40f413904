//! The plain-HTTP admin port (`--admin-addr`, default `:10261`): `/metrics`,
//! `/livez`, `/readyz`, apart from the kubelet API so scraping and probes
//! need no certificates or kubelet authorization.
//!
//! [`Health`] is the shared liveness/readiness state. The Pod watch calls
//! [`Health::set_pod_watch_synced`], the Lease loop
//! [`Health::set_lease_ok`]; every loop that must keep turning (Lease
//! renewal, Node status, the Pod controller's side loops, the inventory
//! publisher, the orphan scan) registers a heartbeat with
//! [`Health::register_loop`] and calls [`LoopHeartbeat::beat`] each turn,
//! and every Pod reconcile holds a [`Working`] guard while it runs, so
//! `/livez` fails when a loop has stalled or a reconcile hangs past its
//! bound.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use crate::error::{Error, Result};
use crate::metrics::{Metrics, TEXT_CONTENT_TYPE};

/// Liveness and readiness shared by every loop and the admin server.
#[derive(Debug, Default)]
pub struct Health {
    pod_watch_synced: AtomicBool,
    lease_ok: AtomicBool,
    loops: Mutex<BTreeMap<&'static str, LoopState>>,
    /// Work in progress: id → (name, started, bound).
    working: Mutex<BTreeMap<u64, (&'static str, Instant, Duration)>>,
    next_work: std::sync::atomic::AtomicU64,
}

/// How long past its period a loop may stay silent before `/livez` fails:
/// longer than any one turn can take with every call's deadline spent.
pub const STALL_MARGIN: Duration = Duration::from_secs(300);

/// A unit of work in progress (one Pod reconcile); dropping it ends it.
#[derive(Debug)]
pub struct Working {
    health: Arc<Health>,
    id: u64,
}

impl Drop for Working {
    fn drop(&mut self) {
        if let Ok(mut w) = self.health.working.lock() {
            w.remove(&self.id);
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct LoopState {
    last: Instant,
    max_silence: Duration,
}

/// A loop's handle for reporting that it is still turning.
#[derive(Debug, Clone)]
pub struct LoopHeartbeat {
    health: Arc<Health>,
    name: &'static str,
}

impl LoopHeartbeat {
    /// Record that the loop is alive now.
    pub fn beat(&self) {
        if let Ok(mut loops) = self.health.loops.lock()
            && let Some(state) = loops.get_mut(self.name)
        {
            state.last = Instant::now();
        }
    }
}

impl Health {
    pub fn new() -> Arc<Health> {
        Arc::new(Health::default())
    }

    /// The Pod watch has listed once (its cache is ready).
    pub fn set_pod_watch_synced(&self, synced: bool) {
        self.pod_watch_synced.store(synced, Ordering::Relaxed);
    }

    /// The last Lease renewal succeeded (true) or failed (false).
    pub fn set_lease_ok(&self, ok: bool) {
        self.lease_ok.store(ok, Ordering::Relaxed);
    }

    pub fn pod_watch_synced(&self) -> bool {
        self.pod_watch_synced.load(Ordering::Relaxed)
    }

    pub fn lease_ok(&self) -> bool {
        self.lease_ok.load(Ordering::Relaxed)
    }

    /// Register a loop that promises to call [`LoopHeartbeat::beat`] at
    /// least every `max_silence`; `/livez` fails once it has been silent
    /// longer. Registering a name again replaces the previous entry.
    pub fn register_loop(
        self: &Arc<Self>,
        name: &'static str,
        max_silence: Duration,
    ) -> LoopHeartbeat {
        if let Ok(mut loops) = self.loops.lock() {
            loops.insert(
                name,
                LoopState {
                    last: Instant::now(),
                    max_silence,
                },
            );
        }
        LoopHeartbeat {
            health: Arc::clone(self),
            name,
        }
    }

    /// Marks work in progress until the guard is dropped; `/livez` fails
    /// while any has run longer than its `bound`.
    pub fn working(self: &Arc<Self>, name: &'static str, bound: Duration) -> Working {
        let id = self.next_work.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut w) = self.working.lock() {
            w.insert(id, (name, Instant::now(), bound));
        }
        Working {
            health: Arc::clone(self),
            id,
        }
    }

    /// Stop watching a loop (it ended on purpose).
    pub fn deregister_loop(&self, name: &str) {
        if let Ok(mut loops) = self.loops.lock() {
            loops.remove(name);
        }
    }

    /// `Ok` when every registered loop beat recently, else the stalled ones.
    pub fn liveness(&self) -> std::result::Result<(), Vec<String>> {
        let now = Instant::now();
        let Ok(loops) = self.loops.lock() else {
            return Err(vec!["health state lock poisoned".into()]);
        };
        let mut stalled: Vec<String> = loops
            .iter()
            .filter(|(_, s)| now.duration_since(s.last) > s.max_silence)
            .map(|(name, s)| {
                format!(
                    "{name} loop silent for {}s (limit {}s)",
                    now.duration_since(s.last).as_secs(),
                    s.max_silence.as_secs()
                )
            })
            .collect();
        drop(loops);
        if let Ok(working) = self.working.lock() {
            // One line per kind of work, for the oldest one.
            let mut oldest: BTreeMap<&str, (Duration, Duration, usize)> = BTreeMap::new();
            for (name, started, bound) in working.values() {
                let age = now.duration_since(*started);
                if age > *bound {
                    let e = oldest.entry(name).or_insert((age, *bound, 0));
                    e.0 = e.0.max(age);
                    e.2 += 1;
                }
            }
            for (name, (age, bound, n)) in oldest {
                stalled.push(format!(
                    "{n} {name} running for {}s (limit {}s)",
                    age.as_secs(),
                    bound.as_secs()
                ));
            }
        }
        if stalled.is_empty() {
            Ok(())
        } else {
            Err(stalled)
        }
    }

    /// `Ok` once the Pod watch synced and the last Lease renewal succeeded,
    /// else what is missing.
    pub fn readiness(&self) -> std::result::Result<(), Vec<&'static str>> {
        let mut missing = Vec::new();
        if !self.pod_watch_synced() {
            missing.push("the Pod watch has not synced yet");
        }
        if !self.lease_ok() {
            missing.push("the last node Lease renewal has not succeeded");
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing)
        }
    }
}

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

/// Serve `router` (from [`router`]) on `listener` until `shutdown`
/// completes; in-flight requests finish first.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(addr = %local, "admin server listening (/metrics, /livez, /readyz)");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| Error::io(format!("admin server on {local}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
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

        health.set_pod_watch_synced(true);
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
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let health = Health::new();
        let task = tokio::spawn(serve(
            listener,
            router(health, Metrics::new().unwrap()),
            async move {
                let _ = rx.await;
            },
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
        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("shutdown in time")
            .unwrap()
            .unwrap();
    }
}
