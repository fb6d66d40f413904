//! Liveness and readiness, shared by every loop and served by the admin
//! port (`crate::admin`).
//!
//! The Pod watch calls [`Health::set_pod_watch_synced`], the Lease loop
//! [`Health::set_lease_ok`]; every loop that must keep turning (Lease
//! renewal, Node status, the Pod controller's side loops, the inventory
//! publisher, the orphan scan) registers a heartbeat with
//! [`Health::register_loop`] (through `crate::periodic`) and beats it each
//! turn and each unit of work, and every Pod reconcile holds a [`Working`]
//! guard while it runs, so `/livez` fails when a loop has stalled or a
//! reconcile hangs past its bound. Things that must keep moving without a
//! loop of their own (the Pod watch) register a progress probe with
//! [`Health::register_progress`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

// tokio's clock (the system's, unless a test pauses it).
use tokio::time::Instant;

/// A poisoned lock is still consistent here (single inserts, removes and
/// timestamp updates), so it is used as it is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Liveness and readiness shared by every loop and the admin server.
#[derive(Debug, Default)]
pub struct Health {
    pod_watch_synced: AtomicBool,
    lease_ok: AtomicBool,
    loops: Mutex<BTreeMap<&'static str, LoopState>>,
    /// Work in progress: id → (name, started, bound).
    working: Mutex<BTreeMap<u64, (&'static str, Instant, Duration)>>,
    next_work: AtomicU64,
    progress: Mutex<Vec<Progress>>,
}

/// How long something has gone without progress (`None`: nothing to
/// watch right now).
type Silence = Box<dyn Fn() -> Option<Duration> + Send + Sync>;

/// A progress probe: `/livez` fails while `silent` reports more than
/// `limit`.
struct Progress {
    name: &'static str,
    limit: Duration,
    silent: Silence,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("name", &self.name)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// How long past its period a loop may stay silent before `/livez` fails:
/// longer than any one turn can take with every call's deadline spent.
pub const STALL_MARGIN: Duration = Duration::from_secs(300);

/// A unit of work in progress (one Pod reconcile); dropping it ends it.
#[derive(Debug)]
pub struct Working {
    health: Arc<Health>,
    id: u64,
}

impl Drop for Working {
    fn drop(&mut self) {
        lock(&self.health.working).remove(&self.id);
    }
}

#[derive(Debug, Clone, Copy)]
struct LoopState {
    last: Instant,
    max_silence: Duration,
}

/// A loop's handle for reporting that it is still turning.
#[derive(Debug, Clone)]
pub struct LoopHeartbeat {
    health: Arc<Health>,
    name: &'static str,
}

impl LoopHeartbeat {
    /// Record that the loop is alive now.
    pub fn beat(&self) {
        if let Some(state) = lock(&self.health.loops).get_mut(self.name) {
            state.last = Instant::now();
        }
    }
}

impl Health {
    pub fn new() -> Arc<Health> {
        Arc::new(Health::default())
    }

    /// The Pod watch has listed once (its cache is ready); it stays so.
    pub fn mark_pod_watch_synced(&self) {
        self.pod_watch_synced.store(true, Ordering::Relaxed);
    }

    /// The last Lease renewal succeeded (true) or failed (false).
    pub fn set_lease_ok(&self, ok: bool) {
        self.lease_ok.store(ok, Ordering::Relaxed);
    }

    pub fn pod_watch_synced(&self) -> bool {
        self.pod_watch_synced.load(Ordering::Relaxed)
    }

    pub fn lease_ok(&self) -> bool {
        self.lease_ok.load(Ordering::Relaxed)
    }

    /// Register a loop that promises to call [`LoopHeartbeat::beat`] at
    /// least every `max_silence`; `/livez` fails once it has been silent
    /// longer. Registering a name again replaces the previous entry.
    pub fn register_loop(
        self: &Arc<Self>,
        name: &'static str,
        max_silence: Duration,
    ) -> LoopHeartbeat {
        lock(&self.loops).insert(
            name,
            LoopState {
                last: Instant::now(),
                max_silence,
            },
        );
        LoopHeartbeat {
            health: Arc::clone(self),
            name,
        }
    }

    /// Marks work in progress until the guard is dropped; `/livez` fails
    /// while any has run longer than its `bound`.
    pub fn working(self: &Arc<Self>, name: &'static str, bound: Duration) -> Working {
        let id = self.next_work.fetch_add(1, Ordering::Relaxed);
        lock(&self.working).insert(id, (name, Instant::now(), bound));
        Working {
            health: Arc::clone(self),
            id,
        }
    }

    /// Register something that must keep making progress: `/livez` fails
    /// while `silent` says it has gone longer than `limit` without.
    pub fn register_progress(
        &self,
        name: &'static str,
        limit: Duration,
        silent: impl Fn() -> Option<Duration> + Send + Sync + 'static,
    ) {
        lock(&self.progress).push(Progress {
            name,
            limit,
            silent: Box::new(silent),
        });
    }

    /// Stop watching a loop (it ended on purpose).
    pub fn deregister_loop(&self, name: &str) {
        lock(&self.loops).remove(name);
    }

    /// `Ok` when every registered loop beat recently, else the stalled ones.
    pub fn liveness(&self) -> std::result::Result<(), Vec<String>> {
        let now = Instant::now();
        let loops = lock(&self.loops);
        let mut stalled: Vec<String> = loops
            .iter()
            .filter(|(_, s)| now.duration_since(s.last) > s.max_silence)
            .map(|(name, s)| {
                format!(
                    "{name} loop silent for {}s (limit {}s)",
                    now.duration_since(s.last).as_secs(),
                    s.max_silence.as_secs()
                )
            })
            .collect();
        drop(loops);
        {
            let working = lock(&self.working);
            // One line per kind of work, for the oldest one.
            let mut oldest: BTreeMap<&str, (Duration, Duration, usize)> = BTreeMap::new();
            for (name, started, bound) in working.values() {
                let age = now.duration_since(*started);
                if age > *bound {
                    let e = oldest.entry(name).or_insert((age, *bound, 0));
                    e.0 = e.0.max(age);
                    e.2 += 1;
                }
            }
            for (name, (age, bound, n)) in oldest {
                stalled.push(format!(
                    "{n} {name} running for {}s (limit {}s)",
                    age.as_secs(),
                    bound.as_secs()
                ));
            }
        }
        for p in lock(&self.progress).iter() {
            stalled.extend(no_progress(p.name, (p.silent)(), p.limit));
        }
        if stalled.is_empty() {
            Ok(())
        } else {
            Err(stalled)
        }
    }

    /// `Ok` once the Pod watch synced and the last Lease renewal succeeded,
    /// else what is missing.
    pub fn readiness(&self) -> std::result::Result<(), Vec<&'static str>> {
        let mut missing = Vec::new();
        if !self.pod_watch_synced() {
            missing.push("the Pod watch has not synced yet");
        }
        if !self.lease_ok() {
            missing.push("the last node Lease renewal has not succeeded");
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing)
        }
    }
}

/// Why `/livez` fails for something registered with
/// [`Health::register_progress`]: it has gone longer than `limit` without
/// progress (`silent`; `None` when nothing is in flight). Pure.
pub fn no_progress(name: &str, silent: Option<Duration>, limit: Duration) -> Option<String> {
    let silent = silent.filter(|s| *s > limit)?;
    Some(format!(
        "{name} made no progress for {}s (limit {}s)",
        silent.as_secs(),
        limit.as_secs()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_fails_liveness_only_past_its_limit() {
        let limit = Duration::from_secs(320);
        assert_eq!(no_progress("Pod watch", None, limit), None, "no watch");
        assert_eq!(no_progress("Pod watch", Some(limit), limit), None);
        assert_eq!(
            no_progress("Pod watch", Some(limit + Duration::from_secs(1)), limit).as_deref(),
            Some("Pod watch made no progress for 321s (limit 320s)")
        );
    }
}
