//! Shared helpers for tests that need the local control plane.
//!
//! `make test` starts one plane (e2e/cluster.sh), exports its admin
//! kubeconfig as `VK_TEST_KUBECONFIG` and sets `VK_REQUIRE_CLUSTER=1`; each
//! test then works in a namespace of its own. Without a cluster the tests
//! print why they skip — unless the cluster was required, then they fail.
//!
//! One copy for every test binary (`mod support;`), the reliability suite
//! and benches/cluster.rs (both `#[path = ".../support/mod.rs"]`). Each
//! binary uses a part of it, hence `dead_code` allowed here for all of it.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

pub struct TestCluster {
    pub client: Client,
    pub kubeconfig: PathBuf,
}

/// The shared cluster, or `None` (after saying why) when none is configured
/// and none is required.
pub async fn cluster() -> Option<TestCluster> {
    vk_sandbox::crypto::install_provider();
    let required = std::env::var("VK_REQUIRE_CLUSTER").is_ok_and(|v| v == "1");
    let Some(path) = std::env::var_os("VK_TEST_KUBECONFIG").map(PathBuf::from) else {
        let why = "VK_TEST_KUBECONFIG is not set (run `make test`, or `make cluster-up` \
                   and export VK_TEST_KUBECONFIG=<printed path>)";
        if required {
            panic!("the local control plane is required but {why}");
        }
        eprintln!("SKIPPED: {why}");
        return None;
    };
    match client_for(&path).await {
        Ok(client) => {
            nodes::sweep_leftovers(&client).await;
            Some(TestCluster {
                client,
                kubeconfig: path,
            })
        }
        Err(e) if !required => {
            eprintln!("SKIPPED: cannot use {}: {e}", path.display());
            None
        }
        Err(e) => panic!("cannot use the cluster of {}: {e}", path.display()),
    }
}

pub async fn client_for(path: &Path) -> Result<Client, String> {
    let kc = Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    Client::try_from(config).map_err(|e| e.to_string())
}

/// A short random suffix for names that must not collide across tests.
pub fn suffix() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// A Kubernetes object (or any type) from test JSON that must parse.
pub fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("test object: {e}"))
}

impl TestCluster {
    /// A fresh namespace `<prefix>-<random>`.
    pub async fn namespace(&self, prefix: &str) -> String {
        let name = format!("{prefix}-{}", suffix());
        let ns: Namespace = from_json(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
        }));
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        // Pods are admitted only once the controller-manager has made the
        // namespace's default ServiceAccount. Right after the reliability
        // suite's apiserver and etcd restarts it can take longer than 30 s
        // (seed 2335885082: scenario 6's namespace timed out at 30 s).
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(self.client.clone(), &name);
        wait_for(
            "the default ServiceAccount of a new namespace (is kube-controller-manager running?)",
            Duration::from_secs(120),
            || async {
                match sas.get_opt("default").await {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err("not created yet".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await;
        name
    }

    /// Best-effort deletion of a test namespace.
    pub async fn drop_namespace(&self, name: &str) {
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(name, &DeleteParams::background())
            .await;
    }
}

/// The last lines of every control plane component log, for failure messages.
pub fn cluster_logs() -> String {
    let Some(dir) = std::env::var_os("VK_CLUSTER_LOGS") else {
        return "(VK_CLUSTER_LOGS not set: no control plane logs)".into();
    };
    let mut out = String::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return format!("(cannot read {})", PathBuf::from(dir).display());
    };
    let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for p in paths {
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(25)..];
        out.push_str(&format!(
            "==== {} (last {} lines)\n",
            p.display(),
            tail.len()
        ));
        for l in tail {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// Waits (60 s at most) until Pod `name` is gone; while it stays, the
/// observation names its deletionTimestamp and `log`'s answer.
pub async fn wait_pod_gone(
    pods: &Api<k8s_openapi::api::core::v1::Pod>,
    name: &str,
    log: impl Fn() -> String,
) {
    wait_for(
        &format!("Pod {name} gone"),
        Duration::from_secs(60),
        || async {
            match pods.get_opt(name).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(p) => Err(format!(
                    "still there, deletionTimestamp {:?}; log:\n{}",
                    p.metadata.deletion_timestamp,
                    log()
                )),
            }
        },
    )
    .await;
}

/// Polls `check` until it yields `Some`, or fails after `timeout` naming
/// what was awaited, the last observation, and the component logs.
/// Until Pod `name` is Running on a claim with an address: its claim id
/// and its Pod IP (`log` says what to print on a timeout besides).
pub async fn running_address<A: std::str::FromStr>(
    pods: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    name: &str,
    timeout: Duration,
    log: impl Fn() -> String,
) -> (String, A)
where
    A::Err: std::fmt::Display,
{
    wait_for(&format!("Pod {name} Running"), timeout, || async {
        let p = pods.get(name).await.map_err(|e| e.to_string())?;
        let st = p.status.clone().unwrap_or_default();
        let id = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("sandbox.cocoonstack.io/claim-id").cloned());
        match (st.phase.as_deref(), id, st.pod_ip) {
            (Some("Running"), Some(id), Some(ip)) => {
                Ok((id, ip.parse::<A>().map_err(|e| format!("{ip}: {e}"))?))
            }
            other => Err(format!("{other:?}{}", log())),
        }
    })
    .await
}

pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}; last observation: {last}\n{}",
                cluster_logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The value of one series in Prometheus text output, the series named
/// exactly as exposed (`name{label="value",...}` with all its labels, or a
/// bare name); `None` when absent.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok()).flatten()
    })
}

pub mod controller;
pub mod crds;
pub mod fleet;
pub mod guests;
pub mod kubectl;
pub mod kubelet;
pub mod netns;
pub mod nodes;
pub mod process;
pub mod progress;
pub mod prometheus;
pub mod rbac;
pub mod real_node;
pub mod scratch;
pub mod sim;
pub mod spdy;
pub mod upstream;
pub mod vk;
