//! What the placement webhook does to a sandbox Pod being created
//! (docs/placement.md). Pure: the Pod, where its key's VM is held and the
//! settings in; a JSON patch and why out.
//!
//! - Tolerations: `node.kubernetes.io/unreachable` and
//!   `node.kubernetes.io/not-ready`, `NoExecute`, without
//!   `tolerationSeconds`, so a silent node agent never evicts a sandbox.
//!   The apiserver's `DefaultTolerationSeconds` plugin runs before
//!   mutating webhooks and has already given the Pod 300 s ones; a
//!   toleration of exactly these keys and `NoExecute` with
//!   `tolerationSeconds` is replaced (the eviction controller takes the
//!   shortest of the matching tolerations, so it could not stay beside).
//! - Placement: required node affinity (`matchFields` `metadata.name In`)
//!   for the node(s) holding a VM for the Pod's `<namespace>/<name>`,
//!   added to every term the Pod already has (terms are ORed, a term's
//!   requirements ANDed). A Pod whose VM is on no node, or already bound,
//!   or whose holders are not known yet, is not placed.

use k8s_openapi::api::core::v1::{
    Affinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, Toleration,
};
use serde_json::{Value, json};

use crate::pods::annotations::{RUNTIME, SANDBOXD};

/// The taints a node agent's outage puts on its Node.
pub const OUTAGE_TAINTS: [&str; 2] = [
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/not-ready",
];
const NO_EXECUTE: &str = "NoExecute";
/// The field a node's name is matched by (as DaemonSet Pods are pinned).
const NODE_NAME_FIELD: &str = "metadata.name";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `--webhook-tolerations`: add the outage tolerations.
    pub tolerations: bool,
}

/// What the index says about the Pod's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The NodeInventory watch has not listed yet.
    NotSynced,
    /// The nodes holding a VM for the key (empty: none does).
    Held(Vec<String>),
}

/// Where the Pod goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Required node affinity for these nodes (sorted).
    Pinned(Vec<String>),
    /// Its VM is on no node: the scheduler chooses.
    Unheld,
    /// The Pod already names its node (`spec.nodeName`).
    AlreadyBound(String),
    /// No name yet (`generateName`): no key to look up.
    NoKey,
    /// The holders are not known yet (the watch has not listed).
    Unknown,
    /// Its affinity already requires these nodes (reinvoked, or set by
    /// hand).
    AlreadyPinned,
}

/// What became of the outage tolerations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tolerations {
    /// Added (or replaced limited ones).
    Set,
    /// The Pod already tolerates both without a limit.
    Present,
    /// `--webhook-tolerations=false`.
    Off,
    /// Set, but a broader toleration of the Pod (no key, or no effect)
    /// still carries `tolerationSeconds`, which the eviction controller
    /// honours: the Pod stays evictable after that long.
    LimitedByPod,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Not a sandbox Pod (no `sandbox.cocoonstack.io/runtime: sandboxd`).
    NotOurs,
    Mutate {
        /// JSON patch operations (RFC 6902), empty when nothing changes.
        patch: Vec<Value>,
        placement: Placement,
        tolerations: Tolerations,
    },
}

impl Decision {
    /// The patch operations (none for a Pod that is not ours).
    pub fn patch(&self) -> &[Value] {
        match self {
            Decision::NotOurs => &[],
            Decision::Mutate { patch, .. } => patch,
        }
    }
}

/// Whether the Pod asks for the sandboxd runtime by its annotation.
pub fn is_sandbox_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RUNTIME))
        .is_some_and(|v| v == SANDBOXD)
}

/// The key a Pod's VM is held under, `<namespace>/<name>` (`namespace`:
/// the request's, which a Pod being created may not carry itself); `None`
/// while it has no name.
pub fn key(pod: &Pod, namespace: &str) -> Option<String> {
    let name = pod.metadata.name.as_deref().filter(|n| !n.is_empty())?;
    let ns = pod
        .metadata
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or(namespace);
    Some(format!("{ns}/{name}"))
}

/// The webhook's decision for `pod`; `lookup`: what the index says about
/// its [`key`].
pub fn decide(pod: &Pod, lookup: &Lookup, settings: Settings) -> Decision {
    if !is_sandbox_pod(pod) {
        return Decision::NotOurs;
    }
    let spec = pod.spec.clone().unwrap_or_default();
    let mut patch = Vec::new();

    let tolerations = if settings.tolerations {
        let (list, outcome) = outage_tolerations(spec.tolerations.as_deref().unwrap_or_default());
        if outcome != Tolerations::Present {
            patch.push(json!({"op": "add", "path": "/spec/tolerations", "value": list}));
        }
        outcome
    } else {
        Tolerations::Off
    };

    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let placement = match (spec.node_name.as_deref(), lookup) {
        (Some(node), _) if !node.is_empty() => Placement::AlreadyBound(node.to_string()),
        _ if name.is_empty() => Placement::NoKey,
        (_, Lookup::NotSynced) => Placement::Unknown,
        (_, Lookup::Held(nodes)) if nodes.is_empty() => Placement::Unheld,
        (_, Lookup::Held(nodes)) => {
            let mut nodes = nodes.clone();
            nodes.sort();
            nodes.dedup();
            match pinned(spec.affinity.as_ref(), &nodes) {
                Some(affinity) => {
                    patch.push(json!({"op": "add", "path": "/spec/affinity", "value": affinity}));
                    Placement::Pinned(nodes)
                }
                None => Placement::AlreadyPinned,
            }
        }
    };
    Decision::Mutate {
        patch,
        placement,
        tolerations,
    }
}

/// The Pod's tolerations with the outage ones in place: limited ones of
/// exactly those keys and `NoExecute` dropped, unlimited ones appended
/// where nothing unlimited tolerates the taint already.
fn outage_tolerations(current: &[Toleration]) -> (Vec<Toleration>, Tolerations) {
    let limited_exact = |t: &Toleration| {
        t.effect.as_deref() == Some(NO_EXECUTE)
            && t.toleration_seconds.is_some()
            && t.key.as_deref().is_some_and(|k| OUTAGE_TAINTS.contains(&k))
    };
    let mut list: Vec<Toleration> = current
        .iter()
        .filter(|t| !limited_exact(t))
        .cloned()
        .collect();
    let mut added = list.len() != current.len();
    for key in OUTAGE_TAINTS {
        if !list
            .iter()
            .any(|t| tolerates(t, key) && t.toleration_seconds.is_none())
        {
            list.push(Toleration {
                key: Some(key.to_string()),
                operator: Some("Exists".into()),
                effect: Some(NO_EXECUTE.into()),
                ..Toleration::default()
            });
            added = true;
        }
    }
    let limited = list
        .iter()
        .any(|t| t.toleration_seconds.is_some() && OUTAGE_TAINTS.iter().any(|k| tolerates(t, k)));
    let outcome = match (added, limited) {
        (_, true) => Tolerations::LimitedByPod,
        (true, false) => Tolerations::Set,
        (false, false) => Tolerations::Present,
    };
    (list, outcome)
}

/// Whether `t` tolerates the taint `key` (no value) with `NoExecute`, as
/// the scheduler and the eviction controller match them.
fn tolerates(t: &Toleration, key: &str) -> bool {
    let effect = matches!(t.effect.as_deref(), None | Some("") | Some(NO_EXECUTE));
    let key_ok = match t.key.as_deref() {
        None | Some("") => t.operator.as_deref() == Some("Exists"),
        Some(k) => k == key,
    };
    let value_ok = match t.operator.as_deref() {
        Some("Exists") => true,
        None | Some("") | Some("Equal") => t.value.as_deref().unwrap_or_default().is_empty(),
        Some(_) => false,
    };
    effect && key_ok && value_ok
}

/// The Pod's affinity requiring `nodes`, or `None` when every term it has
/// already requires exactly that.
fn pinned(current: Option<&Affinity>, nodes: &[String]) -> Option<Affinity> {
    let requirement = NodeSelectorRequirement {
        key: NODE_NAME_FIELD.into(),
        operator: "In".into(),
        values: Some(nodes.to_vec()),
    };
    let mut affinity = current.cloned().unwrap_or_default();
    let mut node_affinity = affinity.node_affinity.take().unwrap_or_default();
    let mut required = node_affinity
        .required_during_scheduling_ignored_during_execution
        .take()
        .unwrap_or_default();
    let mut changed = false;
    if required.node_selector_terms.is_empty() {
        required.node_selector_terms.push(NodeSelectorTerm {
            match_fields: Some(vec![requirement]),
            ..NodeSelectorTerm::default()
        });
        changed = true;
    } else {
        for term in &mut required.node_selector_terms {
            // An empty term matches no node; it stays as it is.
            let empty = term.match_expressions.as_ref().is_none_or(Vec::is_empty)
                && term.match_fields.as_ref().is_none_or(Vec::is_empty);
            if empty {
                continue;
            }
            let fields = term.match_fields.get_or_insert_with(Vec::new);
            if !fields.contains(&requirement) {
                fields.push(requirement.clone());
                changed = true;
            }
        }
    }
    if !changed {
        return None;
    }
    node_affinity.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: required.node_selector_terms,
    });
    affinity.node_affinity = Some(node_affinity);
    Some(affinity)
}

#[cfg(test)]
mod tests;
