//! The kubelet HTTPS API (docs/architecture.md, "Kubelet API"): axum over
//! rustls, TLS ≥ 1.2, HTTP/1.1 and h2, a provided or self-signed serving
//! certificate reloaded when its files change, and kubelet-style
//! authentication/authorization in front of every route but `/healthz`.
//!
//! `main` uses [`KubeletApi::prepare`] (TLS material, client CA, router,
//! bound listener — every start-up failure surfaces here) and then
//! [`KubeletApi::run`] until shutdown. The pieces ([`router`],
//! [`server::serve`], [`KubeletTls`], [`auth::KubeletAuth`]) are public for
//! tests and other wiring.

pub mod auth;
pub mod client_ca;
pub mod exec;
pub mod limits;
pub mod pod_address;
pub mod port_forward;
pub mod recheck;
pub mod relays;
pub mod routes;
pub mod sandbox;
pub mod server;
pub mod state;
pub mod stats;
pub mod stream;
pub mod streaming;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use crate::pods::source::PodSource;
pub use auth::{KubeletAuth, PeerIdentity, UserInfo};
pub use client_ca::load_client_ca;
pub use relays::SandboxdPlane;
pub use routes::{KubeletState, router};
pub use sandbox::{ClaimedSandboxes, DataPlane, SandboxRef, Sandboxes};
pub use server::serve;
pub use state::Streaming;
pub use tls::KubeletTls;

use crate::config::KubeletSettings;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// A kubelet API ready to serve: listener bound, TLS and auth loaded.
pub struct KubeletApi {
    listener: TcpListener,
    tls: KubeletTls,
    server_config: Arc<rustls::ServerConfig>,
    router: axum::Router,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for KubeletApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletApi")
            .field("addr", &self.listener.local_addr().ok())
            .finish_non_exhaustive()
    }
}

impl KubeletApi {
    /// Load the serving certificate (or self-sign), read the client CA
    /// (when auth is on: `--client-ca-file` or the cluster's
    /// extension-apiserver-authentication ConfigMap), build the router and
    /// bind `--listen-addr`. Every error here is a start-up error.
    #[tracing::instrument(skip_all, fields(node = %cfg.node_name, addr = %cfg.listen_addr))]
    pub async fn prepare(
        cfg: &KubeletSettings,
        client: &kube::Client,
        pods: Arc<dyn PodSource>,
        metrics: Arc<Metrics>,
        streaming: Option<Streaming>,
    ) -> Result<KubeletApi> {
        let tls = KubeletTls::init(&cfg.tls, &cfg.node_name, cfg.node_ip.as_deref())?;
        let client_ca = load_client_ca(&cfg.auth, client).await?;
        let server_config = tls.server_config(client_ca)?;
        let auth = cfg.auth.enabled.then(|| {
            Arc::new(KubeletAuth::with_client(
                client.clone(),
                cfg.node_name.clone(),
                cfg.auth.anonymous,
            ))
        });
        let router = router(KubeletState {
            node_name: cfg.node_name.clone(),
            pods,
            auth,
            metrics: Arc::clone(&metrics),
            streaming,
        });
        let listener = cfg.listen_addr.bind().await.map_err(|e| {
            Error::io(
                format!(
                    "bind the kubelet API on --listen-addr (env VK_LISTEN_ADDR)={}; free the \
                     port or choose another",
                    cfg.listen_addr
                ),
                e,
            )
        })?;
        Ok(KubeletApi {
            listener,
            tls,
            server_config,
            router,
            metrics,
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serve, and watch the certificate files, until `stop` is cancelled.
    pub async fn run(self, stop: CancellationToken) -> Result<()> {
        let watcher = self.tls.clone().watch(
            tls::RELOAD_POLL_INTERVAL,
            Arc::clone(&self.metrics),
            stop.clone(),
        );
        let server =
            server::serve_on_own_thread(self.listener, self.server_config, self.router, stop);
        let ((), result) = tokio::join!(watcher, server);
        result
    }
}
