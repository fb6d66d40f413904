//! The Sandbox's lifecycle on a microVM, with the upstream agent-sandbox
//! controller (docs/pod-contract.md, "Lifecycle"): a Sandbox set to
//! `operatingMode: Suspended` loses its Pod and its VM is hibernated, not
//! released; set back to `Running`, its new Pod adopts the same claim, the
//! VM is woken and the Pod runs with the same IP. A refused hibernate
//! leaves the VM running with a Warning; a failed one is retried; a failed
//! wake keeps the Pod Pending and is retried.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use sandboxd_sim::{Endpoint, Fault, SimHandle};
use serde_json::{Value, json};
use support::vk::{VkUnderTest, tail};
use support::{TestCluster, wait_for};

const TOKEN: &str = "root-token-lifecycle";
const CLAIM_ID: &str = "sandbox.cocoonstack.io/claim-id";

struct Env {
    cluster: TestCluster,
    sim: SimHandle,
    vk: VkUnderTest,
    ns: String,
    token_file: std::path::PathBuf,
    _controller: support::controller::SandboxController,
}

/// The simulator (hibernate and wake at their measured speed), vk-sandbox
/// with `extra` flags, and the upstream controller; `None` when skipped.
async fn setup(prefix: &str, extra: &[&str]) -> Option<Env> {
    let cluster = support::cluster().await?;
    if !support::controller::upstream_or_skip("the Sandbox lifecycle") {
        return None;
    }
    support::controller::install_crds(&cluster.client, &cluster.kubeconfig).await;
    if extra.contains(&"--publish-inventory") {
        let crd = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("crds/sandbox.cocoonstack.io_nodeinventories.yaml");
        support::crds::install_file(&cluster.client, &crd).await;
    }
    let mut cfg = support::sim::config(TOKEN, &["base:24.04=4"]);
    cfg.hibernate_delay_ms = 200;
    cfg.wake_delay_ms = 55;
    let sim = support::sim::start(cfg).await;
    let token_file = support::sim::token_file(&support::vk::test_dir(prefix), TOKEN);
    let mut args = support::sim::vk_args(&sim, Some(&token_file));
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let vk = VkUnderTest::start(&cluster, prefix, &args).await;
    vk.wait_ready(&cluster.client, Duration::from_secs(30))
        .await;
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

/// A Running Pod as the test sees it.
#[derive(Debug, Clone)]
struct Seen {
    uid: String,
    claim: String,
    ip: String,
}

impl Env {
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
    fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.ns)
    }

    async fn create_sandbox(&self, name: &str) {
        let sb: DynamicObject = serde_json::from_value(support::controller::contract_sandbox(
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

    async fn set_mode(&self, name: &str, mode: &str) {
        support::controller::set_operating_mode(&self.sandboxes(), name, mode).await
    }

    /// Waits for a Pod `name` Running, not `not_uid`.
    async fn wait_running(&self, name: &str, not_uid: Option<&str>) -> Seen {
        let pods = self.pods();
        wait_for(
            &format!("the Pod of Sandbox {name} Running"),
            Duration::from_secs(90),
            || async {
                let p = pods
                    .get_opt(name)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("no Pod yet")?;
                let uid = p.metadata.uid.clone().unwrap_or_default();
                let status = p.status.clone().unwrap_or_default();
                let phase = status.phase.clone();
                let ok = phase.as_deref() == Some("Running")
                    && p.metadata.deletion_timestamp.is_none()
                    && not_uid != Some(uid.as_str());
                if ok {
                    Ok(Seen {
                        uid,
                        claim: p
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(CLAIM_ID).cloned())
                            .unwrap_or_default(),
                        ip: status.pod_ip.unwrap_or_default(),
                    })
                } else {
                    Err(format!(
                        "phase {phase:?} reason {:?}; log:\n{}",
                        status.reason,
                        tail(&self.vk.logs(), 10)
                    ))
                }
            },
        )
        .await
    }

    async fn wait_pod_gone(&self, name: &str) {
        support::wait_pod_gone(&self.pods(), name, || tail(&self.vk.logs(), 10)).await;
    }

    /// The simulator's row of `id`: (hibernated, archived); `None` when
    /// sandboxd no longer has it.
    fn sim_row(&self, id: &str) -> Option<bool> {
        self.sim
            .sim()
            .claims()
            .into_iter()
            .find(|c| c.id == id)
            .map(|c| c.hibernated)
    }

    async fn wait_sim_hibernated(&self, id: &str, hibernated: bool) {
        wait_for(
            &format!("sandbox {id} hibernated={hibernated} in the simulator"),
            Duration::from_secs(60),
            || async {
                match self.sim_row(id) {
                    Some(h) if h == hibernated => Ok(()),
                    other => Err(format!(
                        "row {other:?}; log:\n{}",
                        tail(&self.vk.logs(), 10)
                    )),
                }
            },
        )
        .await
    }

    /// `key`'s row as vk-sandbox's claims state holds it (snapshot and
    /// journal, read as a restart would).
    fn row(&self, key: &str) -> Option<vk_sandbox::claims::Claim> {
        let paths = vk_sandbox::claims::StatePaths::new(&self.vk.state_path);
        let view = vk_sandbox::claims::read::read(&paths, jiff::Timestamp::now()).ok()?;
        view.loaded.rows.get(key).cloned()
    }

    /// The `lifecycle` object of `key`'s row in vk-sandbox's claims state.
    fn recorded(&self, key: &str) -> Value {
        self.row(key)
            .and_then(|c| c.lifecycle.to_json())
            .unwrap_or(Value::Null)
    }

    fn requests_to(&self, path: &str) -> usize {
        self.sim
            .sim()
            .requests()
            .iter()
            .filter(|r| r.path == path)
            .count()
    }

    fn releases(&self) -> usize {
        support::sim::releases(&self.sim).len()
    }

    /// The Events of this namespace with `reason` (events.k8s.io).
    async fn events(&self, reason: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
        let api: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client(), &self.ns);
        api.list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect()
    }

    async fn wait_event(&self, reason: &str) -> k8s_openapi::api::events::v1::Event {
        wait_for(
            &format!("an Event {reason}"),
            Duration::from_secs(60),
            || async {
                self.events(reason)
                    .await
                    .pop()
                    .ok_or_else(|| format!("none yet; log:\n{}", tail(&self.vk.logs(), 10)))
            },
        )
        .await
    }

    /// Waits until this node's NodeInventory (default group) lists sandbox
    /// `id` in `phase`; returns its entry.
    async fn wait_inventory_phase(&self, id: &str, phase: &str) -> Value {
        let api: Api<DynamicObject> = Api::all_with(
            self.client(),
            &support::crds::nodeinventories("sandbox.cocoonstack.io"),
        );
        wait_for(
            &format!("sandbox {id} {phase} in NodeInventory {}", self.vk.node),
            Duration::from_secs(30),
            || async {
                let obj = api
                    .get_opt(&self.vk.node)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("not published; log:\n{}", tail(&self.vk.logs(), 10)))?;
                let entry = obj.data["entries"]
                    .as_array()
                    .and_then(|es| es.iter().find(|e| e["id"] == id).cloned())
                    .ok_or_else(|| format!("no entry for {id}: {}", obj.data))?;
                if entry["phase"] == phase {
                    Ok(entry)
                } else {
                    Err(format!("entry {entry}"))
                }
            },
        )
        .await
    }

    fn restart_vk(&mut self) {
        self.vk.process.signal(nix::sys::signal::Signal::SIGKILL);
        self.vk.process.wait_exit(Duration::from_secs(5));
        self.vk.restart(&[
            &format!("--sandboxd-url={}", self.sim.base_url()),
            &format!("--sandboxd-token-file={}", self.token_file.display()),
        ]);
    }

    async fn finish(self) {
        self.cluster.drop_namespace(&self.ns).await;
        self.vk.delete_node(&self.cluster.client).await;
    }
}

/// Suspend → the Pod goes, the VM is hibernated (the simulator's row and
/// the claims file say so), nothing released, Event `SandboxHibernated`;
/// Running again → the new Pod runs on the same claim with the same IP,
/// the VM woken before it ran, Event `SandboxWoken`. The node's
/// NodeInventory shows the claim `Hibernated`, then `Running` again.
#[tokio::test(flavor = "multi_thread")]
async fn suspend_hibernates_and_resume_wakes_the_same_vm() {
    let Some(env) = setup("vk-life", &["--publish-inventory", "--publish-interval=1s"]).await
    else {
        return;
    };
    let key = env.key("demo");
    env.create_sandbox("demo").await;
    let first = env.wait_running("demo", None).await;
    assert!(!first.claim.is_empty() && !first.ip.is_empty(), "{first:?}");
    assert_eq!(env.sim_row(&first.claim), Some(false));

    env.set_mode("demo", "Suspended").await;
    env.wait_pod_gone("demo").await;
    env.wait_sim_hibernated(&first.claim, true).await;
    let recorded = env.recorded(&key);
    assert_eq!(recorded["vm"], "hibernated", "claims file: {recorded}");
    assert_eq!(recorded["why"], "suspended", "claims file: {recorded}");
    assert_eq!(
        recorded["owner"]["kind"], "Sandbox",
        "claims file: {recorded}"
    );
    let ev = env.wait_event("SandboxHibernated").await;
    assert_eq!(ev.type_.as_deref(), Some("Normal"));
    assert_eq!(env.releases(), 0, "a suspended Sandbox's VM was released");
    let entry = env.wait_inventory_phase(&first.claim, "Hibernated").await;
    assert_eq!(entry["name"], key.as_str(), "inventory entry {entry}");

    let wakes = format!("/v1/sandboxes/{}/wake", first.claim);
    assert_eq!(env.requests_to(&wakes), 0);
    env.set_mode("demo", "Running").await;
    let second = env.wait_running("demo", Some(&first.uid)).await;
    assert_eq!(second.claim, first.claim, "resumed on another sandbox");
    assert_eq!(second.ip, first.ip, "resumed with another IP");
    assert_eq!(env.sim_row(&first.claim), Some(false), "not woken");
    assert!(env.requests_to(&wakes) >= 1, "no wake was asked");
    env.wait_event("SandboxWoken").await;
    env.wait_inventory_phase(&first.claim, "Running").await;
    assert!(
        env.recorded(&key)["vm"].is_null(),
        "still recorded hibernated: {}",
        env.recorded(&key)
    );
    assert_eq!(env.releases(), 0);
    assert_eq!(
        support::sim::claims_for_key(&env.sim, &key),
        1,
        "claimed twice"
    );
    env.finish().await;
}

/// The same across a `kill -9` of vk-sandbox in the middle of each step:
/// the restarted process finishes the hibernate, and wakes the VM for the
/// Pod that comes back.
#[tokio::test(flavor = "multi_thread")]
async fn suspend_and_resume_survive_kill9_mid_step() {
    let Some(mut env) = setup("vk-life-k9", &[]).await else {
        return;
    };
    let key = env.key("k9");
    env.create_sandbox("k9").await;
    let first = env.wait_running("k9", None).await;

    env.set_mode("k9", "Suspended").await;
    env.restart_vk();
    env.wait_pod_gone("k9").await;
    env.wait_sim_hibernated(&first.claim, true).await;
    assert_eq!(env.recorded(&key)["vm"], "hibernated");
    assert_eq!(env.releases(), 0);

    env.set_mode("k9", "Running").await;
    env.restart_vk();
    let second = env.wait_running("k9", Some(&first.uid)).await;
    assert_eq!(second.claim, first.claim, "resumed on another sandbox");
    assert_eq!(second.ip, first.ip);
    assert_eq!(env.sim_row(&first.claim), Some(false), "not woken");
    assert_eq!(env.releases(), 0);
    assert_eq!(support::sim::claims_for_key(&env.sim, &key), 1);
    env.finish().await;
}

/// sandboxd refuses to hibernate (409: an egress-lane VM, or one with
/// volumes): the VM keeps running, a Warning says so, and it is not asked
/// again. A hibernate that fails otherwise (500) is retried until done.
#[tokio::test(flavor = "multi_thread")]
async fn refused_hibernate_keeps_running_failed_one_is_retried() {
    let Some(env) = setup("vk-life-fail", &[]).await else {
        return;
    };
    env.create_sandbox("refused").await;
    let refused = env.wait_running("refused", None).await;
    env.sim
        .sim()
        .arm_fault(Fault::status(Endpoint::Hibernate, 409).times(1))
        .expect("arm 409");
    env.set_mode("refused", "Suspended").await;
    env.wait_pod_gone("refused").await;
    let warn = env.wait_event("SandboxHibernateFailed").await;
    assert_eq!(warn.type_.as_deref(), Some("Warning"));
    assert_eq!(env.recorded(&env.key("refused"))["hibernateRefused"], true);
    // Past two upkeep back-offs: never asked again, still running.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let path = format!("/v1/sandboxes/{}/hibernate", refused.claim);
    assert_eq!(env.requests_to(&path), 1, "a refused hibernate asked again");
    assert_eq!(env.sim_row(&refused.claim), Some(false));
    assert_eq!(env.releases(), 0);

    env.create_sandbox("flaky").await;
    let flaky = env.wait_running("flaky", None).await;
    env.sim
        .sim()
        .arm_fault(Fault::status(Endpoint::Hibernate, 500).times(2))
        .expect("arm 500");
    env.set_mode("flaky", "Suspended").await;
    env.wait_pod_gone("flaky").await;
    env.wait_sim_hibernated(&flaky.claim, true).await;
    let path = format!("/v1/sandboxes/{}/hibernate", flaky.claim);
    assert!(
        env.requests_to(&path) >= 3,
        "hibernated without the retries"
    );
    assert_eq!(env.recorded(&env.key("flaky"))["vm"], "hibernated");
    assert_eq!(env.releases(), 0);
    env.finish().await;
}

/// A wake that fails keeps the resumed Pod Pending with reason
/// `SandboxWakeFailed`, and is retried until the Pod runs on the same VM.
#[tokio::test(flavor = "multi_thread")]
async fn failed_wake_keeps_the_pod_pending_and_is_retried() {
    let Some(env) = setup("vk-life-wake", &[]).await else {
        return;
    };
    env.create_sandbox("w").await;
    let first = env.wait_running("w", None).await;
    env.set_mode("w", "Suspended").await;
    env.wait_pod_gone("w").await;
    env.wait_sim_hibernated(&first.claim, true).await;
    env.sim
        .sim()
        .arm_fault(Fault::status(Endpoint::Wake, 500).times(3))
        .expect("arm wake 500");
    env.set_mode("w", "Running").await;
    let pods = env.pods();
    wait_for(
        "the resumed Pod Pending with SandboxWakeFailed",
        Duration::from_secs(60),
        || async {
            let p = pods
                .get_opt("w")
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no Pod yet")?;
            let s = p.status.unwrap_or_default();
            if s.phase.as_deref() == Some("Pending")
                && s.reason.as_deref() == Some("SandboxWakeFailed")
            {
                Ok(())
            } else {
                Err(format!("phase {:?} reason {:?}", s.phase, s.reason))
            }
        },
    )
    .await;
    let second = env.wait_running("w", Some(&first.uid)).await;
    assert_eq!(second.claim, first.claim);
    assert_eq!(second.ip, first.ip);
    let metrics = env.vk.metrics().await;
    let counted = |result: &str| {
        support::metric(
            &metrics,
            &format!("vk_sandbox_claim_transitions_total{{action=\"wake\",result=\"{result}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert!(
        counted("failed") >= 1.0,
        "failed wakes not counted:\n{metrics}"
    );
    assert!(counted("ok") >= 1.0, "the wake not counted:\n{metrics}");
    // The resume's own share is timed once per wake that succeeded, and
    // leaves the wake out: the simulator's wake alone takes 55 ms.
    let own = |part: &str| {
        support::metric(&metrics, &format!("vk_sandbox_resume_own_seconds_{part}")).unwrap_or(-1.0)
    };
    assert_eq!(own("count"), counted("ok"), "resumes timed:\n{metrics}");
    assert!(
        (0.0..0.055).contains(&(own("sum") / own("count"))),
        "the wake counted in the resume's own share:\n{metrics}"
    );
    let wakes = format!("/v1/sandboxes/{}/wake", first.claim);
    assert!(env.requests_to(&wakes) >= 4, "ran without the retries");
    assert_eq!(env.sim_row(&first.claim), Some(false));
    assert_eq!(env.releases(), 0);
    env.finish().await;
}

impl Env {
    /// A Sandbox whose Pod asks leases of `ttl` seconds; `extra` merged
    /// into its spec (e.g. a `shutdownTime`).
    async fn create_leased(&self, name: &str, ttl: u64, extra: Value) {
        let mut v = support::controller::contract_sandbox(name, "base:24.04", Some(&self.vk.node));
        v["spec"]["podTemplate"]["metadata"]["annotations"]["sandbox.cocoonstack.io/ttl-seconds"] =
            json!(ttl.to_string());
        if let (Some(spec), Value::Object(more)) = (v["spec"].as_object_mut(), extra) {
            spec.extend(more);
        }
        let sb: DynamicObject = serde_json::from_value(v).expect("sandbox json");
        self.sandboxes()
            .create(&PostParams::default(), &sb)
            .await
            .expect("create Sandbox");
    }

    /// The TTLs asked by the renewals of `id`, in order.
    fn renewals(&self, id: &str) -> Vec<i64> {
        let path = format!("/v1/sandboxes/{id}/renew");
        self.sim
            .sim()
            .requests()
            .iter()
            .filter(|r| r.path == path)
            .map(|r| {
                serde_json::from_str::<Value>(&r.body)
                    .ok()
                    .and_then(|b| b["ttl_seconds"].as_i64())
                    .unwrap_or(-1)
            })
            .collect()
    }

    /// `key`'s deadline in vk-sandbox's claims state.
    fn recorded_deadline(&self, key: &str) -> Option<jiff::Timestamp> {
        self.row(key).and_then(|c| c.deadline)
    }

    /// The simulator's deadline of `id`.
    fn sim_deadline(&self, id: &str) -> Option<jiff::Timestamp> {
        self.sim
            .sim()
            .claims()
            .into_iter()
            .find(|c| c.id == id)
            .and_then(|c| c.deadline)
    }
}

/// Leases of 20 s under a living owner: renewed before each deadline with
/// the Pod's TTL (never 0), the new deadline recorded, and the Pod stays
/// Running on its first sandbox for more than 5 leases; a hibernated VM is
/// renewed without being woken.
#[tokio::test(flavor = "multi_thread")]
async fn leases_under_a_living_owner_are_renewed_also_hibernated() {
    let Some(env) = setup("vk-life-lease", &[]).await else {
        return;
    };
    env.create_leased("long", 20, json!({})).await;
    env.create_leased("asleep", 20, json!({})).await;
    let long = env.wait_running("long", None).await;
    let asleep = env.wait_running("asleep", None).await;
    env.set_mode("asleep", "Suspended").await;
    env.wait_pod_gone("asleep").await;
    env.wait_sim_hibernated(&asleep.claim, true).await;

    let started = std::time::Instant::now();
    let mut last = env.recorded_deadline(&env.key("long"));
    let mut advanced = 0;
    // Five leases and a half.
    while started.elapsed() < Duration::from_secs(110) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = env.recorded_deadline(&env.key("long"));
        if now > last {
            advanced += 1;
            last = now;
        }
        assert!(
            env.sim_row(&long.claim).is_some(),
            "the living Sandbox's sandbox ended at its deadline; log:\n{}",
            tail(&env.vk.logs(), 20)
        );
        assert_eq!(env.sim_row(&asleep.claim), Some(true), "woken or gone");
    }
    let renewed = env.renewals(&long.claim);
    assert!(renewed.len() >= 5, "renewals {renewed:?}");
    assert!(renewed.iter().all(|t| *t == 20), "TTLs asked {renewed:?}");
    assert!(
        advanced >= 5,
        "the recorded deadline moved {advanced} times"
    );
    // The claims file keeps whole seconds.
    assert_eq!(
        env.recorded_deadline(&env.key("long"))
            .map(|t| t.as_second()),
        env.sim_deadline(&long.claim).map(|t| t.as_second()),
        "the claims file's deadline is not sandboxd's"
    );
    let p = env.pods().get("long").await.expect("Pod long");
    assert_eq!(p.metadata.uid.as_deref(), Some(long.uid.as_str()));
    assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Running"));
    assert!(env.events("SandboxLeaseExpired").await.is_empty());

    let slept = env.renewals(&asleep.claim);
    assert!(slept.len() >= 5, "hibernated renewals {slept:?}");
    assert!(slept.iter().all(|t| *t == 20), "TTLs asked {slept:?}");
    let wakes = format!("/v1/sandboxes/{}/wake", asleep.claim);
    assert_eq!(env.requests_to(&wakes), 0, "the hibernated VM was woken");
    assert_eq!(env.releases(), 0);
    env.finish().await;
}

/// A Sandbox with a `shutdownTime`: once it passes (policy `Retain`: the Sandbox stays) its VM is released.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_past_its_shutdown_time_gives_its_vm_back() {
    let Some(env) = setup("vk-life-expire", &[]).await else {
        return;
    };
    let shutdown = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(30);
    env.create_leased(
        "brief",
        20,
        json!({"shutdownTime": shutdown.to_string(), "shutdownPolicy": "Retain"}),
    )
    .await;
    let brief = env.wait_running("brief", None).await;
    env.wait_pod_gone("brief").await;
    let released = format!("/v1/sandboxes/{}/release", brief.claim);
    wait_for(
        "the expired Sandbox's VM released",
        Duration::from_secs(30),
        || async {
            if env.requests_to(&released) >= 1 {
                Ok(())
            } else {
                Err(tail(&env.vk.logs(), 10))
            }
        },
    )
    .await;
    assert!(env.sim_row(&brief.claim).is_none(), "still claimed");
    assert!(
        env.sandboxes()
            .get_opt("brief")
            .await
            .expect("get")
            .is_some(),
        "Retain keeps the Sandbox"
    );
    let renewed = env.renewals(&brief.claim);
    assert!(
        renewed.iter().all(|t| *t > 0),
        "a renewal asked 0: {renewed:?}"
    );
    env.finish().await;
}

/// A Sandbox whose Pod now runs on another node (its template moved it
/// there; a drain does the same): the claim preserved here serves nobody
/// and is released, while the Sandbox lives.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_that_moved_to_another_node_is_released_here() {
    let Some(env) = setup("vk-life-move", &[]).await else {
        return;
    };
    let other_sim = support::sim::start(support::sim::config(TOKEN, &["base:24.04=2"])).await;
    let args = support::sim::vk_args(&other_sim, Some(&env.token_file));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let other = VkUnderTest::start(&env.cluster, "vk-life-there", &args).await;
    other
        .wait_ready(&env.cluster.client, Duration::from_secs(30))
        .await;

    env.create_sandbox("mover").await;
    let here = env.wait_running("mover", None).await;
    // The template now pins the Pod to the other node; the Pod is deleted
    // (as a drain would) and the controller makes it again, there.
    env.sandboxes()
        .patch(
            "mover",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"podTemplate": {"spec": {"nodeSelector": {
                "kubernetes.io/hostname": other.node,
            }}}}})),
        )
        .await
        .expect("move the Sandbox's template");
    env.pods()
        .delete("mover", &Default::default())
        .await
        .expect("delete the Pod");
    let there = env.wait_running("mover", Some(&here.uid)).await;
    let pod = env.pods().get("mover").await.expect("Pod mover");
    assert_eq!(
        pod.spec.and_then(|s| s.node_name).as_deref(),
        Some(other.node.as_str())
    );
    assert_ne!(there.claim, here.claim);
    let released = format!("/v1/sandboxes/{}/release", here.claim);
    wait_for(
        "the moved Sandbox's VM released here",
        Duration::from_secs(90),
        || async {
            if env.requests_to(&released) >= 1 {
                Ok(())
            } else {
                Err(tail(&env.vk.logs(), 10))
            }
        },
    )
    .await;
    assert!(env.sim_row(&here.claim).is_none(), "still claimed here");
    assert!(env.row(&env.key("mover")).is_none(), "still recorded here");
    assert!(
        env.sandboxes()
            .get_opt("mover")
            .await
            .expect("get")
            .is_some(),
        "the Sandbox lives"
    );
    other.delete_node(&env.cluster.client).await;
    env.finish().await;
}
