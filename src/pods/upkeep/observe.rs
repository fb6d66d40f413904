//! The upkeep's look at sandboxd (docs/architecture.md, "Sandbox
//! lifecycle"): every [`period`] one listing, and each settled
//! claim whose record disagrees with its listed row is corrected
//! ([`crate::pods::lifecycle::observe`] decides to what). The turn that
//! follows decides from the corrected record: a VM a relay woke under a
//! suspended Sandbox is hibernated again, one woken from the archive is
//! renewed.

use std::collections::HashMap;
use std::time::Duration;

use tracing::{debug, info};

use crate::claims::Claim;
use crate::pods::context::Context;
use crate::pods::lifecycle::observe::correction;

/// How often sandboxd's listing is compared with `rows`: a VM woken
/// behind the record runs unrenewed or through a suspension at most this
/// long (plus a turn) before the upkeep acts on it.
pub(super) fn period(rows: &[(String, Claim)]) -> Duration {
    let shortest = rows
        .iter()
        .filter_map(|(_, c)| c.lifecycle.granted_seconds.or(c.lifecycle.ttl_seconds))
        .min();
    crate::pods::lifecycle::observe::period(shortest)
}

/// Lists sandboxd once and corrects each of `rows` (read before the
/// listing, so a transition recorded since is never undone) whose VM is
/// listed in another state. The (key, claim id) of each corrected row. A
/// failed listing corrects nothing (it is not an empty answer).
pub(super) async fn observe(ctx: &Context, rows: &[(String, Claim)]) -> Vec<(String, String)> {
    if rows.is_empty() {
        return Vec::new();
    }
    let listing = match ctx.provider.list().await {
        Ok(listing) => listing,
        Err(e) => {
            debug!(error = %e, "sandboxd could not be listed; its VMs' states are read next time");
            return Vec::new();
        }
    };
    let listed: HashMap<&str, _> = listing.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut corrected = Vec::new();
    for (key, claim) in rows {
        // Not listed: the lease-expiry watch and verification judge it.
        let Some(row) = listed.get(claim.id.as_str()) else {
            continue;
        };
        let Some(seen) = correction(&claim.lifecycle.vm, row.state()) else {
            continue;
        };
        if ctx
            .provider
            .take_observed(key, claim, seen, row.deadline.expires_at())
            .await
        {
            info!(pod = %key, sandbox = %claim.id, recorded = ?claim.lifecycle.vm,
                  listed = seen.label(),
                  "sandboxd lists this sandbox in another state than recorded (woken by a \
                   relay, or by its idle tiers): the record now says what sandboxd does");
            ctx.metrics.claim_observed(seen.label());
            corrected.push((key.clone(), claim.id.clone()));
        }
    }
    corrected
}
