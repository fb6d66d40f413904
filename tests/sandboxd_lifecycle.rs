//! Contract tests of sandboxd's lifecycle verbs: hibernate, wake, renew,
//! how paused and archived sandboxes list, the reaper and the archive at
//! the deadline, idle hibernation, running slots, and the faults of each
//! verb — the client against the simulator.

mod sandboxd_common;

use std::num::NonZeroU64;
use std::time::Duration;

use jiff::SignedDuration;
use sandboxd_common::*;
use sandboxd_sim::{ClaimPatch, Endpoint, Fault, SimConfig, SimHandle};
use serde_json::json;
use vk_sandbox::sandboxd::{
    ClaimRequest, Deadline, Op, Refusal, SandboxAuth, SandboxState, SandboxdClient, SandboxdError,
    Secret,
};

async fn claim_ttl(c: &SandboxdClient, net: &str, ttl: u64) -> (String, Secret) {
    let g = c
        .claim(&ClaimRequest {
            template: TEMPLATE.into(),
            net: net.into(),
            ttl_seconds: ttl,
            claim_ref: "ns/pod".into(),
            ..ClaimRequest::default()
        })
        .await
        .expect("claim");
    (g.id.clone(), (*g.token).clone())
}

async fn claim(c: &SandboxdClient) -> (String, Secret) {
    claim_ttl(c, "", 3600).await
}

fn ttl(secs: u64) -> NonZeroU64 {
    NonZeroU64::new(secs).expect("non-zero")
}

fn at(secs: i64) -> Deadline {
    Deadline::At(start() + SignedDuration::from_secs(secs))
}

fn advance(h: &SimHandle, secs: i64) {
    h.patch_clock(serde_json::from_value(json!({ "advance_seconds": secs })).expect("clock"));
}

async fn row(c: &SandboxdClient, id: &str) -> vk_sandbox::sandboxd::SandboxRow {
    c.list()
        .await
        .expect("list")
        .into_iter()
        .find(|r| r.id == id)
        .expect("listed")
}

#[tokio::test]
async fn hibernate_and_wake_are_idempotent_and_keep_the_deadline() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim(&c).await;
    let own = SandboxAuth::Token(&token);
    c.hibernate(&id, own).await.expect("hibernate");
    let r = row(&c, &id).await;
    assert_eq!(
        (r.state(), r.deadline.clone()),
        (SandboxState::Hibernated, at(3600))
    );
    let info = c.info().await.expect("info");
    assert_eq!((info.claimed, info.hibernated), (1, 1));
    c.hibernate(&id, own)
        .await
        .expect("a second hibernate is a no-op");
    assert!(c.get(&id).await.expect("get").hibernated);

    advance(&h, 100);
    c.wake(&id, own).await.expect("wake");
    let r = row(&c, &id).await;
    assert_eq!(r.state(), SandboxState::Running);
    assert_eq!(r.deadline, at(3600), "a woken sandbox keeps its deadline");
    c.wake(&id, own)
        .await
        .expect("wake on a running sandbox is a no-op");
    // The root token acts by id.
    c.hibernate(&id, SandboxAuth::Node)
        .await
        .expect("root hibernate");
    c.wake(&id, SandboxAuth::Node).await.expect("root wake");
    assert_eq!(c.info().await.expect("info").hibernated, 0);
}

#[tokio::test]
async fn lifecycle_auth_refusals() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, _) = claim(&c).await;
    for bad in ["wrong", "acme-token"] {
        let s = Secret::new(bad);
        assert_refused(
            c.hibernate(&id, SandboxAuth::Token(&s)).await,
            Op::Hibernate,
            404,
            Refusal::UnknownSandbox,
        );
        assert_refused(
            c.wake(&id, SandboxAuth::Token(&s)).await,
            Op::Wake,
            404,
            Refusal::UnknownSandbox,
        );
        assert_refused(
            c.renew(&id, SandboxAuth::Token(&s), ttl(60)).await,
            Op::Renew,
            404,
            Refusal::UnknownSandbox,
        );
    }
    let none = Secret::new("");
    assert_refused(
        c.hibernate(&id, SandboxAuth::Token(&none)).await,
        Op::Hibernate,
        401,
        Refusal::Unauthorized,
    );
    let gone = c
        .wake("sb_0000000000000000", SandboxAuth::Node)
        .await
        .expect_err("gone");
    assert!(gone.is_unknown_sandbox());
    let no_node = client_with(&h, None, Duration::from_secs(5));
    assert!(matches!(
        no_node.hibernate(&id, SandboxAuth::Node).await,
        Err(SandboxdError::InvalidRequest {
            op: Op::Hibernate,
            ..
        })
    ));
}

#[tokio::test]
async fn egress_and_volume_sandboxes_cannot_hibernate() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (egress, _) = claim_ttl(&c, "egress", 3600).await;
    assert_refused(
        c.hibernate(&egress, SandboxAuth::Node).await,
        Op::Hibernate,
        409,
        Refusal::Conflict,
    );
    let (id, _) = claim(&c).await;
    h.patch_claim(
        &id,
        ClaimPatch {
            volumes: Some(vec!["data".into()]),
            ..ClaimPatch::default()
        },
    )
    .expect("patch");
    assert_refused(
        c.hibernate(&id, SandboxAuth::Node).await,
        Op::Hibernate,
        409,
        Refusal::Conflict,
    );
    assert_eq!(row(&c, &id).await.state(), SandboxState::Running);
}

#[tokio::test]
async fn hibernate_and_wake_faults() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim(&c).await;
    let own = SandboxAuth::Token(&token);
    h.arm_fault(Fault::fail(Endpoint::Hibernate).times(1))
        .expect("arm");
    let err = c.hibernate(&id, own).await.expect_err("fails");
    assert_eq!(
        err.to_string(),
        "sandboxd hibernate: failed in sandboxd (status 500): hibernate failed"
    );
    assert_eq!(
        row(&c, &id).await.state(),
        SandboxState::Running,
        "the VM keeps running"
    );

    // A hibernate slower than the client: unknown outcome, done later.
    let impatient = client_with(&h, Some(ROOT), Duration::from_millis(200));
    h.arm_fault(Fault::slow_hibernate(1000).times(1))
        .expect("arm");
    let err = impatient.hibernate(&id, own).await.expect_err("timeout");
    assert!(err.is_outcome_unknown(), "{err:?}");
    assert_eq!(row(&c, &id).await.state(), SandboxState::Running, "not yet");
    wait_until("hibernated later", || async {
        row(&c, &id).await.state() == SandboxState::Hibernated
    })
    .await;

    h.arm_fault(Fault::fail(Endpoint::Wake).times(1))
        .expect("arm");
    assert_refused(c.wake(&id, own).await, Op::Wake, 500, Refusal::Failed);
    assert_eq!(
        row(&c, &id).await.state(),
        SandboxState::Hibernated,
        "still paused"
    );
    h.arm_fault(Fault::slow_wake(1000).times(1)).expect("arm");
    let err = impatient.wake(&id, own).await.expect_err("timeout");
    assert!(err.is_outcome_unknown());
    wait_until("woken later", || async {
        row(&c, &id).await.state() == SandboxState::Running
    })
    .await;
    h.arm_fault(Fault::status(Endpoint::Wake, 503).times(1))
        .expect("arm");
    assert_refused(c.wake(&id, own).await, Op::Wake, 503, Refusal::Busy);
}

#[tokio::test]
async fn a_transition_runs_to_completion_and_transitions_are_serialized() {
    let mut cfg = cfg();
    cfg.hibernate_delay_ms = 300;
    cfg.wake_delay_ms = 300;
    let h = sim(cfg).await;
    let c = client(&h);
    let (id, token) = claim(&c).await;
    let hib = {
        let c = c.clone();
        let id = id.clone();
        tokio::spawn(async move { c.hibernate(&id, SandboxAuth::Node).await })
    };
    wait_until("in transition", || async {
        h.claim_state(&id).expect("state")["in_transition"] == true
    })
    .await;
    assert_eq!(
        row(&c, &id).await.state(),
        SandboxState::Running,
        "not before it is done"
    );
    // A wake issued meanwhile waits for the hibernate, then undoes it.
    c.wake(&id, SandboxAuth::Token(&token)).await.expect("wake");
    hib.await.expect("join").expect("hibernate");
    assert_eq!(row(&c, &id).await.state(), SandboxState::Running);
    let log: Vec<_> = h
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/hibernate") || r.path.ends_with("/wake"))
        .map(|r| r.status)
        .collect();
    assert_eq!(log, [Some(204), Some(204)]);
}

#[tokio::test]
async fn renew_sets_now_plus_ttl_and_can_shorten() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim_ttl(&c, "", 86_400).await;
    let own = SandboxAuth::Token(&token);
    advance(&h, 10);
    assert_eq!(
        c.renew(&id, own, ttl(60)).await.expect("renew"),
        at(70),
        "now + ttl, shorter"
    );
    assert_eq!(row(&c, &id).await.deadline, at(70));
    assert_eq!(
        c.renew(&id, SandboxAuth::Node, ttl(10_000_000))
            .await
            .expect("renew"),
        at(10 + 86_400)
    );
    let body: serde_json::Value =
        serde_json::from_str(&h.requests().last().expect("logged").body).expect("json");
    assert_eq!(body, json!({"ttl_seconds": 86_400}), "explicit, clamped");

    // 0 (what the client never sends) means 5 minutes; an empty body is a 400.
    let raw = reqwest::Client::new();
    let url = format!("{}/v1/sandboxes/{id}/renew", h.base_url());
    let resp = raw
        .post(&url)
        .bearer_auth(ROOT)
        .body(r#"{"ttl_seconds":0}"#)
        .send()
        .await
        .expect("renew 0");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(row(&c, &id).await.deadline, at(10 + 300));
    let resp = raw
        .post(&url)
        .bearer_auth(ROOT)
        .send()
        .await
        .expect("empty");
    assert_eq!(resp.status().as_u16(), 400);

    // A hibernated sandbox is renewed without waking.
    c.hibernate(&id, own).await.expect("hibernate");
    assert_eq!(c.renew(&id, own, ttl(120)).await.expect("renew"), at(130));
    assert_eq!(row(&c, &id).await.state(), SandboxState::Hibernated);

    // A failed renew leaves the lease as it was.
    h.arm_fault(Fault::fail(Endpoint::Renew).times(1))
        .expect("arm");
    assert_refused(
        c.renew(&id, own, ttl(999)).await,
        Op::Renew,
        500,
        Refusal::Failed,
    );
    assert_eq!(row(&c, &id).await.deadline, at(130));

    // A renew whose reply is lost still moved the lease.
    h.arm_fault(Fault::drop_after(Endpoint::Renew).times(1))
        .expect("arm");
    let err = c.renew(&id, own, ttl(500)).await.expect_err("lost reply");
    assert!(err.is_outcome_unknown());
    assert_eq!(row(&c, &id).await.deadline, at(510));
}

#[tokio::test]
async fn a_tenant_removed_cannot_renew_with_its_own_token_but_root_can() {
    let h = sim(cfg()).await;
    let tenant = client_with(&h, Some("acme-token"), Duration::from_secs(5));
    let c = client(&h);
    let (id, token) = claim(&tenant).await;
    h.patch_config(serde_json::from_value(json!({"tenants": []})).expect("patch"));
    assert_refused(
        c.renew(&id, SandboxAuth::Token(&token), ttl(60)).await,
        Op::Renew,
        403,
        Refusal::Forbidden,
    );
    c.renew(&id, SandboxAuth::Node, ttl(60))
        .await
        .expect("root renews");
}

#[tokio::test]
async fn the_reaper_destroys_a_hibernated_claim_at_its_deadline() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim_ttl(&c, "", 60).await;
    c.hibernate(&id, SandboxAuth::Token(&token))
        .await
        .expect("hibernate");
    advance(&h, 60);
    assert!(h.reap().is_empty(), "only strictly past the deadline");
    advance(&h, 1);
    assert_eq!(h.reap(), vec![id.clone()]);
    // Recorded for the reliability suite's "lease expired" count.
    let reaped = h.reaped();
    assert_eq!(reaped.len(), 1, "{reaped:?}");
    assert_eq!(
        (reaped[0].id.as_str(), reaped[0].archived),
        (id.as_str(), false)
    );
    assert!(
        reaped[0].after_seq >= h.requests().iter().map(|r| r.seq).max().unwrap_or(0),
        "{reaped:?}"
    );
    assert!(c.list().await.expect("list").is_empty());
    assert!(
        c.wake(&id, SandboxAuth::Node)
            .await
            .expect_err("gone")
            .is_unknown_sandbox()
    );
}

#[tokio::test]
async fn archived_rows_wake_with_a_fresh_lease_and_refuse_renewal() {
    let mut cfg = cfg();
    cfg.pools[0].archive_on_expire = true;
    cfg.pools[0].archive_retention_seconds = 0;
    let h = sim(cfg).await;
    let c = client(&h);
    let (id, token) = claim_ttl(&c, "", 600).await;
    let own = SandboxAuth::Token(&token);
    c.hibernate(&id, own).await.expect("hibernate");
    advance(&h, 601);
    assert_eq!(h.reap(), vec![id.clone()]);
    assert!(
        h.reaped().iter().any(|r| r.id == id && r.archived),
        "{:?}",
        h.reaped()
    );
    let r = row(&c, &id).await;
    assert_eq!(
        (r.state(), r.deadline.clone()),
        (SandboxState::Archived, Deadline::Never)
    );
    let raw = reqwest::Client::new()
        .get(format!("{}/v1/sandboxes", h.base_url()))
        .bearer_auth(ROOT)
        .send()
        .await
        .expect("raw list")
        .text()
        .await
        .expect("body");
    assert!(
        raw.contains(r#""deadline":"0001-01-01T00:00:00Z""#),
        "{raw}"
    );
    assert!(
        raw.contains(r#""archived":true"#) && raw.contains(r#""hibernated":false"#),
        "{raw}"
    );
    assert_eq!(c.info().await.expect("info").archived, 1);
    let s = c.stats(&id).await.expect("stats");
    assert_eq!(s.mem_used_bytes, None);

    assert_refused(
        c.renew(&id, own, ttl(60)).await,
        Op::Renew,
        409,
        Refusal::Conflict,
    );
    c.wake(&id, own).await.expect("wake from the archive");
    let r = row(&c, &id).await;
    assert_eq!(r.state(), SandboxState::Running);
    assert_eq!(
        r.deadline,
        at(601 + 600),
        "a fresh lease of the granted length"
    );
}

#[tokio::test]
async fn renew_with_archive_on_expire_archives_a_running_claim() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, _) = claim_ttl(&c, "", 60).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/sandboxes/{id}/renew", h.base_url()))
        .bearer_auth(ROOT)
        .body(r#"{"ttl_seconds":60,"on_expire":"archive"}"#)
        .send()
        .await
        .expect("renew");
    assert_eq!(resp.status().as_u16(), 200);
    advance(&h, 61);
    h.reap();
    assert_eq!(row(&c, &id).await.state(), SandboxState::Archived);
}

#[tokio::test]
async fn idle_hibernation_and_the_archive_tier() {
    let mut cfg = cfg();
    cfg.idle_hibernate_seconds = 60;
    cfg.archive_after_seconds = 600;
    cfg.archive_delete_after_seconds = 3600;
    let h = sim(cfg).await;
    let c = client(&h);
    let (id, token) = claim_ttl(&c, "", 86_400).await;
    let (egress, _) = claim_ttl(&c, "egress", 86_400).await;
    advance(&h, 59);
    assert!(h.sweep().is_empty());
    // A renew is activity: the idle clock starts again.
    c.renew(&id, SandboxAuth::Token(&token), ttl(86_400))
        .await
        .expect("renew");
    advance(&h, 59);
    assert!(h.sweep().is_empty());
    advance(&h, 1);
    assert_eq!(
        h.sweep(),
        vec![id.clone()],
        "the egress claim is never swept"
    );
    assert_eq!(row(&c, &id).await.state(), SandboxState::Hibernated);
    assert_eq!(row(&c, &egress).await.state(), SandboxState::Running);
    advance(&h, 600);
    assert_eq!(h.sweep(), vec![id.clone()]);
    let r = row(&c, &id).await;
    assert_eq!(r.state(), SandboxState::Archived);
    assert_eq!(r.deadline, at(59 + 60 + 600 + 3600), "the retention window");
}

#[tokio::test]
async fn idle_hibernation_is_off_by_default_and_timing_knobs_default_to_sandboxd_figures() {
    let d = SimConfig::default();
    assert_eq!(
        (
            d.idle_hibernate_seconds,
            d.hibernate_delay_ms,
            d.wake_delay_ms
        ),
        (0, 250, 55)
    );
    let h = sim(cfg()).await;
    let c = client(&h);
    claim(&c).await;
    advance(&h, 10 * 86_400);
    assert!(h.sweep().is_empty());
}

#[tokio::test]
async fn a_hibernated_vm_frees_its_running_slot() {
    let mut cfg = cfg();
    cfg.pools = vec![pool("none", 0)];
    cfg.max_running = 2;
    let h = sim(cfg).await;
    let c = client(&h);
    let (a, _) = claim(&c).await;
    let (_b, _) = claim(&c).await;
    let err = c
        .claim(&ClaimRequest {
            template: TEMPLATE.into(),
            claim_ref: "ns/third".into(),
            ..ClaimRequest::default()
        })
        .await
        .expect_err("no slot");
    assert!(
        matches!(err, SandboxdError::Http { status: 500, .. }),
        "{err:?}"
    );
    c.hibernate(&a, SandboxAuth::Node).await.expect("hibernate");
    let (third, _) = claim(&c).await;
    // Now the hibernated one cannot come back: no slot to run it.
    assert_refused(
        c.wake(&a, SandboxAuth::Node).await,
        Op::Wake,
        500,
        Refusal::Failed,
    );
    c.release_as_node(&third).await.expect("release");
    c.wake(&a, SandboxAuth::Node)
        .await
        .expect("a slot came free");
    let info = c.info().await.expect("info");
    assert_eq!((info.claimed, info.hibernated), (2, 0));
}

#[tokio::test]
async fn a_failed_sandbox_cold_boots_on_wake() {
    let h = sim(cfg()).await;
    let c = client(&h);
    let (id, token) = claim(&c).await;
    h.patch_claim(
        &id,
        ClaimPatch {
            failed: Some("vmm exited".into()),
            ..ClaimPatch::default()
        },
    )
    .expect("patch");
    assert_eq!(
        c.get(&id).await.expect("get").failed.as_deref(),
        Some("vmm exited")
    );
    assert_refused(
        c.hibernate(&id, SandboxAuth::Token(&token)).await,
        Op::Hibernate,
        409,
        Refusal::Conflict,
    );
    c.wake(&id, SandboxAuth::Token(&token))
        .await
        .expect("cold boot");
    assert!(c.get(&id).await.expect("get").failed.is_none());
}
