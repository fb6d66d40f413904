//! Owner references in any served version (docs/pod-contract.md, "Owner
//! references in any served version"), on a real kube-apiserver: the
//! Sandbox CRD serving only `v1beta1` (agent-sandbox 1.0's CRD as it is; an
//! older one's `v1alpha1` switched off), and Pods whose reference still
//! names `v1alpha1` (made by a controller before 1.0). Their Sandbox is read at `v1beta1`: each VM is preserved
//! while its Sandbox lives and released once it is deleted.
//!
//! What the garbage collector does with such a Pod depends on its REST
//! mapper, not on vk-sandbox: once the mapper no longer maps `v1alpha1` (it
//! is reset when the API's preferred resources change) the collector cannot
//! resolve the reference and leaves the Pod, even after its Sandbox is gone;
//! while it still maps it (a stale mapping: minutes, or hours on a
//! long-lived plane), it reads the owner at `v1alpha1`, gets a 404 and
//! deletes the Pod as dangling, even while its Sandbox lives. A real
//! cluster shows either. So the test runs on a scratch apiserver of its own
//! (`support::scratch`: no controllers, and the CRD change touches no other
//! test) and plays the collector's part both ways:
//! - `left`: the collector leaves the Pod. Deleted by hand while its Sandbox
//!   lives: preserved, and adopted by the next Pod; its Sandbox deleted:
//!   released, the Pod left marked Failed, `SandboxOwnerGone`.
//! - `collected`: the collector deletes the Pod as dangling (UID
//!   precondition, background propagation) while its Sandbox lives:
//!   preserved, vk-sandbox's upkeep reads the stored `v1alpha1` owner at
//!   `v1beta1` and keeps it; its Sandbox deleted: released with no Pod here.
//! - `collected-after`: its Sandbox deleted, then the Pod collected:
//!   released, once.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, PostParams, Preconditions, PropagationPolicy};
use kube::{Api, Client};
use serde_json::json;
use support::scratch::Scratch;
use support::vk::{VkUnderTest, tail};
use support::wait_for;

const TOKEN: &str = "root-token-versions";
const CLAIM_ID: &str = "sandbox.cocoonstack.io/claim-id";

/// Makes the Sandbox CRD serve `v1beta1` only: agent-sandbox 1.0's CRD
/// already does (its `v1alpha1` is gone); an older one's `v1alpha1` is
/// switched off. Returns once the apiserver no longer serves `v1alpha1`.
async fn serve_v1beta1_only(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut crd = crds
        .get(support::controller::SANDBOX_CRD)
        .await
        .expect("the Sandbox CRD");
    let served: Vec<&str> = crd
        .spec
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| v.name.as_str())
        .collect();
    assert!(
        served.contains(&"v1beta1"),
        "the Sandbox CRD does not serve v1beta1 (serves {served:?})"
    );
    if let Some(index) = crd.spec.versions.iter().position(|v| v.name == "v1alpha1") {
        crd.spec.versions[index].served = false;
        crd.metadata.managed_fields = None;
        crds.replace(
            support::controller::SANDBOX_CRD,
            &PostParams::default(),
            &crd,
        )
        .await
        .expect("update the Sandbox CRD");
    }
    wait_for(
        "agents.x-k8s.io/v1alpha1 no longer served",
        Duration::from_secs(30),
        || async {
            let req = http::Request::get("/apis/agents.x-k8s.io/v1alpha1")
                .body(Vec::new())
                .map_err(|e| e.to_string())?;
            match client.request_text(req).await {
                Err(kube::Error::Api(ae)) if ae.code == 404 => Ok(()),
                Ok(_) => Err("still served".to_string()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
}

/// The test's world on the scratch apiserver.
struct World {
    client: Client,
    ns: String,
    sim: sandboxd_sim::SimHandle,
    vk: VkUnderTest,
}

impl World {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn sandboxes(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            &self.ns,
            &support::controller::resource("Sandbox"),
        )
    }

    fn releases_of(&self, id: &str) -> usize {
        let path = format!("/v1/sandboxes/{id}/release");
        support::sim::releases(&self.sim)
            .iter()
            .filter(|r| r.path == path)
            .count()
    }

    /// A Sandbox `name` (made at `v1beta1`) and its Pod on this node whose
    /// controller reference names `v1alpha1`; returns that Pod.
    async fn sandbox_with_v1alpha1_pod(&self, name: &str) -> Pod {
        let sb: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": name},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "agent", "image": "base:24.04"}]}}}
        }))
        .expect("sandbox json");
        let uid = self
            .sandboxes()
            .create(&PostParams::default(), &sb)
            .await
            .unwrap_or_else(|e| panic!("create Sandbox {name}: {e}"))
            .metadata
            .uid
            .expect("uid");
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name,
                "annotations": {
                    "sandbox.cocoonstack.io/runtime": "sandboxd",
                    "sandbox.cocoonstack.io/template": "base:24.04"},
                "ownerReferences": [{"apiVersion": "agents.x-k8s.io/v1alpha1", "kind": "Sandbox",
                    "name": name, "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
            "spec": {
                // No scheduler runs on the scratch apiserver.
                "nodeName": self.vk.node,
                "tolerations": [support::controller::provider_toleration()],
                "containers": [{"name": "agent", "image": "base:24.04"}]
            }
        }))
        .expect("pod json")
    }

    /// Creates `pod` and waits for it Running; returns it and its claim.
    async fn run(&self, pod: &Pod) -> (Pod, String) {
        let name = pod.metadata.name.clone().expect("name");
        let pods = self.pods();
        pods.create(&PostParams::default(), pod)
            .await
            .unwrap_or_else(|e| panic!("create Pod {name}: {e}"));
        let running = wait_for(
            &format!("Pod {name} Running"),
            Duration::from_secs(60),
            || async {
                let p = pods.get(&name).await.map_err(|e| e.to_string())?;
                let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                if phase.as_deref() == Some("Running") && p.metadata.deletion_timestamp.is_none() {
                    Ok(p)
                } else {
                    Err(format!(
                        "phase {phase:?}; log:\n{}",
                        tail(&self.vk.logs(), 10)
                    ))
                }
            },
        )
        .await;
        let id = running
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CLAIM_ID).cloned())
            .expect("claim id");
        (running, id)
    }

    /// Deletes Pod `name`: by hand, or as the garbage collector deletes a
    /// dangling dependent (UID precondition, background propagation).
    async fn delete_pod(&self, pod: &Pod, as_collector: bool) {
        let name = pod.metadata.name.clone().expect("name");
        let dp = if as_collector {
            DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                preconditions: Some(Preconditions {
                    uid: pod.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..Default::default()
            }
        } else {
            DeleteParams::default()
        };
        self.pods()
            .delete(&name, &dp)
            .await
            .unwrap_or_else(|e| panic!("delete Pod {name}: {e}"));
    }

    async fn wait_pod_gone(&self, name: &str) {
        support::wait_pod_gone(&self.pods(), name, || tail(&self.vk.logs(), 10)).await;
    }

    async fn delete_sandbox(&self, name: &str) {
        self.sandboxes()
            .delete(name, &DeleteParams::background())
            .await
            .unwrap_or_else(|e| panic!("delete Sandbox {name}: {e}"));
    }

    async fn wait_released(&self, id: &str) {
        wait_for(
            &format!("sandbox {id} released"),
            Duration::from_secs(120),
            || async {
                match self.releases_of(id) {
                    0 => Err(tail(&self.vk.logs(), 10)),
                    _ => Ok(()),
                }
            },
        )
        .await;
        assert!(
            self.sim.sim().claims().iter().all(|c| c.id != id),
            "sandboxd still has {id}"
        );
    }

    /// Waits until vk-sandbox's upkeep has decided on claim `id` with no Pod
    /// of its key here, its owner read (the log's decision line).
    async fn wait_upkeep_kept(&self, id: &str) {
        wait_for(
            &format!("an upkeep turn of {id} with no Pod here"),
            Duration::from_secs(60),
            || async {
                let logs = self.vk.logs();
                let kept = logs.lines().any(|l| {
                    l.contains(&format!("sandbox={id}"))
                        && l.contains("upkeep turn why=NoPodHere decision=Wait")
                });
                if kept { Ok(()) } else { Err(tail(&logs, 10)) }
            },
        )
        .await;
    }
}

/// The collector leaves the Pod: preserved and adopted while the Sandbox
/// lives, released once it is deleted, the Pod left Failed.
async fn left(w: &World) {
    let pod = w.sandbox_with_v1alpha1_pod("left").await;
    let (first, id) = w.run(&pod).await;
    w.delete_pod(&first, false).await;
    w.wait_pod_gone("left").await;
    assert_eq!(
        w.releases_of(&id),
        0,
        "left: released while its Sandbox lives"
    );
    let (_, adopted) = w.run(&pod).await;
    assert_eq!(adopted, id, "left: the preserved sandbox was not adopted");

    w.delete_sandbox("left").await;
    w.wait_released(&id).await;
    let pods = w.pods();
    let status = wait_for(
        "the Pod left behind marked Failed",
        Duration::from_secs(30),
        || async {
            let p = pods.get("left").await.map_err(|e| e.to_string())?;
            let s = p.status.clone().unwrap_or_default();
            if s.phase.as_deref() == Some("Failed") {
                Ok(s)
            } else {
                Err(format!("phase {:?}", s.phase))
            }
        },
    )
    .await;
    assert_eq!(status.reason.as_deref(), Some("SandboxOwnerGone"));
    assert_eq!(w.releases_of(&id), 1, "left: released more than once");
}

/// The collector deletes the Pod as dangling while its Sandbox lives:
/// preserved (the upkeep reads the stored owner at `v1beta1`), released
/// once the Sandbox is deleted, with no Pod here.
async fn collected(w: &World) {
    let pod = w.sandbox_with_v1alpha1_pod("collected").await;
    let (first, id) = w.run(&pod).await;
    w.delete_pod(&first, true).await;
    w.wait_pod_gone("collected").await;
    w.wait_upkeep_kept(&id).await;
    assert_eq!(
        w.releases_of(&id),
        0,
        "collected: released while its Sandbox lives"
    );
    assert!(w.sim.sim().claims().iter().any(|c| c.id == id));

    w.delete_sandbox("collected").await;
    w.wait_released(&id).await;
    assert_eq!(w.releases_of(&id), 1, "collected: released more than once");
}

/// The Sandbox is deleted, then the collector deletes its Pod: released
/// once (by the Pod's deletion or the upkeep, whichever comes first).
async fn collected_after(w: &World) {
    let pod = w.sandbox_with_v1alpha1_pod("collected-after").await;
    let (first, id) = w.run(&pod).await;
    w.delete_sandbox("collected-after").await;
    w.delete_pod(&first, true).await;
    w.wait_pod_gone("collected-after").await;
    w.wait_released(&id).await;
    assert_eq!(
        w.releases_of(&id),
        1,
        "collected-after: released more than once"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_v1alpha1_reference_on_a_v1beta1_only_plane_is_decided_at_v1beta1() {
    if support::cluster().await.is_none() {
        return;
    }
    if !support::controller::upstream_or_skip("a v1alpha1 reference to the upstream Sandbox CRD") {
        return;
    }
    let Some(scratch) = Scratch::up("vk-ver").await else {
        return;
    };
    let cluster = &scratch.cluster;
    support::controller::install_crds(&cluster.client, &cluster.kubeconfig).await;
    let (sim, vk, _token_file) = support::vk::with_simulator(cluster, "vk-ver", TOKEN).await;
    serve_v1beta1_only(&cluster.client).await;
    // No controllers: the namespace's default ServiceAccount (which Pod
    // admission needs) is made here.
    let ns = format!("vk-ver-{}", support::suffix());
    let namespace: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )
    .expect("namespace json");
    Api::all(cluster.client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create namespace");
    let sa: ServiceAccount = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
    )
    .expect("sa json");
    Api::<ServiceAccount>::namespaced(cluster.client.clone(), &ns)
        .create(&PostParams::default(), &sa)
        .await
        .expect("create the default ServiceAccount");
    let w = World {
        client: cluster.client.clone(),
        ns,
        sim,
        vk,
    };
    tokio::join!(left(&w), collected(&w), collected_after(&w));
    w.vk.delete_node(&w.client).await;
}
