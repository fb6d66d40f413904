//! The permissions vk-sandbox needs, as one table that mirrors the
//! ClusterRole of `manifests/rbac.yaml` (a unit test keeps the two equal),
//! and the pure evaluation of SelfSubjectAccessReview
//! answers into checklist lines.

use std::collections::{BTreeMap, BTreeSet};

use super::check::CheckResult;
use crate::inventory::groups::Choice;

/// Where a permission is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// A cluster-scoped resource.
    Cluster,
    /// A namespaced resource, in every namespace (Pods land anywhere).
    AllNamespaces,
    /// A namespaced resource in one namespace.
    Namespace(&'static str),
    /// One named object in one namespace.
    Object(&'static str, &'static str),
}

/// When a rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Always,
    /// Only with `--publish-inventory`, in the groups published to
    /// (`inventory::groups::Choice::publish`).
    PublishInventory,
    /// Only with `--publish-inventory`, in the known groups served but not
    /// published to (`Choice::stale_candidates`): looking for a left-over
    /// object of this node.
    InventoryStaleCheck,
    /// Only with `--kubelet-auth` (the default).
    KubeletAuth,
    /// Only with `--pod-cidr`: the Pod-IP relay enforces NetworkPolicy
    /// (the netpol watches).
    NetworkPolicy,
    /// Only with `--webhook-addr`: the placement webhook's NodeInventory
    /// watch.
    PlacementWebhook,
}

/// One rule of the ClusterRole.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub groups: &'static [&'static str],
    /// `resource` or `resource/subresource`, as RBAC writes them.
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
    pub scope: Scope,
    pub need: Need,
    /// What the daemon uses it for.
    pub why: &'static str,
}

/// The API groups `manifests/rbac.yaml` grants `nodeinventories` in.
pub const INVENTORY_GROUPS: &[&str] = &["sandbox.cocoonstack.io", "extensions.agents.x-k8s.io"];

/// Every permission the daemon uses. Keep in step with the ClusterRole in
/// `manifests/rbac.yaml` (the test `table_matches_manifest` fails otherwise).
pub const RULES: &[Rule] = &[
    Rule {
        groups: &[""],
        resources: &["nodes"],
        verbs: &["get", "create", "patch"],
        scope: Scope::Cluster,
        need: Need::Always,
        why: "register, adopt and label the virtual Node",
    },
    Rule {
        groups: &[""],
        resources: &["nodes/status"],
        verbs: &["patch"],
        scope: Scope::Cluster,
        need: Need::Always,
        why: "Node status heartbeats",
    },
    Rule {
        groups: &[""],
        resources: &["pods"],
        verbs: &["list", "watch", "delete"],
        scope: Scope::AllNamespaces,
        need: Need::Always,
        why: "watch the node's Pods and complete their termination",
    },
    Rule {
        groups: &[""],
        resources: &["pods/status"],
        verbs: &["patch"],
        scope: Scope::AllNamespaces,
        need: Need::Always,
        why: "report Pod status",
    },
    Rule {
        groups: &["events.k8s.io"],
        resources: &["events"],
        verbs: &["create", "patch"],
        scope: Scope::AllNamespaces,
        need: Need::Always,
        why: "Events on Pods",
    },
    Rule {
        groups: &["agents.x-k8s.io"],
        resources: &["sandboxes"],
        verbs: &["get"],
        scope: Scope::AllNamespaces,
        need: Need::Always,
        why: "delete authorization reads the Pod's owning Sandbox",
    },
    Rule {
        groups: INVENTORY_GROUPS,
        resources: &["nodeinventories"],
        verbs: &["create", "patch"],
        scope: Scope::Cluster,
        need: Need::PublishInventory,
        why: "publish the NodeInventory",
    },
    Rule {
        groups: INVENTORY_GROUPS,
        resources: &["nodeinventories"],
        verbs: &["get"],
        scope: Scope::Cluster,
        need: Need::InventoryStaleCheck,
        why: "report a NodeInventory of this node left in a group it no longer publishes in",
    },
    Rule {
        groups: INVENTORY_GROUPS,
        resources: &["nodeinventories"],
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        need: Need::PlacementWebhook,
        why: "the placement webhook's index of which node holds which VM",
    },
    Rule {
        groups: &["networking.k8s.io"],
        resources: &["networkpolicies"],
        verbs: &["list", "watch"],
        scope: Scope::AllNamespaces,
        need: Need::NetworkPolicy,
        why: "enforce ingress NetworkPolicy at the Pod-IP relay",
    },
    Rule {
        groups: &[""],
        resources: &["namespaces"],
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        need: Need::NetworkPolicy,
        why: "namespace labels for NetworkPolicy namespaceSelectors",
    },
    Rule {
        groups: &["authentication.k8s.io"],
        resources: &["tokenreviews"],
        verbs: &["create"],
        scope: Scope::Cluster,
        need: Need::KubeletAuth,
        why: "authenticate kubelet API callers",
    },
    Rule {
        groups: &["authorization.k8s.io"],
        resources: &["subjectaccessreviews"],
        verbs: &["create"],
        scope: Scope::Cluster,
        need: Need::KubeletAuth,
        why: "authorize kubelet API callers",
    },
    Rule {
        groups: &["coordination.k8s.io"],
        resources: &["leases"],
        verbs: &["get", "create", "update"],
        scope: Scope::Namespace("kube-node-lease"),
        need: Need::Always,
        why: "the node Lease",
    },
    Rule {
        groups: &[""],
        resources: &["configmaps"],
        verbs: &["get"],
        scope: Scope::Object("kube-system", "extension-apiserver-authentication"),
        need: Need::KubeletAuth,
        why: "the cluster's client CA for kubelet API client certificates",
    },
];

/// One SelfSubjectAccessReview to make.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Permission {
    /// `""` for the core group.
    pub group: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub verb: String,
    /// `None`: cluster-scoped, or every namespace.
    pub namespace: Option<String>,
    /// `Some`: only this object.
    pub name: Option<String>,
}

impl Permission {
    /// `resource[/sub][.group][ in namespace ns]`, for messages.
    pub fn target(&self) -> String {
        let mut s = self.resource.clone();
        if let Some(sub) = &self.subresource {
            s.push('/');
            s.push_str(sub);
        }
        if !self.group.is_empty() {
            s.push('.');
            s.push_str(&self.group);
        }
        if let Some(name) = &self.name {
            s.push_str(&format!(" {name}"));
        }
        if let Some(ns) = &self.namespace {
            s.push_str(&format!(" in namespace {ns}"));
        }
        s
    }
}

/// The permissions this configuration needs, in table order.
/// `inventory`: where the NodeInventory goes, when publishing;
/// `network_policy`: whether Pod addresses (`--pod-cidr`) are served.
pub fn required(
    inventory: Option<&Choice>,
    kubelet_auth: bool,
    network_policy: bool,
    webhook: bool,
) -> Vec<Permission> {
    let mut out = Vec::new();
    for rule in RULES {
        let groups: Vec<&str> = match rule.need {
            Need::Always => rule.groups.to_vec(),
            Need::PublishInventory => match inventory {
                Some(c) => c.publish.iter().map(String::as_str).collect(),
                None => continue,
            },
            Need::InventoryStaleCheck => match inventory {
                Some(c) => c.stale_candidates.iter().map(String::as_str).collect(),
                None => continue,
            },
            Need::KubeletAuth if kubelet_auth => rule.groups.to_vec(),
            Need::KubeletAuth => continue,
            Need::NetworkPolicy if network_policy => rule.groups.to_vec(),
            Need::NetworkPolicy => continue,
            Need::PlacementWebhook if webhook => rule.groups.to_vec(),
            Need::PlacementWebhook => continue,
        };
        let (namespace, name) = match rule.scope {
            Scope::Namespace(ns) => (Some(ns.to_string()), None),
            Scope::Object(ns, name) => (Some(ns.to_string()), Some(name.to_string())),
            Scope::Cluster | Scope::AllNamespaces => (None, None),
        };
        for group in groups {
            for resource in rule.resources {
                let (resource, subresource) = match resource.split_once('/') {
                    Some((r, s)) => (r, Some(s.to_string())),
                    None => (*resource, None),
                };
                for verb in rule.verbs {
                    out.push(Permission {
                        group: group.to_string(),
                        resource: resource.to_string(),
                        subresource: subresource.clone(),
                        verb: verb.to_string(),
                        namespace: namespace.clone(),
                        name: name.clone(),
                    });
                }
            }
        }
    }
    out
}

/// The RBAC lines from the answers (`Ok(allowed)` or the request's error):
/// one `[ok]` line when everything is granted; otherwise one `[FAIL]` line
/// per resource with the verbs denied, and one for reviews that failed.
pub fn evaluate(answers: &[(Permission, Result<bool, String>)]) -> Vec<CheckResult> {
    // target -> denied verbs, in first-seen order.
    let mut denied: Vec<(String, Vec<String>, bool)> = Vec::new();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for (perm, answer) in answers {
        match answer {
            Ok(true) => {}
            Ok(false) => {
                let target = perm.target();
                let extra_group = perm.resource == "nodeinventories"
                    && !INVENTORY_GROUPS.contains(&perm.group.as_str());
                match denied.iter_mut().find(|(t, _, _)| *t == target) {
                    Some((_, verbs, _)) => verbs.push(perm.verb.clone()),
                    None => denied.push((target, vec![perm.verb.clone()], extra_group)),
                }
            }
            Err(e) => *errors.entry(e.clone()).or_default() += 1,
        }
    }
    let mut out = Vec::new();
    for (target, verbs, extra_group) in denied {
        let fix = if extra_group {
            "manifests/rbac.yaml grants nodeinventories only in sandbox.cocoonstack.io and \
             extensions.agents.x-k8s.io: add this --inventory-group to that rule's apiGroups \
             and apply it, or use one of those groups"
                .to_string()
        } else {
            "grant it to the identity vk-sandbox runs as: kubectl apply -f manifests/rbac.yaml \
             (ClusterRole vk-sandbox, bound to ServiceAccount sandbox-system/vk-sandbox); with \
             other credentials, bind that ClusterRole to them"
                .to_string()
        };
        out.push(CheckResult::fail(
            "RBAC",
            format!("{target}: denied {}", verbs.join(", ")),
            fix,
        ));
    }
    for (error, count) in errors {
        out.push(CheckResult::fail(
            "RBAC",
            format!("{count} SelfSubjectAccessReview(s) could not be made: {error}"),
            "check the apiserver connection (any authenticated user may create \
             SelfSubjectAccessReviews)",
        ));
    }
    if out.is_empty() {
        out.push(CheckResult::ok(
            "RBAC",
            format!(
                "all {} permissions this configuration needs are granted (manifests/rbac.yaml)",
                answers.len()
            ),
        ));
    }
    out
}

/// One verb granted on one resource: `(where, group, resource[/sub], verb)`;
/// `where` is `*` for a ClusterRole, else the Role's namespace, plus
/// `/name` for a rule limited to one object.
pub type Grant = (String, String, String, String);

/// Every grant of the ClusterRoles and Roles in an RBAC manifest (a YAML
/// stream such as manifests/rbac.yaml), and how many ClusterRoles it has.
/// Other documents are skipped.
pub fn grants_of(manifest: &str) -> Result<(BTreeSet<Grant>, usize), String> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_str_multiple(manifest).map_err(|e| format!("not YAML: {e}"))?;
    let mut grants = BTreeSet::new();
    let mut cluster_roles = 0;
    for doc in docs {
        let scope = match doc["kind"].as_str() {
            Some("ClusterRole") => {
                cluster_roles += 1;
                "*".to_string()
            }
            Some("Role") => doc["metadata"]["namespace"]
                .as_str()
                .ok_or("a Role without metadata.namespace")?
                .to_string(),
            _ => continue,
        };
        for rule in doc["rules"].as_array().into_iter().flatten() {
            let list = |key: &str| -> Result<Vec<String>, String> {
                rule[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|v| {
                        v.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| format!("{key}: {v} is not a string"))
                    })
                    .collect()
            };
            let names = list("resourceNames")?;
            let wheres: Vec<String> = if names.is_empty() {
                vec![scope.clone()]
            } else {
                names.iter().map(|n| format!("{scope}/{n}")).collect()
            };
            for w in &wheres {
                for g in list("apiGroups")? {
                    for r in list("resources")? {
                        for v in list("verbs")? {
                            grants.insert((w.clone(), g.clone(), r.clone(), v));
                        }
                    }
                }
            }
        }
    }
    Ok((grants, cluster_roles))
}

#[cfg(test)]
mod tests {
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
            required(None, false, false, webhook)
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
        let base = required(None, false, false, false);
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
        let full = required(Some(&choice), true, true, false);
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
        assert_eq!(full.len(), base.len() + 3 + 2 + 1 + 4);
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
}
