//! Egress NetworkPolicy against sandboxd's network lane (pure). vk-sandbox
//! sees no connection the guest makes: what a VM may reach is its lane
//! (`sandbox.cocoonstack.io/net`: `none`, no NIC, or `egress`). Where a
//! policy selecting the Pod limits its egress and the lane is one that lets
//! the VM out, the policy is not what holds, and a Warning Event says so
//! (docs/networkpolicy.md#egress), once per Pod and message.

use std::collections::{BTreeMap, BTreeSet};

use super::selector::Labels;
use super::verdict::Policy;

/// The lane of a VM with no network interface: nothing leaves it, so every
/// egress policy holds (more than holds: allowed destinations are
/// unreachable too, which is the lane's choice, not a policy gap).
pub const NO_NIC_LANE: &str = "none";

/// Why the egress policies selecting a Pod of `namespace` with `labels`
/// are not what limits its VM, or `None` when nothing is amiss: no policy
/// limits its egress (one allowing everything does not), or its lane has
/// no NIC. `lane` is the Pod's `sandbox.cocoonstack.io/net` (empty: the
/// default, `none`).
pub fn gap<'p>(
    policies: impl IntoIterator<Item = &'p Policy>,
    namespace: &str,
    labels: &Labels,
    lane: &str,
) -> Option<String> {
    if lane.is_empty() || lane == NO_NIC_LANE {
        return None;
    }
    let names: Vec<String> = policies
        .into_iter()
        .filter(|p| p.restricts_egress_of(namespace, labels))
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    let (first, rest) = names.split_first()?;
    let which = if rest.is_empty() {
        format!("NetworkPolicy {first} limits")
    } else {
        format!("NetworkPolicies {} limit", names.join(", "))
    };
    Some(format!(
        "{which} this Pod's egress, which vk-sandbox cannot enforce: the VM's \
         outgoing connections are what sandboxd's {lane:?} lane allows \
         (sandbox.cocoonstack.io/net; \"none\" has no network interface)"
    ))
}

/// What each Pod was last told, so that a gap is reported once per Pod and
/// message: again only when it changes, or after it went away and came
/// back.
#[derive(Debug, Default)]
pub struct Told {
    by_uid: BTreeMap<String, String>,
}

impl Told {
    /// The message to report for the Pod `uid` now, if any: its gap when
    /// it differs from what was last reported.
    pub fn update(&mut self, uid: &str, gap: Option<String>) -> Option<String> {
        match gap {
            None => {
                self.by_uid.remove(uid);
                None
            }
            Some(g) if self.by_uid.get(uid) == Some(&g) => None,
            Some(g) => {
                self.by_uid.insert(uid.to_string(), g.clone());
                Some(g)
            }
        }
    }

    /// Forgets what `uid` was told (its report failed: tell it again).
    pub fn forget(&mut self, uid: &str) {
        self.by_uid.remove(uid);
    }

    /// Forgets the Pods not in `present` (gone from the node).
    pub fn keep_only(&mut self, present: &BTreeSet<String>) {
        self.by_uid.retain(|uid, _| present.contains(uid));
    }

    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use serde_json::{Value, json};

    fn policy(name: &str, spec: Value) -> Policy {
        let np: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"namespace": "shop", "name": name},
            "spec": spec,
        }))
        .unwrap();
        Policy::compile(&np).0
    }

    fn web() -> Labels {
        Labels::from([("app".to_string(), "web".to_string())])
    }

    /// agent-sandbox v1.0.3's managed policy, in shape: ingress from the
    /// router, egress to public addresses only.
    fn managed() -> Policy {
        policy(
            "sandbox-managed",
            json!({
                "podSelector": {"matchLabels": {"app": "web"}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{"podSelector": {}}]}],
                "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}]}],
            }),
        )
    }

    #[test]
    fn a_limiting_policy_on_an_egress_lane_is_reported_by_name_and_lane() {
        let g = gap([&managed()], "shop", &web(), "egress").unwrap();
        assert!(
            g.starts_with("NetworkPolicy shop/sandbox-managed limits"),
            "{g}"
        );
        assert!(g.contains("sandboxd's \"egress\" lane"), "{g}");
    }

    #[test]
    fn a_vm_without_a_nic_has_no_gap_whatever_the_policy() {
        assert_eq!(gap([&managed()], "shop", &web(), "none"), None);
        assert_eq!(gap([&managed()], "shop", &web(), ""), None);
    }

    #[test]
    fn policies_that_do_not_limit_egress_or_do_not_select_the_pod_are_no_gap() {
        let ingress_only = policy("in", json!({"podSelector": {}, "ingress": [{}]}));
        let allow_all = policy(
            "all",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}),
        );
        let other_pods = policy(
            "db",
            json!({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Egress"]}),
        );
        let all = [&ingress_only, &allow_all, &other_pods];
        assert_eq!(gap(all, "shop", &web(), "egress"), None);
        // The same policy, for a Pod of another namespace.
        assert_eq!(gap([&managed()], "other", &web(), "egress"), None);
    }

    #[test]
    fn effective_policy_types_decide_whether_egress_is_limited() {
        // No policyTypes, egress rules: Egress is effective.
        let implied = policy(
            "implied",
            json!({"podSelector": {}, "egress": [{"ports": [{"port": 443}]}]}),
        );
        assert!(gap([&implied], "shop", &web(), "egress").is_some());
        // Egress named with no rules: nothing may leave.
        let deny = policy(
            "deny",
            json!({"podSelector": {}, "policyTypes": ["Egress"]}),
        );
        assert!(gap([&deny], "shop", &web(), "egress").is_some());
        // An open rule beside a narrow one: everything is allowed.
        let open = policy(
            "open",
            json!({"podSelector": {}, "policyTypes": ["Egress"],
                   "egress": [{"ports": [{"port": 53}]}, {"to": []}]}),
        );
        assert_eq!(gap([&open], "shop", &web(), "egress"), None);
        // An invalid selector selects nothing.
        let invalid = policy(
            "bad",
            json!({"podSelector": {"matchExpressions": [{"key": "app", "operator": "Near"}]},
                   "policyTypes": ["Egress"]}),
        );
        assert_eq!(gap([&invalid], "shop", &web(), "egress"), None);
    }

    #[test]
    fn several_limiting_policies_are_named_together() {
        let second = policy(
            "second",
            json!({"podSelector": {}, "policyTypes": ["Egress"]}),
        );
        let g = gap([&managed(), &second], "shop", &web(), "egress").unwrap();
        assert!(
            g.starts_with("NetworkPolicies shop/sandbox-managed, shop/second limit"),
            "{g}"
        );
    }

    #[test]
    fn a_gap_is_told_once_per_pod_and_message() {
        let mut told = Told::default();
        assert_eq!(told.update("u1", Some("a".into())), Some("a".into()));
        assert_eq!(told.update("u1", Some("a".into())), None);
        assert_eq!(told.update("u2", Some("a".into())), Some("a".into()));
        assert_eq!(told.update("u1", Some("b".into())), Some("b".into()));
        // Gone and back: told again.
        assert_eq!(told.update("u1", None), None);
        assert_eq!(told.update("u1", Some("b".into())), Some("b".into()));
        told.keep_only(&BTreeSet::from(["u2".to_string()]));
        assert_eq!(told.len(), 1);
        assert_eq!(told.update("u1", Some("b".into())), Some("b".into()));
        assert_eq!(told.update("u2", Some("a".into())), None);
        told.forget("u2");
        assert_eq!(told.update("u2", Some("a".into())), Some("a".into()));
    }
}
