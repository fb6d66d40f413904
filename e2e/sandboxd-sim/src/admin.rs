//! The admin API under `/_sim` (documented in e2e/README.md and `--help`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::config::{ConfigPatch, PoolConfig, PortMapping};
use crate::faults::Fault;
use crate::sim::{ClaimPatch, ClockPatch, Sim};

/// Give an admin reply time to leave before its own connection is closed.
const SELF_CLOSE_GRACE: Duration = Duration::from_millis(50);

pub fn router(sim: Arc<Sim>) -> Router {
    Router::new()
        .route("/state", get(state))
        .route("/requests", get(requests).delete(clear_requests))
        .route("/faults", get(faults).post(arm_fault).delete(clear_faults))
        .route(
            "/config",
            get(config).patch(patch_config).post(patch_config),
        )
        .route("/pools", post(set_pool))
        .route("/clock", get(clock).post(patch_clock))
        .route("/reap", post(reap))
        .route("/claims", get(claims))
        .route("/claims/{id}", get(claim_state).post(patch_claim))
        .route("/ports", get(ports).post(map_port).delete(clear_ports))
        .route("/sweep", post(sweep))
        .route("/restart", post(restart))
        .route("/listener", get(listener).post(set_listener))
        .with_state(sim)
}

fn bad_request(message: impl Into<String>) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({ "error": message.into() })),
    )
        .into_response()
}

fn parse<T: DeserializeOwned + Default>(body: &Bytes) -> Result<T, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| format!("invalid JSON: {e}"))
}

async fn state(State(sim): State<Arc<Sim>>) -> Response {
    axum::Json(sim.snapshot()).into_response()
}

async fn requests(
    State(sim): State<Arc<Sim>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let mut entries = sim.requests();
    if let Some(prefix) = q.get("path") {
        entries.retain(|e| e.path.starts_with(prefix.as_str()));
    }
    if let Some(method) = q.get("method") {
        entries.retain(|e| e.method.eq_ignore_ascii_case(method));
    }
    axum::Json(entries).into_response()
}

async fn clear_requests(State(sim): State<Arc<Sim>>) -> StatusCode {
    sim.clear_requests();
    StatusCode::NO_CONTENT
}

async fn faults(State(sim): State<Arc<Sim>>) -> Response {
    axum::Json(sim.faults()).into_response()
}

async fn arm_fault(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let fault: Fault = match serde_json::from_slice(&body) {
        Ok(f) => f,
        Err(e) => return bad_request(format!("invalid fault: {e}")),
    };
    match sim.arm_fault(fault) {
        Ok(id) => (StatusCode::CREATED, axum::Json(json!({ "id": id }))).into_response(),
        Err(e) => bad_request(e),
    }
}

async fn clear_faults(State(sim): State<Arc<Sim>>) -> StatusCode {
    sim.clear_faults();
    StatusCode::NO_CONTENT
}

async fn config(State(sim): State<Arc<Sim>>) -> Response {
    axum::Json(sim.config()).into_response()
}

async fn patch_config(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    match parse::<ConfigPatch>(&body) {
        Ok(patch) => axum::Json(sim.patch_config(patch)).into_response(),
        Err(e) => bad_request(e),
    }
}

async fn set_pool(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let pool: PoolConfig = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => return bad_request(format!("invalid pool: {e}")),
    };
    match sim.set_pool(pool) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => bad_request(e),
    }
}

async fn clock(State(sim): State<Arc<Sim>>) -> Response {
    axum::Json(json!({ "now": sim.now().to_string(), "frozen": sim.clock().is_frozen() }))
        .into_response()
}

async fn patch_clock(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    match parse::<ClockPatch>(&body) {
        Ok(patch) => {
            let now = sim.patch_clock(patch);
            axum::Json(json!({ "now": now.to_string(), "frozen": sim.clock().is_frozen() }))
                .into_response()
        }
        Err(e) => bad_request(e),
    }
}

async fn reap(State(sim): State<Arc<Sim>>) -> Response {
    axum::Json(json!({ "reaped": sim.reap() })).into_response()
}

async fn claims(State(sim): State<Arc<Sim>>, Query(q): Query<HashMap<String, String>>) -> Response {
    let claims = match q.get("claim_ref") {
        Some(r) => sim.claims_by_ref(r),
        None => sim.claims(),
    };
    axum::Json(claims).into_response()
}

async fn patch_claim(State(sim): State<Arc<Sim>>, Path(id): Path<String>, body: Bytes) -> Response {
    let patch = match parse::<ClaimPatch>(&body) {
        Ok(p) => p,
        Err(e) => return bad_request(e),
    };
    match sim.patch_claim(&id, patch) {
        Ok(claim) => axum::Json(claim).into_response(),
        Err(e) if e.starts_with("unknown sandbox") => {
            (StatusCode::NOT_FOUND, axum::Json(json!({ "error": e }))).into_response()
        }
        Err(e) => bad_request(e),
    }
}

async fn claim_state(State(sim): State<Arc<Sim>>, Path(id): Path<String>) -> Response {
    match sim.claim_state(&id) {
        Some(v) => axum::Json(v).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({ "error": format!("unknown sandbox {id:?}") })),
        )
            .into_response(),
    }
}

async fn ports(State(sim): State<Arc<Sim>>) -> Response {
    axum::Json(sim.port_map()).into_response()
}

/// A port mapping, or `"remove": true` to drop the one with the same
/// sandbox or template and guest port.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PortRequest {
    #[serde(flatten)]
    mapping: PortMapping,
    #[serde(default)]
    remove: bool,
}

async fn map_port(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let req: PortRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(format!("invalid port mapping: {e}")),
    };
    match sim.map_port(req.mapping, req.remove) {
        Ok(()) => axum::Json(sim.port_map()).into_response(),
        Err(e) => bad_request(e),
    }
}

async fn clear_ports(State(sim): State<Arc<Sim>>) -> StatusCode {
    sim.clear_ports();
    StatusCode::NO_CONTENT
}

async fn sweep(State(sim): State<Arc<Sim>>) -> Response {
    axum::Json(json!({ "changed": sim.sweep() })).into_response()
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RestartRequest {
    /// Claims to lose silently, as reconcile drops claims whose VM is gone.
    drop_ids: Vec<String>,
    /// Also close every open API connection, like a real process restart.
    drop_connections: bool,
}

async fn restart(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let req = match parse::<RestartRequest>(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    match sim.restart(&req.drop_ids) {
        Ok(ids) => {
            if req.drop_connections {
                let sim = sim.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(SELF_CLOSE_GRACE).await;
                    sim.kill_connections();
                });
            }
            axum::Json(json!({ "claims": ids })).into_response()
        }
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({ "error": e.to_string() })),
        )
            .into_response(),
    }
}

async fn listener(State(sim): State<Arc<Sim>>) -> Response {
    axum::Json(json!({ "accepting": sim.is_accepting() })).into_response()
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ListenerRequest {
    accepting: Option<bool>,
    /// With `accepting: false`: accept again after this long.
    resume_after_ms: Option<u64>,
}

async fn set_listener(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let req = match parse::<ListenerRequest>(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    let Some(accepting) = req.accepting else {
        return bad_request("want {\"accepting\": true|false}");
    };
    if accepting {
        sim.set_accepting(true);
    } else {
        // This very request may have come in on the API port: answer first.
        let sim = sim.clone();
        tokio::spawn(async move {
            tokio::time::sleep(SELF_CLOSE_GRACE).await;
            sim.set_accepting(false);
            if let Some(ms) = req.resume_after_ms {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                sim.set_accepting(true);
            }
        });
    }
    axum::Json(json!({ "accepting": accepting })).into_response()
}
