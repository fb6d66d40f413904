//! What the owner's state does to a claim's VM (docs/pod-contract.md, "What
//! happens to the VM"). Pure and table-tested, beside
//! [`authority::decide`](crate::pods::authority::decide), which keeps the
//! first word: its releases and its doubts are unchanged, and the lifecycle
//! only refines "the owner lives".

use std::num::NonZeroU64;
use std::time::Duration;

use jiff::Timestamp;

use super::schedule::{self, Lease};
use crate::claims::lifecycle::{Lifecycle, VmState};
pub use crate::pods::authority::OwnerState;

/// What a Pod's deletion does to its claim's VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnDelete {
    Release(String),
    /// The owner is suspended: keep the claim, hibernate the VM.
    Hibernate(String),
    /// Keep the claim and the VM running for the key's next Pod.
    Preserve(String),
    /// Keep the claim; its VM is already as the suspended owner wants it
    /// (hibernated, archived, or a hibernate pending that the upkeep
    /// retries): sandboxd is not asked, and nothing is announced again.
    /// A repeated delete of the same Pod (its grace-0 echo reconciled
    /// before it leaves the cache) or a restart mid-delete gets here.
    Keep(String),
}

/// The decision when a Pod holding a claim is deleted (or vanished);
/// `held` is what the claims store records of the claim's VM. sandboxd is
/// asked to hibernate a VM once per suspend: a refused one keeps running,
/// a pending one is the upkeep's to retry (with its back-off).
pub fn on_delete(
    owner: &OwnerState,
    held: &Lifecycle,
    now: Timestamp,
    hibernate_on_suspend: bool,
) -> OnDelete {
    match owner {
        OwnerState::None => OnDelete::Release("the Pod has no controller owner".into()),
        OwnerState::Gone(why) => OnDelete::Release(why.clone()),
        OwnerState::Doubt(why) => OnDelete::Preserve(why.clone()),
        OwnerState::Alive(intent) => {
            if let Some(why) = intent.expired(now) {
                OnDelete::Release(why)
            } else if intent.suspended && hibernate_on_suspend {
                match &held.vm {
                    VmState::Hibernated { .. } => OnDelete::Keep("already hibernated".into()),
                    VmState::Hibernating { .. } => OnDelete::Keep(
                        "a hibernate is pending; the lifecycle upkeep retries it".into(),
                    ),
                    VmState::Archived { .. } => {
                        OnDelete::Keep("archived by sandboxd; woken for the next Pod".into())
                    }
                    VmState::Running if held.hibernate_refused => OnDelete::Preserve(
                        "the owner is suspended, but sandboxd refused to hibernate this VM \
                         (an egress-lane VM, or one with volumes): it keeps running"
                            .into(),
                    ),
                    VmState::Running => OnDelete::Hibernate("the owner is suspended".into()),
                }
            } else if intent.suspended {
                OnDelete::Preserve(
                    "the owner is suspended; --hibernate-on-suspend=false keeps its VM running"
                        .into(),
                )
            } else {
                OnDelete::Preserve("the owner is alive".into())
            }
        }
    }
}

/// Where the key's Pod runs, for a claim with no Pod here whose owner
/// lives and runs (it may have moved to another node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Whereabouts {
    /// Not asked yet.
    Unknown,
    /// No Pod of the key elsewhere (none, unscheduled, or another owner's).
    NotElsewhere,
    /// Bound to this other node, under the same owner.
    Elsewhere(String),
}

/// The lifecycle settings (flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub hibernate_on_suspend: bool,
    /// `--lease-renew-margin`; zero renews nothing.
    pub renew_margin: Duration,
}

impl Default for Settings {
    /// The flags' defaults (docs/configuration.md).
    fn default() -> Settings {
        Settings {
            hibernate_on_suspend: true,
            renew_margin: Duration::from_secs(12 * 3600),
        }
    }
}

/// One claim, when its upkeep turn comes.
#[derive(Debug, Clone)]
pub struct Turn<'a> {
    /// A Pod of the claim's key is here and not being deleted.
    pub pod_here: bool,
    pub owner: &'a OwnerState,
    pub vm: &'a VmState,
    pub hibernate_refused: bool,
    pub lease: Lease<'a>,
    pub whereabouts: Whereabouts,
    pub now: Timestamp,
    pub settings: Settings,
}

/// What a claim's upkeep turn does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upkeep {
    /// Renew the lease, asking this TTL.
    Renew(NonZeroU64),
    /// Hibernate the VM (a pending hibernate, or one never done).
    Hibernate(String),
    /// Release the VM and forget the claim.
    Release(String),
    /// The owner's Pod runs on another node (the Sandbox moved): release
    /// the VM here and forget the claim.
    ReleaseMoved(String),
    /// The owner is gone but its Pod stays here (the garbage collector
    /// cannot delete it): release the VM and mark the Pod Failed.
    ReleaseOwnerGone(String),
    /// Find out where the key's Pod runs, then decide again.
    AskWhereabouts,
    /// Nothing now.
    Wait(String),
}

/// The lease is renewed when its time has come and renewing moves it later.
fn renew_if_due(t: &Turn<'_>, shutdown: Option<Timestamp>) -> Upkeep {
    if matches!(t.vm, VmState::Archived { .. }) {
        return Upkeep::Wait("archived by sandboxd: not renewable until woken".into());
    }
    let due = schedule::renew_at(&t.lease, t.settings.renew_margin).is_some_and(|at| at <= t.now);
    if !due {
        return Upkeep::Wait("the lease is not due".into());
    }
    match schedule::renew_ttl(&t.lease, shutdown, t.now) {
        Some(ttl) => Upkeep::Renew(ttl),
        None => Upkeep::Wait("the lease already reaches the owner's shutdownTime".into()),
    }
}

/// The decision for one claim's upkeep turn; first matching row wins.
pub fn upkeep(t: &Turn<'_>) -> Upkeep {
    match (t.pod_here, t.owner) {
        // The Pod runs: proof of life, whatever the owner lookup said.
        (true, OwnerState::None | OwnerState::Doubt(_)) => renew_if_due(t, None),
        // The garbage collector would have deleted the Pod by now, unless it
        // cannot resolve the reference (a version no longer served).
        (true, OwnerState::Gone(why)) => Upkeep::ReleaseOwnerGone(why.clone()),
        (true, OwnerState::Alive(intent)) => match intent.expired(t.now) {
            // The owner's controller deletes the Pod; the release follows.
            Some(why) => Upkeep::Wait(why),
            None => renew_if_due(t, intent.shutdown_time),
        },
        // No Pod here: the stored owner decides alone.
        (false, OwnerState::None) => Upkeep::Wait("no owner is known for this claim".into()),
        // A doubt (an apiserver outage, a 403, a kind not served) releases
        // nothing, but it renews a due lease: a renewal is reversible, a VM
        // reaped under a living owner is not.
        (false, OwnerState::Doubt(why)) => match renew_if_due(t, None) {
            Upkeep::Renew(ttl) => Upkeep::Renew(ttl),
            _ => Upkeep::Wait(format!("the owner is in doubt: {why}")),
        },
        (false, OwnerState::Gone(why)) => Upkeep::Release(why.clone()),
        (false, OwnerState::Alive(intent)) => {
            if let Some(why) = intent.expired(t.now) {
                return Upkeep::Release(why);
            }
            if intent.suspended {
                let hibernate = t.settings.hibernate_on_suspend
                    && !t.hibernate_refused
                    && matches!(t.vm, VmState::Running | VmState::Hibernating { .. });
                if hibernate {
                    // A due lease first (a renewal does not wake): a hibernate
                    // that keeps failing must not let sandboxd reap the VM.
                    return match renew_if_due(t, intent.shutdown_time) {
                        Upkeep::Renew(ttl) => Upkeep::Renew(ttl),
                        _ => Upkeep::Hibernate("the owner is suspended".into()),
                    };
                }
                return renew_if_due(t, intent.shutdown_time);
            }
            match &t.whereabouts {
                Whereabouts::Unknown => Upkeep::AskWhereabouts,
                Whereabouts::Elsewhere(node) => Upkeep::ReleaseMoved(format!(
                    "the owner's Pod now runs on node {node}: the Sandbox moved"
                )),
                Whereabouts::NotElsewhere => renew_if_due(t, intent.shutdown_time),
            }
        }
    }
}

#[cfg(test)]
mod tests;
