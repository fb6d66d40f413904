//! HTTP layer: sandboxd's routes with Go-router-style 404/405 replies, the
//! transport faults (`faults`: every API call goes through it to the
//! model), the request log, and a hand-rolled accept loop so a fault can
//! close a TCP connection without replying, or stop accepting altogether.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body as AxumBody, Bytes, to_bytes};
use axum::extract::{Extension, Path, Request, State};
use axum::http::header::{ALLOW, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, DATE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use futures::StreamExt;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tower::ServiceExt;
use tracing::{debug, warn};

mod faults;
mod verbs;

use crate::model::MAX_BODY;
use crate::sim::{Body, Reply, Sim};
use faults::{After, Call, Outcome};

/// Lets a handler close its own TCP connection without replying.
#[derive(Clone, Debug, Default)]
pub struct ConnCtl(Arc<Notify>);

impl ConnCtl {
    pub fn drop_connection(&self) {
        self.0.notify_one();
    }
}

/// The request-log sequence number of the request being handled.
#[derive(Clone, Copy, Debug)]
struct LogSeq(u64);

/// A note for the request log, attached to a response.
#[derive(Clone, Debug)]
struct LogNote(&'static str);

/// The full router: sandboxd's API, logged, plus the admin API under
/// `/_sim` (not logged).
pub fn router(sim: Arc<Sim>) -> Router {
    let api = Router::new()
        .route("/v1/claim", any(claim))
        .route("/v1/sandboxes", any(list))
        .route("/v1/sandboxes/{id}/release", any(release))
        .route("/v1/sandboxes/{id}", any(verbs::get_sandbox))
        .route("/v1/sandboxes/{id}/hibernate", any(verbs::hibernate))
        .route("/v1/sandboxes/{id}/wake", any(verbs::wake))
        .route("/v1/sandboxes/{id}/renew", any(verbs::renew))
        .route("/v1/sandboxes/{id}/stats", any(verbs::stats))
        .route("/v1/sandboxes/{id}/owner", any(verbs::owner))
        .route("/v1/sandboxes/{id}/exec", any(verbs::exec))
        .route("/v1/sandboxes/{id}/agent", any(verbs::agent_relay))
        .route("/v1/sandboxes/{id}/ports/{port}", any(verbs::port_relay))
        .route("/v1/info", any(info))
        .route("/v1/drain", any(drain))
        .route("/metrics", any(metrics))
        .route("/healthz", any(healthz))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(sim.clone(), record))
        .with_state(sim.clone());
    Router::new()
        .nest("/_sim", crate::admin::router(sim))
        .merge(api)
        .layer(middleware::map_response(go_date))
}

/// Go's server writes a `Date` on every reply, but not on the `101` of a
/// connection its handler hijacked: sandboxd writes that one itself, with
/// exactly the status line, `Upgrade` and `Connection`. hyper's own `Date`
/// is off on the API's connections, so it is added here to the others.
async fn go_date(mut resp: Response) -> Response {
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS && !resp.headers().contains_key(DATE) {
        let now = jiff::Timestamp::now().strftime("%a, %d %b %Y %H:%M:%S GMT");
        if let Ok(v) = HeaderValue::from_str(&now.to_string()) {
            resp.headers_mut().insert(DATE, v);
        }
    }
    resp
}

fn auth(headers: &HeaderMap) -> Option<String> {
    headers
        .get(AUTHORIZATION)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// Go's `ServeMux` reply to an unrouted path.
async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        [(CONTENT_TYPE, "text/plain; charset=utf-8")],
        "404 page not found\n",
    )
        .into_response()
}

/// Go's `ServeMux` reply to a wrong method on a known path.
fn method_not_allowed(allow: &'static str) -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(ALLOW, allow), (CONTENT_TYPE, "text/plain; charset=utf-8")],
        "Method Not Allowed\n",
    )
        .into_response()
}

const GET_ALLOW: &str = "GET, HEAD";

fn is_get(m: &Method) -> bool {
    m == Method::GET || m == Method::HEAD
}

async fn claim(
    State(sim): State<Arc<Sim>>,
    method: Method,
    headers: HeaderMap,
    conn: Option<Extension<ConnCtl>>,
    seq: Option<Extension<LogSeq>>,
    body: Bytes,
) -> Response {
    if method != Method::POST {
        return method_not_allowed("POST");
    }
    let call = Call::Claim { body: &body };
    let outcome = faults::dispatch(&sim, auth(&headers).as_deref(), call).await;
    deliver(&sim, outcome, conn, seq).await
}

async fn release(
    State(sim): State<Arc<Sim>>,
    method: Method,
    headers: HeaderMap,
    Path(id): Path<String>,
    conn: Option<Extension<ConnCtl>>,
    seq: Option<Extension<LogSeq>>,
) -> Response {
    if method != Method::POST {
        return method_not_allowed("POST");
    }
    let call = Call::Release { id: &id };
    let outcome = faults::dispatch(&sim, auth(&headers).as_deref(), call).await;
    deliver(&sim, outcome, conn, seq).await
}

/// A node-wide read (`GET` only): the list, info.
async fn node_read(
    sim: Arc<Sim>,
    method: Method,
    headers: HeaderMap,
    conn: Option<Extension<ConnCtl>>,
    seq: Option<Extension<LogSeq>>,
    call: Call<'static>,
) -> Response {
    if !is_get(&method) {
        return method_not_allowed(GET_ALLOW);
    }
    let outcome = faults::dispatch(&sim, auth(&headers).as_deref(), call).await;
    deliver(&sim, outcome, conn, seq).await
}

async fn list(
    State(sim): State<Arc<Sim>>,
    method: Method,
    headers: HeaderMap,
    conn: Option<Extension<ConnCtl>>,
    seq: Option<Extension<LogSeq>>,
) -> Response {
    node_read(sim, method, headers, conn, seq, Call::List).await
}

async fn info(
    State(sim): State<Arc<Sim>>,
    method: Method,
    headers: HeaderMap,
    conn: Option<Extension<ConnCtl>>,
    seq: Option<Extension<LogSeq>>,
) -> Response {
    node_read(sim, method, headers, conn, seq, Call::Info).await
}

/// `POST /v1/drain` (drain: claims get 429, or a redirect with peers) and
/// `DELETE /v1/drain` (take claims again); root only, as sandboxd's
/// operator surface. Running sandboxes are untouched either way.
async fn drain(
    State(sim): State<Arc<Sim>>,
    method: Method,
    headers: HeaderMap,
    conn: Option<Extension<ConnCtl>>,
    seq: Option<Extension<LogSeq>>,
) -> Response {
    let draining = match method {
        Method::POST => true,
        Method::DELETE => false,
        _ => return method_not_allowed("POST, DELETE"),
    };
    let reply = sim.set_draining(auth(&headers).as_deref(), draining);
    deliver(&sim, reply.into(), conn, seq).await
}

async fn metrics(
    State(sim): State<Arc<Sim>>,
    method: Method,
    headers: HeaderMap,
    conn: Option<Extension<ConnCtl>>,
    seq: Option<Extension<LogSeq>>,
) -> Response {
    if !is_get(&method) {
        return method_not_allowed(GET_ALLOW);
    }
    // No fault applies to the metrics.
    let reply = sim.metrics(auth(&headers).as_deref());
    deliver(&sim, reply.into(), conn, seq).await
}

async fn healthz(method: Method) -> Response {
    if !is_get(&method) {
        return method_not_allowed(GET_ALLOW);
    }
    ([(CONTENT_TYPE, "text/plain; charset=utf-8")], "ok").into_response()
}

fn reply_parts(reply: Reply) -> (StatusCode, Option<String>, Vec<u8>) {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match reply.body {
        Body::Empty => (status, None, Vec::new()),
        Body::Json(v) => (
            status,
            Some("application/json".to_string()),
            serde_json::to_vec(&v).unwrap_or_default(),
        ),
        Body::Raw {
            content_type,
            bytes,
        } => (status, Some(content_type), bytes),
    }
}

fn into_response(reply: Reply) -> Response {
    let (status, content_type, bytes) = reply_parts(reply);
    let mut resp = Response::new(AxumBody::from(bytes));
    *resp.status_mut() = status;
    if let Some(ct) = content_type
        && let Ok(v) = ct.parse()
    {
        resp.headers_mut().insert(CONTENT_TYPE, v);
    }
    resp
}

async fn deliver(
    sim: &Sim,
    outcome: Outcome,
    conn: Option<Extension<ConnCtl>>,
    seq: Option<Extension<LogSeq>>,
) -> Response {
    let seq = seq.map(|Extension(LogSeq(s))| s);
    let status = outcome.reply.status;
    match outcome.after {
        After::Send => into_response(outcome.reply),
        After::Delay(delay) => {
            if let Some(seq) = seq {
                sim.log_finish(
                    seq,
                    Some(status),
                    Some(format!("slow: replied after {delay:?}")),
                );
            }
            tokio::time::sleep(delay).await;
            into_response(outcome.reply)
        }
        After::Drop => {
            let Some(Extension(conn)) = conn else {
                return into_response(Reply::error(
                    500,
                    "sandboxd-sim: cannot drop this connection",
                ));
            };
            if let Some(seq) = seq {
                sim.log_finish(seq, None, Some("connection dropped without a reply".into()));
            }
            conn.drop_connection();
            std::future::pending().await
        }
        After::Truncate => {
            let Some(Extension(conn)) = conn else {
                return into_response(Reply::error(
                    500,
                    "sandboxd-sim: cannot drop this connection",
                ));
            };
            truncated(outcome.reply, conn)
        }
    }
}

/// Headers announcing the full length, half the body, then the connection
/// closes.
fn truncated(reply: Reply, conn: ConnCtl) -> Response {
    let (status, content_type, bytes) = reply_parts(reply);
    let full_len = bytes.len();
    let half = Bytes::from(bytes[..full_len / 2].to_vec());
    let head = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(half) });
    let tail = futures::stream::once(async move {
        // Let the headers and the first half reach the client first.
        tokio::time::sleep(Duration::from_millis(50)).await;
        conn.drop_connection();
        std::future::pending::<Result<Bytes, std::io::Error>>().await
    });
    let mut resp = Response::new(AxumBody::from_stream(head.chain(tail)));
    *resp.status_mut() = status;
    if let Some(ct) = content_type
        && let Ok(v) = ct.parse()
    {
        resp.headers_mut().insert(CONTENT_TYPE, v);
    }
    resp.headers_mut().insert(CONTENT_LENGTH, full_len.into());
    resp.extensions_mut().insert(LogNote(
        "truncated: half the body, then the connection closed",
    ));
    resp
}

/// Request-log middleware: records method, path, Authorization and body
/// before the handler runs, and the status after.
async fn record(State(sim): State<Arc<Sim>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_string(), |p| p.to_string());
    let authorization = auth(&parts.headers);
    let bytes = match to_bytes(body, MAX_BODY + 1).await {
        Ok(b) => b,
        Err(_) => {
            let seq = sim.log_begin(
                parts.method.as_str(),
                &path,
                authorization,
                b"<body too large or unreadable>",
            );
            sim.log_finish(seq, Some(400), None);
            return into_response(Reply::error(400, "invalid request body"));
        }
    };
    let seq = sim.log_begin(parts.method.as_str(), &path, authorization, &bytes);
    let mut req = Request::from_parts(parts, AxumBody::from(bytes));
    req.extensions_mut().insert(LogSeq(seq));
    let resp = next.run(req).await;
    let note = resp.extensions().get::<LogNote>().map(|n| n.0.to_string());
    sim.log_finish(seq, Some(resp.status().as_u16()), note);
    resp
}

/// Serve one accepted connection until it ends, a handler asks to drop it,
/// or all connections are killed.
fn spawn_connection(stream: TcpStream, app: Router, sim: &Arc<Sim>) {
    // sandboxd is a Go program, and Go turns Nagle off on every TCP
    // connection: the agent relay's frames (output, then the exit) go out at
    // once instead of waiting out the client's delayed ACK (40 ms).
    if let Err(e) = stream.set_nodelay(true) {
        debug!(error = %e, "sandboxd-sim: TCP_NODELAY not set");
    }
    let mut kill = sim.kill.subscribe();
    tokio::spawn(async move {
        let ctl = ConnCtl::default();
        let ctl_for_requests = ctl.clone();
        let svc = app.map_request(move |mut req: Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(ctl_for_requests.clone());
            req
        });
        let svc = TowerToHyperService::new(svc);
        // Upgrades (agent, ports) leave this future when the 101 is sent;
        // their relays watch the kill switch themselves. Header names are
        // written as Go writes them (`Upgrade`, `Content-Type`), and the
        // `Date` only where Go writes one ([`go_date`]).
        let conn = hyper::server::conn::http1::Builder::new()
            .keep_alive(true)
            .title_case_headers(true)
            .auto_date_header(false)
            .serve_connection(TokioIo::new(stream), svc)
            .with_upgrades();
        tokio::select! {
            res = conn => {
                if let Err(e) = res {
                    debug!(error = %e, "sandboxd-sim: connection ended with an error");
                }
            }
            () = ctl.0.notified() => debug!("sandboxd-sim: connection dropped on purpose"),
            _ = kill.changed() => debug!("sandboxd-sim: connection killed"),
        }
        // Dropping the connection future closes the socket.
    });
}

/// The API accept loop. While the simulator is not accepting, the listener
/// is closed (connections are refused) and re-bound on the same address
/// when accepting resumes.
pub(crate) async fn serve_api(sim: Arc<Sim>, listener: TcpListener, app: Router) {
    let addr: SocketAddr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            warn!(error = %e, "sandboxd-sim: listener has no address");
            return;
        }
    };
    let mut accepting = sim.accepting.subscribe();
    let mut listener = Some(listener);
    loop {
        if !*accepting.borrow_and_update() {
            listener = None;
            if accepting.changed().await.is_err() {
                return;
            }
            continue;
        }
        let l = match &listener {
            Some(l) => l,
            None => match bind_retrying(addr).await {
                Some(l) => listener.insert(l),
                None => return,
            },
        };
        tokio::select! {
            res = l.accept() => match res {
                Ok((stream, _)) => spawn_connection(stream, app.clone(), &sim),
                Err(e) => {
                    warn!(error = %e, "sandboxd-sim: accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            changed = accepting.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

async fn bind_retrying(addr: SocketAddr) -> Option<TcpListener> {
    for _ in 0..100 {
        match TcpListener::bind(addr).await {
            Ok(l) => return Some(l),
            Err(e) => {
                debug!(error = %e, %addr, "sandboxd-sim: re-bind failed, retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    warn!(%addr, "sandboxd-sim: could not re-bind the API listener");
    None
}

/// Serve the admin API alone (the `--admin-listen` port).
pub(crate) async fn serve_admin(sim: Arc<Sim>, listener: TcpListener) {
    let app = Router::new().nest("/_sim", crate::admin::router(sim));
    if let Err(e) = axum::serve(listener, app).await {
        warn!(error = %e, "sandboxd-sim: admin server stopped");
    }
}
