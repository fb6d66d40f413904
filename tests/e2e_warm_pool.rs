//! The warm-pool path end to end with the upstream agent-sandbox controller
//! (its SandboxTemplate, SandboxWarmPool and SandboxClaim controllers) on
//! the local plane: a pool of N makes N Pods Running on N VMs; a claim
//! adopts one (the Sandbox is re-owned by the claim, the Pod keeps the
//! Sandbox as its controller) with no new claim to sandboxd; the pool
//! replaces it; deleting the claim releases exactly that VM; scaling the
//! pool down, then deleting it, releases the rest — and no VM is released
//! while its Sandbox lives.
//!
//! What agent-sandbox makes beside the Pods is checked too, as the
//! network-endpoint work will rely on it: each Sandbox of a template with
//! `service: true` gets a headless Service (`status.serviceFQDN`; with 1.0
//! the claim mirrors it), and the template a managed NetworkPolicy
//! selecting the pool's Pods (ingress only from the sandbox-router).
//!
//! Skipped (with the reason) only where upstream cannot run and
//! VK_REQUIRE_REAL_CONTROLLER is not 1.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use sandboxd_sim::SimHandle;
use serde_json::json;
use support::controller as ctl;
use support::vk::{VkUnderTest, tail};
use support::{TestCluster, wait_for};

const TOKEN: &str = "warm-pool-token";
const CLAIM_ID: &str = "sandbox.cocoonstack.io/claim-id";
const POOL: &str = "pool";

struct Env {
    cluster: TestCluster,
    sim: SimHandle,
    vk: VkUnderTest,
    ns: String,
    _controller: ctl::SandboxController,
}

/// One Sandbox as observed: its controller owner, its Pod's controller
/// owner and the claim id its Pod runs on.
#[derive(Clone, Debug)]
struct Observed {
    uid: String,
    owner: Option<(String, String, String)>,
    pod_owner: Option<(String, String, String)>,
    claim: Option<String>,
}

impl Env {
    async fn new(prefix: &str) -> Option<Env> {
        let cluster = support::cluster().await?;
        if !ctl::upstream_or_skip("the warm-pool path") {
            return None;
        }
        ctl::install_crds(&cluster.client, &cluster.kubeconfig).await;
        let (sim, vk, _) = support::vk::with_simulator(&cluster, prefix, TOKEN).await;
        let ns = cluster.namespace(prefix).await;
        let controller = ctl::start(&cluster.client, &cluster.kubeconfig, &ns).await;
        Some(Env {
            cluster,
            sim,
            vk,
            ns,
            _controller: controller,
        })
    }

    fn api(&self, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.cluster.client.clone(), &self.ns, &ctl::resource(kind))
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.cluster.client.clone(), &self.ns)
    }

    async fn create(&self, kind: &str, obj: serde_json::Value) -> DynamicObject {
        let obj: DynamicObject = serde_json::from_value(obj).expect("object json");
        self.api(kind)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("create {kind}: {e}"))
    }

    /// Every live Sandbox of the namespace by name.
    async fn observe(&self) -> Result<BTreeMap<String, Observed>, String> {
        let sandboxes = self
            .api("Sandbox")
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let pods = self
            .pods()
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let mut out = BTreeMap::new();
        for sb in sandboxes.items {
            if sb.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let uid = sb.metadata.uid.clone().unwrap_or_default();
            // The Pod this Sandbox controls (named after it, by upstream).
            let pod = pods.items.iter().find(|p| {
                ctl::controller_of(&p.metadata).is_some_and(|(_, _, u)| u == uid)
                    && p.metadata.deletion_timestamp.is_none()
            });
            let running = pod.is_some_and(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            });
            out.insert(
                sb.name_any(),
                Observed {
                    uid,
                    owner: ctl::controller_of(&sb.metadata),
                    pod_owner: pod.and_then(|p| ctl::controller_of(&p.metadata)),
                    claim: pod
                        .filter(|_| running)
                        .and_then(|p| p.annotations().get(CLAIM_ID).cloned()),
                },
            );
        }
        Ok(out)
    }

    /// Waits until `check` accepts the observation; returns it.
    async fn wait_state<F>(&self, what: &str, check: F) -> BTreeMap<String, Observed>
    where
        F: Fn(&BTreeMap<String, Observed>) -> Result<(), String>,
    {
        wait_for(what, Duration::from_secs(120), || async {
            let seen = self.observe().await?;
            check(&seen).map_err(|e| {
                format!(
                    "{e}; Sandboxes {seen:?}; vk-sandbox log:\n{}",
                    tail(&self.vk.logs(), 15)
                )
            })?;
            Ok(seen)
        })
        .await
    }

    fn claim_requests(&self) -> usize {
        self.sim
            .sim()
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path == "/v1/claim")
            .count()
    }

    fn claims_for(&self, pod: &str) -> usize {
        support::sim::claims_for_key(&self.sim, &format!("{}/{pod}", self.ns))
    }

    /// The sandbox ids released so far.
    fn released(&self) -> BTreeSet<String> {
        self.sim
            .sim()
            .requests()
            .iter()
            .filter(|r| r.method == "POST")
            .filter_map(|r| {
                r.path
                    .strip_prefix("/v1/sandboxes/")?
                    .strip_suffix("/release")
                    .map(str::to_string)
            })
            .collect()
    }

    fn live(&self) -> BTreeSet<String> {
        self.sim.sim().claims().into_iter().map(|c| c.id).collect()
    }

    /// No VM of a live Sandbox is released, and each one is still live.
    fn assert_live_keep_their_vms(&self, seen: &BTreeMap<String, Observed>) {
        let released = self.released();
        let live = self.live();
        for (name, o) in seen {
            if let Some(id) = &o.claim {
                assert!(
                    !released.contains(id),
                    "the VM {id} of the live Sandbox {name} was released"
                );
                assert!(live.contains(id), "the VM {id} of Sandbox {name} is gone");
            }
        }
    }
}

/// The managed NetworkPolicy of SandboxTemplate `template`: controlled by
/// it, selecting every Pod of `pods` (the pool's), ingress only from Pods
/// labelled `app=sandbox-router` in namespace `agent-sandbox-system`.
async fn check_network_policy(env: &Env, template: &str, pods: &[Pod]) {
    let policies: Api<NetworkPolicy> = Api::namespaced(env.cluster.client.clone(), &env.ns);
    let name = format!("{template}-network-policy");
    let np = wait_for(
        &format!("NetworkPolicy {name}"),
        Duration::from_secs(60),
        || async {
            policies
                .get_opt(&name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "not there".to_string())
        },
    )
    .await;
    let owner = ctl::controller_of(&np.metadata);
    assert!(
        owner
            .as_ref()
            .is_some_and(|(k, n, _)| k == "SandboxTemplate" && n == template),
        "NetworkPolicy {name} controlled by {owner:?}"
    );
    let spec = np.spec.clone().unwrap_or_default();
    let selector = spec
        .pod_selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .unwrap_or_default();
    assert!(
        !selector.is_empty(),
        "NetworkPolicy {name} selects every Pod"
    );
    for p in pods {
        let labels = p.labels();
        assert!(
            selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
            "NetworkPolicy {name} ({selector:?}) does not select Pod {} ({labels:?})",
            p.name_any()
        );
    }
    let types = spec.policy_types.clone().unwrap_or_default();
    assert_eq!(types, ["Ingress", "Egress"], "NetworkPolicy {name} types");
    let ingress = serde_json::to_value(spec.ingress.unwrap_or_default()).expect("ingress json");
    assert_eq!(
        ingress,
        json!([{"from": [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agent-sandbox-system"}},
            "podSelector": {"matchLabels": {"app": "sandbox-router"}}
        }]}]),
        "NetworkPolicy {name} ingress"
    );
}

/// Sandbox `name`'s headless Service: the Sandbox's `status.serviceFQDN`
/// names it, it has no cluster IP and the Sandbox controls it. Returns the
/// FQDN.
async fn check_service(env: &Env, name: &str) -> String {
    let want = format!("{name}.{}.svc.cluster.local", env.ns);
    let sandboxes = env.api("Sandbox");
    wait_for(
        &format!("Sandbox {name}'s status.serviceFQDN"),
        Duration::from_secs(60),
        || async {
            let sb = sandboxes.get(name).await.map_err(|e| e.to_string())?;
            match sb.data["status"]["serviceFQDN"].as_str() {
                Some(fqdn) if fqdn == want => Ok(()),
                other => Err(format!("serviceFQDN {other:?}")),
            }
        },
    )
    .await;
    let services: Api<Service> = Api::namespaced(env.cluster.client.clone(), &env.ns);
    let svc = services
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("Service {name}: {e}"));
    assert_eq!(
        svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()),
        Some("None"),
        "Service {name} is not headless"
    );
    assert!(
        ctl::controller_of(&svc.metadata).is_some_and(|(k, n, _)| k == "Sandbox" && n == name),
        "Service {name} is not controlled by its Sandbox"
    );
    want
}

fn pool_owned(o: &Observed) -> bool {
    o.owner
        .as_ref()
        .is_some_and(|(k, n, _)| k == "SandboxWarmPool" && n == POOL)
}

fn all_running(seen: &BTreeMap<String, Observed>, n: usize) -> Result<(), String> {
    let running = seen.values().filter(|o| o.claim.is_some()).count();
    if seen.len() == n && running == n {
        Ok(())
    } else {
        Err(format!(
            "{running} of {} Sandboxes Running, want {n}",
            seen.len()
        ))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn warm_pool_claim_adoption_scale_down_and_deletion() {
    let Some(env) = Env::new("vk-warm").await else {
        return;
    };
    let n = 3;
    let mut template = ctl::contract_template("sandboxd-base", "base:24.04", Some(&env.vk.node));
    template["spec"]["service"] = json!(true);
    env.create("SandboxTemplate", template).await;
    env.create("SandboxWarmPool", ctl::warm_pool(POOL, "sandboxd-base", n))
        .await;

    // N Sandboxes of the pool, each Pod Running on a VM of its own.
    let warm = env
        .wait_state("the warm pool's Pods Running", |seen| {
            all_running(seen, n as usize)?;
            if seen.values().all(pool_owned) {
                Ok(())
            } else {
                Err("not all owned by the pool".into())
            }
        })
        .await;
    let vms: BTreeSet<String> = warm.values().filter_map(|o| o.claim.clone()).collect();
    assert_eq!(vms.len(), n as usize, "distinct VMs: {warm:?}");
    assert_eq!(env.claim_requests(), n as usize, "claims to sandboxd");
    for (name, o) in &warm {
        assert_eq!(
            o.pod_owner,
            Some(("Sandbox".to_string(), name.clone(), o.uid.clone())),
            "the Pod of {name} is not controlled by its Sandbox"
        );
    }
    let mut fqdns = BTreeMap::new();
    for name in warm.keys() {
        fqdns.insert(name.clone(), check_service(&env, name).await);
    }
    let pool_pods: Vec<Pod> = env
        .pods()
        .list(&ListParams::default())
        .await
        .expect("list Pods")
        .items
        .into_iter()
        .filter(|p| warm.contains_key(&p.name_any()))
        .collect();
    assert_eq!(pool_pods.len(), n as usize, "the pool's Pods");
    check_network_policy(&env, "sandboxd-base", &pool_pods).await;

    // A claim adopts one: re-owned by the claim, its Pod still the
    // Sandbox's, the same VM, no new claim to sandboxd.
    let claim = env
        .create("SandboxClaim", ctl::sandbox_claim("c1", POOL))
        .await;
    let claim_uid = claim.metadata.uid.clone().expect("claim uid");
    let adopted_state = env
        .wait_state(
            "the claim to adopt a warm Sandbox and the pool to refill",
            |seen| {
                let adopted: Vec<_> = seen
                    .values()
                    .filter(|o| {
                        o.owner
                            .as_ref()
                            .is_some_and(|(k, _, u)| k == "SandboxClaim" && *u == claim_uid)
                    })
                    .collect();
                if adopted.len() != 1 {
                    return Err(format!("{} Sandboxes owned by the claim", adopted.len()));
                }
                all_running(seen, n as usize + 1)
            },
        )
        .await;
    let (adopted_name, adopted) = adopted_state
        .iter()
        .find(|(_, o)| {
            o.owner
                .as_ref()
                .is_some_and(|(k, _, _)| k == "SandboxClaim")
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .expect("the adopted Sandbox");
    let before = warm.get(&adopted_name).unwrap_or_else(|| {
        panic!("the claim adopted {adopted_name}, not one of the warm Sandboxes {warm:?}")
    });
    assert_eq!(
        adopted.uid, before.uid,
        "the adopted Sandbox is a new object"
    );
    assert_eq!(
        adopted.pod_owner,
        Some((
            "Sandbox".to_string(),
            adopted_name.clone(),
            adopted.uid.clone()
        )),
        "the adopted Pod's controller owner changed"
    );
    assert_eq!(
        adopted.claim, before.claim,
        "the adopted Pod runs on another VM"
    );
    assert_eq!(
        env.claims_for(&adopted_name),
        1,
        "adoption made a new claim to sandboxd for {adopted_name}"
    );
    if ctl::is_release_1_0(ctl::kind()) {
        // 1.0 mirrors the adopted Sandbox's Service into the claim.
        let fqdn = fqdns.get(&adopted_name).cloned().expect("a warm FQDN");
        let claims = env.api("SandboxClaim");
        wait_for(
            "the claim's status.sandbox.serviceFQDN",
            Duration::from_secs(60),
            || async {
                let c = claims.get("c1").await.map_err(|e| e.to_string())?;
                match c.data["status"]["sandbox"]["serviceFQDN"].as_str() {
                    Some(f) if f == fqdn => Ok(()),
                    other => Err(format!("{other:?}, want {fqdn}")),
                }
            },
        )
        .await;
    }
    // The replacement is the only new claim.
    assert_eq!(env.claim_requests(), n as usize + 1, "claims to sandboxd");
    assert!(env.released().is_empty(), "released: {:?}", env.released());
    env.assert_live_keep_their_vms(&adopted_state);

    // Deleting the claim releases exactly that VM.
    env.api("SandboxClaim")
        .delete("c1", &DeleteParams::background())
        .await
        .expect("delete the claim");
    let adopted_vm = adopted.claim.clone().expect("the adopted VM");
    let after_claim = env
        .wait_state("the claimed Sandbox gone and its VM released", |seen| {
            if seen.contains_key(&adopted_name) {
                return Err(format!("{adopted_name} still there"));
            }
            if !env.released().contains(&adopted_vm) {
                return Err(format!("{adopted_vm} not released yet"));
            }
            all_running(seen, n as usize)
        })
        .await;
    assert_eq!(
        env.released(),
        BTreeSet::from([adopted_vm.clone()]),
        "deleting the claim released other VMs"
    );
    env.assert_live_keep_their_vms(&after_claim);

    // Scaling the pool down releases the VMs of the Sandboxes it removes.
    env.api("SandboxWarmPool")
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("scale the pool down");
    let scaled = env
        .wait_state("the pool at one Sandbox", |seen| all_running(seen, 1))
        .await;
    let keep: BTreeSet<String> = scaled.values().filter_map(|o| o.claim.clone()).collect();
    let removed: BTreeSet<String> = after_claim
        .values()
        .filter_map(|o| o.claim.clone())
        .filter(|id| !keep.contains(id))
        .collect();
    assert_eq!(removed.len(), n as usize - 1);
    wait_for(
        "the removed Sandboxes' VMs released",
        Duration::from_secs(60),
        || async {
            let released = env.released();
            if removed.iter().all(|id| released.contains(id)) {
                Ok(())
            } else {
                Err(format!("released {released:?}, want also {removed:?}"))
            }
        },
    )
    .await;
    let mut want: BTreeSet<String> = removed.clone();
    want.insert(adopted_vm.clone());
    assert_eq!(env.released(), want, "scaling down released other VMs");
    env.assert_live_keep_their_vms(&scaled);

    // Deleting the pool releases the rest.
    env.api("SandboxWarmPool")
        .delete(POOL, &DeleteParams::background())
        .await
        .expect("delete the pool");
    wait_for(
        "every VM released once the pool is gone",
        Duration::from_secs(120),
        || async {
            let seen = env.observe().await?;
            let live = env.live();
            if seen.is_empty() && live.is_empty() {
                Ok(())
            } else {
                Err(format!("Sandboxes {seen:?}, live VMs {live:?}"))
            }
        },
    )
    .await;
    want.extend(keep);
    assert_eq!(env.released(), want, "released VMs");
    env.cluster.drop_namespace(&env.ns).await;
    env.vk.delete_node(&env.cluster.client).await;
}
