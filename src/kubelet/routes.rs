//! The kubelet API routes (docs/architecture.md#decision-kubelet-api).
//!
//! | Route | Answer |
//! |---|---|
//! | `GET /healthz` | 200 `ok` (no auth) |
//! | `GET /pods` | PodList of every Pod bound to this node (`/pods/` → 301 `/pods`) |
//! | `GET /runningpods/` | PodList of the provider's Pods (`/runningpods` → 301) |
//! | `GET /containerLogs/{ns}/{pod}/{container}` | query validated (400), then 500 not implemented |
//! | `GET, POST /exec/…`, `/attach/…` | options validated (400), then 501 not implemented |
//! | `GET, POST /portForward/{ns}/{pod}` | 501 not implemented |
//! | `GET /stats/summary[/]` | 200 empty Summary JSON |
//! | `GET /metrics/resource[/]` | 200 empty, `text/plain; version=0.0.4` |
//! | anything else | 404 `404 request not found`; wrong method 405 |
//!
//! Nothing is ever executed, attached or forwarded: exec/attach/portForward
//! answer before any upgrade, with a body that `kubectl` shows through the
//! apiserver ("unable to upgrade connection: …not implemented; use the
//! sandbox SDK…").

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{MatchedPath, RawQuery, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};

use crate::kubelet::auth::{KubeletAuth, PeerIdentity};
use crate::metrics::Metrics;
use crate::pods::source::PodSource;

/// The shared tail of every not-implemented answer.
pub const NOT_IMPLEMENTED: &str =
    "vk-sandbox: not implemented; use the sandbox SDK for interactive access";
/// Body of `/containerLogs` once the query is valid (the Go program's text,
/// byte for byte).
pub const LOGS_NOT_IMPLEMENTED: &str = "error getting container logs?): vk-sandbox: not implemented; use the sandbox SDK for interactive access";
/// Content type of `/metrics/resource`.
pub const RESOURCE_METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// What the routes need.
#[derive(Clone)]
pub struct KubeletState {
    pub node_name: String,
    pub pods: Arc<dyn PodSource>,
    /// `None` = authentication and authorization off (`--kubelet-auth=false`).
    pub auth: Option<Arc<KubeletAuth>>,
    pub metrics: Arc<Metrics>,
}

/// The kubelet API router, auth in front of every route but `/healthz`.
pub fn router(state: KubeletState) -> Router {
    let exec = get(exec).post(exec);
    let attach = get(attach).post(attach);
    let port_forward = get(port_forward).post(port_forward);
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
    (StatusCode::INTERNAL_SERVER_ERROR, LOGS_NOT_IMPLEMENTED).into_response()
}

/// exec/attach stream options: query values, with a urlencoded POST body
/// first (Go `FormValue`); "1" means on.
fn stream_option(form: &[(String, String)], query: &str, key: &str) -> bool {
    form.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| query_get(query, key))
        == "1"
}

/// exec/attach options as the kubelet checks them: at least one of
/// stdin/stdout/stderr, and not tty together with stderr.
pub fn validate_stream_options(form: &[(String, String)], query: &str) -> Result<(), String> {
    let on = |k| stream_option(form, query, k);
    let (stdin, stdout, stderr, tty) = (on("input"), on("output"), on("error"), on("tty"));
    if !stdin && !stdout && !stderr {
        return Err("you must specify at least 1 of stdin, stdout, stderr".into());
    }
    if tty && stderr {
        return Err("stderr cannot be set together with tty".into());
    }
    Ok(())
}

fn form_body(method: &Method, headers: &HeaderMap, body: &Bytes) -> Vec<(String, String)> {
    let is_form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if *method != Method::POST || !is_form {
        return Vec::new();
    }
    url::form_urlencoded::parse(body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn streaming_refusal(
    what: &str,
    method: Method,
    headers: HeaderMap,
    query: Option<String>,
    body: Bytes,
) -> Response {
    let form = form_body(&method, &headers, &body);
    if let Err(why) = validate_stream_options(&form, query.as_deref().unwrap_or("")) {
        return (StatusCode::BAD_REQUEST, why).into_response();
    }
    (
        StatusCode::NOT_IMPLEMENTED,
        format!("{what}: {NOT_IMPLEMENTED}"),
    )
        .into_response()
}

async fn exec(method: Method, headers: HeaderMap, RawQuery(q): RawQuery, body: Bytes) -> Response {
    streaming_refusal(
        "error executing command in container",
        method,
        headers,
        q,
        body,
    )
}

async fn attach(
    method: Method,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Response {
    streaming_refusal("error attaching to container", method, headers, q, body)
}

async fn port_forward() -> Response {
    (
        StatusCode::NOT_IMPLEMENTED,
        format!("error forwarding port: {NOT_IMPLEMENTED}"),
    )
        .into_response()
}

async fn stats_summary(State(state): State<KubeletState>) -> Response {
    let body = serde_json::json!({
        "node": {"nodeName": state.node_name, "startTime": null},
        "pods": [],
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn resource_metrics() -> Response {
    ([(header::CONTENT_TYPE, RESOURCE_METRICS_CONTENT_TYPE)], "").into_response()
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
    fn stream_option_rules() {
        assert!(validate_stream_options(&[], "").is_err());
        assert!(validate_stream_options(&[], "tty=1&input=1&output=1").is_ok());
        assert!(validate_stream_options(&[], "tty=1&output=1&error=1").is_err());
        assert!(
            validate_stream_options(&[], "output=true").is_err(),
            "only 1 is on"
        );
        assert!(validate_stream_options(&[], "error=1").is_ok());
        let form = vec![("input".to_string(), "1".to_string())];
        assert!(validate_stream_options(&form, "").is_ok());
        let form = vec![("output".to_string(), "0".to_string())];
        assert!(
            validate_stream_options(&form, "output=1").is_err(),
            "body values win"
        );
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
