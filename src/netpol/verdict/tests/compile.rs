//! Compiling policies (what the apiserver would refuse matches nothing) and which Pods a policy's rules select.

use super::*;

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
