//! The run command's flag groups, one struct per concern (each has its
//! own heading in `--help`).

use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, ValueEnum};

use crate::config::defaults;

/// The virtual Node.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Node")]
pub struct NodeArgs {
    /// Node object name; also the Lease name, a serving-cert SAN and the
    /// inventory name. Must differ from any other node's name.
    #[arg(long, env = "VK_NODE_NAME", default_value = defaults::NODE_NAME, value_name = "NAME")]
    pub node_name: String,

    /// Advertised InternalIP of the Node (omitted when empty); also a
    /// serving-cert SAN.
    #[arg(long, env = "VK_NODE_IP", default_value = "", value_name = "IP")]
    pub node_ip: String,

    /// Node CPU capacity (a Kubernetes quantity; scheduling budget only).
    /// Unset: sized by --sandboxd-max-claims when given, else 4000.
    #[arg(long, env = "VK_NODE_CPU", default_value = "", value_name = "QUANTITY")]
    pub node_cpu: String,

    /// Node memory capacity (a Kubernetes quantity). Unset: sized by
    /// --sandboxd-max-claims when given, else 8Ti.
    #[arg(
        long,
        env = "VK_NODE_MEMORY",
        default_value = "",
        value_name = "QUANTITY"
    )]
    pub node_memory: String,

    /// Node Pod capacity (a Kubernetes quantity). Unset:
    /// --sandboxd-max-claims when given, else 2000.
    #[arg(
        long,
        env = "VK_NODE_PODS",
        default_value = "",
        value_name = "QUANTITY"
    )]
    pub node_pods: String,

    /// Extra Node labels "k=v,k2=v2" (items without "=" or with an empty
    /// key are skipped; later duplicates win). Setting it replaces the
    /// default.
    #[arg(long, default_value = defaults::NODE_LABELS, value_name = "K=V,...")]
    pub node_labels: String,

    /// How often the Node status heartbeat is written (at most 60s keeps
    /// the node lifecycle controller content). Hidden: for tests.
    #[arg(long, default_value = "60s", value_name = "DURATION", hide = true)]
    pub node_status_interval: String,
}

/// The kubelet API: where it listens, its certificate, who may call it.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Kubelet API")]
pub struct KubeletArgs {
    /// Kubelet API (HTTPS) bind address, host:port with a numeric port;
    /// ":10260" listens on every interface. vk-cocoon uses :10250.
    #[arg(long, env = "VK_LISTEN_ADDR", default_value = defaults::LISTEN_ADDR, value_name = "HOST:PORT")]
    pub listen_addr: String,

    /// PEM certificate (chain) for the kubelet API. Used, and reloaded when
    /// it changes, when both --tls-cert and --tls-key name regular files;
    /// otherwise a self-signed certificate is generated in memory.
    #[arg(long, env = "VK_TLS_CERT", default_value = "", value_name = "FILE")]
    pub tls_cert: String,

    /// PEM private key matching --tls-cert.
    #[arg(long, env = "VK_TLS_KEY", default_value = "", value_name = "FILE")]
    pub tls_key: String,

    /// Authenticate (client certificate or bearer token) and authorize
    /// (SubjectAccessReview on nodes/proxy, nodes/log, nodes/stats,
    /// nodes/metrics) every kubelet API request but /healthz.
    /// --kubelet-auth=false serves the API to anyone who reaches the port.
    #[arg(
        long,
        env = "VK_KUBELET_AUTH",
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = BoolishValueParser::new(),
        value_name = "BOOL"
    )]
    pub kubelet_auth: bool,

    /// PEM bundle of CAs that sign kubelet API client certificates. Default:
    /// the key "client-ca-file" of the ConfigMap
    /// kube-system/extension-apiserver-authentication, read once at start.
    #[arg(
        long,
        env = "VK_CLIENT_CA_FILE",
        default_value = "",
        value_name = "FILE"
    )]
    pub client_ca_file: String,

    /// Let unauthenticated kubelet API requests through as
    /// system:anonymous (still subject to authorization).
    #[arg(
        long,
        env = "VK_ANONYMOUS_AUTH",
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = BoolishValueParser::new(),
        value_name = "BOOL"
    )]
    pub anonymous_auth: bool,
}

/// exec, attach and port-forward sessions: how many, how long idle.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Streaming (exec, attach, port-forward)")]
pub struct StreamingArgs {
    /// Close an exec, attach or port-forward session after this long
    /// without a byte either way (pings count), as the kubelet's
    /// --streaming-connection-idle-timeout (Go duration); 0 never closes
    /// one for idleness.
    #[arg(
        long,
        env = "VK_STREAMING_IDLE_TIMEOUT",
        default_value = defaults::STREAMING_IDLE_TIMEOUT,
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub streaming_idle_timeout: String,

    /// Most exec, attach and port-forward sessions open at once on this
    /// node; more are refused (429) until one ends.
    #[arg(
        long,
        env = "VK_MAX_STREAMING_SESSIONS",
        default_value_t = defaults::MAX_STREAMING_SESSIONS,
        value_name = "N"
    )]
    pub max_streaming_sessions: usize,

    /// Most exec, attach and port-forward sessions open at once to one
    /// Pod; more are refused (429) until one ends.
    #[arg(
        long,
        env = "VK_MAX_STREAMING_SESSIONS_PER_POD",
        default_value_t = defaults::MAX_STREAMING_SESSIONS_PER_POD,
        value_name = "N"
    )]
    pub max_streaming_sessions_per_pod: usize,

    /// Most SPDY streams one session holds at once (a forwarded
    /// connection takes two, an exec up to five); more are refused.
    #[arg(
        long,
        env = "VK_MAX_STREAMS_PER_SESSION",
        default_value_t = defaults::MAX_STREAMS_PER_SESSION,
        value_name = "N"
    )]
    pub max_streams_per_session: usize,
}

/// The Kubernetes client.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Kubernetes client")]
pub struct KubeArgs {
    /// Path of a kubeconfig file (used when not running in a cluster;
    /// takes precedence over $KUBECONFIG).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// Client-side QPS of the Kubernetes requests (at least 0.01). Events,
    /// watches and the node's Lease and Node requests are not counted.
    #[arg(long, default_value_t = defaults::KUBE_API_QPS, value_name = "QPS")]
    pub kube_api_qps: f32,

    /// Client-side burst of the Kubernetes requests (at least 1).
    #[arg(long, default_value_t = defaults::KUBE_API_BURST, value_name = "N")]
    pub kube_api_burst: u32,

    /// Client-side QPS of the Events written (their own budget, as the
    /// kubelet's; at least 0.01).
    #[arg(long, default_value_t = defaults::EVENT_QPS, value_name = "QPS")]
    pub event_qps: f32,

    /// Client-side burst of the Events written (at least 1).
    #[arg(long, default_value_t = defaults::EVENT_BURST, value_name = "N")]
    pub event_burst: u32,
}

/// sandboxd: where it is and the token it is called with (the daemon's flags and environment variables; `vk-sandbox claims verify` takes the same).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "sandboxd")]
pub struct SandboxdArgs {
    /// sandboxd base URL (http(s)://host[:port]; trailing "/" trimmed).
    #[arg(long, env = "SANDBOXD_URL", default_value = defaults::SANDBOXD_URL, value_name = "URL")]
    pub sandboxd_url: String,

    /// File holding the sandboxd node (root) API token, read once at start
    /// (whitespace trimmed). Unset or empty file: no Authorization header.
    #[arg(
        long,
        env = "SANDBOXD_TOKEN_FILE",
        default_value = "",
        value_name = "FILE"
    )]
    pub sandboxd_token_file: String,
}

/// The claims state (release credentials).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Claims state")]
pub struct StateArg {
    /// Claims table file (release credentials). Its directory is created
    /// with mode 0700 if missing and must be writable.
    #[arg(long, env = "VK_STATE_PATH", default_value = defaults::STATE_PATH, value_name = "FILE")]
    pub state_path: String,
}

/// The Sandbox lifecycle: suspend, resume, lease renewal
/// (docs/pod-contract.md, "Lifecycle").
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Sandbox lifecycle")]
pub struct LifecycleArgs {
    /// Hibernate the VM of a Pod deleted because its owner is suspended
    /// (agent-sandbox operatingMode: Suspended), and wake it for the Pod
    /// that comes back; false keeps it running while suspended.
    #[arg(
        long,
        env = "VK_HIBERNATE_ON_SUSPEND",
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = BoolishValueParser::new(),
        value_name = "BOOL"
    )]
    pub hibernate_on_suspend: bool,

    /// Renew a claim's sandboxd lease once less than this remains (at most
    /// half the lease), while its owner lives (Go duration); 0 renews
    /// nothing.
    #[arg(
        long,
        env = "VK_LEASE_RENEW_MARGIN",
        default_value = defaults::LEASE_RENEW_MARGIN,
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub lease_renew_margin: String,
}

/// Every sandbox a network endpoint (docs/pod-network.md).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Pod network")]
pub struct PodNetworkArgs {
    /// IPv4 range sandboxes take their own Pod addresses from (a.b.c.d/n,
    /// routed to this host, not overlapping the CNI's); vk-sandbox answers
    /// each Pod's declared TCP ports there. Empty: every Pod gets the host
    /// part of sandboxd's owner_addr, the node's address (said at start).
    #[arg(long, env = "VK_POD_CIDR", default_value = "", value_name = "CIDR")]
    pub pod_cidr: String,

    /// The network namespace Pod addresses are answered in (a path such
    /// as /run/netns/NAME; needs CAP_SYS_ADMIN). Empty: vk-sandbox's own.
    #[arg(long, env = "VK_POD_NETNS", default_value = "", value_name = "PATH")]
    pub pod_netns: String,
}

/// The orphan audit (report only).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Orphan audit")]
pub struct AuditArgs {
    /// Cadence of the sandboxd orphan audit (Go duration, e.g. 60s, 1m30s);
    /// 0 or negative disables it.
    #[arg(long, default_value = defaults::ORPHAN_SCAN_INTERVAL, value_name = "DURATION", allow_hyphen_values = true)]
    pub orphan_scan_interval: String,
}

/// NodeInventory publishing.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "NodeInventory")]
pub struct InventoryArgs {
    /// Publish the NodeInventory object (--publish-inventory or
    /// --publish-inventory=true|false).
    #[arg(
        long,
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = BoolishValueParser::new(),
        value_name = "BOOL"
    )]
    pub publish_inventory: bool,

    /// NodeInventory publish cadence (Go duration; must be > 0 when
    /// publishing).
    #[arg(long, default_value = defaults::PUBLISH_INTERVAL, value_name = "DURATION", allow_hyphen_values = true)]
    pub publish_interval: String,

    /// API group of the published NodeInventory. Unset: every group of
    /// sandbox.cocoonstack.io and extensions.agents.x-k8s.io whose
    /// nodeinventories CRD the cluster serves.
    #[arg(long, env = "VK_INVENTORY_GROUP", value_name = "GROUP")]
    pub inventory_group: Option<String>,

    /// host:port published in the NodeInventory for clients to reach
    /// sandboxd. Default: the host[:port] of --sandboxd-url (loopback by
    /// default, so operators should set it).
    #[arg(
        long,
        env = "SANDBOXD_ADVERTISE_ADDR",
        default_value = "",
        value_name = "HOST:PORT"
    )]
    pub sandboxd_advertise_addr: String,
}

/// sandboxd's capacity and health on the Node (docs/operations.md).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "sandboxd on the Node")]
pub struct FleetArgs {
    /// Size the Node's allocatable by sandboxd's claim cap (--sandboxd-max-claims)
    /// and its pools' VM size; --node-cpu/--node-memory/--node-pods override.
    #[arg(
        long,
        env = "VK_NODE_CAPACITY_FROM_SANDBOXD",
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = BoolishValueParser::new(),
        value_name = "BOOL"
    )]
    pub node_capacity_from_sandboxd: bool,

    /// Node conditions for sandboxd's state (SandboxdReachable, SandboxdDraining,
    /// SandboxdAtCapacity, SandboxdPoolsWarm).
    #[arg(
        long,
        env = "VK_NODE_CONDITIONS_FROM_SANDBOXD",
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = BoolishValueParser::new(),
        value_name = "BOOL"
    )]
    pub node_conditions_from_sandboxd: bool,

    /// Taint the Node (NoSchedule, sandbox.cocoonstack.io/...) while sandboxd
    /// cannot take new sandboxes; PreferNoSchedule while every pool is empty.
    #[arg(
        long,
        env = "VK_NODE_TAINTS_FROM_SANDBOXD",
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = BoolishValueParser::new(),
        value_name = "BOOL"
    )]
    pub node_taints_from_sandboxd: bool,

    /// sandboxd's max_claims (its /v1/info does not say it); 0: not known.
    #[arg(
        long,
        env = "VK_SANDBOXD_MAX_CLAIMS",
        default_value_t = 0,
        value_name = "N"
    )]
    pub sandboxd_max_claims: u64,

    /// How often sandboxd's /v1/info is read (the one reader: the Node and
    /// the NodeInventory share it). A Go duration > 0.
    #[arg(long, env = "VK_SANDBOXD_INFO_INTERVAL", default_value = defaults::SANDBOXD_INFO_INTERVAL, value_name = "DURATION", allow_hyphen_values = true)]
    pub sandboxd_info_interval: String,

    /// Hand back a Pod that could not be claimed for a capacity reason (429,
    /// a redirect, no warm VM, sandboxd unreachable) this long after it was
    /// bound: deleted for its Sandbox to re-create, or marked Failed for
    /// another controller to replace. A Go duration; 0: never.
    #[arg(long, env = "VK_HAND_BACK_AFTER", default_value = defaults::HAND_BACK_AFTER, value_name = "DURATION", allow_hyphen_values = true)]
    pub hand_back_after: String,

    /// A Pod whose VM another node holds (NodeInventories) is handed back
    /// while that node lives; once its Node is deleted or its sandboxd has
    /// been unreachable this long, a fresh VM is claimed here. Go duration.
    #[arg(long, env = "VK_VM_HOLDER_GONE_AFTER", default_value = defaults::VM_HOLDER_GONE_AFTER, value_name = "DURATION", allow_hyphen_values = true)]
    pub vm_holder_gone_after: String,

    /// While the Node is cordoned (kubectl cordon, kubectl drain), drain
    /// sandboxd too (POST /v1/drain: no new claims, Running sandboxes
    /// untouched) and undrain it on uncordon. A drain sandboxd's operator
    /// made is left alone.
    #[arg(
        long,
        env = "VK_DRAIN_SANDBOXD_ON_CORDON",
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = BoolishValueParser::new(),
        value_name = "BOOL"
    )]
    pub drain_sandboxd_on_cordon: bool,
}

/// The placement webhook (docs/placement.md).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Placement webhook")]
pub struct WebhookArgs {
    /// Serve the mutating admission webhook for sandbox Pods (HTTPS,
    /// host:port) that pins a Pod to the node holding its VM and adds the
    /// node-outage tolerations. Empty: not served. Needs
    /// --webhook-tls-cert and --webhook-tls-key.
    #[arg(
        long,
        env = "VK_WEBHOOK_ADDR",
        default_value = "",
        value_name = "HOST:PORT"
    )]
    pub webhook_addr: String,

    /// PEM certificate (chain) of the webhook, signed by the CA in the
    /// webhook configuration's caBundle; reloaded when it changes.
    #[arg(
        long,
        env = "VK_WEBHOOK_TLS_CERT",
        default_value = "",
        value_name = "FILE"
    )]
    pub webhook_tls_cert: String,

    /// PEM private key matching --webhook-tls-cert.
    #[arg(
        long,
        env = "VK_WEBHOOK_TLS_KEY",
        default_value = "",
        value_name = "FILE"
    )]
    pub webhook_tls_key: String,

    /// Give sandbox Pods tolerations of node.kubernetes.io/unreachable and
    /// not-ready (NoExecute, no tolerationSeconds): a silent node agent
    /// then never evicts a sandbox. false: the apiserver's 300 s defaults.
    #[arg(
        long,
        env = "VK_WEBHOOK_TOLERATIONS",
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = BoolishValueParser::new(),
        value_name = "BOOL"
    )]
    pub webhook_tolerations: bool,
}

/// The admin port and logs.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Admin and logs")]
pub struct AdminArgs {
    /// Admin (plain HTTP) bind address for /metrics, /livez and /readyz.
    #[arg(long, env = "VK_ADMIN_ADDR", default_value = defaults::ADMIN_ADDR, value_name = "HOST:PORT")]
    pub admin_addr: String,

    /// Log line format on stderr.
    #[arg(long, env = "VK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Log output format (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}
