use super::*;
use serde_json::json;

fn np(ns: &str, name: &str, port: i32) -> NetworkPolicy {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name},
        "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": port}]}]},
    }))
    .unwrap()
}

fn names(store: &PolicyStore, ns: &str) -> Vec<String> {
    store
        .in_namespace(ns)
        .iter()
        .map(|p| p.name.clone())
        .collect()
}

#[test]
fn the_policy_store_is_empty_and_unlisted_until_the_first_list_ends() {
    let store = PolicyStore::default();
    let mut buffer = None;
    assert!(!store.listed());
    assert!(!store.apply(Event::Init, &mut buffer));
    assert!(!store.apply(Event::InitApply(np("a", "p", 80)), &mut buffer));
    assert!(!store.listed());
    assert!(store.is_empty(), "buffered, not yet in force");
    assert!(store.apply(Event::InitDone, &mut buffer));
    assert!(store.listed());
    assert_eq!(names(&store, "a"), vec!["p"]);
    assert_eq!(store.len(), 1);
}

#[test]
fn a_relist_replaces_the_policies_whole() {
    let store = PolicyStore::default();
    let mut buffer = None;
    for e in [
        Event::Init,
        Event::InitApply(np("a", "p", 80)),
        Event::InitApply(np("a", "q", 80)),
        Event::InitApply(np("b", "r", 80)),
        Event::InitDone,
    ] {
        store.apply(e, &mut buffer);
    }
    assert_eq!(names(&store, "a"), vec!["p", "q"]);
    store.apply(Event::Init, &mut buffer);
    store.apply(Event::InitApply(np("a", "q", 80)), &mut buffer);
    assert_eq!(store.len(), 3, "the old list serves during the relist");
    assert!(store.apply(Event::InitDone, &mut buffer));
    assert_eq!(names(&store, "a"), vec!["q"]);
    assert!(names(&store, "b").is_empty());
    assert_eq!(store.len(), 1);
}

#[test]
fn policy_events_report_whether_anything_changed() {
    let store = PolicyStore::default();
    let mut buffer = None;
    assert!(store.apply(Event::Apply(np("a", "p", 80)), &mut buffer));
    assert!(
        !store.apply(Event::Apply(np("a", "p", 80)), &mut buffer),
        "same spec"
    );
    assert!(store.apply(Event::Apply(np("a", "p", 81)), &mut buffer));
    assert!(store.apply(Event::Apply(np("a", "q", 81)), &mut buffer));
    assert_eq!(store.len(), 2);
    assert!(store.apply(Event::Delete(np("a", "p", 81)), &mut buffer));
    assert!(!store.apply(Event::Delete(np("a", "p", 81)), &mut buffer));
    assert!(!store.apply(Event::Delete(np("z", "p", 81)), &mut buffer));
    assert!(store.apply(Event::Delete(np("a", "q", 81)), &mut buffer));
    assert!(store.is_empty());
    assert!(store.in_namespace("a").is_empty());
}

fn ns(name: &str, pairs: &[(&str, &str)]) -> (String, Labels) {
    (
        name.to_string(),
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

#[test]
fn the_namespace_store_follows_labels() {
    let store = NamespaceStore::default();
    let mut buffer = None;
    assert!(!store.apply(Event::Init, &mut buffer));
    assert!(!store.apply(Event::InitApply(ns("a", &[("t", "1")])), &mut buffer));
    assert!(store.labels("a").is_none());
    assert!(store.apply(Event::InitDone, &mut buffer));
    assert_eq!(store.labels("a").unwrap().get("t").unwrap(), "1");
    assert!(!store.apply(Event::Apply(ns("a", &[("t", "1")])), &mut buffer));
    assert!(store.apply(Event::Apply(ns("a", &[("t", "2")])), &mut buffer));
    assert!(store.apply(Event::Apply(ns("b", &[])), &mut buffer));
    assert_eq!(store.snapshot().len(), 2);
    assert!(store.apply(Event::Delete(ns("a", &[])), &mut buffer));
    assert!(!store.apply(Event::Delete(ns("a", &[])), &mut buffer));
    assert!(store.labels("a").is_none());
    store.apply(Event::Init, &mut buffer);
    store.apply(Event::InitDone, &mut buffer);
    assert!(store.snapshot().is_empty(), "a relist replaces");
}

fn pod(value: serde_json::Value) -> WatchedPod {
    serde_json::from_value(value).unwrap()
}

fn running(uid: &str, ip: &str) -> WatchedPod {
    pod(json!({
        "metadata": {"name": uid, "namespace": "n", "uid": uid, "labels": {"r": "x"}},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    }))
}

#[test]
fn a_peer_slot_indexes_its_pods_after_their_list() {
    let slot = PeerSlot::default();
    let mut buffer = None;
    let ip: IpAddr = "10.0.0.1".parse().unwrap();
    slot.apply(Event::Init, &mut buffer);
    slot.apply(Event::InitApply(running("a", "10.0.0.1")), &mut buffer);
    assert!(!slot.listed());
    assert!(slot.at(ip).is_empty());
    slot.apply(Event::InitDone, &mut buffer);
    assert!(slot.listed());
    assert_eq!(slot.at(ip)[0].uid, "a");
    slot.apply(Event::Apply(running("b", "10.0.0.1")), &mut buffer);
    assert_eq!(slot.len(), 2);
    slot.apply(Event::Delete(running("a", "10.0.0.1")), &mut buffer);
    assert_eq!(slot.at(ip).len(), 1);
    slot.apply(Event::Apply(running("b", "10.0.0.2")), &mut buffer);
    assert!(slot.at(ip).is_empty());
    assert!(!slot.is_empty());
    slot.apply(Event::Init, &mut buffer);
    slot.apply(Event::InitDone, &mut buffer);
    assert!(slot.is_empty(), "a relist replaces");
}

#[test]
fn a_watched_pod_keeps_identity_labels_and_addresses_only() {
    let p = pod(json!({
        "metadata": {"name": "p", "namespace": "n", "uid": "u", "resourceVersion": "7",
                     "labels": {"app": "router"}, "annotations": {"big": "x"},
                     "managedFields": [{"manager": "kubectl"}]},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.1",
                   "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}, {"ip": "::ffff:10.0.0.1"}]},
    }));
    assert_eq!(p.metadata.resource_version.as_deref(), Some("7"));
    assert!(p.metadata.annotations.is_none() && p.metadata.managed_fields.is_none());
    let peer = p.peer();
    assert_eq!(peer.uid, "u");
    assert_eq!(peer.namespace, "n");
    assert_eq!(peer.labels.get("app").map(String::as_str), Some("router"));
    let ips: Vec<String> = peer.ips.iter().map(|i| i.to_string()).collect();
    assert_eq!(ips, vec!["10.0.0.1", "fd00::1"], "each once");
}

#[test]
fn a_pod_without_pod_ips_falls_back_to_pod_ip_and_a_finished_one_has_none() {
    let only_ip = pod(json!({"metadata": {"uid": "u"}, "status": {"podIP": "10.0.0.9"}}));
    assert_eq!(
        only_ip.peer().ips,
        vec!["10.0.0.9".parse::<IpAddr>().unwrap()]
    );
    let pending = pod(json!({"metadata": {"uid": "u"}, "status": {"phase": "Pending"}}));
    assert!(pending.peer().ips.is_empty());
    let no_status = pod(json!({"metadata": {"uid": "u"}}));
    assert!(no_status.peer().ips.is_empty());
    let garbage = pod(json!({"metadata": {"uid": "u"}, "status": {"podIPs": [{"ip": "nope"}]}}));
    assert!(garbage.peer().ips.is_empty());
    for phase in ["Succeeded", "Failed"] {
        let done = pod(json!({"metadata": {"uid": "u"},
                              "status": {"phase": phase, "podIPs": [{"ip": "10.0.0.9"}]}}));
        assert!(done.peer().ips.is_empty(), "{phase}");
    }
}

#[tokio::test]
async fn changes_wake_the_waiter_and_count() {
    let changes = Changes::default();
    assert_eq!(changes.generation(), 0);
    changes.bump();
    assert_eq!(changes.generation(), 1);
    // The permit is kept for a waiter that comes later.
    tokio::time::timeout(std::time::Duration::from_secs(1), changes.wait())
        .await
        .expect("woken");
}
