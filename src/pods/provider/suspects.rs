//! Which keys may have a stray sandbox of ours: claimed without learning
//! the credential (a lost claim reply). Bookkeeping only; the provider
//! lists and returns (`strays.rs`; docs/reliability.md, "Lost claim replies
//! among neighbours").

use std::collections::{HashMap, HashSet};

#[derive(Debug, Default)]
pub(super) struct Suspects {
    /// Pods (key → UID) whose last claim had an unknown outcome in this
    /// process: sandboxd may hold a sandbox tagged with that UID.
    unknown: HashMap<String, String>,
    /// Keys under which the last successful listing showed rows tagged as
    /// ours that no stored claim holds (after a restart, the only trace of a
    /// lost reply). Replaced by every successful listing.
    listed: HashSet<String>,
}

impl Suspects {
    /// Whether a stray of ours may exist under `key`.
    pub(super) fn suspect(&self, key: &str) -> bool {
        self.unknown.contains_key(key) || self.listed.contains(key)
    }

    /// The Pods whose last claim had an unknown outcome, as (key, UID).
    pub(super) fn unknown(&self) -> Vec<(String, String)> {
        self.unknown
            .iter()
            .map(|(k, u)| (k.clone(), u.clone()))
            .collect()
    }

    pub(super) fn note_unknown(&mut self, key: &str, uid: &str) {
        self.unknown.insert(key.to_string(), uid.to_string());
    }

    /// The strays of (`key`, `uid`) were looked for and returned.
    pub(super) fn settled(&mut self, key: &str, uid: &str) {
        if self.unknown.get(key).is_some_and(|u| u == uid) {
            self.unknown.remove(key);
        }
    }

    /// Nothing can be returned (no node token): forget the key's outcome.
    pub(super) fn forget(&mut self, key: &str) {
        self.unknown.remove(key);
    }

    /// The keys a successful listing showed unheld rows of ours under.
    pub(super) fn set_listed(&mut self, keys: HashSet<String>) {
        self.listed = keys;
    }
}
