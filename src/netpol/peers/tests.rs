use super::*;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn policy(ns: &str, spec: Value) -> Policy {
    let np: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": "p"}, "spec": spec,
    }))
    .unwrap();
    Policy::compile(&np).0
}

fn from(ns: &str, selector: Value, from: Value) -> Policy {
    policy(
        ns,
        json!({"podSelector": selector, "ingress": [{"from": from}]}),
    )
}

fn namespaces(list: &[(&str, &[(&str, &str)])]) -> BTreeMap<String, Arc<Labels>> {
    list.iter()
        .map(|(n, l)| (n.to_string(), Arc::new(labels(l))))
        .collect()
}

fn sel(pairs: &[(&str, &str)]) -> Selector {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    Selector::compile(&LabelSelector {
        match_labels: Some(labels(pairs)),
        match_expressions: None,
    })
    .unwrap()
}

fn shown(w: &BTreeSet<PeerWatch>) -> Vec<String> {
    w.iter().map(|w| w.to_string()).collect()
}

fn local() -> Vec<(String, Labels)> {
    vec![("shop".into(), labels(&[("app", "sandbox")]))]
}

#[test]
fn only_policies_selecting_a_pod_here_need_watches() {
    let ns = namespaces(&[("shop", &[]), ("other", &[])]);
    let here = from(
        "shop",
        json!({}),
        json!([{"podSelector": {"matchLabels": {"r": "a"}}}]),
    );
    let elsewhere = from(
        "other",
        json!({}),
        json!([{"podSelector": {"matchLabels": {"r": "b"}}}]),
    );
    let unselected = from(
        "shop",
        json!({"matchLabels": {"app": "db"}}),
        json!([{"podSelector": {"matchLabels": {"r": "c"}}}]),
    );
    let egress = policy(
        "shop",
        json!({"policyTypes": ["Egress"], "ingress": [{"from": [{"podSelector": {"matchLabels": {"r": "d"}}}]}]}),
    );
    let w = desired([&here, &elsewhere, &unselected, &egress], &local(), &ns);
    assert_eq!(shown(&w), vec!["Pods in shop with r=a"]);
    assert!(desired([&here], &[], &ns).is_empty(), "no Pod here");
}

#[test]
fn ip_blocks_and_open_rules_need_no_watch() {
    let ns = namespaces(&[("shop", &[])]);
    let p = policy(
        "shop",
        json!({"podSelector": {}, "ingress": [{}, {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]}),
    );
    assert!(desired([&p], &local(), &ns).is_empty());
}

#[test]
fn a_namespace_selector_watches_the_namespaces_it_matches() {
    let ns = namespaces(&[
        ("a", &[("team", "x")]),
        ("b", &[("team", "x")]),
        ("c", &[("team", "y")]),
    ]);
    let p = from(
        "shop",
        json!({}),
        json!([{"namespaceSelector": {"matchLabels": {"team": "x"}},
                "podSelector": {"matchLabels": {"app": "router"}}},
               {"namespaceSelector": {"matchLabels": {"team": "y"}}}]),
    );
    assert_eq!(
        shown(&desired([&p], &local(), &ns)),
        vec![
            "Pods in a with app=router",
            "Pods in b with app=router",
            "Pods in c"
        ]
    );
    let none = from(
        "shop",
        json!({}),
        json!([{"namespaceSelector": {"matchLabels": {"team": "z"}}}]),
    );
    assert!(desired([&none], &local(), &ns).is_empty());
}

#[test]
fn every_namespace_or_too_many_is_one_cluster_wide_watch() {
    let many: Vec<(String, Vec<(&str, &str)>)> = (0..=MAX_NAMESPACED_WATCHES)
        .map(|i| (format!("n{i}"), vec![("team", "x")]))
        .collect();
    let list: Vec<(&str, &[(&str, &str)])> = many
        .iter()
        .map(|(n, l)| (n.as_str(), l.as_slice()))
        .collect();
    let ns = namespaces(&list);
    let every = from(
        "shop",
        json!({}),
        json!([{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "router"}}}]),
    );
    assert_eq!(
        shown(&desired([&every], &local(), &ns)),
        vec!["Pods in every namespace with app=router"]
    );
    let too_many = from(
        "shop",
        json!({}),
        json!([{"namespaceSelector": {"matchLabels": {"team": "x"}}}]),
    );
    assert_eq!(
        shown(&desired([&too_many], &local(), &ns)),
        vec!["Pods in every namespace"]
    );
    // At the limit: one watch per namespace still.
    let at_limit = namespaces(&list[..MAX_NAMESPACED_WATCHES]);
    assert_eq!(
        desired([&too_many], &local(), &at_limit).len(),
        MAX_NAMESPACED_WATCHES
    );
}

#[test]
fn a_covered_watch_is_left_out() {
    let ns = namespaces(&[("shop", &[("t", "1")]), ("b", &[("t", "1")])]);
    let p = from(
        "shop",
        json!({}),
        json!([
            {"podSelector": {"matchLabels": {"r": "a"}}},
            {"podSelector": {}},
            {"namespaceSelector": {"matchLabels": {"t": "1"}}, "podSelector": {"matchLabels": {"r": "a"}}},
            {"namespaceSelector": {}, "podSelector": {"matchLabels": {"r": "b"}}},
        ]),
    );
    assert_eq!(
        shown(&desired([&p], &local(), &ns)),
        vec![
            "Pods in b with r=a",
            "Pods in shop",
            "Pods in every namespace with r=b"
        ]
    );
    let everything = from("shop", json!({}), json!([{"namespaceSelector": {}}]));
    assert_eq!(
        shown(&desired([&p, &everything], &local(), &ns)),
        vec!["Pods in every namespace"]
    );
}

#[test]
fn coverage_is_by_place_and_selector() {
    let ns_w = |n: &str, s: Selector| PeerWatch::Namespace {
        namespace: n.into(),
        pods: s,
    };
    let cl = |s: Selector| PeerWatch::Cluster { pods: s };
    let (a, b, all) = (sel(&[("r", "a")]), sel(&[("r", "b")]), Selector::default());
    assert!(cl(all.clone()).covers(&cl(a.clone())));
    assert!(cl(all.clone()).covers(&ns_w("x", a.clone())));
    assert!(cl(a.clone()).covers(&ns_w("x", a.clone())));
    assert!(cl(a.clone()).covers(&cl(a.clone())));
    assert!(!cl(a.clone()).covers(&cl(b.clone())));
    assert!(!cl(a.clone()).covers(&cl(all.clone())));
    assert!(!cl(a.clone()).covers(&ns_w("x", b.clone())));
    assert!(!cl(a.clone()).covers(&ns_w("x", all.clone())));
    assert!(!ns_w("x", all.clone()).covers(&cl(a.clone())));
    assert!(ns_w("x", all.clone()).covers(&ns_w("x", a.clone())));
    assert!(ns_w("x", a.clone()).covers(&ns_w("x", a.clone())));
    assert!(!ns_w("x", all.clone()).covers(&ns_w("y", a.clone())));
    assert!(!ns_w("x", a.clone()).covers(&ns_w("x", b.clone())));
    assert!(!ns_w("x", a.clone()).covers(&ns_w("x", all)));
}

fn pod(uid: &str, ns: &str, ips: &[&str]) -> PeerPod {
    PeerPod {
        uid: uid.into(),
        namespace: ns.into(),
        labels: labels(&[("uid", uid)]),
        ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
    }
}

fn uids(index: &PeerIndex, ip: &str) -> Vec<String> {
    let mut u: Vec<String> = index
        .at(ip.parse().unwrap())
        .iter()
        .map(|p| p.uid.clone())
        .collect();
    u.sort();
    u
}

#[test]
fn the_index_finds_pods_by_each_of_their_addresses() {
    let mut index = PeerIndex::default();
    assert!(index.is_empty());
    index.upsert(pod("a", "x", &["10.0.0.1", "fd00::1"]));
    index.upsert(pod("b", "y", &["10.0.0.1"]));
    index.upsert(pod("c", "y", &["10.0.0.3"]));
    assert_eq!(index.len(), 3);
    assert!(!index.is_empty());
    assert_eq!(uids(&index, "10.0.0.1"), vec!["a", "b"]);
    assert_eq!(uids(&index, "::ffff:10.0.0.1"), vec!["a", "b"]);
    assert_eq!(uids(&index, "fd00::1"), vec!["a"]);
    assert_eq!(uids(&index, "10.0.0.3"), vec!["c"]);
    assert!(uids(&index, "10.0.0.2").is_empty());
}

#[test]
fn an_update_moves_a_pod_and_a_removal_forgets_it() {
    let mut index = PeerIndex::default();
    index.upsert(pod("a", "x", &["10.0.0.1"]));
    index.upsert(pod("b", "x", &["10.0.0.1"]));
    index.upsert(pod("a", "x", &["10.0.0.2"]));
    assert_eq!(uids(&index, "10.0.0.1"), vec!["b"]);
    assert_eq!(uids(&index, "10.0.0.2"), vec!["a"]);
    assert_eq!(index.len(), 2);
    index.remove("b");
    assert!(uids(&index, "10.0.0.1").is_empty());
    assert_eq!(index.len(), 1);
    index.remove("b");
    index.remove("nobody");
    assert_eq!(index.len(), 1);
    // Without an address (finished, or not started): not indexed.
    index.upsert(pod("a", "x", &[]));
    assert!(uids(&index, "10.0.0.2").is_empty());
    assert!(index.is_empty());
}

#[test]
fn the_watch_names_its_place_and_selector() {
    let w = PeerWatch::Namespace {
        namespace: "x".into(),
        pods: sel(&[("a", "1")]),
    };
    assert_eq!(w.to_string(), "Pods in x with a=1");
    let c = PeerWatch::Cluster {
        pods: Selector::default(),
    };
    assert_eq!(c.to_string(), "Pods in every namespace");
}
