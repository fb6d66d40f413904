//! NodeInventory where only sandbox-operator's CRD is installed: its group
//! (`extensions.agents.x-k8s.io`, the one its builds read) and its schema
//! (plain lists, no `engine`; `tests/fixtures/operator-nodeinventories.yaml`),
//! without vk-sandbox's CRD for `sandbox.cocoonstack.io`. vk-sandbox, run
//! with `--publish-inventory` and no `--inventory-group`, publishes there,
//! and what it publishes is valid against that schema.
//!
//! The CRDs of the shared plane are not touched: the test runs on a scratch
//! apiserver of its own (`support::scratch`), a real kube-apiserver on the
//! plane's etcd under a prefix of its own.

mod support;

use std::path::Path;
use std::time::Duration;

use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, ValidationDirective};
use serde_json::{Value, json};
use support::scratch::Scratch;
use support::vk::{StartOpts, VkUnderTest, tail};
use support::wait_for;
use vk_sandbox::inventory::desired::desired;
use vk_sandbox::sandboxd::{ClaimRequest, NodeInfo, SandboxRow, SandboxdClient};

const TOKEN: &str = "root-token-operator-crd";
const EXTENSIONS_GROUP: &str = "extensions.agents.x-k8s.io";
const DEFAULT_GROUP: &str = "sandbox.cocoonstack.io";

fn resource(group: &str) -> ApiResource {
    support::crds::nodeinventories(group)
}

fn operator_crd() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/operator-nodeinventories.yaml")
}

/// Every kind of row vk-sandbox publishes: a Pod's (tagged), a neighbour's
/// under the same key, one without a claim, a hibernated and an archived
/// one with a deadline; a pool with and one without sandboxd's engine.
fn every_kind_of_entry(engine: &str) -> vk_sandbox::inventory::NodeInventory {
    let rows: Vec<SandboxRow> = support::from_json(json!([
        {"id": "sb_1", "claim_ref": "ns1/x#vk-sandbox:0b7c2d1e", "deadline": "2026-12-02T10:00:00.25Z"},
        {"id": "sb_2", "claim_ref": "ns1/x"},
        {"id": "sb_3", "claim_ref": ""},
        {"id": "sb_4", "claim_ref": "ns1/h", "hibernated": true},
        {"id": "sb_5", "claim_ref": "ns1/a", "hibernated": true, "archived": true,
         "deadline": "2026-12-03T00:00:00Z"},
    ]));
    let info: NodeInfo = support::from_json(json!({"pools": [
        {"key": {"template": "base:24.04", "net": "none", "size": "small", "engine": engine},
         "warm": 2, "refilling": 0, "target": 4, "golden": true},
        {"key": {"template": "py:3.12", "net": "egress", "size": "medium"},
         "warm": 0, "refilling": 1, "target": 1, "golden": false},
    ]}));
    desired("n-strict", "sandboxd-1.example:7777", &rows, &info, &[])
}

/// The object as vk-sandbox's publisher sends it.
fn body(inv: &vk_sandbox::inventory::NodeInventory, name: &str) -> Value {
    let mut v = serde_json::to_value(inv).expect("encode");
    v["apiVersion"] = json!(format!("{EXTENSIONS_GROUP}/v1beta1"));
    v["kind"] = json!("NodeInventory");
    v["metadata"] = json!({"name": name});
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_operators_crd_is_published_to_with_no_flag() {
    if support::cluster().await.is_none() {
        return;
    }
    let Some(scratch) = Scratch::up("inv-op").await else {
        return;
    };
    let cluster = &scratch.cluster;
    support::crds::install_file(&cluster.client, &operator_crd()).await;
    let served = vk_sandbox::inventory::groups::served_known(&cluster.client)
        .await
        .expect("discovery");
    assert_eq!(
        served,
        vec![EXTENSIONS_GROUP.to_string()],
        "the scratch cluster's CRDs"
    );

    // What vk-sandbox publishes validates against the operator's schema:
    // no field it would prune, but sandboxd's pool engine, which that
    // schema lacks (pruned with a warning by default; docs/architecture.md).
    let api: Api<DynamicObject> =
        Api::all_with(cluster.client.clone(), &resource(EXTENSIONS_GROUP));
    let strict = PatchParams {
        dry_run: true,
        field_validation: Some(ValidationDirective::Strict),
        ..PatchParams::apply("vk-sandbox").force()
    };
    let plain = every_kind_of_entry("");
    assert_eq!(
        plain.entries.len(),
        5,
        "every row shown: {:?}",
        plain.entries
    );
    api.patch("n-strict", &strict, &Patch::Apply(body(&plain, "n-strict")))
        .await
        .unwrap_or_else(|e| panic!("refused by the operator's schema: {e}"));
    let with_engine = every_kind_of_entry("cloud-hypervisor");
    let err = api
        .patch(
            "n-strict",
            &strict,
            &Patch::Apply(body(&with_engine, "n-strict")),
        )
        .await
        .expect_err("engine is not in the operator's schema");
    assert!(
        err.to_string().contains("engine"),
        "only engine is unknown there: {err}"
    );

    // vk-sandbox with --publish-inventory and no --inventory-group.
    let sim = support::sim::start(support::sim::config(TOKEN, &["base:24.04=4"])).await;
    let sandboxd = SandboxdClient::builder(sim.base_url())
        .token(Some(TOKEN.to_string()))
        .build()
        .expect("sandboxd client");
    for claim_ref in ["ns1/x", "ns1/x#vk-sandbox:0b7c2d1e"] {
        sandboxd
            .claim(&ClaimRequest {
                template: "base:24.04".into(),
                claim_ref: claim_ref.into(),
                ..Default::default()
            })
            .await
            .expect("claim");
    }
    let token = support::sim::token_file(&support::vk::test_dir("inv-op-token"), TOKEN);
    let mut args = support::sim::vk_args(&sim, Some(&token));
    args.extend(
        ["--publish-inventory", "--publish-interval=1s"]
            .iter()
            .map(|s| s.to_string()),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let vk = VkUnderTest::start_with(cluster, "inv-op", &args, StartOpts::default()).await;
    vk.wait_ready(&cluster.client, Duration::from_secs(60))
        .await;
    let obj = wait_for(
        &format!("NodeInventory {} in {EXTENSIONS_GROUP}", vk.node),
        Duration::from_secs(60),
        || async {
            match api.get_opt(&vk.node).await {
                Ok(Some(o)) => Ok(o),
                Ok(None) => Err(format!("absent; log:\n{}", tail(&vk.logs(), 15))),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    assert_eq!(obj.data["node"], json!(vk.node));
    let entries = obj.data["entries"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = entries.iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(entries.len(), 2, "both rows of ns1/x shown: {entries:?}");
    assert!(names.contains(&"ns1/x"), "{names:?}");
    assert!(
        entries.iter().all(|e| e["claimRef"] == json!("ns1/x")),
        "{entries:?}"
    );
    let pools = obj.data["pools"].as_array().cloned().unwrap_or_default();
    assert_eq!(pools.len(), 1, "{pools:?}");
    assert_eq!(pools[0]["template"], "base:24.04");
    assert!(
        vk.logs()
            .contains("nodeinventories.extensions.agents.x-k8s.io"),
        "the log says where it publishes:\n{}",
        tail(&vk.logs(), 30)
    );
    // Nothing in the group the cluster does not serve.
    let default_api: Api<DynamicObject> =
        Api::all_with(cluster.client.clone(), &resource(DEFAULT_GROUP));
    assert!(
        !matches!(default_api.get_opt(&vk.node).await, Ok(Some(_))),
        "published in a group the cluster does not serve"
    );
}
