//! Delete authorization: Pod deletion is not VM authority
//! (docs/pod-contract.md). A sandbox is released only when the Pod's owner
//! is confirmed gone or tearing down; every doubt preserves it. The decision
//! is pure; the owner lookup is I/O, at a version the apiserver serves.

use std::collections::HashMap;
use std::sync::Mutex;

use super::owner::{Intent, ServedVersion, choose_version, intent as owner_intent};
use super::pod::Pod;
use crate::claims::OwnerRef;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};

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

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Release(String),
    Preserve(String),
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

/// The decision table, first matching row wins.
pub fn decide(owner: Option<&OwnerReference>, lookup: &OwnerLookup) -> Verdict {
    use OwnerLookup::*;
    match lookup {
        NoControllerRef => Verdict::Release("the Pod has no controller owner".into()),
        BadRef(why) => Verdict::Preserve(format!("owner reference unusable: {why}")),
        NotFound { details_name } => {
            let name = owner.map(|o| o.name.as_str());
            if details_name.is_some() && details_name.as_deref() == name {
                Verdict::Release("the owner is gone (NotFound)".into())
            } else {
                Verdict::Preserve(format!(
                    "owner lookup answered 404 without naming the owner (details.name {details_name:?}); \
                     a wrong path is not proof the owner is gone"
                ))
            }
        }
        Failed(why) => Verdict::Preserve(format!("owner lookup failed: {why}")),
        Unserved(why) => Verdict::Preserve(format!("the owner's kind is not served: {why}")),
        Found { deleting: true, .. } => Verdict::Release("the owner is being deleted".into()),
        Found { uid, .. } => match owner {
            Some(o) if !o.uid.is_empty() && o.uid != *uid => Verdict::Release(format!(
                "the owner generation the Pod referenced ({}) is gone; {} is a new object",
                o.uid, uid
            )),
            _ => Verdict::Preserve("the owner is alive".into()),
        },
    }
}

/// Where an owner reference's kind is read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Resolved {
    /// At this resource; `own_version`: the reference's own version is the
    /// one served (else another version of the group serves the kind).
    At {
        resource: ApiResource,
        own_version: bool,
    },
    /// No served version of the group has the kind (or the group is gone).
    Unserved(String),
}

/// Resolves owner references to a resource at a version the apiserver
/// serves (docs/pod-contract.md, "Owner references in any served version"):
/// the reference's own version when discovery finds the kind there, else
/// the version [`choose_version`] picks from the group's discovery. Cached
/// per group/version/kind; a resolution that leads to an endpoint 404 is
/// dropped and asked again. When discovery cannot answer at all, kube's
/// English plural of the Kind at the reference's version is used
/// (`ApiResource::from_gvk`), as before.
#[derive(Default)]
pub struct OwnerResolver {
    cache: Mutex<HashMap<GroupVersionKind, Resolved>>,
}

fn cache<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The group and version of an `apiVersion` (`""` group for `v1`).
fn split_api_version(api_version: &str) -> Option<(&str, &str)> {
    match api_version.split_once('/') {
        Some((g, v)) if !g.is_empty() && !v.is_empty() && !v.contains('/') => Some((g, v)),
        None if !api_version.is_empty() => Some(("", api_version)),
        _ => None,
    }
}

impl OwnerResolver {
    async fn resolve(&self, client: &Client, gvk: &GroupVersionKind) -> Resolved {
        if let Some(r) = cache(&self.cache).get(gvk).cloned() {
            return r;
        }
        let resolved = match kube::discovery::pinned_kind(client, gvk).await {
            Ok((resource, _caps)) => Resolved::At {
                resource,
                own_version: true,
            },
            Err(pinned) => match kube::discovery::group(client, &gvk.group).await {
                Ok(group) => {
                    let served: Vec<ServedVersion> = group
                        .versions()
                        .map(|v| ServedVersion {
                            version: v.to_string(),
                            kinds: group
                                .versioned_resources(v)
                                .into_iter()
                                .map(|(ar, _)| ar.kind)
                                .collect(),
                        })
                        .collect();
                    let chosen =
                        choose_version(&gvk.version, &gvk.kind, group.preferred_version(), &served);
                    let found = chosen.and_then(|v| {
                        group
                            .versioned_resources(&v)
                            .into_iter()
                            .find(|(ar, _)| ar.kind == gvk.kind)
                    });
                    match found {
                        Some((resource, _)) => Resolved::At {
                            own_version: resource.version == gvk.version,
                            resource,
                        },
                        None => Resolved::Unserved(format!(
                            "no served version of {} has kind {}",
                            gvk.group, gvk.kind
                        )),
                    }
                }
                Err(kube::Error::Discovery(kube::error::DiscoveryError::MissingApiGroup(g))) => {
                    Resolved::Unserved(format!("the apiserver serves no API group {g}"))
                }
                Err(e) => {
                    tracing::debug!(pinned = %pinned, error = %e, kind = %gvk.kind,
                        "discovery failed; using the English plural at the reference's version");
                    return Resolved::At {
                        resource: ApiResource::from_gvk(gvk),
                        own_version: true,
                    };
                }
            },
        };
        cache(&self.cache).insert(gvk.clone(), resolved.clone());
        resolved
    }

    /// Whether the reference's own version is served, as far as discovery
    /// has told (no I/O): `Some(false)` for a reference the garbage
    /// collector cannot resolve, `None` when it has not been resolved yet.
    pub fn own_version_served(&self, reference: &OwnerReference) -> Option<bool> {
        let (group, version) = split_api_version(&reference.api_version)?;
        let gvk = GroupVersionKind::gvk(group, version, &reference.kind);
        match cache(&self.cache).get(&gvk)? {
            Resolved::At { own_version, .. } => Some(*own_version),
            Resolved::Unserved(_) => Some(false),
        }
    }

    /// Looks up the Pod's controller owner in the Pod's namespace.
    pub async fn lookup(&self, client: &Client, pod: &Pod) -> OwnerLookup {
        let Some(owner) = controller_ref(pod) else {
            return OwnerLookup::NoControllerRef;
        };
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        self.lookup_ref(client, ns, owner).await
    }

    /// Looks up the owner `reference` names, in namespace `ns`, at a served
    /// version.
    pub async fn lookup_ref(
        &self,
        client: &Client,
        ns: &str,
        reference: &OwnerReference,
    ) -> OwnerLookup {
        if reference.kind.is_empty() {
            return OwnerLookup::BadRef("empty kind".into());
        }
        let Some((group, version)) = split_api_version(&reference.api_version) else {
            return OwnerLookup::BadRef(format!("apiVersion {:?}", reference.api_version));
        };
        let gvk = GroupVersionKind::gvk(group, version, &reference.kind);
        let resource = match self.resolve(client, &gvk).await {
            Resolved::At { resource, .. } => resource,
            Resolved::Unserved(why) => return OwnerLookup::Unserved(why),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
        match api.get(&reference.name).await {
            Ok(obj) => OwnerLookup::Found {
                deleting: obj.metadata.deletion_timestamp.is_some(),
                intent: owner_intent(group, &reference.kind, &obj.data),
                uid: obj.metadata.uid.unwrap_or_default(),
            },
            Err(kube::Error::Api(status)) if status.code == 404 => {
                let details_name = status.details.as_ref().map(|d| d.name.clone());
                if details_name.is_none() {
                    // The path, not the object: the served versions may have
                    // changed since this was resolved. Ask discovery again
                    // next time.
                    cache(&self.cache).remove(&gvk);
                }
                OwnerLookup::NotFound { details_name }
            }
            Err(e) => OwnerLookup::Failed(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests;
