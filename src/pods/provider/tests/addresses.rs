//! Pod addresses of their own (`--pod-cidr`, src/pods/provider/addresses.rs):
//! each claim gets one of the range, kept in its row and in its Running
//! status; a provider over rows that hold addresses (a restart) never
//! gives them again; a released one cools down from its release.

use super::*;
use crate::podnet::range::PodRange;

fn named(uid: &str, name: &str) -> Arc<Pod> {
    let mut p = pod(uid);
    p.metadata.name = Some(name.into());
    Arc::new(p)
}

/// A watch cache with no Pod in it.
fn no_pods() -> kube::runtime::reflector::Store<Pod> {
    kube::runtime::reflector::store::<Pod>().0
}

fn address_of(provider: &Provider, key: &str) -> Option<std::net::Ipv4Addr> {
    provider
        .claims
        .get(key)
        .and_then(|(c, _)| c.lifecycle.pod_ip)
}

#[tokio::test]
async fn claims_get_addresses_of_their_own_and_a_restart_keeps_them_apart() {
    let (_sim, provider, _dir) = provider_with_token().await;
    assert_eq!(provider.pod_range(), None, "owner_addr mode");
    assert_eq!(provider.next_pod_ip("ns/x"), None, "owner_addr mode");
    let range = PodRange::parse("10.250.9.0/29").expect("range");
    let (claims, sandboxd) = (Arc::clone(&provider.claims), provider.sandboxd.clone());
    let provider = provider.with_pod_range(range, no_pods());
    assert_eq!(provider.pod_range(), Some(range));

    let created = provider.create(&named("u1", "a")).await.expect("create a");
    let a = address_of(&provider, "ns/a").expect("a's address");
    assert!(range.contains(a), "{a}");
    let Created::Claimed { status, .. } = created else {
        panic!("expected a claim, got {created:?}");
    };
    assert_eq!(status["status"]["podIP"], a.to_string(), "{status}");

    // The same rows under a new provider (a restart): a's address is held.
    let restarted =
        Provider::new(silent_client(), sandboxd, claims).with_pod_range(range, no_pods());
    restarted.create(&named("u2", "b")).await.expect("create b");
    let b = address_of(&restarted, "ns/b").expect("b's address");
    assert_ne!(a, b, "a restart gave a held address again");
    assert!(range.contains(b), "{b}");

    // a's row goes (released): its address starts cooling at once.
    let id = restarted.claims.get("ns/a").expect("a's row").0.id;
    assert!(restarted.claims.remove("ns/a", &id).await.expect("remove"));
    restarted.observe_pod_ips();
    assert_eq!(restarted.cooling_pod_ips(), vec![a]);
}

/// An address a Pod here still shows is not given to another claim, also
/// when no row holds it (its claim released just before a restart, which
/// forgot the cool-down, and the Pod's delete not finished); once no Pod
/// shows it, it cools down. Reliability scenario 12 saw two Pods show one
/// address at once without this.
#[tokio::test]
async fn an_address_a_pod_here_still_shows_is_not_given_again() {
    use kube::runtime::watcher::Event;
    let (_sim, provider, _dir) = provider_with_token().await;
    let range = PodRange::parse("10.250.9.0/29").expect("range");
    let (store, mut cache) = kube::runtime::reflector::store::<Pod>();
    let provider = provider.with_pod_range(range, store);
    // What the round-robin of a fresh provider gives first.
    let first = range.first();
    let mut leaving = (*named("u0", "old")).clone();
    leaving.status = Some(crate::pods::pod::PodStatus {
        pod_ip: Some(first.to_string()),
        ..Default::default()
    });
    cache.apply_watcher_event(&Event::Apply(leaving.clone()));
    provider.create(&named("u1", "a")).await.expect("create a");
    let a = address_of(&provider, "ns/a").expect("a's address");
    assert_ne!(a, first, "the address a Pod here shows was given to a");
    assert!(range.contains(a), "{a}");
    cache.apply_watcher_event(&Event::Delete(leaving));
    provider.observe_pod_ips();
    assert_eq!(
        provider.cooling_pod_ips(),
        vec![first],
        "no Pod shows it any more: it cools down"
    );
}

/// The listeners are woken before a Running status is built, so the
/// address listens before a client can read it.
#[tokio::test]
async fn a_running_status_wakes_the_listeners_first() {
    use crate::podnet::listeners::Endpoints;
    let (_sim, provider, _dir) = provider_with_token().await;
    let range = PodRange::parse("10.250.9.0/29").expect("range");
    let provider = provider.with_pod_range(range, no_pods());
    let changed = provider.changed().expect("the listeners' wake-up");
    provider.create(&named("u1", "a")).await.expect("create a");
    tokio::time::timeout(std::time::Duration::from_secs(1), changed.notified())
        .await
        .expect("the listeners were not woken");
}

/// A tracked Pod on a settled claim wants a listener on its address for
/// each declared TCP port; a Pod being deleted wants none.
#[tokio::test]
async fn each_declared_port_of_a_running_pod_wants_a_listener() {
    use crate::podnet::listeners::Endpoints;
    let (_sim, provider, _dir) = provider_with_token().await;
    let range = PodRange::parse("10.250.9.0/29").expect("range");
    let provider = provider.with_pod_range(range, no_pods());
    let mut p = (*named("u1", "a")).clone();
    if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.ports = serde_json::from_value(json!([{"containerPort": 8080}, {"containerPort": 9090}]))
            .expect("ports");
    }
    let p = Arc::new(p);
    provider.create(&p).await.expect("create a");
    let a = address_of(&provider, "ns/a").expect("a's address");
    let id = provider.claims.get("ns/a").expect("row").0.id;
    let got: Vec<String> = provider
        .wanted()
        .iter()
        .map(|w| format!("{} {} {}", w.addr, w.key, w.id))
        .collect();
    assert_eq!(
        got,
        [format!("{a}:8080 ns/a {id}"), format!("{a}:9090 ns/a {id}")]
    );
    let mut going = (*p).clone();
    going.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::now(),
    ));
    provider.track(&Arc::new(going));
    assert!(
        provider.wanted().is_empty(),
        "a Pod being deleted listens nowhere"
    );
}
