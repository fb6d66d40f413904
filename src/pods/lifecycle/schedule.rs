//! When a claim's lease is renewed and for how long (docs/pod-contract.md,
//! "Leases"). Pure.

use std::num::NonZeroU64;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use crate::claims::VmState;

/// sandboxd's longest lease: it clamps every request to this.
pub const MAX_LEASE_SECONDS: u64 = 86_400;
/// sandboxd's default lease, what it grants for a TTL of 0.
pub const DEFAULT_LEASE_SECONDS: u64 = 300;
/// A lease capped by the owner's `shutdownTime` reaches this far past it,
/// so the owner's teardown (and the release it brings) comes first and
/// sandboxd's reaper is only the fallback.
pub const SHUTDOWN_SLACK: Duration = Duration::from_secs(120);
/// The shortest window considered (a lease of a few seconds is renewed
/// half-way, but never later than this before its end).
const MIN_WINDOW: Duration = Duration::from_secs(1);

/// A claim's lease, as the claims store knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease<'a> {
    /// The sandbox id (spreads renewals of leases that end together).
    pub id: &'a str,
    /// The lease's end; `None`: it never expires.
    pub deadline: Option<Timestamp>,
    /// What to ask at each renewal (the Pod's `ttl-seconds`); `None` or 0:
    /// sandboxd's default is what the claim got, so ask for that length.
    pub ttl_seconds: Option<u64>,
    /// What sandboxd granted last; `None`: assume what was asked.
    pub granted_seconds: Option<u64>,
}

impl Lease<'_> {
    /// The length to ask for: explicit, never 0 (0 would cut the lease to
    /// sandboxd's 5-minute default), at most sandboxd's cap.
    fn asked(&self) -> u64 {
        match self.ttl_seconds {
            None => MAX_LEASE_SECONDS,
            Some(0) => DEFAULT_LEASE_SECONDS,
            Some(n) => n.min(MAX_LEASE_SECONDS),
        }
    }

    /// The length sandboxd actually grants this claim.
    fn length(&self) -> u64 {
        self.granted_seconds
            .filter(|g| *g > 0)
            .unwrap_or_else(|| self.asked())
    }
}

/// FNV-1a of the id: a stable, evenly spread offset per claim.
fn spread_of(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// When the lease is due for renewal: `margin` before its end (at most half
/// the lease, so short leases are renewed half-way), moved earlier by up to
/// a quarter of that, by claim, so leases that end together are not
/// renewed in one burst. `None`: never (no deadline, or renewal off with a
/// zero margin).
pub fn renew_at(lease: &Lease<'_>, margin: Duration) -> Option<Timestamp> {
    let deadline = lease.deadline?;
    if margin.is_zero() {
        return None;
    }
    let half = Duration::from_secs(lease.length()) / 2;
    let window = margin.min(half).max(MIN_WINDOW);
    let quarter = window.as_millis() as u64 / 4;
    let spread = Duration::from_millis(spread_of(lease.id) % quarter.max(1));
    let before = SignedDuration::try_from(window + spread).ok()?;
    deadline.checked_sub(before).ok()
}

/// The TTL to renew with at `now`, or `None` when renewing would not move
/// the deadline later: the lease already reaches the owner's `shutdownTime`
/// (plus [`SHUTDOWN_SLACK`]), or that time has passed.
pub fn renew_ttl(
    lease: &Lease<'_>,
    shutdown: Option<Timestamp>,
    now: Timestamp,
) -> Option<NonZeroU64> {
    let mut ttl = lease.asked();
    if let Some(shutdown) = shutdown {
        if shutdown <= now {
            return None;
        }
        let until = shutdown
            .checked_add(SignedDuration::try_from(SHUTDOWN_SLACK).ok()?)
            .ok()?
            .duration_since(now)
            .as_secs();
        let until = u64::try_from(until).ok()?;
        ttl = ttl.min(until);
    }
    let ttl = NonZeroU64::new(ttl)?;
    let new_end = now
        .checked_add(SignedDuration::from_secs(ttl.get() as i64))
        .ok()?;
    match lease.deadline {
        Some(deadline) if new_end <= deadline => None,
        _ => Some(ttl),
    }
}

/// How often the owner of a claim with no Pod of its key here is asked
/// while its VM runs (an evicted Pod's VM costs its memory), and while it
/// is hibernated or archived (a suspended Sandbox's costs little).
pub const RECHECK_RUNNING: Duration = Duration::from_secs(30);
pub const RECHECK_HIBERNATED: Duration = Duration::from_secs(300);
/// How often the owner of a Pod here is asked when the Pod's reference
/// names a version the apiserver does not serve (the garbage collector
/// will not delete the Pod when the owner goes).
pub const RECHECK_UNSERVED_REFERENCE: Duration = Duration::from_secs(60);

/// Whether a Pod of the claim's key is on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodHere {
    No,
    Running,
    /// Being deleted: its reconcile decides, not the upkeep.
    Deleting,
}

/// What the upkeep knows of a claim without asking anyone.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    pub lease: Lease<'a>,
    pub vm: &'a VmState,
    pub pod: PodHere,
    /// An owner is recorded for the claim (it can be asked with no Pod).
    pub owner_recorded: bool,
    /// The Pod's reference names a version the apiserver does not serve.
    pub reference_unserved: bool,
    /// After a failure: not looked at before this (its back-off), a
    /// renewal included.
    pub retry_at: Option<Timestamp>,
    /// After a turn that went through: its owner is not asked again for
    /// having no Pod here (or an unserved reference) before this (its
    /// cadence). A renewal or a pending hibernate does not wait for it.
    pub recheck_at: Option<Timestamp>,
    /// After a due renewal decided to wait (the lease already reaches the
    /// owner's `shutdownTime`, the VM is archived, the owner expired): the
    /// renewal is not looked at again before this ([`renewal_wait`]).
    pub renewal_waits_until: Option<Timestamp>,
}

/// Why a claim's upkeep turn has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    Renewal,
    PendingHibernate,
    NoPodHere,
    UnservedReference,
}

/// Whether (and why) a claim's upkeep turn has come at `now`.
pub fn due(f: &Facts<'_>, margin: Duration, now: Timestamp) -> Option<Due> {
    if f.pod == PodHere::Deleting || f.retry_at.is_some_and(|t| t > now) {
        return None;
    }
    // With a Pod of the key here, its reconcile wakes the VM instead.
    if f.pod == PodHere::No && matches!(f.vm, VmState::Hibernating { .. }) {
        return Some(Due::PendingHibernate);
    }
    if renew_at(&f.lease, margin).is_some_and(|at| at <= now)
        && f.renewal_waits_until.is_none_or(|t| t <= now)
    {
        return Some(Due::Renewal);
    }
    if f.recheck_at.is_some_and(|t| t > now) {
        return None;
    }
    match f.pod {
        PodHere::No if f.owner_recorded => Some(Due::NoPodHere),
        PodHere::Running if f.reference_unserved => Some(Due::UnservedReference),
        _ => None,
    }
}

/// The shortest and longest a due renewal that decided to wait is left
/// alone before it is looked at again.
pub const RENEWAL_WAIT_MIN: Duration = Duration::from_secs(2);
pub const RENEWAL_WAIT_MAX: Duration = Duration::from_secs(300);

/// How long a due renewal that decided to wait is left alone: a quarter of
/// what is left of the lease, between [`RENEWAL_WAIT_MIN`] and
/// [`RENEWAL_WAIT_MAX`]. Far from its end the owner is asked every few
/// minutes (not every turn: one owner GET per claim per turn for hours),
/// and more often as the end nears, so a later `shutdownTime` is still
/// seen in time to renew.
pub fn renewal_wait(deadline: Option<Timestamp>, now: Timestamp) -> Duration {
    let Some(deadline) = deadline else {
        return RENEWAL_WAIT_MAX;
    };
    let left = deadline.duration_since(now).as_millis().max(0) as u64;
    Duration::from_millis(left / 4).clamp(RENEWAL_WAIT_MIN, RENEWAL_WAIT_MAX)
}

/// When a claim is looked at again after a turn that went through: `None`
/// when only its lease's renewal time brings it back.
pub fn cadence(vm: &VmState, pod: PodHere, reference_unserved: bool) -> Option<Duration> {
    match pod {
        PodHere::No if matches!(vm, VmState::Running | VmState::Hibernating { .. }) => {
            Some(RECHECK_RUNNING)
        }
        PodHere::No => Some(RECHECK_HIBERNATED),
        PodHere::Running if reference_unserved => Some(RECHECK_UNSERVED_REFERENCE),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
