//! The HTTP client under the Kubernetes client.
//!
//! kube's default transport speaks HTTP/1.1 only, so every request in
//! flight holds a TLS connection of its own: a burst of 64 reconciles
//! opened 64 connections to the apiserver, and their buffers stayed
//! allocated while the pool kept them idle for 90 s (measured with
//! heaptrack after a 2000-Pod burst: about 5 MiB of the 8.8 MiB still
//! live). This transport offers HTTP/2 as client-go does: every request
//! and watch shares one connection, which is pinged while idle so a dead
//! connection is noticed without waiting on a request. A server that does
//! not offer HTTP/2 gets HTTP/1.1 with at most [`MAX_IDLE_HTTP1`] idle
//! connections kept.
//!
//! Whatever the protocol, a connection that stays silent is given up:
//! every read waits at most [`READ_TIMEOUT`] (kube's `read_timeout` when
//! the kubeconfig's `Config` sets one), longer than the server-side timeout
//! of a watch, and TCP keep-alive probes close a connection whose peer has
//! vanished. Without them an HTTP/1.1 watch on a half-open connection (a
//! NAT or load balancer that dropped it, a host gone without a RST) waited
//! for ever: HTTP/2 pings do not exist on HTTP/1.1.
//!
//! Everything else is kube's own: the cluster URL, the credentials (token,
//! client certificate, exec plugins), extra headers such as the
//! User-Agent, TLS trust and server name from the kubeconfig, and the
//! server retry policy (429/503/504). A kubeconfig with a proxy keeps
//! kube's transport, which implements proxies.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::Config;
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use tower::util::BoxService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tracing::debug;

use crate::{Error, Result};

/// A ping goes out after this long without a frame from the apiserver…
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// …and the connection is closed if its answer takes longer (client-go's
/// `ReadIdleTimeout` and `PingTimeout` have the same purpose).
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(15);
/// Idle HTTP/1.1 connections kept (when the server does not speak HTTP/2).
pub const MAX_IDLE_HTTP1: usize = 8;
/// The longest a connection may stay silent while a read waits on it: just
/// above the 290 s a watch asks the server to end it after (kube's
/// watcher), so a healthy watch always ends first. A write restarts it (a
/// pooled connection's idle time does not count against the next reply).
pub const READ_TIMEOUT: Duration = Duration::from_secs(295);
/// TCP keep-alive: the first probe after this long without traffic…
pub const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// …then one every 10 s, and the connection is closed after 3 unanswered.
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
pub const TCP_KEEPALIVE_RETRIES: u32 = 3;

type Stack = BoxService<http::Request<Body>, http::Response<Box<DynBody>>, BoxError>;

/// A kube `ClientBuilder` over this transport (or kube's own when the
/// kubeconfig names a proxy).
pub fn builder(cfg: Config) -> Result<ClientBuilder<Stack>> {
    let context = |e: kube::Error| Error::kube("build the Kubernetes client", e);
    if cfg.proxy_url.is_some() {
        debug!("a proxy is configured: kube's HTTP/1.1 transport is used");
        return ClientBuilder::try_from(cfg).map_err(context);
    }
    let https = connector(&cfg).map_err(context)?;
    let mut timed = hyper_timeout::TimeoutConnector::new(https);
    timed.set_read_timeout(Some(cfg.read_timeout.unwrap_or(READ_TIMEOUT)));
    timed.set_write_timeout(cfg.write_timeout);
    timed.set_reset_reader_on_write(true);
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_max_idle_per_host(MAX_IDLE_HTTP1)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(timed);
    let retry = cfg
        .default_retry
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(cfg.base_uri_layer())
        .option_layer(retry)
        .option_layer(cfg.auth_layer().map_err(context)?)
        .layer(cfg.extra_headers_layer().map_err(context)?)
        .map_err(BoxError::from)
        .service(hyper)
        .map_response(|r| {
            r.map(|body| {
                Box::new(http_body_util::BodyExt::map_err(body, BoxError::from)) as Box<DynBody>
            })
        })
        .boxed();
    Ok(ClientBuilder::new(service, cfg.default_namespace.clone()))
}

/// The TCP connector: no Nagle delay, keep-alive probes, connect bounded
/// by the kubeconfig's `connect_timeout`.
fn tcp(cfg: &Config) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    // Without it, Nagle's algorithm holds a request's DATA frame until the
    // server ACKs its HEADERS frame, which Linux delays by up to 40 ms: the
    // idle claim path's p50 went from 14 to 51 ms (make bench).
    http.set_nodelay(true);
    http.set_keepalive(Some(TCP_KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(TCP_KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(TCP_KEEPALIVE_RETRIES));
    http.set_connect_timeout(cfg.connect_timeout);
    http
}

/// TLS from the kubeconfig (trust, client identity, server name), offering
/// HTTP/2 and HTTP/1.1; plain HTTP for an `http://` cluster URL.
fn connector(cfg: &Config) -> kube::Result<hyper_rustls::HttpsConnector<HttpConnector>> {
    let http = tcp(cfg);
    let tls = cfg.rustls_client_config()?;
    let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &cfg.tls_server_name {
        let name = rustls_pki_types::ServerName::try_from(name.clone()).map_err(|e| {
            kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e))
        })?;
        builder =
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    Ok(builder.enable_http1().enable_http2().wrap_connector(http))
}

#[cfg(test)]
pub(crate) mod tests;
