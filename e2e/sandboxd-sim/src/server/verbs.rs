//! HTTP handlers of the lifecycle verbs, the single-sandbox read, stats,
//! the owner probe, the buffered exec and the two upgrades (`/agent`,
//! `/ports/{port}`).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body as AxumBody, Bytes};
use axum::extract::{Extension, Path, Request, State};
use axum::http::header::{CONNECTION, UPGRADE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tracing::debug;

use super::faults::{self, Call, Outcome, Relay};
use super::{ConnCtl, GET_ALLOW, LogSeq, auth, deliver, is_get, method_not_allowed};
use crate::guest::agent::{self, AgentConfig};
use crate::sim::{RelayGrant, Reply, Sim};

/// How long a port relay waits for the client to close after the guest
/// side ended (sandboxd's bound).
const CLIENT_CLOSE_WAIT: Duration = Duration::from_secs(30);

type Conn = Option<Extension<ConnCtl>>;
type Seq = Option<Extension<LogSeq>>;

pub(super) async fn hibernate(
    State(sim): State<Arc<Sim>>,
    method: Method,
    headers: HeaderMap,
    Path(id): Path<String>,
    conn: Conn,
    seq: Seq,
) -> Response {
    if method != Method::POST {
        return method_not_allowed("POST");
    }
    let call = Call::Hibernate { id: &id };
    let outcome = faults::dispatch(&sim, auth(&headers).as_deref(), call).await;
    deliver(&sim, outcome, conn, seq).await
}

pub(super) async fn wake(
    State(sim): State<Arc<Sim>>,
    method: Method,
    headers: HeaderMap,
    Path(id): Path<String>,
    conn: Conn,
    seq: Seq,
) -> Response {
    if method != Method::POST {
        return method_not_allowed("POST");
    }
    let call = Call::Wake { id: &id };
    let outcome = faults::dispatch(&sim, auth(&headers).as_deref(), call).await;
    deliver(&sim, outcome, conn, seq).await
}

pub(super) async fn renew(
    State(sim): State<Arc<Sim>>,
    method: Method,
    headers: HeaderMap,
    Path(id): Path<String>,
    conn: Conn,
    seq: Seq,
    body: Bytes,
) -> Response {
    if method != Method::POST {
        return method_not_allowed("POST");
    }
    let call = Call::Renew {
        id: &id,
        body: &body,
    };
    let outcome = faults::dispatch(&sim, auth(&headers).as_deref(), call).await;
    deliver(&sim, outcome, conn, seq).await
}

pub(super) async fn exec(
    State(sim): State<Arc<Sim>>,
    method: Method,
    headers: HeaderMap,
    Path(id): Path<String>,
    conn: Conn,
    seq: Seq,
    body: Bytes,
) -> Response {
    if method != Method::POST {
        return method_not_allowed("POST");
    }
    let call = Call::Exec {
        id: &id,
        body: &body,
    };
    let outcome = faults::dispatch(&sim, auth(&headers).as_deref(), call).await;
    deliver(&sim, outcome, conn, seq).await
}

pub(super) async fn get_sandbox(
    State(sim): State<Arc<Sim>>,
    method: Method,
    headers: HeaderMap,
    Path(id): Path<String>,
    conn: Conn,
    seq: Seq,
) -> Response {
    if !is_get(&method) {
        return method_not_allowed(GET_ALLOW);
    }
    let call = Call::Get { id: &id };
    let outcome = faults::dispatch(&sim, auth(&headers).as_deref(), call).await;
    deliver(&sim, outcome, conn, seq).await
}

pub(super) async fn stats(
    State(sim): State<Arc<Sim>>,
    method: Method,
    headers: HeaderMap,
    Path(id): Path<String>,
    conn: Conn,
    seq: Seq,
) -> Response {
    if !is_get(&method) {
        return method_not_allowed(GET_ALLOW);
    }
    let call = Call::Stats { id: &id };
    let outcome = faults::dispatch(&sim, auth(&headers).as_deref(), call).await;
    deliver(&sim, outcome, conn, seq).await
}

pub(super) async fn owner(
    State(sim): State<Arc<Sim>>,
    method: Method,
    headers: HeaderMap,
    Path(id): Path<String>,
    conn: Conn,
    seq: Seq,
) -> Response {
    if !is_get(&method) {
        return method_not_allowed(GET_ALLOW);
    }
    let call = Call::Owner { id: &id };
    let outcome = faults::dispatch(&sim, auth(&headers).as_deref(), call).await;
    deliver(&sim, outcome, conn, seq).await
}

fn upgrade_header(headers: &HeaderMap) -> Option<String> {
    headers
        .get(UPGRADE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// A refusal before the upgrade; a 426 names the protocol expected.
async fn refuse(
    sim: &Sim,
    outcome: Outcome,
    proto: &'static str,
    conn: Conn,
    seq: Seq,
) -> Response {
    let is_426 = outcome.reply.status == 426;
    let mut resp = deliver(sim, outcome, conn, seq).await;
    if is_426 {
        resp.headers_mut()
            .insert(UPGRADE, HeaderValue::from_static(proto));
    }
    resp
}

/// `101 Switching Protocols` with `Upgrade: <proto>`, `Connection: Upgrade`.
fn switching(proto: &'static str) -> Response {
    let mut resp = Response::new(AxumBody::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    resp.headers_mut()
        .insert(UPGRADE, HeaderValue::from_static(proto));
    resp.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    resp
}

/// Run the relay on the upgraded connection; every relay ends when the
/// simulator kills its connections (a node shutdown force-closes relays).
fn spawn_relay<F, Fut>(sim: &Arc<Sim>, on_upgrade: OnUpgrade, grant: RelayGrant, relay: F)
where
    F: FnOnce(TokioIo<hyper::upgrade::Upgraded>, &RelayGrant) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let sim = Arc::clone(sim);
    let mut kill = sim.kill.subscribe();
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                tokio::select! {
                    () = relay(TokioIo::new(upgraded), &grant) => {}
                    _ = kill.changed() => debug!(vm = %grant.vm.id, "sandboxd-sim: relay killed"),
                }
            }
            Err(e) => debug!(error = %e, "sandboxd-sim: upgrade failed"),
        }
        sim.relay_closed(&grant);
    });
}

pub(super) async fn agent_relay(
    State(sim): State<Arc<Sim>>,
    Path(id): Path<String>,
    conn: Conn,
    seq: Seq,
    mut req: Request,
) -> Response {
    if !is_get(req.method()) {
        return method_not_allowed(GET_ALLOW);
    }
    let headers = req.headers().clone();
    let grant = match faults::open_relay(
        &sim,
        auth(&headers).as_deref(),
        upgrade_header(&headers).as_deref(),
        Relay::Agent { id: &id },
    )
    .await
    {
        Ok(g) => g,
        Err(outcome) => return refuse(&sim, outcome, "silkd", conn, seq).await,
    };
    let Some(on_upgrade) = req.extensions_mut().remove::<OnUpgrade>() else {
        return refuse(
            &sim,
            Reply::error(500, "connection cannot be upgraded").into(),
            "silkd",
            conn,
            seq,
        )
        .await;
    };
    let cfg = AgentConfig {
        shell: sim.agent_shell(),
    };
    spawn_relay(&sim, on_upgrade, grant, move |io, grant| {
        agent::serve(std::sync::Arc::clone(&grant.vm), io, cfg)
    });
    switching("silkd")
}

pub(super) async fn port_relay(
    State(sim): State<Arc<Sim>>,
    Path((id, port)): Path<(String, String)>,
    conn: Conn,
    seq: Seq,
    mut req: Request,
) -> Response {
    if !is_get(req.method()) {
        return method_not_allowed(GET_ALLOW);
    }
    let headers = req.headers().clone();
    let mut grant = match faults::open_relay(
        &sim,
        auth(&headers).as_deref(),
        upgrade_header(&headers).as_deref(),
        Relay::Port {
            id: &id,
            port: &port,
        },
    )
    .await
    {
        Ok(g) => g,
        Err(outcome) => return refuse(&sim, outcome, "tcp", conn, seq).await,
    };
    let Some(on_upgrade) = req.extensions_mut().remove::<OnUpgrade>() else {
        return refuse(
            &sim,
            Reply::error(500, "connection cannot be upgraded").into(),
            "tcp",
            conn,
            seq,
        )
        .await;
    };
    let Some(guest) = grant.guest.take() else {
        return refuse(
            &sim,
            Reply::error(502, "guest port unreachable").into(),
            "tcp",
            conn,
            seq,
        )
        .await;
    };
    spawn_relay(&sim, on_upgrade, grant, move |io, _| splice(io, guest));
    switching("tcp")
}

/// Copy both ways, passing each side's EOF on as a half-close; once the
/// guest has closed, wait at most [`CLIENT_CLOSE_WAIT`] for the client.
/// A copy error closes both sides.
async fn splice<C, G>(client: C, guest: G)
where
    C: AsyncRead + AsyncWrite + Send,
    G: AsyncRead + AsyncWrite + Send,
{
    let (mut client_r, mut client_w) = tokio::io::split(client);
    let (mut guest_r, mut guest_w) = tokio::io::split(guest);
    let up = async {
        let copied = tokio::io::copy(&mut client_r, &mut guest_w).await;
        let _ = guest_w.shutdown().await;
        copied
    };
    let down = async {
        let copied = tokio::io::copy(&mut guest_r, &mut client_w).await;
        let _ = client_w.shutdown().await;
        copied
    };
    tokio::pin!(up, down);
    tokio::select! {
        r = &mut up => {
            if r.is_ok() {
                let _ = down.await;
            }
        }
        r = &mut down => {
            if r.is_ok() {
                let _ = tokio::time::timeout(CLIENT_CLOSE_WAIT, up).await;
            }
        }
    }
}
