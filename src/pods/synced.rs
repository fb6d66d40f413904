//! Whether the Pod watch has delivered its initial list.

use tokio::sync::watch;

/// Whether the Pod watch has delivered its initial list. Every waiter is
/// woken when it has (kube-runtime's own readiness signal wakes only one of
/// several concurrent waiters, so waiting on it cost start-up up to a
/// polling period).
#[derive(Debug, Clone)]
pub struct Synced(watch::Receiver<bool>);

/// The watch's side of [`Synced`]: told once the initial list is applied.
#[derive(Debug)]
pub struct SyncedTx(watch::Sender<bool>);

impl SyncedTx {
    pub fn synced(&self) {
        self.0.send_replace(true);
    }
}

impl Synced {
    /// Not synced yet, and the handle that says when it is.
    pub fn pending() -> (SyncedTx, Synced) {
        let (tx, rx) = watch::channel(false);
        (SyncedTx(tx), Synced(rx))
    }

    /// Resolves once the initial list is in the cache; never, if the watch
    /// ends first (shutting down).
    pub async fn wait(&self) {
        let mut rx = self.0.clone();
        if rx.wait_for(|synced| *synced).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Already synced (tests).
    pub fn ready() -> Synced {
        let (tx, rx) = watch::channel(true);
        drop(tx);
        Synced(rx)
    }
}
