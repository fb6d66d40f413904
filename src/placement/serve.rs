//! The webhook server in the daemon: its listener bound and certificate
//! loaded at start-up (a failure there stops start-up), then three tasks:
//! the HTTPS server, the NodeInventory watch and the certificate watch.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::WebhookConfig;
use crate::error::{Error, Result};
use crate::kubelet::server::serve_as;
use crate::kubelet::tls::{KubeletTls, RELOAD_POLL_INTERVAL};
use crate::metrics::Metrics;

use super::decide::Settings;
use super::watch::{self, Index};
use super::webhook::{Webhook, router};

/// A webhook ready to serve.
pub struct Server {
    listener: TcpListener,
    tls: KubeletTls,
    index: Arc<Index>,
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
            index: Arc::new(Index::default()),
            settings: Settings {
                tolerations: cfg.tolerations,
            },
        })
    }

    /// The HTTPS server (ends with an error only when it cannot serve),
    /// and the loops that keep it current: the NodeInventory watch (in
    /// `group`: `--inventory-group`, or `None` to find the served one) and
    /// the certificate files' watch. Both run until `stop`.
    pub fn run(
        self,
        client: kube::Client,
        group: Option<String>,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) -> Result<(
        impl Future<Output = Result<()>> + Send + 'static,
        impl Future<Output = ()> + Send + 'static,
    )> {
        let config = self.tls.server_config(None)?;
        let app = router(Arc::new(Webhook {
            index: Arc::clone(&self.index),
            settings: self.settings,
        }));
        let server = serve_as(
            "placement webhook",
            self.listener,
            config,
            app,
            stop.clone(),
        );
        let certs = self.tls.watch(RELOAD_POLL_INTERVAL, metrics, stop.clone());
        let inventories = watch::run(self.index, client, group, stop);
        let loops = async move {
            tokio::join!(certs, inventories);
        };
        Ok((server, loops))
    }
}
