//! Delete authorization: Pod deletion is not VM authority
//! (docs/pod-contract.md). A sandbox is released only when the Pod's owner
//! is confirmed gone or tearing down; every doubt preserves it. Pure: what
//! the apiserver answered ([`OwnerLookup`]) is read into the owner's state
//! by one table ([`decide`]); asking is [`crate::pods::owners`]'s.

use super::owner::Intent;
use super::pod::Pod;
use crate::claims::OwnerRef;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// What asking the apiserver about the owner gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerLookup {
    /// Row 1: no controller ownerReference (a bare Pod).
    NoControllerRef,
    /// Row 3: the reference cannot be resolved to a resource.
    BadRef(String),
    /// Rows 4/5: 404; `details_name` is the Status body's `details.name`.
    NotFound { details_name: Option<String> },
    /// Row 6: any other failure (403, 5xx, timeout, refused).
    Failed(String),
    /// Row 6 as well: no served version of the reference's group has its
    /// kind (the group is gone, or the kind moved). Never "owner gone".
    Unserved(String),
    /// Rows 7–9: the owner exists; `intent` is what it asks of its VM
    /// (suspended, expiry), which only the lifecycle reads.
    Found {
        deleting: bool,
        uid: String,
        intent: Intent,
    },
}

/// The owner as delete authorization and the lifecycle decide from it.
/// `None` and `Gone` release a Pod's VM; `Alive` and `Doubt` preserve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerState {
    /// No controller owner: a bare Pod, its own owner.
    None,
    /// Confirmed gone: deleted, being deleted, or replaced by a new object
    /// of that name.
    Gone(String),
    /// The very object the Pod referenced, alive.
    Alive(Intent),
    /// Cannot be decided (403, 5xx, timeout, an unusable reference, a 404
    /// that does not name it, a kind no served version has).
    Doubt(String),
}

impl OwnerState {
    /// Whether the Pod's deletion may release its VM (the owner is not
    /// there to want it).
    pub fn releases(&self) -> bool {
        matches!(self, OwnerState::None | OwnerState::Gone(_))
    }
}

pub fn controller_ref(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true))
}

/// The owner to record for a Pod: its controller reference.
pub fn owner_of(pod: &Pod) -> Option<OwnerRef> {
    controller_ref(pod).map(|r| OwnerRef {
        api_version: r.api_version.clone(),
        kind: r.kind.clone(),
        name: r.name.clone(),
        uid: r.uid.clone(),
    })
}

/// The decision table, first matching row wins: what `lookup` (the
/// apiserver's answer about `owner`, the reference asked) says of it.
pub fn decide(owner: Option<&OwnerReference>, lookup: &OwnerLookup) -> OwnerState {
    use OwnerLookup::*;
    match lookup {
        NoControllerRef => OwnerState::None,
        BadRef(why) => OwnerState::Doubt(format!("owner reference unusable: {why}")),
        NotFound { details_name } => {
            let name = owner.map(|o| o.name.as_str());
            if details_name.is_some() && details_name.as_deref() == name {
                OwnerState::Gone("the owner is gone (NotFound)".into())
            } else {
                OwnerState::Doubt(format!(
                    "owner lookup answered 404 without naming the owner (details.name \
                     {details_name:?}); a wrong path is not proof the owner is gone"
                ))
            }
        }
        Failed(why) => OwnerState::Doubt(format!("owner lookup failed: {why}")),
        Unserved(why) => OwnerState::Doubt(format!("the owner's kind is not served: {why}")),
        Found { deleting: true, .. } => OwnerState::Gone("the owner is being deleted".into()),
        Found { uid, intent, .. } => match owner {
            Some(o) if !o.uid.is_empty() && o.uid != *uid => OwnerState::Gone(format!(
                "the owner generation the Pod referenced ({}) is gone; {} is a new object",
                o.uid, uid
            )),
            _ => OwnerState::Alive(intent.clone()),
        },
    }
}

#[cfg(test)]
mod tests;
