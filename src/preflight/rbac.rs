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
    /// With `--webhook-addr` (the placement webhook's NodeInventory
    /// watch, every group), or with `--publish-inventory` (the check
    /// before a claim, src/pods/elsewhere: the groups published to).
    PlacementWebhook,
    /// Only with `--drain-sandboxd-on-cordon`: the watch of this Node's
    /// cordon (src/cordon).
    DrainOnCordon,
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
        resources: &["nodes"],
        verbs: &["list", "watch"],
        scope: Scope::Cluster,
        need: Need::DrainOnCordon,
        why: "watch this Node's cordon to drain sandboxd with it",
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
        why: "which node holds which VM: the placement webhook, and the check before a claim",
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
/// `network_policy`: whether Pod addresses (`--pod-cidr`) are served;
/// `drain_on_cordon`: `--drain-sandboxd-on-cordon`.
pub fn required(
    inventory: Option<&Choice>,
    kubelet_auth: bool,
    network_policy: bool,
    webhook: bool,
    drain_on_cordon: bool,
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
            // The check before a claim reads where this node publishes.
            Need::PlacementWebhook => match inventory {
                Some(c) => c.publish.iter().map(String::as_str).collect(),
                None => continue,
            },
            Need::DrainOnCordon if drain_on_cordon => rule.groups.to_vec(),
            Need::DrainOnCordon => continue,
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
mod tests;
