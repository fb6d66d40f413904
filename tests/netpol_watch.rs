//! The NetworkPolicy watches on the local control plane, as the
//! ServiceAccount of manifests/rbac.yaml (so its new grants are proven
//! sufficient, and the audit-log check sees them used): a policy change, a
//! namespace relabel and a peer Pod's label and address changes each flip
//! the relay's verdict within 5 s, and only the Pods the policy's peers
//! select are watched.
//!
//! The peer Pod is never run: it names a scheduler nobody runs, and its
//! address is written into its status as a kubelet would.

mod support;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use vk_sandbox::netpol::NetworkPolicies;
use vk_sandbox::netpol::selector::Labels;

const FLIP_LIMIT: Duration = Duration::from_secs(5);

/// How long since `start` (before the change was sent) until the verdict
/// on `source` to `port` is `allowed` (for an allowed one, by a policy's
/// rule, but for the policy-less steps); fails past `limit`.
async fn flips(
    np: &NetworkPolicies,
    target: &Pod,
    (source, port): (IpAddr, u16),
    allowed: bool,
    what: &str,
    limit: Duration,
    start: Instant,
) -> Duration {
    let unselected = what == "policies listed" || what == "policy deleted";
    loop {
        let v = np.verdict(target, source, port);
        let by_rule = v.why.starts_with("allowed by");
        if v.allowed == allowed && (!allowed || by_rule != unselected) {
            let took = start.elapsed();
            eprintln!(
                "netpol watch: {what}: {} after {took:?} ({})",
                v.allowed, v.why
            );
            return took;
        }
        if start.elapsed() > limit {
            panic!(
                "{what}: the verdict on {source}:{port} is still {} after {limit:?} ({}); \
                 peer watches {:?}",
                v.allowed,
                v.why,
                np.peer_watches()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_namespace_and_peer_changes_flip_the_verdict_within_seconds() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let admin = cluster.client.clone();
    let scratch = tempfile::tempdir().unwrap();
    let sa = support::rbac::service_account_kubeconfig(
        &admin,
        &cluster.kubeconfig,
        &scratch.path().join("sa.kubeconfig"),
    )
    .await
    .expect("the vk-sandbox ServiceAccount's kubeconfig");
    let client = support::client_for(&sa)
        .await
        .expect("the ServiceAccount's client");

    let here = cluster.namespace("np-target").await;
    let there = cluster.namespace("np-peer").await;
    // Label values of this run's own, so no namespace left by another run
    // matches.
    let run = support::suffix();
    let (blue, red) = (format!("blue-{run}"), format!("red-{run}"));
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let relabel = |team: String| {
        let namespaces = namespaces.clone();
        let there = there.clone();
        async move {
            let patch = json!({"metadata": {"labels": {"team": team}}});
            namespaces
                .patch(&there, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("relabel the peer namespace");
        }
    };
    relabel(blue.clone()).await;

    // The peer: a Pod nobody schedules, with an address as a kubelet
    // would write it (a private address never dialled: nothing is sent).
    let octet = || rand::random::<u8>() % 250 + 2;
    let (a, b) = (octet(), octet());
    let first: IpAddr = format!("10.251.{a}.{b}").parse().unwrap();
    let second: IpAddr = format!("10.252.{a}.{b}").parse().unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &there);
    let peer: Pod = support::from_json(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "client", "labels": {"role": "client"}},
        "spec": {"schedulerName": "netpol-test-nobody",
                 "containers": [{"name": "c", "image": "registry.invalid/none"}]},
    }));
    pods.create(&PostParams::default(), &peer)
        .await
        .expect("create the peer Pod");
    let set_ip = |ip: IpAddr| {
        let pods = pods.clone();
        async move {
            let status =
                json!({"status": {"podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]}});
            pods.patch_status("client", &PatchParams::default(), &Patch::Merge(&status))
                .await
                .expect("write the peer Pod's address");
        }
    };
    set_ip(first).await;

    // The sandbox Pod on this node the relay asks about.
    let target: Pod = support::from_json(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sandbox", "namespace": here, "labels": {"app": "sandbox"}},
        "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
    }));
    let local: Arc<Mutex<Vec<(String, Labels)>>> = Arc::new(Mutex::new(vec![(
        here.clone(),
        Labels::from([("app".to_string(), "sandbox".to_string())]),
    )]));
    let seen = Arc::clone(&local);
    let np = NetworkPolicies::new(Arc::new(move || seen.lock().unwrap().clone()));
    let stop = CancellationToken::new();
    let t = Instant::now();
    let watches = tokio::spawn(Arc::clone(&np).run(client, "netpol-test".into(), stop.clone()));

    // Listed: nothing selects the sandbox yet.
    flips(
        &np,
        &target,
        (first, 8080),
        true,
        "policies listed",
        Duration::from_secs(20),
        t,
    )
    .await;
    assert!(np.peer_watches().is_empty(), "no policy, no peer watch");

    let policies: Api<NetworkPolicy> = Api::namespaced(admin.clone(), &here);
    let policy = |port: &str| -> NetworkPolicy {
        let port: serde_json::Value = port.parse::<u16>().map_or(json!(port), |n| json!(n));
        support::from_json(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "sandbox-ingress"},
            "spec": {"podSelector": {"matchLabels": {"app": "sandbox"}},
                     "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": blue}},
                                            "podSelector": {"matchLabels": {"role": "client"}}}],
                                  "ports": [{"port": port}]}]},
        }))
    };
    let apply = PatchParams::apply("netpol-test").force();
    let t = Instant::now();
    policies
        .patch("sandbox-ingress", &apply, &Patch::Apply(&policy("http")))
        .await
        .expect("create the policy");
    // The peer watch starts and lists; the named port resolves to 8080.
    let mut took = vec![];
    took.push(
        flips(
            &np,
            &target,
            (first, 8080),
            true,
            "policy created, peer listed",
            FLIP_LIMIT,
            t,
        )
        .await,
    );
    assert!(!np.verdict(&target, first, 8081).allowed, "another port");
    assert!(
        !np.verdict(&target, "192.0.2.1".parse().unwrap(), 8080)
            .allowed,
        "an outside address"
    );
    assert_eq!(
        np.peer_watches(),
        vec![(format!("Pods in {there} with role=client"), 1, true)],
        "only the Pods the peer selects, in the namespace it selects"
    );

    let t = Instant::now();
    relabel(red.clone()).await;
    took.push(
        flips(
            &np,
            &target,
            (first, 8080),
            false,
            "namespace relabelled red",
            FLIP_LIMIT,
            t,
        )
        .await,
    );
    // The verdict flips as the namespace's labels arrive; the watch loop
    // stops the peer watch when it next wakes on that change.
    let stopping = Instant::now();
    while !np.peer_watches().is_empty() {
        assert!(
            stopping.elapsed() < FLIP_LIMIT,
            "no namespace matches, yet still watched after {FLIP_LIMIT:?}: {:?}",
            np.peer_watches()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = Instant::now();
    relabel(blue.clone()).await;
    took.push(
        flips(
            &np,
            &target,
            (first, 8080),
            true,
            "namespace relabelled blue",
            FLIP_LIMIT,
            t,
        )
        .await,
    );

    let label = |role: &'static str| {
        let pods = pods.clone();
        async move {
            let patch = json!({"metadata": {"labels": {"role": role}}});
            pods.patch("client", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("relabel the peer Pod");
        }
    };
    let t = Instant::now();
    label("other").await;
    took.push(
        flips(
            &np,
            &target,
            (first, 8080),
            false,
            "peer relabelled other",
            FLIP_LIMIT,
            t,
        )
        .await,
    );
    let t = Instant::now();
    label("client").await;
    took.push(
        flips(
            &np,
            &target,
            (first, 8080),
            true,
            "peer relabelled client",
            FLIP_LIMIT,
            t,
        )
        .await,
    );

    let t = Instant::now();
    set_ip(second).await;
    took.push(
        flips(
            &np,
            &target,
            (second, 8080),
            true,
            "peer moved to a new address",
            FLIP_LIMIT,
            t,
        )
        .await,
    );
    assert!(
        !np.verdict(&target, first, 8080).allowed,
        "its old address is no one's"
    );

    let t = Instant::now();
    policies
        .patch("sandbox-ingress", &apply, &Patch::Apply(&policy("9090")))
        .await
        .expect("change the policy's port");
    took.push(
        flips(
            &np,
            &target,
            (second, 8080),
            false,
            "policy moved to port 9090",
            FLIP_LIMIT,
            t,
        )
        .await,
    );
    assert!(np.verdict(&target, second, 9090).allowed);

    // No sandbox Pod here any more: the peer watch goes.
    local.lock().unwrap().clear();
    let start = Instant::now();
    while !np.peer_watches().is_empty() {
        assert!(
            start.elapsed() < FLIP_LIMIT,
            "the peer watch outlived the last Pod here"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t = Instant::now();
    policies
        .delete("sandbox-ingress", &Default::default())
        .await
        .expect("delete the policy");
    took.push(
        flips(
            &np,
            &target,
            (second, 8080),
            true,
            "policy deleted",
            FLIP_LIMIT,
            t,
        )
        .await,
    );

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), watches)
        .await
        .expect("the watches stop")
        .expect("the watch task");
    let worst = took.iter().max().copied().unwrap_or_default();
    eprintln!("netpol watch: {} flips, slowest {worst:?}", took.len());
    cluster.drop_namespace(&here).await;
    cluster.drop_namespace(&there).await;
}
