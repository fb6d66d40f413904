//! Delete authorization: Pod deletion is not VM authority
//! (docs/pod-contract.md). A sandbox is released only when the Pod's owner
//! is confirmed gone or tearing down; every doubt preserves it. The decision
//! is pure; the owner lookup is I/O.

use std::collections::HashMap;
use std::sync::Mutex;

use super::owner::{Intent, intent as owner_intent};
use super::pod::Pod;
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

/// Resolves owner kinds to resources through discovery, cached; falls back
/// to kube's English plural of the Kind (`ApiResource::from_gvk`) when
/// discovery cannot answer.
#[derive(Default)]
pub struct OwnerResolver {
    cache: Mutex<HashMap<GroupVersionKind, ApiResource>>,
}

impl OwnerResolver {
    async fn resource(&self, client: &Client, gvk: &GroupVersionKind) -> ApiResource {
        if let Some(ar) = self.cache.lock().ok().and_then(|c| c.get(gvk).cloned()) {
            return ar;
        }
        match kube::discovery::pinned_kind(client, gvk).await {
            Ok((ar, _caps)) => {
                if let Ok(mut c) = self.cache.lock() {
                    c.insert(gvk.clone(), ar.clone());
                }
                ar
            }
            Err(e) => {
                tracing::debug!(error = %e, kind = %gvk.kind, "discovery failed; using the English plural");
                ApiResource::from_gvk(gvk)
            }
        }
    }

    /// Looks up the Pod's controller owner in the Pod's namespace.
    pub async fn lookup(&self, client: &Client, pod: &Pod) -> OwnerLookup {
        let Some(owner) = controller_ref(pod) else {
            return OwnerLookup::NoControllerRef;
        };
        if owner.kind.is_empty() {
            return OwnerLookup::BadRef("empty kind".into());
        }
        let (group, version) = match owner.api_version.split_once('/') {
            Some((g, v)) if !g.is_empty() && !v.is_empty() && !v.contains('/') => (g, v),
            None if !owner.api_version.is_empty() => ("", owner.api_version.as_str()),
            _ => {
                return OwnerLookup::BadRef(format!("apiVersion {:?}", owner.api_version));
            }
        };
        let gvk = GroupVersionKind::gvk(group, version, &owner.kind);
        let ar = self.resource(client, &gvk).await;
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
        match api.get(&owner.name).await {
            Ok(obj) => OwnerLookup::Found {
                deleting: obj.metadata.deletion_timestamp.is_some(),
                intent: owner_intent(group, &owner.kind, &obj.data),
                uid: obj.metadata.uid.unwrap_or_default(),
            },
            Err(kube::Error::Api(status)) if status.code == 404 => OwnerLookup::NotFound {
                details_name: status.details.as_ref().map(|d| d.name.clone()),
            },
            Err(e) => OwnerLookup::Failed(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "agents.x-k8s.io/v1beta1".into(),
            kind: "Sandbox".into(),
            name: "sb".into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn released(v: &Verdict) -> bool {
        matches!(v, Verdict::Release(_))
    }

    #[test]
    fn decision_table() {
        let o = owner("u1");
        assert!(released(&decide(None, &OwnerLookup::NoControllerRef)));
        assert!(!released(&decide(
            Some(&o),
            &OwnerLookup::BadRef("x".into())
        )));
        assert!(released(&decide(
            Some(&o),
            &OwnerLookup::NotFound {
                details_name: Some("sb".into())
            }
        )));
        assert!(!released(&decide(
            Some(&o),
            &OwnerLookup::NotFound { details_name: None }
        )));
        assert!(!released(&decide(
            Some(&o),
            &OwnerLookup::NotFound {
                details_name: Some("other".into())
            }
        )));
        assert!(!released(&decide(
            Some(&o),
            &OwnerLookup::Failed("403".into())
        )));
        assert!(released(&decide(
            Some(&o),
            &OwnerLookup::Found {
                deleting: true,
                uid: "u1".into(),
                intent: Intent::default(),
            }
        )));
        assert!(released(&decide(
            Some(&o),
            &OwnerLookup::Found {
                deleting: false,
                uid: "u2".into(),
                intent: Intent::default(),
            }
        )));
        assert!(!released(&decide(
            Some(&o),
            &OwnerLookup::Found {
                deleting: false,
                uid: "u1".into(),
                intent: Intent::default(),
            }
        )));
        let no_uid = owner("");
        assert!(!released(&decide(
            Some(&no_uid),
            &OwnerLookup::Found {
                deleting: false,
                uid: "u9".into(),
                intent: Intent::default(),
            }
        )));
    }

    #[test]
    fn plurals() {
        for (k, p) in [
            ("Sandbox", "sandboxes"),
            ("Policy", "policies"),
            ("Gateway", "gateways"),
            ("Batch", "batches"),
            ("ReplicaSet", "replicasets"),
            ("CocoonSet", "cocoonsets"),
            ("Mesh", "meshes"),
            ("Quiz", "quizes"),
        ] {
            let gvk = GroupVersionKind::gvk("agents.x-k8s.io", "v1beta1", k);
            assert_eq!(ApiResource::from_gvk(&gvk).plural, p, "{k}");
        }
    }

    #[test]
    fn controller_ref_finds_the_controller_among_owners() {
        let p = crate::pods::fixtures::owned_pod("p", "o1");
        let r = controller_ref(&p).expect("the Sandbox is the controller");
        assert_eq!((r.kind.as_str(), r.uid.as_str()), ("Sandbox", "o1"));
    }

    /// Delete authorization over a scripted apiserver: discovery, then a
    /// GET of the controller owner, each answer read as the decision table
    /// says.
    #[tokio::test]
    async fn each_owner_answer_is_read_as_the_table_says() {
        use crate::pods::fixtures::*;
        use serde_json::{Value, json};
        let cases: Vec<(&str, Answer, bool)> = vec![
            ("alive", sandbox("o1", false), false),
            ("tearing down", sandbox("o1", true), true),
            ("a new generation", sandbox("o2", false), true),
            (
                "gone",
                status(404, "NotFound", json!({"name": "sb", "kind": "sandboxes"})),
                true,
            ),
            (
                "404 naming another object",
                status(404, "NotFound", json!({"name": "other"})),
                false,
            ),
            ("plain-text 404 (wrong path)", (404, Value::Null), false),
            ("forbidden", status(403, "Forbidden", json!({})), false),
            // A real apiserver's refusals name the object too: only a 404
            // that names the owner is proof it is gone.
            (
                "forbidden, naming the owner",
                status(403, "Forbidden", json!({"name": "sb", "kind": "sandboxes"})),
                false,
            ),
            (
                "conflict, naming the owner",
                status(409, "Conflict", json!({"name": "sb", "kind": "sandboxes"})),
                false,
            ),
            (
                "server error, naming the owner",
                status(
                    500,
                    "InternalError",
                    json!({"name": "sb", "kind": "sandboxes"}),
                ),
                false,
            ),
            (
                "server error",
                status(500, "InternalError", json!({})),
                false,
            ),
            (
                "unavailable",
                status(503, "ServiceUnavailable", json!({})),
                false,
            ),
        ];
        for (what, answer, want_release) in cases {
            let api = ApiServer::new(move |s| match s.path() {
                "/apis/agents.x-k8s.io/v1beta1" => sandbox_discovery(),
                "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/sb" => answer.clone(),
                _ => (404, Value::Null),
            });
            let pod = owned_pod("p1", "o1");
            let resolver = OwnerResolver::default();
            let lookup = within(resolver.lookup(&api.client, &pod)).await;
            let verdict = decide(controller_ref(&pod), &lookup);
            assert_eq!(
                released(&verdict),
                want_release,
                "{what}: {lookup:?} -> {verdict:?}"
            );
            let gets: Vec<String> = api
                .seen()
                .iter()
                .filter(|s| s.path().contains("/sandboxes/"))
                .map(|s| format!("{} {}", s.method, s.path()))
                .collect();
            assert_eq!(
                gets,
                vec!["GET /apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/sb".to_string()],
                "{what}"
            );
        }
    }

    /// An owner reference that names no resource is a doubt: preserved,
    /// and nothing is asked.
    #[tokio::test]
    async fn unusable_owner_references_preserve_without_asking() {
        use crate::pods::fixtures::*;
        use serde_json::Value;
        for api_version in [
            "",
            "/v1beta1",
            "agents.x-k8s.io/",
            "a/b/c",
            "agents.x-k8s.io//v1",
        ] {
            let api = ApiServer::new(|_| (200, Value::Null));
            let mut pod = owned_pod("p1", "o1");
            if let Some(refs) = pod.metadata.owner_references.as_mut() {
                refs[1].api_version = api_version.into();
            }
            let lookup = within(OwnerResolver::default().lookup(&api.client, &pod)).await;
            assert!(
                matches!(lookup, OwnerLookup::BadRef(_)),
                "{api_version:?}: {lookup:?}"
            );
            assert!(!released(&decide(controller_ref(&pod), &lookup)));
            assert!(
                api.seen().is_empty(),
                "{api_version:?}: asked {:?}",
                api.seen()
            );
        }
        let api = ApiServer::new(|_| (200, Value::Null));
        let mut pod = owned_pod("p1", "o1");
        if let Some(refs) = pod.metadata.owner_references.as_mut() {
            refs[1].kind = String::new();
        }
        let lookup = within(OwnerResolver::default().lookup(&api.client, &pod)).await;
        assert_eq!(lookup, OwnerLookup::BadRef("empty kind".into()));
        // A core-group owner (`v1`) is looked up in the core API.
        let api = ApiServer::new(|s| match s.path() {
            "/api/v1" => (
                200,
                serde_json::json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                    {"name": "configmaps", "singularName": "configmap", "namespaced": true,
                     "kind": "ConfigMap", "verbs": ["get"]}]}),
            ),
            "/api/v1/namespaces/ns/configmaps/sb" => sandbox("o1", false),
            _ => (404, Value::Null),
        });
        let mut pod = owned_pod("p1", "o1");
        if let Some(refs) = pod.metadata.owner_references.as_mut() {
            refs[1].api_version = "v1".into();
            refs[1].kind = "ConfigMap".into();
        }
        let lookup = within(OwnerResolver::default().lookup(&api.client, &pod)).await;
        assert_eq!(
            lookup,
            OwnerLookup::Found {
                deleting: false,
                uid: "o1".into(),
                intent: Intent::default(),
            }
        );
    }

    /// Discovery is asked once per kind and cached; when it cannot answer,
    /// the English plural is used.
    #[tokio::test]
    async fn discovery_is_cached_and_falls_back_to_the_plural() {
        use crate::pods::fixtures::*;
        use serde_json::Value;
        let api = ApiServer::new(|s| match s.path() {
            "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/sb" => sandbox("o1", false),
            _ => (404, Value::Null),
        });
        let pod = owned_pod("p1", "o1");
        let resolver = OwnerResolver::default();
        for _ in 0..2 {
            let lookup = within(resolver.lookup(&api.client, &pod)).await;
            assert_eq!(
                lookup,
                OwnerLookup::Found {
                    deleting: false,
                    uid: "o1".into(),
                    intent: Intent::default(),
                }
            );
        }
        let discovery = api
            .seen()
            .iter()
            .filter(|s| s.path() == "/apis/agents.x-k8s.io/v1beta1")
            .count();
        // Failed discovery is not cached (it may answer next time).
        assert_eq!(discovery, 2);
        let api = ApiServer::new(|s| match s.path() {
            "/apis/agents.x-k8s.io/v1beta1" => sandbox_discovery(),
            "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/sb" => sandbox("o1", false),
            _ => (404, Value::Null),
        });
        let resolver = OwnerResolver::default();
        for _ in 0..3 {
            within(resolver.lookup(&api.client, &pod)).await;
        }
        let discovery = api
            .seen()
            .iter()
            .filter(|s| s.path() == "/apis/agents.x-k8s.io/v1beta1")
            .count();
        assert_eq!(discovery, 1, "discovery is asked once per kind");
    }

    #[test]
    fn controller_ref_ignores_non_controllers() {
        let mut p = Pod::default();
        let mut r = owner("u");
        r.controller = None;
        p.metadata.owner_references = Some(vec![r]);
        assert!(controller_ref(&p).is_none());
    }
}
