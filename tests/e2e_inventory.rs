//! NodeInventory publishing and the orphan audit scan on the real local
//! control plane with the CRDs from `crds/`, the sandboxd simulator and the
//! vk-sandbox binary.

mod support;

use std::path::Path;
use std::time::Duration;

use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use sandboxd_sim::SimHandle;
use sandboxd_sim::{ClaimPatch, Fault};
use serde_json::{Value, json};
use support::vk::{StartOpts, VkUnderTest, tail};
use support::{TestCluster, metric, wait_for};
use vk_sandbox::sandboxd::{ClaimRequest, SandboxdClient};

const TOKEN: &str = "root-token-inventory";
const DEFAULT_GROUP: &str = "sandbox.cocoonstack.io";
const EXTENSIONS_GROUP: &str = "extensions.agents.x-k8s.io";

fn inventory_resource(group: &str) -> ApiResource {
    support::crds::nodeinventories(group)
}

/// The NodeInventory CRDs of `crds/`, one per group vk-sandbox can publish in.
async fn install_crds(cluster: &TestCluster) {
    for group in [DEFAULT_GROUP, EXTENSIONS_GROUP] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("crds/{group}_nodeinventories.yaml"));
        support::crds::install_file(&cluster.client, &path).await;
    }
}

async fn start_sim() -> SimHandle {
    support::sim::start(support::sim::config(TOKEN, &["base:24.04=4"])).await
}

fn sandboxd(sim: &SimHandle) -> SandboxdClient {
    SandboxdClient::builder(sim.base_url())
        .token(Some(TOKEN.to_string()))
        .build()
        .expect("sandboxd client")
}

/// Claims one sandbox directly from the simulator (as another client would).
async fn claim(sim: &SimHandle, claim_ref: &str) -> vk_sandbox::sandboxd::Granted {
    sandboxd(sim)
        .claim(&ClaimRequest {
            template: "base:24.04".into(),
            claim_ref: claim_ref.into(),
            ..Default::default()
        })
        .await
        .expect("claim from the simulator")
}

/// vk-sandbox for a fresh node, with `state` (a Go claims.json) seeded.
async fn start_vk(
    cluster: &TestCluster,
    sim: &SimHandle,
    prefix: &str,
    state: Option<Value>,
    extra: &[&str],
) -> VkUnderTest {
    let token = support::sim::token_file(&support::vk::test_dir(&format!("{prefix}-token")), TOKEN);
    let mut args = support::sim::vk_args(sim, Some(&token));
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let state = state.map(|s| s.to_string());
    let vk = VkUnderTest::start_with(
        cluster,
        prefix,
        &args,
        StartOpts {
            state: state.as_deref(),
            ..Default::default()
        },
    )
    .await;
    vk.wait_ready(&cluster.client, Duration::from_secs(30))
        .await;
    vk
}

async fn wait_metric(vk: &VkUnderTest, series: &str, at_least: f64) -> String {
    wait_for(
        &format!("{series} >= {at_least}"),
        Duration::from_secs(30),
        || async {
            let text = vk.metrics().await;
            match metric(&text, series) {
                Some(v) if v >= at_least => Ok(text),
                other => Err(format!(
                    "{series} = {other:?}; log:\n{}",
                    tail(&vk.logs(), 15)
                )),
            }
        },
    )
    .await
}

/// The node's NodeInventory once it is published.
async fn wait_inventory(api: &Api<DynamicObject>, vk: &VkUnderTest, group: &str) -> DynamicObject {
    wait_for(
        &format!("NodeInventory {} in {group}", vk.node),
        Duration::from_secs(30),
        || async {
            match api.get_opt(&vk.node).await {
                Ok(Some(o)) => Ok(o),
                Ok(None) => Err(format!("absent; log:\n{}", tail(&vk.logs(), 15))),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await
}

fn entries(obj: &DynamicObject) -> Vec<Value> {
    obj.data["entries"].as_array().cloned().unwrap_or_default()
}

/// The NodeInventory in either group: the held and the other sandboxes,
/// the pools and the advertised address; then an unchanged inventory is
/// not applied again, a change is, and failed sandboxd queries skip the
/// tick without publishing a half-empty object.
#[tokio::test(flavor = "multi_thread")]
async fn inventory_published_only_when_changed() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    install_crds(&cluster).await;
    let sim = start_sim().await;
    let held = claim(&sim, "ns1/a").await;
    let other = claim(&sim, "").await;
    sim.sim()
        .patch_claim(
            &other.id,
            ClaimPatch {
                hibernated: Some(true),
                ..Default::default()
            },
        )
        .expect("hibernate");
    let state = json!({"claims": {"ns1/a": {
        "id": held.id, "token": held.token.expose(), "address": held.owner_addr, "podUID": "uid-a"
    }}});

    // The extensions group first: the default-group round changes the
    // simulator's rows at its end.
    for (group, extra) in [
        (
            EXTENSIONS_GROUP,
            vec!["--inventory-group=extensions.agents.x-k8s.io"],
        ),
        (DEFAULT_GROUP, vec![]),
    ] {
        let mut args = vec![
            "--publish-inventory",
            "--publish-interval=1s",
            "--sandboxd-advertise-addr=sandboxd-1.example:7777",
        ];
        args.extend(extra);
        let vk = start_vk(&cluster, &sim, "inv", Some(state.clone()), &args).await;
        let api: Api<DynamicObject> =
            Api::all_with(cluster.client.clone(), &inventory_resource(group));
        let obj = wait_inventory(&api, &vk, group).await;
        assert_eq!(obj.data["node"], json!(vk.node));
        assert_eq!(obj.data["address"], json!("sandboxd-1.example:7777"));
        let want_entries = json!([
            {"name": "ns1/a", "phase": "Running", "id": held.id, "claimRef": "ns1/a", "addr": held.owner_addr},
            {"name": other.id, "phase": "Hibernated", "id": other.id, "claimRef": other.id},
        ]);
        // Deadlines come from the simulator's default lease; checked apart.
        let got: Vec<Value> = entries(&obj)
            .into_iter()
            .map(|mut e| {
                assert!(
                    e["deadline"].as_str().is_some_and(|d| d.ends_with('Z')),
                    "deadline on {e}"
                );
                e.as_object_mut().map(|o| o.remove("deadline"));
                e
            })
            .collect();
        assert_eq!(json!(got), want_entries, "entries of {}", obj.data);
        let pools = obj.data["pools"].as_array().cloned().unwrap_or_default();
        assert_eq!(pools.len(), 1, "pools {pools:?}");
        assert_eq!(pools[0]["template"], "base:24.04");
        assert_eq!(pools[0]["net"], "none");
        assert_eq!(pools[0]["size"], "small");
        assert!(pools[0]["warm"].is_i64() && pools[0]["target"] == json!(4));
        let managers: Vec<String> = obj
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.manager.clone())
            .collect();
        assert_eq!(managers, vec!["vk-sandbox".to_string()]);

        // Unchanged: once the simulator's pool has refilled the object
        // stops changing; several ticks later it is the same version and
        // no apply was made meanwhile.
        let unchanged = "vk_sandbox_inventory_skips_total{reason=\"unchanged\"}";
        let applied = "vk_sandbox_inventory_applies_total{result=\"success\"}";
        let text = wait_metric(&vk, unchanged, 1.0).await;
        let (skips, applies) = (metric(&text, unchanged), metric(&text, applied));
        let rv = api
            .get(&vk.node)
            .await
            .expect("get inventory")
            .metadata
            .resource_version;
        let text = wait_metric(&vk, unchanged, skips.unwrap_or(0.0) + 3.0).await;
        assert_eq!(metric(&text, applied), applies, "applies while unchanged");
        let again = api.get(&vk.node).await.expect("get inventory");
        assert_eq!(
            again.metadata.resource_version, rv,
            "an unchanged inventory was written"
        );

        if group == EXTENSIONS_GROUP {
            // Only one group is written per process.
            let default_api: Api<DynamicObject> =
                Api::all_with(cluster.client.clone(), &inventory_resource(DEFAULT_GROUP));
            assert!(default_api.get_opt(&vk.node).await.expect("get").is_none());
            continue;
        }

        // A failed listing, then a failed info: skipped, the object kept.
        let sim_state = sim.sim();
        sim_state
            .arm_fault(fault("list", 3))
            .expect("arm list fault");
        wait_metric(
            &vk,
            "vk_sandbox_inventory_skips_total{reason=\"list_failed\"}",
            1.0,
        )
        .await;
        sim_state.clear_faults();
        sim_state
            .arm_fault(fault("info", 3))
            .expect("arm info fault");
        let released = sandboxd(&sim).release_as_node(&other.id).await;
        assert!(released.is_ok(), "release {released:?}");
        wait_metric(
            &vk,
            "vk_sandbox_inventory_skips_total{reason=\"info_failed\"}",
            1.0,
        )
        .await;
        let during = api.get(&vk.node).await.expect("get inventory");
        assert_eq!(
            entries(&during).len(),
            2,
            "inventory changed while info failed"
        );
        sim_state.clear_faults();

        // A change (the hibernated sandbox released) is applied.
        wait_for(
            "the released entry to leave the inventory",
            Duration::from_secs(30),
            || async {
                let o = api.get(&vk.node).await.map_err(|e| e.to_string())?;
                let n = entries(&o).len();
                if n == 1 {
                    Ok(())
                } else {
                    Err(format!("{n} entries"))
                }
            },
        )
        .await;
        let text = vk.metrics().await;
        assert!(metric(&text, applied) > applies, "no apply after a change");
        for needle in [
            "vk_sandbox_reconcile_runs_total{controller=\"inventory\"}",
            "vk_sandbox_reconcile_runs_total{controller=\"node\"}",
        ] {
            assert!(
                metric(&text, needle).is_some_and(|v| v > 0.0),
                "{needle} in\n{text}"
            );
        }
    }
}

/// A NodeInventory of this node left in a group vk-sandbox does not publish
/// in (the Go build wrote `extensions.agents.x-k8s.io`; here
/// `--inventory-group` names the other) is reported: a warning, the
/// `vk_sandbox_inventory_stale` gauge and a preflight line. Without the
/// flag both served groups are published to and nothing is stale.
#[tokio::test(flavor = "multi_thread")]
async fn a_left_over_inventory_in_the_other_group_is_reported() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    install_crds(&cluster).await;
    let sim = start_sim().await;
    let flagged = [
        "--publish-inventory",
        "--publish-interval=1s",
        "--inventory-group=sandbox.cocoonstack.io",
    ];
    let mut vk = start_vk(&cluster, &sim, "stale", None, &flagged).await;
    // The Go build's object, under the field manager both builds use.
    let ext: Api<DynamicObject> = Api::all_with(
        cluster.client.clone(),
        &inventory_resource(EXTENSIONS_GROUP),
    );
    let left: DynamicObject = support::from_json(json!({
        "apiVersion": format!("{EXTENSIONS_GROUP}/v1beta1"), "kind": "NodeInventory",
        "metadata": {"name": vk.node},
        "node": vk.node, "address": "old:7777",
        "entries": [{"name": "ns/gone", "phase": "Running", "id": "sb_gone", "claimRef": "ns/gone"}],
    }));
    ext.patch(
        &vk.node,
        &kube::api::PatchParams::apply("vk-sandbox").force(),
        &kube::api::Patch::Apply(&left),
    )
    .await
    .expect("the left-over object");
    // Looked for at the first apply of a process.
    restart_vk(&cluster, &mut vk, &sim, &flagged).await;
    let stale = format!("vk_sandbox_inventory_stale{{group=\"{EXTENSIONS_GROUP}\"}}");
    wait_metric(&vk, &stale, 1.0).await;
    let logs = vk.logs();
    assert!(
        logs.contains("no longer publishes")
            && logs.contains(&format!(
                "kubectl delete nodeinventories.{EXTENSIONS_GROUP} {}",
                vk.node
            )),
        "{}",
        tail(&logs, 30)
    );
    let text = vk.metrics().await;
    assert_eq!(
        metric(
            &text,
            &format!("vk_sandbox_inventory_stale{{group=\"{DEFAULT_GROUP}\"}}")
        ),
        Some(0.0),
        "{text}"
    );
    // Left alone: reported, not written.
    let still = ext.get(&vk.node).await.expect("get");
    assert_eq!(still.data["address"], json!("old:7777"));

    // Preflight says so too.
    let kubeconfig = vk.kubeconfig.display().to_string();
    let node = vk.node.clone();
    let sim_url = sim.base_url();
    let token = support::sim::token_file(&support::vk::test_dir("stale-pf"), TOKEN);
    let (_, out) = tokio::task::spawn_blocking(move || {
        support::process::run_to_exit(
            &[
                "preflight",
                &format!("--kubeconfig={kubeconfig}"),
                &format!("--node-name={node}"),
                &format!("--listen-addr=127.0.0.1:{}", support::process::free_port()),
                &format!("--admin-addr=127.0.0.1:{}", support::process::free_port()),
                &format!("--sandboxd-url={sim_url}"),
                &format!("--sandboxd-token-file={}", token.display()),
                "--publish-inventory",
                "--inventory-group=sandbox.cocoonstack.io",
            ],
            &[],
        )
    })
    .await
    .expect("preflight");
    let line = out
        .lines()
        .find(|l| l.contains("NodeInventory left over"))
        .unwrap_or_else(|| panic!("no left-over line:\n{out}"));
    assert!(
        line.starts_with("[warn]")
            && line.contains(&format!("nodeinventories.{EXTENSIONS_GROUP}/")),
        "{out}"
    );

    // Without the flag: both groups served, both published, none stale.
    restart_vk(
        &cluster,
        &mut vk,
        &sim,
        &["--publish-inventory", "--publish-interval=1s"],
    )
    .await;
    wait_for(
        "the extensions object published again",
        Duration::from_secs(30),
        || async {
            let o = ext.get(&vk.node).await.map_err(|e| e.to_string())?;
            if o.data["address"] != json!("old:7777") {
                Ok(())
            } else {
                Err(format!(
                    "still the left-over; log:\n{}",
                    tail(&vk.logs(), 15)
                ))
            }
        },
    )
    .await;
    let text = vk.metrics().await;
    assert_eq!(metric(&text, &stale), Some(0.0), "{text}");
}

/// Stops `vk` (SIGTERM) and starts it again on the same node, state and
/// ports with `extra`; returns once the Node is Ready again.
async fn restart_vk(cluster: &TestCluster, vk: &mut VkUnderTest, sim: &SimHandle, extra: &[&str]) {
    vk.process.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        vk.process.wait_exit(Duration::from_secs(20)).is_some(),
        "SIGTERM ignored"
    );
    let token = support::sim::token_file(&support::vk::test_dir("restart-token"), TOKEN);
    let mut args = support::sim::vk_args(sim, Some(&token));
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    vk.restart(&args);
    // The Node stays Ready across the restart: wait for the new process's
    // admin port instead.
    wait_for(
        "the restarted process's admin port",
        Duration::from_secs(30),
        || async { vk.process.metrics().await.map(drop) },
    )
    .await;
    vk.wait_ready(&cluster.client, Duration::from_secs(30))
        .await;
}

fn fault(endpoint: &str, times: u32) -> Fault {
    serde_json::from_value(
        json!({"endpoint": endpoint, "kind": "status", "status": 500, "times": times}),
    )
    .expect("fault json")
}

/// With --publish-inventory off (and the Node not following sandboxd,
/// the other reader of info), nothing is written and sandboxd's info is
/// never read, while the other loops run.
#[tokio::test(flavor = "multi_thread")]
async fn inventory_off_writes_nothing() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    install_crds(&cluster).await;
    let sim = start_sim().await;
    let vk = start_vk(
        &cluster,
        &sim,
        "noinv",
        None,
        &[
            "--orphan-scan-interval=1s",
            "--node-capacity-from-sandboxd=false",
            "--node-conditions-from-sandboxd=false",
            "--node-taints-from-sandboxd=false",
        ],
    )
    .await;
    // Two audit cycles prove the process has been running its loops.
    wait_metric(
        &vk,
        "vk_sandbox_orphan_audit_scans_total{result=\"success\"}",
        2.0,
    )
    .await;
    for group in [DEFAULT_GROUP, EXTENSIONS_GROUP] {
        let api: Api<DynamicObject> =
            Api::all_with(cluster.client.clone(), &inventory_resource(group));
        assert!(
            api.get_opt(&vk.node).await.expect("get").is_none(),
            "{group}"
        );
    }
    let infos = sim
        .sim()
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/info")
        .count();
    assert_eq!(infos, 0, "GET /v1/info while publishing is off");
}

/// Orphan audit: verdicts logged once per change and exported as
/// gauges; a failed listing skips the cycle and changes nothing; nothing
/// is ever released.
#[tokio::test(flavor = "multi_thread")]
async fn orphan_audit_reports_and_never_releases() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let sim = start_sim().await;
    let held = claim(&sim, "ns1/held").await;
    let stale = claim(&sim, "ns1/stale").await;
    let orphan = claim(&sim, "").await;
    let external = claim(&sim, "elsewhere/x").await;
    let state = json!({"claims": {
        "ns1/held": {"id": held.id, "token": held.token.expose(), "podUID": "u1"},
        "ns1/stale": {"id": stale.id, "token": stale.token.expose(), "podUID": "u2"},
    }});
    let vk = start_vk(
        &cluster,
        &sim,
        "orphan",
        Some(state),
        &["--orphan-scan-interval=1s"],
    )
    .await;
    // Reaped behind vk-sandbox's back after start-up verification vouched
    // for it: the claim row is now stale.
    wait_for("start-up verification", Duration::from_secs(30), || async {
        let c = vk.metrics().await;
        match metric(&c, "vk_sandbox_claims{state=\"settled\"}") {
            Some(v) if v >= 2.0 => Ok(()),
            other => Err(format!("settled claims {other:?}")),
        }
    })
    .await;
    sandboxd(&sim)
        .release_as_node(&stale.id)
        .await
        .expect("release");

    let text = wait_for("verdicts of one scan", Duration::from_secs(30), || async {
        let t = vk.metrics().await;
        let v = |verdict: &str| {
            metric(
                &t,
                &format!("vk_sandbox_orphan_audit_sandboxes{{verdict=\"{verdict}\"}}"),
            )
        };
        if (v("orphan"), v("external"), v("stale")) == (Some(1.0), Some(1.0), Some(1.0)) {
            Ok(t)
        } else {
            Err(format!(
                "orphan {:?} external {:?} stale {:?}",
                v("orphan"),
                v("external"),
                v("stale")
            ))
        }
    })
    .await;
    let scans = metric(
        &text,
        "vk_sandbox_orphan_audit_scans_total{result=\"success\"}",
    )
    .unwrap_or(0.0);
    // More cycles: each verdict is still logged exactly once.
    wait_metric(
        &vk,
        "vk_sandbox_orphan_audit_scans_total{result=\"success\"}",
        scans + 2.0,
    )
    .await;
    let logs = vk.logs();
    let lines_with = |needle: &str, id: &str| {
        logs.lines()
            .filter(|l| l.contains(needle) && l.contains(id))
            .count()
    };
    assert_eq!(
        lines_with("possible orphan sandbox", &orphan.id),
        1,
        "{}",
        tail(&logs, 40)
    );
    assert_eq!(lines_with("claimed outside this provider", &external.id), 1);
    assert_eq!(lines_with("stale claim", &stale.id), 1);

    // A failed listing skips the cycle: gauges and logs unchanged.
    sim.sim()
        .arm_fault(fault("list", 1000))
        .expect("arm list fault");
    let text = wait_metric(
        &vk,
        "vk_sandbox_orphan_audit_scans_total{result=\"skipped\"}",
        2.0,
    )
    .await;
    for verdict in ["orphan", "external", "stale"] {
        assert_eq!(
            metric(
                &text,
                &format!("vk_sandbox_orphan_audit_sandboxes{{verdict=\"{verdict}\"}}")
            ),
            Some(1.0),
            "{verdict} after a skipped cycle"
        );
    }
    let logs = vk.logs();
    assert!(logs.contains("skipping orphan scan this cycle (failed query is not an empty list)"));
    assert_eq!(
        logs.lines()
            .filter(|l| l.contains("possible orphan sandbox"))
            .count(),
        1
    );
    sim.sim().clear_faults();

    // Report only: vk-sandbox released nothing, and the orphan and the
    // external sandbox still exist.
    let releases: Vec<_> = sim
        .sim()
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/release") && !r.path.contains(&stale.id))
        .collect();
    assert!(releases.is_empty(), "releases by vk-sandbox: {releases:?}");
    let live: Vec<String> = sim.sim().claims().into_iter().map(|c| c.id).collect();
    for id in [&orphan.id, &external.id, &held.id] {
        assert!(live.contains(id), "{id} gone from {live:?}");
    }
}

/// Orphan audit: nothing lists before the scanner runs (with
/// `--orphan-scan-interval <= 0` the configuration has no interval and the
/// daemon never starts it: `config/tests/values.rs`); running, it lists
/// every interval, the first one interval in.
#[tokio::test(flavor = "multi_thread")]
async fn scanner_lists_every_interval() {
    let sim = start_sim().await;
    let claims = std::sync::Arc::new(
        vk_sandbox::claims::ClaimsStore::open(
            &support::vk::test_dir("scan-off").join("claims.json"),
        )
        .await
        .expect("claims store"),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let metrics = vk_sandbox::metrics::Metrics::new().expect("metrics");
    let health = vk_sandbox::health::Health::new();
    let scanner = vk_sandbox::orphan::Scanner::new(sandboxd(&sim), claims, metrics.clone());
    assert_eq!(sim.sim().requests().len(), 0);
    let running = tokio::spawn(scanner.run(Duration::from_millis(50), health, stop.clone()));
    wait_for("a scan to list", Duration::from_secs(10), || async {
        let n = sim
            .sim()
            .requests()
            .iter()
            .filter(|r| r.path == "/v1/sandboxes")
            .count();
        if n >= 2 {
            Ok(())
        } else {
            Err(format!("{n} lists"))
        }
    })
    .await;
    stop.cancel();
    running.await.expect("scanner task");
    let scans = metrics.value(
        "vk_sandbox_orphan_audit_scans_total",
        &[("result", "success")],
    );
    assert!(scans >= Some(2.0), "every listed cycle counted: {scans:?}");
}

/// Start-up lists sandboxd once: that listing vouches for the previous
/// run's claims and also feeds the first NodeInventory, which shows the
/// claim it vouched for.
#[tokio::test(flavor = "multi_thread")]
async fn start_up_lists_sandboxd_once() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    install_crds(&cluster).await;
    let sim = start_sim().await;
    let held = claim(&sim, "ns1/once").await;
    let state = json!({"claims": {"ns1/once": {
        "id": held.id, "token": held.token.expose(), "address": held.owner_addr, "podUID": "uid-once"
    }}});
    sim.sim().clear_requests();
    let vk = start_vk(
        &cluster,
        &sim,
        "inv-once",
        Some(state),
        &["--publish-inventory", "--publish-interval=10m"],
    )
    .await;
    let api: Api<DynamicObject> =
        Api::all_with(cluster.client.clone(), &inventory_resource(DEFAULT_GROUP));
    let obj = wait_inventory(&api, &vk, DEFAULT_GROUP).await;
    let ids: Vec<Value> = entries(&obj).iter().map(|e| e["id"].clone()).collect();
    assert_eq!(ids, vec![json!(held.id)], "entries of {}", obj.data);
    // Anything that would list again at start-up has had its moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lists = sim
        .sim()
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == "/v1/sandboxes")
        .count();
    assert_eq!(
        lists,
        1,
        "sandboxd listings at start-up; log:\n{}",
        tail(&vk.logs(), 20)
    );
}
