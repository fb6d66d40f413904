//! One lock per Pod key, taken by every reconcile and by each unit of work
//! of the side loops (vanished sweep, lease expiry, preserved-claim
//! recheck, stray returns), so a release and an adoption of one key never
//! interleave. kube-runtime already runs one reconcile per Pod at a time;
//! this also orders them against the side loops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

type Locks = Arc<Mutex<HashMap<String, Arc<AsyncMutex<()>>>>>;

/// The locks of the keys someone holds or waits for; a key's entry goes
/// when its last holder is done.
#[derive(Debug, Default)]
pub struct KeyLocks(Locks);

/// A held key; dropping it lets the next one in.
#[derive(Debug)]
pub struct KeyGuard {
    guard: Option<OwnedMutexGuard<()>>,
    key: String,
    locks: Locks,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl KeyLocks {
    /// Waits until `key` is free, and holds it.
    pub async fn lock(&self, key: &str) -> KeyGuard {
        let mutex = Arc::clone(lock(&self.0).entry(key.to_string()).or_default());
        KeyGuard {
            guard: Some(mutex.lock_owned().await),
            key: key.to_string(),
            locks: Arc::clone(&self.0),
        }
    }

    /// Keys with a holder or a waiter (tests).
    pub fn len(&self) -> usize {
        lock(&self.0).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut locks = lock(&self.locks);
        // Only the map holds it: nobody holds or waits for the key.
        if locks
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            locks.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_holder_per_key_and_entries_go_with_the_last() {
        let locks = Arc::new(KeyLocks::default());
        let a = locks.lock("ns/a").await;
        let b = locks.lock("ns/b").await;
        assert_eq!(locks.len(), 2, "other keys are not held up");
        assert!(!locks.is_empty(), "two keys are held");
        let waiter = tokio::spawn({
            let locks = Arc::clone(&locks);
            async move { locks.lock("ns/a").await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "ns/a is held");
        drop(a);
        let again = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("let in")
            .expect("join");
        assert_eq!(locks.len(), 2);
        drop(again);
        drop(b);
        assert!(
            locks.is_empty(),
            "entries are dropped with their last holder"
        );
    }
}
