use super::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};

use crate::netpol::watches::WatchedPod;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn enforcer() -> Arc<NetworkPolicies> {
    NetworkPolicies::new(Arc::new(|| {
        vec![("shop".into(), labels(&[("app", "web")]))]
    }))
}

fn listed(e: &NetworkPolicies, policies: &[Value]) {
    let mut buffer = None;
    e.policies.apply(Event::Init, &mut buffer);
    for p in policies {
        let np: NetworkPolicy = serde_json::from_value(p.clone()).unwrap();
        e.policies.apply(Event::InitApply(np), &mut buffer);
    }
    e.policies.apply(Event::InitDone, &mut buffer);
}

fn namespace(e: &NetworkPolicies, name: &str, pairs: &[(&str, &str)]) {
    e.namespaces
        .apply(Event::Apply((name.into(), labels(pairs))), &mut None);
}

/// A peer watch holding `pods` (no task behind it: an idle one).
fn peer_slot(e: &NetworkPolicies, key: &str, pods: &[Value]) {
    let slot = Arc::new(PeerSlot::default());
    for p in pods {
        let p: WatchedPod = serde_json::from_value(p.clone()).unwrap();
        slot.apply(Event::Apply(p), &mut None);
    }
    let task = tokio::spawn(std::future::pending::<()>()).abort_handle();
    let key = PeerWatch::Namespace {
        namespace: key.into(),
        pods: Default::default(),
    };
    lock(&e.peers).insert(key, Running { slot, task });
}

fn peer(uid: &str, ns: &str, role: &str, ip: &str) -> Value {
    json!({"metadata": {"uid": uid, "namespace": ns, "labels": {"role": role}},
           "status": {"phase": "Running", "podIPs": [{"ip": ip}]}})
}

fn target() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": "shop", "name": "web", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
    }))
    .unwrap()
}

fn from_clients(ns_selector: Value) -> Value {
    json!({"metadata": {"namespace": "shop", "name": "clients"},
    "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{
        "from": [{"namespaceSelector": ns_selector, "podSelector": {"matchLabels": {"role": "client"}}}],
        "ports": [{"port": "http"}],
    }]}})
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[tokio::test]
async fn nothing_is_allowed_before_the_policies_are_listed() {
    let e = enforcer();
    assert_eq!(e.policies_known(), None);
    let v = e.verdict(&target(), ip("10.0.0.1"), 8080);
    assert_eq!(
        v,
        Verdict {
            allowed: false,
            why: "NetworkPolicies not listed yet".into()
        }
    );
    listed(&e, &[]);
    assert_eq!(e.policies_known(), Some(0));
    let v = e.verdict(&target(), ip("10.0.0.1"), 8080);
    assert!(v.allowed, "{v:?}");
    assert_eq!(v.why, "no NetworkPolicy selects the Pod");
}

#[tokio::test]
async fn a_known_pod_at_the_address_is_matched_with_its_namespace_labels() {
    let e = enforcer();
    listed(
        &e,
        &[from_clients(json!({"matchLabels": {"team": "blue"}}))],
    );
    namespace(&e, "front", &[("team", "blue")]);
    peer_slot(&e, "front", &[peer("c1", "front", "client", "10.0.0.7")]);
    let v = e.verdict(&target(), ip("10.0.0.7"), 8080);
    assert_eq!(v.why, "allowed by NetworkPolicy shop/clients ingress[0]");
    assert!(v.allowed);
    // The named port resolves against the target's declared ports only.
    assert!(!e.verdict(&target(), ip("10.0.0.7"), 8081).allowed);
    // An address no watched Pod has is no client.
    assert!(!e.verdict(&target(), ip("10.0.0.8"), 8080).allowed);
    namespace(&e, "front", &[("team", "red")]);
    assert!(!e.verdict(&target(), ip("10.0.0.7"), 8080).allowed);
    let lean: crate::pods::pod::Pod = serde_json::from_value(json!({
        "metadata": {"namespace": "shop", "name": "web", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
    }))
    .unwrap();
    namespace(&e, "front", &[("team", "blue")]);
    assert!(
        e.verdict(&lean, ip("10.0.0.7"), 8080).allowed,
        "the cached Pod type"
    );
}

#[tokio::test]
async fn a_namespace_not_seen_yet_has_its_name_label() {
    let e = enforcer();
    let by_name = json!({"matchLabels": {NAMESPACE_NAME_LABEL: "front"}});
    listed(&e, &[from_clients(by_name)]);
    peer_slot(&e, "front", &[peer("c1", "front", "client", "10.0.0.7")]);
    assert!(e.verdict(&target(), ip("10.0.0.7"), 8080).allowed);
}

#[tokio::test]
async fn pods_seen_by_several_watches_count_once_and_any_may_allow() {
    let e = enforcer();
    listed(&e, &[from_clients(json!({}))]);
    let client = peer("c1", "front", "client", "10.0.0.7");
    let other = peer("o1", "front", "other", "10.0.0.7");
    peer_slot(&e, "a", &[client.clone(), other.clone()]);
    peer_slot(&e, "b", &[client]);
    let pods = e.pods_at(ip("10.0.0.7"));
    let mut uids: Vec<&str> = pods.iter().map(|p| p.uid.as_str()).collect();
    uids.sort();
    assert_eq!(uids, vec!["c1", "o1"]);
    assert!(e.verdict(&target(), ip("10.0.0.7"), 8080).allowed);
    assert!(e.verdict(&target(), ip("::ffff:10.0.0.7"), 8080).allowed);
    let watches = e.peer_watches();
    assert_eq!(
        watches,
        vec![
            ("Pods in a".to_string(), 2, false),
            ("Pods in b".to_string(), 1, false)
        ]
    );
}

#[tokio::test]
async fn the_wanted_watches_follow_the_policies_selecting_local_pods() {
    let e = enforcer();
    let elsewhere = json!({"metadata": {"namespace": "other", "name": "p"},
        "spec": {"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"x": "y"}}}]}]}});
    listed(
        &e,
        &[
            from_clients(json!({"matchLabels": {"team": "blue"}})),
            elsewhere,
        ],
    );
    namespace(&e, "front", &[("team", "blue")]);
    namespace(&e, "back", &[("team", "red")]);
    let local = vec![("shop".to_string(), labels(&[("app", "web")]))];
    let wanted: Vec<String> = e.wanted(&local).iter().map(|w| w.to_string()).collect();
    assert_eq!(wanted, vec!["Pods in front with role=client"]);
    let db = vec![("shop".to_string(), labels(&[("app", "db")]))];
    assert!(e.wanted(&db).is_empty());
}
