//! The scenarios of issue 8. Each takes a seeded world, injects its faults
//! with randomized timing, and hands the world back for the invariant
//! check. Counts scale with the run's size (short in `make test`, full in
//! `make reliability`).

use std::time::Duration;

use serde_json::json;

use crate::world::{TOKEN, World};
use crate::{Size, support};

fn fault(spec: serde_json::Value) -> sandboxd_sim::Fault {
    serde_json::from_value(spec).expect("fault json")
}

fn arm(w: &mut World, spec: serde_json::Value) {
    w.sim.sim().arm_fault(fault(spec)).expect("arm a fault");
    w.faults += 1;
}

/// Waits for the Sandboxes created so far to run (their first claim).
async fn settle(w: &mut World, timeout: Duration) {
    let (_, problems) = w.converge(timeout).await;
    assert!(
        problems.is_empty(),
        "the world did not settle before the faults: {problems:?}\n{}",
        support::vk::tail(&w.vk.logs(), 30)
    );
}

/// 1. `kill -9` at random points during bursts of creates and deletes.
pub async fn kill9(w: &mut World, size: Size) {
    w.create(size.pick(4, 8)).await;
    for _ in 0..size.pick(5, 20) {
        w.create(2).await;
        w.delete_random().await;
        w.jitter(1500).await;
        w.kill_and_restart();
        w.faults += 1;
        w.jitter(400).await;
    }
}

/// 2. Eviction storm: vk-sandbox paused past the node-monitor grace
/// period, so the node lifecycle controller taints the node and evicts
/// its Pods (the Sandboxes live on); then resumed.
pub async fn eviction(w: &mut World, size: Size) {
    w.create(size.pick(3, 8)).await;
    settle(w, Duration::from_secs(90)).await;
    // Evictions pause when no node is Ready: keep another node alive.
    let keeper = support::vk::VkUnderTest::start(&w.cluster, "rel-keeper", &[]).await;
    keeper
        .wait_ready(&w.cluster.client, Duration::from_secs(60))
        .await;
    w.vk.process.signal(nix::sys::signal::Signal::SIGSTOP);
    w.faults += 1;
    let pods = w.pods();
    support::wait_for(
        "taint eviction of the paused node's Pods",
        Duration::from_secs(180),
        || async {
            let list = pods
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            let evicted = list
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_some())
                .count();
            if evicted > 0 && evicted == list.items.len() {
                Ok(())
            } else {
                Err(format!("{evicted} of {} Pods evicted", list.items.len()))
            }
        },
    )
    .await;
    w.jitter(3000).await;
    w.vk.process.signal(nix::sys::signal::Signal::SIGCONT);
    // Deletes during the storm's recovery.
    w.create(1).await;
    w.delete_random().await;
    settle(w, Duration::from_secs(180)).await;
    keeper.delete_node(&w.cluster.client).await;
}

/// 3. sandboxd faults: 429 bursts, slow claims past the client timeout
/// that succeed server-side, persist-then-drop replies, release 500s of
/// both kinds, list failures during start-up verification, sandboxd
/// restarts, token rotation.
pub async fn sandboxd_faults(w: &mut World, size: Size) {
    w.create(size.pick(3, 6)).await;
    settle(w, Duration::from_secs(90)).await;
    for _ in 0..size.pick(1, 3) {
        arm(
            w,
            json!({"endpoint": "claim", "kind": "status", "status": 429, "times": 3}),
        );
        w.create(2).await;
        w.jitter(500).await;
        // Succeeds server-side after the client's 10 s timeout: D7 returns it.
        arm(
            w,
            json!({"endpoint": "claim", "kind": "slow", "ms": 11000, "times": 1}),
        );
        w.create(1).await;
        w.jitter(500).await;
        arm(
            w,
            json!({"endpoint": "claim", "kind": "drop_after", "times": 1}),
        );
        w.create(1).await;
        settle(w, Duration::from_secs(120)).await;

        arm(
            w,
            json!({"endpoint": "release", "kind": "release_fail_keep", "times": 2}),
        );
        w.delete_random().await;
        arm(
            w,
            json!({"endpoint": "release", "kind": "release_fail_drop", "times": 1}),
        );
        w.delete_random().await;
        w.jitter(2000).await;

        // A restart meets a failing listing: claims stay quarantined.
        arm(
            w,
            json!({"endpoint": "list", "kind": "status", "status": 503, "times": 2}),
        );
        arm(
            w,
            json!({"endpoint": "list", "kind": "garbage", "times": 2}),
        );
        w.kill_and_restart();
        w.jitter(1000).await;

        // sandboxd restarts (keeping what it persisted).
        w.sim.sim().restart(&[]).expect("simulator restart");
        w.faults += 1;
        w.create(1).await;
        settle(w, Duration::from_secs(120)).await;
    }
    // Token rotation: sandboxd takes a new node token, vk-sandbox is
    // restarted with it (the token file is read at start).
    let rotated = format!("{TOKEN}-rotated");
    w.sim.sim().patch_config(sandboxd_sim::config::ConfigPatch {
        api_token: Some(rotated.clone()),
        ..Default::default()
    });
    w.faults += 1;
    w.create(1).await;
    w.jitter(1500).await;
    std::fs::write(&w.token_file, &rotated).expect("rotate the token file");
    w.vk.process.signal(nix::sys::signal::Signal::SIGTERM);
    w.vk.process.wait_exit(Duration::from_secs(10));
    w.restart();
}

/// 4. apiserver outage mid-burst, then an etcd restart.
pub async fn apiserver_outage(w: &mut World, size: Size) {
    let Some(cluster_sh) = crate::cluster_control() else {
        return;
    };
    w.create(size.pick(3, 6)).await;
    settle(w, Duration::from_secs(90)).await;
    w.create(2).await;
    w.delete_random().await;
    w.jitter(1000).await;
    let down = size.pick(20, 30).to_string();
    restart_component(&cluster_sh, "kube-apiserver", &down).await;
    w.faults += 1;
    w.create(1).await;
    w.delete_random().await;
    settle(w, Duration::from_secs(180)).await;
    restart_component(&cluster_sh, "etcd", "3").await;
    w.faults += 1;
    w.create(1).await;
    w.delete_random().await;
}

async fn restart_component(cluster_sh: &std::path::Path, name: &str, down: &str) {
    let out = tokio::process::Command::new(cluster_sh)
        .args(["restart", name, down])
        .output()
        .await
        .expect("run cluster.sh restart");
    assert!(
        out.status.success(),
        "cluster.sh restart {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// 6. Owner churn: Sandboxes deleted and re-created under the same name
/// while their Pods are being torn down (UID-change paths).
pub async fn owner_churn(w: &mut World, size: Size) {
    w.create(size.pick(3, 6)).await;
    settle(w, Duration::from_secs(90)).await;
    for round in 0..size.pick(3, 10) {
        let alive: Vec<usize> = (0..w.owners.len())
            .filter(|i| w.owners[*i].deleted_at.is_none())
            .collect();
        let i = alive[round % alive.len()];
        let name = w.owners[i].name.clone();
        let foreground = round % 2 == 0;
        w.delete_index(i, foreground).await;
        w.jitter(300).await;
        w.create_named(&name).await;
        w.faults += 1;
        w.jitter(1500).await;
    }
}
