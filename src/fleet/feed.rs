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

use super::reading::{FailureKind, Reading, Sample};

/// Reads `/v1/info` and sends each reading (every read wakes the
/// receivers; the Node writes only what changed).
pub struct InfoFeed {
    sandboxd: SandboxdClient,
    tx: watch::Sender<Sample>,
}

impl InfoFeed {
    /// The feed and a receiver of its readings ([`Reading::NotYet`] until
    /// the first read).
    pub fn new(sandboxd: SandboxdClient) -> (InfoFeed, watch::Receiver<Sample>) {
        let (tx, rx) = watch::channel(Sample {
            seq: 0,
            reading: Reading::NotYet,
        });
        (InfoFeed { sandboxd, tx }, rx)
    }

    /// Another receiver of the same readings.
    pub fn subscribe(&self) -> watch::Receiver<Sample> {
        self.tx.subscribe()
    }

    /// One read, shared.
    pub async fn read_once(&self) {
        let read = self
            .sandboxd
            .info()
            .await
            .map_err(|e| (FailureKind::of(&e), e.to_string()));
        let (seq, was) = {
            let s = self.tx.borrow();
            (s.seq, s.reading.clone())
        };
        let now = was.next(read);
        match (&was, &now) {
            (Reading::Read(_) | Reading::NotYet, Reading::Failed { message, .. }) => {
                warn!(error = %message, "sandboxd info failed (the Node says unknown, not empty)")
            }
            (Reading::Failed { .. }, Reading::Read(_)) => info!("sandboxd info answers again"),
            _ => {}
        }
        self.tx.send_replace(Sample {
            seq: seq.wrapping_add(1),
            reading: now,
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

/// A first failed read is confirmed this soon (the Node is tainted
/// unreachable only after two in a row), not a whole interval later.
pub const CONFIRM_AFTER: Duration = Duration::from_millis(500);

impl Turn for InfoFeed {
    async fn turn(&mut self, _: &Beat) -> Next {
        self.read_once().await;
        confirm_soon(&self.tx.borrow().reading)
    }
}

/// When the next read is due after `reading`.
fn confirm_soon(reading: &Reading) -> Next {
    match reading {
        Reading::Failed { consecutive: 1, .. } => Next::After(CONFIRM_AFTER),
        _ => Next::Period,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_failure_is_read_again_soon_then_the_period_resumes() {
        let failed = |consecutive| Reading::Failed {
            kind: FailureKind::Unreachable,
            message: "refused".into(),
            consecutive,
            last: None,
        };
        assert!(matches!(confirm_soon(&failed(1)), Next::After(d) if d == CONFIRM_AFTER));
        assert!(matches!(confirm_soon(&failed(2)), Next::Period));
        assert!(matches!(confirm_soon(&Reading::NotYet), Next::Period));
    }
}
