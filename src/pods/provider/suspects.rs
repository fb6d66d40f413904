//! Which keys may have a stray sandbox of ours: claimed without learning
//! the credential (a lost claim reply). Bookkeeping only, pure; the
//! provider lists and returns (`strays.rs`; docs/reliability.md, "Lost
//! claim replies among neighbours").
//!
//! An unknown outcome is kept per Pod (key and UID) until that Pod is gone
//! *and* a listing taken long enough after the outcome was noted has been
//! returned from: sandboxd goes on with a claim after its client gave up,
//! so a listing right after the timeout may not show the row yet.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How long after an unknown outcome a listing must be taken before it
/// can settle it: far longer than any claim sandboxd is still working on
/// when its client gives up (10 s).
pub(super) const SETTLE_AFTER: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
pub(super) struct Suspects {
    /// Pods (key, UID) whose claim had an unknown outcome in this process,
    /// and when the last one was noted: sandboxd may hold a sandbox tagged
    /// with that UID.
    unknown: HashMap<(String, String), Instant>,
    /// Keys under which the last successful listing showed rows tagged as
    /// ours that no stored claim holds (after a restart, the only trace of a
    /// lost reply). Replaced by every successful listing.
    listed: HashSet<String>,
}

impl Suspects {
    /// Whether a stray of ours may exist under `key`.
    pub(super) fn suspect(&self, key: &str) -> bool {
        self.listed.contains(key) || self.unknown.keys().any(|(k, _)| k == key)
    }

    /// The Pods whose claim had an unknown outcome, as (key, UID), sorted.
    pub(super) fn unknown(&self) -> Vec<(String, String)> {
        let mut v: Vec<_> = self.unknown.keys().cloned().collect();
        v.sort();
        v
    }

    pub(super) fn note_unknown(&mut self, key: &str, uid: &str, at: Instant) {
        self.unknown.insert((key.to_string(), uid.to_string()), at);
    }

    /// The Pod (`key`, `uid`) is gone and its strays were returned from a
    /// listing taken at `listed_at`: its unknown outcome is settled when
    /// that listing came at least `after` past the last one noted. Returns
    /// whether it is settled (or was not noted).
    pub(super) fn settle(
        &mut self,
        key: &str,
        uid: &str,
        listed_at: Instant,
        after: Duration,
    ) -> bool {
        let id = (key.to_string(), uid.to_string());
        match self.unknown.get(&id) {
            Some(noted) if listed_at.saturating_duration_since(*noted) < after => false,
            Some(_) => {
                self.unknown.remove(&id);
                true
            }
            None => true,
        }
    }

    /// The keys a successful listing showed unheld rows of ours under.
    pub(super) fn set_listed(&mut self, keys: HashSet<String>) {
        self.listed = keys;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_kept_per_pod_until_a_late_enough_listing_settles_them() {
        let t0 = Instant::now();
        let after = Duration::from_secs(60);
        let mut s = Suspects::default();
        assert!(!s.suspect("ns/p"));
        s.note_unknown("ns/p", "u1", t0);
        s.note_unknown("ns/p", "u2", t0 + Duration::from_secs(5));
        assert!(s.suspect("ns/p") && !s.suspect("ns/q"));
        assert_eq!(
            s.unknown(),
            vec![("ns/p".into(), "u1".into()), ("ns/p".into(), "u2".into())]
        );
        // A listing too soon after the outcome settles nothing.
        assert!(!s.settle("ns/p", "u1", t0 + Duration::from_secs(59), after));
        assert!(s.settle("ns/p", "u1", t0 + after, after));
        assert_eq!(s.unknown(), vec![("ns/p".into(), "u2".into())]);
        assert!(s.suspect("ns/p"), "u2 is still unknown");
        assert!(!s.settle("ns/p", "u2", t0 + after, after));
        assert!(s.settle("ns/p", "u2", t0 + Duration::from_secs(65), after));
        assert!(!s.suspect("ns/p"));
        assert!(s.settle("ns/p", "u3", t0, after), "nothing noted: settled");
        // A second unknown outcome of one Pod counts from the last.
        s.note_unknown("ns/r", "u", t0);
        s.note_unknown("ns/r", "u", t0 + Duration::from_secs(30));
        assert!(!s.settle("ns/r", "u", t0 + after, after));
        // Listed keys are replaced by each listing.
        s.set_listed(HashSet::from(["ns/x".to_string()]));
        assert!(s.suspect("ns/x"));
        s.set_listed(HashSet::new());
        assert!(!s.suspect("ns/x"));
    }
}
