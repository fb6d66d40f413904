//! The webhook server in the daemon: its listener bound and certificate
//! loaded at start-up (a failure there stops start-up), then two tasks:
//! the HTTPS server and the certificate watch. It answers from the
//! NodeInventory index it is given (one watch per process, shared with the
//! Pod controller's check before a claim).

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::WebhookConfig;
use crate::error::{Error, Result};
use crate::kubelet::server::serve_as;
use crate::kubelet::tls::{KubeletTls, RELOAD_POLL_INTERVAL};
use crate::metrics::Metrics;

use super::decide::Settings;
use super::watch::Index;
use super::webhook::{Webhook, router};

/// A webhook ready to serve.
pub struct Server {
    listener: TcpListener,
    tls: KubeletTls,
    settings: Settings,
}

impl Server {
    /// Bind `--webhook-addr` and load the certificate pair.
    pub async fn prepare(cfg: &WebhookConfig) -> Result<Server> {
        let tls = KubeletTls::from_files(&cfg.cert, &cfg.key, "webhook")?;
        let listener = cfg.addr.bind().await.map_err(|e| {
            Error::io(
                format!(
                    "bind the placement webhook on --webhook-addr (env VK_WEBHOOK_ADDR)={}; free \
                     the port or choose another",
                    cfg.addr
                ),
                e,
            )
        })?;
        Ok(Server {
            listener,
            tls,
            settings: Settings {
                tolerations: cfg.tolerations,
            },
        })
    }

    /// The HTTPS server answering from `index` (ends with an error only
    /// when it cannot serve), and the certificate files' watch, until
    /// `stop`.
    pub fn run(
        self,
        index: Arc<Index>,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) -> Result<(
        impl Future<Output = Result<()>> + Send + 'static,
        impl Future<Output = ()> + Send + 'static,
    )> {
        let config = self.tls.server_config(None)?;
        let app = router(Arc::new(Webhook {
            index,
            settings: self.settings,
        }));
        let server = serve_as(
            "placement webhook",
            self.listener,
            config,
            app,
            stop.clone(),
        );
        let certs = self.tls.watch(RELOAD_POLL_INTERVAL, metrics, stop);
        Ok((server, certs))
    }
}
