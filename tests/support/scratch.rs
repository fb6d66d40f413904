//! An empty cluster of its own on the local plane: a second kube-apiserver
//! on the same etcd under an etcd prefix of its own (`e2e/cluster.sh
//! scratch-apiserver`). For a test that must install or remove cluster-wide
//! objects (CRDs) the other tests, running at the same time on the shared
//! plane, rely on. No scheduler or controllers run there.

use std::path::PathBuf;
use std::process::Command;

use super::TestCluster;

pub struct Scratch {
    pub cluster: TestCluster,
    _down: Down,
}

/// Stops the scratch apiserver and deletes its keys when dropped (a failed
/// test included).
struct Down {
    name: String,
    script: PathBuf,
}

impl Drop for Down {
    fn drop(&mut self) {
        let _ = Command::new(&self.script)
            .args(["scratch-apiserver", "down", &self.name])
            .output();
    }
}

impl Scratch {
    /// `None` (after saying why) where the suite does not control the
    /// plane (`VK_CLUSTER_CONTROL` names `e2e/cluster.sh`, as
    /// `e2e/run-tests.sh` sets it for the local plane).
    pub async fn up(prefix: &str) -> Option<Scratch> {
        let Some(script) = std::env::var_os("VK_CLUSTER_CONTROL").map(PathBuf::from) else {
            eprintln!(
                "SKIPPED: VK_CLUSTER_CONTROL does not name e2e/cluster.sh (not the local plane): \
                 no scratch apiserver"
            );
            return None;
        };
        vk_sandbox::crypto::install_provider();
        let name = format!("{prefix}-{}", super::suffix());
        let port = super::process::free_port().to_string();
        let down = Down {
            name: name.clone(),
            script: script.clone(),
        };
        let out = Command::new(&script)
            .args(["scratch-apiserver", "up", &name, &port])
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "scratch apiserver {name} did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let kubeconfig = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string());
        let client = super::client_for(&kubeconfig)
            .await
            .unwrap_or_else(|e| panic!("scratch apiserver {name}: {e}"));
        Some(Scratch {
            cluster: TestCluster { client, kubeconfig },
            _down: down,
        })
    }
}
