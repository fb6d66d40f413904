//! The kubelet API routes (docs/architecture.md#decision-kubelet-api).
//!
//! | Route | Answer |
//! |---|---|
//! | `GET /healthz` | 200 `ok` (no auth) |
//! | `GET /pods` | PodList of every Pod bound to this node (`/pods/` → 301 `/pods`) |
//! | `GET /runningpods/` | PodList of the provider's Pods (`/runningpods` → 301) |
//! | `GET /containerLogs/{ns}/{pod}/{container}` | query validated (400), then 400: sandboxes keep no container log |
//! | `GET, POST /exec/…`, `/attach/…` | options validated (400), upgraded (SPDY or WebSocket), run in the sandbox ([`super::streaming`]) |
//! | `GET, POST /portForward/{ns}/{pod}` | upgraded, forwarded to guest ports ([`super::port_forward`]) |
//! | `GET /stats/summary[/]` | 200 Summary JSON: each sandbox Pod's memory ([`super::stats`]) |
//! | `GET /metrics/resource[/]` | 200 Prometheus text, `text/plain; version=0.0.4` |
//! | anything else | 404 `404 request not found`; wrong method 405 |
//!

use axum::Router;
use axum::extract::{MatchedPath, RawQuery, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};

use crate::kubelet::auth::PeerIdentity;
pub use crate::kubelet::state::KubeletState;
use crate::kubelet::streaming::{attach_route, exec_route, port_forward_route};

pub use crate::kubelet::streaming::{NO_CONTAINER_LOG, NOTHING_TO_ATTACH};
/// Content type of `/metrics/resource`.
pub const RESOURCE_METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// The kubelet API router, auth in front of every route but `/healthz`.
pub fn router(state: KubeletState) -> Router {
    let exec = get(exec_route).post(exec_route);
    let attach = get(attach_route).post(attach_route);
    let port_forward = get(port_forward_route).post(port_forward_route);
    Router::new()
        .route("/healthz", get(healthz))
        .route("/pods", get(pods))
        .route("/pods/", any(strip_trailing_slash))
        .route("/runningpods/", get(running_pods))
        .route("/runningpods", any(add_trailing_slash))
        .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
        .route("/exec/{ns}/{pod}/{container}", exec.clone())
        .route("/exec/{ns}/{pod}/{uid}/{container}", exec)
        .route("/attach/{ns}/{pod}/{container}", attach.clone())
        .route("/attach/{ns}/{pod}/{uid}/{container}", attach)
        .route("/portForward/{ns}/{pod}", port_forward.clone())
        .route("/portForward/{ns}/{pod}/{uid}", port_forward)
        .route("/stats/summary", get(stats_summary))
        .route("/stats/summary/", get(stats_summary))
        .route("/metrics/resource", get(resource_metrics))
        .route("/metrics/resource/", get(resource_metrics))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .with_state(state)
}

/// Counts every answer by route template and status code.
async fn count(State(state): State<KubeletState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let resp = next.run(req).await;
    state
        .metrics
        .kubelet_request(route.as_str(), resp.status().as_str());
    resp
}

/// Authentication and authorization (see `auth`), skipped for
/// `/healthz` and when auth is off.
async fn authenticate(State(state): State<KubeletState>, mut req: Request, next: Next) -> Response {
    let Some(auth) = state.auth.as_ref() else {
        return next.run(req).await;
    };
    if req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    let peer = req
        .extensions()
        .get::<PeerIdentity>()
        .and_then(|p| p.0.clone());
    let path = req.uri().path().to_string();
    match auth
        .check(peer.as_ref(), req.headers(), req.method(), &path)
        .await
    {
        Ok(user) => {
            tracing::debug!(user = %user.name, method = %req.method(), %path, "kubelet API request authorized");
            req.extensions_mut().insert(user);
            next.run(req).await
        }
        Err(refusal) => {
            state.metrics.kubelet_refused(refusal.metric_label());
            tracing::info!(method = %req.method(), %path, refusal = ?refusal, "kubelet API request refused");
            refusal.into_response()
        }
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "404 request not found\n").into_response()
}

fn redirect_to(path: &str, query: Option<&str>) -> Response {
    let location = match query {
        Some(q) if !q.is_empty() => format!("{path}?{q}"),
        _ => path.to_string(),
    };
    (
        StatusCode::MOVED_PERMANENTLY,
        [(header::LOCATION, location)],
        "",
    )
        .into_response()
}

async fn strip_trailing_slash(req: Request) -> Response {
    let path = req.uri().path().trim_end_matches('/').to_string();
    redirect_to(&path, req.uri().query())
}

async fn add_trailing_slash(req: Request) -> Response {
    let path = format!("{}/", req.uri().path());
    redirect_to(&path, req.uri().query())
}

fn pod_list(items: Vec<crate::pods::pod::Pod>) -> Response {
    let body = serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": items,
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn pods(State(state): State<KubeletState>) -> Response {
    pod_list(state.pods.node_pods())
}

async fn running_pods(State(state): State<KubeletState>) -> Response {
    pod_list(state.pods.running_pods())
}

/// Go's `strconv.ParseBool`.
fn go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `strconv.Atoi` (64-bit).
fn go_int(v: &str) -> Option<i64> {
    let digits = v.strip_prefix(['+', '-']).unwrap_or(v);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse::<i64>().ok()
}

/// First value of `key` in a query string, "" when absent (Go `q.Get`).
fn query_get(query: &str, key: &str) -> String {
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// The `/containerLogs` query checks the Go kubelet server makes (a bad
/// value is a 400).
pub fn validate_log_query(query: &str) -> Result<(), String> {
    let get = |k: &str| query_get(query, k);
    let tail = get("tailLines");
    if !tail.is_empty() && go_int(&tail).is_none_or(|n| n < 0) {
        return Err(format!(
            "invalid tailLines {tail:?}: want a non-negative integer"
        ));
    }
    for key in ["follow", "previous", "timestamps"] {
        let v = get(key);
        if !v.is_empty() && go_bool(&v).is_none() {
            return Err(format!("invalid {key} {v:?}: want true or false"));
        }
    }
    let limit = get("limitBytes");
    if !limit.is_empty() && go_int(&limit).is_none_or(|n| n < 1) {
        return Err(format!(
            "invalid limitBytes {limit:?}: want an integer >= 1"
        ));
    }
    let since_seconds = get("sinceSeconds");
    if !since_seconds.is_empty() && go_int(&since_seconds).is_none_or(|n| n < 1) {
        return Err(format!(
            "invalid sinceSeconds {since_seconds:?}: want an integer >= 1"
        ));
    }
    let since_time = get("sinceTime");
    if !since_time.is_empty() {
        // RFC 3339 proper: jiff's own parser also takes ISO 8601 and
        // RFC 9557 forms (`+02`, `T03Z`, `[UTC]`, `,5`, basic format).
        if crate::sandboxd::lease_deadline::parse_rfc3339(&since_time).is_none() {
            return Err(format!(
                "invalid sinceTime {since_time:?}: want an RFC 3339 time"
            ));
        }
        if !since_seconds.is_empty() {
            return Err("sinceSeconds and sinceTime cannot both be set".into());
        }
    }
    Ok(())
}

async fn container_logs(RawQuery(query): RawQuery) -> Response {
    if let Err(why) = validate_log_query(query.as_deref().unwrap_or("")) {
        return (StatusCode::BAD_REQUEST, why).into_response();
    }
    // A 400 reaches `kubectl logs` with its text intact ("Error from server
    // (BadRequest): …"), as a kubelet's answer for a container with no log.
    (StatusCode::BAD_REQUEST, NO_CONTAINER_LOG).into_response()
}

async fn stats_summary(State(state): State<KubeletState>) -> Response {
    let scrape = match &state.streaming {
        Some(s) => s.stats.pods().await,
        None => Default::default(),
    };
    let body = crate::kubelet::stats::summary(&state.node_name, &scrape.pods);
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn resource_metrics(State(state): State<KubeletState>) -> Response {
    let scrape = match &state.streaming {
        Some(s) => s.stats.pods().await,
        None => Default::default(),
    };
    let body = crate::kubelet::stats::resource_metrics(&scrape);
    (
        [(header::CONTENT_TYPE, RESOURCE_METRICS_CONTENT_TYPE)],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_query_rules() {
        for ok in [
            "",
            "tailLines=0",
            "tailLines=10",
            "tailLines=%2B3",
            "follow=true&previous=0&timestamps=T",
            "limitBytes=1",
            "sinceSeconds=5",
            "sinceTime=2026-01-02T03:04:05Z",
            "sinceTime=2026-01-02T03:04:05.5%2B02:00",
            "tailLines=",
        ] {
            assert_eq!(validate_log_query(ok), Ok(()), "{ok}");
        }
        for bad in [
            "tailLines=-1",
            "tailLines=x",
            "tailLines=1.5",
            "follow=yes",
            "previous=2",
            "timestamps=on",
            "limitBytes=0",
            "limitBytes=-4",
            "sinceSeconds=0",
            "sinceSeconds=abc",
            "sinceTime=yesterday",
            "sinceTime=2026-01-02T03:04:05Z&sinceSeconds=3",
            // Found with the kubelet_query fuzz target's checks: ISO 8601 / RFC 9557
            // forms jiff takes but RFC 3339 does not.
            "sinceTime=2026-01-02T03:04:05%2B02",
            "sinceTime=2026-01-02T03:04:05%2B0200",
            "sinceTime=2026-01-02T03:04Z",
            "sinceTime=2026-01-02T03Z",
            "sinceTime=20260102T030405Z",
            "sinceTime=2026-01-02T03:04:05Z%5BUTC%5D",
            "sinceTime=2026-01-02T03:04:05,5Z",
            "sinceTime=%2B002026-01-02T03:04:05Z",
            "sinceTime=2026-01-02T03:04:05%2B24:00",
            "sinceTime=2026-01-02T03:04:05%2B02:00:00",
        ] {
            assert!(validate_log_query(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn go_parsers() {
        assert_eq!(go_int("-0"), Some(0));
        assert_eq!(go_int("+7"), Some(7));
        assert_eq!(go_int(" 7"), None);
        assert_eq!(go_int("99999999999999999999"), None);
        assert_eq!(go_bool("True"), Some(true));
        assert_eq!(go_bool("yes"), None);
    }
}
