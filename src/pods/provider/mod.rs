//! The provider: turns Pod creates and deletes into sandboxd claims and
//! releases, holding the durable claims store and the in-memory table of
//! tracked Pods (docs/architecture.md, "Pods controller";
//! `#decision-pods`, `#decision-reliability`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::pod::{Pod, cached_replaces_tracked};
use jiff::Timestamp;
use kube::Client;
use serde_json::Value;
use tracing::{info, warn};

use super::lifecycle::decide::Settings;
use super::owners::Owners;
use super::status::{self, ClaimView};
use crate::claims::{Claim, ClaimState, ClaimsStore};
use crate::sandboxd::{
    Op, SandboxRow, SandboxdClient, SandboxdError, Token, pod_ip_from_owner_addr,
};
use keys::{KeyGuard, KeyLocks};
use preserved::Preserved;
use suspects::Suspects;
use verification::Verification;

pub use outcomes::{CreateFailure, Created, Deleted, Hibernation};

/// Compensating releases run on their own deadline, detached from the
/// caller: a claim whose commit or status failed is given back even if
/// the reconcile that made it is cancelled.
const UNDO_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Provider {
    sandboxd: SandboxdClient,
    claims: Arc<ClaimsStore>,
    /// Asks the apiserver about owners; shared with the upkeep ([`Provider::owners`]).
    owners: Arc<Owners>,
    /// Pods this provider has claimed for or adopted, by key. Shared with
    /// the watch cache (the same `Arc`), not a second copy of each Pod.
    tracked: Mutex<HashMap<String, Arc<Pod>>>,
    /// Since when the watch cache has shown an older version of a tracked
    /// Pod than the tracked copy, by key (locked after `tracked`).
    behind: Mutex<HashMap<String, Instant>>,
    /// Keys to check for strays before claiming for them again.
    suspects: Mutex<Suspects>,
    /// Whether the last sandboxd listing succeeded; while it has not,
    /// [`Provider::refresh_needed`] asks the side loop to list again, so
    /// strays and quarantined rows are looked at as soon as sandboxd is back.
    listing_ok: std::sync::atomic::AtomicBool,
    /// The tenant-token warning was logged (once per process).
    said_not_root: std::sync::atomic::AtomicBool,
    /// Claims kept when their Pod was deleted with its owner alive, by key
    /// (see `preserved.rs`). In memory only: after a restart such a claim
    /// waits for its key's next Pod or its deadline.
    preserved: Mutex<HashMap<String, Preserved>>,
    /// One lock per key, shared by reconciles and the side loops.
    keys: KeyLocks,
    /// The one verification listing creates share (see `verification.rs`).
    verification: tokio::sync::Mutex<Verification>,
    /// How long after an unknown claim outcome a listing settles it.
    settle_after: Duration,
    /// `--hibernate-on-suspend`, `--lease-renew-margin`.
    lifecycle: Settings,
    /// `--pod-cidr`: claims get Pod addresses of their own (see
    /// `addresses.rs`).
    addresses: Option<Mutex<crate::podnet::range::Picker>>,
    /// The watch cache of this node's Pods (with `--pod-cidr`): an address
    /// a Pod here still shows (a Pod being deleted after its claim was
    /// released, across a restart that forgot the cool-down) is in use.
    pods_here: Option<kube::runtime::reflector::Store<Pod>>,
    /// Wakes the Pod-address listeners before a Running status is written.
    endpoints_changed: Arc<tokio::sync::Notify>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave them inconsistent
    // (single inserts/removes), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The view a status is built from; `None` address when owner_addr has no
/// usable IP (the Pod then runs without an IP, and the Sandbox says so).
pub fn view(claim: &Claim) -> ClaimView<'_> {
    // The claim's own Pod address (`--pod-cidr`), else the host part of
    // sandboxd's owner_addr (the node's).
    let own = claim.lifecycle.pod_ip.map(std::net::IpAddr::V4);
    ClaimView {
        id: &claim.id,
        ip: own
            .or_else(|| pod_ip_from_owner_addr(&claim.address).ok())
            .map(|ip| ip.to_string()),
        claimed_at: claim.claimed_at,
        deadline: claim.deadline,
    }
}

impl Provider {
    pub fn new(client: Client, sandboxd: SandboxdClient, claims: Arc<ClaimsStore>) -> Provider {
        Provider {
            owners: Arc::new(Owners::new(client)),
            sandboxd,
            claims,
            tracked: Mutex::new(HashMap::new()),
            behind: Mutex::new(HashMap::new()),
            suspects: Mutex::new(Suspects::default()),
            listing_ok: std::sync::atomic::AtomicBool::new(false),
            said_not_root: std::sync::atomic::AtomicBool::new(false),
            preserved: Mutex::new(HashMap::new()),
            keys: KeyLocks::default(),
            verification: tokio::sync::Mutex::new(Verification::default()),
            settle_after: suspects::SETTLE_AFTER,
            lifecycle: Settings::default(),
            addresses: None,
            pods_here: None,
            endpoints_changed: Arc::default(),
        }
    }

    /// The lifecycle's settings (flags); the defaults otherwise.
    pub fn with_lifecycle(mut self, settings: Settings) -> Provider {
        self.lifecycle = settings;
        self
    }

    /// The lifecycle's settings.
    pub fn lifecycle(&self) -> Settings {
        self.lifecycle
    }

    /// Settle unknown claim outcomes with listings taken `after` them
    /// (tests shorten it).
    pub fn settle_strays_after(mut self, after: Duration) -> Provider {
        self.settle_after = after;
        self
    }

    /// The claims store, for tests that set a row's state directly.
    #[cfg(test)]
    pub fn claims_store(&self) -> &Arc<ClaimsStore> {
        &self.claims
    }

    /// Waits until `key` is free and holds it: every reconcile, and each
    /// unit of work of the side loops, runs under its key's lock.
    pub async fn lock_key(&self, key: &str) -> KeyGuard {
        self.keys.lock(key).await
    }

    /// Lists sandboxd. Every successful listing also recomputes which keys
    /// have stray rows of ours; a failed one marks the listing as needed
    /// again (a failed list is never an empty one).
    pub async fn list(&self) -> Result<Vec<SandboxRow>, SandboxdError> {
        use std::sync::atomic::Ordering;
        match self.sandboxd.list().await {
            Ok(listing) => {
                self.note_listing(&listing);
                self.listing_ok.store(true, Ordering::Relaxed);
                Ok(listing)
            }
            Err(e) => {
                self.listing_ok.store(false, Ordering::Relaxed);
                if self.first_not_root(&e) {
                    warn!(
                        error = %e,
                        "sandboxd refuses to list with this token: it is not the node (root) \
                         token (a tenant token?); claims cannot be verified nor strays returned \
                         until vk-sandbox is given sandboxd's root api_token in \
                         --sandboxd-token-file (vk-sandbox preflight checks it)"
                    );
                }
                Err(e)
            }
        }
    }

    /// Whether a failed listing is the first refusal of this token (403:
    /// not the node's root token), which is logged once per process.
    fn first_not_root(&self, e: &SandboxdError) -> bool {
        e.status() == Some(403)
            && !self
                .said_not_root
                .swap(true, std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether no listing has succeeded since start-up or since the last
    /// failed one.
    pub fn refresh_needed(&self) -> bool {
        !self.listing_ok.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether sandboxd can be asked to release any sandbox by id (a node
    /// token is configured). Without one (open mode) strays cannot be
    /// returned and are left to their deadline.
    fn can_release_by_id(&self) -> bool {
        self.sandboxd.has_token()
    }

    pub fn tracked(&self, key: &str) -> Option<Arc<Pod>> {
        lock(&self.tracked).get(key).cloned()
    }

    pub fn tracked_pods(&self) -> Vec<Pod> {
        let mut v: Vec<Pod> = lock(&self.tracked)
            .values()
            .map(|p| Pod::clone(p))
            .collect();
        v.sort_by_key(Pod::key);
        v
    }

    pub fn tracked_keys(&self) -> Vec<String> {
        lock(&self.tracked).keys().cloned().collect()
    }

    fn track(&self, pod: &Arc<Pod>) {
        let k = pod.key();
        // A Pod of the key is here: the claim's fate is its Pod's again.
        lock(&self.preserved).remove(&k);
        let mut t = lock(&self.tracked);
        lock(&self.behind).remove(&k);
        t.insert(k, Arc::clone(pod));
    }

    fn untrack(&self, key: &str, uid: &str) {
        let mut t = lock(&self.tracked);
        if t.get(key).is_some_and(|p| p.uid() == uid) {
            t.remove(key);
            lock(&self.behind).remove(key);
        }
    }

    /// Whether the claims store holds a claim (any state) for `key`.
    pub fn holds(&self, key: &str) -> bool {
        self.claims.get(key).is_some()
    }

    /// Replaces the tracked copy with `pod`, a version of the same Pod
    /// (same UID) that is not older than it: the watch cache's copy, or the
    /// Pod as our own status write stored it, which the cache may not show
    /// yet. An older one replaces it too once the cache has shown older
    /// versions for [`super::pod::BEHIND_LIMIT`]: the apiserver's history went back
    /// (etcd restored), and our write is in none of it.
    pub fn update_tracked(&self, pod: &Arc<Pod>) {
        self.update_tracked_at(pod, Instant::now());
    }

    fn update_tracked_at(&self, pod: &Arc<Pod>, now: Instant) {
        let k = pod.key();
        let mut t = lock(&self.tracked);
        let Some(current) = t.get(&k).filter(|p| p.uid() == pod.uid()) else {
            return;
        };
        let newer = current.is_newer_than(pod);
        let mut behind = lock(&self.behind);
        let since = if newer {
            *behind.entry(k.clone()).or_insert(now)
        } else {
            now
        };
        if !cached_replaces_tracked(newer, now.saturating_duration_since(since)) {
            return;
        }
        if newer {
            warn!(
                pod = %k,
                ours = ?current.metadata.resource_version,
                cached = ?pod.metadata.resource_version,
                "the Pod's resourceVersion stayed behind our own last write (etcd restored?); \
                 deciding from the apiserver's version"
            );
        }
        behind.remove(&k);
        t.insert(k, Arc::clone(pod));
    }

    /// The newest version of `pod` known here: the tracked copy when it is
    /// a later version of the same Pod (our own status write, whose echo
    /// the watch has not delivered yet), else `pod` itself. Deciding from
    /// it keeps a reconcile that runs before the echo from writing the same
    /// status again.
    pub fn newest(&self, pod: &Arc<Pod>) -> Arc<Pod> {
        match lock(&self.tracked).get(&pod.key()) {
            Some(t) if t.is_newer_than(pod) => Arc::clone(t),
            _ => Arc::clone(pod),
        }
    }

    /// The running status for a key's settled claim, if it holds one whose
    /// lease is not known to be over.
    pub fn running_status(&self, pod: &Pod) -> Option<(String, Value)> {
        let (claim, state) = self.claims.get(&pod.key())?;
        if state != ClaimState::Settled {
            return None;
        }
        self.endpoints_changed();
        Some((claim.id.clone(), status::running(pod, &view(&claim))))
    }

    /// Release with the claim's own token, or the node token for a claim
    /// recovered without one. `Ok(false)`: no credential can release it
    /// (recovered claim, no node token).
    async fn release_claim(&self, claim: &Claim) -> Result<bool, SandboxdError> {
        match &claim.token {
            Some(token) => {
                self.sandboxd.release(&claim.id, token).await?;
            }
            None if self.can_release_by_id() => self.release_by_id(&claim.id).await?,
            None => return Ok(false),
        }
        Ok(true)
    }

    /// Gives back a claim that must not be kept (its commit failed), with
    /// its own credential, on a deadline of its own.
    async fn undo_release(&self, id: &str, token: &Token) -> Result<(), SandboxdError> {
        match tokio::time::timeout(UNDO_TIMEOUT, self.sandboxd.release(id, token)).await {
            Ok(r) => r.map(drop),
            Err(_) => Err(SandboxdError::Timeout {
                op: Op::Release,
                after: UNDO_TIMEOUT,
            }),
        }
    }

    /// One verification pass that also refreshes the stray keys: list
    /// sandboxd once, then lift or drop the quarantined rows. A failed list
    /// changes nothing. Returns the listing (start-up hands it on).
    pub async fn refresh(&self) -> Result<Vec<SandboxRow>, SandboxdError> {
        let snapshot = self.claims.quarantined();
        let listing = self.list().await?;
        if snapshot.is_empty() {
            return Ok(listing);
        }
        match self.claims.apply_verification(&snapshot, &listing).await {
            Ok(report) => info!(
                ?report,
                "claims from the previous run verified against sandboxd"
            ),
            Err(e) => warn!(error = %e, "verification could not be persisted; will retry"),
        }
        Ok(listing)
    }

    /// The claim rows the lease watch must confirm (settled, past their
    /// deadline, with a tracked Pod) and the listing to confirm them
    /// against; `Ok(None)` when there are none (sandboxd is not called).
    pub async fn expiry_check(
        &self,
        now: Timestamp,
    ) -> Result<Option<(Vec<(String, Claim)>, Vec<SandboxRow>)>, SandboxdError> {
        let candidates: Vec<(String, Claim)> =
            super::plan::expiry_candidates(self.claims.all(), now, |k| self.tracked(k).is_some())
                .into_iter()
                .map(|(k, c, _)| (k, c))
                .collect();
        if candidates.is_empty() {
            return Ok(None);
        }
        let listing = self.list().await?;
        Ok(Some((candidates, listing)))
    }

    /// A lease-expiry candidate is still listed: take the listing's
    /// deadline (it may have been renewed, or become "none").
    pub async fn take_listed_deadline(&self, k: &str, claim: &Claim, row: &SandboxRow) {
        if let Err(e) = self
            .claims
            .set_deadline(k, &claim.id, row.deadline.expires_at())
            .await
        {
            warn!(pod = %k, error = %e, "listed deadline not persisted; kept in memory");
        }
    }

    /// Whether `k` still holds claim `id` (the key may change hands while a
    /// listing is in flight).
    /// The owners room this provider asks (the upkeep asks the same one).
    pub fn owners(&self) -> &Arc<Owners> {
        &self.owners
    }

    pub fn holds_id(&self, k: &str, id: &str) -> bool {
        self.claims.get(k).is_some_and(|(c, _)| c.id == id)
    }

    /// Whether any claim row still waits for a listing to vouch for it.
    pub fn has_quarantined(&self) -> bool {
        !self.claims.quarantined().is_empty()
    }
}

pub mod addresses;
mod create;
pub mod create_step;
mod delete;
pub mod keys;
pub mod lifecycle;
mod outcomes;
mod preserved;
mod recheck;
mod strays;
mod suspects;
#[cfg(test)]
mod tests;
mod verification;
