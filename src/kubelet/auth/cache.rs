//! A small TTL map for review answers.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Entries kept per cache before it is pruned.
const CACHE_MAX_ENTRIES: usize = 4096;

/// A small TTL map; pruned of expired entries (or cleared) when full.
pub(super) struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    pub(super) fn new() -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock().ok()?;
        let (expires, value) = entries.get(key)?;
        (Instant::now() < *expires).then(|| value.clone())
    }

    pub(super) fn put(&self, key: K, value: V, ttl: Duration) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        let now = Instant::now();
        if entries.len() >= CACHE_MAX_ENTRIES {
            entries.retain(|_, (expires, _)| *expires > now);
            if entries.len() >= CACHE_MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(key, (now + ttl, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_cache_expires_and_prunes() {
        let c: TtlCache<u32, u32> = TtlCache::new();
        c.put(1, 10, Duration::from_secs(60));
        c.put(2, 20, Duration::ZERO);
        assert_eq!(c.get(&1), Some(10));
        assert_eq!(c.get(&2), None);
        for i in 0..(CACHE_MAX_ENTRIES as u32 + 10) {
            c.put(i, i, Duration::from_secs(60));
        }
        assert!(c.entries.lock().expect("cache lock not poisoned").len() <= CACHE_MAX_ENTRIES);
    }
}
