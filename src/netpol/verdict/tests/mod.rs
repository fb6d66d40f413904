use super::*;
use serde_json::{Value, json};

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn policy(ns: &str, name: &str, spec: Value) -> NetworkPolicy {
    serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": ns, "name": name}, "spec": spec,
    }))
    .expect("test policy")
}

fn one(p: &NetworkPolicy) -> &[NetworkPolicy] {
    std::slice::from_ref(p)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The target of most cases: `app=web` in `shop`, declaring `http` (8080)
/// and `metrics` (9090/TCP), and `dns` (53/UDP).
struct World {
    target_labels: Labels,
    ports: Vec<DeclaredPort>,
    shop: Labels,
    other: Labels,
}

fn world() -> World {
    let port = |name: &str, number, protocol: &str| DeclaredPort {
        name: name.into(),
        number,
        protocol: protocol.into(),
    };
    World {
        target_labels: labels(&[("app", "web")]),
        ports: vec![
            port("http", 8080, "TCP"),
            port("metrics", 9090, "TCP"),
            port("dns", 53, "UDP"),
        ],
        shop: labels(&[(NAMESPACE_NAME_LABEL, "shop"), ("team", "a")]),
        other: labels(&[(NAMESPACE_NAME_LABEL, "other"), ("team", "b")]),
    }
}

impl World {
    fn target(&self) -> Target<'_> {
        Target {
            namespace: "shop",
            labels: &self.target_labels,
            ports: &self.ports,
        }
    }

    /// A Pod of `ns` (`shop` or `other`) with `labels`.
    fn pod<'a>(&'a self, ns: &'a str, labels: &'a Labels) -> SourcePod<'a> {
        SourcePod {
            namespace: ns,
            labels,
            namespace_labels: if ns == "shop" {
                &self.shop
            } else {
                &self.other
            },
        }
    }

    /// The verdict on `policies` for a connection from `from` (the address
    /// and its Pods) to `port`.
    fn check(
        &self,
        policies: &[NetworkPolicy],
        from: &str,
        pods: &[SourcePod],
        port: u16,
    ) -> Verdict {
        let source = Source { ip: ip(from), pods };
        evaluate(policies, &self.target(), &source, port)
    }

    fn allows(
        &self,
        policies: &[NetworkPolicy],
        from: &str,
        pods: &[SourcePod],
        port: u16,
    ) -> bool {
        self.check(policies, from, pods, port).allowed
    }
}

fn ingress_from(ns: &str, from: Value) -> NetworkPolicy {
    policy(
        ns,
        "p",
        json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": from}]}),
    )
}

fn ingress_ports(ports: Value) -> NetworkPolicy {
    policy(
        "shop",
        "p",
        json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"ports": ports}]}),
    )
}

#[test]
fn no_policy_allows_everything() {
    let w = world();
    let v = w.check(&[], "192.0.2.1", &[], 80);
    assert_eq!(
        v,
        Verdict {
            allowed: true,
            why: "no NetworkPolicy selects the Pod".into()
        }
    );
}

#[test]
fn a_policy_of_another_namespace_selects_nothing_here() {
    let w = world();
    let deny = policy("other", "deny", json!({"podSelector": {}}));
    assert!(w.allows(&[deny], "192.0.2.1", &[], 80));
}

#[test]
fn the_pod_selector_decides_which_pods_a_policy_selects() {
    let w = world();
    let deny = |sel: Value| policy("shop", "deny", json!({"podSelector": sel}));
    assert!(!w.allows(&[deny(json!({}))], "192.0.2.1", &[], 80));
    assert!(!w.allows(
        &[deny(json!({"matchLabels": {"app": "web"}}))],
        "192.0.2.1",
        &[],
        80
    ));
    assert!(w.allows(
        &[deny(json!({"matchLabels": {"app": "db"}}))],
        "192.0.2.1",
        &[],
        80
    ));
    let expr = json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["db"]}]});
    assert!(!w.allows(&[deny(expr)], "192.0.2.1", &[], 80));
    // An absent podSelector (optional since v1.33's API) selects every Pod.
    let absent = policy("shop", "deny", json!({}));
    assert!(!w.allows(&[absent], "192.0.2.1", &[], 80));
}

#[test]
fn policy_types_decide_whether_a_policy_is_about_ingress() {
    let w = world();
    let with = |types: Value, egress: bool| {
        let mut spec = json!({"podSelector": {}});
        if !types.is_null() {
            spec["policyTypes"] = types;
        }
        if egress {
            spec["egress"] = json!([{}]);
        }
        policy("shop", "p", spec)
    };
    // Selecting with no ingress rule: nothing is allowed.
    for (types, egress) in [
        (Value::Null, false),
        (Value::Null, true),
        (json!([]), false),
        (json!(["Ingress"]), false),
        (json!(["Ingress", "Egress"]), true),
        (json!(["Egress", "Ingress"]), false),
    ] {
        assert!(
            !w.allows(&[with(types.clone(), egress)], "192.0.2.1", &[], 80),
            "policyTypes {types}, egress rules {egress}: selects for ingress"
        );
    }
    // Egress only: not about ingress at all.
    assert!(w.allows(&[with(json!(["Egress"]), true)], "192.0.2.1", &[], 80));
    assert!(w.allows(&[with(json!(["Egress"]), false)], "192.0.2.1", &[], 80));
    assert!(w.allows(&[with(json!(["ingress"]), false)], "192.0.2.1", &[], 80));
}

#[test]
fn an_egress_only_policy_with_ingress_rules_still_allows_everything() {
    let w = world();
    let p = policy(
        "shop",
        "p",
        json!({"podSelector": {}, "policyTypes": ["Egress"], "ingress": [{"ports": [{"port": 1}]}]}),
    );
    assert!(w.allows(&[p], "192.0.2.1", &[], 80));
}

#[test]
fn an_empty_rule_allows_every_source_and_port() {
    let w = world();
    let p = policy("shop", "p", json!({"podSelector": {}, "ingress": [{}]}));
    assert!(w.allows(one(&p), "192.0.2.1", &[], 1));
    assert!(w.allows(one(&p), "2001:db8::1", &[], 65535));
    let empty_lists = policy(
        "shop",
        "p",
        json!({"podSelector": {}, "ingress": [{"from": [], "ports": []}]}),
    );
    assert!(w.allows(&[empty_lists], "192.0.2.1", &[], 80));
}

#[test]
fn the_verdict_names_the_allowing_policy_and_rule() {
    let w = world();
    let deny = policy("shop", "deny-all", json!({"podSelector": {}}));
    let allow = policy(
        "shop",
        "web",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [
            {"ports": [{"port": 1}]},
            {"ports": [{"port": 80}]},
        ]}),
    );
    let v = w.check(&[deny.clone(), allow.clone()], "192.0.2.1", &[], 80);
    assert_eq!(v.why, "allowed by NetworkPolicy shop/web ingress[1]");
    assert!(v.allowed);
    let v = w.check(&[deny, allow], "192.0.2.1", &[], 81);
    assert_eq!(
        v,
        Verdict {
            allowed: false,
            why: "2 NetworkPolicies select the Pod (deny-all, web); none allows 192.0.2.1 to TCP port 81"
                .into()
        }
    );
}

#[test]
fn a_denial_names_one_policy_in_the_singular_and_at_most_three() {
    let w = world();
    let deny = |n: &str| policy("shop", n, json!({"podSelector": {}}));
    let v = w.check(&[deny("a")], "192.0.2.1", &[], 80);
    assert_eq!(
        v.why,
        "1 NetworkPolicy selects the Pod (a); none allows 192.0.2.1 to TCP port 80"
    );
    let v = w.check(&[deny("a"), deny("b"), deny("c")], "192.0.2.1", &[], 80);
    assert_eq!(
        v.why,
        "3 NetworkPolicies select the Pod (a, b, c); none allows 192.0.2.1 to TCP port 80"
    );
    let four = [deny("a"), deny("b"), deny("c"), deny("d")];
    let v = w.check(&four, "::ffff:192.0.2.1", &[], 80);
    assert_eq!(
        v.why,
        "4 NetworkPolicies select the Pod (a, b, c, ...); none allows 192.0.2.1 to TCP port 80"
    );
    assert!(!v.allowed);
}

#[test]
fn policies_add_up_whatever_their_order() {
    let w = world();
    let only_80 = ingress_ports(json!([{"port": 80}]));
    let mut only_90 = ingress_ports(json!([{"port": 90}]));
    only_90.metadata.name = Some("q".into());
    let deny = policy("shop", "deny", json!({"podSelector": {}}));
    for set in [
        vec![only_80.clone(), only_90.clone(), deny.clone()],
        vec![deny.clone(), only_90.clone(), only_80.clone()],
    ] {
        assert!(w.allows(&set, "192.0.2.1", &[], 80));
        assert!(w.allows(&set, "192.0.2.1", &[], 90));
        assert!(!w.allows(&set, "192.0.2.1", &[], 85));
    }
}

#[test]
fn a_pod_selector_peer_alone_means_pods_of_the_policys_namespace() {
    let w = world();
    let p = ingress_from(
        "shop",
        json!([{"podSelector": {"matchLabels": {"role": "client"}}}]),
    );
    let client = labels(&[("role", "client")]);
    let stranger = labels(&[("role", "other")]);
    assert!(w.allows(one(&p), "10.0.0.1", &[w.pod("shop", &client)], 80));
    assert!(!w.allows(one(&p), "10.0.0.1", &[w.pod("other", &client)], 80));
    assert!(!w.allows(one(&p), "10.0.0.1", &[w.pod("shop", &stranger)], 80));
    assert!(
        !w.allows(one(&p), "10.0.0.1", &[], 80),
        "an address is no Pod"
    );
    let all_here = ingress_from("shop", json!([{"podSelector": {}}]));
    assert!(w.allows(one(&all_here), "10.0.0.1", &[w.pod("shop", &stranger)], 80));
    assert!(!w.allows(&[all_here], "10.0.0.1", &[w.pod("other", &client)], 80));
}

#[test]
fn a_namespace_selector_peer_alone_means_every_pod_of_those_namespaces() {
    let w = world();
    let p = ingress_from(
        "shop",
        json!([{"namespaceSelector": {"matchLabels": {"team": "b"}}}]),
    );
    let any = labels(&[("x", "y")]);
    assert!(w.allows(one(&p), "10.0.0.1", &[w.pod("other", &any)], 80));
    assert!(!w.allows(one(&p), "10.0.0.1", &[w.pod("shop", &any)], 80));
    assert!(!w.allows(&[p], "10.0.0.1", &[], 80));
    let every_ns = ingress_from("shop", json!([{"namespaceSelector": {}}]));
    assert!(w.allows(one(&every_ns), "10.0.0.1", &[w.pod("other", &any)], 80));
    assert!(w.allows(one(&every_ns), "10.0.0.1", &[w.pod("shop", &any)], 80));
    assert!(!w.allows(&[every_ns], "10.0.0.1", &[], 80), "not a Pod");
}

#[test]
fn both_selectors_in_one_peer_need_both() {
    let w = world();
    let p = ingress_from(
        "shop",
        json!([{"namespaceSelector": {"matchLabels": {"team": "b"}},
                "podSelector": {"matchLabels": {"role": "client"}}}]),
    );
    let client = labels(&[("role", "client")]);
    let stranger = labels(&[("role", "x")]);
    assert!(w.allows(one(&p), "10.0.0.1", &[w.pod("other", &client)], 80));
    assert!(!w.allows(one(&p), "10.0.0.1", &[w.pod("shop", &client)], 80));
    assert!(!w.allows(&[p], "10.0.0.1", &[w.pod("other", &stranger)], 80));
}

#[test]
fn two_peers_are_either() {
    let w = world();
    let p = ingress_from(
        "shop",
        json!([{"namespaceSelector": {"matchLabels": {"team": "b"}}},
               {"podSelector": {"matchLabels": {"role": "client"}}}]),
    );
    let client = labels(&[("role", "client")]);
    let stranger = labels(&[("role", "x")]);
    assert!(w.allows(one(&p), "10.0.0.1", &[w.pod("other", &stranger)], 80));
    assert!(w.allows(one(&p), "10.0.0.1", &[w.pod("shop", &client)], 80));
    assert!(!w.allows(&[p], "10.0.0.1", &[w.pod("shop", &stranger)], 80));
}

#[test]
fn a_namespace_is_matched_on_its_labels_not_its_name() {
    let w = world();
    let p = ingress_from(
        "shop",
        json!([{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "other"}}}]),
    );
    let any = labels(&[]);
    let bare = labels(&[]);
    let unlabelled = SourcePod {
        namespace: "other",
        labels: &any,
        namespace_labels: &bare,
    };
    assert!(w.allows(one(&p), "10.0.0.1", &[w.pod("other", &any)], 80));
    assert!(!w.allows(&[p], "10.0.0.1", &[unlabelled], 80));
}

mod addresses;
mod compile;
