//! Placement follows the VM (issue 45, parts 1 and 3) on the fleet tier:
//! three vk-sandbox nodes publishing their NodeInventories, node 0 also
//! serving the placement webhook (a `url:` clientConfig on loopback, its
//! own certificate pair in the caBundle), the upstream Sandbox controller
//! and the default scheduler.
//!
//! - Sandboxes suspended and resumed come back on the node that held their
//!   VM: the same claim id and Pod IP, no fresh VM claimed anywhere.
//! - The Pods of Sandboxes deleted (as an eviction does): every
//!   replacement runs on its VM's node with the same claim.
//! - Every sandbox Pod carries the outage tolerations (NoExecute, no
//!   tolerationSeconds) instead of the apiserver's 300 s ones.
//!
//! Without the webhook the scheduler picks any of the three nodes, so about
//! two in three resumes would land elsewhere and claim a fresh VM.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use sandbox_controller::Sandbox;
use serde_json::json;
use support::fleet::{self, Fleet};
use support::vk::tail;
use support::wait_for;

/// Sandboxes suspended and resumed, and Sandboxes whose Pods are deleted
/// (the figures).
const SUSPENDED: usize = 30;
const REPLACED: usize = 20;

/// The webhook's certificate pair for 127.0.0.1: (cert, key, PEM).
fn webhook_pair(dir: &std::path::Path) -> (PathBuf, PathBuf, String) {
    let generated =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).expect("self-sign");
    let pem = generated.cert.pem();
    let (cert, key) = (dir.join("webhook.crt"), dir.join("webhook.key"));
    std::fs::write(&cert, &pem).expect("write the webhook certificate");
    std::fs::write(&key, generated.signing_key.serialize_pem()).expect("write the webhook key");
    (cert, key, pem)
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

/// Each Pod's node, claim id and Pod IP, by name.
async fn seen(fleet: &Fleet, names: &[String]) -> Seen {
    let list = fleet
        .pods()
        .list(&ListParams::default())
        .await
        .expect("list pods");
    list.items
        .iter()
        .filter_map(|p| {
            let name = p.metadata.name.clone()?;
            names.contains(&name).then(|| {
                let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                let claim = p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("sandbox.cocoonstack.io/claim-id").cloned());
                let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone());
                (
                    name,
                    (
                        node.unwrap_or_default(),
                        claim.unwrap_or_default(),
                        ip.unwrap_or_default(),
                    ),
                )
            })
        })
        .collect()
}

type Seen = BTreeMap<String, (String, String, String)>;

/// The names among `names` whose node, claim or Pod IP differ, with both.
fn changed(before: &Seen, after: &Seen, names: &[String]) -> Vec<String> {
    names
        .iter()
        .filter(|n| before.get(*n) != after.get(*n))
        .map(|n| format!("{n}: {:?} -> {:?}", before.get(n), after.get(n)))
        .collect()
}

/// Claim requests each node's sandboxd has had.
fn claims_asked(fleet: &Fleet) -> Vec<usize> {
    fleet
        .members
        .iter()
        .map(|m| {
            m.sim
                .sim()
                .requests()
                .iter()
                .filter(|r| r.method == "POST" && r.path == "/v1/claim")
                .count()
        })
        .collect()
}

/// Live claims across the fleet's sandboxd simulators.
fn vms_held(fleet: &Fleet) -> usize {
    fleet
        .members
        .iter()
        .map(|m| m.sim.sim().claims().len())
        .sum()
}

async fn set_mode(fleet: &Fleet, names: &[String], mode: &str) {
    let api: Api<Sandbox> = Api::namespaced(fleet.client(), &fleet.ns);
    for name in names {
        support::controller::set_operating_mode(&api, name, mode).await;
    }
}

/// Done when `these` is empty; else how many are `what`, a few named.
fn none_of(these: Vec<String>, what: &str) -> Result<(), String> {
    if these.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} {what}, e.g. {:?}",
            these.len(),
            &these[..these.len().min(3)]
        ))
    }
}

/// Waits until none of `names` has a Pod.
async fn wait_gone(fleet: &Fleet, names: &[String], timeout: Duration) {
    let pods = fleet.pods();
    wait_for(
        &format!("the Pods of {} Sandboxes gone", names.len()),
        timeout,
        || async {
            let list = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let left: Vec<String> = list
                .items
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .filter(|n| names.contains(n))
                .collect();
            none_of(left, "left")
        },
    )
    .await
}

/// Waits until every node's NodeInventory lists the VMs of `names` (the
/// webhook reads them there).
async fn wait_inventoried(fleet: &Fleet, names: &[String]) {
    let api: Api<kube::api::DynamicObject> = Api::all_with(
        fleet.client(),
        &support::crds::nodeinventories("sandbox.cocoonstack.io"),
    );
    let want: Vec<String> = names.iter().map(|n| format!("{}/{n}", fleet.ns)).collect();
    wait_for(
        "every Sandbox's VM in a NodeInventory",
        Duration::from_secs(30),
        || async {
            let list = api
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let held: Vec<String> = list
                .items
                .iter()
                .flat_map(|inv| {
                    inv.data["entries"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(|e| e["claimRef"].as_str().map(str::to_string))
                })
                .collect();
            let missing = want.iter().filter(|k| !held.contains(k)).cloned().collect();
            none_of(missing, "missing")
        },
    )
    .await
}

/// The outage tolerations as the webhook sets them, and nothing limiting.
fn tolerates_outages_for_ever(p: &Pod) -> bool {
    let ts = p
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    [
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/not-ready",
    ]
    .iter()
    .all(|key| {
        let of_key: Vec<_> = ts
            .iter()
            .filter(|t| t.key.as_deref() == Some(*key) && t.effect.as_deref() == Some("NoExecute"))
            .collect();
        !of_key.is_empty() && of_key.iter().all(|t| t.toleration_seconds.is_none())
    })
}

/// The fleet's webhook configuration.
fn hook_name(fleet: &Fleet) -> String {
    format!("vk-sandbox-placement-{}", fleet.group)
}

/// The fleet, every node publishing its NodeInventory, node `server`
/// serving the webhook and the webhook configured for the fleet's
/// namespace; `None` without a cluster.
async fn webhook_fleet(server: usize) -> Option<Fleet> {
    let cluster = support::cluster().await?;
    support::crds::install_file(
        &cluster.client,
        &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("crds/sandbox.cocoonstack.io_nodeinventories.yaml"),
    )
    .await;
    let dir = support::vk::test_dir("placement-webhook");
    let (cert, key, pem) = webhook_pair(&dir);
    let port = free_port();
    let webhook_args = [
        format!("--webhook-addr=127.0.0.1:{port}"),
        format!("--webhook-tls-cert={}", cert.display()),
        format!("--webhook-tls-key={}", key.display()),
    ];
    let fleet = fleet::setup(|i| {
        let mut args = vec![
            "--publish-inventory=true".to_string(),
            "--publish-interval=1s".to_string(),
            "--inventory-group=sandbox.cocoonstack.io".to_string(),
        ];
        if i == server {
            args.extend(webhook_args.iter().cloned());
        }
        args
    })
    .await?;

    // The webhook, for this test's namespace only, sandbox Pods only.
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(fleet.client());
    let hook_name = hook_name(&fleet);
    let hook: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": hook_name},
        "webhooks": [{
            "name": "placement.sandbox.cocoonstack.io",
            "clientConfig": {
                "url": format!("https://127.0.0.1:{port}/mutate-pods"),
                "caBundle": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, pem.as_bytes()),
            },
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": fleet.ns}},
            "matchConditions": [{
                "name": "sandbox-runtime",
                "expression": "has(object.metadata.annotations) && \
                    object.metadata.annotations[?'sandbox.cocoonstack.io/runtime'].orValue('') == 'sandboxd'",
            }],
            "failurePolicy": "Ignore",
            "timeoutSeconds": 5,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
        }],
    }))
    .expect("webhook configuration");
    hooks
        .create(&PostParams::default(), &hook)
        .await
        .expect("create the MutatingWebhookConfiguration");
    Some(fleet)
}

#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_come_back_to_the_node_holding_their_vm() {
    let Some(fleet) = webhook_fleet(0).await else {
        return;
    };
    let nodes: Vec<String> = (0..3).map(|i| fleet.node(i).to_string()).collect();
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(fleet.client());
    let hook_name = hook_name(&fleet);
    // Sandboxes spread by the scheduler (their VMs are on no node yet).
    let started = Instant::now();
    let names = fleet.create("placed", SUSPENDED).await;
    let first = fleet.wait_running(&names, Duration::from_secs(180)).await;
    let before = seen(&fleet, &names).await;
    let mut per_node: BTreeMap<&str, usize> = nodes.iter().map(|n| (n.as_str(), 0)).collect();
    for node in first.values() {
        *per_node.entry(node.as_str()).or_default() += 1;
    }
    println!(
        "{SUSPENDED} Sandboxes Running in {:?}: {per_node:?}",
        started.elapsed()
    );
    assert!(
        per_node.values().filter(|c| **c > 0).count() >= 2,
        "the Sandboxes should spread (else every resume lands on its node by chance): {per_node:?}"
    );
    let pods = fleet
        .pods()
        .list(&ListParams::default())
        .await
        .expect("pods");
    for p in pods
        .items
        .iter()
        .filter(|p| names.contains(p.metadata.name.as_ref().unwrap()))
    {
        assert!(
            tolerates_outages_for_ever(p),
            "{:?}: tolerations {:?}; webhook log:\n{}",
            p.metadata.name,
            p.spec.as_ref().and_then(|s| s.tolerations.clone()),
            tail(&fleet.members[0].vk.logs(), 30)
        );
    }
    wait_inventoried(&fleet, &names).await;

    // Suspend all, then resume all.
    let asked = claims_asked(&fleet);
    let started = Instant::now();
    set_mode(&fleet, &names, "Suspended").await;
    wait_gone(&fleet, &names, Duration::from_secs(120)).await;
    println!("{SUSPENDED} suspended in {:?}", started.elapsed());
    let started = Instant::now();
    set_mode(&fleet, &names, "Running").await;
    fleet.wait_running(&names, Duration::from_secs(180)).await;
    println!("{SUSPENDED} resumed in {:?}", started.elapsed());
    let after = seen(&fleet, &names).await;
    let moved = changed(&before, &after, &names);
    assert!(
        moved.is_empty(),
        "{} of {SUSPENDED} resumed elsewhere or on another VM: {moved:?}; webhook log:\n{}",
        moved.len(),
        tail(&fleet.members[0].vk.logs(), 30)
    );
    assert_eq!(
        claims_asked(&fleet),
        asked,
        "fresh VMs were claimed on resume"
    );
    assert_eq!(
        vms_held(&fleet),
        SUSPENDED,
        "one VM per Sandbox across the fleet, none left behind"
    );

    // The Pods of REPLACED Sandboxes deleted, as an eviction does.
    let replaced: Vec<String> = names[..REPLACED].to_vec();
    let old_uids: BTreeMap<String, String> = {
        let list = fleet
            .pods()
            .list(&ListParams::default())
            .await
            .expect("pods");
        list.items
            .iter()
            .filter_map(|p| Some((p.metadata.name.clone()?, p.metadata.uid.clone()?)))
            .collect()
    };
    let started = Instant::now();
    for name in &replaced {
        fleet
            .pods()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete Pod {name}: {e}"));
    }
    let pods = fleet.pods();
    wait_for(
        &format!("{REPLACED} replacement Pods"),
        Duration::from_secs(120),
        || async {
            let list = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let fresh = list
                .items
                .iter()
                .filter(|p| {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    replaced.contains(&name)
                        && p.metadata.uid != old_uids.get(&name).cloned()
                        && fleet::running_and_ready(p)
                })
                .count();
            if fresh == REPLACED {
                Ok(())
            } else {
                Err(format!("{fresh} of {REPLACED} replaced and Running"))
            }
        },
    )
    .await;
    println!("{REPLACED} Pods replaced in {:?}", started.elapsed());
    let replaced_seen = seen(&fleet, &replaced).await;
    let moved = changed(&before, &replaced_seen, &replaced);
    assert!(
        moved.is_empty(),
        "{} of {REPLACED} replacements elsewhere or on another VM: {moved:?}",
        moved.len()
    );
    assert_eq!(
        claims_asked(&fleet),
        asked,
        "fresh VMs were claimed for replacements"
    );
    assert_eq!(
        vms_held(&fleet),
        SUSPENDED,
        "one VM per Sandbox after the replacements"
    );

    let _ = hooks.delete(&hook_name, &DeleteParams::default()).await;
    fleet.delete(&names).await;
    fleet.cluster.drop_namespace(&fleet.ns).await;
}

/// The webhook's answer to `review`.
async fn ask(
    http: &reqwest::Client,
    url: &str,
    review: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    let r = http
        .post(url)
        .json(review)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    r.json().await.map_err(|e| e.to_string())
}

/// The webhook reads the NodeInventories of the group `--inventory-group`
/// names (here the one sandbox-operator builds read), over its own TLS
/// pair: an inventory written there pins a Pod of its key to its node.
#[tokio::test(flavor = "multi_thread")]
async fn the_webhook_reads_the_inventory_group_it_is_given() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let group = "extensions.agents.x-k8s.io";
    support::crds::install_file(
        &cluster.client,
        &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("crds/{group}_nodeinventories.yaml")),
    )
    .await;
    let dir = support::vk::test_dir("placement-group");
    let (cert, key, pem) = webhook_pair(&dir);
    let port = free_port();
    let sim = support::sim::start(support::sim::config(fleet::TOKEN, &["base=1"])).await;
    let token_file = support::sim::token_file(&dir, fleet::TOKEN);
    let mut args = support::sim::vk_args(&sim, Some(&token_file));
    args.extend([
        format!("--inventory-group={group}"),
        format!("--webhook-addr=127.0.0.1:{port}"),
        format!("--webhook-tls-cert={}", cert.display()),
        format!("--webhook-tls-key={}", key.display()),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let vk = support::vk::VkUnderTest::start(&cluster, "placement-group", &args).await;

    // Another node's inventory, as its vk-sandbox would publish it.
    let other = format!("elsewhere-{}", support::suffix());
    let api: Api<kube::api::DynamicObject> = Api::all_with(
        cluster.client.clone(),
        &support::crds::nodeinventories(group),
    );
    let inv: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{group}/v1beta1"), "kind": "NodeInventory",
        "metadata": {"name": other}, "node": other,
        "entries": [{"name": "team/sbx", "phase": "Hibernated", "id": "sb_1",
                     "claimRef": "team/sbx", "addr": "10.0.0.9"}],
    }))
    .expect("inventory");
    api.create(&PostParams::default(), &inv)
        .await
        .expect("create the NodeInventory");

    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).expect("CA"))
        .build()
        .expect("client");
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "sbx", "namespace": "team", "operation": "CREATE",
            "userInfo": {"username": "test"},
            "object": {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "sbx", "annotations": {"sandbox.cocoonstack.io/runtime": "sandboxd"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        }
    });
    let url = format!("https://127.0.0.1:{port}/mutate-pods");
    let answer = wait_for(
        "the webhook pins team/sbx to the other node",
        Duration::from_secs(30),
        || async {
            let v = ask(&http, &url, &review).await?;
            let placement = v["response"]["auditAnnotations"]["placement"].clone();
            if placement == json!(format!("pinned to {other}")) {
                Ok(v)
            } else {
                Err(format!("{placement}; log:\n{}", tail(&vk.logs(), 10)))
            }
        },
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["patchType"], "JSONPatch");

    // Its inventory gone, the key is held nowhere: no affinity.
    api.delete(&other, &DeleteParams::default())
        .await
        .expect("delete the NodeInventory");
    wait_for(
        "the webhook forgets the deleted inventory",
        Duration::from_secs(30),
        || async {
            let v = ask(&http, &url, &review).await?;
            let placement = v["response"]["auditAnnotations"]["placement"].clone();
            if placement == json!("its VM is on no node") {
                Ok(())
            } else {
                Err(placement.to_string())
            }
        },
    )
    .await;
}

fn ready_pods_of(list: &[Pod], names: &[String]) -> usize {
    list.iter()
        .filter(|p| names.contains(p.metadata.name.as_ref().unwrap_or(&String::new())))
        .filter(|p| fleet::running_and_ready(p))
        .count()
}

/// A node agent hung (SIGSTOP) past the point where the node lifecycle
/// controller taints its Node unreachable and the apiserver's default
/// toleration (30 s on the local plane) runs out: a Pod without the
/// webhook's tolerations on that node is evicted, its sandboxes, which
/// tolerate the outage as the webhook set it, are not. After SIGCONT they
/// are all Ready again within 5 s. The webhook is served by another node.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_outage_evicts_no_sandbox() {
    let Some(fleet) = webhook_fleet(1).await else {
        return;
    };
    let names = fleet.create("outage", 9).await;
    fleet.wait_running(&names, Duration::from_secs(120)).await;
    let pods = fleet.pods();
    let list = pods.list(&ListParams::default()).await.expect("pods");
    let here: BTreeMap<String, String> = list
        .items
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(fleet.node(0)))
        .filter_map(|p| Some((p.metadata.name.clone()?, p.metadata.uid.clone()?)))
        .collect();
    assert!(!here.is_empty(), "no Sandbox on node 0 of 9");
    let on_it: Vec<String> = here.keys().cloned().collect();

    // The control: a sandbox Pod the webhook does not see (another
    // namespace), bound to node 0, with the apiserver's default
    // tolerations only.
    let ctl_ns = fleet.cluster.namespace("outage-ctl").await;
    let ctl: Api<Pod> = Api::namespaced(fleet.client(), &ctl_ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "ctl", "annotations": {
            "sandbox.cocoonstack.io/runtime": "sandboxd",
            "sandbox.cocoonstack.io/template": fleet::TEMPLATE,
        }},
        "spec": {
            "nodeName": fleet.node(0),
            "tolerations": [support::controller::provider_toleration()],
            "containers": [{"name": "agent", "image": fleet::TEMPLATE}],
        }
    }))
    .expect("pod json");
    ctl.create(&PostParams::default(), &pod)
        .await
        .expect("create the control Pod");
    wait_for(
        "the control Pod Running",
        Duration::from_secs(60),
        || async {
            let p = ctl.get("ctl").await.map_err(|e| e.to_string())?;
            if fleet::running_and_ready(&p) {
                Ok(())
            } else {
                Err(format!("{:?}", p.status.and_then(|s| s.phase)))
            }
        },
    )
    .await;

    let vk = &fleet.members[0].vk;
    vk.process.signal(nix::sys::signal::Signal::SIGSTOP);
    let stopped = Instant::now();
    wait_for(
        "the control Pod evicted (the outage reached eviction)",
        Duration::from_secs(180),
        || async {
            match ctl.get_opt("ctl").await.map_err(|e| e.to_string())? {
                Some(p) if p.metadata.deletion_timestamp.is_none() => Err("not evicted yet".into()),
                _ => Ok(()),
            }
        },
    )
    .await;
    let evicted_after = stopped.elapsed();
    // A little past it, to give a late eviction its chance.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let list = pods.list(&ListParams::default()).await.expect("pods");
    let kept: Vec<String> = list
        .items
        .iter()
        .filter(|p| {
            let name = p.metadata.name.clone().unwrap_or_default();
            here.get(&name) == p.metadata.uid.as_ref() && p.metadata.deletion_timestamp.is_none()
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    println!(
        "outage: the control Pod evicted {evicted_after:?} after the stop; {} of {} sandboxes kept",
        kept.len(),
        here.len()
    );
    assert_eq!(
        kept.len(),
        here.len(),
        "sandboxes evicted: kept {kept:?} of {on_it:?}"
    );

    vk.process.signal(nix::sys::signal::Signal::SIGCONT);
    let resumed = Instant::now();
    wait_for(
        "node 0's sandboxes Ready again",
        Duration::from_secs(60),
        || async {
            let list = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let ready = ready_pods_of(&list.items, &on_it);
            if ready == on_it.len() {
                Ok(())
            } else {
                Err(format!("{ready} of {} Ready", on_it.len()))
            }
        },
    )
    .await;
    let took = resumed.elapsed();
    println!(
        "outage: node 0's {} sandboxes Ready {took:?} after SIGCONT",
        on_it.len()
    );
    assert!(
        took <= Duration::from_secs(5),
        "Ready again only {took:?} after the resume; log:\n{}",
        tail(&vk.logs(), 20)
    );

    let hooks: Api<MutatingWebhookConfiguration> = Api::all(fleet.client());
    let _ = hooks
        .delete(&hook_name(&fleet), &DeleteParams::default())
        .await;
    fleet.delete(&names).await;
    fleet.cluster.drop_namespace(&ctl_ns).await;
    fleet.cluster.drop_namespace(&fleet.ns).await;
}

/// The Warning Events of `reason` in the fleet's namespace: their notes.
async fn event_notes(fleet: &Fleet, reason: &str) -> Vec<String> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(fleet.client(), &fleet.ns);
    events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.message)
        .collect()
}

/// The sandboxes (node index, id) held for Sandbox `name` across the fleet.
fn held_for(fleet: &Fleet, name: &str) -> Vec<(usize, String)> {
    let key = format!("{}/{name}#", fleet.ns);
    fleet
        .members
        .iter()
        .enumerate()
        .flat_map(|(i, m)| {
            m.sim
                .sim()
                .claims()
                .into_iter()
                .filter(|c| c.claim_ref.starts_with(&key))
                .map(move |c| (i, c.id))
        })
        .collect()
}

/// Without the webhook (no configuration: as when it is down with
/// `failurePolicy: Ignore`), a resumed Sandbox's Pod that reaches another
/// node is handed back while the node holding its VM lives, and ends on
/// that node with its claim; no second VM is claimed. With that node's
/// sandboxd stopped past `--vm-holder-gone-after` (15 s here), a
/// replacement Pod is served a fresh VM elsewhere with a Warning Event,
/// and the first node releases its VM once it returns and sees the
/// Sandbox Running there — not before.
#[tokio::test(flavor = "multi_thread")]
async fn without_the_webhook_a_pod_is_handed_back_to_its_vm_or_moved_when_that_node_is_gone() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    support::crds::install_file(
        &cluster.client,
        &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("crds/sandbox.cocoonstack.io_nodeinventories.yaml"),
    )
    .await;
    drop(cluster);
    let Some(fleet) = fleet::setup(|_| {
        vec![
            "--publish-inventory=true".to_string(),
            "--publish-interval=1s".to_string(),
            "--inventory-group=sandbox.cocoonstack.io".to_string(),
            "--vm-holder-gone-after=15s".to_string(),
        ]
    })
    .await
    else {
        return;
    };
    let names = fleet.create("held", 1).await;
    let name = names[0].clone();
    let first = fleet.wait_running(&names, Duration::from_secs(60)).await;
    let before = seen(&fleet, &names).await;
    let (node, claim, _) = before[&name].clone();
    let x = (0..3).find(|i| fleet.node(*i) == node).expect("its node");
    let others: Vec<usize> = (0..3).filter(|i| *i != x).collect();
    println!("{name} runs on {} with {claim}", first[&name]);
    wait_inventoried(&fleet, &names).await;

    // Suspended; resumed with its node cordoned: the Pod reaches the other
    // nodes and each gives it back.
    set_mode(&fleet, &names, "Suspended").await;
    wait_gone(&fleet, &names, Duration::from_secs(60)).await;
    fleet.cordon(x, true).await;
    set_mode(&fleet, &names, "Running").await;
    wait_for(
        "the resumed Pod handed back by another node",
        Duration::from_secs(60),
        || async {
            let notes = event_notes(&fleet, "HandedBack").await;
            let held_there = format!("held on node {node}");
            if notes.iter().any(|n| n.contains(&held_there)) {
                Ok(())
            } else {
                Err(format!("{notes:?}"))
            }
        },
    )
    .await;
    // Its node open again and the others closed: it lands there, on its VM.
    for i in &others {
        fleet.cordon(*i, true).await;
    }
    fleet.cordon(x, false).await;
    fleet.wait_running(&names, Duration::from_secs(60)).await;
    let after = seen(&fleet, &names).await;
    assert_eq!(
        (after[&name].0.as_str(), after[&name].1.as_str()),
        (node.as_str(), claim.as_str()),
        "resumed elsewhere or on another VM"
    );
    assert_eq!(
        held_for(&fleet, &name),
        vec![(x, claim.clone())],
        "a second VM"
    );
    for i in &others {
        fleet.cordon(*i, false).await;
    }

    // Its node's sandboxd stopped; the Pod deleted (as an eviction): the
    // replacement goes elsewhere (the node is tainted unreachable), is
    // handed back within the grace, then served a fresh VM.
    fleet.members[x].sim.sim().set_accepting(false);
    let stopped = Instant::now();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(fleet.client());
    wait_for(
        "the stopped node tainted unreachable",
        Duration::from_secs(20),
        || async {
            let n = nodes.get(&node).await.map_err(|e| e.to_string())?;
            let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
            if taints
                .iter()
                .any(|t| t.key == "sandbox.cocoonstack.io/unreachable")
            {
                Ok(())
            } else {
                Err(format!("{taints:?}"))
            }
        },
    )
    .await;
    fleet
        .pods()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the Pod");
    let moved = fleet.wait_running(&names, Duration::from_secs(90)).await;
    let took = stopped.elapsed();
    let now = seen(&fleet, &names).await;
    println!(
        "{name} moved to {} with {} after {took:?}",
        moved[&name], now[&name].1
    );
    assert_ne!(moved[&name], node, "still on the stopped node");
    assert_ne!(now[&name].1, claim, "the old VM is on the stopped node");
    // The condition's time has a second's precision.
    assert!(
        took >= Duration::from_secs(13),
        "served before the grace: {took:?}"
    );
    let notes = event_notes(&fleet, "SandboxMovedNode").await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains(&format!("was on node {node}"))),
        "{notes:?}"
    );
    // The old VM is kept while its node is away...
    assert!(
        fleet.members[x]
            .sim
            .sim()
            .claims()
            .iter()
            .any(|c| c.id == claim),
        "the old VM went while its node was away"
    );
    // ...and released once it returns and sees the Sandbox Running there.
    fleet.members[x].sim.sim().set_accepting(true);
    wait_for(
        "the old VM released by its returning node",
        Duration::from_secs(90),
        || async {
            let held = held_for(&fleet, &name);
            if held.len() == 1 && held[0].1 == now[&name].1 {
                Ok(())
            } else {
                Err(format!("{held:?}"))
            }
        },
    )
    .await;
    fleet.delete(&names).await;
    fleet.cluster.drop_namespace(&fleet.ns).await;
}
