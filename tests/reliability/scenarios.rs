//! The reliability scenarios. Each takes a seeded world, injects its faults
//! with randomized timing, and hands the world back for the invariant
//! check. Counts scale with the run's size (short in `make test`, full in
//! `make reliability`).

use std::time::Duration;

use rand::Rng;
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

/// Scenario 1: `kill -9` at random points during bursts of creates and deletes.
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

/// Scenario 2: Eviction storm: vk-sandbox paused past the node-monitor grace
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

/// Scenario 3: sandboxd faults: 429 bursts, slow claims past the client timeout
/// that succeed server-side, persist-then-drop replies, claims persisted
/// after their reply timed out (`persist_late`), release 500s of
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
        // Succeeds server-side after the client's 10 s timeout: vk-sandbox
        // must return that sandbox with the node token.
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
        // The reply times out (10 s) and sandboxd persists the claim 15 s
        // after it was asked, once the Pod has claimed again and runs: the
        // late row is a stray of a running Pod. The world settles again
        // after it appeared, so it must have been returned (a stray still
        // live is "not converged", and a leak at the end).
        arm(
            w,
            json!({"endpoint": "claim", "kind": "persist_late", "ms": 15000, "times": 1}),
        );
        let late_at = tokio::time::Instant::now() + Duration::from_secs(16);
        w.create(1).await;
        settle(w, Duration::from_secs(120)).await;
        tokio::time::sleep_until(late_at).await;
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

/// Scenario 4: apiserver outage mid-burst, then an etcd restart.
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

/// Scenario 6: Owner churn: Sandboxes deleted and re-created under the same name
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

fn sh(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// While the store is faulty, a Pod may only be reported Running once its
/// claim is on disk (the claim is durable before the Pod runs). A full
/// tmpfs can still take a small journal append in a page's slack, so
/// Running is allowed; running without the claim on disk is not.
async fn assert_durable_if_running(w: &mut World, what: &str, names: &[String]) {
    w.jitter(1000).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let state = w.vk.state_path.clone();
    let pods = w.pods();
    for n in names {
        let Ok(Some(p)) = pods.get_opt(n).await else {
            continue;
        };
        if p.status.and_then(|s| s.phase).as_deref() != Some("Running") {
            continue;
        }
        let id = p
            .metadata
            .annotations
            .and_then(|a| a.get("sandbox.cocoonstack.io/claim-id").cloned())
            .unwrap_or_default();
        let mut on_disk = std::fs::read_to_string(&state).unwrap_or_default();
        on_disk.push_str(
            &std::fs::read_to_string(format!("{}.journal", state.display())).unwrap_or_default(),
        );
        assert!(
            !id.is_empty() && on_disk.contains(&id),
            "Pod {n} reported Running on {id:?} while {what}, and its claim is not on disk"
        );
    }
}

/// Scenario 5: State store faults: the state directory replaced, made read-only and
/// full while running; the state file corrupted while stopped (refused,
/// untouched); the state directory deleted while running. Needs root (a
/// tmpfs over the state directory).
pub async fn state_faults(w: &mut World, size: Size) {
    if !nix::unistd::Uid::effective().is_root() {
        println!("   (state store faults need root for a tmpfs; skipped)");
        return;
    }
    let state = w.vk.state_path.clone();
    let dir = state.parent().expect("state dir").to_path_buf();
    let d = dir.to_str().expect("utf-8 path").to_string();
    w.create(size.pick(2, 4)).await;
    settle(w, Duration::from_secs(90)).await;

    // The directory replaced under the running process: rewritten from memory.
    sh(
        "mount",
        &["-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", &d],
    )
    .expect("mount tmpfs");
    w.faults += 1;
    w.create(1).await;
    settle(w, Duration::from_secs(60)).await;
    assert!(
        state.exists(),
        "the claims file was not rewritten onto the new directory"
    );

    // Read-only: new claims cannot be persisted. vk-sandbox keeps its
    // journal and its state lock open for writing, so the tmpfs itself
    // cannot be remounted read-only (EBUSY); a bind mount of the directory
    // over itself, made read-only, refuses every new file and rename (a
    // snapshot, a new journal, the lock taken again) while the files
    // already open stay writable.
    sh("mount", &["--bind", &d, &d]).expect("bind the state directory");
    sh("mount", &["-o", "remount,bind,ro", &d]).expect("remount ro");
    w.faults += 1;
    let before = w.owners.len();
    w.create(2).await;
    let names: Vec<String> = w.owners[before..].iter().map(|o| o.name.clone()).collect();
    assert_durable_if_running(w, "the state directory was read-only", &names).await;
    sh("umount", &[&d]).expect("drop the read-only bind");
    settle(w, Duration::from_secs(120)).await;

    // Full.
    let filler = dir.join("filler");
    let chunk = vec![0u8; 16 * 1024];
    if let Ok(mut f) = std::fs::File::create(&filler) {
        use std::io::Write;
        while f.write_all(&chunk).is_ok() {}
    }
    w.faults += 1;
    let before = w.owners.len();
    w.create(2).await;
    let names: Vec<String> = w.owners[before..].iter().map(|o| o.name.clone()).collect();
    assert_durable_if_running(w, "the state directory was full", &names).await;
    std::fs::remove_file(&filler).expect("remove the filler");
    settle(w, Duration::from_secs(120)).await;

    // Corrupted while stopped: refused with the file named, left untouched.
    w.vk.process.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        w.vk.process
            .wait_exit(Duration::from_secs(15))
            .is_some_and(|s| s.success())
    );
    let good = std::fs::read(&state).expect("read the state file");
    let garbage = b"{\"claims\": {\"ns/x\": {\"id\": 7,".to_vec();
    std::fs::write(&state, &garbage).expect("corrupt the state file");
    w.faults += 1;
    let log_len = w.vk.logs().len();
    w.restart();
    // This start is expected to be refused: it never comes up.
    w.starts -= 1;
    let st = w.vk.process.wait_exit(Duration::from_secs(30));
    assert!(
        st.is_some_and(|s| !s.success()),
        "vk-sandbox started on a corrupted state file: {st:?}"
    );
    let said = w.vk.logs()[log_len..].to_string();
    assert!(
        said.contains(state.to_str().expect("utf-8")),
        "the refusal does not name the file:\n{said}"
    );
    assert_eq!(
        std::fs::read(&state).expect("state file"),
        garbage,
        "the corrupted state file was modified"
    );
    std::fs::write(&state, &good).expect("restore the state file");
    w.restart_and_wait().await;
    settle(w, Duration::from_secs(120)).await;

    // Lost while stopped (the file removed): the running Pods keep their
    // sandboxes (adopted, released later with the node token); nothing
    // is released or claimed twice.
    w.vk.process.signal(nix::sys::signal::Signal::SIGTERM);
    w.vk.process.wait_exit(Duration::from_secs(15));
    std::fs::remove_file(&state).expect("remove the state file");
    w.faults += 1;
    w.restart_and_wait().await;
    settle(w, Duration::from_secs(120)).await;

    // Deleted while running: the tmpfs goes (lazily) and the directory
    // with it; the next claim recreates both.
    sh("umount", &["-l", &d]).expect("umount");
    let _ = std::fs::remove_dir_all(&dir);
    w.faults += 1;
    w.create(1).await;
}

/// Scenario 9: neighbours on one sandboxd. Another client claims with
/// `claim_ref = <namespace>/<name>` for Sandboxes this node serves, and for
/// names about to be created here, while claim replies are lost and
/// vk-sandbox is killed; none of the neighbour's sandboxes may be released
/// (counted as wrongly released), and the real lost replies are returned.
pub async fn neighbours(w: &mut World, size: Size) {
    w.create(size.pick(3, 6)).await;
    for _ in 0..size.pick(4, 12) {
        let alive: Vec<String> = w
            .owners
            .iter()
            .filter(|o| o.deleted_at.is_none())
            .map(|o| o.name.clone())
            .collect();
        if !alive.is_empty() {
            let pick = alive[w.rng.random_range(0..alive.len())].clone();
            w.neighbour_claim(&pick).await;
        }
        let next = w.next_name();
        w.neighbour_claim(&next).await;
        if w.rng.random_bool(0.5) {
            arm(
                w,
                json!({"endpoint": "claim", "kind": "drop_after", "times": 1}),
            );
        }
        w.create_named(&next).await;
        w.jitter(1200).await;
        if w.rng.random_bool(0.5) {
            w.kill_and_restart();
            w.faults += 1;
        }
        if w.rng.random_bool(0.3) {
            w.delete_random().await;
        }
        w.jitter(400).await;
    }
}

/// Creates `obj` through `api`, retrying (bounded) through vk-sandbox's
/// and the apiserver's hiccups.
async fn create_retry(api: &kube::Api<kube::api::DynamicObject>, obj: serde_json::Value) {
    let obj: kube::api::DynamicObject = serde_json::from_value(obj).expect("object json");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match api.create(&kube::api::PostParams::default(), &obj).await {
            Ok(_) => return,
            Err(e) if std::time::Instant::now() >= deadline => {
                panic!("create {:?}: {e}", obj.metadata.name)
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

/// Merge-patches `name` through `api`, retrying (bounded).
async fn patch_retry(
    api: &kube::Api<kube::api::DynamicObject>,
    name: &str,
    patch: serde_json::Value,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let r = api
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await;
        match r {
            Ok(_) => return,
            Err(e) if std::time::Instant::now() >= deadline => panic!("patch {name}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

/// Scenario 8: warm-pool churn with the upstream controller: a
/// SandboxWarmPool on this node, SandboxClaims adopting its Sandboxes and
/// being deleted, the pool scaled up and down, all during `kill -9` bursts
/// of vk-sandbox. The Sandboxes are the controllers' (found by watching
/// them); none may lose its VM while it lives (a release sent before the
/// watch saw it go counts as wrong), and every one that went must have its
/// VM released.
pub async fn warm_pool_churn(w: &mut World, size: Size) {
    use kube::api::DeleteParams;
    use support::controller as c;
    if !c::upstream_or_skip("scenario 8 (warm-pool churn)") {
        return;
    }
    w.discover = true;
    w.watch_sandboxes();
    let max = size.pick(3, 5) as i32;
    let node = w.vk.node.clone();
    let templates = w.dynamic("SandboxTemplate");
    let pools = w.dynamic("SandboxWarmPool");
    let claims = w.dynamic("SandboxClaim");
    create_retry(
        &templates,
        c::contract_template("churn", "base:24.04", Some(&node)),
    )
    .await;
    create_retry(&pools, c::warm_pool("churn", "churn", max)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let seen = w.discover_sandboxes().await;
        let n = w.owners.iter().filter(|o| o.deleted_at.is_none()).count();
        if n >= max as usize {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the warm pool made {n} of {max} Sandboxes in 120 s ({seen:?})"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    settle(w, Duration::from_secs(120)).await;
    let mut made = 0;
    let mut live_claims: Vec<String> = Vec::new();
    for round in 0..size.pick(5, 15) {
        // A claim or two adopt warm Sandboxes.
        for _ in 0..w.rng.random_range(1..=2) {
            made += 1;
            let name = format!("claim-{made}");
            create_retry(&claims, c::sandbox_claim(&name, "churn")).await;
            live_claims.push(name);
        }
        w.jitter(800).await;
        // An older claim goes (its Sandbox and VM with it).
        if live_claims.len() > 2 && w.rng.random_bool(0.6) {
            let i = w.rng.random_range(0..live_claims.len() - 1);
            let name = live_claims.remove(i);
            let dp = if round % 2 == 0 {
                DeleteParams::foreground()
            } else {
                DeleteParams::background()
            };
            let _ = claims.delete(&name, &dp).await;
        }
        // The pool is resized.
        let replicas = w.rng.random_range(0..=max);
        patch_retry(&pools, "churn", json!({"spec": {"replicas": replicas}})).await;
        // Record the Sandboxes of the moment (more are judged that way).
        let _ = w.discover_sandboxes().await;
        w.jitter(1500).await;
        let _ = w.discover_sandboxes().await;
        w.kill_and_restart();
        w.faults += 1;
        w.jitter(600).await;
        let _ = w.discover_sandboxes().await;
    }
    // Back to a full pool before the invariants are checked. The upstream
    // pool can stall here for up to its 5-minute expectations timeout: when
    // it deletes an excess Sandbox while a claim adopts it, the deletion it
    // waits to see never reaches it ("Skipping sandbox creation: waiting
    // for in-flight creates/deletes to be observed"). Not a vk-sandbox
    // matter: the invariants hold for whatever Sandboxes exist.
    patch_retry(&pools, "churn", json!({"spec": {"replicas": max}})).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ready = pools
            .get("churn")
            .await
            .ok()
            .and_then(|p| p.data["status"]["readyReplicas"].as_i64())
            .unwrap_or(0);
        let _ = w.discover_sandboxes().await;
        if ready == i64::from(max) {
            break;
        }
        if std::time::Instant::now() >= deadline {
            println!(
                "   note: the warm pool has {ready} of {max} ready Sandboxes after 60 s \
                 (the upstream pool's expectations stall; checked as it is)"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Scenario 10: suspend/resume churn with the upstream controller.
/// Sandboxes on short leases (30 s, renewed half-way) are suspended
/// (`operatingMode: Suspended`: the controller deletes the Pod, vk-sandbox
/// hibernates the VM) and resumed (a new Pod adopts the claim and wakes the
/// VM) at random, a few at a time, while vk-sandbox is killed with
/// `kill -9` and sandboxd refuses hibernates (409), fails them (500), wakes
/// slowly (past the client's 10 s timeout too) or fails them, fails
/// renewals, hibernates slowly, or restarts; some Sandboxes are deleted,
/// suspended or not, and new ones made. The world is then held settled
/// for two leases: a lease not renewed ends meanwhile. Judged: nothing
/// released under a living owner, nothing leaked, no lease ended by
/// sandboxd's reaper under a living owner, every suspended Sandbox's VM
/// hibernated (unless sandboxd refused with 409) and every resumed one's
/// Pod Running on its first VM.
pub async fn suspend_churn(w: &mut World, size: Size) {
    if !support::controller::upstream_or_skip("scenario 10 (suspend/resume churn)") {
        return;
    }
    const TTL: u64 = 30;
    w.lease_ttl = Some(TTL);
    w.create(size.pick(4, 8)).await;
    settle(w, Duration::from_secs(90)).await;
    for _ in 0..size.pick(6, 20) {
        // One to three Sandboxes change mode (only ones that have run: the
        // judge knows their VM).
        for _ in 0..w.rng.random_range(1..=3) {
            let ran: Vec<usize> = (0..w.owners.len())
                .filter(|i| w.owners[*i].deleted_at.is_none() && w.owners[*i].claim.is_some())
                .collect();
            if ran.is_empty() {
                break;
            }
            let i = ran[w.rng.random_range(0..ran.len())];
            let to = !w.owners[i].suspended;
            w.set_suspended(i, to).await;
            w.faults += 1;
        }
        // A sandboxd fault for the next transitions.
        let slow = w.rng.random_range(1000..12000);
        match w.rng.random_range(0..8) {
            0 => arm(
                w,
                json!({"endpoint": "hibernate", "kind": "status", "status": 409, "times": 1}),
            ),
            1 => {
                let times = w.rng.random_range(1..=2);
                arm(
                    w,
                    json!({"endpoint": "hibernate", "kind": "fail", "times": times}),
                )
            }
            2 | 3 => arm(
                w,
                json!({"endpoint": "wake", "kind": "persist_late", "ms": slow, "times": 1}),
            ),
            4 => arm(w, json!({"endpoint": "wake", "kind": "fail", "times": 1})),
            5 => arm(w, json!({"endpoint": "renew", "kind": "fail", "times": 2})),
            6 => arm(
                w,
                json!({"endpoint": "hibernate", "kind": "persist_late", "ms": slow / 2, "times": 1}),
            ),
            _ => {
                // sandboxd restarts, keeping what it persisted.
                w.sim.sim().restart(&[]).expect("simulator restart");
                w.faults += 1;
            }
        }
        w.jitter(1500).await;
        if w.rng.random_bool(0.5) {
            w.kill_and_restart();
            w.faults += 1;
        }
        w.jitter(800).await;
        if w.rng.random_bool(0.2) {
            w.delete_random().await;
            w.create(1).await;
        }
    }
    // Settle (the new Sandboxes run, the suspended hibernate), then hold
    // the world past two leases so that an unrenewed one would end.
    w.sim.sim().clear_faults();
    let (_, problems) = w.converge(Duration::from_secs(180)).await;
    if !problems.is_empty() {
        println!("   (not settled after the churn: {problems:?}; judged at the end)");
    }
    tokio::time::sleep(Duration::from_secs(2 * TTL + 5)).await;
}

/// A `kubectl exec -i … -- cat` session into Sandbox `name`'s Pod, left
/// open (its stdin never ends) until the scenario kills it.
fn open_session(w: &World, name: &str) -> Option<tokio::process::Child> {
    tokio::process::Command::new(support::kubectl::path())
        .arg("--kubeconfig")
        .arg(&w.cluster.kubeconfig)
        .args(["-n", &w.ns, "exec", "-i", name, "--", "cat"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .ok()
}

/// Opens (and closes) the guest agent relay of sandbox `id` with its own
/// token, as a session that outlived its Pod would: sandboxd wakes a
/// hibernated or archived VM for it, behind vk-sandbox's record.
async fn wake_behind_the_record(w: &World, id: &str) -> bool {
    let Some(token) = w
        .sim
        .sim()
        .claims()
        .into_iter()
        .find(|c| c.id == id)
        .map(|c| c.token)
    else {
        return false;
    };
    let client = vk_sandbox::sandboxd::SandboxdClient::builder(w.sim.base_url())
        .build()
        .expect("client");
    let token = vk_sandbox::sandboxd::Secret::new(token);
    tokio::time::timeout(Duration::from_secs(15), client.agent(id, &token))
        .await
        .is_ok_and(|r| r.is_ok())
}

/// Scenario 11: relays across suspends, with sandboxd's idle tiers on.
/// `kubectl exec` sessions are open while their Sandbox is suspended and
/// killed after it (the hang-up's `kill` must not wake the VM); sandboxd
/// idle-hibernates and archives VMs; VMs are woken behind vk-sandbox's
/// record (a relay with the claim's token, as any session that outlived
/// its Pod would); Sandboxes are resumed, and deleted and re-created under
/// the same name. Judged: no VM running for a suspended Sandbox, no lease
/// lost under a living owner (short leases: a woken VM left unrenewed
/// ends within a minute), no VM of one owner generation given to another.
pub async fn relays_idle(w: &mut World, size: Size) {
    if !support::controller::upstream_or_skip("scenario 11 (relays and idle tiers)") {
        return;
    }
    const TTL: u64 = 30;
    w.lease_ttl = Some(TTL);
    // The simulator's sweep runs with its reaper (every second); a claim
    // is made idle by moving its last activity back.
    w.sim.sim().patch_config(sandboxd_sim::config::ConfigPatch {
        idle_hibernate_seconds: Some(600),
        archive_after_seconds: Some(1200),
        archive_delete_after_seconds: Some(86_400),
        ..Default::default()
    });
    w.create(size.pick(4, 8)).await;
    settle(w, Duration::from_secs(90)).await;
    for _ in 0..size.pick(5, 15) {
        let live: Vec<usize> = (0..w.owners.len())
            .filter(|i| w.owners[*i].deleted_at.is_none() && w.owners[*i].claim.is_some())
            .collect();
        if live.is_empty() {
            w.create(2).await;
            continue;
        }
        // Sessions into one or two running Sandboxes, then some of them
        // suspended while the sessions are open.
        let mut sessions = Vec::new();
        for _ in 0..w.rng.random_range(1..=2) {
            let i = live[w.rng.random_range(0..live.len())];
            if !w.owners[i].suspended {
                let name = w.owners[i].name.clone();
                sessions.extend(open_session(w, &name).map(|c| (i, c)));
            }
        }
        w.jitter(1500).await;
        for (i, _) in &sessions {
            if w.rng.random_bool(0.7) && !w.owners[*i].suspended {
                w.set_suspended(*i, true).await;
                w.faults += 1;
            }
        }
        // sandboxd's idle tiers: a running VM idle past its hibernate
        // tier, a hibernated one past its archive tier.
        let rows = w.sim.sim().claims();
        for c in &rows {
            if w.rng.random_bool(0.3) {
                let idle = if c.hibernated { 1300 } else { 700 };
                let _ = w.sim.sim().patch_claim(
                    &c.id,
                    sandboxd_sim::ClaimPatch {
                        idle_seconds: Some(idle),
                        ..Default::default()
                    },
                );
                w.faults += 1;
            }
        }
        w.sim.sim().sweep();
        w.jitter(3000).await;
        // The sessions end after the suspend: the hang-up's `kill`.
        for (_, mut child) in sessions {
            let _ = child.kill().await;
        }
        // VMs woken behind the record: a suspended Sandbox's, an
        // archived one's.
        let asleep: Vec<String> = w
            .sim
            .sim()
            .claims()
            .into_iter()
            .filter(|c| c.hibernated || c.archived)
            .map(|c| c.id)
            .collect();
        for id in asleep {
            if w.rng.random_bool(0.4) && wake_behind_the_record(w, &id).await {
                w.faults += 1;
            }
        }
        w.jitter(2000).await;
        // Some suspended Sandboxes resume; now and then one is deleted and
        // re-created under the same name (a new owner generation).
        let suspended: Vec<usize> = (0..w.owners.len())
            .filter(|i| w.owners[*i].deleted_at.is_none() && w.owners[*i].suspended)
            .collect();
        for i in suspended {
            if w.rng.random_bool(0.3) {
                w.set_suspended(i, false).await;
                w.faults += 1;
            }
        }
        if w.rng.random_bool(0.3) {
            let i = live[w.rng.random_range(0..live.len())];
            if w.owners[i].deleted_at.is_none() {
                let name = w.owners[i].name.clone();
                let foreground = w.rng.random_bool(0.5);
                w.delete_index(i, foreground).await;
                w.create_named(&name).await;
                w.faults += 1;
            }
        }
        if w.rng.random_bool(0.3) {
            w.kill_and_restart();
            w.faults += 1;
        }
    }
    // Settle, then hold the world past two leases (and an observation
    // period of the upkeep's, 30 s): a woken VM left unrenewed would end,
    // one left running under a suspended Sandbox would still run.
    w.sim.sim().clear_faults();
    let (_, problems) = w.converge(Duration::from_secs(180)).await;
    if !problems.is_empty() {
        println!("   (not settled after the churn: {problems:?}; judged at the end)");
    }
    tokio::time::sleep(Duration::from_secs(2 * TTL + 35)).await;
}

/// 12: connections to the Pods' own addresses (docs/pod-network.md) while
/// Sandboxes are suspended, resumed, deleted (some re-created under their
/// name) and vk-sandbox is killed: no connection reaches another
/// sandbox's VM, no address is shown by two Pods, none outlives its claim
/// ([`crate::podnet`] probes and judges).
pub async fn pod_addresses(w: &mut World, size: Size) {
    let seed = w.rng.random();
    let Some(probe) = crate::podnet::AddressProbe::start(&w.sim, w.pods(), seed) else {
        assert!(
            std::env::var_os("VK_REQUIRE_CLUSTER").is_none(),
            "scenario 12 needs a network namespace of its own (ip netns add: root)"
        );
        println!("   SKIPPED scenario 12: cannot make a network namespace (not root)");
        return;
    };
    // vk-sandbox again, now with the Pod range (nothing is claimed yet).
    w.extra_args = vec![
        format!("--pod-cidr={}", crate::podnet::RANGE),
        format!("--pod-netns={}", probe.netns_path().display()),
    ];
    w.pod_ports = vec![crate::podnet::PORT];
    w.vk.process.signal(nix::sys::signal::Signal::SIGKILL);
    w.vk.process.wait_exit(Duration::from_secs(10));
    w.restart_and_wait().await;
    w.create(size.pick(4, 8)).await;
    settle(w, Duration::from_secs(90)).await;
    for _ in 0..size.pick(6, 15) {
        // Only Sandboxes whose first claim the world has seen are acted
        // on (a Sandbox suspended before its Pod ran has no VM to judge).
        let ran: Vec<usize> = (0..w.owners.len())
            .filter(|i| w.owners[*i].deleted_at.is_none() && w.owners[*i].claim.is_some())
            .collect();
        if ran.is_empty() {
            w.create(2).await;
            let _ = w.converge(Duration::from_secs(30)).await;
            continue;
        }
        for &i in &ran {
            if w.rng.random_bool(0.25) {
                let suspend = !w.owners[i].suspended;
                w.set_suspended(i, suspend).await;
                w.faults += 1;
            }
        }
        if w.rng.random_bool(0.4) {
            let i = ran[w.rng.random_range(0..ran.len())];
            let name = w.owners[i].name.clone();
            let foreground = w.rng.random_bool(0.5);
            w.delete_index(i, foreground).await;
            if w.rng.random_bool(0.5) {
                w.create_named(&name).await;
            } else {
                w.create(1).await;
            }
            w.faults += 1;
        }
        w.jitter(2000).await;
        if w.rng.random_bool(0.3) {
            w.kill_and_restart();
            w.faults += 1;
        }
        w.jitter(1500).await;
        // New Sandboxes' first claims recorded; the probe keeps going.
        let _ = w.converge(Duration::from_secs(30)).await;
    }
    // Most suspended Sandboxes resume: their Pods must show the address
    // their VM had.
    let suspended: Vec<usize> = (0..w.owners.len())
        .filter(|i| w.owners[*i].deleted_at.is_none() && w.owners[*i].suspended)
        .collect();
    for i in suspended {
        if w.rng.random_bool(0.7) {
            w.set_suspended(i, false).await;
            w.faults += 1;
        }
    }
    w.sim.sim().clear_faults();
    let (_, problems) = w.converge(Duration::from_secs(180)).await;
    if !problems.is_empty() {
        println!("   (not settled after the churn: {problems:?}; judged at the end)");
    }
    let live = w.sim.sim().claims().into_iter().map(|c| c.id).collect();
    let pods = w
        .pods()
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let running: Vec<(std::net::IpAddr, String)> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let st = p.status.as_ref()?;
            (st.phase.as_deref() == Some("Running")).then_some(())?;
            let ip = st.pod_ip.as_deref()?.parse().ok()?;
            let claim = p
                .metadata
                .annotations
                .as_ref()?
                .get("sandbox.cocoonstack.io/claim-id")?;
            Some((ip, claim.clone()))
        })
        .collect();
    let (faults, notes) = probe.judge(&live, &running).await;
    w.address_faults += faults;
    w.address_notes.extend(notes);
}
