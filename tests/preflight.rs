//! `vk-sandbox preflight` as a process against the local control plane and
//! the sandboxd simulator: a good configuration passes (exit 0, warm pools
//! listed), and each broken one fails its own check with a fix (exit 1).

mod support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use support::process::{dead_kubeconfig, free_port, run_to_exit};
use support::{TestCluster, from_json};

const TOKEN: &str = "preflight-node-token";

/// A simulator with one warm and one cold pool that do not refill while
/// the test runs, its token file, a private directory and node name.
struct Env {
    sim: sandboxd_sim::SimHandle,
    dir: PathBuf,
    token_file: PathBuf,
    node: String,
}

async fn env(prefix: &str) -> Env {
    let sim = support::sim::start(sandboxd_sim::SimConfig {
        refill_delay_ms: 3_600_000,
        ..support::sim::config(TOKEN, &["base:24.04=2/3", "py:3.12=0/1"])
    })
    .await;
    let dir = support::vk::test_dir(prefix);
    let token_file = support::sim::token_file(&dir, &format!("{TOKEN}\n"));
    Env {
        sim,
        dir,
        token_file,
        node: format!("{prefix}-{}", support::suffix()),
    }
}

impl Env {
    /// Runs `vk-sandbox preflight` with this environment's settings, free
    /// loopback ports and a state path in a directory that does not exist
    /// yet; a flag in `extra` replaces the same flag among those.
    /// The process runs off the test's runtime thread, which serves the
    /// simulator meanwhile.
    async fn preflight(&self, kubeconfig: &Path, extra: &[&str]) -> (ExitStatus, String, Duration) {
        let mut args = vec![
            "preflight".to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--node-name={}", self.node),
            format!("--listen-addr=127.0.0.1:{}", free_port()),
            format!("--admin-addr=127.0.0.1:{}", free_port()),
            format!("--sandboxd-url={}", self.sim.base_url()),
            format!("--sandboxd-token-file={}", self.token_file.display()),
            format!(
                "--state-path={}",
                self.dir.join("state/claims.json").display()
            ),
        ];
        // clap refuses a repeated flag: an extra flag replaces the default.
        let flag = |a: &str| a.split('=').next().unwrap_or(a).to_string();
        args.retain(|a| !extra.iter().any(|e| flag(e) == flag(a)));
        args.extend(extra.iter().map(|s| s.to_string()));
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let started = Instant::now();
            let (status, out) = run_to_exit(&args, &[]);
            (status, out, started.elapsed())
        })
        .await
        .expect("run vk-sandbox preflight")
    }
}

/// The checklist line for `check` (`[ok]   name: …`), if any.
fn line<'a>(out: &'a str, marker: &str, check: &str) -> Option<&'a str> {
    let prefix = format!("{marker} {check}:");
    out.lines().find(|l| l.starts_with(&prefix))
}

/// The `fix:` line right after the first `[FAIL] check:` line.
fn fix_of<'a>(out: &'a str, check: &str) -> Option<&'a str> {
    let prefix = format!("[FAIL] {check}:");
    let mut lines = out.lines().skip_while(|l| !l.starts_with(&prefix));
    lines.next()?;
    lines.next().filter(|l| l.starts_with("       fix: "))
}

#[tokio::test]
async fn good_configuration_passes_and_lists_warm_pools() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let kubeconfig = support::vk::sa_kubeconfig(&cluster).await;
    let env = env("pf-good").await;
    let (status, out, took) = env.preflight(&kubeconfig, &[]).await;
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(!out.contains("[FAIL]"), "{out}");
    assert!(took < Duration::from_secs(20), "took {took:?}:\n{out}");
    for check in [
        "configuration",
        "apiserver",
        "RBAC",
        "NodeInventory CRD",
        "node name",
        "sandboxd",
        "warm pools",
        "state directory",
        "state file",
        "kubelet port",
        "admin port",
    ] {
        assert!(
            line(&out, "[ok]  ", check).is_some(),
            "no [ok] {check}:\n{out}"
        );
    }
    let api = line(&out, "[ok]  ", "apiserver").unwrap_or_default();
    assert!(
        api.contains("system:serviceaccount:sandbox-system:vk-sandbox"),
        "{out}"
    );
    let pools = line(&out, "[ok]  ", "warm pools").unwrap_or_default();
    assert!(
        pools.contains("1 of 2 warm")
            && pools.contains("base:24.04 (none, small) warm 2/3")
            && pools.contains("py:3.12 (none, small) warm 0/1"),
        "{out}"
    );
    assert!(out.contains("preflight passed"), "{out}");
    assert!(
        !env.dir.join("state").exists(),
        "preflight created the state directory"
    );

    // An existing Go claims.json is read, never modified.
    let state = env.dir.join("go/claims.json");
    std::fs::create_dir_all(state.parent().expect("parent")).expect("mkdir");
    let go = br#"{"claims":{"ns/p":{"id":"sb_1","token":"t","address":"10.0.0.5:7777","podUID":"u","claimedAt":"2025-01-02T03:04:05Z"}}}"#;
    std::fs::write(&state, go).expect("write claims.json");
    let (status, out, _) = env
        .preflight(&kubeconfig, &[&format!("--state-path={}", state.display())])
        .await;
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(
        line(&out, "[ok]  ", "state file").is_some_and(|l| l.contains("1 claims")),
        "{out}"
    );
    assert_eq!(std::fs::read(&state).expect("read"), go);
    let names: Vec<_> = std::fs::read_dir(state.parent().expect("parent"))
        .expect("ls")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, vec!["claims.json"], "nothing left beside the state");
}

#[tokio::test]
async fn bad_sandboxd_token_fails_with_the_fix() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let kubeconfig = support::vk::sa_kubeconfig(&cluster).await;
    let env = env("pf-token").await;
    let wrong = env.dir.join("wrong-token");
    std::fs::write(&wrong, "not-the-token").expect("write");
    let (status, out, _) = env
        .preflight(
            &kubeconfig,
            &[&format!("--sandboxd-token-file={}", wrong.display())],
        )
        .await;
    assert_eq!(status.code(), Some(1), "{out}");
    let failed = line(&out, "[FAIL]", "sandboxd").unwrap_or_default();
    assert!(failed.contains("rejected the token (HTTP 401"), "{out}");
    let fix = fix_of(&out, "sandboxd").unwrap_or_default();
    assert!(
        fix.contains(&wrong.display().to_string()) && fix.contains("SANDBOXD_TOKEN_FILE"),
        "{out}"
    );
    // The rest is unaffected.
    assert!(line(&out, "[ok]  ", "apiserver").is_some(), "{out}");
    assert!(line(&out, "[ok]  ", "RBAC").is_some(), "{out}");

    // No token at all against a sandboxd that requires one.
    let (status, out, _) = env
        .preflight(&kubeconfig, &["--sandboxd-token-file="])
        .await;
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        fix_of(&out, "sandboxd").is_some_and(|f| f.contains("requires a token")),
        "{out}"
    );
}

#[tokio::test]
async fn a_bound_port_fails() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let kubeconfig = support::vk::sa_kubeconfig(&cluster).await;
    let env = env("pf-port").await;
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let (status, out, _) = env
        .preflight(&kubeconfig, &[&format!("--listen-addr=127.0.0.1:{port}")])
        .await;
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        line(&out, "[FAIL]", "kubelet port").is_some_and(|l| l.contains("already in use")),
        "{out}"
    );
    assert!(
        fix_of(&out, "kubelet port").is_some_and(|f| f.contains("--listen-addr")),
        "{out}"
    );
    assert!(line(&out, "[ok]  ", "admin port").is_some(), "{out}");

    let (status, out, _) = env
        .preflight(&kubeconfig, &[&format!("--admin-addr=127.0.0.1:{port}")])
        .await;
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(line(&out, "[FAIL]", "admin port").is_some(), "{out}");
    assert!(line(&out, "[ok]  ", "kubelet port").is_some(), "{out}");
    drop(taken);
}

/// With `--webhook-addr`: the webhook's pair and port are checked, and
/// the RBAC lines include its NodeInventory watch.
#[tokio::test]
async fn the_webhook_pair_and_port_are_checked() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let kubeconfig = support::vk::sa_kubeconfig(&cluster).await;
    let env = env("pf-webhook").await;
    let pair = |name: &str| {
        let generated =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).expect("self-sign");
        let (cert, key) = (
            env.dir.join(format!("{name}.crt")),
            env.dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert, generated.cert.pem()).expect("cert");
        std::fs::write(&key, generated.signing_key.serialize_pem()).expect("key");
        (cert, key)
    };
    let (cert, key) = pair("a");
    let (_, other_key) = pair("b");
    let flags = |key: &Path| {
        vec![
            format!("--webhook-addr=127.0.0.1:{}", free_port()),
            format!("--webhook-tls-cert={}", cert.display()),
            format!("--webhook-tls-key={}", key.display()),
        ]
    };
    let good = flags(&key);
    let good: Vec<&str> = good.iter().map(String::as_str).collect();
    let (status, out, _) = env.preflight(&kubeconfig, &good).await;
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(
        line(&out, "[ok]  ", "webhook certificate").is_some(),
        "{out}"
    );
    assert!(line(&out, "[ok]  ", "webhook port").is_some(), "{out}");
    // The base RBAC does not let it read webhook configurations (the grant
    // comes with manifests/placement): said, not failed.
    assert!(
        line(&out, "[warn]", "webhook configuration")
            .is_some_and(|l| l.contains("may not list mutatingwebhookconfigurations")),
        "{out}"
    );

    // The key of another pair.
    let bad = flags(&other_key);
    let bad: Vec<&str> = bad.iter().map(String::as_str).collect();
    let (status, out, _) = env.preflight(&kubeconfig, &bad).await;
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        line(&out, "[FAIL]", "webhook certificate").is_some(),
        "{out}"
    );
    assert!(
        fix_of(&out, "webhook certificate").is_some_and(|f| f.contains("--webhook-tls-cert")),
        "{out}"
    );
}

#[tokio::test]
async fn a_physical_node_name_fails_and_a_virtual_one_is_adopted() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let kubeconfig = support::vk::sa_kubeconfig(&cluster).await;
    let env = env("pf-node").await;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let physical = format!("pf-physical-{}", support::suffix());
    let virtual_ = format!("pf-virtual-{}", support::suffix());
    for (name, labels) in [
        (&physical, json!({"kubernetes.io/hostname": physical})),
        (&virtual_, json!({"type": "virtual-kubelet"})),
    ] {
        let node: Node = from_json(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels}
        }));
        nodes
            .create(&PostParams::default(), &node)
            .await
            .expect("create node");
    }
    let (status, out, _) = env
        .preflight(&kubeconfig, &[&format!("--node-name={physical}")])
        .await;
    let (v_status, v_out, _) = env
        .preflight(&kubeconfig, &[&format!("--node-name={virtual_}")])
        .await;
    for name in [&physical, &virtual_] {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
    }
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        line(&out, "[FAIL]", "node name").is_some_and(|l| l.contains("not a virtual kubelet")),
        "{out}"
    );
    assert!(
        fix_of(&out, "node name")
            .is_some_and(|f| f.contains("--node-name") && f.contains("VK_NODE_NAME")),
        "{out}"
    );
    assert_eq!(v_status.code(), Some(0), "{v_out}");
    assert!(
        line(&v_out, "[ok]  ", "node name").is_some_and(|l| l.contains("adopted")),
        "{v_out}"
    );
}

#[tokio::test]
async fn a_service_account_without_rbac_fails_the_rbac_lines() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let env = env("pf-rbac").await;
    let ns = cluster.namespace("pf-rbac").await;
    let sa: ServiceAccount = from_json(json!({
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bare"}
    }));
    Api::<ServiceAccount>::namespaced(cluster.client.clone(), &ns)
        .create(&PostParams::default(), &sa)
        .await
        .expect("create service account");
    let kubeconfig = support::rbac::token_kubeconfig(
        &cluster.client,
        &cluster.kubeconfig,
        &ns,
        "bare",
        &env.dir.join("bare.kubeconfig"),
    )
    .await
    .expect("kubeconfig");
    let (status, out, _) = env.preflight(&kubeconfig, &[]).await;
    cluster.drop_namespace(&ns).await;
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        line(&out, "[ok]  ", "apiserver")
            .is_some_and(|l| l.contains(&format!("system:serviceaccount:{ns}:bare"))),
        "{out}"
    );
    let rbac: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("[FAIL] RBAC:"))
        .collect();
    for expected in [
        "[FAIL] RBAC: nodes: denied get, create, patch",
        "[FAIL] RBAC: pods: denied list, watch, delete",
        "[FAIL] RBAC: leases.coordination.k8s.io in namespace kube-node-lease: denied",
        "[FAIL] RBAC: sandboxes.agents.x-k8s.io: denied get",
        "[FAIL] RBAC: tokenreviews.authentication.k8s.io: denied create",
    ] {
        assert!(
            rbac.iter().any(|l| l.starts_with(expected)),
            "no line starting {expected:?}:\n{out}"
        );
    }
    assert!(
        fix_of(&out, "RBAC").is_some_and(|f| f.contains("manifests/rbac.yaml")),
        "{out}"
    );
    // Reading the Node is denied too.
    assert!(line(&out, "[FAIL]", "node name").is_some(), "{out}");
    // Not publishing: no inventory permission asked for.
    assert!(!out.contains("nodeinventories"), "{out}");
}

/// Installs a minimal cluster-scoped NodeInventory CRD in `group`.
async fn install_inventory_crd(cluster: &TestCluster, group: &str) {
    let crd = from_json(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("nodeinventories.{group}")},
        "spec": {
            "group": group, "scope": "Cluster",
            "names": {"plural": "nodeinventories", "singular": "nodeinventory",
                      "kind": "NodeInventory", "listKind": "NodeInventoryList"},
            "versions": [{"name": "v1beta1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object",
                              "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }));
    support::crds::install(&cluster.client, &crd).await;
}

/// --publish-inventory: the CRD must be served in --inventory-group. Run
/// with the admin credentials (the shipped RBAC grants nodeinventories only
/// in its two groups), in groups private to this test.
#[tokio::test]
async fn inventory_crd_is_required_when_publishing() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let env = env("pf-crd").await;
    let installed = format!("pf{}.example.com", support::suffix());
    let missing = format!("pf{}.example.com", support::suffix());
    install_inventory_crd(&cluster, &installed).await;
    let admin = cluster.kubeconfig.clone();
    let (status, out, _) = env
        .preflight(
            &admin,
            &[
                "--publish-inventory",
                &format!("--inventory-group={installed}"),
            ],
        )
        .await;
    let (m_status, m_out, _) = env
        .preflight(
            &admin,
            &[
                "--publish-inventory",
                &format!("--inventory-group={missing}"),
            ],
        )
        .await;
    let _ = Api::<CustomResourceDefinition>::all(cluster.client.clone())
        .delete(
            &format!("nodeinventories.{installed}"),
            &DeleteParams::default(),
        )
        .await;
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(
        line(&out, "[ok]  ", "NodeInventory CRD")
            .is_some_and(|l| l.contains(&format!("nodeinventories.{installed} served (v1beta1)"))),
        "{out}"
    );
    assert_eq!(m_status.code(), Some(1), "{m_out}");
    assert!(
        line(&m_out, "[FAIL]", "NodeInventory CRD").is_some_and(|l| l.contains("not installed")),
        "{m_out}"
    );
    assert!(
        fix_of(&m_out, "NodeInventory CRD").is_some_and(|f| f.contains("--inventory-group")),
        "{m_out}"
    );
}

/// Nothing answers: every check still ends within its timeout, the
/// apiserver and sandboxd fail, and the checks that need the apiserver say
/// they were not run. Needs no cluster.
#[tokio::test]
async fn unreachable_apiserver_and_sandboxd_fail_quickly() {
    let dir = support::vk::test_dir("pf-dead");
    let kubeconfig = dead_kubeconfig(&dir);
    let env = Env {
        sim: support::sim::start(Default::default()).await,
        token_file: dir.join("none"),
        dir,
        node: "pf-dead".into(),
    };
    let (status, out, took) = env
        .preflight(
            &kubeconfig,
            &[
                &format!("--sandboxd-url=http://127.0.0.1:{}", free_port()),
                "--sandboxd-token-file=",
            ],
        )
        .await;
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(took < Duration::from_secs(20), "took {took:?}:\n{out}");
    assert!(line(&out, "[FAIL]", "apiserver").is_some(), "{out}");
    assert!(
        line(&out, "[FAIL]", "sandboxd").is_some_and(|l| l.contains("cannot reach sandboxd")),
        "{out}"
    );
    assert!(
        line(&out, "[warn]", "RBAC").is_some_and(|l| l.contains("not checked")),
        "{out}"
    );
    assert!(line(&out, "[ok]  ", "kubelet port").is_some(), "{out}");

    // An invalid configuration is one failed line, like the run command's refusal.
    let (status, out, _) = env.preflight(&kubeconfig, &["--listen-addr=10260"]).await;
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        line(&out, "[FAIL]", "configuration").is_some_and(|l| l.contains("--listen-addr")),
        "{out}"
    );
}
