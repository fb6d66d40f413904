//! When an upgraded connection last carried anything: the streaming
//! sessions' idle timeout (docs/streaming.md, "Limits") reads it, the
//! session's reader and writer note each read and write. Cheap enough to
//! note on every read: one relaxed atomic store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

// tokio's clock: the std one outside tests, a paused one in them.
use tokio::time::Instant;

/// Shared between a session's tasks and whoever watches it for idleness.
#[derive(Debug, Clone)]
pub struct Activity {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    since: Instant,
    /// Milliseconds from `since` to the last activity.
    last: AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        Activity::new()
    }
}

impl Activity {
    /// Active now.
    pub fn new() -> Activity {
        Activity {
            inner: Arc::new(Inner {
                since: Instant::now(),
                last: AtomicU64::new(0),
            }),
        }
    }

    /// Something was read or written just now.
    pub fn note(&self) {
        let ms = u64::try_from(self.inner.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.inner.last.store(ms, Ordering::Relaxed);
    }

    /// How long since the last [`Activity::note`] (or the start).
    pub fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.inner.last.load(Ordering::Relaxed));
        self.inner.since.elapsed().saturating_sub(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_time_restarts_at_each_note() {
        let a = Activity::new();
        std::thread::sleep(Duration::from_millis(30));
        assert!(a.idle_for() >= Duration::from_millis(30));
        a.note();
        assert!(a.idle_for() < Duration::from_millis(25));
        let b = a.clone();
        std::thread::sleep(Duration::from_millis(30));
        assert!(b.idle_for() >= Duration::from_millis(30), "shared");
    }
}
