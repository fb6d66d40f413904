//! The lifecycle upkeep loop (docs/architecture.md, "Sandbox lifecycle"):
//! each turn (every 2 s) picks the claims whose turn has come — a lease due
//! for renewal, a hibernate pending, a claim with no Pod of its key here
//! (every 30 s while its VM runs, every 5 min while hibernated), a Pod whose
//! owner reference names a version the apiserver does not serve (every
//! minute) — asks the owner, and does what [`upkeep`] decides: renew,
//! hibernate, release. At most [`AT_ONCE`] claims at a time, each with its
//! own back-off after a failure (2 s doubling to 5 min). Every 30 s (a
//! quarter of the shortest lease, if shorter) a turn first lists sandboxd
//! and corrects records that fell behind the VM (`observe`). This module
//! holds the loop and a turn's questions and decision; `acts` what a
//! decision does; `slot` each claim's schedule and how a turn moves it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use tracing::{Instrument, debug, info_span, warn};

use super::authority::owner_of;
use super::context::Context;
use super::lifecycle::decide::{OwnerState, Settings, Turn as Facts, Upkeep, Whereabouts, upkeep};
use super::lifecycle::schedule::{self, Due, Lease, PodHere};
use super::owners::Owner;
use super::pod::Pod;
use crate::claims::{Claim, VmState};
use crate::periodic::{Beat, Next, Turn};
use kube::runtime::reflector::{ObjectRef, Store};

mod acts;
mod observe;
mod slot;
mod turn;

pub use acts::report_hibernation;
use acts::{Released, hibernate, regarding, release, renew};
use slot::{Looked, Slots};
use turn::{Held, Went};

/// The loop's period.
pub const PERIOD: Duration = Duration::from_secs(2);
/// Claims looked after at once.
pub const AT_ONCE: usize = 8;
/// How long one claim's turn may take before `/livez` fails (each call
/// in it has its own, shorter timeout).
const CLAIM_BOUND: Duration = Duration::from_secs(300);
/// How often the loop beats while claims are being looked after.
const BEAT_WHILE_WAITING: Duration = Duration::from_millis(100);
/// The upkeep loop's state: the context and each claim's schedule, by
/// (key, claim id).
pub struct LifecycleUpkeep {
    ctx: Arc<Context>,
    /// The watch cache: which Pods are on this node.
    store: Store<Pod>,
    slots: Slots,
    /// When sandboxd's listing was last compared with the records (`None`:
    /// on the next turn). The first look comes a period after the start:
    /// the start-up's verification has just listed sandboxd.
    observed_at: Option<std::time::Instant>,
}

impl LifecycleUpkeep {
    pub fn new(ctx: Arc<Context>, store: Store<Pod>) -> LifecycleUpkeep {
        LifecycleUpkeep {
            ctx,
            store,
            slots: Slots::new(),
            observed_at: Some(std::time::Instant::now()),
        }
    }

    /// Tests: the next turn lists sandboxd and corrects the records.
    #[cfg(test)]
    pub fn observe_next_turn(&mut self) {
        self.observed_at = None;
    }

    /// Every [`observe::period`]: lists sandboxd and corrects the
    /// records that disagree; a corrected claim's schedule starts over,
    /// so this turn decides on it.
    async fn observe_if_due(&mut self, beat: &Beat) {
        let rows = self.ctx.provider.settled_claims();
        let now = std::time::Instant::now();
        if !slot::observe_due(self.observed_at, now, observe::period(&rows)) {
            return;
        }
        self.observed_at = Some(now);
        beat.beat();
        let _working = self
            .ctx
            .health
            .as_ref()
            .map(|h| h.working("lifecycle upkeep: sandboxd's listing", CLAIM_BOUND));
        let span = info_span!("upkeep_observe", node = %self.ctx.node);
        for corrected in observe::observe(&self.ctx, &rows).instrument(span).await {
            self.slots.remove(&corrected);
        }
        beat.beat();
    }
}

/// The Pod of `key` on this node (the watch cache), and whether it is
/// being deleted. After a restart the cache knows every Pod here before
/// the reconciles have resumed them.
fn pod_here(store: &Store<Pod>, key: &str) -> (Option<Arc<Pod>>, PodHere) {
    let (ns, name) = key.split_once('/').unwrap_or(("default", key));
    match store.get(&ObjectRef::new(name).within(ns)) {
        None => (None, PodHere::No),
        Some(p) if p.metadata.deletion_timestamp.is_some() => (Some(p), PodHere::Deleting),
        Some(p) if p.terminal() => (None, PodHere::No),
        Some(p) => (Some(p), PodHere::Running),
    }
}

fn lease<'a>(claim: &'a Claim, pod: Option<&Pod>) -> Lease<'a> {
    // The Pod's annotation, while it is here; else what was recorded.
    let asked = pod
        .and_then(|p| super::annotations::claim_request(p).ok())
        .map(|r| r.ttl_seconds)
        .or(claim.lifecycle.ttl_seconds);
    Lease {
        id: &claim.id,
        deadline: claim.deadline,
        ttl_seconds: asked,
        granted_seconds: claim.lifecycle.granted_seconds,
    }
}

impl Turn for LifecycleUpkeep {
    async fn turn(&mut self, beat: &Beat) -> Next {
        self.observe_if_due(beat).await;
        let now = Timestamp::now();
        let settings = self.ctx.provider.lifecycle();
        let rows = self.ctx.provider.settled_claims();
        slot::keep_held(&mut self.slots, &rows);
        let mut nearest: Option<i64> = None;
        let mut due = Vec::new();
        for (key, claim) in rows {
            let (pod, here) = pod_here(&self.store, &key);
            let unserved = pod
                .as_deref()
                .and_then(owner_of)
                .and_then(|o| self.ctx.owners.version_served(&o))
                == Some(false);
            let slot = self.slots.get(&(key.clone(), claim.id.clone()));
            let facts = schedule::Facts {
                lease: lease(&claim, pod.as_deref()),
                vm: &claim.lifecycle.vm,
                pod: here,
                owner_recorded: claim.lifecycle.owner.is_some(),
                reference_unserved: unserved,
                retry_at: slot.and_then(|s| s.retry_at),
                recheck_at: slot.and_then(|s| s.recheck_at),
                renewal_waits_until: slot.and_then(|s| s.renewal_waits_until),
            };
            if !settings.renew_margin.is_zero()
                && !matches!(claim.lifecycle.vm, VmState::Archived { .. })
                && let Some(d) = claim.deadline
            {
                let left = d.duration_since(now).as_secs();
                nearest = Some(nearest.map_or(left, |n| n.min(left)));
            }
            if let Some(why) = schedule::due(&facts, settings.renew_margin, now) {
                due.push((key, claim, pod, here, unserved, why));
            }
        }
        if let Some(left) = nearest {
            self.ctx.metrics.claim_lease_remaining_min(left as f64);
        }
        let (ctx, store) = (&self.ctx, &self.store);
        let work = futures::stream::iter(due)
            .map(|(key, claim, _pod, here, unserved, why)| async move {
                beat.beat();
                // A claim stuck past its bound fails `/livez`; the loop
                // itself beats while its claims wait on sandboxd or the
                // apiserver.
                let _working = ctx
                    .health
                    .as_ref()
                    .map(|h| h.working("lifecycle upkeep of a claim", CLAIM_BOUND));
                let span = info_span!("upkeep", node = %ctx.node, pod = %key, sandbox = %claim.id);
                let went = look_after(ctx, store, settings, &key, &claim, why)
                    .instrument(span)
                    .await;
                (key, claim, here, unserved, why, went)
            })
            .buffer_unordered(AT_ONCE)
            .inspect(|_| beat.beat())
            .collect::<Vec<(String, Claim, PodHere, bool, Due, Went)>>();
        tokio::pin!(work);
        let mut tick = tokio::time::interval(BEAT_WHILE_WAITING);
        let results = loop {
            tokio::select! {
                done = &mut work => break done,
                _ = tick.tick() => beat.beat(),
            }
        };
        let now = Timestamp::now();
        for (key, claim, here, unserved, why, went) in results {
            let looked = Looked {
                why,
                vm: &claim.lifecycle.vm,
                here,
                reference_unserved: unserved,
                deadline: claim.deadline,
            };
            self.slots
                .entry((key, claim.id.clone()))
                .or_default()
                .after(went, &looked, now);
        }
        Next::Period
    }
}

/// How long a due renewal waits for its key before it goes on without it.
/// The key may be held for as long as a slow sandboxd call (a wake, up to
/// its 10 s timeout), which with a failed renewal or two can use up a
/// short lease's window: sandboxd would reap the VM of a living owner.
/// A renewal needs no lock: sandboxd serializes it with the VM's
/// transitions itself, and its record is made only if the row still
/// holds the claim.
const RENEWAL_LOCK_WAIT: Duration = Duration::from_secs(2);

/// One claim's turn: ask the apiserver (the owner, where its Pod runs)
/// with the key free, then, under the key's lock (no reconcile or other
/// side loop works on the key meanwhile), decide and act, provided the row
/// and the Pod here are still what they were when the questions were asked.
/// Those questions are API round trips (a second under a burst): a
/// resumed Pod's reconcile waiting on the key behind them waited as long
/// before its wake. A due renewal whose key stays busy is made without the
/// lock.
async fn look_after(
    ctx: &Context,
    store: &Store<Pod>,
    settings: Settings,
    key: &str,
    claim: &Claim,
    why: Due,
) -> Went {
    let provider = &ctx.provider;
    // As things are now: the row and the Pod may have changed since the
    // loop collected the due claims.
    let Some(asked_for) = Local::read(ctx, store, key, &claim.id) else {
        return Went::Through;
    };
    let asked = match ask(ctx, key, &asked_for, settings).await {
        Ok(asked) => asked,
        Err(went) => return went,
    };
    let guard = if why == Due::Renewal {
        tokio::time::timeout(RENEWAL_LOCK_WAIT, provider.lock_key(key))
            .await
            .ok()
    } else {
        Some(provider.lock_key(key).await)
    };
    let _key = match guard {
        Some(g) => g,
        None => {
            debug!("the key is busy (a slow wake?): the due lease is renewed without it");
            let now = match still(ctx, store, key, &asked_for) {
                Ok(now) => now,
                Err(went) => return went,
            };
            if let Some(went) = act(ctx, key, &now, &asked, settings, why, Held::No).await {
                return went;
            }
            provider.lock_key(key).await
        }
    };
    match still(ctx, store, key, &asked_for) {
        Ok(now) => act(ctx, key, &now, &asked, settings, why, Held::Yes)
            .await
            .unwrap_or(Went::Through),
        Err(went) => went,
    }
}

/// The key's row and Pod as they are now, if nothing a decision reads
/// changed since `asked_for`; otherwise how the turn went without acting.
fn still(ctx: &Context, store: &Store<Pod>, key: &str, asked_for: &Local) -> Result<Local, Went> {
    match Local::read(ctx, store, key, &asked_for.claim.id) {
        Some(now) if now.same(asked_for) => Ok(now),
        Some(_) => {
            debug!("the key changed while its owner was asked: asked again next turn");
            Err(Went::Changed)
        }
        None => Err(Went::Through),
    }
}

/// The key's row and Pod on this node, as a turn reads them.
struct Local {
    claim: Claim,
    pod: Option<Arc<Pod>>,
    here: PodHere,
    tracked: bool,
}

impl Local {
    /// `None`: nothing for the upkeep (the row is gone or holds another
    /// claim, or the key's Pod is its reconcile's: being deleted, or
    /// tracked but not yet in the watch cache).
    fn read(ctx: &Context, store: &Store<Pod>, key: &str, id: &str) -> Option<Local> {
        let claim = ctx.provider.settled_claims_of(key).filter(|c| c.id == id)?;
        let (pod, here) = pod_here(store, key);
        let tracked = ctx.provider.tracked(key).is_some();
        if here == PodHere::Deleting || (pod.is_none() && tracked) {
            return None;
        }
        Some(Local {
            claim,
            pod,
            here,
            tracked,
        })
    }

    /// Nothing a decision reads changed: the row (an adoption rebinds it,
    /// a wake or a renewal records itself in it), the Pod here (the same
    /// one, in the same state), whether a reconcile tracks one.
    fn same(&self, other: &Local) -> bool {
        let uid = |l: &Local| l.pod.as_ref().map(|p| p.uid().to_string());
        self.claim == other.claim
            && self.here == other.here
            && self.tracked == other.tracked
            && uid(self) == uid(other)
    }
}

/// What the apiserver answered for a turn.
struct Asked {
    owner: Owner,
    whereabouts: Whereabouts,
}

/// Asks the owner and, when the decision needs it, where the owner's Pod
/// runs. `Err`: how the turn went without an answer.
async fn ask(ctx: &Context, key: &str, local: &Local, settings: Settings) -> Result<Asked, Went> {
    let owner = match (&local.pod, &local.claim.lifecycle.owner) {
        (Some(p), _) => ctx.owners.of_pod(p).await,
        (None, Some(owner)) => ctx.owners.of_stored(key, owner).await,
        (None, None) => return Err(Went::Through),
    };
    let state = owner.state();
    let mut asked = Asked {
        owner,
        whereabouts: Whereabouts::Unknown,
    };
    if upkeep(&facts(local, &state, Whereabouts::Unknown, settings)) == Upkeep::AskWhereabouts
        && let Some(owner) = &local.claim.lifecycle.owner
    {
        match ctx.owners.whereabouts(key, owner, &ctx.node).await {
            Ok(w) => asked.whereabouts = w,
            Err(e) => {
                warn!(error = %e, "could not find where the owner's Pod runs; asked again later");
                return Err(Went::Failed);
            }
        }
    }
    Ok(asked)
}

fn facts<'a>(
    local: &'a Local,
    owner: &'a OwnerState,
    whereabouts: Whereabouts,
    settings: Settings,
) -> Facts<'a> {
    Facts {
        pod_here: local.pod.is_some(),
        owner,
        vm: &local.claim.lifecycle.vm,
        hibernate_refused: local.claim.lifecycle.hibernate_refused,
        lease: lease(&local.claim, local.pod.as_deref()),
        whereabouts,
        now: Timestamp::now(),
        settings,
    }
}

/// Decides from the answers and acts; `None` (only when the key is not
/// held): there is more to do than a renewal, which needs the key.
async fn act(
    ctx: &Context,
    key: &str,
    local: &Local,
    asked: &Asked,
    settings: Settings,
    why: Due,
    held: Held,
) -> Option<Went> {
    let claim = &local.claim;
    let pod = local.pod.as_deref();
    let owner = asked.owner.state();
    if let (Some(p), None, Held::Yes) = (pod, &claim.lifecycle.owner, held) {
        remember_owner(ctx, key, claim, p).await;
    }
    let decision = upkeep(&facts(local, &owner, asked.whereabouts.clone(), settings));
    debug!(?why, ?decision, ?held, "upkeep turn");
    let regarding = regarding(key, claim.lifecycle.owner.as_ref(), pod);
    let went = match decision {
        Upkeep::Wait(why) => {
            if matches!(owner, OwnerState::Doubt(_)) {
                debug!(%why, "owner in doubt; asked again later");
                return Some(Went::Failed);
            }
            Went::Waited
        }
        Upkeep::Renew(ttl) => {
            let went = renew(ctx, key, claim, pod, ttl, regarding.clone(), held).await;
            match (went, held) {
                (Went::Through, Held::Yes) => {
                    then_hibernate(ctx, key, local, &owner, asked, settings, regarding).await
                }
                _ => went,
            }
        }
        _ if held == Held::No => return None,
        Upkeep::AskWhereabouts => Went::Through,
        Upkeep::Hibernate(why) => hibernate(ctx, key, claim, &why, regarding).await,
        Upkeep::Release(why) => release(ctx, key, claim, &why, Released::Gone, regarding).await,
        Upkeep::ReleaseMoved(why) => {
            release(ctx, key, claim, &why, Released::Moved, regarding).await
        }
        Upkeep::ReleaseOwnerGone(why) => match pod {
            Some(pod) => {
                release(
                    ctx,
                    key,
                    claim,
                    &why,
                    Released::PodLeftBehind(pod),
                    regarding,
                )
                .await
            }
            None => release(ctx, key, claim, &why, Released::Gone, regarding).await,
        },
    };
    Some(went)
}

/// After a renewal that came first (a suspended owner's VM whose lease was
/// due), the hibernate it put off, in the same turn, on the renewed record.
/// Otherwise, with leases short enough to be due at every look, each turn
/// renewed and none hibernated: the VM ran through the suspension
/// (reliability scenario 11, 30 s leases).
async fn then_hibernate(
    ctx: &Context,
    key: &str,
    local: &Local,
    owner: &OwnerState,
    asked: &Asked,
    settings: Settings,
    regarding: Option<k8s_openapi::api::core::v1::ObjectReference>,
) -> Went {
    let Some(claim) = ctx
        .provider
        .settled_claims_of(key)
        .filter(|c| c.id == local.claim.id)
    else {
        return Went::Through;
    };
    let renewed = Local {
        claim,
        pod: local.pod.clone(),
        here: local.here,
        tracked: local.tracked,
    };
    match upkeep(&facts(&renewed, owner, asked.whereabouts.clone(), settings)) {
        Upkeep::Hibernate(why) => hibernate(ctx, key, &renewed.claim, &why, regarding).await,
        _ => Went::Through,
    }
}

/// A Pod here whose claim has no owner recorded (made before lifecycle
/// state existed): record it, so the claim can be looked after once the Pod
/// is gone.
async fn remember_owner(ctx: &Context, key: &str, claim: &Claim, pod: &Pod) {
    let Some(owner) = owner_of(pod) else {
        return;
    };
    if let Err(e) = ctx.provider.record_owner(key, &claim.id, owner).await {
        warn!(error = %e, "the claim's owner could not be recorded");
    }
}
