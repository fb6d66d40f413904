//! The validated configuration, typed, and its projections.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::values::ListenAddr;
use crate::sandboxd::Secret;

/// `--tls-cert` / `--tls-key` as given (empty = unset). Whether the pair is
/// usable (both regular files) is decided when the kubelet API starts and
/// again on every reload check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// Kubelet API authentication/authorization
/// (docs/architecture.md#decision-kubelet-api).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletAuthConfig {
    /// `--kubelet-auth`: false serves every route to anyone.
    pub enabled: bool,
    /// `--anonymous-auth`: unauthenticated requests become system:anonymous.
    pub anonymous: bool,
    /// `--client-ca-file`; `None` = read the cluster's
    /// kube-system/extension-apiserver-authentication `client-ca-file`.
    pub client_ca_file: Option<PathBuf>,
}

/// Node capacity (= allocatable): the flag's value, or its default when
/// unset (`*_fixed` false: sandboxd's claim cap sizes it when known).
#[derive(Debug, Clone, PartialEq)]
pub struct Capacity {
    pub cpu: Quantity,
    pub memory: Quantity,
    pub pods: Quantity,
    pub cpu_fixed: bool,
    pub memory_fixed: bool,
    pub pods_fixed: bool,
}

/// sandboxd's capacity and health on the Node (`--node-*-from-sandboxd`).
#[derive(Debug, Clone, PartialEq)]
pub struct FleetConfig {
    pub capacity: bool,
    pub conditions: bool,
    pub taints: bool,
    /// `--sandboxd-max-claims`; `None` when 0.
    pub max_claims: Option<u64>,
    /// `--sandboxd-info-interval` (> 0).
    pub info_interval: Duration,
    /// `--drain-sandboxd-on-cordon`.
    pub drain_on_cordon: bool,
    /// `--hand-back-after`; `None` when 0.
    pub hand_back_after: Option<Duration>,
    /// `--vm-holder-gone-after`.
    pub vm_holder_gone_after: Duration,
}

/// Kubernetes client settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeClientConfig {
    pub kubeconfig: Option<PathBuf>,
    pub qps: f32,
    pub burst: u32,
    pub event_qps: f32,
    pub event_burst: u32,
}

/// sandboxd connection settings.
#[derive(Debug, Clone)]
pub struct SandboxdConfig {
    /// Base URL, trailing `/` trimmed.
    pub url: String,
    /// `host[:port]` for the NodeInventory.
    pub advertise_addr: String,
    /// The node (root) token; `None` = no Authorization header.
    pub token: Option<Secret>,
    /// Where the token came from (for messages only).
    pub token_file: Option<PathBuf>,
}

/// NodeInventory publishing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InventoryConfig {
    pub publish: bool,
    /// Positive whenever `publish`; zero when publishing is off and the
    /// flag was `<= 0`.
    pub interval: Duration,
    /// `--inventory-group`; `None`: publish in every known group whose CRD
    /// the cluster serves (`inventory::groups`).
    pub group: Option<String>,
}

/// The Sandbox lifecycle (docs/configuration.md, "Sandbox lifecycle").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LifecycleConfig {
    pub hibernate_on_suspend: bool,
    /// Zero renews nothing.
    pub renew_margin: Duration,
}

/// Pod addresses of their own (docs/pod-network.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodNetworkConfig {
    /// `None`: the owner_addr mode (the node's address for every Pod).
    pub range: Option<crate::podnet::range::PodRange>,
    /// `None`: the process's own namespace.
    pub netns: Option<PathBuf>,
}

/// exec, attach and port-forward sessions (docs/streaming.md, "Limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamingConfig {
    /// `None`: sessions are never closed for idleness.
    pub idle_timeout: Option<Duration>,
    /// At least 1.
    pub max_sessions: usize,
    /// At least 1.
    pub max_sessions_per_pod: usize,
    /// At least [`super::defaults::MIN_STREAMS_PER_SESSION`].
    pub max_streams_per_session: usize,
}

impl Default for StreamingConfig {
    fn default() -> Self {
        use super::defaults;
        StreamingConfig {
            idle_timeout: Some(Duration::from_secs(4 * 3600)),
            max_sessions: defaults::MAX_STREAMING_SESSIONS,
            max_sessions_per_pod: defaults::MAX_STREAMING_SESSIONS_PER_POD,
            max_streams_per_session: defaults::MAX_STREAMS_PER_SESSION,
        }
    }
}

/// The placement webhook (`--webhook-*`), when served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    pub addr: ListenAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// `--webhook-tolerations`.
    pub tolerations: bool,
}

/// Everything validated, ready to run.
#[derive(Debug, Clone)]
pub struct Config {
    pub node_name: String,
    /// `None` when `--node-ip` is empty.
    pub node_ip: Option<String>,
    pub listen_addr: ListenAddr,
    pub admin_addr: ListenAddr,
    pub tls: TlsFiles,
    pub capacity: Capacity,
    pub kube: KubeClientConfig,
    pub sandboxd: SandboxdConfig,
    /// The claims file; its directory exists and is writable.
    pub state_path: PathBuf,
    pub lifecycle: LifecycleConfig,
    pub pod_network: PodNetworkConfig,
    /// `None` = the orphan audit is disabled (`<= 0`).
    pub orphan_scan_interval: Option<Duration>,
    pub inventory: InventoryConfig,
    /// Extra Node labels from `--node-labels`.
    pub node_labels: BTreeMap<String, String>,
    pub kubelet_auth: KubeletAuthConfig,
    pub streaming: StreamingConfig,
    /// Node status heartbeat period (> 0).
    pub node_status_interval: Duration,
    pub fleet: FleetConfig,
    /// `None`: `--webhook-addr` is empty.
    pub webhook: Option<WebhookConfig>,
}

/// What the kubelet API is built from (a projection of [`Config`], as
/// the node has [`crate::node::NodeSettings::from_config`]).
#[derive(Debug, Clone)]
pub struct KubeletSettings {
    pub node_name: String,
    pub node_ip: Option<String>,
    pub listen_addr: ListenAddr,
    pub tls: TlsFiles,
    pub auth: KubeletAuthConfig,
    pub streaming: StreamingConfig,
}

impl Config {
    pub fn kubelet(&self) -> KubeletSettings {
        KubeletSettings {
            node_name: self.node_name.clone(),
            node_ip: self.node_ip.clone(),
            listen_addr: self.listen_addr.clone(),
            tls: self.tls.clone(),
            auth: self.kubelet_auth.clone(),
            streaming: self.streaming,
        }
    }
}
