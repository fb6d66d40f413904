//! Who owns a Pod (or a stored claim) and whether it lives: the owner
//! questions of delete authorization and the lifecycle, each asked once per
//! decision. The reference asked and the apiserver's answer travel together
//! ([`Owner`]), and what they mean is [`authority::decide`]'s table. Owners
//! are read at a version the apiserver serves (docs/pod-contract.md,
//! "Owner references in any served version").

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};

use super::authority::{self, OwnerLookup, OwnerState};
use super::lifecycle::decide::Whereabouts;
use super::owner::{ServedVersion, choose_version, intent as owner_intent};
use super::pod::Pod;
use crate::claims::OwnerRef;

/// An owner reference and what the apiserver answered about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    /// The controller reference asked about (`None`: the Pod has none).
    pub reference: Option<OwnerReference>,
    pub answer: OwnerLookup,
}

impl Owner {
    /// What the answer says of the owner.
    pub fn state(&self) -> OwnerState {
        authority::decide(self.reference.as_ref(), &self.answer)
    }

    /// The owner to record for a claim: the reference asked about.
    pub fn recorded(&self) -> Option<OwnerRef> {
        self.reference.as_ref().map(|r| OwnerRef {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
        })
    }
}

/// The reference a stored owner stands for (always the controller).
pub fn reference(owner: &OwnerRef) -> OwnerReference {
    OwnerReference {
        api_version: owner.api_version.clone(),
        kind: owner.kind.clone(),
        name: owner.name.clone(),
        uid: owner.uid.clone(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// The namespace of a `<namespace>/<name>` key.
fn namespace_of(key: &str) -> &str {
    key.split_once('/').map_or("default", |(ns, _)| ns)
}

/// Asks the apiserver about owners.
pub struct Owners {
    client: Client,
    resolver: OwnerResolver,
}

impl Owners {
    pub fn new(client: Client) -> Owners {
        Owners {
            client,
            resolver: OwnerResolver::default(),
        }
    }

    /// The Pod's controller owner, in the Pod's namespace.
    pub async fn of_pod(&self, pod: &Pod) -> Owner {
        let Some(reference) = authority::controller_ref(pod) else {
            return Owner {
                reference: None,
                answer: OwnerLookup::NoControllerRef,
            };
        };
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        Owner {
            answer: self.resolver.lookup_ref(&self.client, ns, reference).await,
            reference: Some(reference.clone()),
        }
    }

    /// A claim's recorded owner (no Pod of its `key` here).
    pub async fn of_stored(&self, key: &str, owner: &OwnerRef) -> Owner {
        let reference = reference(owner);
        Owner {
            answer: self
                .resolver
                .lookup_ref(&self.client, namespace_of(key), &reference)
                .await,
            reference: Some(reference),
        }
    }

    /// Whether the reference's own version is served, from discovery's
    /// cache (no I/O): `Some(false)` when the garbage collector cannot
    /// resolve it, `None` when it has not been resolved yet.
    pub fn version_served(&self, owner: &OwnerRef) -> Option<bool> {
        self.resolver.own_version_served(&reference(owner))
    }

    /// Where the Pod of `key` runs now, for a claim whose owner lives and
    /// runs with no Pod of the key on `node`: `Running` on another node,
    /// under the same owner, means the Sandbox moved (it is served there).
    /// A Pod only bound there is not: that node may yet hand it back
    /// because the VM is here (src/pods/elsewhere.rs). A `list` by name
    /// (the grant the Pod watch holds), not a `get`.
    pub async fn whereabouts(
        &self,
        key: &str,
        owner: &OwnerRef,
        node: &str,
    ) -> Result<Whereabouts, kube::Error> {
        let (ns, name) = key.split_once('/').unwrap_or(("default", key));
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let pods = api
            .list(&ListParams::default().fields(&format!("metadata.name={name}")))
            .await?;
        let elsewhere = pods.items.iter().find_map(|p| {
            let bound = p.spec.as_ref()?.node_name.as_deref()?;
            let same_owner = authority::controller_ref(p).is_some_and(|r| r.uid == owner.uid);
            let served = p.phase() == Some("Running");
            (same_owner && served && bound != node && p.metadata.deletion_timestamp.is_none())
                .then(|| bound.to_string())
        });
        Ok(elsewhere.map_or(Whereabouts::NotElsewhere, Whereabouts::Elsewhere))
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
struct OwnerResolver {
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
    fn own_version_served(&self, reference: &OwnerReference) -> Option<bool> {
        let (group, version) = split_api_version(&reference.api_version)?;
        let gvk = GroupVersionKind::gvk(group, version, &reference.kind);
        match cache(&self.cache).get(&gvk)? {
            Resolved::At { own_version, .. } => Some(*own_version),
            Resolved::Unserved(_) => Some(false),
        }
    }

    /// Looks up the owner `reference` names, in namespace `ns`, at a served
    /// version.
    async fn lookup_ref(
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
#[cfg(test)]
mod whereabouts_tests;
