//! The one reader of sandboxd's `GET /v1/info`: every `--sandboxd-info-
//! interval` it reads and shares the reading on a watch channel, which the
//! Node status and the NodeInventory publisher both take from (no second
//! poller of the same endpoint).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use crate::health::Health;
use crate::periodic::{Beat, Next, Periodic, Turn};
use crate::sandboxd::SandboxdClient;

use super::reading::{FailureKind, Reading};

/// Reads `/v1/info` and sends each reading (only a changed one wakes the
/// receivers).
pub struct InfoFeed {
    sandboxd: SandboxdClient,
    tx: watch::Sender<Reading>,
}

impl InfoFeed {
    /// The feed and a receiver of its readings ([`Reading::NotYet`] until
    /// the first read).
    pub fn new(sandboxd: SandboxdClient) -> (InfoFeed, watch::Receiver<Reading>) {
        let (tx, rx) = watch::channel(Reading::NotYet);
        (InfoFeed { sandboxd, tx }, rx)
    }

    /// Another receiver of the same readings.
    pub fn subscribe(&self) -> watch::Receiver<Reading> {
        self.tx.subscribe()
    }

    /// One read, shared when the reading changed.
    pub async fn read_once(&self) {
        let read = self
            .sandboxd
            .info()
            .await
            .map_err(|e| (FailureKind::of(&e), e.to_string()));
        let was = self.tx.borrow().clone();
        let now = was.next(read);
        match (&was, &now) {
            (Reading::Read(_) | Reading::NotYet, Reading::Failed { message, .. }) => {
                warn!(error = %message, "sandboxd info failed (the Node says unknown, not empty)")
            }
            (Reading::Failed { .. }, Reading::Read(_)) => info!("sandboxd info answers again"),
            _ => {}
        }
        self.tx.send_if_modified(|r| {
            let changed = *r != now;
            *r = now;
            changed
        });
    }

    /// Reads now and then every `interval` until `stop`.
    pub async fn run(self, interval: Duration, health: Arc<Health>, stop: CancellationToken) {
        Periodic::new("sandboxd info", interval)
            .run(Some(&health), &stop, self)
            .instrument(info_span!("sandboxd info"))
            .await
    }
}

impl Turn for InfoFeed {
    async fn turn(&mut self, _: &Beat) -> Next {
        self.read_once().await;
        Next::Period
    }
}
