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
use super::status::{self, ClaimView};
use crate::claims::{Claim, ClaimState, ClaimsStore};
use crate::sandboxd::{SandboxRow, SandboxdClient, SandboxdError, Secret, pod_ip_from_owner_addr};

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
}

pub struct Provider {
    pub client: Client,
    pub sandboxd: SandboxdClient,
    pub claims: Arc<ClaimsStore>,
    owners: OwnerResolver,
    /// Pods this provider has claimed for or adopted, by key. Shared with
    /// the watch cache (the same `Arc`), not a second copy of each Pod.
    tracked: Mutex<HashMap<String, Arc<Pod>>>,
    /// Keys whose last claim had an unknown outcome, or which sandboxd lists
    /// under a claim_ref no stored claim holds: before claiming for them
    /// again, stray sandboxes are returned (decisions.md D7).
    suspects: Mutex<HashSet<String>>,
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
            suspects: Mutex::new(HashSet::new()),
        }
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

    /// Marks keys for which sandboxd lists rows that no stored claim holds
    /// (computed once at start-up from a successful listing).
    pub fn note_suspects(&self, listing: &[SandboxRow]) {
        let held = self.claims.held_ids();
        let mut s = lock(&self.suspects);
        for row in listing {
            if !row.claim_ref.is_empty() && !held.contains(&row.id) {
                s.insert(row.claim_ref.clone());
            }
        }
    }

    /// Runs §4.5 verification once: list sandboxd, lift or drop quarantined
    /// rows. A failed list changes nothing.
    pub async fn verify(&self) -> Result<(), SandboxdError> {
        let snapshot = self.claims.quarantined();
        if snapshot.is_empty() {
            return Ok(());
        }
        let listing = self.sandboxd.list().await?;
        match self.claims.apply_verification(&snapshot, &listing).await {
            Ok(report) => info!(
                ?report,
                "claims from the previous run verified against sandboxd"
            ),
            Err(e) => warn!(error = %e, "verification could not be persisted; will retry"),
        }
        Ok(())
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
            self.verify().await.map_err(|e| {
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
            let listing = self.sandboxd.list().await.map_err(|e| {
                CreateFailure::provider(format!(
                    "the claim for {k} is past its cached deadline and sandboxd cannot be \
                     listed; refusing to replace it: {e}"
                ))
            })?;
            match listing.iter().find(|r| r.id == claim.id) {
                Some(row) => {
                    let _ = self
                        .claims
                        .set_deadline(&k, &claim.id, row.deadline.expires_at())
                        .await;
                }
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

        // 5. A stranded claim (an earlier commit and undo both failed).
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

        // D7: return strays from an earlier claim whose reply was lost.
        if lock(&self.suspects).contains(&k) {
            self.return_strays(&k).await.map_err(|e| {
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
                    lock(&self.suspects).insert(k.clone());
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
        // 11. Running.
        Ok(Created::Claimed {
            id: claim.id.clone(),
            status: status::running(pod, &view(&claim)),
        })
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
        let listing = self.sandboxd.list().await.map_err(|e| {
            CreateFailure::provider(format!(
                "{k} ran on sandbox {id}, which no stored claim holds, and sandboxd cannot be \
                 listed to check whether it lives; refusing to claim a second one: {e}"
            ))
        })?;
        let Some(row) = listing.iter().find(|r| r.id == *id && r.claim_ref == k) else {
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
        self.claims.commit(k, claim.clone()).await.map_err(|e| {
            CreateFailure::provider(format!(
                "persist the recovered claim of {k} on sandbox {id}: {e}"
            ))
        })?;
        lock(&self.suspects).remove(k);
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
    /// recovered without one.
    async fn release_claim(&self, claim: &Claim) -> Result<(), SandboxdError> {
        if claim.token.is_empty() {
            self.sandboxd.release_as_node(&claim.id).await.map(|_| ())
        } else {
            let token = Secret::new(claim.token.clone());
            self.sandboxd.release(&claim.id, &token).await.map(|_| ())
        }
    }

    async fn undo_release(&self, claim: &Claim) -> Result<(), SandboxdError> {
        let token = Secret::new(claim.token.clone());
        match tokio::time::timeout(UNDO_TIMEOUT, self.sandboxd.release(&claim.id, &token)).await {
            Ok(r) => r.map(|_| ()),
            Err(_) => Err(SandboxdError::Config(format!(
                "release of {} timed out after {UNDO_TIMEOUT:?}",
                claim.id
            ))),
        }
    }

    /// Releases, with the node token, sandboxes sandboxd lists under `k`
    /// that no stored claim holds. Only called right before claiming for
    /// `k`, which holds no claim, so nothing live of ours is touched.
    async fn return_strays(&self, k: &str) -> Result<(), SandboxdError> {
        let listing = self.sandboxd.list().await?;
        let held = self.claims.held_ids();
        for row in listing
            .iter()
            .filter(|r| r.claim_ref == k && !held.contains(&r.id))
        {
            match self.sandboxd.release_as_node(&row.id).await {
                Ok(_) => {
                    info!(pod = %k, sandbox = %row.id, "returned a sandbox whose claim reply was lost")
                }
                Err(e) => return Err(e),
            }
        }
        lock(&self.suspects).remove(k);
        Ok(())
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
                self.release_claim(&claim).await?;
                if let Err(e) = self.claims.remove(&k, &claim.id).await {
                    warn!(pod = %k, error = %e, "release done but its record could not be removed");
                }
                self.untrack(&k, uid(pod));
                info!(pod = %k, sandbox = %claim.id, %reason, "released sandbox");
                Ok(Deleted::Released {
                    id: claim.id,
                    reason,
                })
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
        let _ = rustls::crypto::ring::default_provider().install_default();
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
        let listing = provider.sandboxd.list().await.expect("list");
        provider.note_suspects(&listing);
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
        restarted.verify().await.expect("verify");
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
