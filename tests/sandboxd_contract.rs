//! Contract tests: the sandboxd client against the sandboxd simulator, one
//! test per status code each endpoint can answer (authentication, claim,
//! release, list, info) and what the client makes of it, plus the
//! lost-reply, token-header, restart, reaper and property tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use sandboxd_sim::{
    ClaimPatch, ConfigPatch, DeadlineQuirk, Endpoint, Fault, FaultKind, OwnerAddrMode, PoolConfig,
    Quirks, SimConfig, SimHandle, TenantConfig, TenantList,
};
use vk_sandbox::sandboxd::decode::{self, RawReply};
use vk_sandbox::sandboxd::{
    ClaimRequest, Deadline, Observer, Op, ReleaseOutcome, SandboxState, SandboxdClient,
    SandboxdError, Secret, read_token_file,
};

const ROOT: &str = "root-token";
const START: &str = "2026-07-06T00:00:00.25Z";
const TEMPLATE: &str = "base:24.04";

fn start() -> Timestamp {
    START.parse().expect("start time")
}

/// Root token, one warm pool of 4, frozen clock, no periodic reaper, short
/// delays.
fn cfg() -> SimConfig {
    SimConfig {
        api_token: ROOT.into(),
        pools: vec![pool(TEMPLATE, 4)],
        clock_start: Some(start()),
        clock_frozen: true,
        reap_interval_ms: 0,
        provision_delay_ms: 20,
        refill_delay_ms: 20,
        ..SimConfig::default()
    }
}

fn pool(template: &str, warm: u32) -> PoolConfig {
    PoolConfig {
        template: template.into(),
        net: "none".into(),
        size: "small".into(),
        warm,
        target: None,
        golden: true,
        archive_on_expire: false,
        archive_retention_seconds: 0,
    }
}

async fn sim(cfg: SimConfig) -> SimHandle {
    vk_sandbox::crypto::install_provider();
    sandboxd_sim::start_local(cfg)
        .await
        .expect("start simulator")
}

fn client_with(h: &SimHandle, token: Option<&str>, timeout: Duration) -> SandboxdClient {
    vk_sandbox::crypto::install_provider();
    SandboxdClient::builder(format!("{}/", h.base_url()))
        .token(token.map(str::to_string))
        .timeout(timeout)
        .build()
        .expect("client")
}

fn client(h: &SimHandle) -> SandboxdClient {
    client_with(h, Some(ROOT), Duration::from_secs(5))
}

fn req(claim_ref: &str) -> ClaimRequest {
    ClaimRequest {
        template: TEMPLATE.into(),
        ttl_seconds: 86_400,
        claim_ref: claim_ref.into(),
        ..ClaimRequest::default()
    }
}

fn fault(endpoint: Endpoint, kind: FaultKind, times: Option<u32>) -> Fault {
    Fault {
        endpoint,
        kind,
        times,
    }
}

fn status_fault(status: u16, error: Option<&str>) -> FaultKind {
    FaultKind::Status {
        status,
        error: error.map(str::to_string),
        body: None,
        content_type: None,
    }
}

fn raw_fault(status: u16, body: &str) -> FaultKind {
    FaultKind::Status {
        status,
        error: None,
        body: Some(body.to_string()),
        content_type: None,
    }
}

fn arm(h: &SimHandle, f: Fault) {
    h.arm_fault(f).expect("arm fault");
}

#[track_caller]
fn assert_http(err: &SandboxdError, op: Op, status: u16, message: &str) {
    match err {
        SandboxdError::Http {
            op: o,
            status: s,
            message: m,
        } => {
            assert_eq!((*o, *s, m.as_str()), (op, status, message), "{err}");
        }
        other => panic!("want Http {{{op}, {status}, {message:?}}}, got {other:?}"),
    }
}

#[track_caller]
fn assert_transport(err: &SandboxdError, op: Op) {
    assert!(
        matches!(err, SandboxdError::Transport { op: o, .. } if *o == op),
        "want Transport on {op}, got {err:?}"
    );
}

/// Wait for a condition without fixed sleeps (bounded).
async fn wait_until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn refused(h: &SimHandle) -> bool {
    tokio::net::TcpStream::connect(h.addr()).await.is_err()
}

// ---------------------------------------------------------------------------
// GET /metrics
// ---------------------------------------------------------------------------

/// `GET /metrics` with this bearer: status, content type, body.
async fn scrape(h: &SimHandle, token: Option<&str>) -> (u16, String, String) {
    let mut r = reqwest::Client::new().get(format!("{}/metrics", h.base_url()));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let resp = r.send().await.expect("GET /metrics");
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().expect("ascii").to_string())
        .unwrap_or_default();
    (status, ct, resp.text().await.expect("body"))
}

/// `name{labels}` → value, from the text format (comments skipped; every
/// sample line must parse).
fn samples(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap_or_else(|| panic!("sample {l:?}"));
            (
                k.to_string(),
                v.parse().unwrap_or_else(|_| panic!("value {l:?}")),
            )
        })
        .collect()
}

#[tokio::test]
async fn metrics_are_root_only_prometheus_text_with_the_contracts_families() {
    let mut c = cfg();
    c.pools.push(PoolConfig {
        golden: true,
        ..pool("golden:1", 0)
    });
    c.tenants = vec![TenantConfig {
        name: "acme".into(),
        token: "tenant-tok".into(),
        max_claims: 0,
    }];
    c.hibernate_delay_ms = 0;
    c.wake_delay_ms = 5;
    c.archive_after_seconds = 60;
    let h = sim(c).await;
    let root = client(&h);
    let tenant = client_with(&h, Some("tenant-tok"), Duration::from_secs(5));

    let (status, _, _) = scrape(&h, None).await;
    assert_eq!(status, 401);
    let (status, _, _) = scrape(&h, Some("tenant-tok")).await;
    assert_eq!(status, 403, "a tenant is not the operator");
    // Nothing done yet: every counter reads 0.
    let m = samples(&scrape(&h, Some(ROOT)).await.2);
    for name in [
        "sandboxd_claim_seconds_total",
        "sandboxd_wake_seconds_total",
        "sandboxd_wakes_total",
        "sandboxd_claims_total{tier=\"warm\"}",
    ] {
        assert_eq!(m.get(name), Some(&0.0), "{name}");
    }

    // warm: the pool's; golden: a miss cloned from the snapshot; cold: no pool.
    let warm = root.claim(&req("ns/warm")).await.expect("warm claim");
    let golden = ClaimRequest {
        template: "golden:1".into(),
        ..req("ns/golden")
    };
    root.claim(&golden).await.expect("golden claim");
    let cold = ClaimRequest {
        template: "cold:1".into(),
        ..req("ns/cold")
    };
    let cold = root.claim(&cold).await.expect("cold claim");
    let by_tenant = tenant.claim(&req("ns/tenant")).await.expect("tenant claim");
    // A hibernate and a wake; a release; a reap.
    root.hibernate(&warm.id, vk_sandbox::sandboxd::SandboxAuth::Node)
        .await
        .expect("hibernate");
    root.wake(&warm.id, vk_sandbox::sandboxd::SandboxAuth::Node)
        .await
        .expect("wake");
    root.release(&cold.id, &cold.token).await.expect("release");
    let patch = |id: &str, p: serde_json::Value| {
        h.patch_claim(id, serde_json::from_value(p).expect("patch"))
            .expect("patch claim")
    };
    patch(
        &by_tenant.id,
        serde_json::json!({"deadline_in_seconds": -1}),
    );
    assert_eq!(h.reap(), vec![by_tenant.id.clone()]);
    // Archived by the idle sweep, woken from the archive, archived again
    // and deleted at the end of its retention.
    patch(
        &warm.id,
        serde_json::json!({"hibernated": true, "idle_seconds": 120}),
    );
    assert_eq!(h.sweep(), vec![warm.id.clone()]);
    root.wake(&warm.id, vk_sandbox::sandboxd::SandboxAuth::Node)
        .await
        .expect("wake from the archive");
    patch(
        &warm.id,
        serde_json::json!({"hibernated": true, "idle_seconds": 120}),
    );
    assert_eq!(h.sweep(), vec![warm.id.clone()]);
    patch(&warm.id, serde_json::json!({"deadline_in_seconds": -1}));
    assert_eq!(h.reap(), vec![warm.id.clone()]);

    let (status, ct, text) = scrape(&h, Some(ROOT)).await;
    assert_eq!((status, ct.as_str()), (200, "text/plain; version=0.0.4"));
    let m = samples(&text);
    let want = [
        ("sandboxd_claimed", 1.0),
        ("sandboxd_hibernated", 0.0),
        ("sandboxd_archived", 0.0),
        ("sandboxd_failed", 0.0),
        ("sandboxd_draining", 0.0),
        ("sandboxd_tenant_claims{tenant=\"acme\"}", 0.0),
        ("sandboxd_claims_total{tier=\"warm\"}", 2.0),
        ("sandboxd_claims_total{tier=\"golden\"}", 1.0),
        ("sandboxd_claims_total{tier=\"cold\"}", 1.0),
        ("sandboxd_wakes_total", 2.0),
        ("sandboxd_hibernates_total", 1.0),
        ("sandboxd_releases_total", 1.0),
        ("sandboxd_reaps_total", 1.0),
        ("sandboxd_archives_total", 2.0),
        ("sandboxd_unarchives_total", 1.0),
        ("sandboxd_archive_deletes_total", 1.0),
        ("sandboxd_forks_total", 0.0),
        ("sandboxd_checkpoints_total", 0.0),
        ("sandboxd_promotes_total", 0.0),
        (
            "sandboxd_pool_target{template=\"base:24.04\",net=\"none\",size=\"small\"}",
            4.0,
        ),
        (
            "sandboxd_pool_target{template=\"golden:1\",net=\"none\",size=\"small\"}",
            0.0,
        ),
    ];
    for (name, value) in want {
        assert_eq!(m.get(name), Some(&value), "{name} in\n{text}");
    }
    assert!(
        m.contains_key("sandboxd_pool_warm{template=\"base:24.04\",net=\"none\",size=\"small\"}"),
        "{text}"
    );
    // Two wakes of at least 5 ms each; four claims, one provisioned for 20 ms.
    assert!(m["sandboxd_wake_seconds_total"] >= 0.010, "{text}");
    assert!(m["sandboxd_claim_seconds_total"] >= 0.020, "{text}");
    for family in ["claimed", "claims_total", "wake_seconds_total", "pool_warm"] {
        let kind = if family.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        assert!(
            text.contains(&format!("# TYPE sandboxd_{family} {kind}\n")),
            "{family}: {text}"
        );
    }
    // A tenant's live claim is counted under its name; draining shows.
    tenant
        .claim(&req("ns/tenant2"))
        .await
        .expect("tenant claim");
    h.patch_config(serde_json::from_value(serde_json::json!({"draining": true})).expect("patch"));
    let m = samples(&scrape(&h, Some(ROOT)).await.2);
    assert_eq!(m["sandboxd_tenant_claims{tenant=\"acme\"}"], 1.0);
    assert_eq!(m["sandboxd_draining"], 1.0);
    assert_eq!(m["sandboxd_claimed"], 2.0);
}

// ---------------------------------------------------------------------------
// POST /v1/claim
// ---------------------------------------------------------------------------

#[tokio::test]
async fn claim_200_with_id_is_a_claim_and_the_request_is_shaped_per_contract() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let claim = c
        .claim(&ClaimRequest {
            template: TEMPLATE.into(),
            net: String::new(),
            size: String::new(),
            ttl_seconds: 10_000_000_000,
            claim_ref: "team-a/worker-0".into(),
        })
        .await
        .expect("claim");
    assert!(
        claim.id.starts_with("sb_") && claim.id.len() == 19,
        "{}",
        claim.id
    );
    assert_eq!(claim.token.expose().len(), 32);
    // The granted deadline is the server's: now + clamped TTL (24 h).
    assert_eq!(
        claim.deadline,
        Deadline::At(start() + SignedDuration::from_secs(86_400))
    );
    assert_eq!(claim.owner_addr, "10.0.0.5:7777");
    assert_eq!(claim.pod_ip().expect("pod ip").to_string(), "10.0.0.5");

    let log = h.requests();
    assert_eq!(log.len(), 1);
    assert_eq!(
        (log[0].method.as_str(), log[0].path.as_str()),
        ("POST", "/v1/claim")
    );
    assert_eq!(log[0].status, Some(200));
    // template always; net/size omitted when empty; ttl clamped; never no_redirect.
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&log[0].body).expect("json body"),
        serde_json::json!({"template": TEMPLATE, "ttl_seconds": 86400, "claim_ref": "team-a/worker-0"})
    );
    let stored = h.claims_by_ref("team-a/worker-0");
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].token, claim.token.expose());
}

#[tokio::test]
async fn claim_sends_net_and_size_when_set_and_omits_zero_ttl() {
    let h = sim(cfg()).await;
    let claim = client(&h)
        .claim(&ClaimRequest {
            template: TEMPLATE.into(),
            net: "egress".into(),
            size: "medium".into(),
            ttl_seconds: 0,
            claim_ref: "ns/p".into(),
        })
        .await
        .expect("claim");
    let body: serde_json::Value = serde_json::from_str(&h.requests()[0].body).expect("json body");
    assert_eq!(
        body,
        serde_json::json!({"template": TEMPLATE, "net": "egress", "size": "medium", "claim_ref": "ns/p"})
    );
    // ttl 0 → server default of 5 minutes.
    assert_eq!(
        claim.deadline.expires_at(),
        Some(start() + SignedDuration::from_secs(300))
    );
}

#[tokio::test]
async fn claim_200_redirect_is_a_capacity_miss_and_creates_nothing() {
    let mut cfg = cfg();
    cfg.peers = vec!["10.0.0.6:7777".into()];
    cfg.pools = vec![pool(TEMPLATE, 0)];
    let h = sim(cfg).await;
    let err = client(&h).claim(&req("ns/a")).await.expect_err("redirect");
    assert!(
        matches!(&err, SandboxdError::CapacityMiss { message } if message.contains("10.0.0.6:7777")),
        "{err:?}"
    );
    assert!(!err.is_outcome_unknown());
    assert!(h.claims().is_empty(), "a redirect creates no claim");
    assert_eq!(h.requests().len(), 1, "the redirect is never followed");
}

#[tokio::test]
async fn claim_200_redirect_fault_and_empty_200_are_capacity_misses() {
    let h = sim(cfg()).await;
    arm(
        &h,
        fault(
            Endpoint::Claim,
            FaultKind::Redirect { peers: vec![] },
            Some(1),
        ),
    );
    arm(&h, fault(Endpoint::Claim, raw_fault(200, "{}"), Some(1)));
    let c = client(&h);
    for _ in 0..2 {
        let err = c.claim(&req("ns/a")).await.expect_err("miss");
        assert!(err.is_capacity_miss(), "{err:?}");
    }
    assert!(h.claims().is_empty());
    c.claim(&req("ns/a")).await.expect("faults used up");
}

/// A 3xx is never followed: it is an Http error and the target is never hit.
#[tokio::test]
async fn claim_http_redirects_are_never_followed() {
    let h = sim(cfg()).await;
    let target = format!("{}/v1/claim", h.base_url());
    let app = axum::Router::new().fallback(move || {
        let target = target.clone();
        async move {
            (
                axum::http::StatusCode::TEMPORARY_REDIRECT,
                [(axum::http::header::LOCATION, target)],
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    vk_sandbox::crypto::install_provider();
    let c = SandboxdClient::builder(format!("http://{addr}"))
        .token(Some(ROOT.into()))
        .build()
        .expect("client");
    let err = c.claim(&req("ns/r")).await.expect_err("307");
    assert_http(&err, Op::Claim, 307, "");
    assert!(h.requests().is_empty(), "the redirect target was contacted");
    server.abort();
}

#[tokio::test]
async fn claim_400_bad_key_or_body() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let mut bad = req("ns/a");
    bad.size = "huge".into();
    let err = c.claim(&bad).await.expect_err("bad size");
    assert_http(
        &err,
        Op::Claim,
        400,
        "invalid pool key: unknown size \"huge\"",
    );
    let mut bad = req("ns/a");
    bad.template = String::new();
    let err = c.claim(&bad).await.expect_err("empty template");
    assert_http(
        &err,
        Op::Claim,
        400,
        "invalid pool key: template must not be empty",
    );
    assert!(h.claims().is_empty());
}

#[tokio::test]
async fn claim_401_wrong_or_missing_token() {
    let h = sim(cfg()).await;
    for token in [Some("wrong"), None] {
        let err = client_with(&h, token, Duration::from_secs(5))
            .claim(&req("ns/a"))
            .await
            .expect_err("401");
        assert_http(&err, Op::Claim, 401, "invalid api token");
    }
    assert!(h.claims().is_empty());
}

#[tokio::test]
async fn claim_404_is_an_http_error_not_success() {
    let h = sim(cfg()).await;
    arm(
        &h,
        fault(
            Endpoint::Claim,
            status_fault(404, Some("unknown template")),
            Some(1),
        ),
    );
    let err = client(&h).claim(&req("ns/a")).await.expect_err("404");
    assert_http(&err, Op::Claim, 404, "unknown template");
}

#[tokio::test]
async fn claim_409_without_egress_attachment() {
    let mut cfg = cfg();
    cfg.egress = false;
    let h = sim(cfg).await;
    let mut r = req("ns/a");
    r.net = "egress".into();
    let err = client(&h).claim(&r).await.expect_err("409");
    assert_http(
        &err,
        Op::Claim,
        409,
        "node has no egress attachment (bridge or network)",
    );
}

#[tokio::test]
async fn claim_429_node_quota_is_a_capacity_miss() {
    let mut cfg = cfg();
    cfg.max_claims = 1;
    let h = sim(cfg).await;
    let c = client(&h);
    c.claim(&req("ns/a")).await.expect("first claim");
    let err = c.claim(&req("ns/b")).await.expect_err("quota");
    assert!(
        matches!(&err, SandboxdError::CapacityMiss { message }
            if message == "node claim quota reached: 1 live claims, cap 1"),
        "{err:?}"
    );
    assert_eq!(h.claims().len(), 1);
}

#[tokio::test]
async fn claim_429_draining_and_tenant_cap() {
    let mut cfg = cfg();
    cfg.tenants = vec![TenantConfig {
        name: "acme".into(),
        token: "tenant-tok".into(),
        max_claims: 1,
    }];
    let h = sim(cfg).await;
    let tenant = client_with(&h, Some("tenant-tok"), Duration::from_secs(5));
    tenant.claim(&req("ns/a")).await.expect("tenant claim");
    let err = tenant.claim(&req("ns/b")).await.expect_err("tenant cap");
    assert!(
        matches!(&err, SandboxdError::CapacityMiss { message } if message.contains("tenant acme at 1 live claims, cap 1")),
        "{err:?}"
    );
    h.patch_config(ConfigPatch {
        draining: Some(true),
        ..ConfigPatch::default()
    });
    let err = client(&h).claim(&req("ns/c")).await.expect_err("draining");
    assert!(
        matches!(&err, SandboxdError::CapacityMiss { message } if message.ends_with("node draining")),
        "{err:?}"
    );
}

#[tokio::test]
async fn claim_quota_with_peers_redirects_instead_of_429() {
    let mut cfg = cfg();
    cfg.draining = true;
    cfg.peers = vec!["10.0.0.7:7777".into()];
    let h = sim(cfg).await;
    let err = client(&h).claim(&req("ns/a")).await.expect_err("redirect");
    assert!(err.is_capacity_miss());
    assert_eq!(h.requests()[0].status, Some(200));
}

#[tokio::test]
async fn claim_429_for_n_calls_then_success_and_always() {
    let h = sim(cfg()).await;
    let c = client(&h);
    arm(&h, fault(Endpoint::Claim, status_fault(429, None), Some(2)));
    for _ in 0..2 {
        assert!(
            c.claim(&req("ns/a"))
                .await
                .expect_err("429")
                .is_capacity_miss()
        );
    }
    assert!(h.claims().is_empty(), "a 429 has no side effect");
    c.claim(&req("ns/a")).await.expect("third call succeeds");
    arm(&h, fault(Endpoint::Claim, status_fault(429, None), None));
    for _ in 0..3 {
        assert!(
            c.claim(&req("ns/b"))
                .await
                .expect_err("429")
                .is_capacity_miss()
        );
    }
    h.clear_faults();
    c.claim(&req("ns/b")).await.expect("cleared");
}

#[tokio::test]
async fn claim_500_and_503_are_http_errors() {
    let h = sim(cfg()).await;
    let c = client(&h);
    arm(
        &h,
        fault(
            Endpoint::Claim,
            status_fault(500, Some("provisioning failed")),
            Some(1),
        ),
    );
    arm(
        &h,
        fault(
            Endpoint::Claim,
            status_fault(503, Some("meta store unreachable")),
            Some(1),
        ),
    );
    let err = c.claim(&req("ns/a")).await.expect_err("500");
    assert_http(&err, Op::Claim, 500, "provisioning failed");
    assert!(!err.is_outcome_unknown());
    let err = c.claim(&req("ns/a")).await.expect_err("503");
    assert_http(&err, Op::Claim, 503, "meta store unreachable");
    assert!(h.claims().is_empty());
}

#[tokio::test]
async fn claim_200_garbage_is_decode_and_outcome_unknown() {
    let h = sim(cfg()).await;
    arm(&h, fault(Endpoint::Claim, FaultKind::Garbage, Some(1)));
    let err = client(&h).claim(&req("ns/a")).await.expect_err("garbage");
    assert!(
        matches!(
            err,
            SandboxdError::Decode {
                op: Op::Claim,
                status: 200,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_outcome_unknown());
}

#[tokio::test]
async fn claim_warm_miss_provisions_synchronously() {
    let mut cfg = cfg();
    cfg.pools = vec![pool(TEMPLATE, 0)];
    cfg.provision_delay_ms = 100;
    let h = sim(cfg).await;
    let claim = client(&h).claim(&req("ns/a")).await.expect("slow 200");
    assert_eq!(h.claims()[0].id, claim.id);
}

#[tokio::test]
async fn claim_ref_is_not_an_idempotency_key() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let a = c.claim(&req("ns/same")).await.expect("a");
    let b = c.claim(&req("ns/same")).await.expect("b");
    assert_ne!(a.id, b.id);
    assert_ne!(a.token, b.token);
    let listed: Vec<_> = c
        .list()
        .await
        .expect("list")
        .into_iter()
        .filter(|r| r.claim_ref == "ns/same")
        .collect();
    assert_eq!(listed.len(), 2);
}

/// The lost-reply scenario: sandboxd persists the claim, then the
/// connection drops. The client must report Transport (outcome unknown) and
/// the sandbox must be listed under its claim_ref, without its token.
#[tokio::test]
async fn claim_persist_then_drop_is_transport_and_the_claim_is_listed() {
    let h = sim(cfg()).await;
    let c = client(&h);
    arm(&h, fault(Endpoint::Claim, FaultKind::DropAfter, Some(1)));
    let err = c.claim(&req("ns/lost")).await.expect_err("dropped");
    assert_transport(&err, Op::Claim);
    assert!(err.is_outcome_unknown());
    assert_eq!(err.metric_label(), "sandboxd_transport");
    let text = err.to_string();
    assert!(
        text.starts_with("sandboxd claim: transport error"),
        "{text}"
    );
    assert!(text.contains("outcome unknown"), "{text}");

    let rows = c.list().await.expect("list");
    let lost: Vec<_> = rows.iter().filter(|r| r.claim_ref == "ns/lost").collect();
    assert_eq!(lost.len(), 1, "lost claim listed under its claim_ref");
    let stored = h.claims_by_ref("ns/lost");
    // The token is unreachable through the API: the list never carries it.
    let log = h.requests();
    assert_eq!(log[0].status, None, "no reply was sent");
    let raw = reqwest::Client::new()
        .get(format!("{}/v1/sandboxes", h.base_url()))
        .bearer_auth(ROOT)
        .send()
        .await
        .expect("raw list")
        .text()
        .await
        .expect("raw body");
    assert!(raw.contains("ns/lost") && !raw.contains(&stored[0].token));
    // Without its token, the node (root) token can still release it by id.
    assert_eq!(
        c.release_as_node(&lost[0].id).await.expect("root release"),
        ReleaseOutcome::Released
    );
    assert!(h.claims_by_ref("ns/lost").is_empty());
}

#[tokio::test]
async fn claim_drop_before_any_effect_is_transport_with_nothing_created() {
    let h = sim(cfg()).await;
    arm(&h, fault(Endpoint::Claim, FaultKind::DropBefore, Some(1)));
    let err = client(&h).claim(&req("ns/a")).await.expect_err("dropped");
    assert!(err.is_outcome_unknown());
    assert!(h.claims().is_empty());
}

#[tokio::test]
async fn claim_slower_than_the_timeout_is_transport_and_still_persists() {
    let h = sim(cfg()).await;
    arm(
        &h,
        fault(Endpoint::Claim, FaultKind::Slow { ms: 1500 }, Some(1)),
    );
    let c = client_with(&h, Some(ROOT), Duration::from_millis(300));
    let err = c.claim(&req("ns/slow")).await.expect_err("timeout");
    assert!(
        matches!(
            err,
            SandboxdError::Transport {
                op: Op::Claim,
                timeout: true,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_outcome_unknown());
    assert_eq!(err.metric_label(), "sandboxd_timeout");
    assert_eq!(
        h.claims_by_ref("ns/slow").len(),
        1,
        "server-side effect applied"
    );
}

/// sandboxd's handler goes on after its client has gone: the reply times
/// out with nothing created yet, and the claim is made and persisted later,
/// listed under its claim_ref with a token nobody holds.
#[tokio::test]
async fn claim_reply_times_out_and_sandboxd_persists_the_claim_later() {
    let h = sim(cfg()).await;
    arm(&h, Fault::claim_persists_late(1500).times(1));
    let c = client_with(&h, Some(ROOT), Duration::from_millis(300));
    let err = c.claim(&req("ns/late")).await.expect_err("timeout");
    assert!(
        matches!(
            err,
            SandboxdError::Transport {
                op: Op::Claim,
                timeout: true,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_outcome_unknown());
    assert!(
        h.claims_by_ref("ns/late").is_empty(),
        "nothing exists when the client gives up"
    );
    assert!(
        c.list().await.expect("list").is_empty(),
        "a listing right after the timeout does not show it yet"
    );
    wait_until("the late claim is persisted", || async {
        h.claims_by_ref("ns/late").len() == 1
    })
    .await;
    let rows = c.list().await.expect("list");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].claim_ref, "ns/late");
    let log = h.requests();
    let claims: Vec<_> = log.iter().filter(|r| r.path == "/v1/claim").collect();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].status, None, "no reply reached the client");
    assert_eq!(
        c.release_as_node(&rows[0].id).await.expect("root release"),
        ReleaseOutcome::Released
    );

    // A client that waits long enough gets the claim, made after the delay.
    arm(&h, Fault::claim_persists_late(200).times(1));
    let granted = client(&h).claim(&req("ns/patient")).await.expect("claim");
    assert_eq!(h.claims_by_ref("ns/patient")[0].id, granted.id);
    assert!(h.faults().is_empty(), "a one-shot fault is used up");
}

#[tokio::test]
async fn claim_truncated_reply_is_transport() {
    let h = sim(cfg()).await;
    arm(&h, fault(Endpoint::Claim, FaultKind::Truncate, Some(1)));
    let err = client(&h).claim(&req("ns/t")).await.expect_err("truncated");
    assert_transport(&err, Op::Claim);
    assert!(err.is_outcome_unknown());
    assert_eq!(h.claims_by_ref("ns/t").len(), 1);
}

#[tokio::test]
async fn claim_refused_connection_is_transport() {
    let h = sim(cfg()).await;
    let c = client(&h);
    c.list().await.expect("warm the pool");
    h.set_accepting(false);
    wait_until("listener closed", || refused(&h)).await;
    let err = c.claim(&req("ns/a")).await.expect_err("refused");
    assert_transport(&err, Op::Claim);
    // Nothing reached sandboxd, so nothing can have been created.
    assert!(!err.is_outcome_unknown(), "{err}");
    h.set_accepting(true);
    wait_until("listener back", || async { !refused(&h).await }).await;
    c.claim(&req("ns/a")).await.expect("back up");
}

#[tokio::test]
async fn claim_reply_quirks_deadline_shapes() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let set = |deadline, offset| {
        h.patch_config(ConfigPatch {
            quirks: Some(Quirks {
                deadline,
                deadline_offset_minutes: offset,
                extra_fields: true,
                engine_in_key: true,
                ..Quirks::default()
            }),
            ..ConfigPatch::default()
        });
    };
    set(DeadlineQuirk::Missing, 0);
    assert_eq!(
        c.claim(&req("ns/a")).await.expect("claim").deadline,
        Deadline::Never
    );
    set(DeadlineQuirk::Zero, 0);
    assert_eq!(
        c.claim(&req("ns/b")).await.expect("claim").deadline,
        Deadline::Never
    );
    set(DeadlineQuirk::Unparseable, 0);
    let d = c
        .claim(&req("ns/c"))
        .await
        .expect("claim still delivered")
        .deadline;
    assert_eq!(d.unparseable(), Some("not-a-time"));
    assert_eq!(d.expires_at(), None);
    set(DeadlineQuirk::Normal, 480);
    let d = c.claim(&req("ns/d")).await.expect("claim").deadline;
    assert_eq!(
        d.expires_at(),
        Some(start() + SignedDuration::from_secs(86_400))
    );
    assert!(h.requests().len() == 4);
    // Rows with unknown fields and engine in key still decode.
    let rows = c.list().await.expect("list with extras");
    assert_eq!(rows.len(), 4);
    assert!(rows.iter().all(|r| r.key.template == TEMPLATE));
}

#[tokio::test]
async fn claim_owner_addr_shapes() {
    let h = sim(cfg()).await;
    let c = client(&h);
    for (mode, raw, ip) in [
        (OwnerAddrMode::HostPort, "10.0.0.5:7777", Some("10.0.0.5")),
        (OwnerAddrMode::HostLess, ":7777", None),
        (OwnerAddrMode::Omit, "", None),
        (OwnerAddrMode::Origin, "https://node-a.example:7777", None),
    ] {
        h.patch_config(ConfigPatch {
            owner_addr_mode: Some(mode),
            ..ConfigPatch::default()
        });
        let claim = c.claim(&req("ns/o")).await.expect("claim");
        assert_eq!(claim.owner_addr, raw, "{mode:?}");
        match ip {
            Some(ip) => assert_eq!(claim.pod_ip().expect("ip").to_string(), ip),
            None => {
                let err = claim.pod_ip().expect_err("no usable address");
                assert!(err.to_string().contains("no usable address"), "{err}");
            }
        }
    }
    h.patch_config(ConfigPatch {
        owner_addr_mode: Some(OwnerAddrMode::Origin),
        origin: Some("https://10.0.0.9:7777".into()),
        ..ConfigPatch::default()
    });
    let claim = c.claim(&req("ns/o")).await.expect("claim");
    assert_eq!(claim.pod_ip().expect("ip origin").to_string(), "10.0.0.9");
}

#[tokio::test]
async fn claim_takes_warm_vms_and_the_pool_refills() {
    let mut cfg = cfg();
    cfg.pools = vec![pool(TEMPLATE, 1)];
    let h = sim(cfg).await;
    let c = client(&h);
    c.claim(&req("ns/a")).await.expect("warm claim");
    let info = c.info().await.expect("info");
    assert_eq!((info.pools[0].warm, info.pools[0].target), (0, 1));
    wait_until("refill", || {
        let c = c.clone();
        async move { c.info().await.is_ok_and(|i| i.pools[0].warm == 1) }
    })
    .await;
}

// ---------------------------------------------------------------------------
// POST /v1/sandboxes/{id}/release
// ---------------------------------------------------------------------------

#[tokio::test]
async fn release_204_with_the_claim_token_then_404_is_already_gone() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let claim = c.claim(&req("ns/a")).await.expect("claim");
    assert_eq!(
        c.release(&claim.id, &claim.token).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert!(
        c.list().await.expect("list").is_empty(),
        "gone from the list at once"
    );
    assert_eq!(
        c.release(&claim.id, &claim.token)
            .await
            .expect("second release"),
        ReleaseOutcome::AlreadyGone
    );
    let log = h.requests();
    let releases: Vec<_> = log
        .iter()
        .filter(|r| r.path.ends_with("/release"))
        .collect();
    assert_eq!(
        releases[0].path,
        format!("/v1/sandboxes/{}/release", claim.id)
    );
    assert_eq!(releases[0].body, "", "release has no body");
    assert_eq!(releases[0].status, Some(204));
    assert_eq!(releases[1].status, Some(404));
}

#[tokio::test]
async fn release_404_unknown_id_or_wrong_token_maps_to_already_gone() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let claim = c.claim(&req("ns/a")).await.expect("claim");
    assert_eq!(
        c.release("sb_0000000000000000", &claim.token)
            .await
            .expect("unknown id"),
        ReleaseOutcome::AlreadyGone
    );
    assert_eq!(
        c.release(&claim.id, &Secret::new("not-the-token"))
            .await
            .expect("wrong token"),
        ReleaseOutcome::AlreadyGone
    );
    assert_eq!(h.claims().len(), 1, "a wrong token releases nothing");
}

#[tokio::test]
async fn release_401_without_a_bearer() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let claim = c.claim(&req("ns/a")).await.expect("claim");
    let err = c
        .release(&claim.id, &Secret::default())
        .await
        .expect_err("401");
    assert_http(&err, Op::Release, 401, "missing bearer token");
    assert_eq!(h.requests()[1].authorization, None);
    assert_eq!(h.claims().len(), 1);
}

#[tokio::test]
async fn release_500_claim_kept_then_retry_succeeds() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let claim = c.claim(&req("ns/a")).await.expect("claim");
    arm(
        &h,
        fault(Endpoint::Release, FaultKind::ReleaseFailKeep, Some(1)),
    );
    let err = c.release(&claim.id, &claim.token).await.expect_err("500");
    assert_http(&err, Op::Release, 500, "release failed");
    assert_eq!(h.claims().len(), 1, "rolled back: still live");
    assert_eq!(
        c.release(&claim.id, &claim.token).await.expect("retry"),
        ReleaseOutcome::Released
    );
}

#[tokio::test]
async fn release_500_claim_dropped_then_retry_gets_404() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let claim = c.claim(&req("ns/a")).await.expect("claim");
    arm(
        &h,
        fault(Endpoint::Release, FaultKind::ReleaseFailDrop, Some(1)),
    );
    let err = c.release(&claim.id, &claim.token).await.expect_err("500");
    assert_http(&err, Op::Release, 500, "release failed");
    assert!(h.claims().is_empty(), "dropped despite the 500");
    assert_eq!(
        c.release(&claim.id, &claim.token).await.expect("retry"),
        ReleaseOutcome::AlreadyGone
    );
}

#[tokio::test]
async fn release_other_2xx_is_an_error() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let claim = c.claim(&req("ns/a")).await.expect("claim");
    for status in [200, 202] {
        arm(
            &h,
            fault(Endpoint::Release, raw_fault(status, "{}"), Some(1)),
        );
        let err = c.release(&claim.id, &claim.token).await.expect_err("2xx");
        assert_http(&err, Op::Release, status, "");
    }
}

#[tokio::test]
async fn release_router_404_from_a_wrong_base_url_is_an_error() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let claim = c.claim(&req("ns/a")).await.expect("claim");
    let wrong = SandboxdClient::builder(format!("{}/sandboxd", h.base_url()))
        .build()
        .expect("client");
    let err = wrong
        .release(&claim.id, &claim.token)
        .await
        .expect_err("router 404");
    assert!(
        matches!(
            err,
            SandboxdError::Http {
                op: Op::Release,
                status: 404,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(h.claims().len(), 1);
}

#[tokio::test]
async fn release_slow_past_the_timeout_then_retry_is_already_gone() {
    let h = sim(cfg()).await;
    let c = client_with(&h, Some(ROOT), Duration::from_millis(300));
    let claim = c.claim(&req("ns/a")).await.expect("claim");
    arm(
        &h,
        fault(Endpoint::Release, FaultKind::Slow { ms: 1500 }, Some(1)),
    );
    let err = c
        .release(&claim.id, &claim.token)
        .await
        .expect_err("timeout");
    assert!(matches!(
        err,
        SandboxdError::Transport {
            op: Op::Release,
            timeout: true,
            ..
        }
    ));
    assert!(
        !err.is_outcome_unknown(),
        "only claims have an unknown outcome"
    );
    assert!(h.claims().is_empty(), "released server-side");
    assert_eq!(
        c.release(&claim.id, &claim.token).await.expect("retry"),
        ReleaseOutcome::AlreadyGone
    );
}

#[tokio::test]
async fn release_applied_then_connection_dropped() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let claim = c.claim(&req("ns/a")).await.expect("claim");
    arm(&h, fault(Endpoint::Release, FaultKind::DropAfter, Some(1)));
    let err = c
        .release(&claim.id, &claim.token)
        .await
        .expect_err("dropped");
    assert_transport(&err, Op::Release);
    assert!(h.claims().is_empty());
    assert_eq!(
        c.release(&claim.id, &claim.token).await.expect("retry"),
        ReleaseOutcome::AlreadyGone
    );
}

#[tokio::test]
async fn release_escapes_the_id_and_refuses_an_empty_one() {
    let h = sim(cfg()).await;
    let c = client(&h);
    assert_eq!(
        c.release("a/b c?", &Secret::new("t"))
            .await
            .expect("unknown"),
        ReleaseOutcome::AlreadyGone
    );
    assert_eq!(h.requests()[0].path, "/v1/sandboxes/a%2Fb%20c%3F/release");
    let err = c
        .release("", &Secret::new("t"))
        .await
        .expect_err("empty id");
    assert!(matches!(
        err,
        SandboxdError::InvalidRequest {
            op: Op::Release,
            ..
        }
    ));
    assert_eq!(h.requests().len(), 1, "no call for an empty id");
}

#[tokio::test]
async fn release_as_node_needs_a_node_token_and_open_mode_needs_the_claim_token() {
    let mut open = cfg();
    open.api_token = String::new();
    let h = sim(open).await;
    let c = client_with(&h, None, Duration::from_secs(5));
    let claim = c.claim(&req("ns/a")).await.expect("open-mode claim");
    let err = c
        .release_as_node(&claim.id)
        .await
        .expect_err("no node token");
    assert!(matches!(err, SandboxdError::InvalidRequest { .. }));
    // Even a bearer that is not the claim token cannot release in open mode.
    let other = client_with(&h, Some("anything"), Duration::from_secs(5));
    assert_eq!(
        other.release_as_node(&claim.id).await.expect("404"),
        ReleaseOutcome::AlreadyGone
    );
    assert_eq!(h.claims().len(), 1);
    assert_eq!(
        c.release(&claim.id, &claim.token).await.expect("own token"),
        ReleaseOutcome::Released
    );
}

// ---------------------------------------------------------------------------
// GET /v1/sandboxes
// ---------------------------------------------------------------------------

#[tokio::test]
async fn list_200_rows_sorted_with_states_and_zero_deadline() {
    let h = sim(cfg()).await;
    let c = client(&h);
    assert!(c.list().await.expect("empty list").is_empty());
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(c.claim(&req(&format!("ns/p{i}"))).await.expect("claim").id);
    }
    let mut sorted = ids.clone();
    sorted.sort();
    h.patch_claim(
        &ids[1],
        ClaimPatch {
            hibernated: Some(true),
            ..ClaimPatch::default()
        },
    )
    .expect("hibernate");
    h.patch_claim(
        &ids[2],
        ClaimPatch {
            archived: Some(true),
            deadline: Some("zero".into()),
            ..ClaimPatch::default()
        },
    )
    .expect("archive");
    let rows = c.list().await.expect("list");
    assert_eq!(
        rows.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        sorted
    );
    let row = |id: &str| rows.iter().find(|r| r.id == id).expect("row");
    assert_eq!(row(&ids[0]).state(), SandboxState::Running);
    assert_eq!(row(&ids[0]).claim_ref, "ns/p0");
    assert_eq!(
        row(&ids[0]).deadline.expires_at(),
        Some(start() + SignedDuration::from_secs(86_400))
    );
    assert_eq!(row(&ids[1]).state(), SandboxState::Hibernated);
    assert_eq!(row(&ids[2]).state(), SandboxState::Archived);
    assert_eq!(
        row(&ids[2]).deadline,
        Deadline::Never,
        "zero time = no expiry"
    );
    assert_eq!(row(&ids[2]).key.net, "none");
}

#[tokio::test]
async fn list_401_is_an_error() {
    let h = sim(cfg()).await;
    let err = client_with(&h, Some("nope"), Duration::from_secs(5))
        .list()
        .await
        .expect_err("401");
    assert_http(&err, Op::List, 401, "invalid api token");
}

#[tokio::test]
async fn list_403_for_tenants_on_older_builds_and_own_rows_on_newer() {
    let mut cfg = cfg();
    cfg.tenants = vec![TenantConfig {
        name: "acme".into(),
        token: "tenant-tok".into(),
        max_claims: 0,
    }];
    let h = sim(cfg).await;
    let root = client(&h);
    let tenant = client_with(&h, Some("tenant-tok"), Duration::from_secs(5));
    root.claim(&req("ns/root")).await.expect("root claim");
    tenant.claim(&req("ns/tenant")).await.expect("tenant claim");
    let err = tenant.list().await.expect_err("403");
    assert_http(&err, Op::List, 403, "operator token required");
    h.patch_config(ConfigPatch {
        tenant_list: Some(TenantList::Own),
        ..ConfigPatch::default()
    });
    let rows = tenant.list().await.expect("own rows");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].claim_ref, "ns/tenant");
    assert_eq!(root.list().await.expect("root sees all").len(), 2);
}

#[tokio::test]
async fn list_failures_are_never_an_empty_list() {
    let h = sim(cfg()).await;
    let c = client_with(&h, Some(ROOT), Duration::from_millis(300));
    c.claim(&req("ns/a")).await.expect("claim");

    arm(
        &h,
        fault(Endpoint::List, status_fault(500, Some("boom")), Some(1)),
    );
    assert_http(&c.list().await.expect_err("500"), Op::List, 500, "boom");
    arm(&h, fault(Endpoint::List, status_fault(503, None), Some(1)));
    assert!(matches!(
        c.list().await,
        Err(SandboxdError::Http { status: 503, .. })
    ));
    arm(&h, fault(Endpoint::List, FaultKind::Garbage, Some(1)));
    assert!(matches!(
        c.list().await,
        Err(SandboxdError::Decode { op: Op::List, .. })
    ));
    arm(&h, fault(Endpoint::List, raw_fault(200, "{}"), Some(1)));
    assert!(
        matches!(c.list().await, Err(SandboxdError::Decode { .. })),
        "{{}} is not a list"
    );
    arm(
        &h,
        fault(
            Endpoint::List,
            raw_fault(200, r#"{"sandboxes":null}"#),
            Some(1),
        ),
    );
    assert!(matches!(c.list().await, Err(SandboxdError::Decode { .. })));
    arm(&h, fault(Endpoint::List, FaultKind::Truncate, Some(1)));
    assert_transport(&c.list().await.expect_err("truncated"), Op::List);
    arm(
        &h,
        fault(Endpoint::List, FaultKind::Slow { ms: 1500 }, Some(1)),
    );
    assert!(matches!(
        c.list().await,
        Err(SandboxdError::Transport {
            op: Op::List,
            timeout: true,
            ..
        })
    ));
    arm(&h, fault(Endpoint::List, FaultKind::DropBefore, Some(1)));
    assert_transport(&c.list().await.expect_err("dropped"), Op::List);

    h.set_accepting(false);
    wait_until("listener closed", || refused(&h)).await;
    assert_transport(&c.list().await.expect_err("refused"), Op::List);
    h.set_accepting(true);
    wait_until("listener back", || async { !refused(&h).await }).await;
    assert_eq!(c.list().await.expect("recovered").len(), 1);
}

#[tokio::test]
async fn list_reply_over_the_listing_limit_is_a_decode_error() {
    let h = sim(cfg()).await;
    // The listing limit (32 MiB) holds a full node's rows; one byte past it is refused.
    let big = format!(
        r#"{{"sandboxes":[],"pad":"{}"}}"#,
        "x".repeat(decode::LIST_BODY_LIMIT)
    );
    arm(&h, fault(Endpoint::List, raw_fault(200, &big), Some(1)));
    let err = client(&h).list().await.expect_err("too big");
    assert!(
        matches!(&err, SandboxdError::Decode { message, .. } if message.contains("exceeds")),
        "{err:?}"
    );
    // A huge error body is cut at 64 KiB and does not break the mapping.
    let big_err = format!(r#"{{"error":"{}"}}"#, "y".repeat(200 * 1024));
    arm(&h, fault(Endpoint::List, raw_fault(500, &big_err), Some(1)));
    assert_http(
        &client(&h).list().await.expect_err("500"),
        Op::List,
        500,
        "",
    );
}

// ---------------------------------------------------------------------------
// GET /v1/info
// ---------------------------------------------------------------------------

#[tokio::test]
async fn info_200_pools_and_counters() {
    let mut cfg = cfg();
    cfg.pools.push(PoolConfig {
        net: "egress".into(),
        size: "medium".into(),
        target: Some(2),
        ..pool("rt:24.04", 1)
    });
    cfg.peers = vec!["10.0.0.6:7777".into()];
    cfg.quirks.engine_in_key = true;
    cfg.refill_delay_ms = 60_000;
    let h = sim(cfg).await;
    let c = client(&h);
    let claim = c.claim(&req("ns/a")).await.expect("claim");
    h.patch_claim(
        &claim.id,
        ClaimPatch {
            hibernated: Some(true),
            ..ClaimPatch::default()
        },
    )
    .expect("hibernate");
    let info = c.info().await.expect("info");
    assert_eq!((info.claimed, info.hibernated, info.archived), (1, 1, 0));
    assert_eq!(info.peers, vec!["10.0.0.6:7777".to_string()]);
    assert!(!info.draining);
    let base = info
        .pools
        .iter()
        .find(|p| p.key.template == TEMPLATE)
        .expect("base pool");
    assert_eq!((base.warm, base.target, base.refilling), (3, 4, 1));
    let rt = info
        .pools
        .iter()
        .find(|p| p.key.template == "rt:24.04")
        .expect("rt pool");
    assert_eq!(
        (rt.key.net.as_str(), rt.key.size.as_str()),
        ("egress", "medium")
    );
    assert_eq!((rt.warm, rt.target), (1, 2));
    h.patch_config(ConfigPatch {
        draining: Some(true),
        ..ConfigPatch::default()
    });
    assert!(c.info().await.expect("info").draining);
}

#[tokio::test]
async fn info_401_and_403() {
    let mut cfg = cfg();
    cfg.tenants = vec![TenantConfig {
        name: "acme".into(),
        token: "tenant-tok".into(),
        max_claims: 0,
    }];
    let h = sim(cfg).await;
    let err = client_with(&h, Some("nope"), Duration::from_secs(5))
        .info()
        .await
        .expect_err("401");
    assert_http(&err, Op::Info, 401, "invalid api token");
    let err = client_with(&h, Some("tenant-tok"), Duration::from_secs(5))
        .info()
        .await
        .expect_err("403");
    assert_http(&err, Op::Info, 403, "operator token required");
}

#[tokio::test]
async fn info_failures_are_errors_never_zero_capacity() {
    let h = sim(cfg()).await;
    let c = client(&h);
    arm(
        &h,
        fault(Endpoint::Info, status_fault(500, Some("boom")), Some(1)),
    );
    assert_http(&c.info().await.expect_err("500"), Op::Info, 500, "boom");
    arm(&h, fault(Endpoint::Info, status_fault(503, None), Some(1)));
    assert!(matches!(
        c.info().await,
        Err(SandboxdError::Http {
            op: Op::Info,
            status: 503,
            ..
        })
    ));
    arm(&h, fault(Endpoint::Info, FaultKind::Garbage, Some(1)));
    assert!(matches!(
        c.info().await,
        Err(SandboxdError::Decode { op: Op::Info, .. })
    ));
    arm(&h, fault(Endpoint::Info, FaultKind::Truncate, Some(1)));
    assert_transport(&c.info().await.expect_err("truncated"), Op::Info);
    h.set_accepting(false);
    wait_until("listener closed", || refused(&h)).await;
    assert_transport(&c.info().await.expect_err("refused"), Op::Info);
}

// ---------------------------------------------------------------------------
// Authentication and the token header
// ---------------------------------------------------------------------------

#[tokio::test]
async fn token_file_is_trimmed_and_sent_as_bearer_release_uses_the_claim_token() {
    let mut cfg = cfg();
    cfg.api_token = "tok".into();
    let h = sim(cfg).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("token");
    std::fs::write(&path, " tok\n").expect("write token");
    let token = read_token_file(&path).expect("read token");
    assert_eq!(token.as_deref(), Some("tok"));
    let c = client_with(&h, token.as_deref(), Duration::from_secs(5));
    let claim = c.claim(&req("ns/a")).await.expect("claim");
    c.list().await.expect("list");
    c.info().await.expect("info");
    c.release(&claim.id, &claim.token).await.expect("release");
    let auth: Vec<_> = h
        .requests()
        .into_iter()
        .map(|r| (r.path, r.authorization))
        .collect();
    let bearer = |t: &str| Some(format!("Bearer {t}"));
    assert_eq!(
        auth,
        vec![
            ("/v1/claim".to_string(), bearer("tok")),
            ("/v1/sandboxes".to_string(), bearer("tok")),
            ("/v1/info".to_string(), bearer("tok")),
            (
                format!("/v1/sandboxes/{}/release", claim.id),
                bearer(claim.token.expose())
            ),
        ]
    );
}

#[tokio::test]
async fn no_token_sends_no_authorization_header_and_works_in_open_mode() {
    let mut open = cfg();
    open.api_token = String::new();
    let h = sim(open).await;
    let c = client_with(&h, None, Duration::from_secs(5));
    assert!(!c.has_token());
    c.claim(&req("ns/a")).await.expect("claim");
    c.list().await.expect("list");
    c.info().await.expect("info");
    assert!(h.requests().iter().all(|r| r.authorization.is_none()));
    // Open mode ignores any Authorization header on node-token routes.
    client_with(&h, Some("whatever"), Duration::from_secs(5))
        .list()
        .await
        .expect("header ignored in open mode");
}

#[tokio::test]
async fn empty_token_file_means_no_header() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("token");
    std::fs::write(&path, "\n  \n").expect("write");
    assert_eq!(read_token_file(&path).expect("read"), None);
}

#[tokio::test]
async fn root_token_rotation_turns_into_401() {
    let h = sim(cfg()).await;
    let c = client(&h);
    c.list().await.expect("before rotation");
    h.patch_config(ConfigPatch {
        api_token: Some("rotated".into()),
        ..ConfigPatch::default()
    });
    assert_http(
        &c.list().await.expect_err("401"),
        Op::List,
        401,
        "invalid api token",
    );
    assert_http(
        &c.info().await.expect_err("401"),
        Op::Info,
        401,
        "invalid api token",
    );
    assert_http(
        &c.claim(&req("ns/a")).await.expect_err("401"),
        Op::Claim,
        401,
        "invalid api token",
    );
}

#[tokio::test]
async fn simulator_checks_the_exact_bearer_prefix() {
    let h = sim(cfg()).await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/sandboxes", h.base_url());
    for (header, want) in [
        (format!("Bearer {ROOT}"), 200),
        (format!("bearer {ROOT}"), 401),
        (format!("Bearer  {ROOT}"), 401),
        ("Bearer ".to_string(), 401),
        (format!("Basic {ROOT}"), 401),
    ] {
        let status = http
            .get(&url)
            .header("Authorization", &header)
            .send()
            .await
            .expect("send")
            .status()
            .as_u16();
        assert_eq!(status, want, "{header:?}");
    }
}

#[tokio::test]
async fn simulator_router_replies_are_plain_text_404_and_405_with_allow() {
    let h = sim(cfg()).await;
    let http = reqwest::Client::new();
    let resp = http
        .get(format!("{}/v1/nope", h.base_url()))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 404);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .expect("ct")
            .starts_with("text/plain")
    );
    assert_eq!(resp.text().await.expect("body"), "404 page not found\n");
    for (method, path, allow) in [
        (reqwest::Method::GET, "/v1/claim", "POST"),
        (reqwest::Method::DELETE, "/v1/sandboxes", "GET, HEAD"),
        (reqwest::Method::GET, "/v1/sandboxes/sb_1/release", "POST"),
        (reqwest::Method::POST, "/v1/info", "GET, HEAD"),
    ] {
        let resp = http
            .request(method.clone(), format!("{}{path}", h.base_url()))
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status().as_u16(), 405, "{method} {path}");
        assert_eq!(resp.headers()["allow"], allow, "{method} {path}");
    }
    let resp = http
        .get(format!("{}/healthz", h.base_url()))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.text().await.expect("body"), "ok");
}

#[tokio::test]
async fn simulator_decodes_claims_like_go() {
    let h = sim(cfg()).await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/claim", h.base_url());
    for (body, want) in [
        (
            r#"{"TEMPLATE":"base:24.04","Claim_Ref":"ns/x","unknown":[1]} {"#,
            200,
        ),
        (r#"{"template":"base:24.04","ttl_seconds":-5}"#, 200),
        ("", 400),
        ("[]", 400),
        (r#"{"template":5}"#, 400),
    ] {
        let resp = http
            .post(&url)
            .bearer_auth(ROOT)
            .body(body)
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status().as_u16(), want, "{body}");
    }
    let stored = h.claims();
    assert!(stored.iter().any(|c| c.claim_ref == "ns/x"));
    assert!(
        stored.iter().any(|c| c.ttl_seconds == 300),
        "negative TTL → 5 min"
    );
}

// ---------------------------------------------------------------------------
// Lease lifecycle: reaper, restart, clock
// ---------------------------------------------------------------------------

#[tokio::test]
async fn reaper_drops_claims_whose_deadline_strictly_passed() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let mut r = req("ns/a");
    r.ttl_seconds = 60;
    let claim = c.claim(&r).await.expect("claim");
    h.patch_clock(sandboxd_sim::ClockPatch {
        advance_seconds: Some(60),
        ..Default::default()
    });
    assert!(
        h.reap().is_empty(),
        "exactly at the deadline is not past it"
    );
    h.patch_clock(sandboxd_sim::ClockPatch {
        advance_ms: Some(1),
        ..Default::default()
    });
    assert_eq!(h.reap(), vec![claim.id.clone()]);
    assert!(c.list().await.expect("list").is_empty());
    assert_eq!(
        c.release(&claim.id, &claim.token)
            .await
            .expect("after reap"),
        ReleaseOutcome::AlreadyGone
    );
}

#[tokio::test]
async fn reaper_archives_hibernated_claims_of_an_archiving_pool() {
    let mut cfg = cfg();
    cfg.pools[0].archive_on_expire = true;
    let h = sim(cfg).await;
    let c = client(&h);
    let mut r = req("ns/a");
    r.ttl_seconds = 60;
    let claim = c.claim(&r).await.expect("claim");
    h.patch_claim(
        &claim.id,
        ClaimPatch {
            hibernated: Some(true),
            ..ClaimPatch::default()
        },
    )
    .expect("hibernate");
    h.patch_clock(sandboxd_sim::ClockPatch {
        advance_seconds: Some(61),
        ..Default::default()
    });
    h.reap();
    let rows = c.list().await.expect("list");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].state(), SandboxState::Archived);
    assert_eq!(rows[0].deadline, Deadline::Never);
}

#[tokio::test]
async fn restart_reloads_persisted_claims_and_can_drop_some() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = cfg();
    cfg.state_file = Some(dir.path().join("state/claims.json"));
    let h = sim(cfg.clone()).await;
    let c = client(&h);
    let a = c.claim(&req("ns/a")).await.expect("a");
    let b = c.claim(&req("ns/b")).await.expect("b");
    let kept = h.restart(std::slice::from_ref(&b.id)).expect("restart");
    assert_eq!(kept, vec![a.id.clone()]);
    let rows = c.list().await.expect("list");
    assert_eq!(
        rows.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        [a.id.as_str()]
    );
    assert_eq!(
        c.release(&b.id, &b.token).await.expect("dropped row"),
        ReleaseOutcome::AlreadyGone
    );
    // A fresh simulator on the same state file sees the surviving claim.
    drop(h);
    let h2 = sim(cfg).await;
    let c2 = client(&h2);
    assert_eq!(c2.list().await.expect("list")[0].id, a.id);
    assert_eq!(
        c2.release(&a.id, &a.token)
            .await
            .expect("release after restart"),
        ReleaseOutcome::Released
    );
}

// ---------------------------------------------------------------------------
// Observer hook
// ---------------------------------------------------------------------------

#[derive(Default)]
struct Counting {
    ok: AtomicUsize,
    failed: AtomicUsize,
}

impl Observer for Counting {
    fn observe(&self, _op: Op, _elapsed: Duration, outcome: Result<(), &SandboxdError>) {
        match outcome {
            Ok(()) => self.ok.fetch_add(1, Ordering::SeqCst),
            Err(_) => self.failed.fetch_add(1, Ordering::SeqCst),
        };
    }
}

#[tokio::test]
async fn observer_sees_every_call() {
    let h = sim(cfg()).await;
    let counting = Arc::new(Counting::default());
    vk_sandbox::crypto::install_provider();
    let c = SandboxdClient::builder(h.base_url())
        .token(Some(ROOT.into()))
        .observer(counting.clone())
        .build()
        .expect("client");
    c.list().await.expect("list");
    c.claim(&req("ns/a")).await.expect("claim");
    arm(&h, fault(Endpoint::Info, status_fault(500, None), Some(1)));
    c.info().await.expect_err("500");
    assert_eq!(counting.ok.load(Ordering::SeqCst), 2);
    assert_eq!(counting.failed.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------
// Property tests: no reply, however malformed, makes the client panic
// ---------------------------------------------------------------------------

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let key = prop_oneof![
        Just("id".to_string()),
        Just("token".to_string()),
        Just("deadline".to_string()),
        Just("owner_addr".to_string()),
        Just("redirect".to_string()),
        Just("error".to_string()),
        Just("sandboxes".to_string()),
        Just("pools".to_string()),
        Just("key".to_string()),
        Just("hibernated".to_string()),
        Just("archived".to_string()),
        Just("claim_ref".to_string()),
        Just("warm".to_string()),
        Just("target".to_string()),
        Just("from_checkpoint".to_string()),
        "[a-z_]{0,8}",
    ];
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f)
            .map_or(serde_json::Value::Null, serde_json::Value::Number)),
        ".{0,24}".prop_map(serde_json::Value::from),
        Just(serde_json::Value::from("0001-01-01T00:00:00Z")),
        Just(serde_json::Value::from("2026-07-06T08:05:00.5+08:00")),
        Just(serde_json::Value::from(":7777")),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn decode_everything(reply: &RawReply) {
    let _ = decode::decode_claim(reply).map(|c| {
        let _ = (
            c.pod_ip(),
            c.owner(),
            c.deadline.expires_at(),
            format!("{c:?}"),
        );
    });
    let _ = decode::decode_release(reply);
    let _ = decode::decode_list(reply).map(|rows| {
        for r in rows {
            let _ = (r.state(), r.deadline.expires_at(), r.deadline.to_string());
        }
    });
    let _ = decode::decode_info(reply);
    let _ = decode::error_message(&reply.body);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn decoding_random_bytes_never_panics(
        status in any::<u16>(),
        body in prop::collection::vec(any::<u8>(), 0..512),
        over_limit in any::<bool>(),
    ) {
        decode_everything(&RawReply { status, body, over_limit });
    }

    #[test]
    fn decoding_random_json_never_panics(
        status in prop_oneof![Just(200u16), Just(204), Just(404), Just(429), 100u16..600],
        value in json_value(),
    ) {
        let body = serde_json::to_vec(&value).expect("serialise");
        decode_everything(&RawReply::new(status, body));
    }

    #[test]
    fn random_deadlines_and_addresses_never_panic(s in ".{0,40}") {
        let d = Deadline::parse(Some(&s));
        let _ = (d.expires_at(), d.unparseable(), d.to_string());
        let _ = vk_sandbox::sandboxd::pod_ip_from_owner_addr(&s);
        let _ = vk_sandbox::sandboxd::OwnerAddr::parse(Some(&s)).to_string();
    }
}

/// Random replies over real HTTP: status and raw bytes from a tiny server,
/// through the client's bounded reader and decoders. What the client
/// returns must be exactly what the pure decoders make of the same reply
/// (the oracle), for every call: nothing lost or invented on the way.
#[test]
fn client_survives_random_replies_over_http() {
    use axum::body::Body;
    use axum::response::Response;

    vk_sandbox::crypto::install_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let current: Arc<std::sync::Mutex<(u16, Vec<u8>, bool)>> =
        Arc::new(std::sync::Mutex::new((200, Vec::new(), false)));
    let client = rt.block_on(async {
        let state = current.clone();
        let app = axum::Router::new().fallback(move || {
            let state = state.clone();
            async move {
                let (status, body, json_content_type) = state.lock().expect("reply lock").clone();
                let mut resp = Response::new(Body::from(body.clone()));
                *resp.status_mut() =
                    axum::http::StatusCode::from_u16(status).expect("status in range");
                if json_content_type {
                    resp.headers_mut().insert(
                        axum::http::header::CONTENT_TYPE,
                        axum::http::HeaderValue::from_static("application/json"),
                    );
                }
                resp
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        SandboxdClient::builder(format!("http://{addr}"))
            .token(Some("t".into()))
            .timeout(Duration::from_secs(5))
            .build()
            .expect("client")
    });
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(64));
    let strategy = (
        prop_oneof![Just(200u16), Just(204), Just(404), Just(429), 200u16..600],
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..256),
            json_value().prop_map(|v| serde_json::to_vec(&v).expect("json")),
        ],
        any::<bool>(),
    );
    runner
        .run(&strategy, |(status, body, flag)| {
            *current.lock().expect("reply lock") = (status, body.clone(), flag);
            // HTTP itself carries no body on 204 and 304.
            let sent = if matches!(status, 204 | 304) {
                Vec::new()
            } else {
                body
            };
            let reply = RawReply::new(status, sent);
            let show = |r: Result<String, vk_sandbox::sandboxd::SandboxdError>| match r {
                Ok(v) => format!("ok {v}"),
                Err(e) => format!("err {e}"),
            };
            let (claim, release, list, info) = rt.block_on(async {
                (
                    client.claim(&req("ns/p")).await.map(|v| format!("{v:?}")),
                    client
                        .release("sb_1", &Secret::new("x"))
                        .await
                        .map(|v| format!("{v:?}")),
                    client.list().await.map(|v| format!("{v:?}")),
                    client.info().await.map(|v| format!("{v:?}")),
                )
            });
            prop_assert_eq!(
                show(claim),
                show(decode::decode_claim(&reply).map(|v| format!("{v:?}")))
            );
            prop_assert_eq!(
                show(release),
                show(decode::decode_release(&reply).map(|v| format!("{v:?}")))
            );
            prop_assert_eq!(
                show(list),
                show(decode::decode_list(&reply).map(|v| format!("{v:?}")))
            );
            prop_assert_eq!(
                show(info),
                show(decode::decode_info(&reply).map(|v| format!("{v:?}")))
            );
            Ok(())
        })
        .expect("the client returns what the decoders make of every reply");
}

/// What the Node's capacity and health are read from (docs/operations.md,
/// "sandboxd on the Node"): sandboxd's operator drain (`POST`/`DELETE
/// /v1/drain`, root only) shows as `draining` and refuses claims with 429;
/// a claim cap refuses with "N live claims, cap N"; a host with no room
/// and no warm VM reports `at_capacity`. Running sandboxes stay listed
/// through all of it.
#[tokio::test]
async fn drain_cap_and_host_capacity_show_in_info() {
    let mut cfg = self::cfg();
    cfg.tenants = vec![TenantConfig {
        name: "acme".into(),
        token: "tenant-tok".into(),
        max_claims: 0,
    }];
    cfg.pools = vec![pool(TEMPLATE, 2)];
    cfg.refill_delay_ms = 60_000;
    let h = sim(cfg).await;
    let c = client(&h);
    let first = c.claim(&req("ns/a")).await.expect("claim");
    let http = reqwest::Client::new();
    let drain = |method: reqwest::Method, token: &str| {
        http.request(method, format!("{}/v1/drain", h.base_url()))
            .bearer_auth(token)
            .send()
    };
    let r = drain(reqwest::Method::POST, "tenant-tok")
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 403, "a tenant cannot drain");
    let r = drain(reqwest::Method::POST, ROOT).await.expect("send");
    assert_eq!(r.status().as_u16(), 204);
    assert!(c.info().await.expect("info").draining);
    let err = c.claim(&req("ns/b")).await.expect_err("draining");
    assert!(
        matches!(&err, SandboxdError::CapacityMiss { message } if message.ends_with("node draining")),
        "{err:?}"
    );
    let listed = c.list().await.expect("list");
    assert!(
        listed.iter().any(|r| r.id == first.id),
        "running sandbox kept"
    );
    let r = drain(reqwest::Method::DELETE, ROOT).await.expect("send");
    assert_eq!(r.status().as_u16(), 204);
    assert!(!c.info().await.expect("info").draining);
    let r = drain(reqwest::Method::GET, ROOT).await.expect("send");
    assert_eq!(r.status().as_u16(), 405);

    // The cap: info says how many are claimed (not the cap); the 429 does.
    h.patch_config(ConfigPatch {
        max_claims: Some(2),
        ..ConfigPatch::default()
    });
    c.claim(&req("ns/b")).await.expect("claim under the cap");
    let err = c.claim(&req("ns/c")).await.expect_err("at the cap");
    assert!(
        matches!(&err, SandboxdError::CapacityMiss { message } if message.ends_with("2 live claims, cap 2")),
        "{err:?}"
    );
    assert_eq!(c.info().await.expect("info").claimed, 2);

    // No room on the host and the pool empty: at_capacity with its reason.
    let mut full = self::cfg();
    full.pools = vec![pool(TEMPLATE, 2)];
    full.max_running = 2;
    let h = sim(full).await;
    let c = client(&h);
    // Take warm VMs until none is left and no refill can start.
    let mut info = c.info().await.expect("info");
    for i in 0..6 {
        if info.pools[0].warm == 0 && info.pools[0].refilling == 0 {
            break;
        }
        if info.pools[0].warm > 0 {
            c.claim(&req(&format!("ns/x{i}"))).await.expect("claim");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        info = c.info().await.expect("info");
    }
    assert_eq!(info.pools[0].warm, 0, "{info:?}");
    assert!(info.at_capacity, "{info:?}");
    assert!(
        info.at_capacity_reason
            .as_deref()
            .is_some_and(|r| r.contains("max_running")),
        "{info:?}"
    );
}
