//! The agent-sandbox controller stand-in (e2e/sandbox-controller) on the
//! local control plane: the CRD installs, a Sandbox gets the Pod of
//! behaviour.md §10.2, the Pod is re-created when deleted, the Sandbox
//! status follows the Pod (§10.3), garbage collection removes the Pod with
//! the Sandbox, and suspend / shutdownTime / rejections behave.
//!
//! The Pods carry a scheduling gate so that no vk-sandbox node of a
//! concurrent test binds them: their status is set by hand here.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use sandbox_controller::{Options, Sandbox};
use serde_json::{Value, json};
use support::wait_for;

const RUNTIME: &str = "sandbox.cocoonstack.io/runtime";
const TEMPLATE: &str = "sandbox.cocoonstack.io/template";
const HASH_LABEL: &str = "agents.x-k8s.io/sandbox-name-hash";
const HOLD: &str = "e2e.vk-sandbox.dev/hold";

struct Fixture {
    cluster: support::TestCluster,
    ns: String,
    sandboxes: Api<Sandbox>,
    pods: Api<Pod>,
    _controller: sandbox_controller::ControllerHandle,
}

impl Fixture {
    async fn new(prefix: &str) -> Option<Fixture> {
        let cluster = support::cluster().await?;
        let _ = tracing_subscriber::fmt()
            .with_env_filter("info,sandbox_controller=debug")
            .with_test_writer()
            .try_init();
        sandbox_controller::crd::install(&cluster.client, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| {
                panic!("install the Sandbox CRD: {e}\n{}", support::cluster_logs())
            });
        let ns = cluster.namespace(prefix).await;
        let client: Client = cluster.client.clone();
        let controller = sandbox_controller::spawn(
            client.clone(),
            Options {
                namespace: Some(ns.clone()),
                ..Options::default()
            },
        );
        Some(Fixture {
            sandboxes: Api::namespaced(client.clone(), &ns),
            pods: Api::namespaced(client, &ns),
            cluster,
            ns,
            _controller: controller,
        })
    }

    async fn create(&self, name: &str, spec_extra: Value, template_spec_extra: Value) -> Sandbox {
        let mut template_spec = json!({
            "schedulingGates": [{"name": HOLD}],
            "containers": [{"name": "agent", "image": "base:24.04"}]
        });
        merge(&mut template_spec, template_spec_extra);
        let mut spec = json!({"podTemplate": {
            "metadata": {
                "labels": {"app": "agent", "agents.x-k8s.io/reserved": "x"},
                "annotations": {
                    RUNTIME: "sandboxd",
                    "sandbox.cocoonstack.io/net": "egress",
                    "extensions.agents.x-k8s.io/reserved": "x"
                }
            },
            "spec": template_spec
        }});
        merge(&mut spec, spec_extra);
        let sb: Sandbox = serde_json::from_value(json!({
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": name}, "spec": spec
        }))
        .expect("sandbox json");
        self.sandboxes
            .create(&PostParams::default(), &sb)
            .await
            .unwrap_or_else(|e| panic!("create Sandbox {name}: {e}"))
    }

    async fn wait_pod(&self, name: &str, not_uid: Option<&str>) -> Pod {
        wait_for(
            &format!("Pod {}/{name} (other than UID {not_uid:?})", self.ns),
            Duration::from_secs(30),
            || async {
                match self.pods.get_opt(name).await.map_err(|e| e.to_string())? {
                    Some(p) if p.metadata.uid.as_deref() != not_uid => Ok(p),
                    Some(_) => Err("still the old Pod".into()),
                    None => Err("no Pod".into()),
                }
            },
        )
        .await
    }

    async fn wait_pod_gone(&self, name: &str, timeout: Duration) {
        wait_for(
            &format!("Pod {}/{name} to be gone", self.ns),
            timeout,
            || async {
                match self.pods.get_opt(name).await.map_err(|e| e.to_string())? {
                    Some(p) => Err(format!(
                        "still there (deletionTimestamp {:?})",
                        p.metadata.deletion_timestamp
                    )),
                    None => Ok(()),
                }
            },
        )
        .await
    }

    /// Waits until the Sandbox's condition `type_` has `status` and `reason`.
    async fn wait_condition(&self, name: &str, type_: &str, status: &str, reason: &str) -> Sandbox {
        wait_for(
            &format!("Sandbox {name} {type_}={status} ({reason})"),
            Duration::from_secs(30),
            || async {
                let sb = self.sandboxes.get(name).await.map_err(|e| e.to_string())?;
                let c = sb
                    .status
                    .as_ref()
                    .and_then(|s| s.condition(type_))
                    .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
                match c {
                    Some((s, r, _)) if s == status && r == reason => Ok(sb),
                    other => Err(format!("{type_} is {other:?}")),
                }
            },
        )
        .await
    }

    async fn set_pod_status(&self, name: &str, status: Value) {
        self.pods
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .unwrap_or_else(|e| panic!("patch pods/status {name}: {e}"));
    }
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn provider_toleration() -> Toleration {
    Toleration {
        key: Some("virtual-kubelet.io/provider".into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Toleration::default()
    }
}

#[tokio::test]
async fn sandbox_pod_is_created_recreated_reported_and_collected() {
    let Some(f) = Fixture::new("sbctl").await else {
        return;
    };
    let sb = f.create("demo", json!({}), json!({})).await;
    let sb_uid = sb.metadata.uid.clone().expect("uid");

    // The Pod of §10.2.
    let pod = f.wait_pod("demo", None).await;
    assert_eq!(
        pod.metadata.owner_references.clone().unwrap_or_default(),
        vec![OwnerReference {
            api_version: "agents.x-k8s.io/v1beta1".into(),
            kind: "Sandbox".into(),
            name: "demo".into(),
            uid: sb_uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]
    );
    let labels = pod.labels();
    assert_eq!(labels.get("app").map(String::as_str), Some("agent"));
    // FNV-1a-32("demo"), computed independently.
    assert_eq!(labels.get(HASH_LABEL).map(String::as_str), Some("aefd3536"));
    assert!(
        !labels.contains_key("agents.x-k8s.io/reserved"),
        "{labels:?}"
    );
    let ann = pod.annotations();
    assert_eq!(ann.get(RUNTIME).map(String::as_str), Some("sandboxd"));
    assert_eq!(ann.get(TEMPLATE).map(String::as_str), Some("base:24.04"));
    assert_eq!(
        ann.get("sandbox.cocoonstack.io/net").map(String::as_str),
        Some("egress")
    );
    assert!(
        !ann.contains_key("extensions.agents.x-k8s.io/reserved"),
        "{ann:?}"
    );
    assert_eq!(
        ann.get("agents.x-k8s.io/propagated-labels")
            .map(String::as_str),
        Some("app")
    );
    assert_eq!(
        ann.get("agents.x-k8s.io/propagated-annotations")
            .map(String::as_str),
        Some("sandbox.cocoonstack.io/net,sandbox.cocoonstack.io/runtime")
    );
    let spec = pod.spec.clone().expect("pod spec");
    assert_eq!(
        spec.node_selector
            .clone()
            .unwrap_or_default()
            .get(RUNTIME)
            .map(String::as_str),
        Some("sandboxd")
    );
    let provider: Vec<_> = spec
        .tolerations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key.as_deref() == Some("virtual-kubelet.io/provider"))
        .collect();
    assert_eq!(provider, vec![provider_toleration()]);

    // Pending → NotReady; the selector names the hash label.
    let sb = f
        .wait_condition("demo", "Ready", "False", "PodPending")
        .await;
    let status = sb.status.expect("status");
    assert_eq!(
        status.selector.as_deref(),
        Some("agents.x-k8s.io/sandbox-name-hash=aefd3536")
    );
    assert!(status.pod_ips.is_empty());

    // Running and Ready but no podIPs: still NotReady (an empty owner_addr).
    f.set_pod_status(
        "demo",
        json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}),
    )
    .await;
    let sb = f.wait_condition("demo", "Ready", "False", "PodNoIPs").await;
    let msg = &sb
        .status
        .as_ref()
        .and_then(|s| s.condition("Ready"))
        .expect("Ready")
        .message;
    assert!(msg.contains("Ready but has no podIPs yet"), "{msg}");

    // With podIPs: Ready, and the IPs are published.
    f.set_pod_status(
        "demo",
        json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
               "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]}),
    )
    .await;
    let sb = f.wait_condition("demo", "Ready", "True", "PodReady").await;
    assert_eq!(
        sb.status.expect("status").pod_ips,
        vec!["10.0.0.5".to_string()]
    );

    // Pod deleted while the Sandbox lives: re-created under the same name.
    let old_uid = pod.metadata.uid.clone().expect("pod uid");
    f.pods
        .delete("demo", &DeleteParams::default())
        .await
        .expect("delete Pod");
    let again = f.wait_pod("demo", Some(&old_uid)).await;
    assert_ne!(again.metadata.uid.as_deref(), Some(old_uid.as_str()));
    assert_eq!(
        again.metadata.owner_references.clone().unwrap_or_default()[0].uid,
        sb_uid
    );
    let sb = f
        .wait_condition("demo", "Ready", "False", "PodPending")
        .await;
    assert!(sb.status.expect("status").pod_ips.is_empty());

    // Failed Pod → Ready=False and Finished=True, reason PodFailed.
    f.set_pod_status(
        "demo",
        json!({"phase": "Failed", "reason": "SandboxLeaseExpired", "message": "lease ended"}),
    )
    .await;
    f.wait_condition("demo", "Finished", "True", "PodFailed")
        .await;
    f.wait_condition("demo", "Ready", "False", "PodFailed")
        .await;

    // Sandbox deleted (background propagation): the garbage collector
    // deletes the Pod (unbound, so at once).
    f.sandboxes
        .delete("demo", &DeleteParams::background())
        .await
        .expect("delete Sandbox");
    f.wait_pod_gone("demo", Duration::from_secs(120)).await;
    assert!(
        f.sandboxes.get_opt("demo").await.expect("get").is_none(),
        "the Sandbox should be gone"
    );
    f.cluster.drop_namespace(&f.ns).await;
}

#[tokio::test]
async fn suspend_resume_shutdown_time_and_rejection() {
    let Some(f) = Fixture::new("sbctl2").await else {
        return;
    };

    // A pinned nodeName is refused in sandboxd mode: no Pod, Ready=False.
    f.create("pinned", json!({}), json!({"nodeName": "somewhere"}))
        .await;
    let sb = f
        .wait_condition("pinned", "Ready", "False", "PodRejected")
        .await;
    let msg = &sb
        .status
        .as_ref()
        .and_then(|s| s.condition("Ready"))
        .expect("Ready")
        .message;
    assert!(msg.contains("nodeName"), "{msg}");
    assert!(f.pods.get_opt("pinned").await.expect("get").is_none());

    // Suspended: the Pod goes; Running again: a new Pod.
    f.create("sus", json!({}), json!({})).await;
    let first = f.wait_pod("sus", None).await;
    f.sandboxes
        .patch(
            "sus",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"operatingMode": "Suspended"}})),
        )
        .await
        .expect("suspend");
    f.wait_pod_gone("sus", Duration::from_secs(30)).await;
    f.wait_condition("sus", "Suspended", "True", "Suspended")
        .await;
    f.wait_condition("sus", "Ready", "False", "Suspended").await;
    f.sandboxes
        .patch(
            "sus",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"operatingMode": "Running"}})),
        )
        .await
        .expect("resume");
    f.wait_pod("sus", first.metadata.uid.as_deref()).await;
    f.wait_condition("sus", "Suspended", "False", "Running")
        .await;

    // shutdownTime with policy Delete: the Pod, then the Sandbox, go.
    let at = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(4);
    f.create(
        "expiring",
        json!({"shutdownTime": at.to_string(), "shutdownPolicy": "Delete"}),
        json!({}),
    )
    .await;
    f.wait_pod("expiring", None).await;
    f.wait_pod_gone("expiring", Duration::from_secs(30)).await;
    wait_for(
        "Sandbox expiring deleted at its shutdownTime",
        Duration::from_secs(30),
        || async {
            match f
                .sandboxes
                .get_opt("expiring")
                .await
                .map_err(|e| e.to_string())?
            {
                None => Ok(()),
                Some(_) => Err("still there".into()),
            }
        },
    )
    .await;

    // shutdownTime already past, policy Retain (the default): no Pod, and
    // the Sandbox stays, Finished.
    f.create(
        "retained",
        json!({"shutdownTime": "2020-01-01T00:00:00Z"}),
        json!({}),
    )
    .await;
    f.wait_condition("retained", "Finished", "True", "ShutdownTimeReached")
        .await;
    assert!(f.pods.get_opt("retained").await.expect("get").is_none());
    f.cluster.drop_namespace(&f.ns).await;
}
