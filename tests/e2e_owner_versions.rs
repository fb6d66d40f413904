//! Owner references in any served version (docs/pod-contract.md, "Owner
//! references in any served version"), on a real plane: the Sandbox CRD
//! made to serve only `v1beta1` (as agent-sandbox 1.0 does), and a Pod
//! whose reference still names `v1alpha1` (made by an older controller).
//! Its Sandbox is read at `v1beta1`: the VM is preserved while the Sandbox
//! lives, and released once it is deleted, although the garbage collector
//! leaves such a Pod behind (the Pod is marked Failed, `SandboxOwnerGone`).
//!
//! The CRD change is cluster-wide: it is undone when the test ends, also
//! when it fails (and so is the test's own CRD, see `gc_forgets_v1alpha1`).
//! No Sandbox controller runs in this binary.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::vk::tail;
use support::wait_for;

const TOKEN: &str = "root-token-versions";
const CLAIM_ID: &str = "sandbox.cocoonstack.io/claim-id";

/// Sets whether the Sandbox CRD serves `v1alpha1`; returns that version's
/// index in the CRD.
async fn serve_v1alpha1(client: &Client, served: bool) -> usize {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut crd = crds
        .get(support::controller::SANDBOX_CRD)
        .await
        .expect("the Sandbox CRD");
    let index = crd
        .spec
        .versions
        .iter()
        .position(|v| v.name == "v1alpha1")
        .expect("the Sandbox CRD has v1alpha1");
    crd.spec.versions[index].served = served;
    crd.metadata.managed_fields = None;
    crds.replace(
        support::controller::SANDBOX_CRD,
        &PostParams::default(),
        &crd,
    )
    .await
    .expect("update the Sandbox CRD");
    wait_for(
        &format!("agents.x-k8s.io/v1alpha1 served={served}"),
        Duration::from_secs(30),
        || async {
            let req = http::Request::get("/apis/agents.x-k8s.io/v1alpha1")
                .body(Vec::new())
                .map_err(|e| e.to_string())?;
            let now = client.request_text(req).await.is_ok();
            if now == served {
                Ok(())
            } else {
                Err(format!("served {now}"))
            }
        },
    )
    .await;
    index
}

/// Serves `v1alpha1` again when the test ends, however it ends.
struct Restore {
    kubeconfig: PathBuf,
    index: usize,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let patch = format!(
            r#"[{{"op":"replace","path":"/spec/versions/{}/served","value":true}}]"#,
            self.index
        );
        let _ = std::process::Command::new(support::kubectl::path())
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args([
                "patch",
                "crd",
                support::controller::SANDBOX_CRD,
                "--type=json",
                "-p",
                &patch,
            ])
            .status();
        let _ = std::process::Command::new(support::kubectl::path())
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args([
                "delete",
                "crd",
                GC_RESET_CRD,
                "--ignore-not-found",
                "--wait=false",
            ])
            .status();
    }
}

/// A CRD of the test's own, made only to change the API's preferred
/// resources (see [`gc_forgets_v1alpha1`]).
const GC_RESET_CRD: &str = "pings.gc-reset.vk-sandbox.test";

/// Waits until the garbage collector leaves a `v1alpha1` reference alone.
/// A dependent whose owner the collector has not observed yet is checked by
/// reading the owner at the reference's version; while the collector's REST
/// mapper still maps `v1alpha1` (kube-controller-manager resets it only when
/// the preferred resources change, looked at every 30 s) that read is a 404
/// and the dependent is deleted as dangling: on a loaded shared plane the
/// test's Pod was deleted that way a second after it was made. A CRD of our
/// own changes the preferred resources; an unschedulable canary Pod with the
/// same reference left alone for 10 s shows the collector has the Sandbox
/// (or no `v1alpha1` mapping) before the real Pod is made.
async fn gc_forgets_v1alpha1(client: &Client, pods: &Api<Pod>, reference: serde_json::Value) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": GC_RESET_CRD},
        "spec": {
            "group": "gc-reset.vk-sandbox.test",
            "names": {"plural": "pings", "singular": "ping", "kind": "Ping", "listKind": "PingList"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .expect("crd json");
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create {GC_RESET_CRD}: {e}"),
    }
    let canary: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "gc-canary", "ownerReferences": [reference]},
        "spec": {
            "nodeSelector": {"vk-sandbox.test/nowhere": "true"},
            "containers": [{"name": "c", "image": "base:24.04"}]
        }
    }))
    .expect("canary json");
    wait_for(
        "the garbage collector leaves a v1alpha1 reference alone (its REST mapper reset)",
        Duration::from_secs(150),
        || async {
            if pods
                .get_opt("gc-canary")
                .await
                .map_err(|e| e.to_string())?
                .is_none()
            {
                pods.create(&PostParams::default(), &canary)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            tokio::time::sleep(Duration::from_secs(10)).await;
            match pods.get_opt("gc-canary").await.map_err(|e| e.to_string())? {
                Some(p) if p.metadata.deletion_timestamp.is_none() => Ok(()),
                _ => Err("the canary was collected: the mapper still has v1alpha1".to_string()),
            }
        },
    )
    .await;
    let _ = pods.delete("gc-canary", &DeleteParams::default()).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "depends on the garbage collector's REST mapper: on a plane up for hours (make test, twice on \
            2026-12-02) the collector deletes a Pod whose reference names the unserved v1alpha1 (it reads \
            the owner there and gets a 404), on fresh planes it leaves it; see gc_forgets_v1alpha1. \
            Run: cargo test --test e2e_owner_versions -- --ignored"]
async fn a_v1alpha1_reference_on_a_v1beta1_only_plane_is_decided_at_v1beta1() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    if !support::controller::upstream_or_skip("a v1alpha1 reference to the upstream Sandbox CRD") {
        return;
    }
    support::controller::install_crds(&cluster.client, &cluster.kubeconfig).await;
    let (sim, vk, _token_file) = support::vk::with_simulator(&cluster, "vk-ver", TOKEN).await;
    let ns = cluster.namespace("vk-ver").await;
    let index = serve_v1alpha1(&cluster.client, false).await;
    let _restore = Restore {
        kubeconfig: cluster.kubeconfig.clone(),
        index,
    };

    let sandboxes: Api<DynamicObject> = Api::namespaced_with(
        cluster.client.clone(),
        &ns,
        &support::controller::resource("Sandbox"),
    );
    let sb: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
        "metadata": {"name": "old"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "agent", "image": "base:24.04"}]}}}
    }))
    .expect("sandbox json");
    let uid = sandboxes
        .create(&PostParams::default(), &sb)
        .await
        .expect("create Sandbox")
        .metadata
        .uid
        .expect("uid");
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    let reference = json!({"apiVersion": "agents.x-k8s.io/v1alpha1", "kind": "Sandbox",
        "name": "old", "uid": uid, "controller": true});
    gc_forgets_v1alpha1(&cluster.client, &pods, reference.clone()).await;
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "old",
            "annotations": {
                "sandbox.cocoonstack.io/runtime": "sandboxd",
                "sandbox.cocoonstack.io/template": "base:24.04"},
            "ownerReferences": [reference]},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": vk.node},
            "tolerations": [support::controller::provider_toleration()],
            "containers": [{"name": "agent", "image": "base:24.04"}]
        }
    }))
    .expect("pod json");
    let running = |not_uid: Option<String>| {
        let pods = pods.clone();
        let vk = &vk;
        async move {
            wait_for("Pod old Running", Duration::from_secs(60), || async {
                let p = pods.get("old").await.map_err(|e| e.to_string())?;
                let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                let fresh = not_uid.is_none() || p.metadata.uid != not_uid;
                if fresh && phase.as_deref() == Some("Running") {
                    Ok(p)
                } else {
                    Err(format!("phase {phase:?}; log:\n{}", tail(&vk.logs(), 10)))
                }
            })
            .await
        }
    };
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create Pod");
    let first = running(None).await;
    let id = first
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CLAIM_ID).cloned())
        .expect("claim id");
    let released = format!("/v1/sandboxes/{id}/release");
    let releases = || {
        support::sim::releases(&sim)
            .iter()
            .filter(|r| r.path == released)
            .count()
    };

    // The Pod goes while its Sandbox lives: preserved, and adopted by the
    // next Pod of the key.
    pods.delete("old", &DeleteParams::default())
        .await
        .expect("delete Pod");
    wait_for("Pod old gone", Duration::from_secs(60), || async {
        match pods.get_opt("old").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err(tail(&vk.logs(), 10)),
        }
    })
    .await;
    assert_eq!(releases(), 0, "released while its Sandbox lives");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create the Pod again");
    let second = running(first.metadata.uid.clone()).await;
    assert_eq!(
        second
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CLAIM_ID).cloned()),
        Some(id.clone()),
        "the preserved sandbox was not adopted"
    );

    // The Sandbox goes; the garbage collector cannot resolve the Pod's
    // reference and leaves it: the VM is released all the same.
    sandboxes
        .delete("old", &DeleteParams::background())
        .await
        .expect("delete Sandbox");
    wait_for(
        "the VM of the deleted Sandbox released",
        Duration::from_secs(120),
        || async {
            if releases() == 1 {
                Ok(())
            } else {
                Err(tail(&vk.logs(), 10))
            }
        },
    )
    .await;
    let left = wait_for(
        "the Pod left behind marked Failed",
        Duration::from_secs(30),
        || async {
            let p = pods.get("old").await.map_err(|e| e.to_string())?;
            let s = p.status.clone().unwrap_or_default();
            if s.phase.as_deref() == Some("Failed") {
                Ok(s)
            } else {
                Err(format!("phase {:?}", s.phase))
            }
        },
    )
    .await;
    assert_eq!(left.reason.as_deref(), Some("SandboxOwnerGone"));
    assert!(sim.sim().claims().iter().all(|c| c.id != id));
    cluster.drop_namespace(&ns).await;
    vk.delete_node(&cluster.client).await;
}
