use super::*;
use crate::preflight::Status;
use std::collections::BTreeSet;

fn manifest_grants() -> BTreeSet<Grant> {
    let text = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/rbac.yaml"));
    let (grants, cluster_roles) = grants_of(text).expect("rbac.yaml");
    assert_eq!(cluster_roles, 1, "rbac.yaml holds exactly one ClusterRole");
    grants
}

fn table_grants() -> BTreeSet<(String, String, String, String)> {
    let mut set = BTreeSet::new();
    for rule in RULES {
        let w = match rule.scope {
            Scope::Cluster | Scope::AllNamespaces => "*".to_string(),
            Scope::Namespace(ns) => ns.to_string(),
            Scope::Object(ns, name) => format!("{ns}/{name}"),
        };
        for g in rule.groups {
            for r in rule.resources {
                for v in rule.verbs {
                    set.insert((w.clone(), g.to_string(), r.to_string(), v.to_string()));
                }
            }
        }
    }
    set
}

#[test]
fn table_matches_manifest() {
    let manifest = manifest_grants();
    let table = table_grants();
    let missing: Vec<_> = table.difference(&manifest).collect();
    assert!(
        missing.is_empty(),
        "permissions preflight checks but manifests/rbac.yaml does not grant: {missing:?}"
    );
    let unchecked: Vec<_> = manifest.difference(&table).collect();
    assert!(
        unchecked.is_empty(),
        "permissions manifests/rbac.yaml grants that preflight's table lacks: {unchecked:?}"
    );
}

#[test]
fn the_webhook_needs_list_and_watch_on_nodeinventories() {
    let inv = |webhook| {
        required(None, false, false, webhook, false)
            .into_iter()
            .filter(|p| p.resource == "nodeinventories")
            .map(|p| (p.group, p.verb))
            .collect::<Vec<_>>()
    };
    assert!(inv(false).is_empty());
    let mut got = inv(true);
    got.sort();
    let want: Vec<(String, String)> = [
        ("extensions.agents.x-k8s.io", "list"),
        ("extensions.agents.x-k8s.io", "watch"),
        ("sandbox.cocoonstack.io", "list"),
        ("sandbox.cocoonstack.io", "watch"),
    ]
    .iter()
    .map(|(g, v)| (g.to_string(), v.to_string()))
    .collect();
    assert_eq!(got, want);
}

#[test]
fn required_follows_the_configuration() {
    let base = required(None, false, false, false, false);
    assert!(base.iter().all(|p| p.resource != "nodeinventories"));
    assert!(base.iter().all(|p| p.resource != "tokenreviews"));
    let status = base
        .iter()
        .find(|p| p.resource == "nodes" && p.subresource.as_deref() == Some("status"))
        .expect("nodes/status");
    assert_eq!(status.namespace, None);
    let lease = base
        .iter()
        .find(|p| p.resource == "leases")
        .expect("leases");
    assert_eq!(lease.namespace.as_deref(), Some("kube-node-lease"));
    assert_eq!(lease.group, "coordination.k8s.io");

    let choice = crate::inventory::groups::choose(
        Some("extensions.agents.x-k8s.io"),
        &["sandbox.cocoonstack.io".to_string()],
    );
    let full = required(Some(&choice), true, true, false, false);
    let inv: Vec<_> = full
        .iter()
        .filter(|p| p.resource == "nodeinventories")
        .map(|p| (p.group.as_str(), p.verb.as_str()))
        .collect();
    assert_eq!(
        inv,
        vec![
            ("extensions.agents.x-k8s.io", "create"),
            ("extensions.agents.x-k8s.io", "patch"),
            ("sandbox.cocoonstack.io", "get"),
            // Which node holds which VM, read where it publishes.
            ("extensions.agents.x-k8s.io", "list"),
            ("extensions.agents.x-k8s.io", "watch"),
        ]
    );
    assert!(
        full.iter()
            .any(|p| p.resource == "subjectaccessreviews" && p.verb == "create")
    );
    // NetworkPolicy at the Pod addresses: only with --pod-cidr.
    assert!(base.iter().all(|p| p.resource != "networkpolicies"));
    assert!(base.iter().all(|p| p.resource != "namespaces"));
    let np: Vec<_> = full
        .iter()
        .filter(|p| p.resource == "networkpolicies" || p.resource == "namespaces")
        .map(|p| (p.group.as_str(), p.resource.as_str(), p.verb.as_str()))
        .collect();
    assert_eq!(
        np,
        vec![
            ("networking.k8s.io", "networkpolicies", "list"),
            ("networking.k8s.io", "networkpolicies", "watch"),
            ("", "namespaces", "list"),
            ("", "namespaces", "watch"),
        ]
    );
    let ca = full
        .iter()
        .find(|p| p.resource == "configmaps")
        .expect("the client CA ConfigMap");
    assert_eq!(
        (
            ca.namespace.as_deref(),
            ca.name.as_deref(),
            ca.verb.as_str()
        ),
        (
            Some("kube-system"),
            Some("extension-apiserver-authentication"),
            "get"
        )
    );
    assert!(
        ca.target()
            .contains("extension-apiserver-authentication in namespace kube-system"),
        "{}",
        ca.target()
    );
    assert_eq!(full.len(), base.len() + 5 + 2 + 1 + 4);
}

fn perm(resource: &str, verb: &str) -> Permission {
    Permission {
        group: String::new(),
        resource: resource.into(),
        subresource: None,
        verb: verb.into(),
        namespace: None,
        name: None,
    }
}

#[test]
fn all_granted_is_one_ok_line() {
    let answers = vec![
        (perm("pods", "get"), Ok(true)),
        (perm("pods", "list"), Ok(true)),
    ];
    let r = evaluate(&answers);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].status, Status::Ok);
    assert!(r[0].detail.contains("all 2 permissions"));
}

#[test]
fn denials_grouped_per_resource_with_fix() {
    let mut lease = perm("leases", "create");
    lease.group = "coordination.k8s.io".into();
    lease.namespace = Some("kube-node-lease".into());
    let mut status = perm("nodes", "patch");
    status.subresource = Some("status".into());
    let answers = vec![
        (perm("pods", "get"), Ok(false)),
        (perm("pods", "delete"), Ok(false)),
        (perm("nodes", "get"), Ok(true)),
        (lease, Ok(false)),
        (status, Ok(false)),
        (perm("services", "get"), Err("timed out".to_string())),
    ];
    let r = evaluate(&answers);
    assert_eq!(r.len(), 4, "{r:#?}");
    assert!(r.iter().all(|c| c.status == Status::Fail));
    assert_eq!(r[0].detail, "pods: denied get, delete");
    assert!(
        r[0].fix
            .as_deref()
            .is_some_and(|f| f.contains("manifests/rbac.yaml"))
    );
    assert_eq!(
        r[1].detail,
        "leases.coordination.k8s.io in namespace kube-node-lease: denied create"
    );
    assert_eq!(r[2].detail, "nodes/status: denied patch");
    assert!(r[3].detail.contains("1 SelfSubjectAccessReview(s)"));
}

#[test]
fn inventory_group_outside_the_manifest_says_so() {
    let mut p = perm("nodeinventories", "create");
    p.group = "inv.example.com".into();
    let r = evaluate(&[(p, Ok(false))]);
    assert!(
        r[0].fix
            .as_deref()
            .is_some_and(|f| f.contains("--inventory-group")),
        "{r:?}"
    );
}

#[test]
fn the_cordon_drain_needs_list_and_watch_on_nodes() {
    let nodes = |drain| {
        let mut v: Vec<String> = required(None, false, false, false, drain)
            .into_iter()
            .filter(|p| p.resource == "nodes" && p.subresource.is_none())
            .map(|p| p.verb)
            .collect();
        v.sort();
        v
    };
    assert_eq!(nodes(false), ["create", "get", "patch"]);
    assert_eq!(nodes(true), ["create", "get", "list", "patch", "watch"]);
}
