//! The provider: turns Pod creates and deletes into sandboxd claims and
//! releases, holding the durable claims store and the in-memory table of
//! tracked Pods (behaviour.md §3.2–§3.4, §3.7, §4.5; decisions.md D3, D7).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use serde_json::Value;
use tracing::{info, warn};

use super::annotations::{self, key};
use super::authority::{self, OwnerResolver, Verdict};
use super::claim_ref;
use super::status::{self, ClaimView};
use crate::claims::{Claim, ClaimState, ClaimsStore};
use crate::sandboxd::{
    Op, ReleaseOutcome, SandboxRow, SandboxdClient, SandboxdError, Secret, pod_ip_from_owner_addr,
};

/// Compensating releases run on their own deadline, detached from the
/// caller (behaviour.md §3.2 steps 5 and 10).
const UNDO_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a create did not produce a Running Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateFailure {
    /// `ProviderFailed` or `NoWarmCapacity` (decisions.md D3).
    pub reason: &'static str,
    pub message: String,
}

impl CreateFailure {
    fn provider(message: impl Into<String>) -> Self {
        CreateFailure {
            reason: "ProviderFailed",
            message: message.into(),
        }
    }
}

/// What a successful create did.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    Claimed {
        id: String,
        status: Value,
    },
    /// A claim kept from an earlier Pod under the same key.
    Adopted {
        id: String,
        status: Value,
    },
    /// This same Pod's own claim, seen again after a restart: nothing
    /// changed hands, so there is nothing to announce.
    Resumed {
        id: String,
        status: Value,
    },
}

/// What a provider delete did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deleted {
    /// A newer Pod holds the key: this request was for an old generation.
    Stale,
    /// No claim was held for the key.
    NothingHeld,
    Preserved {
        id: String,
        reason: String,
    },
    Released {
        id: String,
        reason: String,
    },
    /// The owner is gone, but the claim holds no release credential (it
    /// was recovered without one) and no node token is configured (sandboxd
    /// in open mode): nothing here can release it. The row is dropped so
    /// the Pod is not held Terminating; the sandbox ends at its deadline.
    LeftToExpire {
        id: String,
        reason: String,
    },
}

/// What is known about sandboxes this node may have claimed without
/// learning their credential (lost claim replies; decisions in
/// docs/reliability.md, "Lost claim replies among neighbours").
#[derive(Debug, Default)]
struct Strays {
    /// Pods (key → UID) whose last claim had an unknown outcome in this
    /// process: sandboxd may hold a sandbox tagged with that UID.
    unknown: HashMap<String, String>,
    /// Keys under which the last successful listing showed rows tagged as
    /// ours that no stored claim holds (after a restart, the only trace of a
    /// lost reply). Replaced by every successful listing.
    listed: HashSet<String>,
}

pub struct Provider {
    pub client: Client,
    pub sandboxd: SandboxdClient,
    pub claims: Arc<ClaimsStore>,
    owners: OwnerResolver,
    /// Pods this provider has claimed for or adopted, by key. Shared with
    /// the watch cache (the same `Arc`), not a second copy of each Pod.
    tracked: Mutex<HashMap<String, Arc<Pod>>>,
    /// Keys to check for strays before claiming for them again.
    strays: Mutex<Strays>,
    /// Whether the last sandboxd listing succeeded; while it has not,
    /// [`Provider::refresh_needed`] asks the side loop to list again, so
    /// strays and quarantined rows are looked at as soon as sandboxd is back.
    listing_ok: std::sync::atomic::AtomicBool,
    /// The tenant-token warning was logged (once per process).
    said_not_root: std::sync::atomic::AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave them inconsistent
    // (single inserts/removes), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// The view a status is built from; `None` address when owner_addr has no
/// usable IP (the Pod then runs without an IP, and the Sandbox says so).
pub fn view(claim: &Claim) -> ClaimView<'_> {
    ClaimView {
        id: &claim.id,
        ip: pod_ip_from_owner_addr(&claim.address)
            .ok()
            .map(|ip| ip.to_string()),
        claimed_at: claim.claimed_at,
        deadline: claim.deadline,
    }
}

impl Provider {
    pub fn new(client: Client, sandboxd: SandboxdClient, claims: Arc<ClaimsStore>) -> Provider {
        Provider {
            client,
            sandboxd,
            claims,
            owners: OwnerResolver::default(),
            tracked: Mutex::new(HashMap::new()),
            strays: Mutex::new(Strays::default()),
            listing_ok: std::sync::atomic::AtomicBool::new(false),
            said_not_root: std::sync::atomic::AtomicBool::new(false),
        }
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
                if e.status() == Some(403) && !self.said_not_root.swap(true, Ordering::Relaxed) {
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
        v.sort_by_key(key);
        v
    }

    pub fn tracked_keys(&self) -> Vec<String> {
        lock(&self.tracked).keys().cloned().collect()
    }

    fn track(&self, pod: &Arc<Pod>) {
        lock(&self.tracked).insert(key(pod), Arc::clone(pod));
    }

    fn untrack(&self, key: &str, uid: &str) {
        let mut t = lock(&self.tracked);
        if t.get(key)
            .is_some_and(|p| p.metadata.uid.as_deref().unwrap_or_default() == uid)
        {
            t.remove(key);
        }
    }

    /// Whether the claims store holds a claim (any state) for `key`.
    pub fn holds(&self, key: &str) -> bool {
        self.claims.get(key).is_some()
    }

    /// Replaces the tracked copy (an update of the same Pod generation).
    pub fn update_tracked(&self, pod: &Arc<Pod>) {
        let k = key(pod);
        let mut t = lock(&self.tracked);
        if t.get(&k).is_some_and(|p| uid(p) == uid(pod)) {
            t.insert(k, Arc::clone(pod));
        }
    }

    /// Recomputes the keys under which `listing` shows rows tagged as this
    /// node's (see [`claim_ref`]) that no stored claim holds. Rows without
    /// the tag (other clients of sandboxd, rows written by the Go
    /// implementation) never count. Nothing is marked without a node token:
    /// such strays could not be returned anyway.
    pub fn note_listing(&self, listing: &[SandboxRow]) {
        let keys: HashSet<String> = if self.can_release_by_id() {
            let held = self.claims.held_ids();
            listing
                .iter()
                .filter(|r| !held.contains(&r.id))
                .filter_map(|r| {
                    let p = claim_ref::parse(&r.claim_ref);
                    p.ours.map(|_| p.key.to_string())
                })
                .collect()
        } else {
            HashSet::new()
        };
        lock(&self.strays).listed = keys;
    }

    /// Whether a stray of ours may exist under `key`.
    pub fn suspect(&self, key: &str) -> bool {
        let s = lock(&self.strays);
        s.unknown.contains_key(key) || s.listed.contains(key)
    }

    /// The Pods whose last claim had an unknown outcome, as (key, UID).
    pub fn unknown_outcomes(&self) -> Vec<(String, String)> {
        lock(&self.strays)
            .unknown
            .iter()
            .map(|(k, u)| (k.clone(), u.clone()))
            .collect()
    }

    /// The running status for a key's settled claim, if it holds one whose
    /// lease is not known to be over.
    pub fn running_status(&self, pod: &Pod) -> Option<(String, Value)> {
        let (claim, state) = self.claims.get(&key(pod))?;
        if state != ClaimState::Settled {
            return None;
        }
        Some((claim.id.clone(), status::running(pod, &view(&claim))))
    }

    /// Create (behaviour.md §3.2): adopt a held claim or claim a new sandbox.
    pub async fn create(&self, pod: &Arc<Pod>) -> Result<Created, CreateFailure> {
        let k = key(pod);
        // 1. Runtime gate.
        annotations::runtime_gate(pod).map_err(CreateFailure::provider)?;

        // 2. A claim from a previous run must be vouched for by sandboxd.
        if let Some((_, ClaimState::Quarantined)) = self.claims.get(&k) {
            self.refresh().await.map_err(|e| {
                CreateFailure::provider(format!(
                    "a claim from a previous run is unverified and sandboxd cannot be listed; \
                     refusing to claim over a possibly live sandbox: {e}"
                ))
            })?;
        }

        // 3. A settled claim past its cached deadline: sandboxd decides.
        if let Some((claim, ClaimState::Settled)) = self.claims.get(&k)
            && claim.deadline.is_some_and(|d| d <= Timestamp::now())
        {
            let listing = self.list().await.map_err(|e| {
                CreateFailure::provider(format!(
                    "the claim for {k} is past its cached deadline and sandboxd cannot be \
                     listed; refusing to replace it: {e}"
                ))
            })?;
            match listing.iter().find(|r| r.id == claim.id) {
                Some(row) => self.take_listed_deadline(&k, &claim, row).await,
                None => {
                    let _ = self.claims.remove(&k, &claim.id).await;
                }
            }
        }

        // 4. Adopt in place: the VM outlived its previous Pod (or this
        // process restarted under the same Pod).
        if let Some((claim, ClaimState::Settled)) = self.claims.get(&k) {
            let same_pod = !claim.pod_uid.is_empty() && claim.pod_uid == uid(pod);
            if let Err(e) = self.claims.rebind(&k, &claim.id, uid(pod)).await {
                warn!(pod = %k, error = %e, "adoption not persisted; the claim is kept in memory");
            }
            self.track(pod);
            let claim = self.claims.get(&k).map(|(c, _)| c).unwrap_or(claim);
            let (id, status) = (claim.id.clone(), status::running(pod, &view(&claim)));
            return Ok(if same_pod {
                Created::Resumed { id, status }
            } else {
                Created::Adopted { id, status }
            });
        }

        // 5. A stranded claim (an earlier commit and undo both failed). One
        // without a credential is a recovered claim whose commit failed: it
        // is the Pod's running sandbox, not ours to return; drop the row and
        // recover it again below.
        if let Some((claim, ClaimState::Tentative)) = self.claims.get(&k)
            && claim.token.is_empty()
        {
            let _ = self.claims.remove(&k, &claim.id).await;
        }
        if let Some((claim, ClaimState::Tentative)) = self.claims.get(&k) {
            self.undo_release(&claim).await.map_err(|e| {
                CreateFailure::provider(format!(
                    "a previous sandbox {} for {k} could not be returned and its credential \
                     is only in memory: {e}",
                    claim.id
                ))
            })?;
            let _ = self.claims.remove(&k, &claim.id).await;
        }

        // A Pod already running on a sandbox no claim holds: the claims
        // state was lost or replaced while its VM kept serving. Adopt it
        // (released later with the node token) rather than return it as a
        // stray or claim a second one.
        if let Some(adopted) = self.recover_lost_claim(pod, &k).await? {
            return Ok(adopted);
        }

        // 6–7. What to claim.
        let request = annotations::claim_request(pod).map_err(CreateFailure::provider)?;

        // D7: return strays of this Pod's earlier claims whose reply was lost.
        if self.suspect(&k) {
            self.return_strays(&k, uid(pod), None).await.map_err(|e| {
                CreateFailure::provider(format!(
                    "cannot check for, or return, a sandbox an earlier claim for {k} may \
                     have left behind; refusing to claim twice: {e}"
                ))
            })?;
        }

        // 8. Claim.
        let granted = match self.sandboxd.claim(&request).await {
            Ok(c) => c,
            Err(e) => {
                if e.is_outcome_unknown() {
                    self.note_unknown_outcome(&k, uid(pod));
                }
                let reason = if e.is_capacity_miss() {
                    "NoWarmCapacity"
                } else {
                    "ProviderFailed"
                };
                return Err(CreateFailure {
                    reason,
                    message: format!("claim sandbox for {k} (template {}): {e}", request.template),
                });
            }
        };

        // 9. Durable before it counts.
        let claim = Claim {
            id: granted.id.clone(),
            token: granted.token.expose().to_string(),
            address: granted.owner_addr.clone(),
            pod_uid: uid(pod).to_string(),
            claimed_at: Timestamp::now(),
            deadline: granted.deadline.expires_at(),
        };
        if let Err(persist) = self.claims.commit(&k, claim.clone()).await {
            // 10. Undo: return the sandbox rather than hold an unrecorded credential.
            return match self.undo_release(&claim).await {
                Ok(()) => {
                    let _ = self.claims.remove(&k, &claim.id).await;
                    Err(CreateFailure::provider(format!(
                        "persist claim for {k}: {persist}"
                    )))
                }
                Err(undo) => Err(CreateFailure::provider(format!(
                    "persist claim for {k}: {persist}; returning sandbox {} also failed: {undo}",
                    claim.id
                ))),
            };
        }
        self.track(pod);
        // 11. Running, from the row as stored (times at the store's
        // precision), so a later re-publish computes the same status.
        let claim = self.claims.get(&k).map(|(c, _)| c).unwrap_or(claim);
        Ok(Created::Claimed {
            id: claim.id.clone(),
            status: status::running(pod, &view(&claim)),
        })
    }

    fn note_unknown_outcome(&self, k: &str, uid: &str) {
        if self.can_release_by_id() {
            lock(&self.strays)
                .unknown
                .insert(k.to_string(), uid.to_string());
        } else {
            warn!(
                pod = %k,
                "the claim's outcome is unknown and no node token is configured (sandboxd open \
                 mode): a sandbox it may have created cannot be returned and ends at its deadline"
            );
        }
    }

    /// The Pod names (claim-id annotation) a sandbox sandboxd lists under
    /// this Pod's key, and no stored claim holds it: its credential is gone
    /// but the VM is the Pod's. Recorded with an empty token, which
    /// [`Provider::delete`] releases with the node token.
    async fn recover_lost_claim(
        &self,
        pod: &Arc<Pod>,
        k: &str,
    ) -> Result<Option<Created>, CreateFailure> {
        let Some(id) = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::CLAIM_ID))
            .filter(|id| !id.is_empty())
        else {
            return Ok(None);
        };
        if self.claims.held_ids().contains(id) {
            return Ok(None);
        }
        let listing = self.list().await.map_err(|e| {
            CreateFailure::provider(format!(
                "{k} ran on sandbox {id}, which no stored claim holds, and sandboxd cannot be \
                 listed to check whether it lives; refusing to claim a second one: {e}"
            ))
        })?;
        let Some(row) = listing
            .iter()
            .find(|r| r.id == *id && claim_ref::names_key(&r.claim_ref, k))
        else {
            return Ok(None);
        };
        let address = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default();
        let claim = Claim {
            id: id.clone(),
            token: String::new(),
            address,
            pod_uid: uid(pod).to_string(),
            claimed_at: Timestamp::now(),
            deadline: row.deadline.expires_at(),
        };
        if let Err(e) = self.claims.commit(k, claim.clone()).await {
            // Nothing to undo (the sandbox is the Pod's, and there is no
            // credential to lose): drop the row so the next try recovers it
            // again instead of finding a stranded claim it cannot return.
            let _ = self.claims.remove(k, id).await;
            return Err(CreateFailure::provider(format!(
                "persist the recovered claim of {k} on sandbox {id}: {e}"
            )));
        }
        warn!(
            pod = %k,
            sandbox = %id,
            "adopted a running sandbox whose release credential was not in the claims state \
             (state file lost or replaced?); it will be released with the node token"
        );
        self.track(pod);
        Ok(Some(Created::Adopted {
            id: claim.id.clone(),
            status: status::running(pod, &view(&claim)),
        }))
    }

    /// Release with the claim's own token, or the node token for a claim
    /// recovered without one. `Ok(false)`: no credential can release it
    /// (recovered claim, no node token).
    async fn release_claim(&self, claim: &Claim) -> Result<bool, SandboxdError> {
        if claim.token.is_empty() {
            if !self.can_release_by_id() {
                return Ok(false);
            }
            self.release_by_id(&claim.id).await?;
        } else {
            let token = Secret::new(claim.token.clone());
            self.sandboxd.release(&claim.id, &token).await?;
        }
        Ok(true)
    }

    /// Release any sandbox by id with the node token. A `404` is proof that
    /// it is gone only once a listing no longer shows it: a tenant token, or
    /// any token against a sandboxd without `api_token`, gets the same
    /// answer for a sandbox it may not touch.
    async fn release_by_id(&self, id: &str) -> Result<(), SandboxdError> {
        match self.sandboxd.release_as_node(id).await? {
            ReleaseOutcome::Released => Ok(()),
            ReleaseOutcome::AlreadyGone => {
                if self.list().await?.iter().any(|r| r.id == id) {
                    Err(SandboxdError::NotReleased { id: id.to_string() })
                } else {
                    Ok(())
                }
            }
        }
    }

    async fn undo_release(&self, claim: &Claim) -> Result<(), SandboxdError> {
        let token = Secret::new(claim.token.clone());
        match tokio::time::timeout(UNDO_TIMEOUT, self.sandboxd.release(&claim.id, &token)).await {
            Ok(r) => r.map(|_| ()),
            Err(_) => Err(SandboxdError::Timeout {
                op: Op::Release,
                after: UNDO_TIMEOUT,
            }),
        }
    }

    /// Returns, with the node token, the sandboxes sandboxd lists as
    /// claimed by this node for the Pod (`k`, `uid`) that no stored claim
    /// holds: lost claim replies of that Pod. `running_on` (the Pod's
    /// claim-id annotation) is never touched. Only called when the Pod is
    /// known to run on none of them: right before claiming for it, or when
    /// it goes away without having run. Rows of other clients (no tag) and
    /// of other Pods are never touched.
    async fn return_strays(
        &self,
        k: &str,
        uid: &str,
        running_on: Option<&str>,
    ) -> Result<(), SandboxdError> {
        if !self.can_release_by_id() {
            lock(&self.strays).unknown.remove(k);
            return Ok(());
        }
        let mut listing = self.list().await?;
        let held = self.claims.held_ids();
        let strays: Vec<String> = listing
            .iter()
            .filter(|r| {
                claim_ref::made_for(&r.claim_ref, k, uid)
                    && !held.contains(&r.id)
                    && running_on != Some(r.id.as_str())
            })
            .map(|r| r.id.clone())
            .collect();
        for id in &strays {
            self.release_by_id(id).await?;
            info!(pod = %k, sandbox = %id, "returned a sandbox whose claim reply was lost");
        }
        // The listing as it stands now: the returned rows are gone.
        listing.retain(|r| !strays.contains(&r.id));
        self.note_listing(&listing);
        let mut strays = lock(&self.strays);
        if strays.unknown.get(k).is_some_and(|u| u == uid) {
            strays.unknown.remove(k);
        }
        Ok(())
    }

    /// A Pod that goes away without ever having run (deleted while
    /// Pending, or vanished untracked): return what its lost claim replies
    /// left behind, if it had any. Best effort: on failure the strays stay
    /// listed and are retried by [`Provider::settle_unknown`].
    pub async fn forget_never_ran(&self, pod: &Pod) -> Result<(), SandboxdError> {
        let k = key(pod);
        if !self.suspect(&k) {
            return Ok(());
        }
        let running_on = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::CLAIM_ID))
            .map(String::as_str);
        self.return_strays(&k, uid(pod), running_on).await
    }

    /// A Pod whose claim had an unknown outcome is no longer in the API
    /// (it never ran: had it, it would be tracked): return its strays and
    /// forget it, so the unknown-outcome map does not grow.
    pub async fn settle_unknown(&self, k: &str, uid: &str) -> Result<(), SandboxdError> {
        self.return_strays(k, uid, None).await?;
        let mut strays = lock(&self.strays);
        if strays.unknown.get(k).is_some_and(|u| u == uid) {
            strays.unknown.remove(k);
        }
        Ok(())
    }

    /// One §4.5 verification pass that also refreshes the stray keys: list
    /// sandboxd once, then lift or drop the quarantined rows. A failed list
    /// changes nothing.
    pub async fn refresh(&self) -> Result<(), SandboxdError> {
        let snapshot = self.claims.quarantined();
        let listing = self.list().await?;
        if snapshot.is_empty() {
            return Ok(());
        }
        match self.claims.apply_verification(&snapshot, &listing).await {
            Ok(report) => info!(
                ?report,
                "claims from the previous run verified against sandboxd"
            ),
            Err(e) => warn!(error = %e, "verification could not be persisted; will retry"),
        }
        Ok(())
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
    pub fn holds_id(&self, k: &str, id: &str) -> bool {
        self.claims.get(k).is_some_and(|(c, _)| c.id == id)
    }

    /// Whether any claim row still waits for a listing to vouch for it.
    pub fn has_quarantined(&self) -> bool {
        !self.claims.quarantined().is_empty()
    }

    /// Provider Delete (behaviour.md §3.4): preserve unless the owner is
    /// confirmed gone or tearing down; release with the claim's own token.
    pub async fn delete(&self, pod: &Pod) -> Result<Deleted, SandboxdError> {
        let k = key(pod);
        if let Some(t) = self.tracked(&k)
            && uid(&t) != uid(pod)
        {
            return Ok(Deleted::Stale);
        }
        let Some((claim, _state)) = self.claims.get(&k) else {
            self.untrack(&k, uid(pod));
            return Ok(Deleted::NothingHeld);
        };
        let owner = authority::controller_ref(pod);
        let lookup = self.owners.lookup(&self.client, pod).await;
        match authority::decide(owner, &lookup) {
            Verdict::Preserve(reason) => {
                info!(pod = %k, sandbox = %claim.id, %reason,
                      "preserving sandbox: pod deletion is not VM authority");
                self.untrack(&k, uid(pod));
                Ok(Deleted::Preserved {
                    id: claim.id,
                    reason,
                })
            }
            Verdict::Release(reason) => {
                let released = self.release_claim(&claim).await?;
                if let Err(e) = self.claims.remove(&k, &claim.id).await {
                    warn!(pod = %k, error = %e, "release done but its record could not be removed");
                }
                self.untrack(&k, uid(pod));
                if released {
                    info!(pod = %k, sandbox = %claim.id, %reason, "released sandbox");
                    Ok(Deleted::Released {
                        id: claim.id,
                        reason,
                    })
                } else {
                    warn!(pod = %k, sandbox = %claim.id, %reason,
                          "no credential can release this recovered claim (no node token): \
                           it ends at its deadline");
                    Ok(Deleted::LeftToExpire {
                        id: claim.id,
                        reason,
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A kube client whose requests go nowhere: these paths must not call
    /// the apiserver at all (a call would hang and time the test out).
    fn silent_client() -> Client {
        let (mock, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        std::mem::forget(_handle);
        Client::new(mock, "default")
    }

    /// An in-process simulator with a warm `base:24.04` pool of two.
    async fn sim_with_pool() -> sandboxd_sim::SimHandle {
        crate::crypto::install_provider();
        sandboxd_sim::start_local(sandboxd_sim::SimConfig {
            pools: vec![
                sandboxd_sim::config::PoolConfig::parse_spec("base:24.04=2").expect("pool"),
            ],
            ..Default::default()
        })
        .await
        .expect("sim")
    }

    fn pod(uid: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": uid, "annotations": {
                "sandbox.cocoonstack.io/template": "base:24.04"}},
            "spec": {"containers": [{"name": "a", "image": "base:24.04"}]},
        }))
        .expect("pod")
    }

    const TOKEN: &str = "node-root-token";

    /// An in-process simulator with a root token and a warm pool of four,
    /// and a provider (node token configured) over a fresh claims store.
    async fn provider_with_token() -> (sandboxd_sim::SimHandle, Provider, tempfile::TempDir) {
        crate::crypto::install_provider();
        let sim = sandboxd_sim::start_local(sandboxd_sim::SimConfig {
            api_token: TOKEN.into(),
            pools: vec![
                sandboxd_sim::config::PoolConfig::parse_spec("base:24.04=4").expect("pool"),
            ],
            ..Default::default()
        })
        .await
        .expect("sim");
        let dir = tempfile::tempdir().expect("tempdir");
        let claims = Arc::new(
            ClaimsStore::open(&dir.path().join("claims.json"))
                .await
                .expect("store"),
        );
        let sandboxd = SandboxdClient::builder(sim.base_url())
            .token(Some(TOKEN.into()))
            .build()
            .expect("client");
        let provider = Provider::new(silent_client(), sandboxd, claims);
        (sim, provider, dir)
    }

    /// Another client of the same sandboxd (sandbox-operator's aggregated
    /// apiserver) claims with `claim_ref = <namespace>/<name>`.
    async fn neighbour_claims(sim: &sandboxd_sim::SimHandle, claim_ref: &str) -> String {
        SandboxdClient::builder(sim.base_url())
            .token(Some(TOKEN.into()))
            .build()
            .expect("client")
            .claim(&crate::sandboxd::ClaimRequest {
                template: "base:24.04".into(),
                claim_ref: claim_ref.into(),
                ..Default::default()
            })
            .await
            .expect("neighbour claim")
            .id
    }

    fn released(sim: &sandboxd_sim::SimHandle) -> Vec<String> {
        sim.sim()
            .requests()
            .iter()
            .filter_map(|r| {
                r.path
                    .strip_prefix("/v1/sandboxes/")
                    .and_then(|p| p.strip_suffix("/release"))
                    .map(str::to_string)
            })
            .collect()
    }

    fn drop_next_claim_reply(sim: &sandboxd_sim::SimHandle) {
        let fault: sandboxd_sim::Fault =
            serde_json::from_value(json!({"endpoint": "claim", "kind": "drop_after", "times": 1}))
                .expect("fault");
        sim.sim().arm_fault(fault).expect("arm");
    }

    /// D7 among neighbours: a sandbox another client claimed under this
    /// Pod's key is never a stray of ours, whether it was listed at
    /// start-up or the Pod needs a fresh claim after a lost reply; the real
    /// lost reply (tagged with this Pod's UID) is returned.
    #[tokio::test(flavor = "multi_thread")]
    async fn neighbours_rows_are_never_returned_our_lost_reply_is() {
        let (sim, provider, _dir) = provider_with_token().await;
        let foreign = neighbour_claims(&sim, "ns/p").await;
        // The start-up listing sees the foreign row.
        provider.list().await.expect("list");
        assert!(
            !provider.suspect("ns/p"),
            "a foreign row made the key suspect"
        );

        // A claim whose reply is lost, then the retry.
        drop_next_claim_reply(&sim);
        let pod = Arc::new(pod("u1"));
        let lost = provider.create(&pod).await.expect_err("the reply was lost");
        assert!(lost.message.contains("outcome unknown"), "{lost:?}");
        assert!(provider.suspect("ns/p"));
        let stray: Vec<String> = sim
            .sim()
            .claims()
            .into_iter()
            .filter(|c| c.claim_ref == "ns/p#vk-sandbox:u1")
            .map(|c| c.id)
            .collect();
        assert_eq!(stray.len(), 1, "the lost reply's sandbox exists, tagged");
        let created = provider.create(&pod).await.expect("claim again");
        let Created::Claimed { id, .. } = created else {
            panic!("expected a fresh claim, got {created:?}");
        };
        assert_eq!(released(&sim), stray, "only the lost reply was returned");
        assert!(
            sim.sim().claims().iter().any(|c| c.id == foreign),
            "the neighbour's sandbox was released"
        );
        assert!(sim.sim().claims().iter().any(|c| c.id == id));
        assert!(!provider.suspect("ns/p"));
        let node_auth = format!("Bearer {TOKEN}");
        assert!(
            sim.sim()
                .requests()
                .iter()
                .filter(|r| r.path.ends_with("/release"))
                .all(|r| r.authorization.as_deref() == Some(node_auth.as_str())),
            "strays go back with the node token"
        );
    }

    /// After a restart the only trace of a lost reply is the listing: a
    /// tagged row no stored claim holds marks the key, and the next fresh
    /// claim for that Pod returns it.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_lost_reply_seen_only_in_the_listing_is_returned() {
        let (sim, provider, _dir) = provider_with_token().await;
        let ours = neighbour_claims(&sim, "ns/p#vk-sandbox:u1").await;
        let other_pod = neighbour_claims(&sim, "ns/p#vk-sandbox:u0").await;
        assert!(!provider.suspect("ns/p"));
        provider.list().await.expect("list");
        assert!(provider.suspect("ns/p"));
        let created = provider.create(&Arc::new(pod("u1"))).await.expect("claim");
        assert!(matches!(created, Created::Claimed { .. }), "{created:?}");
        assert_eq!(released(&sim), vec![ours]);
        // A stray of another Pod under the same name is not this Pod's to
        // return (it may be a VM that Pod ran on): it is left alone.
        assert!(sim.sim().claims().iter().any(|c| c.id == other_pod));
    }

    /// A Pod that goes away without having run returns its own strays, and
    /// an unknown outcome is forgotten once settled.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_pod_that_never_ran_returns_its_strays_when_it_goes() {
        let (sim, provider, _dir) = provider_with_token().await;
        let foreign = neighbour_claims(&sim, "ns/p").await;
        drop_next_claim_reply(&sim);
        let p = pod("u1");
        provider
            .create(&Arc::new(p.clone()))
            .await
            .expect_err("the reply was lost");
        assert_eq!(
            provider.unknown_outcomes(),
            vec![("ns/p".into(), "u1".into())]
        );
        provider.settle_unknown("ns/p", "u1").await.expect("settle");
        assert!(provider.unknown_outcomes().is_empty());
        let released = released(&sim);
        assert_eq!(released.len(), 1, "{released:?}");
        assert_ne!(released[0], foreign);
        // forget_never_ran with nothing suspect calls nothing.
        let before = sim.sim().requests().len();
        provider.forget_never_ran(&p).await.expect("nothing to do");
        assert_eq!(sim.sim().requests().len(), before);
    }

    /// Open mode (no node token): nothing can be released by id, so no key
    /// is ever held back as suspect, and a create after a lost reply goes
    /// on (the stray ends at its deadline).
    #[tokio::test(flavor = "multi_thread")]
    async fn open_mode_never_waits_on_strays() {
        let sim = sim_with_pool().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let claims = Arc::new(
            ClaimsStore::open(&dir.path().join("claims.json"))
                .await
                .expect("store"),
        );
        let sandboxd = SandboxdClient::builder(sim.base_url())
            .build()
            .expect("client");
        let provider = Provider::new(silent_client(), sandboxd, claims);
        drop_next_claim_reply(&sim);
        let pod = Arc::new(pod("u1"));
        provider.create(&pod).await.expect_err("lost reply");
        assert!(!provider.suspect("ns/p"));
        provider.list().await.expect("list");
        assert!(!provider.suspect("ns/p"), "open mode marked a key suspect");
        let created = provider.create(&pod).await.expect("claim");
        assert!(matches!(created, Created::Claimed { .. }));
        assert!(released(&sim).is_empty());
    }

    /// A release by id answered 404 is proof of nothing while sandboxd
    /// still lists the sandbox (a tenant token gets that answer): the row
    /// is kept and the release reported as failed.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_404_on_release_by_id_is_not_proof_while_listed() {
        crate::crypto::install_provider();
        let sim = sandboxd_sim::start_local(sandboxd_sim::SimConfig {
            api_token: TOKEN.into(),
            tenants: vec![
                serde_json::from_value(json!({"name": "acme", "token": "tenant-token"}))
                    .expect("tenant"),
            ],
            tenant_list: sandboxd_sim::config::TenantList::Own,
            pools: vec![
                sandboxd_sim::config::PoolConfig::parse_spec("base:24.04=2").expect("pool"),
            ],
            ..Default::default()
        })
        .await
        .expect("sim");
        let dir = tempfile::tempdir().expect("tempdir");
        let claims = Arc::new(
            ClaimsStore::open(&dir.path().join("claims.json"))
                .await
                .expect("store"),
        );
        let tenant = SandboxdClient::builder(sim.base_url())
            .token(Some("tenant-token".into()))
            .build()
            .expect("client");
        let provider = Provider::new(silent_client(), tenant, claims);
        drop_next_claim_reply(&sim);
        let pod = Arc::new(pod("u1"));
        provider.create(&pod).await.expect_err("lost reply");
        let again = provider
            .create(&pod)
            .await
            .expect_err("the stray cannot go");
        assert!(
            again.message.contains("cannot release sandboxes by id"),
            "{again:?}"
        );
        assert_eq!(sim.sim().claims().len(), 1, "the stray is still there");
        assert!(provider.suspect("ns/p"), "the key stays suspect");
    }

    /// A claim recovered without its credential whose commit fails must not
    /// wedge the key: the row is not left "stranded" (returning it would
    /// need a token it does not have); once the state is writable again the
    /// next try recovers it, and nothing is released or claimed twice.
    #[tokio::test(flavor = "multi_thread")]
    async fn recovered_claim_whose_commit_fails_is_recovered_again() {
        crate::crypto::install_provider();
        let sim = sandboxd_sim::start_local(sandboxd_sim::SimConfig {
            api_token: TOKEN.into(),
            pools: vec![
                sandboxd_sim::config::PoolConfig::parse_spec("base:24.04=2").expect("pool"),
            ],
            ..Default::default()
        })
        .await
        .expect("sim");
        let id = neighbour_claims(&sim, "ns/p#vk-sandbox:u1").await;
        let dir = tempfile::tempdir().expect("tempdir");
        let state_dir = dir.path().join("state");
        let parked = dir.path().join("parked");
        let claims = Arc::new(
            ClaimsStore::open(&state_dir.join("claims.json"))
                .await
                .expect("store"),
        );
        let sandboxd = SandboxdClient::builder(sim.base_url())
            .token(Some(TOKEN.into()))
            .build()
            .expect("client");
        let provider = Provider::new(silent_client(), sandboxd, Arc::clone(&claims));
        let mut running = pod("u1");
        running
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(annotations::CLAIM_ID.to_string(), id.clone());
        running.status = Some(k8s_openapi::api::core::v1::PodStatus {
            pod_ip: Some("10.0.0.5".into()),
            ..Default::default()
        });
        let running = Arc::new(running);
        // The state cannot be written: the directory's place is a file.
        std::fs::rename(&state_dir, &parked).expect("park");
        std::fs::write(&state_dir, "").expect("block");
        let failed = provider.create(&running).await.expect_err("not persisted");
        assert!(
            failed.message.contains("persist the recovered claim"),
            "{failed:?}"
        );
        assert!(
            claims.get("ns/p").is_none(),
            "a stranded token-less row was left"
        );
        std::fs::remove_file(&state_dir).expect("unblock");
        std::fs::rename(&parked, &state_dir).expect("restore");
        let created = provider.create(&running).await.expect("recovered");
        assert!(
            matches!(&created, Created::Adopted { id: got, .. } if *got == id),
            "{created:?}"
        );
        assert!(released(&sim).is_empty(), "the Pod's sandbox was released");
        assert_eq!(sim.sim().claims().len(), 1, "a second sandbox was claimed");
    }

    /// Reliability finding: with the claims state lost, a Pod running on
    /// its sandbox must keep it (adopted, to be released with the node
    /// token), not see it returned as a stray and a second one claimed.
    #[tokio::test(flavor = "multi_thread")]
    async fn lost_credential_is_recovered_not_released() {
        let sim = sim_with_pool().await;
        let sandboxd = SandboxdClient::builder(sim.base_url())
            .build()
            .expect("client");
        let first = sandboxd
            .claim(&crate::sandboxd::ClaimRequest {
                template: "base:24.04".into(),
                claim_ref: "ns/p".into(),
                ..Default::default()
            })
            .await
            .expect("claim");
        let dir = tempfile::tempdir().expect("tempdir");
        let claims = Arc::new(
            ClaimsStore::open(&dir.path().join("claims.json"))
                .await
                .expect("store"),
        );
        let provider = Provider::new(silent_client(), sandboxd, Arc::clone(&claims));
        provider.list().await.expect("list");
        let mut running = pod("u1");
        running
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(annotations::CLAIM_ID.to_string(), first.id.clone());
        running.status = Some(k8s_openapi::api::core::v1::PodStatus {
            pod_ip: Some("10.0.0.5".into()),
            ..Default::default()
        });
        let created = provider.create(&Arc::new(running)).await.expect("create");
        assert!(
            matches!(&created, Created::Adopted { id, .. } if *id == first.id),
            "expected the running sandbox adopted, got {created:?}"
        );
        let requests = sim.sim().requests();
        assert!(
            requests.iter().all(|r| !r.path.ends_with("/release")),
            "the running sandbox was released: {requests:?}"
        );
        assert_eq!(
            requests.iter().filter(|r| r.path == "/v1/claim").count(),
            1,
            "a second sandbox was claimed"
        );
        let (stored, _) = claims.get("ns/p").expect("stored");
        assert_eq!(
            (stored.id.as_str(), stored.token.as_str()),
            (first.id.as_str(), "")
        );
        assert_eq!(sim.sim().claims().len(), 1);
    }

    /// After a restart the same Pod resumes its own claim (no Event is
    /// announced for it); a new Pod under the key adopts it. Neither claims.
    #[tokio::test(flavor = "multi_thread")]
    async fn restart_resumes_the_same_pod_and_a_new_pod_adopts() {
        let sim = sim_with_pool().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("claims.json");
        let client = || {
            SandboxdClient::builder(sim.base_url())
                .build()
                .expect("client")
        };
        let claims = Arc::new(ClaimsStore::open(&path).await.expect("store"));
        let first = Provider::new(silent_client(), client(), Arc::clone(&claims));
        let Created::Claimed { id, .. } = first.create(&Arc::new(pod("u1"))).await.expect("claim")
        else {
            panic!("expected a fresh claim");
        };
        claims.compact().await.expect("compact");
        drop((first, claims));

        let claims = Arc::new(ClaimsStore::open(&path).await.expect("reopen"));
        let restarted = Provider::new(silent_client(), client(), Arc::clone(&claims));
        restarted.refresh().await.expect("verify");
        let again = restarted
            .create(&Arc::new(pod("u1")))
            .await
            .expect("resume");
        assert!(
            matches!(&again, Created::Resumed { id: got, .. } if *got == id),
            "same Pod after a restart: {again:?}"
        );
        let other = Provider::new(silent_client(), client(), Arc::clone(&claims));
        let next = other.create(&Arc::new(pod("u2"))).await.expect("adopt");
        assert!(
            matches!(&next, Created::Adopted { id: got, .. } if *got == id),
            "a new Pod under the key: {next:?}"
        );
        assert_eq!(
            sim.sim()
                .requests()
                .iter()
                .filter(|r| r.path == "/v1/claim")
                .count(),
            1,
            "claimed again instead of resuming or adopting"
        );
    }

    /// Test 34: a delete or update for an older generation of a tracked key
    /// is ignored: no release, the claim and the tracked Pod stay.
    #[tokio::test(flavor = "multi_thread")]
    async fn stale_uid_is_ignored() {
        let sim = sim_with_pool().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let claims = Arc::new(
            ClaimsStore::open(&dir.path().join("claims.json"))
                .await
                .expect("store"),
        );
        let sandboxd = SandboxdClient::builder(sim.base_url())
            .build()
            .expect("client");
        let provider = Provider::new(silent_client(), sandboxd, Arc::clone(&claims));

        let created = provider.create(&Arc::new(pod("u2"))).await.expect("create");
        let Created::Claimed { id, .. } = created else {
            panic!("expected a fresh claim, got {created:?}");
        };
        let deleted = tokio::time::timeout(Duration::from_secs(5), provider.delete(&pod("u1")))
            .await
            .expect("a stale delete must not call out")
            .expect("delete");
        assert_eq!(deleted, Deleted::Stale);
        provider.update_tracked(&Arc::new(pod("u1")));
        assert_eq!(
            provider
                .tracked("ns/p")
                .and_then(|p| p.metadata.uid.clone())
                .as_deref(),
            Some("u2"),
            "an update for an old generation replaced the tracked Pod"
        );
        assert_eq!(claims.get("ns/p").map(|(c, _)| c.id), Some(id));
        assert!(
            sim.sim()
                .requests()
                .iter()
                .all(|r| !r.path.ends_with("/release")),
            "a stale delete released the sandbox"
        );
    }
}
