//! The Nodes tests register: each is deleted when its test is over, also
//! when the test fails ([`NodeCleanup`], held by every vk-sandbox under
//! test), and the leftovers of an earlier run that was killed before it
//! could clean up are swept when a test binary first reaches the cluster
//! ([`sweep_leftovers`]). The plane is shared with `make demo` and other
//! test binaries, so only test-named Nodes long dead are swept.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};

/// How long a test Node must have been silent (no Lease renewal, not
/// Ready) before a later run sweeps it: far beyond any test's own outage
/// of its vk-sandbox.
pub const LEFTOVER_AFTER: Duration = Duration::from_secs(15 * 60);

/// Deletes a Node when dropped (unless [`NodeCleanup::done`] says it
/// already went). Synchronous, through kubectl with the admin kubeconfig:
/// a drop during a panic has no runtime to await on.
#[derive(Debug)]
pub struct NodeCleanup {
    kubeconfig: PathBuf,
    name: String,
    done: AtomicBool,
}

impl NodeCleanup {
    pub fn new(kubeconfig: PathBuf, name: &str) -> NodeCleanup {
        NodeCleanup {
            kubeconfig,
            name: name.to_string(),
            done: AtomicBool::new(false),
        }
    }

    /// The Node was deleted already: nothing left to do.
    pub fn done(&self) {
        self.done.store(true, Ordering::SeqCst);
    }

    /// The Node may be registered again (its process restarted).
    pub fn pending(&self) {
        self.done.store(false, Ordering::SeqCst);
    }
}

impl Drop for NodeCleanup {
    fn drop(&mut self) {
        if self.done.load(Ordering::SeqCst) {
            return;
        }
        let out = Command::new(super::kubectl::path())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["delete", "node", &self.name, "--ignore-not-found"])
            .args(["--wait=false", "--request-timeout=20s"])
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "test cleanup: deleting Node {}: {}",
                self.name,
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => eprintln!("test cleanup: deleting Node {}: {e}", self.name),
        }
    }
}

/// A name tests give their Nodes: `<prefix>-<8 hex digits>` (see
/// [`super::suffix`]), or that with `-twin`.
pub fn is_test_name(name: &str) -> bool {
    let name = name.strip_suffix("-twin").unwrap_or(name);
    let Some((prefix, suffix)) = name.rsplit_once('-') else {
        return false;
    };
    !prefix.is_empty() && suffix.len() == 8 && suffix.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether a test Node is a leftover: test-named, not Ready, and silent
/// (its Lease last renewed, else the Node made) longer than `after`.
pub fn is_leftover(
    node: &Node,
    lease: Option<&Lease>,
    now: jiff::Timestamp,
    after: Duration,
) -> bool {
    let Some(name) = node.metadata.name.as_deref() else {
        return false;
    };
    if !is_test_name(name) || super::vk::node_condition(node, "Ready").as_deref() == Some("True") {
        return false;
    }
    let last = lease
        .and_then(|l| l.spec.as_ref()?.renew_time.as_ref())
        .map(|t| t.0)
        .or_else(|| node.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let Some(last) = last else {
        return false;
    };
    now.duration_since(last).as_secs() > after.as_secs() as i64
}

/// Delete the leftover test Nodes of earlier runs (once per test binary).
pub async fn sweep_leftovers(client: &Client) {
    static SWEPT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    SWEPT
        .get_or_init(|| async {
            let nodes: Api<Node> = Api::all(client.clone());
            let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
            let Ok(list) = nodes.list(&ListParams::default()).await else {
                return;
            };
            let now = jiff::Timestamp::now();
            for node in list {
                let Some(name) = node.metadata.name.clone() else {
                    continue;
                };
                if !is_test_name(&name) {
                    continue;
                }
                let lease = leases.get_opt(&name).await.ok().flatten();
                if is_leftover(&node, lease.as_ref(), now, LEFTOVER_AFTER) {
                    eprintln!("test set-up: deleting Node {name}, left over by an earlier run");
                    let _ = nodes.delete(&name, &DeleteParams::default()).await;
                }
            }
        })
        .await;
}
