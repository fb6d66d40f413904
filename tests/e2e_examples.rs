//! manifests/examples/ as a user applies them, unchanged, with kubectl, on
//! the local plane with the upstream agent-sandbox controller and a
//! vk-sandbox node: the Sandbox's Pod goes Running; the SandboxTemplate and
//! SandboxWarmPool make the pool's Pods Running; the SandboxClaim adopts one
//! of them (Ready, its Pod Running on the VM it already had).
//!
//! The examples select any sandboxd node, so this binary holds one test and
//! first waits until no other sandboxd node is Ready (a test binary that
//! just finished may leave one behind for the node-monitor grace period).

mod support;

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DynamicObject, ListParams};
use kube::{Api, ResourceExt};
use support::controller as ctl;
use support::vk::{node_condition, tail};
use support::wait_for;

const TOKEN: &str = "examples-token";

/// `kubectl apply -f <file>` into `ns`, the file as it is in the repo.
async fn apply(kubeconfig: &Path, ns: &str, file: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let path = path.to_str().expect("a UTF-8 repository path");
    let (ok, out) = support::kubectl::run(kubeconfig, &["-n", ns, "apply", "-f", path]).await;
    assert!(ok, "kubectl apply -f {file}: {out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn example_files_apply_unchanged_and_run() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    if !ctl::upstream_or_skip("applying manifests/examples/ unchanged") {
        return;
    }
    ctl::install_crds(&cluster.client, &cluster.kubeconfig).await;
    let (sim, vk, _) = support::vk::with_simulator(&cluster, "vk-examples", TOKEN).await;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    wait_for(
        "no sandboxd node but this test's Ready (the examples may run on any)",
        Duration::from_secs(90),
        || async {
            let list = nodes
                .list(&ListParams::default().labels("sandbox.cocoonstack.io/runtime=sandboxd"))
                .await
                .map_err(|e| e.to_string())?;
            let others: Vec<String> = list
                .items
                .iter()
                .filter(|n| n.name_any() != vk.node)
                .filter(|n| node_condition(n, "Ready").as_deref() == Some("True"))
                .map(|n| n.name_any())
                .collect();
            if others.is_empty() {
                Ok(())
            } else {
                Err(format!("also Ready: {others:?} (a running `make demo`?)"))
            }
        },
    )
    .await;
    let ns = cluster.namespace("vk-examples").await;
    let controller = ctl::start(&cluster.client, &cluster.kubeconfig, &ns).await;
    assert!(controller.is_upstream());
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    let running_here = |p: &Pod| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(vk.node.as_str())
            && p.metadata.deletion_timestamp.is_none()
    };

    // sandbox.yaml: one Sandbox, its Pod Running here.
    apply(&cluster.kubeconfig, &ns, "manifests/examples/sandbox.yaml").await;
    wait_for(
        "the Pod of manifests/examples/sandbox.yaml Running",
        Duration::from_secs(90),
        || async {
            match pods.get_opt("demo").await.map_err(|e| e.to_string())? {
                Some(p) if running_here(&p) => Ok(()),
                Some(p) => Err(format!(
                    "status {:?}; vk-sandbox log:\n{}",
                    p.status,
                    tail(&vk.logs(), 10)
                )),
                None => Err("no Pod yet".into()),
            }
        },
    )
    .await;

    // sandboxtemplate.yaml + sandboxwarmpool.yaml: the pool's Pods Running.
    apply(
        &cluster.kubeconfig,
        &ns,
        "manifests/examples/sandboxtemplate.yaml",
    )
    .await;
    apply(
        &cluster.kubeconfig,
        &ns,
        "manifests/examples/sandboxwarmpool.yaml",
    )
    .await;
    let pool: DynamicObject = Api::<DynamicObject>::namespaced_with(
        cluster.client.clone(),
        &ns,
        &ctl::resource("SandboxWarmPool"),
    )
    .get("sandboxd-base")
    .await
    .expect("the example SandboxWarmPool");
    let replicas = pool.data["spec"]["replicas"].as_u64().expect("replicas") as usize;
    let pool_pods = || async {
        let list = pods
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        Ok::<Vec<Pod>, String>(
            list.items
                .into_iter()
                .filter(|p| p.name_any() != "demo" && running_here(p))
                .collect(),
        )
    };
    wait_for(
        "the example warm pool's Pods Running",
        Duration::from_secs(120),
        || async {
            let n = pool_pods().await?.len();
            if n == replicas {
                Ok(())
            } else {
                Err(format!(
                    "{n} of {replicas} Running; vk-sandbox log:\n{}",
                    tail(&vk.logs(), 10)
                ))
            }
        },
    )
    .await;
    let claims_before = sim.sim().claims().len();

    // sandboxclaim.yaml: Ready, its Sandbox's Pod Running on the VM it had.
    apply(
        &cluster.kubeconfig,
        &ns,
        "manifests/examples/sandboxclaim.yaml",
    )
    .await;
    let claims: Api<DynamicObject> =
        Api::namespaced_with(cluster.client.clone(), &ns, &ctl::resource("SandboxClaim"));
    let sandbox = wait_for(
        "the example SandboxClaim Ready",
        Duration::from_secs(120),
        || async {
            let c = claims.get("demo-claim").await.map_err(|e| e.to_string())?;
            let ready = c.data["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            let name = c.data["status"]["sandbox"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if ready && !name.is_empty() {
                Ok(name)
            } else {
                Err(format!("status {}", c.data["status"]))
            }
        },
    )
    .await;
    let pod = pods
        .get(&sandbox)
        .await
        .unwrap_or_else(|e| panic!("the claimed Sandbox's Pod {sandbox}: {e}"));
    assert!(running_here(&pod), "{:?}", pod.status);
    // Adopted from the pool: no claim to sandboxd for it beyond the pool's
    // replacement.
    let claimed = support::sim::claims_for_key(&sim, &format!("{ns}/{sandbox}"));
    assert_eq!(
        claimed, 1,
        "the claimed Sandbox's Pod was claimed {claimed} times"
    );
    wait_for("the pool refilled", Duration::from_secs(120), || async {
        let n = sim.sim().claims().len();
        if n == claims_before + 1 {
            Ok(())
        } else {
            Err(format!("{n} live VMs, want {}", claims_before + 1))
        }
    })
    .await;
    drop(controller);
    cluster.drop_namespace(&ns).await;
    vk.delete_node(&cluster.client).await;
}
