//! The upstream agent-sandbox Go SDK (`clients/go/sandbox`) in port-forward
//! mode, as a user of agent-sandbox runs it, against a sandbox on a
//! vk-sandbox node: the SDK claims a sandbox from a SandboxWarmPool (the
//! upstream controller adopts a warm Sandbox whose Pod runs on a sandboxd
//! VM), port-forwards to the Pod's runtime ports through the apiserver and
//! vk-sandbox's kubelet API (SPDY), and runs a command and writes and reads
//! a file. The runtime is agent-sandbox's own in-sandbox daemon
//! (`packages/sandboxd`, REST + gRPC on loopback), run here as the guest
//! service the simulator's `/ports` relay leads to.
//!
//! Skipped (with the reason) only where upstream cannot be fetched and
//! VK_REQUIRE_REAL_CONTROLLER is not 1.

mod support;

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DynamicObject, ListParams, PostParams};
use serde_json::Value;
use support::controller as ctl;
use support::vk::{StartOpts, VkUnderTest, tail};
use support::wait_for;

const TOKEN: &str = "sdk-token";
const TEMPLATE: &str = "base:24.04";
const POOL: &str = "sdk-pool";

#[tokio::test(flavor = "multi_thread")]
async fn the_go_sdk_runs_a_command_and_moves_a_file_through_port_forward() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    if !ctl::upstream_or_skip("the Go SDK end to end") {
        return;
    }
    let (runtime_bin, driver) = support::upstream::sdk();
    let runtime = support::upstream::Runtime::start(&runtime_bin).await;

    // The template's guest ports 8080 (REST) and 9090 (gRPC), the SDK's
    // defaults, lead to the runtime.
    let mut cfg = support::sim::config(TOKEN, &[&format!("{TEMPLATE}=2")]);
    cfg.wake_delay_ms = 0;
    support::sim::lead_template_ports(
        &mut cfg,
        TEMPLATE,
        &[(8080, runtime.rest), (9090, runtime.grpc)],
    );
    let sim = support::sim::start(cfg).await;
    let token_file = support::sim::token_file(&support::vk::test_dir("vk-sdk"), TOKEN);
    let args = support::sim::vk_args(&sim, Some(&token_file));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let vk = VkUnderTest::start_with(&cluster, "vk-sdk", &args, StartOpts::default()).await;
    vk.wait_ready(&cluster.client, Duration::from_secs(30))
        .await;
    ctl::install_crds(&cluster.client, &cluster.kubeconfig).await;
    let ns = cluster.namespace("vk-sdk").await;
    let _controller = ctl::start(&cluster.client, &cluster.kubeconfig, &ns).await;
    let api = |kind: &str| -> Api<DynamicObject> {
        Api::namespaced_with(cluster.client.clone(), &ns, &ctl::resource(kind))
    };
    for (kind, obj) in [
        (
            "SandboxTemplate",
            ctl::contract_template("sdk-template", TEMPLATE, Some(&vk.node)),
        ),
        ("SandboxWarmPool", ctl::warm_pool(POOL, "sdk-template", 1)),
    ] {
        let obj: DynamicObject = serde_json::from_value(obj).expect("object json");
        api(kind)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("create {kind}: {e}"));
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    wait_for(
        "the warm pool's Pod Running on a VM",
        Duration::from_secs(120),
        || async {
            let list = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .iter()
                .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .then_some(())
                .ok_or(format!(
                    "{} Pods, none Running; log:\n{}",
                    list.items.len(),
                    tail(&vk.logs(), 10)
                ))
        },
    )
    .await;

    // The SDK, as a user runs it (KUBECONFIG names the cluster).
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new(&driver)
            .args([POOL, &ns])
            .env("KUBECONFIG", &cluster.kubeconfig)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the SDK driver within 5 minutes")
    .expect("run the SDK driver");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let why = format!(
        "stdout:\n{stdout}\nstderr (last 2000 bytes):\n{}\nvk-sandbox log:\n{}",
        &stderr[stderr.len().saturating_sub(2000)..],
        tail(&vk.logs(), 20)
    );
    assert!(out.status.success(), "the SDK driver failed: {why}");
    let steps: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let step = |name: &str| {
        steps
            .iter()
            .find(|s| s["step"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} step: {why}"))
    };
    let run = step("run");
    assert_eq!(run["stdout"], "hello from the sandbox\n", "{why}");
    assert_eq!(run["stderr"], "to stderr\n", "{why}");
    assert_eq!(run["exit_code"], 4, "{why}");
    let read = step("read");
    assert_eq!(
        read["content"], "written through vk-sandbox's port-forward\n",
        "{why}"
    );
    step("close");
    // The file is where the runtime keeps the sandbox's files.
    let on_disk = std::fs::read_to_string(runtime.root.join("notes/greeting.txt"))
        .expect("the runtime wrote the file");
    assert_eq!(on_disk, "written through vk-sandbox's port-forward\n");
    // Every byte went through vk-sandbox's port-forward.
    let log = vk.logs();
    assert!(
        log.lines()
            .any(|l| l.contains("request authorized") && l.contains("path=/portForward/")),
        "vk-sandbox served no port-forward: {why}"
    );
    cluster.drop_namespace(&ns).await;
    vk.delete_node(&cluster.client).await;
}
