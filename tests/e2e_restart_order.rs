//! After a restart over many Running Pods, a Pod waiting for its claim is
//! served before the Pods already Running are checked
//! (src/pods/work_first.rs). kube-runtime's queue keeps no order of its
//! own: the new Pod used to take its turn at a random place among the
//! checks (docs/benchmarks.md, the restart timeline). The real local
//! control plane, the simulator and the vk-sandbox binary.

mod support;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;
use support::vk::{VkUnderTest, tail};
use support::wait_for;

const TOKEN: &str = "root-token-order";
/// Reconciles in flight at once (src/pods/controller.rs).
const SLOTS: usize = 64;
/// Several times [`SLOTS`], so the order shows.
const RUNNING: usize = 300;

/// A bare sandbox Pod bound to `node`.
fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
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
    .expect("pod json")
}

async fn all_running(pods: &Api<Pod>, n: usize, vk: &VkUnderTest) {
    wait_for(
        &format!("{n} Pods Running"),
        Duration::from_secs(120),
        || async {
            let list = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let running = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            if running == n {
                Ok(())
            } else {
                Err(format!("{running} Running; log:\n{}", tail(&vk.logs(), 5)))
            }
        },
    )
    .await
}

/// The log since the last restart.
fn since_restart(logs: &str) -> &str {
    let at = logs
        .rfind("vk-sandbox exiting")
        .unwrap_or_else(|| panic!("no shutdown in the log:\n{}", tail(logs, 20)));
    &logs[at..]
}

const CHECKED: &str = "resumed the Pod's own claim";
const NEEDY: &str = "listed Pod needs work: queued first";
const HELD: &str = "listed Pods already served: queued once reconciles open";

/// The `ns/name` of a log line's reconcile span or `pod` field.
fn pod_of(line: &str) -> Option<&str> {
    let rest = line.split(" pod=").nth(1)?;
    let end = rest.find(['}', ' ']).unwrap_or(rest.len());
    Some(&rest[..end])
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_restart_a_waiting_pod_goes_before_the_running_ones_are_checked() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let pool = format!("base:24.04={}", RUNNING + 8);
    let sim = support::sim::start(support::sim::config(TOKEN, &[pool.as_str()])).await;
    let prefix = "vk-order";
    let token_file = support::sim::token_file(&support::vk::test_dir(prefix), TOKEN);
    let args = support::sim::vk_args(&sim, Some(&token_file));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut vk = VkUnderTest::start(&cluster, prefix, &argv).await;
    vk.wait_ready(&cluster.client, Duration::from_secs(30))
        .await;
    let ns = cluster.namespace(prefix).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    let node = vk.node.clone();
    futures::stream::iter(0..RUNNING)
        .map(|i| {
            let (pods, p) = (pods.clone(), pod(&format!("r-{i:03}"), &node));
            async move {
                pods.create(&PostParams::default(), &p)
                    .await
                    .expect("create Pod")
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    all_running(&pods, RUNNING, &vk).await;

    // Down; a new Pod bound meanwhile; up again over the Running ones.
    vk.process.signal(nix::sys::signal::Signal::SIGTERM);
    vk.process
        .wait_exit(Duration::from_secs(10))
        .expect("exit after SIGTERM");
    pods.create(&PostParams::default(), &pod("new", &node))
        .await
        .expect("create the new Pod");
    vk.restart(&argv);
    all_running(&pods, RUNNING + 1, &vk).await;
    wait_for(
        "every Running Pod checked after the restart",
        Duration::from_secs(30),
        || async {
            let logs = vk.logs();
            let checked = since_restart(&logs).matches(CHECKED).count();
            if checked >= RUNNING {
                Ok(())
            } else {
                Err(format!("{checked} checked"))
            }
        },
    )
    .await;

    // Which Pods the list held back (every Pod not logged as needing work
    // when listed), and how many of their checks came before the new
    // Pod's reconcile decided to claim.
    let logs = vk.logs();
    let after = since_restart(&logs);
    let needy: std::collections::BTreeSet<&str> = after
        .lines()
        .filter(|l| l.contains(NEEDY))
        .filter_map(pod_of)
        .collect();
    let held: usize = after
        .lines()
        .find(|l| l.contains(HELD))
        .and_then(|l| {
            l.split("held=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no '{HELD}' in the log:\n{}", tail(after, 30)));
    let new = format!("{ns}/new");
    assert!(
        needy.contains(new.as_str()),
        "the new Pod was held back: {needy:?}"
    );
    assert!(
        held + SLOTS > RUNNING,
        "only {held} of {RUNNING} Running Pods were held back; needing work: {needy:?}"
    );
    let mut checked = 0;
    let mut before = None;
    for line in after.lines() {
        if line.contains(CHECKED) && pod_of(line).is_some_and(|p| !needy.contains(p)) {
            checked += 1;
        } else if pod_of(line) == Some(new.as_str()) && line.contains("planned") {
            before = Some(checked);
            break;
        }
    }
    let before = before.unwrap_or_else(|| {
        panic!(
            "the new Pod's reconcile is not in the log:\n{}",
            tail(after, 30)
        )
    });
    // Held Pods are queued only once reconciles open, after the Pods
    // already waiting for that; without the order, the new Pod's place is
    // anywhere among them.
    assert_eq!(
        before, 0,
        "the new Pod was reconciled after {before} checks of held-back Running Pods"
    );
    eprintln!(
        "restart order: {held} of {RUNNING} Running Pods held back, {} Pods needed work, \
         the new Pod first",
        needy.len()
    );
    cluster.drop_namespace(&ns).await;
    vk.delete_node(&cluster.client).await;
}
