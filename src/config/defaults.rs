//! Flag defaults (docs/configuration.md), shared by `--help` and tests.

pub const NODE_NAME: &str = "vk-sandboxd";
pub const LISTEN_ADDR: &str = ":10260";
pub const ADMIN_ADDR: &str = ":10261";
pub const NODE_CPU: &str = "4000";
pub const NODE_MEMORY: &str = "8Ti";
pub const NODE_PODS: &str = "2000";
pub const KUBE_API_QPS: f32 = 200.0;
/// The lowest `--kube-api-qps` / `--event-qps` accepted: one request per
/// 100 s. Lower values only make every request wait past its deadline (and
/// values near zero overflowed the wait's arithmetic).
pub const MIN_QPS: f32 = 0.01;
pub const KUBE_API_BURST: u32 = 400;
/// Events' own bucket. As high as the request bucket's: a reconcile waits
/// for its Event, so a lower rate would cap claims at it.
pub const EVENT_QPS: f32 = 200.0;
pub const EVENT_BURST: u32 = 400;
pub const SANDBOXD_URL: &str = "http://127.0.0.1:7777";
pub const STATE_PATH: &str = "/var/lib/vk-sandbox/claims.json";
pub const ORPHAN_SCAN_INTERVAL: &str = "60s";
pub const PUBLISH_INTERVAL: &str = "30s";
pub const SANDBOXD_INFO_INTERVAL: &str = "2s";
/// Well inside the 30 s a Sandbox bound to a full node has to end Running
/// elsewhere, and longer than the Node takes to show the taint (about 2 s).
pub const HAND_BACK_AFTER: &str = "10s";
/// Long enough that a sandboxd restart or a short outage never costs a
/// Sandbox its VM.
pub const VM_HOLDER_GONE_AFTER: &str = "5m";
pub const NODE_LABELS: &str = "sandbox.cocoonstack.io/runtime=sandboxd";
pub const LEASE_RENEW_MARGIN: &str = "12h";
/// The kubelet's `--streaming-connection-idle-timeout` default.
pub const STREAMING_IDLE_TIMEOUT: &str = "4h";
pub const MAX_STREAMING_SESSIONS: usize = 512;
pub const MAX_STREAMING_SESSIONS_PER_POD: usize = 16;
pub const MAX_STREAMS_PER_SESSION: usize = 512;
/// An exec over SPDY opens up to five streams (error, stdin, stdout,
/// stderr, resize).
pub const MIN_STREAMS_PER_SESSION: usize = 5;
