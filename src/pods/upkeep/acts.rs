//! What an upkeep turn does once it has decided: renew a lease, hibernate,
//! release, and the Events that say so. `report_hibernation` is shared
//! with the Pod delete path.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use tracing::{info, warn};

use super::turn::{Held, Went};
use crate::claims::{Claim, OwnerRef};
use crate::pods::context::Context;
use crate::pods::lifecycle::reason;
use crate::pods::pod::Pod;
use crate::pods::provider::Hibernation;
use crate::pods::provider::lifecycle::Renewal;
use crate::pods::provider::view;
use crate::pods::status;
use crate::pods::writes::{self, Guard};

/// What a lifecycle Event is about: the Pod while it is here, else the
/// owner (so `kubectl describe sandbox` shows it).
pub(super) fn regarding(
    key: &str,
    owner: Option<&OwnerRef>,
    pod: Option<&Pod>,
) -> Option<ObjectReference> {
    if let Some(p) = pod {
        return Some(p.object_ref(&()));
    }
    let owner = owner?;
    Some(ObjectReference {
        api_version: Some(owner.api_version.clone()),
        kind: Some(owner.kind.clone()),
        name: Some(owner.name.clone()),
        namespace: Some(
            key.split_once('/')
                .map_or("default", |(ns, _)| ns)
                .to_string(),
        ),
        uid: Some(owner.uid.clone()),
        ..Default::default()
    })
}

/// A Normal Event, posted without waiting (`Context::announce_about`).
async fn normal(ctx: &Context, regarding: Option<ObjectReference>, reason: &str, note: String) {
    if let Some(regarding) = regarding {
        ctx.announce_about(&regarding, reason, note).await;
    }
}

/// A Warning Event (through kube's Recorder, which folds repeats).
async fn warning(
    ctx: &Context,
    regarding: Option<ObjectReference>,
    reason: &str,
    action: &str,
    note: String,
) {
    if let Some(regarding) = regarding {
        ctx.warning_about(&regarding, reason, action, note).await;
    }
}

pub(super) async fn renew(
    ctx: &Context,
    key: &str,
    claim: &Claim,
    pod: Option<&Pod>,
    ttl: std::num::NonZeroU64,
    regarding: Option<ObjectReference>,
    held: Held,
) -> Went {
    match ctx
        .provider
        .renew_claim(key, claim, ttl, held == Held::Yes)
        .await
    {
        Renewal::Renewed(deadline) => {
            ctx.metrics.claim_renewed("renewed");
            info!(?deadline, ttl = ttl.get(), "lease renewed");
            Went::Through
        }
        Renewal::Archived => {
            ctx.metrics.claim_renewed("archived");
            Went::Through
        }
        // Acting on it needs the key: looked at again with it.
        Renewal::Gone if held == Held::No => Went::Failed,
        Renewal::Gone => {
            ctx.metrics.claim_renewed("gone");
            if pod.is_some() {
                // The lease-expiry watch confirms it and reports the Pod.
                ctx.provider.lease_gone(key, claim).await;
            } else {
                warn!("sandboxd no longer has this sandbox; the claim is dropped");
                let _ = ctx.provider.release_held(key, claim).await;
                warning(
                    ctx,
                    regarding,
                    reason::LOST,
                    reason::LOST,
                    format!(
                        "sandbox {} is gone from sandboxd (its lease ended?); the owner's next \
                         Pod gets a fresh one, without this one's memory and files",
                        claim.id
                    ),
                )
                .await;
            }
            Went::Through
        }
        Renewal::Failed(e) => {
            ctx.metrics.claim_renewed("failed");
            warn!(error = %e, "lease renewal failed; retried");
            warning(
                ctx,
                regarding,
                reason::RENEW_FAILED,
                reason::RENEW_ERROR,
                format!(
                    "{}: renewing sandbox {}'s lease failed (it ends at {}); retried: {e}",
                    reason::RENEW_ERROR,
                    claim.id,
                    claim
                        .deadline
                        .map_or_else(|| "never".to_string(), |d| d.to_string())
                ),
            )
            .await;
            Went::Failed
        }
        Renewal::NoCredential => {
            ctx.metrics.claim_renewed("no_credential");
            Went::Through
        }
    }
}

pub(super) async fn hibernate(
    ctx: &Context,
    key: &str,
    claim: &Claim,
    why: &str,
    regarding: Option<ObjectReference>,
) -> Went {
    let outcome = ctx
        .provider
        .hibernate_claim(key, claim, claim.lifecycle.owner.clone(), "suspended")
        .await;
    report_hibernation(ctx, &claim.id, why, &outcome, regarding).await;
    match outcome {
        Hibernation::Failed(_) => Went::Failed,
        _ => Went::Through,
    }
}

/// Metrics, log and Event of a hibernate (shared with the Pod delete path).
pub async fn report_hibernation(
    ctx: &Context,
    id: &str,
    why: &str,
    outcome: &Hibernation,
    regarding: Option<ObjectReference>,
) {
    match outcome {
        Hibernation::Hibernated => {
            ctx.metrics.claim_transition("hibernate", "ok");
            info!(sandbox = %id, %why, "sandbox hibernated");
            normal(
                ctx,
                regarding,
                reason::HIBERNATED,
                format!("sandbox {id} hibernated: {why}"),
            )
            .await;
        }
        Hibernation::Refused(e) => {
            ctx.metrics.claim_transition("hibernate", "refused");
            warn!(sandbox = %id, error = %e, "sandboxd refuses to hibernate this sandbox; it keeps running");
            warning(
                ctx,
                regarding,
                reason::HIBERNATE_FAILED,
                reason::HIBERNATE_REFUSED,
                format!(
                    "{}: sandboxd cannot hibernate sandbox {id} (an egress-lane VM, or one \
                     with volumes); it keeps running while {why}: {e}",
                    reason::HIBERNATE_REFUSED
                ),
            )
            .await;
        }
        Hibernation::Failed(e) => {
            ctx.metrics.claim_transition("hibernate", "failed");
            warn!(sandbox = %id, error = %e, "hibernate failed; the VM keeps running; retried");
            warning(
                ctx,
                regarding,
                reason::HIBERNATE_FAILED,
                reason::HIBERNATE_ERROR,
                format!(
                    "{}: hibernating sandbox {id} failed, it keeps running for now; retried: {e}",
                    reason::HIBERNATE_ERROR
                ),
            )
            .await;
        }
        Hibernation::Gone => {
            ctx.metrics.claim_transition("hibernate", "gone");
            info!(sandbox = %id, "sandboxd no longer has this sandbox; the claim is dropped");
        }
        Hibernation::NoCredential => {
            ctx.metrics.claim_transition("hibernate", "no_credential");
            warn!(sandbox = %id, "no credential can hibernate this recovered claim; it keeps running");
        }
    }
}

/// Why the upkeep releases a claim, as its Event tells it.
pub(super) enum Released<'a> {
    /// The owner is gone (or expired, or the Pod had none).
    Gone,
    /// The owner's Pod runs on another node: the Sandbox moved.
    Moved,
    /// The owner is gone but its Pod stays here: it is marked Failed.
    PodLeftBehind(&'a Pod),
}

pub(super) async fn release(
    ctx: &Context,
    key: &str,
    claim: &Claim,
    why: &str,
    released: Released<'_>,
    regarding: Option<ObjectReference>,
) -> Went {
    match ctx.provider.release_held(key, claim).await {
        Ok(_) => {
            info!(%why, "released sandbox");
            if let Released::PodLeftBehind(pod) = released {
                let patch = status::ended(
                    pod,
                    &view(claim),
                    Timestamp::now(),
                    reason::OWNER_GONE,
                    &format!(
                        "the Pod's owner is gone ({why}) but the Pod stays (its owner reference \
                         names a version the apiserver no longer serves, so the garbage \
                         collector cannot delete it); sandbox {} was released",
                        claim.id
                    ),
                );
                if let Err(e) =
                    writes::write_status(&ctx.client, &ctx.metrics, pod, &patch, Guard::Uid).await
                {
                    warn!(error = %e, "could not mark the Pod left behind Failed");
                }
                warning(
                    ctx,
                    regarding,
                    reason::OWNER_GONE,
                    reason::OWNER_GONE,
                    format!(
                        "sandbox {} released: {why}; the Pod is left Failed",
                        claim.id
                    ),
                )
                .await;
            } else {
                let action = match released {
                    Released::Moved => reason::MOVED,
                    _ => crate::pods::context::reason::RELEASED,
                };
                normal(
                    ctx,
                    regarding,
                    crate::pods::context::reason::RELEASED,
                    format!("{action}: sandbox {} released: {why}", claim.id),
                )
                .await;
            }
            Went::Through
        }
        Err(e) => {
            warn!(error = %e, %why, "release failed; retried");
            Went::Failed
        }
    }
}
