//! The kubelet API's streaming routes: `exec`, `attach`, `portForward` and
//! `containerLogs` (docs/streaming.md). A request is validated, its
//! protocol negotiated and its Pod's sandbox looked up before the upgrade
//! (a bad request is a 400, a Pod not bound here a 404, as from a kubelet);
//! after the `101` the session runs in its own task, on the server's
//! [`Sessions`] (inside its shutdown grace, ended by its shutdown).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use crate::kubelet::exec::{self, ExecRequest, Outcome};
use crate::kubelet::limits::{SessionPass, refusal_message};
use crate::kubelet::port_forward;
use crate::kubelet::sandbox::{DataPlane, SandboxRef, Unavailable};
use crate::kubelet::state::{KubeletState, Streaming};
use crate::kubelet::stream::negotiate::STREAM_PROTOCOL_HEADER;
use crate::kubelet::stream::version::Version;
use crate::kubelet::stream::watch::{ConnectionFd, HangupFd, Sessions, Upkeep, Watch};
use crate::kubelet::stream::{
    Negotiated, Opened, PortForwardVersion, Refusal, RemoteCommandVersion, StreamOptions,
    Transport, negotiate, spdy_exec, stream_options, tunnel, websocket,
};
use crate::spdy;

/// `kubectl logs` on a sandbox Pod (a 400, which `kubectl` shows as is).
pub const NO_CONTAINER_LOG: &str = "a sandbox Pod has no container log: its container is a \
     sandboxd microVM, whose console output is not kept. Look inside with kubectl exec (for \
     example kubectl exec -it POD -- sh) or read the files your program writes.";

/// `kubectl attach` on a sandbox Pod.
pub const NOTHING_TO_ATTACH: &str = "a sandbox Pod has no container process to attach to: its \
     container is a sandboxd microVM. Start a shell with kubectl exec -it POD -- sh instead.";

/// Most bytes of a urlencoded POST body read for stream options.
const MAX_FORM: usize = 64 * 1024;

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (status, body.into()).into_response()
}

/// An answer given instead of upgrading (boxed: a `Response` is large).
type Refused = Box<Response>;

fn refused(status: StatusCode, body: impl Into<String>) -> Refused {
    Box::new(text(status, body))
}

async fn form(
    req: Request,
) -> Result<(axum::http::request::Parts, Vec<(String, String)>), Refused> {
    let (parts, body) = req.into_parts();
    let is_form = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if parts.method != Method::POST || !is_form {
        return Ok((parts, Vec::new()));
    }
    let bytes = axum::body::to_bytes(body, MAX_FORM)
        .await
        .map_err(|e| refused(StatusCode::BAD_REQUEST, format!("read the form body: {e}")))?;
    let pairs = url::form_urlencoded::parse(&bytes)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    Ok((parts, pairs))
}

fn refusal(r: Refusal) -> Response {
    match r {
        Refusal::BadRequest(m) => text(StatusCode::BAD_REQUEST, m),
        Refusal::Forbidden(m) => text(StatusCode::FORBIDDEN, m),
    }
}

/// The `101` for `n`, and the upgraded connection's future.
fn switching<V: Version>(
    n: &Negotiated<V>,
    parts: &mut axum::http::request::Parts,
) -> Result<(Response, OnUpgrade), Refused> {
    let on_upgrade = parts.extensions.remove::<OnUpgrade>().ok_or_else(|| {
        refused(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: the connection cannot be upgraded (use HTTP/1.1)",
        )
    })?;
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    let protocol = n.version.name();
    match &n.transport {
        Transport::Spdy => {
            h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
            h.insert(STREAM_PROTOCOL_HEADER, HeaderValue::from_static(protocol));
        }
        Transport::WebSocket { key } => {
            h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
            let accept = derive_accept_key(key.as_bytes());
            let accept = HeaderValue::from_str(&accept).map_err(|_| {
                refused(
                    StatusCode::BAD_REQUEST,
                    "unable to upgrade: bad Sec-WebSocket-Key",
                )
            })?;
            h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
            h.insert(
                header::SEC_WEBSOCKET_PROTOCOL,
                HeaderValue::from_static(protocol),
            );
        }
    }
    Ok((resp, on_upgrade))
}

/// The server's sessions (none when the router runs without
/// [`crate::kubelet::serve`], as in some tests: then nothing waits for
/// them and nothing shuts them down).
fn sessions(parts: &axum::http::request::Parts) -> Sessions {
    parts
        .extensions
        .get::<Sessions>()
        .cloned()
        .unwrap_or_default()
}

/// A place among the open sessions for one more to `pod`, and what it is
/// held to (its socket watched from here on, the server's shutdown); a 429
/// naming the limit when there is none.
fn admit(
    state: &KubeletState,
    streaming: &Streaming,
    pod: &str,
    parts: &axum::http::request::Parts,
) -> Result<(SessionPass, Upkeep), Refused> {
    let gate = &streaming.gate;
    let pass = gate.enter(pod).map_err(|why| {
        let message = refusal_message(why, &state.node_name, pod, gate.limits());
        tracing::info!(
            pod,
            reason = why.label(),
            "streaming session refused: {message}"
        );
        refused(StatusCode::TOO_MANY_REQUESTS, message)
    })?;
    let limits = gate.limits();
    let stats = Arc::clone(gate.stats());
    let upkeep = Upkeep {
        spdy: spdy::Limits {
            max_streams: limits.max_streams_per_session,
            stats: Arc::clone(&stats),
            ..spdy::Limits::default()
        },
        watch: Watch {
            idle_timeout: limits.idle_timeout,
            socket: parts
                .extensions
                .get::<ConnectionFd>()
                .copied()
                .and_then(HangupFd::of),
            shutdown: sessions(parts).shutdown,
            stats,
        },
    };
    Ok((pass, upkeep))
}

/// The session's data plane: each relay opened only while the Pod's
/// lookup still names the sandbox the session was opened on.
fn rechecked(streaming: &Streaming, ns: &str, pod: &str, uid: Option<&str>) -> Arc<dyn DataPlane> {
    Arc::new(crate::kubelet::recheck::Rechecked::new(
        Arc::clone(&streaming.plane),
        Arc::clone(&streaming.sandboxes),
        ns,
        pod,
        uid,
    ))
}

/// Path parameters of exec and attach: ns, pod, [uid,] container.
fn pod_params(params: &[String]) -> (String, String, Option<String>) {
    let uid = (params.len() == 4).then(|| params[2].clone());
    (params[0].clone(), params[1].clone(), uid)
}

/// Which sandbox, or the refusal to run anything.
fn target(
    streaming: &Streaming,
    ns: &str,
    pod: &str,
    uid: Option<&str>,
) -> Result<Result<SandboxRef, Outcome>, Refused> {
    match streaming.sandboxes.lookup(ns, pod, uid) {
        Ok(s) => Ok(Ok(s)),
        Err(Unavailable::NoPod) => Err(refused(StatusCode::NOT_FOUND, "pod does not exist")),
        Err(Unavailable::NoSandbox(why)) => Ok(Err(Outcome::Refused {
            reason: "NotFound",
            message: why,
        })),
    }
}

async fn remote_command(
    state: KubeletState,
    params: Vec<String>,
    req: Request,
    attach: bool,
) -> Response {
    let (mut parts, form) = match form(req).await {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let query = parts.uri.query().unwrap_or("").to_string();
    let opts = match stream_options(&form, &query) {
        Ok(o) => o,
        Err(why) => return text(StatusCode::BAD_REQUEST, why),
    };
    if !attach && opts.command.is_empty() {
        return text(
            StatusCode::BAD_REQUEST,
            "no command given (the command query parameter)",
        );
    }
    let negotiated = match negotiate::<RemoteCommandVersion>(&parts.headers) {
        Ok(n) => n,
        Err(r) => return refusal(r),
    };
    let Some(streaming) = state.streaming.clone() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "streaming is not configured on this node",
        );
    };
    let (ns, pod, uid) = pod_params(&params);
    let target = match target(&streaming, &ns, &pod, uid.as_deref()) {
        Ok(t) => t,
        Err(r) => return *r,
    };
    let target = if attach {
        Err(Outcome::Refused {
            reason: "BadRequest",
            message: NOTHING_TO_ATTACH.into(),
        })
    } else {
        target
    };
    let key = format!("{ns}/{pod}");
    let (pass, upkeep) = match admit(&state, &streaming, &key, &parts) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let (resp, on_upgrade) = match switching(&negotiated, &mut parts) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let plane = rechecked(&streaming, &ns, &pod, uid.as_deref());
    let span = tracing::info_span!("exec", pod = %key, node = %state.node_name);
    let prepared = prepare(target, Arc::clone(&plane));
    sessions(&parts)
        .tracker
        .spawn(tracing::Instrument::instrument(
            async move {
                session(negotiated, on_upgrade, opts, plane, prepared, upkeep).await;
                drop(pass);
            },
            span,
        ));
    resp
}

/// The sandbox and a connection to its guest agent (or why not), or the
/// refusal to run anything.
type Prepared = Result<(SandboxRef, exec::Connection), Outcome>;

async fn prepare(target: Result<SandboxRef, Outcome>, plane: Arc<dyn DataPlane>) -> Prepared {
    let sandbox = target?;
    let conn = exec::agent::connect(plane.as_ref(), &sandbox).await;
    Ok((sandbox, conn))
}

/// One remote-command session, after the `101`: the transport opens it,
/// the command runs on its channels, and its status is sent once.
async fn session(
    negotiated: Negotiated<RemoteCommandVersion>,
    on_upgrade: OnUpgrade,
    opts: StreamOptions,
    plane: Arc<dyn DataPlane>,
    prepared: impl Future<Output = Prepared>,
    upkeep: Upkeep,
) {
    // The relay opens while the 101 goes out, the connection is handed
    // over and the transport opens: its round trip to sandboxd overlaps
    // them (the thread would otherwise wait for sandboxd's answer with
    // nothing to do, then open the transport).
    let transport = async {
        let io = match on_upgrade.await {
            Ok(u) => TokioIo::new(u),
            Err(e) => {
                tracing::debug!(error = %e, "upgrade failed");
                return None;
            }
        };
        let version = negotiated.version;
        match negotiated.transport {
            Transport::Spdy => spdy_exec::open(io, version, &opts, upkeep).await,
            Transport::WebSocket { .. } => {
                Some(websocket::open(io, version, &opts, upkeep.watch).await)
            }
        }
    };
    let (opened, prepared) = tokio::join!(transport, prepared);
    let Some(Opened { channels, status }) = opened else {
        return;
    };
    let hangup = channels.hangup.clone();
    let outcome = match prepared {
        Ok((sandbox, conn)) => {
            let req = ExecRequest {
                argv: opts.command.clone(),
                tty: opts.tty,
            };
            exec::run_on(conn, plane, sandbox, req, channels).await
        }
        Err(refused) => {
            drop(channels);
            refused
        }
    };
    if hangup.is_cancelled() {
        // Dropped unsent: the session ends, and its tasks with it.
        tracing::info!(
            ?outcome,
            "exec ended; the client is gone: no status to send"
        );
        return;
    }
    // The log line after the status: it is not the client's wait.
    status
        .send(exec::status::status(&outcome, &opts.command))
        .await;
    tracing::info!(?outcome, "exec ended");
}

/// `GET|POST /exec/{ns}/{pod}[/{uid}]/{container}`.
pub async fn exec_route(
    State(state): State<KubeletState>,
    Path(params): Path<Vec<String>>,
    req: Request,
) -> Response {
    remote_command(state, params, req, false).await
}

/// `GET|POST /attach/{ns}/{pod}[/{uid}]/{container}`.
pub async fn attach_route(
    State(state): State<KubeletState>,
    Path(params): Path<Vec<String>>,
    req: Request,
) -> Response {
    remote_command(state, params, req, true).await
}

/// `GET|POST /portForward/{ns}/{pod}[/{uid}]`.
pub async fn port_forward_route(
    State(state): State<KubeletState>,
    Path(params): Path<Vec<String>>,
    req: Request,
) -> Response {
    let (mut parts, _) = req.into_parts();
    let negotiated = match negotiate::<PortForwardVersion>(&parts.headers) {
        Ok(n) => n,
        Err(r) => return refusal(r),
    };
    let Some(streaming) = state.streaming.clone() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "streaming is not configured on this node",
        );
    };
    let ns = params[0].clone();
    let pod = params[1].clone();
    let uid = params.get(2).cloned();
    let sandbox = match target(&streaming, &ns, &pod, uid.as_deref()) {
        Ok(Ok(s)) => s,
        Ok(Err(Outcome::Refused { message, .. })) => {
            // Nothing to forward to: before the upgrade, so that the client
            // shows the reason instead of a broken stream.
            return text(StatusCode::BAD_REQUEST, message);
        }
        Ok(Err(_)) => return text(StatusCode::BAD_REQUEST, "pod has no sandbox"),
        Err(r) => return *r,
    };
    let key = format!("{ns}/{pod}");
    let (pass, upkeep) = match admit(&state, &streaming, &key, &parts) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let (resp, on_upgrade) = match switching(&negotiated, &mut parts) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let forward = port_forward::Forward {
        plane: rechecked(&streaming, &ns, &pod, uid.as_deref()),
        sandbox,
        pod: key,
        pair_timeout: streaming.pair_timeout,
        upkeep,
    };
    sessions(&parts).tracker.spawn(async move {
        let _pass = pass;
        let io = match on_upgrade.await {
            Ok(u) => TokioIo::new(u),
            Err(e) => {
                tracing::debug!(error = %e, "upgrade failed");
                return;
            }
        };
        match negotiated.transport {
            Transport::Spdy => port_forward::serve(io, forward).await,
            Transport::WebSocket { .. } => {
                let io = tunnel::byte_stream(io).await;
                port_forward::serve(io, forward).await
            }
        }
    });
    resp
}
