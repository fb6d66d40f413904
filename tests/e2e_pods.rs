//! Sandbox Pods end to end: the real local control plane, the sandboxd
//! simulator, and the vk-sandbox binary with the shipped RBAC. Pods are
//! created the way the agent-sandbox controller creates them (owned by a
//! `Sandbox`, carrying the Pod contract) so each test controls its timing;
//! tests/e2e_sandbox_path.rs drives the full Sandbox path with the Sandbox
//! controller.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, DynamicObject, PostParams};
use kube::{Api, Client};
use sandboxd_sim::SimHandle;
use serde_json::{Value, json};
use support::prometheus::Prometheus;
use support::vk::{StartOpts, VkUnderTest, tail};
use support::{TestCluster, wait_for};

const TOKEN: &str = "root-token-e2e";

struct Env {
    cluster: TestCluster,
    sim: SimHandle,
    vk: VkUnderTest,
    ns: String,
    token_file: PathBuf,
}

async fn setup(prefix: &str, extra: &[&str]) -> Option<Env> {
    setup_with_log(prefix, extra, None).await
}

async fn setup_with_log(prefix: &str, extra: &[&str], rust_log: Option<&str>) -> Option<Env> {
    setup_full(prefix, extra, rust_log, true).await
}

/// sandboxd in open mode (no token anywhere), vk-sandbox without a token.
async fn setup_open(prefix: &str) -> Option<Env> {
    setup_full(prefix, &[], None, false).await
}

async fn setup_full(
    prefix: &str,
    extra: &[&str],
    rust_log: Option<&str>,
    with_token: bool,
) -> Option<Env> {
    let cluster = support::cluster().await?;
    // The Pods here are made by hand; only the Sandbox kind must be served.
    support::controller::install_crds(&cluster.client, &cluster.kubeconfig).await;
    let token = if with_token { TOKEN } else { "" };
    let sim = support::sim::start(support::sim::config(token, &["base:24.04=8"])).await;
    // Spelled with the blanks a hand-written file may have.
    let token_file =
        support::sim::token_file(&support::vk::test_dir(prefix), &format!(" {TOKEN}\n"));
    let mut args = support::sim::vk_args(&sim, with_token.then_some(token_file.as_path()));
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let vk = VkUnderTest::start_with(
        &cluster,
        prefix,
        &args,
        StartOpts {
            rust_log,
            ..Default::default()
        },
    )
    .await;
    vk.wait_ready(&cluster.client, Duration::from_secs(30))
        .await;
    let ns = cluster.namespace(prefix).await;
    Some(Env {
        cluster,
        sim,
        vk,
        ns,
        token_file,
    })
}

impl Env {
    /// Starts vk-sandbox again (same node, state and ports) against the
    /// simulator with the token file, plus `extra`.
    fn restart_vk(&mut self, extra: &[&str]) {
        let mut args = support::sim::vk_args(&self.sim, Some(&self.token_file));
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.vk.restart(&args);
    }

    fn client(&self) -> Client {
        self.cluster.client.clone()
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client(), &self.ns)
    }

    fn sandboxes(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client(),
            &self.ns,
            &support::controller::resource("Sandbox"),
        )
    }

    async fn create_sandbox(&self, name: &str) -> String {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": name},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "agent", "image": "base:24.04"}]}}}
        }))
        .expect("sandbox json");
        self.sandboxes()
            .create(&PostParams::default(), &obj)
            .await
            .expect("create Sandbox")
            .metadata
            .uid
            .expect("uid")
    }

    /// A Pod as the agent-sandbox controller makes it, bound here.
    fn pod(
        &self,
        name: &str,
        owner_uid: Option<&str>,
        annotations: Value,
        restart_never: bool,
    ) -> Pod {
        let mut ann = json!({
            "sandbox.cocoonstack.io/runtime": "sandboxd",
            "sandbox.cocoonstack.io/template": "base:24.04",
        });
        if let (Some(a), Some(extra)) = (ann.as_object_mut(), annotations.as_object()) {
            for (k, v) in extra {
                a.insert(k.clone(), v.clone());
            }
        }
        let owners = owner_uid
            .map(|uid| {
                json!([{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "name": name,
                        "uid": uid, "controller": true, "blockOwnerDeletion": true}])
            })
            .unwrap_or(json!([]));
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": ann, "ownerReferences": owners},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": self.vk.node},
                "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"}],
                "restartPolicy": if restart_never { "Never" } else { "Always" },
                "containers": [{"name": "agent", "image": "base:24.04"}]
            }
        }))
        .expect("pod json")
    }

    async fn create_pod(&self, pod: &Pod) -> Pod {
        self.pods()
            .create(&PostParams::default(), pod)
            .await
            .expect("create Pod")
    }

    fn claims_for(&self, key: &str) -> usize {
        support::sim::claims_for_key(&self.sim, key)
    }

    /// Live sandboxes claimed for the Pod `key` (vk-sandbox tags its
    /// claim_refs with the Pod UID).
    fn claims_of(&self, key: &str) -> Vec<sandboxd_sim::ClaimRecord> {
        self.sim
            .sim()
            .claims()
            .into_iter()
            .filter(|c| vk_sandbox::pods::claim_ref::display(&c.claim_ref) == key)
            .collect()
    }

    fn releases(&self) -> Vec<sandboxd_sim::RequestRecord> {
        support::sim::releases(&self.sim)
    }

    async fn wait_phase(&self, name: &str, phase: &str, timeout: Duration) -> Pod {
        let pods = self.pods();
        wait_for(&format!("Pod {name} phase {phase}"), timeout, || async {
            let p = pods.get(name).await.map_err(|e| e.to_string())?;
            let st = p.status.clone().unwrap_or_default();
            if st.phase.as_deref() == Some(phase) {
                Ok(p)
            } else {
                Err(format!(
                    "phase {:?} reason {:?} message {:?}; vk-sandbox log:\n{}",
                    st.phase,
                    st.reason,
                    st.message,
                    tail(&self.vk.logs(), 20)
                ))
            }
        })
        .await
    }

    async fn wait_gone(&self, name: &str, uid: &str) {
        let pods = self.pods();
        wait_for(
            &format!("Pod {name} ({uid}) gone"),
            Duration::from_secs(30),
            || async {
                match pods.get_opt(name).await.map_err(|e| e.to_string())? {
                    Some(p) if p.metadata.uid.as_deref() == Some(uid) => Err(format!(
                        "still there (deletionTimestamp {:?}); vk-sandbox log:\n{}",
                        p.metadata.deletion_timestamp,
                        tail(&self.vk.logs(), 20)
                    )),
                    _ => Ok(()),
                }
            },
        )
        .await
    }

    /// Waits until the Pod's status reason is `reason`.
    async fn wait_reason(&self, name: &str, reason: &str) {
        let pods = self.pods();
        wait_for(
            &format!("{name} to report {reason}"),
            Duration::from_secs(30),
            || async {
                let p = pods.get(name).await.map_err(|e| e.to_string())?;
                match p.status.and_then(|s| s.reason) {
                    Some(r) if r == reason => Ok(()),
                    other => Err(format!("reason {other:?}")),
                }
            },
        )
        .await;
    }

    /// The ids the claims state holds, as a restart would load it: the
    /// snapshot and journal are copied aside and opened there.
    async fn effective_held_ids(&self) -> std::collections::HashSet<String> {
        let copy = tempfile::tempdir().expect("tempdir");
        let state = copy.path().join("claims.json");
        for (from, to) in [
            (self.vk.state_path.clone(), state.clone()),
            (
                PathBuf::from(format!("{}.journal", self.vk.state_path.display())),
                copy.path().join("claims.json.journal"),
            ),
        ] {
            if from.exists() {
                std::fs::copy(&from, &to).expect("copy the claims state");
            }
        }
        vk_sandbox::claims::ClaimsStore::open(&state)
            .await
            .expect("the claims state loads")
            .held_ids()
    }

    fn state_text(&self) -> String {
        let mut s = std::fs::read_to_string(&self.vk.state_path).unwrap_or_default();
        let journal = PathBuf::from(format!("{}.journal", self.vk.state_path.display()));
        s.push_str(&std::fs::read_to_string(journal).unwrap_or_default());
        s
    }

    /// Waits until the restarted process has registered again (its log
    /// says "virtual node ready" a second time) and is still running.
    async fn wait_restarted(&mut self) {
        let vk = &mut self.vk;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if vk.logs().matches("virtual node ready").count() >= 2 {
                break;
            }
            if let Some(st) = vk.process.wait_exit(Duration::from_millis(200)) {
                panic!(
                    "restarted vk-sandbox exited ({st:?}):\n{}",
                    tail(&vk.logs(), 30)
                );
            }
            assert!(
                std::time::Instant::now() < deadline,
                "restart not ready:\n{}",
                tail(&vk.logs(), 30)
            );
        }
    }

    async fn finish(self) {
        self.cluster.drop_namespace(&self.ns).await;
        self.vk.delete_node(&self.cluster.client).await;
    }
}

/// The release token of a live sandbox (from the simulator).
fn token_of(env: &Env, id: &str) -> String {
    env.sim
        .sim()
        .claims()
        .into_iter()
        .find(|c| c.id == id)
        .map(|c| c.token)
        .unwrap_or_else(|| panic!("{id} is not live"))
}

fn claim_id(p: &Pod) -> String {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("sandbox.cocoonstack.io/claim-id"))
        .cloned()
        .unwrap_or_default()
}

/// Claim → Running; a label change makes no call; a Pod deleted while its
/// owner lives → preserved → a same-name Pod adopts the sandbox.
#[tokio::test(flavor = "multi_thread")]
async fn claim_run_preserve_and_adopt() {
    let Some(env) = setup("vk-pods", &[]).await else {
        return;
    };
    let owner = env.create_sandbox("sb1").await;
    let created = env
        .create_pod(&env.pod("sb1", Some(&owner), json!({}), false))
        .await;
    let ns = env.ns.clone();
    let running = env
        .wait_phase("sb1", "Running", Duration::from_secs(30))
        .await;
    let id = claim_id(&running);
    assert!(id.starts_with("sb_"), "claim-id annotation: {id:?}");
    let st = running.status.clone().expect("status");
    assert_eq!(st.pod_ip.as_deref(), Some("10.0.0.5"));
    assert_eq!(st.host_ip.as_deref(), Some("10.0.0.5"));
    let cs = st.container_statuses.expect("container statuses");
    assert_eq!(cs.len(), 1);
    assert!(cs[0].ready);
    assert_eq!(cs[0].image_id, format!("sandboxd://{id}"));
    let conds = st.conditions.expect("conditions");
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    );
    // The claim request, exactly once, with the contract's fields.
    let claims: Vec<_> = env
        .sim
        .sim()
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/claim")
        .collect();
    assert_eq!(claims.len(), 1, "{claims:?}");
    let body: Value = serde_json::from_str(&claims[0].body).expect("claim body");
    assert_eq!(body["template"], "base:24.04");
    assert_eq!(body["ttl_seconds"], 86400);
    // The Pod key, tagged with the Pod's UID: only this node writes it.
    assert_eq!(
        body["claim_ref"],
        format!(
            "{ns}/sb1#vk-sandbox:{}",
            created.metadata.uid.as_deref().unwrap_or_default()
        )
    );
    assert_eq!(
        claims[0].authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    // Durable, and the token never reaches the Pod.
    assert!(env.state_text().contains(&id), "claims file lacks {id}");
    let token = env
        .sim
        .sim()
        .claims()
        .into_iter()
        .find(|c| c.id == id)
        .expect("sim claim")
        .token;
    let pod_json = serde_json::to_string(&running).expect("json");
    assert!(
        !pod_json.contains(&token),
        "release token leaked onto the Pod"
    );

    let m = env.vk.metrics().await;
    assert!(
        m.lines().any(|l| l.starts_with("vk_sandbox_claim_duration_seconds_count") && !l.ends_with(" 0")),
        "claim latency not observed:\n{m}"
    );
    assert!(
        m.lines().any(|l| l.starts_with("vk_sandbox_claim_provider_seconds_count") && !l.ends_with(" 0")),
        "provider share of the claim latency not observed:\n{m}"
    );
    // A label change makes no sandboxd call (the Node's info reads aside).
    let before = support::sim::requests_but_info(&env.sim).len();
    env.pods()
        .patch(
            "sb1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .expect("label");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        support::sim::requests_but_info(&env.sim).len(),
        before,
        "a label change called sandboxd"
    );

    // Delete the Pod while the Sandbox lives: preserved.
    env.pods()
        .delete("sb1", &DeleteParams::default())
        .await
        .expect("delete pod");
    env.wait_gone("sb1", created.metadata.uid.as_deref().unwrap_or_default())
        .await;
    assert!(
        env.releases().is_empty(),
        "released while the owner lives: {:?}",
        env.releases()
    );
    assert!(
        env.state_text().contains(&id),
        "claim dropped on Pod deletion"
    );
    // The controller recreates the Pod: it adopts the same sandbox.
    env.create_pod(&env.pod("sb1", Some(&owner), json!({}), false))
        .await;
    let again = env
        .wait_phase("sb1", "Running", Duration::from_secs(30))
        .await;
    assert_eq!(
        claim_id(&again),
        id,
        "the new Pod did not adopt the preserved sandbox"
    );
    assert_eq!(
        env.claims_for(&format!("{ns}/sb1")),
        1,
        "a second claim was made"
    );
    assert_eq!(
        again.status.and_then(|s| s.start_time),
        running.status.and_then(|s| s.start_time),
        "startTime must be the original claim time"
    );
    env.finish().await;
}

/// Release when the owner is gone, or when there is none.
#[tokio::test(flavor = "multi_thread")]
async fn release_when_owner_gone_or_absent() {
    let Some(env) = setup("vk-release", &[]).await else {
        return;
    };
    let owner = env.create_sandbox("sb2").await;
    let p = env
        .create_pod(&env.pod("sb2", Some(&owner), json!({}), false))
        .await;
    let bare = env
        .create_pod(&env.pod("bare", None, json!({}), false))
        .await;
    let running = env
        .wait_phase("sb2", "Running", Duration::from_secs(30))
        .await;
    let bare_running = env
        .wait_phase("bare", "Running", Duration::from_secs(30))
        .await;
    let id = claim_id(&running);
    let bare_id = claim_id(&bare_running);
    let token = |id: &str| {
        env.sim
            .sim()
            .claims()
            .into_iter()
            .find(|c| c.id == id)
            .expect("sim claim")
            .token
    };
    let (tok, bare_tok) = (token(&id), token(&bare_id));

    // Owner deleted first (orphan the Pod so GC does not race the test),
    // then the Pod.
    env.sandboxes()
        .delete(
            "sb2",
            &DeleteParams {
                propagation_policy: Some(kube::api::PropagationPolicy::Orphan),
                ..Default::default()
            },
        )
        .await
        .expect("delete sandbox");
    wait_for(
        "the Sandbox to be gone",
        Duration::from_secs(30),
        || async {
            match env
                .sandboxes()
                .get_opt("sb2")
                .await
                .map_err(|e| e.to_string())?
            {
                None => Ok(()),
                Some(_) => Err("still there".into()),
            }
        },
    )
    .await;
    env.pods()
        .delete("sb2", &DeleteParams::default())
        .await
        .expect("delete pod");
    env.pods()
        .delete("bare", &DeleteParams::default())
        .await
        .expect("delete bare pod");
    env.wait_gone("sb2", p.metadata.uid.as_deref().unwrap_or_default())
        .await;
    env.wait_gone("bare", bare.metadata.uid.as_deref().unwrap_or_default())
        .await;
    let releases = env.releases();
    let find = |id: &str| {
        releases
            .iter()
            .find(|r| r.path == format!("/v1/sandboxes/{id}/release"))
            .cloned()
    };
    let r = find(&id).expect("release for the owner-gone Pod");
    assert_eq!(
        r.authorization.as_deref(),
        Some(format!("Bearer {tok}").as_str())
    );
    let r = find(&bare_id).expect("release for the bare Pod");
    assert_eq!(
        r.authorization.as_deref(),
        Some(format!("Bearer {bare_tok}").as_str())
    );
    assert!(
        env.sim
            .sim()
            .claims()
            .iter()
            .all(|c| c.id != id && c.id != bare_id)
    );
    // The claims state as a restart would load it (snapshot plus journal,
    // read from a copy so the running process's files are untouched) no
    // longer holds either claim.
    wait_for(
        "the released claims to leave the claims state",
        Duration::from_secs(10),
        || async {
            let held = env.effective_held_ids().await;
            match [&id, &bare_id].iter().find(|i| held.contains(**i)) {
                Some(still) => Err(format!("{still} still held: {held:?}")),
                None => Ok(()),
            }
        },
    )
    .await;
    env.finish().await;
}

/// A Pod breaking the contract is refused before any claim; with
/// restartPolicy Never it goes Failed.
#[tokio::test(flavor = "multi_thread")]
async fn bad_contract_is_reported_without_claiming() {
    let Some(env) = setup("vk-contract", &[]).await else {
        return;
    };
    for (name, annotations, never) in [
        (
            "other-runtime",
            json!({"sandbox.cocoonstack.io/runtime": "vk-cocoon"}),
            false,
        ),
        (
            "no-template",
            json!({"sandbox.cocoonstack.io/template": ""}),
            false,
        ),
        (
            "bad-ttl",
            json!({"sandbox.cocoonstack.io/ttl-seconds": "-1"}),
            false,
        ),
        (
            "never",
            json!({"sandbox.cocoonstack.io/ttl-seconds": "abc"}),
            true,
        ),
    ] {
        env.create_pod(&env.pod(name, None, annotations, never))
            .await;
    }
    for name in ["other-runtime", "no-template", "bad-ttl"] {
        env.wait_phase(name, "Pending", Duration::from_secs(30))
            .await;
        env.wait_reason(name, "ProviderFailed").await;
    }
    let never = env
        .wait_phase("never", "Failed", Duration::from_secs(30))
        .await;
    let m = env.vk.metrics().await;
    assert!(
        m.lines().any(|l| l.starts_with(
            "vk_sandbox_reconcile_failures_total{controller=\"pods\",error=\"pod_create\"}"
        )),
        "failures by kind not counted:\n{m}"
    );
    assert_eq!(
        never.status.and_then(|s| s.reason).as_deref(),
        Some("ProviderFailed")
    );
    assert!(
        env.sim
            .sim()
            .requests()
            .iter()
            .all(|r| r.path != "/v1/claim"),
        "a claim was sent for an invalid Pod"
    );
    env.finish().await;
}

/// 429 then success; the Pod waits with NoWarmCapacity.
#[tokio::test(flavor = "multi_thread")]
async fn capacity_miss_is_retried_until_running() {
    let Some(env) = setup("vk-capacity", &[]).await else {
        return;
    };
    let fault: sandboxd_sim::Fault = serde_json::from_value(json!({
        "endpoint": "claim", "kind": "status", "status": 429, "times": 3,
        "error": "node claim quota reached: 12 live claims, cap 12"
    }))
    .expect("fault");
    env.sim.sim().arm_fault(fault).expect("arm");
    env.create_pod(&env.pod("waits", None, json!({}), false))
        .await;
    env.wait_reason("waits", "NoWarmCapacity").await;
    let p = env
        .wait_phase("waits", "Running", Duration::from_secs(60))
        .await;
    assert!(!claim_id(&p).is_empty());
    let n = env.claims_for(&format!("{}/waits", env.ns));
    assert!(
        n >= 4,
        "expected 3 refused claims then a granted one, saw {n}"
    );
    assert_eq!(
        env.sim.sim().claims().len(),
        1,
        "exactly one sandbox is held"
    );
    env.finish().await;
}

/// A restart adopts the persisted claim (after verification).
#[tokio::test(flavor = "multi_thread")]
async fn restart_adopts_persisted_claims() {
    let Some(mut env) = setup("vk-restart", &[]).await else {
        return;
    };
    let owner = env.create_sandbox("sb3").await;
    env.create_pod(&env.pod("sb3", Some(&owner), json!({}), false))
        .await;
    let running = env
        .wait_phase("sb3", "Running", Duration::from_secs(30))
        .await;
    let id = claim_id(&running);
    env.vk.process.signal(nix::sys::signal::Signal::SIGTERM);
    let st = env
        .vk
        .process
        .wait_exit(Duration::from_secs(10))
        .expect("exit after SIGTERM");
    assert!(st.success());
    // After a clean shutdown the state file is a plain Go claims.json.
    let text = std::fs::read_to_string(&env.vk.state_path).expect("state file");
    let parsed: Value = serde_json::from_str(&text).expect("claims.json is JSON");
    assert_eq!(parsed["claims"][format!("{}/sb3", env.ns)]["id"], id);
    env.restart_vk(&[]);
    env.wait_restarted().await;
    // The same Pod resumes its own claim: taken up again, announced by no
    // Event (a restart over many Pods must not flood the apiserver).
    let resumed = format!("pod={}/sb3", env.ns);
    wait_for(
        "the Pod's claim resumed after the restart",
        Duration::from_secs(30),
        || async {
            let logs = env.vk.logs();
            if logs
                .lines()
                .any(|l| l.contains("resumed the Pod's own claim") && l.contains(&resumed))
            {
                Ok(())
            } else {
                Err(tail(&logs, 10))
            }
        },
    )
    .await;
    let p = env
        .wait_phase("sb3", "Running", Duration::from_secs(30))
        .await;
    assert_eq!(claim_id(&p), id);
    let reasons = event_reasons(&events(&env).await, "sb3");
    assert_eq!(
        reasons
            .iter()
            .filter(|r| *r == "Claimed" || *r == "Adopted")
            .count(),
        1,
        "one Claimed event before the restart, nothing announced after it: {reasons:?}"
    );
    assert_eq!(
        env.claims_for(&format!("{}/sb3", env.ns)),
        1,
        "restart claimed again"
    );
    assert!(env.releases().is_empty());
    env.finish().await;
}

/// vk-sandbox restarts while sandboxd's listing is down (sandboxd still
/// starting, 503): every Pod already Running stays exactly as it is (same
/// resourceVersion: no status write, whatever its restartPolicy), no
/// Warning is recorded, the verification is one listing shared by all the
/// Pods (with back-off), not one per Pod; once sandboxd answers, each Pod
/// resumes its own claim, still without a write.
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_during_a_listing_outage_leaves_running_pods_untouched() {
    let Some(mut env) = setup("vk-outage", &[]).await else {
        return;
    };
    let names: Vec<String> = (0..6).map(|i| format!("sb-out{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let owner = env.create_sandbox(name).await;
        env.create_pod(&env.pod(name, Some(&owner), json!({}), i % 2 == 0))
            .await;
    }
    let mut before = std::collections::BTreeMap::new();
    for name in &names {
        let p = env
            .wait_phase(name, "Running", Duration::from_secs(60))
            .await;
        before.insert(name.clone(), p.metadata.resource_version.clone());
    }
    // One more status write per Pod may still be in flight (the echo of
    // our own write writes nothing): settle, then read the versions again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in &names {
        let p = env.pods().get(name).await.expect("get");
        before.insert(name.clone(), p.metadata.resource_version.clone());
    }
    env.vk.process.signal(nix::sys::signal::Signal::SIGTERM);
    env.vk
        .process
        .wait_exit(Duration::from_secs(10))
        .expect("exit after SIGTERM");
    env.sim
        .sim()
        .arm_fault(sandboxd_sim::Fault::status(
            sandboxd_sim::Endpoint::List,
            503,
        ))
        .expect("arm");
    let lists = |env: &Env| {
        env.sim
            .sim()
            .requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path == "/v1/sandboxes")
            .count()
    };
    let lists_before = lists(&env);
    env.restart_vk(&[]);
    env.wait_restarted().await;
    // Every Pod is reconciled: it fails its verification and is retried
    // (or, were it written, the check below says so).
    wait_for(
        "every Pod reconciled after the restart",
        Duration::from_secs(30),
        || async {
            let logs = env.vk.logs();
            let mut done = 0;
            for name in &names {
                let pod = format!("pod={}/{name}", env.ns);
                let failed = logs
                    .lines()
                    .any(|l| l.contains("reconcile failed") && l.contains(&pod));
                let rv = env.pods().get(name).await.map_err(|e| e.to_string())?;
                if failed || rv.metadata.resource_version != before[name] {
                    done += 1;
                }
            }
            if done == names.len() {
                Ok(())
            } else {
                Err(format!("{done} of {} reconciled", names.len()))
            }
        },
    )
    .await;
    let during = lists(&env) - lists_before;
    assert!(
        during < names.len(),
        "{during} listings during the outage for {} Pods",
        names.len()
    );
    let check_untouched = |when: &'static str| {
        let env = &env;
        let before = &before;
        async move {
            for (name, rv) in before {
                let p = env.pods().get(name).await.expect("get");
                assert_eq!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Running"),
                    "{name} {when}"
                );
                assert_eq!(
                    &p.metadata.resource_version,
                    rv,
                    "{name} was written {when}; vk-sandbox log:\n{}",
                    tail(&env.vk.logs(), 20)
                );
            }
        }
    };
    check_untouched("during the outage").await;
    // sandboxd answers again: each Pod resumes its claim, nothing written.
    env.sim.sim().clear_faults();
    wait_for(
        "every Pod resumed its own claim",
        Duration::from_secs(90),
        || async {
            let logs = env.vk.logs();
            let resumed = names
                .iter()
                .filter(|n| {
                    let pod = format!("pod={}/{n}", env.ns);
                    logs.lines()
                        .any(|l| l.contains("resumed the Pod's own claim") && l.contains(&pod))
                })
                .count();
            if resumed == names.len() {
                Ok(())
            } else {
                Err(format!("{resumed} of {} resumed", names.len()))
            }
        },
    )
    .await;
    check_untouched("after the outage").await;
    let warnings: Vec<_> = events(&env)
        .await
        .into_iter()
        // The scheduler's own Warnings (FailedScheduling while the Node
        // was still tainted not-ready) are not ours to judge here.
        .filter(|e| e.reporting_controller.as_deref() == Some("vk-sandbox"))
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(|e| (e.reason, e.note))
        .collect();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(env.releases().is_empty());
    env.finish().await;
}

fn event_reasons(events: &[k8s_openapi::api::events::v1::Event], pod: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod))
        .filter_map(|e| e.reason.clone())
        .collect()
}

async fn events(env: &Env) -> Vec<k8s_openapi::api::events::v1::Event> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client(), &env.ns);
    // A failed listing must fail the test, not pass a "no Warning" check.
    api.list(&Default::default())
        .await
        .expect("list Events")
        .items
}

/// A failing release keeps the claim and the Pod
/// Terminating until sandboxd recovers; a Pod that never got a claim goes
/// at once without a sandboxd call.
#[tokio::test(flavor = "multi_thread")]
async fn failed_release_is_retried_and_unclaimed_pods_go_at_once() {
    let Some(env) = setup("vk-relfail", &[]).await else {
        return;
    };
    let p = env
        .create_pod(&env.pod("bare", None, json!({}), false))
        .await;
    let running = env
        .wait_phase("bare", "Running", Duration::from_secs(30))
        .await;
    let id = claim_id(&running);
    let fault: sandboxd_sim::Fault = serde_json::from_value(json!({
        "endpoint": "release", "kind": "release_fail_keep"
    }))
    .expect("fault");
    env.sim.sim().arm_fault(fault).expect("arm");
    env.pods()
        .delete("bare", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for(
        "a ProviderDeleteFailed event",
        Duration::from_secs(30),
        || async {
            let reasons = event_reasons(&events(&env).await, "bare");
            if reasons.iter().any(|r| r == "ProviderDeleteFailed") {
                Ok(())
            } else {
                Err(format!("events so far: {reasons:?}"))
            }
        },
    )
    .await;
    let still = env
        .pods()
        .get("bare")
        .await
        .expect("the Pod stays while release fails");
    assert!(still.metadata.deletion_timestamp.is_some());
    assert!(
        env.sim.sim().claims().iter().any(|c| c.id == id),
        "sandbox gone despite the 500"
    );
    assert!(
        env.state_text().contains(&id),
        "claim dropped although release failed"
    );
    env.sim.sim().clear_faults();
    env.wait_gone("bare", p.metadata.uid.as_deref().unwrap_or_default())
        .await;
    assert!(
        env.sim.sim().claims().iter().all(|c| c.id != id),
        "not released after recovery"
    );

    // A Pod that never got a claim goes at once, without a sandboxd call.
    let before = support::sim::requests_but_info(&env.sim).len();
    let pending = env
        .create_pod(&env.pod(
            "pending",
            None,
            json!({"sandbox.cocoonstack.io/template": ""}),
            false,
        ))
        .await;
    env.wait_phase("pending", "Pending", Duration::from_secs(30))
        .await;
    env.pods()
        .delete("pending", &DeleteParams::default())
        .await
        .expect("delete");
    env.wait_gone(
        "pending",
        pending.metadata.uid.as_deref().unwrap_or_default(),
    )
    .await;
    let calls: Vec<_> = support::sim::requests_but_info(&env.sim)
        .into_iter()
        .skip(before)
        .collect();
    assert!(
        calls.is_empty(),
        "sandboxd was called for a Pod that never had a claim: {calls:?}"
    );
    env.finish().await;
}

/// 32 Pods at once; every claim recorded.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_creates_all_recorded() {
    let Some(mut env) = setup("vk-burst", &[]).await else {
        return;
    };
    env.sim
        .sim()
        .set_pool(sandboxd_sim::config::PoolConfig::parse_spec("base:24.04=40").expect("pool"))
        .expect("pool");
    let names: Vec<String> = (0..32).map(|i| format!("p{i}")).collect();
    let creates = names.iter().map(|n| {
        let pod = env.pod(n, None, json!({}), false);
        let pods = env.pods();
        async move {
            pods.create(&PostParams::default(), &pod)
                .await
                .expect("create")
        }
    });
    futures::future::join_all(creates).await;
    for n in &names {
        env.wait_phase(n, "Running", Duration::from_secs(60)).await;
    }
    env.vk.process.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        env.vk
            .process
            .wait_exit(Duration::from_secs(10))
            .is_some_and(|s| s.success())
    );
    let text = std::fs::read_to_string(&env.vk.state_path).expect("claims.json");
    let parsed: Value = serde_json::from_str(&text).expect("JSON");
    let rows = parsed["claims"].as_object().map(|m| m.len()).unwrap_or(0);
    assert_eq!(rows, 32, "claims.json after the burst: {text}");
    assert_eq!(env.sim.sim().claims().len(), 32);
    env.finish().await;
}

/// A persisted claim sandboxd no longer lists is dropped at
/// restart and the Pod gets a fresh claim.
#[tokio::test(flavor = "multi_thread")]
async fn restart_drops_claims_sandboxd_forgot() {
    let Some(mut env) = setup("vk-forgot", &[]).await else {
        return;
    };
    env.create_pod(&env.pod("p", None, json!({}), false)).await;
    let first = claim_id(
        &env.wait_phase("p", "Running", Duration::from_secs(30))
            .await,
    );
    env.vk.process.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        env.vk
            .process
            .wait_exit(Duration::from_secs(10))
            .is_some_and(|s| s.success())
    );
    env.sim
        .sim()
        .restart(std::slice::from_ref(&first))
        .expect("sim restart dropping the row");
    env.restart_vk(&[]);
    env.wait_restarted().await;
    let pods = env.pods();
    wait_for(
        "a fresh claim for the Pod",
        Duration::from_secs(60),
        || async {
            let p = pods.get("p").await.map_err(|e| e.to_string())?;
            let id = claim_id(&p);
            let running = p.status.and_then(|s| s.phase).as_deref() == Some("Running");
            if running && !id.is_empty() && id != first {
                Ok(())
            } else {
                Err(format!(
                    "claim {id:?} running {running}; log:\n{}",
                    tail(&env.vk.logs(), 15)
                ))
            }
        },
    )
    .await;
    env.finish().await;
}

/// The lease watch marks a Pod Failed only once sandboxd no longer lists
/// its sandbox, and publishes nothing while sandboxd cannot be listed.
#[tokio::test(flavor = "multi_thread")]
async fn lease_expiry_confirmed_by_sandboxd() {
    let Some(env) = setup("vk-lease", &[]).await else {
        return;
    };
    // sandboxd's clock two hours behind: a 10-minute lease is already past
    // by wall-clock time, but sandboxd still lists it: not Failed.
    let past = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(2);
    env.sim.sim().patch_clock(
        serde_json::from_value(json!({"set": past.to_string(), "frozen": true})).expect("clock"),
    );
    env.create_pod(&env.pod(
        "p",
        None,
        json!({"sandbox.cocoonstack.io/ttl-seconds": "600"}),
        false,
    ))
    .await;
    let running = env
        .wait_phase("p", "Running", Duration::from_secs(30))
        .await;
    let id = claim_id(&running);
    // One lease tick (30 s) with the sandbox still listed: still Running.
    tokio::time::sleep(Duration::from_secs(35)).await;
    let p = env.pods().get("p").await.expect("pod");
    assert_eq!(
        p.status.and_then(|s| s.phase).as_deref(),
        Some("Running"),
        "Failed while still listed"
    );
    // sandboxd reaps it: the next tick marks the Pod Failed.
    env.sim
        .sim()
        .patch_clock(serde_json::from_value(json!({"advance_seconds": 7200})).expect("clock"));
    env.sim.sim().reap();
    // While sandboxd cannot be listed, a tick publishes nothing.
    let list_down: sandboxd_sim::Fault =
        serde_json::from_value(json!({"endpoint": "list", "kind": "status", "status": 503}))
            .expect("fault");
    env.sim.sim().arm_fault(list_down).expect("arm");
    tokio::time::sleep(Duration::from_secs(35)).await;
    let p = env.pods().get("p").await.expect("pod");
    assert_eq!(
        p.status.and_then(|s| s.phase).as_deref(),
        Some("Running"),
        "Failed published on a failed listing"
    );
    env.sim.sim().clear_faults();
    let failed = env.wait_phase("p", "Failed", Duration::from_secs(45)).await;
    let st = failed.status.expect("status");
    assert_eq!(st.reason.as_deref(), Some("SandboxLeaseExpired"));
    let cs = st.container_statuses.expect("container statuses");
    let term = cs[0]
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("terminated");
    assert_eq!(term.exit_code, 1);
    assert_eq!(term.reason.as_deref(), Some("SandboxLeaseExpired"));
    // The dead VM's address and the Running conditions are gone.
    assert_eq!(
        (
            st.pod_ip.as_deref(),
            st.host_ip.as_deref(),
            st.pod_ips.as_ref().map(Vec::len),
            st.conditions.as_ref().map(Vec::len)
        ),
        (None, None, None, None),
        "an expired Pod keeps no address or conditions"
    );
    assert!(
        env.state_text().contains(&id),
        "the lease watch must not drop the claim"
    );
    env.finish().await;
}

/// A claim whose reply was lost is returned (node token) before the Pod is
/// claimed for again; nothing else is touched.
#[tokio::test(flavor = "multi_thread")]
async fn lost_claim_reply_is_returned_before_claiming_again() {
    let Some(env) = setup("vk-lost", &[]).await else {
        return;
    };
    let fault: sandboxd_sim::Fault =
        serde_json::from_value(json!({"endpoint": "claim", "kind": "drop_after", "times": 1}))
            .expect("fault");
    env.sim.sim().arm_fault(fault).expect("arm");
    env.create_pod(&env.pod("p", None, json!({}), false)).await;
    let running = env
        .wait_phase("p", "Running", Duration::from_secs(60))
        .await;
    let id = claim_id(&running);
    let key = format!("{}/p", env.ns);
    let live: Vec<_> = env.claims_of(&key);
    assert_eq!(live.len(), 1, "exactly one sandbox for the Pod: {live:?}");
    assert_eq!(live[0].id, id);
    let releases = env.releases();
    assert_eq!(
        releases.len(),
        1,
        "the stray was returned once: {releases:?}"
    );
    assert_ne!(releases[0].path, format!("/v1/sandboxes/{id}/release"));
    assert_eq!(
        releases[0].authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str()),
        "strays are returned with the node token"
    );
    env.finish().await;
}

/// Neighbours on one sandboxd (docs/reliability.md, "Lost claim replies
/// among neighbours"): sandbox-operator's aggregated
/// apiserver claims with `claim_ref = <namespace>/<Sandbox>`, the key of
/// the Pod this node then serves. Those sandboxes are never released: not
/// when they are in the start-up listing, not when that Pod is claimed for,
/// not when a Pod under such a key needs a fresh claim after a lost reply,
/// not when the Pods go. The real lost reply is still returned.
#[tokio::test(flavor = "multi_thread")]
async fn neighbours_sandboxes_are_never_released() {
    let Some(mut env) = setup("vk-neigh", &[]).await else {
        return;
    };
    let neighbour = vk_sandbox::sandboxd::SandboxdClient::builder(env.sim.base_url())
        .token(Some(TOKEN.into()))
        .build()
        .expect("neighbour client");
    let mut foreign = Vec::new();
    for name in ["a", "b"] {
        let c = neighbour
            .claim(&vk_sandbox::sandboxd::ClaimRequest {
                template: "base:24.04".into(),
                claim_ref: format!("{}/{name}", env.ns),
                ..Default::default()
            })
            .await
            .expect("neighbour claim");
        foreign.push(c.id);
    }
    // Restart so the foreign rows are in vk-sandbox's start-up listing.
    env.vk.process.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        env.vk
            .process
            .wait_exit(Duration::from_secs(10))
            .is_some_and(|s| s.success())
    );
    env.restart_vk(&[]);
    env.wait_restarted().await;

    // Pod a: a plain fresh claim under a key a neighbour also uses.
    let a = env.create_pod(&env.pod("a", None, json!({}), false)).await;
    let running_a = env
        .wait_phase("a", "Running", Duration::from_secs(60))
        .await;
    // Pod b: its first claim's reply is lost, so it is claimed for again
    // after looking for strays under its key.
    let fault: sandboxd_sim::Fault =
        serde_json::from_value(json!({"endpoint": "claim", "kind": "drop_after", "times": 1}))
            .expect("fault");
    env.sim.sim().arm_fault(fault).expect("arm");
    let b = env.create_pod(&env.pod("b", None, json!({}), false)).await;
    let running_b = env
        .wait_phase("b", "Running", Duration::from_secs(60))
        .await;
    let b_uid = b.metadata.uid.clone().unwrap_or_default();
    let strays: Vec<String> = env.releases().iter().map(|r| r.path.clone()).collect();
    assert_eq!(
        strays.len(),
        1,
        "exactly the lost reply was returned: {strays:?}"
    );
    assert!(
        !strays[0].contains(&claim_id(&running_b))
            && !foreign.iter().any(|f| strays[0].contains(f)),
        "the returned stray is neither b's sandbox nor a neighbour's: {strays:?}"
    );
    // Both bare Pods go: their own sandboxes are released, nothing else.
    for (name, pod) in [("a", &a), ("b", &b)] {
        env.pods()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete pod");
        env.wait_gone(name, pod.metadata.uid.as_deref().unwrap_or_default())
            .await;
    }
    let released: Vec<String> = env.releases().iter().map(|r| r.path.clone()).collect();
    assert_eq!(released.len(), 3, "{released:?}");
    for id in [claim_id(&running_a), claim_id(&running_b)] {
        assert!(
            released.contains(&format!("/v1/sandboxes/{id}/release")),
            "{id} not released: {released:?}"
        );
    }
    let live: Vec<String> = env.sim.sim().claims().into_iter().map(|c| c.id).collect();
    for f in &foreign {
        assert!(live.contains(f), "the neighbour's sandbox {f} was released");
        assert!(
            !released.iter().any(|r| r.contains(f.as_str())),
            "a release was sent for the neighbour's sandbox {f}"
        );
    }
    assert!(
        env.claims_of(&format!("{}/b", env.ns))
            .iter()
            .all(|c| !c.claim_ref.contains(&b_uid)),
        "b's own sandboxes are all gone"
    );
    env.finish().await;
}

/// One `pods/status` write per Running Pod: the write that makes it
/// Running, and nothing after it while nothing changes (the echo of our own
/// write, a resync and the claim time read back are not drift).
#[tokio::test(flavor = "multi_thread")]
async fn one_status_write_per_running_pod() {
    let Some(env) = setup("vk-writes", &[]).await else {
        return;
    };
    const PODS: usize = 8;
    // Spread over a second, so the claim times fall at every fraction of
    // a second (a time rounded where the store truncates differs for half
    // of them).
    for i in 0..PODS {
        env.create_pod(&env.pod(&format!("w{i}"), None, json!({}), false))
            .await;
        tokio::time::sleep(Duration::from_millis(1000 / PODS as u64)).await;
    }
    for i in 0..PODS {
        env.wait_phase(&format!("w{i}"), "Running", Duration::from_secs(60))
            .await;
    }
    // Long enough for every echo and a late second write to have come.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let text = env.vk.metrics().await;
    let written = support::metric(
        &text,
        "vk_sandbox_pod_status_writes_total{result=\"written\"}",
    );
    assert_eq!(
        written,
        Some(PODS as f64),
        "status writes for {PODS} Pods going Running:\n{}",
        text.lines()
            .filter(|l| l.starts_with("vk_sandbox_pod_status_writes_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    env.finish().await;
}

/// sandboxd in open mode (no token; releasing by id is impossible): Pods
/// claim and run, a lost reply does not hold the Pod back (its stray is
/// left to its deadline, never released), and Pods that go release their
/// own sandboxes with their own tokens.
#[tokio::test(flavor = "multi_thread")]
async fn open_mode_end_to_end() {
    let Some(env) = setup_open("vk-open").await else {
        return;
    };
    let a = env.create_pod(&env.pod("a", None, json!({}), false)).await;
    let running_a = env
        .wait_phase("a", "Running", Duration::from_secs(60))
        .await;
    let fault: sandboxd_sim::Fault =
        serde_json::from_value(json!({"endpoint": "claim", "kind": "drop_after", "times": 1}))
            .expect("fault");
    env.sim.sim().arm_fault(fault).expect("arm");
    let b = env.create_pod(&env.pod("b", None, json!({}), false)).await;
    let running_b = env
        .wait_phase("b", "Running", Duration::from_secs(60))
        .await;
    let b_key = format!("{}/b", env.ns);
    assert_eq!(env.claims_of(&b_key).len(), 2, "the stray and b's sandbox");
    assert!(
        env.releases().is_empty(),
        "nothing can be released by id in open mode"
    );
    let own = [
        (claim_id(&running_a), token_of(&env, &claim_id(&running_a))),
        (claim_id(&running_b), token_of(&env, &claim_id(&running_b))),
    ];
    for (name, pod) in [("a", &a), ("b", &b)] {
        env.pods()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete pod");
        env.wait_gone(name, pod.metadata.uid.as_deref().unwrap_or_default())
            .await;
    }
    let releases = env.releases();
    assert_eq!(releases.len(), 2, "{releases:?}");
    for (id, tok) in own {
        let r = releases
            .iter()
            .find(|r| r.path == format!("/v1/sandboxes/{id}/release"))
            .unwrap_or_else(|| panic!("{id} not released: {releases:?}"));
        assert_eq!(
            r.authorization.as_deref(),
            Some(format!("Bearer {tok}").as_str())
        );
    }
    let left = env.claims_of(&b_key);
    assert_eq!(left.len(), 1, "the stray is left to its deadline: {left:?}");
    env.finish().await;
}

/// kill -9 in the middle of a burst of 50 creates: after the restart every
/// Pod runs, every live sandbox is held by exactly one Pod, and the only
/// releases are strays returned with the node token.
#[tokio::test(flavor = "multi_thread")]
async fn kill9_mid_burst_loses_and_leaks_nothing() {
    let Some(mut env) = setup("vk-kill9", &[]).await else {
        return;
    };
    env.sim
        .sim()
        .set_pool(sandboxd_sim::config::PoolConfig::parse_spec("base:24.04=60").expect("pool"))
        .expect("pool");
    // Slow claims widen the window in which a claim is granted but not yet
    // recorded.
    let slow: sandboxd_sim::Fault =
        serde_json::from_value(json!({"endpoint": "claim", "kind": "slow", "ms": 150}))
            .expect("fault");
    env.sim.sim().arm_fault(slow).expect("arm");
    let mut owners = Vec::new();
    for i in 0..50 {
        owners.push(env.create_sandbox(&format!("b{i}")).await);
    }
    let creates = (0..50).map(|i| {
        let pod = env.pod(&format!("b{i}"), Some(&owners[i]), json!({}), false);
        let pods = env.pods();
        async move {
            pods.create(&PostParams::default(), &pod)
                .await
                .expect("create")
        }
    });
    futures::future::join_all(creates).await;
    // Kill once some claims are granted and others are in flight.
    wait_for("a few claims granted", Duration::from_secs(60), || async {
        let n = env.sim.sim().claims().len();
        if n >= 5 {
            Ok(())
        } else {
            Err(format!("{n} granted"))
        }
    })
    .await;
    env.vk.process.signal(nix::sys::signal::Signal::SIGKILL);
    env.vk.process.wait_exit(Duration::from_secs(5));
    env.sim.sim().clear_faults();
    env.restart_vk(&[]);
    env.wait_restarted().await;
    let mut held = std::collections::HashSet::new();
    for i in 0..50 {
        let p = env
            .wait_phase(&format!("b{i}"), "Running", Duration::from_secs(120))
            .await;
        assert!(held.insert(claim_id(&p)), "two Pods share a sandbox");
    }
    let live: std::collections::HashSet<String> =
        env.sim.sim().claims().into_iter().map(|c| c.id).collect();
    assert_eq!(
        live, held,
        "live sandboxes and Pods' claims differ (leak or loss)"
    );
    eprintln!(
        "kill9: {} Pods running on {} sandboxes; {} strays returned; {} claim requests",
        held.len(),
        live.len(),
        env.releases().len(),
        env.sim
            .sim()
            .requests()
            .iter()
            .filter(|r| r.path == "/v1/claim")
            .count()
    );
    for r in env.releases() {
        assert_eq!(
            r.authorization.as_deref(),
            Some(format!("Bearer {TOKEN}").as_str()),
            "a release other than a stray return: {r:?}"
        );
        let id = r
            .path
            .trim_start_matches("/v1/sandboxes/")
            .trim_end_matches("/release");
        assert!(!held.contains(id), "a held sandbox was released: {id}");
    }
    env.finish().await;
}

/// An owner held by a finalizer (deletionTimestamp set) is
/// tearing down → release; an owner the shipped RBAC may not read (403) →
/// preserve.
#[tokio::test(flavor = "multi_thread")]
async fn owner_in_teardown_releases_unreadable_owner_preserves() {
    let Some(env) = setup("vk-owner", &[]).await else {
        return;
    };
    // An owner held by a finalizer.
    let held: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
        "metadata": {"name": "held", "finalizers": ["e2e.vk-sandbox.dev/hold"]},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "agent", "image": "base:24.04"}]}}}
    }))
    .expect("sandbox");
    let held_uid = env
        .sandboxes()
        .create(&PostParams::default(), &held)
        .await
        .expect("create")
        .metadata
        .uid
        .expect("uid");
    let p1 = env
        .create_pod(&env.pod("held", Some(&held_uid), json!({}), false))
        .await;
    // An owner the shipped RBAC may not read (403): the namespace's default
    // ServiceAccount (it exists, so the garbage collector leaves the Pod).
    let sa_uid =
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(env.client(), &env.ns)
            .get("default")
            .await
            .expect("default ServiceAccount")
            .metadata
            .uid
            .expect("uid");
    let mut p2 = env.pod("rs-owned", None, json!({}), false);
    p2.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ServiceAccount", "name": "default",
            "uid": sa_uid, "controller": true
        }))
        .expect("owner ref"),
    ]);
    let p2 = env.create_pod(&p2).await;
    let id1 = claim_id(
        &env.wait_phase("held", "Running", Duration::from_secs(30))
            .await,
    );
    let id2 = claim_id(
        &env.wait_phase("rs-owned", "Running", Duration::from_secs(30))
            .await,
    );

    env.sandboxes()
        .delete(
            "held",
            &DeleteParams {
                propagation_policy: Some(kube::api::PropagationPolicy::Orphan),
                ..Default::default()
            },
        )
        .await
        .expect("delete held Sandbox");
    env.pods()
        .delete("held", &DeleteParams::default())
        .await
        .expect("delete");
    env.pods()
        .delete("rs-owned", &DeleteParams::default())
        .await
        .expect("delete");
    env.wait_gone("held", p1.metadata.uid.as_deref().unwrap_or_default())
        .await;
    env.wait_gone("rs-owned", p2.metadata.uid.as_deref().unwrap_or_default())
        .await;
    let released: Vec<String> = env.releases().into_iter().map(|r| r.path).collect();
    assert!(
        released.contains(&format!("/v1/sandboxes/{id1}/release")),
        "owner in teardown: no release ({released:?})"
    );
    assert!(
        !released.contains(&format!("/v1/sandboxes/{id2}/release")),
        "released although the owner could not be read"
    );
    assert!(env.sim.sim().claims().iter().any(|c| c.id == id2));
    assert!(
        env.state_text().contains(&id2),
        "claim dropped on a failed owner lookup"
    );
    // Let the held Sandbox go.
    let _ = env
        .sandboxes()
        .patch(
            "held",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await;
    env.finish().await;
}

/// sandboxd does not answer within the client's 10 s: the claim fails
/// (outcome unknown), the sandbox sandboxd made meanwhile is returned with
/// the node token, and the retry runs the Pod on exactly one sandbox.
#[tokio::test(flavor = "multi_thread")]
async fn unanswered_claim_times_out_and_its_sandbox_is_returned() {
    let Some(env) = setup("vk-slow", &[]).await else {
        return;
    };
    let slow: sandboxd_sim::Fault = serde_json::from_value(
        json!({"endpoint": "claim", "kind": "slow", "ms": 14000, "times": 1}),
    )
    .expect("fault");
    env.sim.sim().arm_fault(slow).expect("arm");
    let started = std::time::Instant::now();
    env.create_pod(&env.pod("p", None, json!({}), false)).await;
    let running = env
        .wait_phase("p", "Running", Duration::from_secs(60))
        .await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(10) && took < Duration::from_secs(25),
        "the first claim should fail at the client's 10 s timeout; Running after {took:?}"
    );
    let failures: Vec<String> = events(&env)
        .await
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("ProviderCreateFailed")
                && e.action.as_deref() == Some("ProviderFailed")
        })
        .filter_map(|e| e.note)
        .collect();
    assert!(
        failures
            .iter()
            .any(|n| n.contains("timed out") && n.contains("outcome unknown")),
        "no ProviderFailed event for the timed-out claim: {failures:?}"
    );
    let id = claim_id(&running);
    let live = env.claims_of(&format!("{}/p", env.ns));
    assert_eq!(live.len(), 1, "one sandbox for the Pod: {live:?}");
    assert_eq!(live[0].id, id);
    assert_eq!(
        env.releases().len(),
        1,
        "the timed-out claim's sandbox was returned once"
    );
    env.finish().await;
}

/// A real Prometheus scrapes the admin port; the target is up
/// and the reconcile and claim metrics move when a Pod is claimed; the
/// exposition passes `promtool check metrics`.
#[tokio::test(flavor = "multi_thread")]
async fn prometheus_scrapes_the_admin_port() {
    let Some(env) = setup("vk-prom", &[]).await else {
        return;
    };
    let target = format!("127.0.0.1:{}", env.vk.process.admin_port);
    let Some(prom) = Prometheus::start(&env.vk.dir, &target).await else {
        return;
    };
    prom.wait_value("up{job=\"vk-sandbox\"}", |v| v == 1.0)
        .await;
    let claimed = "vk_sandbox_claim_duration_seconds_count{job=\"vk-sandbox\"}";
    assert_eq!(
        prom.wait_value(claimed, |_| true).await,
        0.0,
        "claims before any Pod"
    );
    let runs = "vk_sandbox_reconcile_runs_total{controller=\"pods\",job=\"vk-sandbox\"}";
    let before = prom
        .query(runs)
        .await
        .expect("query")
        .first()
        .map(|s| s.1)
        .unwrap_or(0.0);

    let owner = env.create_sandbox("prom").await;
    env.create_pod(&env.pod("prom", Some(&owner), json!({}), false))
        .await;
    env.wait_phase("prom", "Running", Duration::from_secs(30))
        .await;
    prom.wait_value(claimed, |v| v >= 1.0).await;
    prom.wait_value(runs, |v| v > before).await;
    prom.wait_value(
        "vk_sandbox_sandboxd_requests_total{endpoint=\"claim\",status=\"ok\"}",
        |v| v >= 1.0,
    )
    .await;
    prom.wait_value("vk_sandbox_claims{state=\"settled\"}", |v| v == 1.0)
        .await;
    prom.wait_value("vk_sandbox_pods{phase=\"Running\"}", |v| v == 1.0)
        .await;
    prom.wait_value(
        "vk_sandbox_claims_store_write_duration_seconds_count{result=\"success\"}",
        |v| v >= 1.0,
    )
    .await;
    prom.wait_value("vk_sandbox_lease_renewals_total{result=\"success\"}", |v| {
        v >= 1.0
    })
    .await;

    // promtool lints the exposition format and naming conventions.
    let text = env.vk.metrics().await;
    check_monitoring_manifests(&prom, &text, &env.vk.dir).await;
    let (ok, out) = support::prometheus::promtool(&["check", "metrics"], &text);
    assert!(ok, "promtool check metrics failed:\n{out}");
    env.finish().await;
}

/// The shipped dashboard and alerts only name metrics the binary exposes,
/// every expression is valid PromQL (queried on the live server), and the
/// rules pass `promtool check rules`.
async fn check_monitoring_manifests(prom: &Prometheus, exposition: &str, dir: &std::path::Path) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("manifests/monitoring");
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("grafana-dashboard.json")).expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(|e| e.replace("$instance", ".*")))
        .collect();
    let rule: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root.join("prometheusrule.yaml")).expect("rules"),
    )
    .expect("the PrometheusRule is YAML");
    let rules_file = dir.join("rules.yml");
    std::fs::write(
        &rules_file,
        serde_saphyr::to_string(&rule["spec"]).expect("yaml"),
    )
    .expect("write rules");
    let rules_file = rules_file.to_str().expect("a UTF-8 temporary path");
    let (ok, out) = support::prometheus::promtool(&["check", "rules", rules_file], "");
    assert!(ok, "promtool check rules: {out}");
    for group in rule["spec"]["groups"].as_array().expect("groups") {
        for r in group["rules"].as_array().expect("rules") {
            exprs.push(r["expr"].as_str().expect("expr").to_string());
        }
    }
    assert!(exprs.len() >= 10, "only {} expressions", exprs.len());
    // Where families are registered: src/metrics/ and the gauges sampled
    // at scrape time beside what they measure.
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources = vec![src.join("pods/gauges.rs"), src.join("claims/gauge.rs")];
    for entry in std::fs::read_dir(src.join("metrics")).expect("src/metrics/") {
        sources.push(entry.expect("src/metrics/ entry").path());
    }
    let metrics_source: String = sources
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    for expr in &exprs {
        if let Err(e) = prom.query(expr).await {
            panic!("invalid PromQL in manifests/monitoring: {expr}: {e}");
        }
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("vk_sandbox_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            let family = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(&name);
            // Label vectors with no series yet are not exposed: those must
            // at least be registered under that name.
            assert!(
                exposition.contains(&format!("# TYPE {family} "))
                    || metrics_source.contains(&format!("\"{family}\"")),
                "manifests/monitoring names {name}, which vk-sandbox does not expose"
            );
        }
    }
}

/// No credential ever reaches the logs — the sandboxd node token,
/// every claim's release token, and the ServiceAccount bearer token — over
/// claim, failed and retried release, restart with the claims reloaded (in
/// JSON log format), adoption and release, at trace level.
#[tokio::test(flavor = "multi_thread")]
async fn tokens_never_logged() {
    let Some(mut env) = setup_with_log("vk-tokens", &[], Some("trace")).await else {
        return;
    };
    let owner = env.create_sandbox("tok").await;
    env.create_pod(&env.pod("tok", Some(&owner), json!({}), false))
        .await;
    env.wait_phase("tok", "Running", Duration::from_secs(30))
        .await;
    env.vk.process.signal(nix::sys::signal::Signal::SIGKILL);
    env.vk.process.wait_exit(Duration::from_secs(10));
    env.restart_vk(&["--log-format=json"]);
    env.wait_restarted().await;
    env.wait_phase("tok", "Running", Duration::from_secs(30))
        .await;
    // One failed release (sandboxd keeps the sandbox), then the retry.
    let fault: sandboxd_sim::Fault = serde_json::from_value(json!({
        "endpoint": "release", "kind": "release_fail_keep", "times": 1
    }))
    .expect("fault");
    env.sim.sim().arm_fault(fault).expect("arm");
    env.sandboxes()
        .delete("tok", &DeleteParams::foreground())
        .await
        .expect("delete Sandbox");
    wait_for(
        "the release to succeed",
        Duration::from_secs(60),
        || async {
            let ok = env
                .releases()
                .iter()
                .filter(|r| r.status == Some(204))
                .count();
            if ok >= 1 {
                Ok(())
            } else {
                Err(format!("releases {:?}", env.releases()))
            }
        },
    )
    .await;
    assert!(
        env.releases().len() >= 2,
        "the failed release was not retried"
    );

    let mut secrets: Vec<String> = vec![TOKEN.to_string()];
    for r in env.sim.sim().requests() {
        if let Some(t) = r
            .authorization
            .as_deref()
            .and_then(|a| a.strip_prefix("Bearer "))
        {
            secrets.push(t.to_string());
        }
    }
    secrets.extend(env.sim.sim().claims().into_iter().map(|c| c.token));
    // Parsed, not grepped: a YAML writer may fold a long token.
    let kubeconfig: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&env.vk.kubeconfig).expect("kubeconfig"))
            .expect("the kubeconfig is YAML");
    let sa_token = kubeconfig["users"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|u| u["user"]["token"].as_str())
        .map(str::to_string)
        .expect("the ServiceAccount kubeconfig carries a token");
    secrets.push(sa_token);
    secrets.sort();
    secrets.dedup();
    assert!(
        secrets.len() >= 3,
        "too few secrets to check: {}",
        secrets.len()
    );
    let logs = env.vk.logs();
    assert!(
        logs.lines().count() > 100,
        "trace logging produced {} lines",
        logs.lines().count()
    );
    assert!(logs.contains("\"level\":"), "the restart did not log JSON");
    assert!(
        !logs.contains('\u{1b}'),
        "terminal colour codes in a log written to a file"
    );
    for secret in &secrets {
        assert!(secret.len() >= 8, "secret too short to grep: {secret:?}");
        if let Some(line) = logs.lines().find(|l| l.contains(secret.as_str())) {
            panic!("a credential ({}…) was logged:\n{line}", &secret[..4]);
        }
    }
    env.finish().await;
}

/// `kubectl cordon` / `uncordon` with `--drain-sandboxd-on-cordon` (issue
/// 39 part 3): sandboxd is drained and undrained with the Node, a Sandbox
/// made meanwhile waits unscheduled and goes Running after the uncordon,
/// and the Running sandbox is not touched (no release, no write to its
/// Pod). A drain sandboxd's operator made is neither taken over by a
/// cordon nor undone by the uncordon.
#[tokio::test]
async fn cordon_drains_sandboxd_and_uncordon_undrains_it() {
    use kube::api::{Patch, PatchParams};
    use vk_sandbox::cordon::DRAINED_FOR_CORDON;
    let Some(env) = setup("vk-cordon", &["--drain-sandboxd-on-cordon"]).await else {
        return;
    };
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client());
    let node = env.vk.node.clone();
    let cordon = |on: bool| {
        let nodes = nodes.clone();
        let node = node.clone();
        async move {
            nodes
                .patch(
                    &node,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"unschedulable": on}})),
                )
                .await
                .expect("cordon");
        }
    };
    // The Node's record and sandboxd's drain, as the test waits on them.
    let state = || {
        let nodes = nodes.clone();
        let node = node.clone();
        let sim = std::sync::Arc::clone(env.sim.sim());
        async move {
            let n = nodes.get(&node).await.map_err(|e| e.to_string())?;
            let ours = n
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key(DRAINED_FOR_CORDON);
            Ok::<_, String>((ours, sim.config().draining))
        }
    };
    let wait_state = |want: (bool, bool)| {
        let state = &state;
        let vk = &env.vk;
        async move {
            wait_for(
                &format!("(our record, sandboxd draining) = {want:?}"),
                Duration::from_secs(20),
                || async {
                    let got = state().await?;
                    if got == want {
                        Ok(())
                    } else {
                        Err(format!("{got:?}; log:\n{}", tail(&vk.logs(), 15)))
                    }
                },
            )
            .await
        }
    };

    let owner = env.create_sandbox("sb1").await;
    env.create_pod(&env.pod("sb1", Some(&owner), json!({}), false))
        .await;
    let running = env
        .wait_phase("sb1", "Running", Duration::from_secs(30))
        .await;
    let rv = running.metadata.resource_version.clone();

    cordon(true).await;
    wait_state((true, true)).await;
    // Cordoned: a new Sandbox's Pod is not placed here.
    let owner2 = env.create_sandbox("sb2").await;
    env.create_pod(&env.pod("sb2", Some(&owner2), json!({}), false))
        .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let waiting = env.pods().get("sb2").await.expect("sb2");
    assert_eq!(
        waiting.spec.as_ref().and_then(|s| s.node_name.clone()),
        None,
        "a Pod was bound to a cordoned node"
    );
    assert_eq!(env.claims_for(&format!("{}/sb2", env.ns)), 0);

    cordon(false).await;
    wait_state((false, false)).await;
    env.wait_phase("sb2", "Running", Duration::from_secs(30))
        .await;
    // The Running sandbox: untouched through the round trip.
    let after = env.pods().get("sb1").await.expect("sb1");
    assert_eq!(after.metadata.resource_version, rv, "sb1's Pod was written");
    assert!(env.releases().is_empty(), "{:?}", env.releases());
    assert_eq!(env.sim.sim().claims().len(), 2);

    // sandboxd's operator drains it: that drain stays theirs.
    let http = reqwest::Client::new();
    let drain = |method: reqwest::Method| {
        http.request(method, format!("{}/v1/drain", env.sim.base_url()))
            .bearer_auth(TOKEN)
            .send()
    };
    assert!(
        drain(reqwest::Method::POST)
            .await
            .expect("drain")
            .status()
            .is_success()
    );
    for (on, wrong) in [
        (true, "the cordon took over the operator's drain"),
        (false, "the uncordon ended the operator's drain"),
    ] {
        cordon(on).await;
        // Two info reads and more: the task would have acted by now.
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(state().await.expect("state"), (false, true), "{wrong}");
    }
    assert!(
        drain(reqwest::Method::DELETE)
            .await
            .expect("undrain")
            .status()
            .is_success()
    );
    env.finish().await;
}
