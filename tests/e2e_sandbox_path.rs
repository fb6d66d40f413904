//! The whole path with a `Sandbox` handled by the Sandbox controller (the
//! upstream agent-sandbox controller; the stand-in only where it cannot be
//! fetched, see tests/support/controller.rs): Sandbox → Pod bound by the
//! scheduler → claim → Pod Running with the VM address → Sandbox Ready; Pod
//! deletion preserves, Sandbox deletion releases; an eviction storm
//! releases nothing.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams, PropagationPolicy};
use kube::{Api, Client};
use sandbox_controller::Sandbox;
use sandboxd_sim::SimHandle;
use support::vk::{VkUnderTest, tail};
use support::{TestCluster, wait_for};

const TOKEN: &str = "root-token-path";

struct Env {
    cluster: TestCluster,
    sim: SimHandle,
    vk: VkUnderTest,
    ns: String,
    token_file: std::path::PathBuf,
    _controller: support::controller::SandboxController,
}

async fn setup(prefix: &str) -> Option<Env> {
    let cluster = support::cluster().await?;
    support::controller::install_crds(&cluster.client, &cluster.kubeconfig).await;
    let (sim, vk, token_file) = support::vk::with_simulator(&cluster, prefix, TOKEN).await;
    let ns = cluster.namespace(prefix).await;
    let controller = support::controller::start(&cluster.client, &cluster.kubeconfig, &ns).await;
    Some(Env {
        cluster,
        sim,
        vk,
        ns,
        token_file,
        _controller: controller,
    })
}

impl Env {
    fn client(&self) -> Client {
        self.cluster.client.clone()
    }
    fn sandboxes(&self) -> Api<Sandbox> {
        Api::namespaced(self.client(), &self.ns)
    }
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client(), &self.ns)
    }

    /// A Sandbox carrying the Pod contract, pinned to this test's node by
    /// hostname (other tests' virtual nodes carry the same runtime label).
    async fn create_sandbox(&self, name: &str) {
        let sb: Sandbox = serde_json::from_value(support::controller::contract_sandbox(
            name,
            "base:24.04",
            Some(&self.vk.node),
        ))
        .expect("sandbox json");
        self.sandboxes()
            .create(&PostParams::default(), &sb)
            .await
            .expect("create Sandbox");
    }

    /// Waits for the Sandbox's Pod to run; returns (uid, claim id).
    async fn wait_running(&self, name: &str, timeout: Duration) -> (String, String) {
        let pods = self.pods();
        wait_for(
            &format!("the Pod of Sandbox {name} Running"),
            timeout,
            || async {
                let p = pods
                    .get_opt(name)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("no Pod yet")?;
                let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                let id = p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("sandbox.cocoonstack.io/claim-id").cloned())
                    .unwrap_or_default();
                if phase.as_deref() == Some("Running") && p.metadata.deletion_timestamp.is_none() {
                    Ok((p.metadata.uid.clone().unwrap_or_default(), id))
                } else {
                    Err(format!(
                        "phase {phase:?}; log:\n{}",
                        tail(&self.vk.logs(), 10)
                    ))
                }
            },
        )
        .await
    }

    async fn wait_sandbox_ready(&self, name: &str) -> Sandbox {
        let api = self.sandboxes();
        wait_for(
            &format!("Sandbox {name} Ready"),
            Duration::from_secs(30),
            || async {
                let sb = api.get(name).await.map_err(|e| e.to_string())?;
                let ready =
                    sb.status.as_ref().map(|s| &s.conditions).is_some_and(|cs| {
                        cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                    });
                if ready {
                    Ok(sb)
                } else {
                    Err(format!("status {:?}", sb.status))
                }
            },
        )
        .await
    }

    fn claims_for(&self, key: &str) -> usize {
        support::sim::claims_for_key(&self.sim, key)
    }

    fn release_of(&self, id: &str) -> Option<sandboxd_sim::RequestRecord> {
        self.sim
            .sim()
            .requests()
            .into_iter()
            .find(|r| r.path == format!("/v1/sandboxes/{id}/release"))
    }

    fn releases(&self) -> usize {
        support::sim::releases(&self.sim).len()
    }

    fn token_of(&self, id: &str) -> String {
        self.sim
            .sim()
            .claims()
            .into_iter()
            .find(|c| c.id == id)
            .map(|c| c.token)
            .unwrap_or_default()
    }

    async fn wait_pod_gone(&self, name: &str) {
        support::wait_pod_gone(&self.pods(), name, || tail(&self.vk.logs(), 10)).await;
    }

    async fn finish(self) {
        self.cluster.drop_namespace(&self.ns).await;
        self.vk.delete_node(&self.cluster.client).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sandbox_runs_survives_pod_deletion_and_is_released_with_it() {
    let Some(env) = setup("vk-path").await else {
        return;
    };
    let key = |n: &str| format!("{}/{n}", env.ns);

    // Sandbox → Pod → claim → Running with the VM address → Sandbox Ready.
    env.create_sandbox("demo").await;
    let (uid, id) = env.wait_running("demo", Duration::from_secs(60)).await;
    let sb = env.wait_sandbox_ready("demo").await;
    let ips = sb.status.map(|s| s.pod_ips).unwrap_or_default();
    assert_eq!(ips, vec!["10.0.0.5".to_string()], "Sandbox podIPs");

    // The Pod is deleted while the Sandbox lives: the controller recreates
    // it, and the new Pod adopts the same sandbox.
    env.pods()
        .delete("demo", &DeleteParams::default())
        .await
        .expect("delete Pod");
    let pods = env.pods();
    let (uid2, id2) = wait_for(
        "a replacement Pod Running",
        Duration::from_secs(60),
        || async {
            let p = pods
                .get_opt("demo")
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no Pod")?;
            let u = p.metadata.uid.clone().unwrap_or_default();
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            let id = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("sandbox.cocoonstack.io/claim-id").cloned())
                .unwrap_or_default();
            if u != uid && running {
                Ok((u, id))
            } else {
                Err("not yet replaced and Running".to_string())
            }
        },
    )
    .await;
    assert_ne!(uid2, uid);
    assert_eq!(
        id2, id,
        "the replacement Pod did not adopt the preserved sandbox"
    );
    assert_eq!(env.claims_for(&key("demo")), 1, "a second claim was made");
    assert_eq!(
        env.releases(),
        0,
        "a sandbox was released while its Sandbox lives"
    );

    // Background deletion of the Sandbox: GC deletes the Pod once the
    // owner is gone → owner NotFound → release with the claim's token.
    let token = env.token_of(&id);
    env.sandboxes()
        .delete("demo", &DeleteParams::background())
        .await
        .expect("delete Sandbox");
    env.wait_pod_gone("demo").await;
    let rel = env.release_of(&id).expect("release after the Sandbox went");
    assert_eq!(rel.authorization, Some(format!("Bearer {token}")));

    // Foreground deletion: the owner is in teardown when the Pod goes.
    env.create_sandbox("fg").await;
    let (_, fg_id) = env.wait_running("fg", Duration::from_secs(60)).await;
    env.sandboxes()
        .delete(
            "fg",
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Foreground),
                ..Default::default()
            },
        )
        .await
        .expect("delete Sandbox (foreground)");
    env.wait_pod_gone("fg").await;
    assert!(
        env.release_of(&fg_id).is_some(),
        "no release after foreground deletion"
    );
    env.finish().await;
}

/// The node lifecycle controller evicts every Pod of a silent node; the
/// Sandboxes live, so nothing is released, and after a restart every
/// Sandbox runs again on its original sandbox.
#[tokio::test(flavor = "multi_thread")]
async fn eviction_storm_releases_nothing() {
    let Some(mut env) = setup("vk-evict").await else {
        return;
    };
    let names = ["e0", "e1", "e2"];
    let mut ids = Vec::new();
    for n in names {
        env.create_sandbox(n).await;
    }
    for n in names {
        ids.push(env.wait_running(n, Duration::from_secs(60)).await);
    }
    // The lifecycle controller pauses evictions when no node is Ready:
    // keep one other virtual node alive meanwhile.
    let keeper = VkUnderTest::start(&env.cluster, "vk-keeper", &[]).await;
    keeper
        .wait_ready(&env.cluster.client, Duration::from_secs(30))
        .await;
    env.vk.process.signal(nix::sys::signal::Signal::SIGKILL);
    env.vk.process.wait_exit(Duration::from_secs(5));
    // Grace period (20 s) + unreachable toleration (30 s) on the local plane.
    let pods = env.pods();
    wait_for(
        "taint eviction of the silent node's Pods",
        Duration::from_secs(150),
        || async {
            let mut evicted = 0;
            for n in names {
                match pods.get_opt(n).await.map_err(|e| e.to_string())? {
                    Some(p) if p.metadata.deletion_timestamp.is_none() => {}
                    _ => evicted += 1,
                }
            }
            if evicted == names.len() {
                Ok(())
            } else {
                Err(format!("{evicted} of 3 evicted"))
            }
        },
    )
    .await;
    assert_eq!(env.releases(), 0);
    env.vk.restart(&[
        &format!("--sandboxd-url={}", env.sim.base_url()),
        &format!("--sandboxd-token-file={}", env.token_file.display()),
    ]);
    for (n, (_, id)) in names.iter().zip(&ids) {
        let (_, now) = env.wait_running(n, Duration::from_secs(120)).await;
        assert_eq!(&now, id, "Sandbox {n} came back on another sandbox");
    }
    assert_eq!(env.releases(), 0, "the eviction storm released sandboxes");
    keeper.delete_node(&env.cluster.client).await;
    for n in names {
        assert_eq!(
            env.claims_for(&format!("{}/{n}", env.ns)),
            1,
            "{n} was claimed twice"
        );
    }
    env.finish().await;
}
