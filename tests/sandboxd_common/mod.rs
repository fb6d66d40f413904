//! What the lifecycle and data-plane contract tests share: a simulator with
//! fast transitions and a frozen clock, clients, and assertions.

#![allow(dead_code)]

use std::time::Duration;

use jiff::Timestamp;
use sandboxd_sim::{PoolConfig, SimConfig, SimHandle, TenantConfig};
use vk_sandbox::sandboxd::{Op, Refusal, SandboxdClient, SandboxdError};

pub const ROOT: &str = "root-token";
pub const TENANT: &str = "acme-token";
pub const TEMPLATE: &str = "base:24.04";
pub const START: &str = "2026-07-06T00:00:00Z";
/// Bound on every wait (never a measured limit).
pub const PATIENCE: Duration = Duration::from_secs(20);

pub fn start() -> Timestamp {
    START.parse().expect("start")
}

/// Root token, tenant `acme`, pools of `TEMPLATE` (4 warm, and 1 warm on the
/// egress lane), frozen clock, no periodic reaper, instant transitions.
pub fn cfg() -> SimConfig {
    SimConfig {
        api_token: ROOT.into(),
        pools: vec![pool("none", 4), pool("egress", 1)],
        tenants: vec![TenantConfig {
            name: "acme".into(),
            token: TENANT.into(),
            max_claims: 0,
        }],
        clock_start: Some(start()),
        clock_frozen: true,
        reap_interval_ms: 0,
        provision_delay_ms: 10,
        refill_delay_ms: 10,
        hibernate_delay_ms: 0,
        wake_delay_ms: 0,
        ..SimConfig::default()
    }
}

pub fn pool(net: &str, warm: u32) -> PoolConfig {
    PoolConfig {
        template: TEMPLATE.into(),
        net: net.into(),
        size: "small".into(),
        warm,
        target: None,
        golden: true,
        archive_on_expire: false,
        archive_retention_seconds: 0,
    }
}

pub async fn sim(cfg: SimConfig) -> SimHandle {
    vk_sandbox::crypto::install_provider();
    sandboxd_sim::start_local(cfg)
        .await
        .expect("start simulator")
}

pub fn client_with(h: &SimHandle, token: Option<&str>, timeout: Duration) -> SandboxdClient {
    vk_sandbox::crypto::install_provider();
    SandboxdClient::builder(h.base_url())
        .token(token.map(str::to_string))
        .timeout(timeout)
        .build()
        .expect("client")
}

/// The root token's client.
pub fn client(h: &SimHandle) -> SandboxdClient {
    client_with(h, Some(ROOT), Duration::from_secs(10))
}

#[track_caller]
pub fn assert_refused<T: std::fmt::Debug>(
    r: Result<T, SandboxdError>,
    op: Op,
    status: u16,
    reason: Refusal,
) {
    match r {
        Err(SandboxdError::Refused {
            op: o,
            status: s,
            reason: why,
            ..
        }) => assert_eq!((o, s, why), (op, status, reason)),
        other => panic!("want {op} {status} {reason:?}, got {other:?}"),
    }
}

/// Wait for a condition (bounded by [`PATIENCE`]).
pub async fn wait_until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
