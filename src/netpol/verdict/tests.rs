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

#[test]
fn one_allowed_pod_at_an_address_is_enough() {
    let w = world();
    let p = ingress_from(
        "shop",
        json!([{"podSelector": {"matchLabels": {"role": "client"}}}]),
    );
    let client = labels(&[("role", "client")]);
    let host = labels(&[("role", "node-agent")]);
    let pods = [
        w.pod("other", &client),
        w.pod("shop", &host),
        w.pod("shop", &client),
    ];
    assert!(w.allows(one(&p), "10.0.0.1", &pods, 80));
    assert!(!w.allows(&[p], "10.0.0.1", &pods[..2], 80));
}

#[test]
fn an_ip_block_matches_the_address_whatever_the_pods() {
    let w = world();
    let p = ingress_from(
        "shop",
        json!([{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24", "10.0.2.7/32"]}}]),
    );
    let any = labels(&[]);
    assert!(w.allows(one(&p), "10.0.0.1", &[], 80));
    assert!(w.allows(one(&p), "10.0.0.1", &[w.pod("other", &any)], 80));
    assert!(w.allows(one(&p), "10.0.255.255", &[], 80));
    assert!(w.allows(one(&p), "10.0.2.6", &[], 80));
    assert!(!w.allows(one(&p), "10.0.1.9", &[], 80));
    assert!(!w.allows(one(&p), "10.0.2.7", &[], 80));
    assert!(!w.allows(one(&p), "10.1.0.1", &[w.pod("shop", &any)], 80));
    assert!(
        w.allows(one(&p), "::ffff:10.0.0.1", &[], 80),
        "a mapped address is IPv4"
    );
    assert!(!w.allows(&[p], "::ffff:10.0.1.1", &[], 80));
}

#[test]
fn an_ipv6_block_matches_ipv6_addresses() {
    let w = world();
    let p = ingress_from(
        "shop",
        json!([{"ipBlock": {"cidr": "2001:db8::/32", "except": ["2001:db8:1::/48"]}}]),
    );
    assert!(w.allows(one(&p), "2001:db8::5", &[], 80));
    assert!(!w.allows(one(&p), "2001:db8:1::5", &[], 80));
    assert!(!w.allows(one(&p), "2001:db9::5", &[], 80));
    assert!(!w.allows(&[p], "10.0.0.1", &[], 80));
}

#[test]
fn ports_match_by_number_and_range() {
    let w = world();
    let p = ingress_ports(json!([{"port": 80}, {"port": 8000, "endPort": 8010}]));
    for (port, allowed) in [
        (80, true),
        (79, false),
        (81, false),
        (8000, true),
        (8005, true),
        (8010, true),
        (7999, false),
        (8011, false),
    ] {
        assert_eq!(
            w.allows(one(&p), "192.0.2.1", &[], port),
            allowed,
            "port {port}"
        );
    }
    let top = ingress_ports(json!([{"port": 65535}, {"port": 1, "endPort": 1}]));
    assert!(w.allows(one(&top), "192.0.2.1", &[], 65535));
    assert!(w.allows(one(&top), "192.0.2.1", &[], 1));
    assert!(!w.allows(&[top], "192.0.2.1", &[], 2));
}

#[test]
fn a_port_without_a_number_is_every_port_of_its_protocol() {
    let w = world();
    let tcp = ingress_ports(json!([{"protocol": "TCP"}]));
    assert!(w.allows(&[tcp], "192.0.2.1", &[], 4242));
    let udp = ingress_ports(json!([{"protocol": "UDP"}]));
    assert!(!w.allows(&[udp], "192.0.2.1", &[], 4242));
}

#[test]
fn only_tcp_rules_allow_a_tcp_connection() {
    let w = world();
    for proto in ["UDP", "SCTP", "tcp"] {
        let p = ingress_ports(json!([{"port": 80, "protocol": proto}]));
        assert!(!w.allows(&[p], "192.0.2.1", &[], 80), "{proto}");
    }
    let defaulted = ingress_ports(json!([{"port": 80}]));
    assert!(w.allows(&[defaulted], "192.0.2.1", &[], 80));
    let both =
        ingress_ports(json!([{"port": 80, "protocol": "UDP"}, {"port": 80, "protocol": "TCP"}]));
    assert!(w.allows(&[both], "192.0.2.1", &[], 80));
}

#[test]
fn named_ports_resolve_against_the_targets_declared_ports() {
    let w = world();
    let http = ingress_ports(json!([{"port": "http"}]));
    assert!(w.allows(one(&http), "192.0.2.1", &[], 8080));
    assert!(
        !w.allows(one(&http), "192.0.2.1", &[], 9090),
        "metrics is another name"
    );
    assert!(!w.allows(&[http], "192.0.2.1", &[], 80));
    // Declared for UDP: no TCP port of that name.
    let dns = ingress_ports(json!([{"port": "dns"}]));
    assert!(!w.allows(one(&dns), "192.0.2.1", &[], 53));
    let dns_udp = ingress_ports(json!([{"port": "dns", "protocol": "UDP"}]));
    assert!(!w.allows(&[dns_udp], "192.0.2.1", &[], 53));
    let unknown = ingress_ports(json!([{"port": "grpc"}]));
    assert!(!w.allows(&[unknown], "192.0.2.1", &[], 8080));
    // Another Pod declaring no ports: the name resolves to nothing.
    let bare = Target {
        namespace: "shop",
        labels: &w.target_labels,
        ports: &[],
    };
    let src = Source {
        ip: ip("192.0.2.1"),
        pods: &[],
    };
    let v = evaluate(
        &[ingress_ports(json!([{"port": "http"}]))],
        &bare,
        &src,
        8080,
    );
    assert!(!v.allowed);
}

#[test]
fn source_and_port_must_both_match_in_one_rule() {
    let w = world();
    let p = policy(
        "shop",
        "p",
        json!({"podSelector": {}, "ingress": [
            {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 80}]},
            {"from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}], "ports": [{"port": 443}]},
        ]}),
    );
    assert!(w.allows(one(&p), "10.1.1.1", &[], 80));
    assert!(w.allows(one(&p), "192.0.2.1", &[], 443));
    assert!(!w.allows(one(&p), "10.1.1.1", &[], 443));
    assert!(!w.allows(&[p], "192.0.2.1", &[], 80));
}

#[test]
fn compile_reports_what_the_apiserver_would_refuse_and_it_matches_nothing() {
    let w = world();
    let p = policy(
        "shop",
        "bad",
        json!({"podSelector": {}, "ingress": [
            {"from": [
                {"ipBlock": {"cidr": "10.0.0.0/33"}},
                {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["nope"]}},
                {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}},
                {},
                {"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
                {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Is", "values": ["b"]}]}},
            ]},
            {"ports": [
                {"endPort": 90},
                {"port": 90, "endPort": 80},
                {"port": "http", "endPort": 9000},
                {"port": 0},
                {"port": 70000},
                {"port": 80, "endPort": 70000},
            ]},
        ]}),
    );
    let (_, problems) = Policy::compile(&p);
    assert_eq!(
        problems,
        vec![
            "ingress[0].from[0]: ipBlock \"10.0.0.0/33\": prefix length out of range",
            "ingress[0].from[1]: ipBlock \"nope\": not a CIDR block",
            "ingress[0].from[2]: ipBlock with a selector",
            "ingress[0].from[3]: no ipBlock, namespaceSelector or podSelector",
            "ingress[0].from[4]: podSelector: In \"a\" without values",
            "ingress[0].from[5]: namespaceSelector: unknown operator \"Is\" on \"a\"",
            "ingress[1].ports[0]: endPort without port",
            "ingress[1].ports[1]: port range 90-80",
            "ingress[1].ports[2]: endPort with a named port",
            "ingress[1].ports[3]: port range 0-0",
            "ingress[1].ports[4]: port range 70000-70000",
            "ingress[1].ports[5]: port range 80-70000",
        ]
    );
    let any = labels(&[]);
    let every = [w.pod("shop", &any), w.pod("other", &any)];
    for port in [80, 85, 90, 8080] {
        assert!(!w.allows(one(&p), "10.0.0.1", &every, port), "port {port}");
    }
}

#[test]
fn an_invalid_pod_selector_selects_nothing() {
    let w = world();
    let p = policy(
        "shop",
        "bad",
        json!({"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}}),
    );
    let (compiled, problems) = Policy::compile(&p);
    assert_eq!(problems, vec!["podSelector: Exists \"app\" with values"]);
    assert!(!compiled.selects(&w.target()));
    assert!(w.allows(&[p], "192.0.2.1", &[], 80));
}

#[test]
fn a_valid_policy_compiles_without_problems() {
    let p = policy(
        "shop",
        "ok",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{
            "from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}},
                     {"namespaceSelector": {}, "podSelector": {}}],
            "ports": [{"port": "http"}, {"port": 1, "endPort": 65535}, {"protocol": "UDP"}],
        }]}),
    );
    let (compiled, problems) = Policy::compile(&p);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(
        (compiled.namespace.as_str(), compiled.name.as_str()),
        ("shop", "ok")
    );
}

#[test]
fn pod_peers_are_what_the_ingress_rules_select_by_label() {
    let p = policy(
        "shop",
        "p",
        json!({"podSelector": {}, "ingress": [
            {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}},
                      {"podSelector": {"matchLabels": {"a": "1"}}}]},
            {},
            {"from": [{"namespaceSelector": {"matchLabels": {"t": "x"}}}, {}]},
        ]}),
    );
    let (compiled, _) = Policy::compile(&p);
    let peers: Vec<String> = compiled
        .pod_peers()
        .map(|(ns, pods)| match ns {
            Namespaces::Own(n) => format!("own {n}: {pods}"),
            Namespaces::Selected(s) => format!("ns {s}: {pods}"),
        })
        .collect();
    assert_eq!(peers, vec!["own shop: a=1", "ns t=x: "]);
    let egress_only = policy(
        "shop",
        "e",
        json!({"policyTypes": ["Egress"], "ingress": [{"from": [{"podSelector": {}}]}]}),
    );
    assert_eq!(Policy::compile(&egress_only).0.pod_peers().count(), 0);
}

#[test]
fn selects_pod_looks_at_namespace_labels_and_policy_types() {
    let web = labels(&[("app", "web")]);
    let db = labels(&[("app", "db")]);
    let p = policy(
        "shop",
        "p",
        json!({"podSelector": {"matchLabels": {"app": "web"}}}),
    );
    let (c, _) = Policy::compile(&p);
    assert!(c.selects_pod("shop", &web));
    assert!(!c.selects_pod("shop", &db));
    assert!(!c.selects_pod("other", &web));
    let e = policy(
        "shop",
        "e",
        json!({"podSelector": {}, "policyTypes": ["Egress"]}),
    );
    assert!(!Policy::compile(&e).0.selects_pod("shop", &web));
}
