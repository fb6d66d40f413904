//! The stand-in (e2e/sandbox-controller) against the upstream agent-sandbox
//! controller: one scenario, run once with each on the local plane, and the
//! Pods they make and the Sandbox status they write compared step by step,
//! so the two cannot drift apart silently. The scenario covers what
//! vk-sandbox depends on: the Pod's name, labels and annotations (the Pod
//! contract passed through, reserved keys dropped), its one controller
//! ownerReference, its scheduling fields (the template's, untouched: no
//! mutator), metadata sync after a template change, re-creation under the
//! same name after the Pod is deleted, status from the Pod, suspension, and
//! the Pod's garbage collection on background and foreground deletion.
//!
//! The Pods carry a scheduling gate so that no vk-sandbox node binds them:
//! their status is set by hand. The upstream controller watches every
//! namespace, so the stand-in's turn holds the upstream leader Lease:
//! no upstream process (this binary's, another's, the demo's) reconciles
//! meanwhile.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use support::controller as ctl;
use support::{TestCluster, wait_for};

const HOLD: &str = "e2e.vk-sandbox.dev/hold";
const RUNTIME: &str = "sandbox.cocoonstack.io/runtime";

/// What one controller did, step by step.
type Transcript = Vec<(String, Value)>;

struct Run<'a> {
    cluster: &'a TestCluster,
    ns: String,
    sandboxes: Api<DynamicObject>,
    pods: Api<Pod>,
    out: Transcript,
}

fn template() -> Value {
    json!({
        "metadata": {
            "labels": {"app": "agent", "agents.x-k8s.io/reserved": "x"},
            "annotations": {
                RUNTIME: "sandboxd",
                "sandbox.cocoonstack.io/template": "base:24.04",
                "sandbox.cocoonstack.io/net": "egress",
                "extensions.agents.x-k8s.io/reserved": "x"
            }
        },
        "spec": {
            "schedulingGates": [{"name": HOLD}],
            "nodeSelector": {RUNTIME: "sandboxd"},
            "tolerations": [ctl::provider_toleration()],
            "containers": [{"name": "agent", "image": "base:24.04"}]
        }
    })
}

/// The fields of a Pod vk-sandbox depends on, with this run's namespace and
/// UIDs replaced by placeholders.
fn pod_view(p: &Pod, sandbox_uid: &str) -> Value {
    let spec = p.spec.clone().unwrap_or_default();
    let owners: Vec<Value> = p
        .owner_references()
        .iter()
        .map(|o| {
            json!({
                "apiVersion": o.api_version, "kind": o.kind, "name": o.name,
                "uid": if o.uid == sandbox_uid { "<sandbox uid>".to_string() } else { o.uid.clone() },
                "controller": o.controller, "blockOwnerDeletion": o.block_owner_deletion,
            })
        })
        .collect();
    let tolerations: Vec<Value> = spec
        .tolerations
        .unwrap_or_default()
        .iter()
        .map(|t| serde_json::to_value(t).unwrap_or_default())
        .collect();
    json!({
        "name": p.name_any(),
        "labels": p.labels(),
        "annotations": p.annotations(),
        "ownerReferences": owners,
        "nodeSelector": spec.node_selector,
        "tolerations": tolerations,
        "nodeName": spec.node_name,
        "schedulingGates": spec.scheduling_gates,
        "runtimeClassName": spec.runtime_class_name,
        "restartPolicy": spec.restart_policy,
        "containers": spec.containers.iter().map(|c| json!({"name": c.name, "image": c.image})).collect::<Vec<_>>(),
    })
}

/// A Sandbox's status and annotations without timestamps.
fn sandbox_view(sb: &DynamicObject) -> Value {
    let st = &sb.data["status"];
    let conditions: Vec<Value> = st["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            json!({"type": c["type"], "status": c["status"], "reason": c["reason"],
                   "message": c["message"], "observedGeneration": c["observedGeneration"]})
        })
        .collect();
    json!({
        "conditions": conditions,
        "podIPs": st["podIPs"],
        "nodeName": st["nodeName"],
        "selector": st["selector"],
        "service": st["service"],
        "serviceFQDN": st["serviceFQDN"],
        "annotations": sb.annotations(),
    })
}

impl<'a> Run<'a> {
    async fn new(cluster: &'a TestCluster, prefix: &str) -> Run<'a> {
        let ns = cluster.namespace(prefix).await;
        Run {
            sandboxes: Api::namespaced_with(cluster.client.clone(), &ns, &ctl::resource("Sandbox")),
            pods: Api::namespaced(cluster.client.clone(), &ns),
            cluster,
            ns,
            out: Vec::new(),
        }
    }

    fn record(&mut self, step: &str, v: Value) {
        self.out.push((step.to_string(), v));
    }

    async fn create(&self, name: &str) -> String {
        self.create_with(name, json!({})).await
    }

    /// A Sandbox with `extra` merged into its spec (a JSON merge patch:
    /// `null` removes).
    async fn create_with(&self, name: &str, extra: Value) -> String {
        let mut spec = json!({"podTemplate": template()});
        merge(&mut spec, extra);
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": name}, "spec": spec
        }))
        .expect("sandbox json");
        self.sandboxes
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("create Sandbox {name}: {e}"))
            .metadata
            .uid
            .expect("uid")
    }

    /// Waits for a Pod named `name` (another than UID `not_uid`) passing `ok`.
    async fn wait_pod(&self, name: &str, not_uid: Option<&str>, ok: impl Fn(&Pod) -> bool) -> Pod {
        wait_for(
            &format!("Pod {}/{name}", self.ns),
            Duration::from_secs(60),
            || async {
                match self.pods.get_opt(name).await.map_err(|e| e.to_string())? {
                    Some(p) if p.metadata.uid.as_deref() != not_uid && ok(&p) => Ok(p),
                    Some(p) => Err(format!("not yet: {:?}", pod_view(&p, ""))),
                    None => Err("no Pod".into()),
                }
            },
        )
        .await
    }

    async fn wait_pod_gone(&self, name: &str) {
        wait_for(
            &format!("Pod {}/{name} gone", self.ns),
            Duration::from_secs(120),
            || async {
                match self.pods.get_opt(name).await.map_err(|e| e.to_string())? {
                    None => Ok(()),
                    Some(p) => Err(format!(
                        "deletionTimestamp {:?}",
                        p.metadata.deletion_timestamp
                    )),
                }
            },
        )
        .await
    }

    /// Waits until Sandbox `name`'s condition `type_` has `status`.
    async fn wait_condition(&self, name: &str, type_: &str, status: &str) -> DynamicObject {
        wait_for(
            &format!("Sandbox {name} {type_}={status}"),
            Duration::from_secs(60),
            || async {
                let sb = self.sandboxes.get(name).await.map_err(|e| e.to_string())?;
                let ok = sb.data["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == type_ && c["status"] == status)
                    });
                if ok {
                    Ok(sb)
                } else {
                    Err(format!("status {}", sb.data["status"]))
                }
            },
        )
        .await
    }

    /// Waits until the Sandbox's status stops changing, then returns it
    /// (each controller may write it in several steps).
    async fn settled(&self, name: &str) -> DynamicObject {
        let mut last = Value::Null;
        let mut same = 0;
        loop {
            let sb = self.sandboxes.get(name).await.expect("get Sandbox");
            let v = sandbox_view(&sb);
            if v == last {
                same += 1;
                if same >= 4 {
                    return sb;
                }
            } else {
                same = 0;
                last = v;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
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

    async fn patch_sandbox(&self, name: &str, patch: Value) {
        self.sandboxes
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap_or_else(|e| panic!("patch Sandbox {name}: {e}"));
    }

    /// The scenario. The controller under test serves `self.ns` throughout.
    async fn scenario(&mut self) {
        let uid = self.create("demo").await;
        let pod = self.wait_pod("demo", None, |_| true).await;
        self.record("created Pod", pod_view(&pod, &uid));
        let sb = self.settled("demo").await;
        self.record("status: Pod Pending, unscheduled", sandbox_view(&sb));

        // Running, Ready, no podIPs; then with podIPs.
        self.set_pod_status(
            "demo",
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}),
        )
        .await;
        self.wait_condition("demo", "Ready", "False").await;
        let sb = self.settled("demo").await;
        self.record(
            "status: Running and Ready without podIPs",
            sandbox_view(&sb),
        );
        self.set_pod_status(
            "demo",
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                   "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]}),
        )
        .await;
        self.wait_condition("demo", "Ready", "True").await;
        let sb = self.settled("demo").await;
        self.record("status: Running, Ready, podIPs", sandbox_view(&sb));

        // A template metadata change is synced onto the Pod; vk-sandbox's own
        // annotation on the Pod is kept.
        self.pods
            .patch(
                "demo",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"sandbox.cocoonstack.io/claim-id": "sb_1"}}})),
            )
            .await
            .expect("annotate the Pod");
        self.patch_sandbox(
            "demo",
            json!({"spec": {"podTemplate": {"metadata": {
                "labels": {"app": "agent2", "team": "a"},
                "annotations": {"sandbox.cocoonstack.io/net": null, "sandbox.cocoonstack.io/size": "small"}
            }}}}),
        )
        .await;
        let synced = self
            .wait_pod("demo", None, |p| {
                p.labels().get("team").is_some_and(|v| v == "a")
            })
            .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let synced = self.pods.get("demo").await.unwrap_or(synced);
        self.record(
            "Pod after a template metadata change",
            pod_view(&synced, &uid),
        );

        // The Pod is deleted while the Sandbox lives: re-created, same name.
        let old = synced.metadata.uid.clone().expect("pod uid");
        self.pods
            .delete("demo", &DeleteParams::default())
            .await
            .expect("delete Pod");
        let again = self.wait_pod("demo", Some(&old), |_| true).await;
        self.record("re-created Pod", pod_view(&again, &uid));
        let sb = self.settled("demo").await;
        self.record("status: re-created Pod Pending", sandbox_view(&sb));

        // The Pod fails (a lease ended).
        self.set_pod_status(
            "demo",
            json!({"phase": "Failed", "reason": "SandboxLeaseExpired", "message": "lease ended"}),
        )
        .await;
        self.wait_condition("demo", "Finished", "True").await;
        let sb = self.settled("demo").await;
        self.record("status: Pod Failed", sandbox_view(&sb));

        // Suspended: the Pod goes; Running again: a new one.
        self.patch_sandbox("demo", json!({"spec": {"operatingMode": "Suspended"}}))
            .await;
        self.wait_pod_gone("demo").await;
        self.wait_condition("demo", "Suspended", "True").await;
        let sb = self.settled("demo").await;
        self.record("status: suspended", sandbox_view(&sb));
        self.patch_sandbox("demo", json!({"spec": {"operatingMode": "Running"}}))
            .await;
        let resumed = self.wait_pod("demo", Some(&old), |_| true).await;
        self.record("Pod after resuming", pod_view(&resumed, &uid));

        // shutdownTime already past, policy Retain (the default): no Pod,
        // the Sandbox stays, expired.
        self.create_with("expired", json!({"shutdownTime": "2020-01-01T00:00:00Z"}))
            .await;
        self.wait_condition("expired", "Ready", "False").await;
        let sb = self.settled("expired").await;
        let pod = self.pods.get_opt("expired").await.expect("get Pod");
        self.record(
            "shutdownTime past, Retain",
            json!({"status": sandbox_view(&sb), "pod": pod.is_some()}),
        );
        // shutdownTime a moment ahead, policy Delete: the Pod, then the
        // Sandbox, go once it passes.
        let at = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(5);
        self.create_with(
            "expiring",
            json!({"shutdownTime": at.to_string(), "shutdownPolicy": "Delete"}),
        )
        .await;
        self.wait_pod("expiring", None, |_| true).await;
        self.wait_pod_gone("expiring").await;
        wait_for(
            "Sandbox expiring deleted",
            Duration::from_secs(60),
            || async {
                match self
                    .sandboxes
                    .get_opt("expiring")
                    .await
                    .map_err(|e| e.to_string())?
                {
                    None => Ok(()),
                    Some(sb) => Err(format!("still there: {}", sb.data["status"])),
                }
            },
        )
        .await;
        self.record(
            "shutdownTime reached, Delete",
            json!("Pod and Sandbox gone"),
        );

        // Background deletion: the garbage collector takes the Pod.
        self.sandboxes
            .delete("demo", &DeleteParams::background())
            .await
            .expect("delete Sandbox");
        self.wait_pod_gone("demo").await;
        self.record("background deletion", json!("Pod gone"));

        // Foreground deletion, of a Sandbox whose template has no labels.
        let fg_uid = self
            .create_with("fg", json!({"podTemplate": {"metadata": {"labels": null}}}))
            .await;
        let fg = self.wait_pod("fg", None, |_| true).await;
        self.record("created Pod (second Sandbox)", pod_view(&fg, &fg_uid));
        self.sandboxes
            .delete("fg", &DeleteParams::foreground())
            .await
            .expect("delete Sandbox (foreground)");
        self.wait_pod_gone("fg").await;
        wait_for("Sandbox fg gone", Duration::from_secs(60), || async {
            match self
                .sandboxes
                .get_opt("fg")
                .await
                .map_err(|e| e.to_string())?
            {
                None => Ok(()),
                Some(_) => Err("still there".into()),
            }
        })
        .await;
        self.record("foreground deletion", json!("Pod and Sandbox gone"));
        self.cluster.drop_namespace(&self.ns).await;
    }
}

/// JSON merge patch semantics: objects merge, `null` removes, the rest
/// replaces.
fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                if v.is_null() {
                    a.remove(&k);
                } else {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (a, b) => *a = b,
    }
}

// ------------------------------------------------------------------ lease

const HOLDER: &str = "vk-sandbox-parity-test";

/// Takes the upstream controller's leader Lease (waiting until nobody holds
/// it) and renews it until dropped, so no upstream process reconciles.
struct LeaseHold {
    task: tokio::task::JoinHandle<()>,
    client: Client,
}

async fn take_lease(client: &Client) -> LeaseHold {
    let leases: Api<Lease> = Api::namespaced(client.clone(), ctl::LEASE_NAMESPACE);
    wait_for(
        "the agent-sandbox leader Lease to be free (stop any other upstream controller on this cluster, e.g. make demo-down)",
        Duration::from_secs(60),
        || async {
            if let Some(h) = ctl::lease_holder(client).await? {
                return Err(format!("held by {h}"));
            }
            let now = MicroTime(jiff::Timestamp::now());
            let spec = json!({"holderIdentity": HOLDER, "leaseDurationSeconds": 15,
                              "acquireTime": now, "renewTime": now});
            match leases.get_opt(ctl::LEASE_NAME).await.map_err(|e| e.to_string())? {
                None => {
                    let lease: Lease = serde_json::from_value(json!({
                        "metadata": {"name": ctl::LEASE_NAME}, "spec": spec
                    }))
                    .map_err(|e| e.to_string())?;
                    leases
                        .create(&PostParams::default(), &lease)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
                Some(mut lease) => {
                    // Conditional on the version read: a controller that
                    // takes it meanwhile wins, and we wait again.
                    lease.spec = Some(serde_json::from_value(spec).map_err(|e| e.to_string())?);
                    leases
                        .replace(ctl::LEASE_NAME, &PostParams::default(), &lease)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
            }
        },
    )
    .await;
    let renew = leases.clone();
    let task = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let patch = json!({"spec": {"renewTime": MicroTime(jiff::Timestamp::now())}});
            let _ = renew
                .patch(
                    ctl::LEASE_NAME,
                    &PatchParams::default(),
                    &Patch::Merge(patch),
                )
                .await;
        }
    });
    LeaseHold {
        task,
        client: client.clone(),
    }
}

impl LeaseHold {
    async fn release(self) {
        self.task.abort();
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), ctl::LEASE_NAMESPACE);
        let patch = json!({"spec": {"holderIdentity": "", "leaseDurationSeconds": 1}});
        let _ = leases
            .patch(
                ctl::LEASE_NAME,
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await;
    }
}

// ------------------------------------------------------------------ test

/// Every step where the two transcripts differ.
fn differences(upstream: &Transcript, stand_in: &Transcript) -> Vec<String> {
    let mut out = Vec::new();
    for (i, (step, up)) in upstream.iter().enumerate() {
        let Some((step2, si)) = stand_in.get(i) else {
            out.push(format!("step {step}: the stand-in's run ended early"));
            continue;
        };
        assert_eq!(step, step2, "the runs took different steps");
        if up != si {
            out.push(diff(step, up, si));
        }
    }
    out
}

fn diff(step: &str, up: &Value, si: &Value) -> String {
    let (Value::Object(a), Value::Object(b)) = (up, si) else {
        return format!("{step}: upstream {up} / stand-in {si}");
    };
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let mut lines = vec![format!("{step}:")];
    for k in keys {
        let (x, y) = (
            a.get(k).unwrap_or(&Value::Null),
            b.get(k).unwrap_or(&Value::Null),
        );
        if x != y {
            lines.push(format!("  {k}: upstream {x} / stand-in {y}"));
        }
    }
    lines.join("\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn stand_in_makes_the_pods_upstream_makes() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    if !ctl::upstream_or_skip("comparing the stand-in with the upstream controller") {
        return;
    }
    if !ctl::is_release_1_0(ctl::kind()) {
        // Before 1.0 upstream also set the Sandbox's pod-name annotation.
        eprintln!(
            "SKIPPED: the stand-in models agent-sandbox 1.0, not the {}",
            ctl::describe(ctl::kind())
        );
        return;
    }

    // Upstream: a process of this test's own, stopped (its Lease released)
    // before the stand-in's turn.
    let dir = support::vk::test_dir("parity");
    let upstream = ctl::Upstream::spawn(
        &cluster.client,
        &cluster.kubeconfig,
        &dir.join("agent-sandbox-controller.log"),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let mut up = Run::new(&cluster, "parity-up").await;
    up.scenario().await;
    upstream.stop();
    let up_log = upstream.log.clone();
    drop(upstream);

    // The stand-in (default mode: no runtime mutator), holding the Lease.
    let lease = take_lease(&cluster.client).await;
    let mut si = Run::new(&cluster, "parity-si").await;
    let handle = ctl::start_stand_in(&cluster.client, &si.ns, false).await;
    si.scenario().await;
    drop(handle);
    lease.release().await;

    let diffs = differences(&up.out, &si.out);
    let shown: BTreeMap<usize, &String> = diffs.iter().enumerate().collect();
    assert!(
        diffs.is_empty(),
        "the stand-in differs from upstream agent-sandbox (upstream log: {}):\n{}",
        up_log.display(),
        shown
            .values()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The scenario saw what vk-sandbox relies on (not merely "the same").
    let created = &up.out[0].1;
    assert_eq!(created["name"], "demo");
    assert_eq!(created["annotations"][RUNTIME], "sandboxd");
    assert_eq!(
        created["annotations"]["sandbox.cocoonstack.io/template"],
        "base:24.04"
    );
    assert_eq!(created["nodeSelector"][RUNTIME], "sandboxd");
    assert_eq!(
        created["ownerReferences"],
        json!([{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "name": "demo",
                "uid": "<sandbox uid>", "controller": true, "blockOwnerDeletion": true}])
    );
    assert!(created["labels"].get("agents.x-k8s.io/reserved").is_none());
    let synced = &up.out[4].1;
    assert_eq!(
        synced["annotations"]["sandbox.cocoonstack.io/claim-id"],
        "sb_1"
    );
}
