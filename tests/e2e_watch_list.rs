//! vk-sandbox on an apiserver without streaming lists: kube-apiserver
//! with `--feature-gates WatchList=false` (the default before Kubernetes
//! 1.34) refuses the Pod watch's streaming list with a 422, and the watch
//! lists in pages instead (src/kube_client/watch_list.rs), once per
//! process: the Node goes Ready, a Pod bound there goes Running, and after
//! a restart the paged list brings the Running Pod back on its claim while a
//! Pod bound meanwhile is served. A scratch apiserver of its own (the
//! shared plane serves streaming lists, as every other e2e test uses).

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use support::scratch::Scratch;
use support::vk::{VkUnderTest, tail};

const TOKEN: &str = "root-token-watch-list";
const FALLBACK: &str = "the apiserver does not serve streaming lists (WatchList off)";

fn pod(name: &str, node: &str) -> Pod {
    support::from_json(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {
            "sandbox.cocoonstack.io/runtime": "sandboxd",
            "sandbox.cocoonstack.io/template": "base:24.04"}},
        "spec": {
            "nodeName": node,
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "agent", "image": "base:24.04"}]
        }
    }))
}

#[tokio::test(flavor = "multi_thread")]
async fn without_streaming_lists_the_pod_watch_lists_in_pages() {
    if support::cluster().await.is_none() {
        return;
    }
    let Some(scratch) = Scratch::up_with_gates("vk-wl", "WatchList=false").await else {
        return;
    };
    let cluster = &scratch.cluster;
    let sim = support::sim::start(support::sim::config(TOKEN, &["base:24.04=8"])).await;
    let prefix = "vk-wl";
    let token_file = support::sim::token_file(&support::vk::test_dir(prefix), TOKEN);
    let args = support::sim::vk_args(&sim, Some(&token_file));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut vk = VkUnderTest::start(cluster, prefix, &argv).await;
    vk.wait_ready(&cluster.client, Duration::from_secs(30))
        .await;

    // No controllers there: the namespace's default ServiceAccount (Pod
    // admission needs it) is made here.
    let ns = format!("{prefix}-{}", support::suffix());
    let namespace: Namespace = support::from_json(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    );
    Api::all(cluster.client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create namespace");
    let sa: ServiceAccount = support::from_json(
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
    );
    Api::<ServiceAccount>::namespaced(cluster.client.clone(), &ns)
        .create(&PostParams::default(), &sa)
        .await
        .expect("create the default ServiceAccount");
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    pods.create(&PostParams::default(), &pod("first", &vk.node))
        .await
        .expect("create the first Pod");
    let (first_claim, _) = support::running_address::<std::net::IpAddr>(
        &pods,
        "first",
        Duration::from_secs(30),
        || tail(&vk.logs(), 20),
    )
    .await;
    let logs = vk.logs();
    assert_eq!(
        logs.matches(FALLBACK).count(),
        1,
        "one refusal, then pages:\n{}",
        tail(&logs, 30)
    );

    // Down; a Pod bound meanwhile; up again over the Running one.
    vk.process.signal(nix::sys::signal::Signal::SIGTERM);
    vk.process
        .wait_exit(Duration::from_secs(10))
        .expect("exit after SIGTERM");
    pods.create(&PostParams::default(), &pod("second", &vk.node))
        .await
        .expect("create the second Pod");
    vk.restart(&argv);
    let (second_claim, _) = support::running_address::<std::net::IpAddr>(
        &pods,
        "second",
        Duration::from_secs(30),
        || tail(&vk.logs(), 20),
    )
    .await;
    assert_ne!(first_claim, second_claim);
    let logs = vk.logs();
    let after = &logs[logs
        .rfind("vk-sandbox exiting")
        .expect("the first run's end")..];
    assert_eq!(
        after.matches(FALLBACK).count(),
        1,
        "the restarted process falls back once too:\n{}",
        tail(after, 30)
    );
    assert!(
        after.contains("Pod watch listed this node's Pods pods=2"),
        "the paged list has both Pods:\n{}",
        tail(after, 30)
    );
    // The first Pod kept its claim through the restart.
    let first = pods.get("first").await.expect("first Pod");
    let claim = first
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("sandbox.cocoonstack.io/claim-id"))
        .cloned();
    assert_eq!(claim.as_deref(), Some(first_claim.as_str()));
    assert_eq!(
        first.status.and_then(|s| s.phase).as_deref(),
        Some("Running")
    );
    vk.delete_node(&cluster.client).await;
}
