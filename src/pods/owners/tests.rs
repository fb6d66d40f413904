use super::*;
use crate::pods::authority::{controller_ref, decide};
use crate::pods::owner::Intent;
use std::sync::Arc;

fn released(s: &OwnerState) -> bool {
    s.releases()
}

/// What the owners room answers about `pod`'s controller owner.
async fn asked_about(owners: &Owners, pod: &Pod) -> OwnerLookup {
    owners.of_pod(pod).await.answer
}

/// The plural a reference's kind gets when discovery cannot answer.
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
        let owners = Owners::new(api.client.clone());
        let lookup = within(asked_about(&owners, &pod)).await;
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
        let lookup = within(asked_about(&Owners::new(api.client.clone()), &pod)).await;
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
    let lookup = within(asked_about(&Owners::new(api.client.clone()), &pod)).await;
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
    let lookup = within(asked_about(&Owners::new(api.client.clone()), &pod)).await;
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
    let owners = Owners::new(api.client.clone());
    for _ in 0..2 {
        let lookup = within(asked_about(&owners, &pod)).await;
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
    let owners = Owners::new(api.client.clone());
    for _ in 0..3 {
        within(asked_about(&owners, &pod)).await;
    }
    let discovery = api
        .seen()
        .iter()
        .filter(|s| s.path() == "/apis/agents.x-k8s.io/v1beta1")
        .count();
    assert_eq!(discovery, 1, "discovery is asked once per kind");
}

/// The group listing of an apiserver serving `versions` of
/// agents.x-k8s.io, the first preferred.
fn groups(versions: &[&str]) -> crate::pods::fixtures::Answer {
    let listed: Vec<serde_json::Value> = versions
        .iter()
        .map(|v| serde_json::json!({"groupVersion": format!("agents.x-k8s.io/{v}"), "version": v}))
        .collect();
    (
        200,
        serde_json::json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": "agents.x-k8s.io", "versions": listed, "preferredVersion": listed[0]}]}),
    )
}

fn resources(version: &str) -> crate::pods::fixtures::Answer {
    (
        200,
        serde_json::json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": format!("agents.x-k8s.io/{version}"),
            "resources": [{"name": "sandboxes", "singularName": "sandbox", "namespaced": true,
                           "kind": "Sandbox", "verbs": ["get"]}]}),
    )
}

/// A plane serving only `served` versions of the Sandbox, where the Sandbox
/// answers `object` at each of them; every other path is the router's
/// plain-text 404 (as the apiserver answers an unserved version).
fn plane(
    served: &'static [&'static str],
    object: crate::pods::fixtures::Answer,
) -> crate::pods::fixtures::ApiServer {
    crate::pods::fixtures::ApiServer::new(move |s| {
        let path = s.path();
        if path == "/apis" {
            return groups(served);
        }
        for v in served {
            if path == format!("/apis/agents.x-k8s.io/{v}") {
                return resources(v);
            }
            if path == format!("/apis/agents.x-k8s.io/{v}/namespaces/ns/sandboxes/sb") {
                return object.clone();
            }
        }
        (404, serde_json::Value::Null)
    })
}

fn owned_at(api_version: &str) -> Pod {
    let mut pod = crate::pods::fixtures::owned_pod("p1", "o1");
    if let Some(refs) = pod.metadata.owner_references.as_mut() {
        refs[1].api_version = api_version.into();
    }
    pod
}

/// agent-sandbox 1.0 serves only v1beta1; Pods made under 0.x name v1alpha1.
/// Their owner is read at v1beta1: alive preserves, gone releases; and the
/// other way round. "Version not served" is never "owner gone".
#[tokio::test]
async fn owners_are_read_at_a_served_version() {
    use crate::pods::fixtures::*;
    use serde_json::json;
    let gone = || status(404, "NotFound", json!({"name": "sb", "kind": "sandboxes"}));
    let cases: Vec<(&str, &'static [&'static str], &str, Answer, bool)> = vec![
        (
            "v1alpha1 ref, v1beta1 only, alive",
            &["v1beta1"],
            "agents.x-k8s.io/v1alpha1",
            sandbox("o1", false),
            false,
        ),
        (
            "v1alpha1 ref, v1beta1 only, gone",
            &["v1beta1"],
            "agents.x-k8s.io/v1alpha1",
            gone(),
            true,
        ),
        (
            "v1beta1 ref, v1alpha1 only, alive",
            &["v1alpha1"],
            "agents.x-k8s.io/v1beta1",
            sandbox("o1", false),
            false,
        ),
        (
            "v1beta1 ref, v1alpha1 only, gone",
            &["v1alpha1"],
            "agents.x-k8s.io/v1beta1",
            gone(),
            true,
        ),
        (
            "v1alpha1 ref, both served, gone",
            &["v1beta1", "v1alpha1"],
            "agents.x-k8s.io/v1alpha1",
            gone(),
            true,
        ),
    ];
    for (what, served, api_version, object, want_release) in cases {
        let api = plane(served, object);
        let pod = owned_at(api_version);
        let owners = Owners::new(api.client.clone());
        let lookup = within(asked_about(&owners, &pod)).await;
        let verdict = decide(controller_ref(&pod), &lookup);
        assert_eq!(
            released(&verdict),
            want_release,
            "{what}: {lookup:?} -> {verdict:?}"
        );
        let own = api_version.rsplit('/').next().unwrap_or_default();
        assert_eq!(
            owners
                .resolver
                .own_version_served(&controller_ref(&pod).cloned().expect("ref")),
            Some(served.contains(&own)),
            "{what}"
        );
    }
}

#[tokio::test]
async fn a_kind_no_version_serves_is_a_doubt() {
    use crate::pods::fixtures::*;
    // The group is there, without the kind at any version.
    let api = ApiServer::new(|s| match s.path() {
        "/apis" => groups(&["v1beta1"]),
        "/apis/agents.x-k8s.io/v1beta1" => (
            200,
            serde_json::json!({"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": "agents.x-k8s.io/v1beta1", "resources": []}),
        ),
        _ => (404, serde_json::Value::Null),
    });
    let pod = owned_at("agents.x-k8s.io/v1alpha1");
    let owners = Owners::new(api.client.clone());
    let lookup = within(asked_about(&owners, &pod)).await;
    assert!(matches!(lookup, OwnerLookup::Unserved(_)), "{lookup:?}");
    assert!(!released(&decide(controller_ref(&pod), &lookup)));
    // The group is gone altogether (CRD uninstalled).
    let api = ApiServer::new(|s| match s.path() {
        "/apis" => (
            200,
            serde_json::json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
        ),
        _ => (404, serde_json::Value::Null),
    });
    let lookup = within(asked_about(&Owners::new(api.client.clone()), &pod)).await;
    assert!(matches!(lookup, OwnerLookup::Unserved(_)), "{lookup:?}");
    assert!(!released(&decide(controller_ref(&pod), &lookup)));
    let gets = api
        .seen()
        .iter()
        .filter(|s| s.path().contains("/sandboxes/"))
        .count();
    assert_eq!(gets, 0, "nothing read at a version nobody serves");
}

/// A resolution that meets the router's 404 is asked again: the served
/// versions changed under a running process (the CRD dropped a version).
#[tokio::test]
async fn a_resolution_that_meets_an_endpoint_404_is_asked_again() {
    use crate::pods::fixtures::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dropped = Arc::new(AtomicBool::new(false));
    let now_dropped = Arc::clone(&dropped);
    let api = ApiServer::new(move |s| {
        let alpha = !now_dropped.load(Ordering::SeqCst);
        match s.path() {
            "/apis" if alpha => groups(&["v1beta1", "v1alpha1"]),
            "/apis" => groups(&["v1beta1"]),
            "/apis/agents.x-k8s.io/v1beta1" => resources("v1beta1"),
            "/apis/agents.x-k8s.io/v1alpha1" if alpha => resources("v1alpha1"),
            "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/sb" => sandbox("o1", false),
            "/apis/agents.x-k8s.io/v1alpha1/namespaces/ns/sandboxes/sb" if alpha => {
                sandbox("o1", false)
            }
            _ => (404, serde_json::Value::Null),
        }
    });
    let pod = owned_at("agents.x-k8s.io/v1alpha1");
    let owners = Owners::new(api.client.clone());
    let r = controller_ref(&pod).cloned().expect("ref");
    assert!(matches!(
        within(asked_about(&owners, &pod)).await,
        OwnerLookup::Found { .. }
    ));
    assert_eq!(owners.resolver.own_version_served(&r), Some(true));
    dropped.store(true, Ordering::SeqCst);
    // The cached v1alpha1 path now meets the router: a doubt, and forgotten.
    let lookup = within(asked_about(&owners, &pod)).await;
    assert_eq!(lookup, OwnerLookup::NotFound { details_name: None });
    assert_eq!(owners.resolver.own_version_served(&r), None);
    // Asked again, at v1beta1.
    assert!(matches!(
        within(asked_about(&owners, &pod)).await,
        OwnerLookup::Found { .. }
    ));
    assert_eq!(owners.resolver.own_version_served(&r), Some(false));
    // The same, asked of the room with the owner a claim records.
    let recorded = owners.of_pod(&pod).await.recorded().expect("recorded");
    assert_eq!(recorded.api_version, "agents.x-k8s.io/v1alpha1");
    assert_eq!(
        (recorded.kind.as_str(), recorded.uid.as_str()),
        ("Sandbox", "o1")
    );
    assert_eq!(owners.version_served(&recorded), Some(false));
}

#[tokio::test]
async fn the_intent_is_read_from_the_owner() {
    use crate::pods::fixtures::*;
    let suspended = (
        200,
        serde_json::json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": "sb", "namespace": "ns", "uid": "o1"},
            "spec": {"operatingMode": "Suspended"}}),
    );
    let api = plane(&["v1beta1"], suspended);
    let lookup = within(asked_about(
        &Owners::new(api.client.clone()),
        &owned_at("agents.x-k8s.io/v1beta1"),
    ))
    .await;
    assert_eq!(
        lookup,
        OwnerLookup::Found {
            deleting: false,
            uid: "o1".into(),
            intent: Intent {
                suspended: true,
                ..Intent::default()
            },
        }
    );
}
