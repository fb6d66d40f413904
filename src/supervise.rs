//! The daemon's task supervisor: the long-running tasks and loops of one
//! process, the token that stops them, and the shutdown that leaves a
//! plain claims file behind.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::claims::ClaimsStore;
use crate::error::{Error, Result};

/// The tasks `run` supervises, and the token that stops them: each ends
/// only on shutdown, or with the error that stops the process.
pub struct Tasks {
    set: tokio::task::JoinSet<Result<()>>,
    stop: CancellationToken,
}

impl Tasks {
    pub fn new() -> Tasks {
        Tasks {
            set: tokio::task::JoinSet::new(),
            stop: CancellationToken::new(),
        }
    }

    /// A task that ends with an error only when the process must stop.
    pub fn spawn(&mut self, fut: impl Future<Output = Result<()>> + Send + 'static) {
        self.set.spawn(fut);
    }

    /// A loop that retries its own failures and ends only when told to
    /// stop; ending is reported like any task's.
    pub fn spawn_loop(&mut self, fut: impl Future<Output = ()> + Send + 'static) {
        self.set.spawn(async move {
            fut.await;
            Ok(())
        });
    }

    pub fn stop(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Until a signal, or until a task ends (the error that stops the
    /// process).
    pub async fn supervise(&mut self, signal: impl Future<Output = Result<()>>) -> Result<()> {
        tokio::select! {
            r = signal => r,
            Some(done) = self.set.join_next() => Err(match done {
                Ok(Ok(())) => Error::Internal("a background task ended unexpectedly".into()),
                Ok(Err(e)) => e,
                Err(e) => Error::Internal(format!("a background task panicked: {e}")),
            }),
        }
    }

    /// Shutdown never evicts, releases or deletes: stop the loops, leave a
    /// plain claims.json behind.
    pub async fn shut_down(mut self, claims: &ClaimsStore) {
        self.stop.cancel();
        let drain = async {
            while let Some(r) = self.set.join_next().await {
                if let Ok(Err(e)) = r {
                    error!(error = %e, "task failed during shutdown");
                }
            }
        };
        if tokio::time::timeout(Duration::from_secs(5), drain)
            .await
            .is_err()
        {
            info!("some tasks did not stop within 5 s; exiting anyway");
        }
        // An operator can roll back to the Go build on the plain file. If
        // this fails the journal still holds every change and the next
        // start replays it: nothing is lost, so the shutdown still succeeds.
        if let Err(e) = claims.compact().await {
            warn!(
                error = %e,
                "final compaction of the claims state failed; the journal beside it still holds \
                 every change and is replayed at the next start (roll back to the Go build only \
                 after a clean compaction)"
            );
        }
    }
}

impl Default for Tasks {
    fn default() -> Tasks {
        Tasks::new()
    }
}
