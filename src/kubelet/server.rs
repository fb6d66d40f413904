//! Serving a router over TLS: tokio-rustls for the handshake, hyper-util's
//! auto builder for HTTP/1.1 and h2 (ALPN), one task per connection, a
//! 30 s read-header timeout (a client that never finishes its headers cannot
//! hold a connection), TCP keep-alive as Go's listeners have it, graceful
//! shutdown.
//!
//! The daemon serves it on a thread of its own ([`serve_on_own_thread`]):
//! one exec is a TLS handshake, a request, an upgrade, a relay to sandboxd
//! and a handful of tasks passing frames; on one single-threaded runtime
//! none of those hand-offs wakes another thread (docs/streaming.md).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::error::{Error, Result};
use crate::kubelet::auth::{PeerIdentity, UserInfo};
use crate::kubelet::stream::watch::{ConnectionFd, Sessions};

/// Longest a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a request's headers may take to arrive (HTTP/1.1).
pub const READ_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long open connections and upgraded sessions get to finish after
/// shutdown starts.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// TCP keep-alive of accepted connections, as Go's listeners (and so the
/// kubelet's) set it: a probe after 15 s without traffic, then every 15 s,
/// 9 unanswered probes and the connection fails. A client whose host
/// vanished is then noticed even by a session that only waits.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(15);
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);
pub const KEEPALIVE_PROBES: u32 = 9;

/// Turn on TCP keep-alive on `tcp` with the figures above.
pub fn keep_alive(tcp: &TcpStream) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = tcp.as_raw_fd();
    let secs = |d: Duration| libc::c_int::try_from(d.as_secs()).unwrap_or(libc::c_int::MAX);
    for (level, name, value) in [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, secs(KEEPALIVE_IDLE)),
        (
            libc::IPPROTO_TCP,
            libc::TCP_KEEPINTVL,
            secs(KEEPALIVE_INTERVAL),
        ),
        (
            libc::IPPROTO_TCP,
            libc::TCP_KEEPCNT,
            libc::c_int::try_from(KEEPALIVE_PROBES).unwrap_or(9),
        ),
    ] {
        // SAFETY: a valid socket and a c_int option value of its size.
        let r = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                std::ptr::from_ref(&value).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Serve `router` over TLS on `listener` until `stop` is cancelled, then
/// let open connections finish, and end the upgraded sessions (exec,
/// port-forward: told by `stop`, each kills its process or closes its
/// relays), waiting for both at most [`SHUTDOWN_GRACE`]. Each request
/// carries a [`PeerIdentity`] extension with the identity of a verified
/// client certificate, if the client sent one, and the server's
/// [`Sessions`].
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    stop: CancellationToken,
) -> Result<()> {
    serve_as("kubelet API", listener, tls, router, stop).await
}

/// [`serve`] for another server on the same terms (the placement
/// webhook); `name` says which in logs.
pub async fn serve_as(
    name: &'static str,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    stop: CancellationToken,
) -> Result<()> {
    let local = listener.local_addr().ok();
    tracing::info!(addr = ?local, "{name} listening (TLS)");
    let acceptor = TlsAcceptor::from(tls);
    let mut connections = JoinSet::new();
    let sessions = Sessions {
        tracker: tokio_util::task::TaskTracker::new(),
        shutdown: stop.clone(),
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    connections.spawn(serve_connection(
                        name,
                        acceptor.clone(),
                        tcp,
                        peer,
                        router.clone(),
                        stop.clone(),
                        sessions.clone(),
                    ));
                }
                Err(e) => {
                    // E.g. too many open files: back off instead of spinning.
                    tracing::warn!(error = %e, "{name} accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    sessions.tracker.close();
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
        sessions.tracker.wait().await;
    })
    .await;
    if drained.is_err() {
        tracing::info!(
            open = connections.len(),
            sessions = sessions.tracker.len(),
            "{name} connections or sessions still open after the grace period; closing them"
        );
        connections.shutdown().await;
    }
    tracing::info!("{name} stopped");
    Ok(())
}

/// [`serve`] on a thread of its own, named `kubelet-api`, with a
/// single-threaded runtime: every task of a connection (the handshake, the
/// request, a streaming session, its relay to sandboxd) then runs on that
/// thread, and passing a frame between them costs no wake-up of another
/// thread. Returns when `serve` does.
pub async fn serve_on_own_thread(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    stop: CancellationToken,
) -> Result<()> {
    let listener = listener
        .into_std()
        .map_err(|e| Error::io("hand the kubelet API listener to its thread", e))?;
    let span = tracing::Span::current();
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("kubelet-api".into())
        .spawn(move || {
            let _entered = span.enter();
            let served = crate::runtime::build(crate::runtime::Threads::Current).and_then(|rt| {
                rt.block_on(async move {
                    let listener = TcpListener::from_std(listener)
                        .map_err(|e| Error::io("register the kubelet API listener", e))?;
                    serve(listener, tls, router, stop).await
                })
            });
            let _ = done.send(served);
        })
        .map_err(|e| Error::io("start the kubelet API thread", e))?;
    result.await.unwrap_or_else(|_| {
        Err(Error::Internal(
            "the kubelet API thread ended without a result (it panicked)".into(),
        ))
    })
}

async fn serve_connection(
    name: &'static str,
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
    router: Router,
    stop: CancellationToken,
    sessions: Sessions,
) {
    // Streams write small frames back to back (a status after the last
    // output, a terminal's echo): without this, Nagle holds the second until
    // the peer's delayed ACK, up to 40 ms each time. Go's kubelet has it on.
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "{name}: TCP_NODELAY not set");
    }
    if let Err(e) = keep_alive(&tcp) {
        tracing::debug!(%peer, error = %e, "{name}: TCP keep-alive not set");
    }
    // Streaming sessions watch the socket for a hang-up (stream::watch).
    let socket = ConnectionFd(std::os::fd::AsRawFd::as_raw_fd(&tcp));
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "{name} TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "{name} TLS handshake timed out");
            return;
        }
    };
    let identity = PeerIdentity(
        tls.get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| UserInfo::from_certificate(leaf.as_ref())),
    );
    let service = router.map_request(move |mut req: http::Request<Incoming>| {
        req.extensions_mut().insert(identity.clone());
        req.extensions_mut().insert(socket);
        req.extensions_mut().insert(sessions.clone());
        req
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(READ_HEADER_TIMEOUT);
    // With upgrades: exec, attach and port-forward switch protocols.
    let conn = builder
        .serve_connection_with_upgrades(TokioIo::new(tls), TowerToHyperService::new(service));
    tokio::pin!(conn);
    tokio::select! {
        res = conn.as_mut() => {
            if let Err(e) = res {
                tracing::debug!(%peer, error = %e, "{name} connection ended with an error");
            }
        }
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.as_mut().await;
        }
    }
}
