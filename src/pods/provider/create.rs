//! Create: carry out [`next_step`]'s decisions until one ends the create
//! (adopted, resumed, claimed, or refused).

use std::sync::Arc;
use std::time::Instant;

use jiff::Timestamp;
use tracing::{info, warn};

use super::create_step::{CreateStep, adoption, claim_failed, next_step, strays_unchecked};
use super::lifecycle::WakeError;
use super::verification::Ask;
use super::{CreateFailure, Created, Provider, lock, view};
use crate::claims::{Claim, Lifecycle, OwnerRef, VmState};
use crate::pods::authority::OwnerState;
use crate::pods::failure::Cause;
use crate::pods::lifecycle::reason;
use crate::pods::pod::Pod;
use crate::pods::{authority, claim_ref, status};
use crate::sandboxd::ClaimRequest;

/// Steps that change the row (verify, confirm, drop, return) each run at
/// most once per create; the rest end it.
const MAX_STEPS: usize = 6;

impl Provider {
    /// Lists sandboxd to vouch for the quarantined rows, sharing the
    /// listing with the creates that asked meanwhile (`verification.rs`);
    /// `Err` says why it could not.
    async fn verify(&self) -> Result<(), String> {
        let asked = Instant::now();
        let mut v = self.verification.lock().await;
        match v.ask(asked, Instant::now()) {
            Ask::Verified => return Ok(()),
            Ask::Failed(why) => return Err(why),
            Ask::List => {}
        }
        let started = Instant::now();
        match self.refresh().await {
            Ok(_) => {
                v.succeeded(started);
                Ok(())
            }
            Err(e) => {
                v.failed(Instant::now(), e.to_string());
                Err(e.to_string())
            }
        }
    }

    /// Create: adopt a held claim or claim a new sandbox.
    pub async fn create(&self, pod: &Arc<Pod>) -> Result<Created, CreateFailure> {
        let k = pod.key();
        let mut done: Vec<CreateStep> = Vec::new();
        for _ in 0..MAX_STEPS {
            let row = self.claims.get(&k);
            let step = next_step(row.as_ref().map(|(c, s)| (c, *s)), pod, Timestamp::now());
            if done.contains(&step) {
                // The step before did not change the row (e.g. a
                // verification that could not be persisted): try later.
                return Err(CreateFailure::ours(format!(
                    "the claim row for {k} is unchanged after {step:?}; retried later"
                )));
            }
            let Some((claim, _)) = row else {
                return match step {
                    CreateStep::Recover { id, then } => {
                        match self.recover_lost_claim(pod, &k, &id).await? {
                            Some(recovered) => Ok(recovered),
                            None => self.claim_new(pod, &k, *then).await,
                        }
                    }
                    other => self.claim_new(pod, &k, other).await,
                };
            };
            match &step {
                CreateStep::Refuse(why) => return Err(CreateFailure::refused(why.clone())),
                CreateStep::Verify => {
                    self.verify().await.map_err(|e| {
                        CreateFailure::ours(format!(
                            "a claim from a previous run is unverified and sandboxd cannot be \
                             listed; refusing to claim over a possibly live sandbox: {e}"
                        ))
                    })?;
                }
                CreateStep::ConfirmDeadline => {
                    if let Some(adopted) = self.confirm_deadline(pod, &k, &claim).await? {
                        return Ok(adopted);
                    }
                }
                CreateStep::Adopt { wake } => {
                    return self.adopt(pod, &k, claim, false, *wake).await;
                }
                CreateStep::Resume { wake } => {
                    return self.adopt(pod, &k, claim, true, *wake).await;
                }
                CreateStep::Supersede(owner) => {
                    self.supersede(pod, &k, &claim, owner).await?;
                }
                CreateStep::DropUnrecorded => {
                    let _ = self.claims.remove(&k, &claim.id).await;
                }
                CreateStep::ReturnStranded(token) => {
                    self.undo_release(&claim.id, token).await.map_err(|e| {
                        CreateFailure::ours(format!(
                            "a previous sandbox {} for {k} could not be returned and its \
                             credential is only in memory: {e}",
                            claim.id
                        ))
                    })?;
                    let _ = self.claims.remove(&k, &claim.id).await;
                }
                // Only without a row (above).
                CreateStep::Recover { .. } | CreateStep::Claim(_) => {}
            }
            done.push(step);
        }
        Err(CreateFailure::ours(format!(
            "the claim path for {k} did not settle in {MAX_STEPS} steps; retried later"
        )))
    }

    /// The row's VM serves another owner generation than `pod`'s: its
    /// recorded `owner` decides. Gone (deleted, or replaced by a new object
    /// of its name): its VM is released and the row dropped, so the create
    /// goes on to claim a fresh one. Alive or in doubt: nothing is handed
    /// over and the Pod waits, retried.
    async fn supersede(
        &self,
        pod: &Pod,
        k: &str,
        claim: &Claim,
        owner: &OwnerRef,
    ) -> Result<(), CreateFailure> {
        let held_for = format!(
            "sandbox {} under {k} was claimed for {} {} (uid {})",
            claim.id, owner.kind, owner.name, owner.uid
        );
        match self.owners.of_stored(k, owner).await.state() {
            OwnerState::Gone(why) => {
                info!(pod = %k, sandbox = %claim.id, %why,
                      "the claim's owner generation is gone: released, a fresh one is claimed");
                self.release_held(k, claim).await.map_err(|e| {
                    CreateFailure::ours(format!(
                        "{held_for}, which is gone ({why}); releasing it failed, retried \
                         before a fresh sandbox is claimed for Pod {}: {e}",
                        pod.uid()
                    ))
                })?;
                lock(&self.preserved).remove(k);
                Ok(())
            }
            OwnerState::Alive(_) | OwnerState::None => Err(CreateFailure::ours(format!(
                "{held_for}, which still exists; this Pod's controller is another object, so \
                 that sandbox (its memory and files) is not handed over; the Pod waits until \
                 that owner is gone"
            ))),
            OwnerState::Doubt(why) => Err(CreateFailure::ours(format!(
                "{held_for}; whether that owner still exists cannot be told ({why}), so \
                 nothing is handed over or released yet; retried"
            ))),
        }
    }

    /// A settled row past its cached deadline: sandboxd decides. Listed:
    /// its deadline is taken (it may have been renewed, or become "none")
    /// and the claim adopted. Not listed: the row goes.
    async fn confirm_deadline(
        &self,
        pod: &Arc<Pod>,
        k: &str,
        claim: &Claim,
    ) -> Result<Option<Created>, CreateFailure> {
        let listing = self.list().await.map_err(|e| {
            CreateFailure::ours(format!(
                "the claim for {k} is past its cached deadline and sandboxd cannot be \
                 listed; refusing to replace it: {e}"
            ))
        })?;
        match listing.iter().find(|r| r.id == claim.id) {
            Some(row) => {
                self.take_listed_deadline(k, claim, row).await;
                let (resumed, wake) = match adoption(claim, pod) {
                    CreateStep::Resume { wake } => (true, wake),
                    CreateStep::Adopt { wake } => (false, wake),
                    _ => (false, false),
                };
                self.adopt(pod, k, claim.clone(), resumed, wake)
                    .await
                    .map(Some)
            }
            None => {
                let _ = self.claims.remove(k, &claim.id).await;
                Ok(None)
            }
        }
    }

    /// Adopt in place: the VM outlived its previous Pod (or this process
    /// restarted under the same Pod, `resumed`). A VM vk-sandbox hibernated
    /// is woken first (`wake`): the Pod runs only once it answers. The new
    /// Pod's owner is recorded, and the VM no longer hibernated, in the
    /// adoption's one write.
    async fn adopt(
        &self,
        pod: &Arc<Pod>,
        k: &str,
        claim: Claim,
        resumed: bool,
        wake: bool,
    ) -> Result<Created, CreateFailure> {
        let waiting = std::time::Instant::now();
        let woken = wake && self.wake_for(pod, k, &claim).await?;
        let owner = authority::owner_of(pod);
        // A claim made without a Pod address of its own (before
        // --pod-cidr was set) gets one with its next Pod; the Pod that
        // already runs keeps the address it was given.
        let address = (!resumed && claim.lifecycle.pod_ip.is_none())
            .then(|| self.next_pod_ip(k))
            .flatten();
        let recorded = self
            .claims
            .rebind_with(k, &claim.id, pod.uid(), |l| {
                if owner.is_some() {
                    l.owner = owner;
                }
                if address.is_some() && l.pod_ip.is_none() {
                    l.pod_ip = address;
                }
                if woken {
                    l.vm = VmState::Running;
                }
            })
            .await;
        // The wake call and the commit (what lies between takes µs).
        let waited = waiting.elapsed();
        if let Err(e) = recorded {
            warn!(pod = %k, error = %e, "adoption not persisted; the claim is kept in memory");
        }
        self.track(pod);
        let claim = self.claims.get(k).map(|(c, _)| c).unwrap_or(claim);
        self.endpoints_changed();
        let (id, status) = (claim.id.clone(), status::running(pod, &view(&claim)));
        Ok(if woken {
            Created::Woken { id, status, waited }
        } else if resumed {
            Created::Resumed { id, status }
        } else {
            Created::Adopted { id, status }
        })
    }

    /// Wakes the VM of a claim about to be adopted. `Ok(false)`: it cannot
    /// be asked (a recovered claim without a token, and no node token): the
    /// first relay call wakes it. A VM sandboxd no longer has loses the row
    /// (its next create claims a fresh one); a failed wake keeps the Pod
    /// Pending, retried.
    async fn wake_for(&self, pod: &Pod, k: &str, claim: &Claim) -> Result<bool, CreateFailure> {
        self.note_wake_asked(pod, k, claim).await?;
        match self.wake_claim(claim).await {
            Ok(()) => {
                // An archived VM came back with a fresh lease: take it.
                if matches!(claim.lifecycle.vm, VmState::Archived { .. })
                    && let Ok(info) = self.sandboxd.get(&claim.id).await
                {
                    let deadline = info.deadline.expires_at();
                    let _ = self
                        .claims
                        .update_lifecycle(k, &claim.id, |_, d| *d = deadline)
                        .await;
                }
                Ok(true)
            }
            Err(WakeError::NoCredential) => {
                warn!(pod = %k, sandbox = %claim.id,
                      "no credential can wake this recovered claim; its first relay call will");
                Ok(false)
            }
            Err(WakeError::Gone) => {
                let _ = self.claims.remove(k, &claim.id).await;
                Err(CreateFailure {
                    reason: reason::LOST,
                    message: format!(
                        "the hibernated sandbox {} of {k} is gone from sandboxd (its lease \
                         ended, or its archive was deleted); a fresh one is claimed next, \
                         without its memory and files (Pod {})",
                        claim.id,
                        pod.uid()
                    ),
                    cause: Cause::Ours,
                    shortfall: None,
                })
            }
            Err(WakeError::Failed(e)) => Err(CreateFailure {
                reason: reason::WAKE_FAILED_STATUS,
                message: format!("waking sandbox {} for {k} failed; retried: {e}", claim.id),
                cause: Cause::Ours,
                shortfall: None,
            }),
        }
    }

    /// Before a hibernated VM is woken, the record stops saying
    /// "hibernated": once the wake is sent the VM may run whatever its reply
    /// says (sandboxd finishes a wake after its client has gone: a reply
    /// past the timeout, this process killed while waiting). A pending
    /// hibernate is what it is then: the key's next Pod wakes it, and a
    /// suspend before that hibernates it again (sandboxd's hibernate is
    /// idempotent). Not recorded, the wake is not sent.
    async fn note_wake_asked(
        &self,
        pod: &Pod,
        k: &str,
        claim: &Claim,
    ) -> Result<(), CreateFailure> {
        // An archived VM too: a wake whose reply is lost still ends the
        // archive, and a record left `Archived` would then never be
        // hibernated on a suspend nor renewed (defect review 2026-12-b,
        // finding 1).
        let asleep =
            |vm: &VmState| matches!(vm, VmState::Hibernated { .. } | VmState::Archived { .. });
        if !asleep(&claim.lifecycle.vm) {
            return Ok(());
        }
        let why = format!("being woken for Pod {}", pod.uid());
        let since = Timestamp::now();
        self.claims
            .update_lifecycle(k, &claim.id, |l, _| {
                if asleep(&l.vm) {
                    l.vm = VmState::Hibernating { why, since };
                }
            })
            .await
            .map(|_| ())
            .map_err(|e| {
                CreateFailure::ours(format!(
                    "cannot record that sandbox {} of {k} is being woken, so it is not woken \
                     yet; retried: {e}",
                    claim.id
                ))
            })
    }

    /// No row: claim a new sandbox (`step` is [`CreateStep::Claim`], or
    /// why not), after returning strays of this Pod's earlier claims whose
    /// reply was lost; while no listing has succeeded (after a restart, or
    /// since the last failure) any key may have one. Durable before it
    /// counts: a claim whose commit fails is returned.
    async fn claim_new(
        &self,
        pod: &Arc<Pod>,
        k: &str,
        step: CreateStep,
    ) -> Result<Created, CreateFailure> {
        let request: ClaimRequest = match step {
            CreateStep::Claim(request) => request,
            CreateStep::Refuse(why) => return Err(CreateFailure::refused(why)),
            other => {
                return Err(CreateFailure::ours(format!(
                    "internal: no claim step for {k} without a row ({other:?})"
                )));
            }
        };
        if self.suspect(k) || self.refresh_needed() {
            let unchecked = |e| strays_unchecked(k, &e);
            self.return_strays(k, pod.uid(), None)
                .await
                .map_err(unchecked)?;
        }
        // The sandboxd call and the commit below are timed so the
        // provider's own share of the claim path can be told apart from
        // the waits on sandboxd and the disk.
        let waiting = std::time::Instant::now();
        let granted = match self.sandboxd.claim(&request).await {
            Ok(c) => c,
            Err(e) => {
                if e.is_outcome_unknown() {
                    self.note_unknown_outcome(k, pod.uid());
                }
                return Err(claim_failed(k, &request.template, &e));
            }
        };
        let now = Timestamp::now();
        let deadline = granted.deadline.expires_at();
        let claim = Claim {
            id: granted.id.clone(),
            token: Some(granted.token.clone()),
            address: granted.owner_addr.clone(),
            pod_uid: pod.uid().to_string(),
            claimed_at: now,
            deadline,
            // The owner, so the claim can be looked after once its Pod is
            // gone (suspended, evicted); the lease asked and granted, for
            // its renewals.
            lifecycle: Box::new(Lifecycle {
                owner: authority::owner_of(pod),
                pod_ip: self.next_pod_ip(k),
                ttl_seconds: Some(request.ttl_seconds),
                granted_seconds: deadline
                    .and_then(|d| u64::try_from(d.duration_since(now).as_secs()).ok())
                    .filter(|s| *s > 0),
                ..Default::default()
            }),
        };
        let committed = self.claims.commit(k, claim.clone()).await;
        // The claim call and the commit (building the row between them
        // takes microseconds).
        let waited = waiting.elapsed();
        if let Err(persist) = committed {
            // Return the sandbox rather than hold an unrecorded credential.
            return match self.undo_release(&granted.id, &granted.token).await {
                Ok(()) => {
                    let _ = self.claims.remove(k, &claim.id).await;
                    Err(CreateFailure::ours(format!(
                        "persist claim for {k}: {persist}"
                    )))
                }
                Err(undo) => Err(CreateFailure::ours(format!(
                    "persist claim for {k}: {persist}; returning sandbox {} also failed: {undo}",
                    claim.id
                ))),
            };
        }
        self.track(pod);
        // Running, from the row as stored (times at the store's precision),
        // so a later re-publish computes the same status.
        let claim = self.claims.get(k).map(|(c, _)| c).unwrap_or(claim);
        self.endpoints_changed();
        Ok(Created::Claimed {
            id: claim.id.clone(),
            status: status::running(pod, &view(&claim)),
            waited,
        })
    }

    /// The Pod names (claim-id annotation) a sandbox sandboxd lists as
    /// claimed for this Pod (its key and UID in the tag), and no stored
    /// claim holds it: its credential is gone but the VM is the Pod's. An
    /// untagged row under the key may be a neighbour's Sandbox of the same
    /// name, and another UID's row an earlier Pod's: neither is recovered.
    /// Recorded without a token; [`Provider::delete`] releases it with the
    /// node token.
    async fn recover_lost_claim(
        &self,
        pod: &Arc<Pod>,
        k: &str,
        id: &str,
    ) -> Result<Option<Created>, CreateFailure> {
        if self.claims.held_ids().contains(id) {
            return Ok(None);
        }
        let listing = self.list().await.map_err(|e| {
            CreateFailure::ours(format!(
                "{k} ran on sandbox {id}, which no stored claim holds, and sandboxd cannot be \
                 listed to check whether it lives; refusing to claim a second one: {e}"
            ))
        })?;
        let Some(row) = listing
            .iter()
            .find(|r| r.id == id && claim_ref::made_for(&r.claim_ref, k, pod.uid()))
        else {
            return Ok(None);
        };
        let address = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default();
        let claim = Claim {
            id: id.to_string(),
            token: None,
            address,
            pod_uid: pod.uid().to_string(),
            claimed_at: Timestamp::now(),
            deadline: row.deadline.expires_at(),
            lifecycle: Default::default(),
        };
        if let Err(e) = self.claims.commit(k, claim.clone()).await {
            // Nothing to undo (the sandbox is the Pod's, and there is no
            // credential to lose): drop the row so the next try recovers it
            // again instead of finding a stranded claim it cannot return.
            let _ = self.claims.remove(k, id).await;
            return Err(CreateFailure::ours(format!(
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
        self.endpoints_changed();
        Ok(Some(Created::Adopted {
            id: claim.id.clone(),
            status: status::running(pod, &view(&claim)),
        }))
    }
}
