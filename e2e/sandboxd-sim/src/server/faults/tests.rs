//! The edge's faults against the real model: a replacing fault leaves the
//! model untouched, a delivery fault carries the model's reply, a fault
//! that happens inside sandboxd reaches the model.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::*;
use crate::config::{GuestNetworkMode, PoolConfig, SimConfig};
use crate::faults::Fault;

const CLAIM: &[u8] = br#"{"template":"base:24.04","claim_ref":"ns/p"}"#;
const WARM: u32 = 4;

fn sim() -> Arc<Sim> {
    Sim::new(SimConfig {
        pools: vec![PoolConfig::parse_spec(&format!("base:24.04={WARM}")).expect("pool")],
        refill_delay_ms: 60_000,
        hibernate_delay_ms: 0,
        wake_delay_ms: 0,
        guest_network: GuestNetworkMode::Host,
        ..Default::default()
    })
    .expect("sim")
}

fn arm_once(sim: &Sim, fault: Fault) {
    sim.arm_fault(fault.times(1)).expect("a valid fault");
}

fn warm(sim: &Sim) -> u32 {
    sim.pools().iter().map(|(_, p)| p.warm).sum()
}

fn json(outcome: &Outcome) -> &Value {
    match &outcome.reply.body {
        Body::Json(v) => v,
        other => panic!("not JSON: {other:?}"),
    }
}

async fn claim(sim: &Arc<Sim>) -> Outcome {
    dispatch(sim, None, Call::Claim { body: CLAIM }).await
}

/// A claim made without faults: its id and `Bearer <token>`.
async fn claimed(sim: &Arc<Sim>) -> (String, String) {
    let out = claim(sim).await;
    assert_eq!(out.after, After::Send);
    let v = json(&out);
    let id = v["id"].as_str().expect("id").to_string();
    let token = v["token"].as_str().expect("token");
    (id, format!("Bearer {token}"))
}

fn status(status: u16) -> FaultKind {
    FaultKind::Status {
        status,
        error: None,
        body: None,
        content_type: None,
    }
}

#[tokio::test]
async fn a_replacing_fault_answers_a_claim_without_the_model() {
    let kinds = [
        status(500),
        FaultKind::Status {
            status: 503,
            error: None,
            body: Some("busy".into()),
            content_type: Some("text/plain".into()),
        },
        FaultKind::Redirect { peers: Vec::new() },
        FaultKind::Garbage,
        FaultKind::DropBefore,
    ];
    for kind in kinds {
        let sim = sim();
        arm_once(&sim, Fault::new(Endpoint::Claim, kind.clone()));
        let out = claim(&sim).await;
        match &kind {
            FaultKind::Status { body: None, .. } => {
                assert_eq!(out.reply.status, 500);
                assert_eq!(
                    json(&out)["error"],
                    "internal error (injected by sandboxd-sim)"
                );
                assert_eq!(out.after, After::Send);
            }
            FaultKind::Status { body: Some(_), .. } => assert_eq!(
                out,
                Outcome::from(Reply {
                    status: 503,
                    body: Body::Raw {
                        content_type: "text/plain".into(),
                        bytes: b"busy".to_vec(),
                    },
                })
            ),
            FaultKind::Redirect { .. } => {
                assert_eq!(out.reply.status, 200);
                assert_eq!(
                    json(&out)["redirect"],
                    serde_json::json!(DEFAULT_FAULT_PEERS)
                );
            }
            FaultKind::Garbage => {
                assert_eq!(out.reply.status, 200);
                let Body::Raw { bytes, .. } = &out.reply.body else {
                    panic!("garbage is raw: {out:?}");
                };
                assert!(serde_json::from_slice::<Value>(bytes).is_err());
            }
            FaultKind::DropBefore => assert_eq!(out.after, After::Drop),
            _ => unreachable!(),
        }
        assert!(sim.claims().is_empty(), "{kind:?}: the model made a claim");
        assert_eq!(warm(&sim), WARM, "{kind:?}: a warm VM was taken");
        // One use: the next claim reaches the model.
        assert_eq!(claim(&sim).await.reply.status, 200, "{kind:?}");
        assert_eq!(sim.claims().len(), 1, "{kind:?}");
    }
}

#[tokio::test]
async fn a_replacing_fault_comes_before_auth_and_keeps_the_claim() {
    let sim = sim();
    let (id, auth) = claimed(&sim).await;
    // Taken before auth: no bearer would be a 401.
    arm_once(&sim, Fault::status(Endpoint::Release, 503));
    let out = dispatch(&sim, None, Call::Release { id: &id }).await;
    assert_eq!(out.reply.status, 503);
    arm_once(&sim, Fault::drop_before(Endpoint::Release));
    let out = dispatch(&sim, Some(&auth), Call::Release { id: &id }).await;
    assert_eq!(out.after, After::Drop);
    assert_eq!(sim.claims().len(), 1, "the claim is still there");
    assert!(sim.faults().is_empty(), "both faults used up");
    let out = dispatch(&sim, Some(&auth), Call::Release { id: &id }).await;
    assert_eq!(out, Outcome::from(Reply::empty(204)));
    assert!(sim.claims().is_empty());
}

#[tokio::test]
async fn a_delivery_fault_sends_the_models_reply_late_lost_or_cut() {
    let cases = [
        (
            Fault::slow(Endpoint::Claim, 40),
            After::Delay(Duration::from_millis(40)),
        ),
        (Fault::drop_after(Endpoint::Claim), After::Drop),
        (
            Fault::new(Endpoint::Claim, FaultKind::Truncate),
            After::Truncate,
        ),
    ];
    for (fault, after) in cases {
        let sim = sim();
        arm_once(&sim, fault);
        let out = claim(&sim).await;
        assert_eq!(out.after, after);
        assert_eq!(out.reply.status, 200);
        // The effect is applied: the reply is the claim the model made.
        let claims = sim.claims();
        assert_eq!(claims.len(), 1, "{after:?}");
        assert_eq!(json(&out)["id"], claims[0].id.as_str());
        assert_eq!(warm(&sim), WARM - 1);
    }
}

#[tokio::test]
async fn a_truncated_release_is_lost_as_a_204_has_no_body() {
    let sim = sim();
    let (id, auth) = claimed(&sim).await;
    arm_once(&sim, Fault::new(Endpoint::Release, FaultKind::Truncate));
    let out = dispatch(&sim, Some(&auth), Call::Release { id: &id }).await;
    assert_eq!(
        out,
        Outcome {
            reply: Reply::empty(204),
            after: After::Drop,
        }
    );
    assert!(
        sim.claims().is_empty(),
        "released before the reply was lost"
    );
}

#[tokio::test]
async fn a_refusal_goes_out_as_it_is() {
    let sim = sim();
    let (id, auth) = claimed(&sim).await;
    arm_once(&sim, Fault::slow(Endpoint::Get, 5_000));
    let out = dispatch(&sim, None, Call::Get { id: "no-such-id" }).await;
    assert_eq!(out, Outcome::from(Reply::error(404, "unknown sandbox")));
    assert!(sim.faults().is_empty(), "the fault was used on the refusal");
    arm_once(&sim, Fault::slow(Endpoint::Renew, 30));
    let out = dispatch(
        &sim,
        None,
        Call::Renew {
            id: &id,
            body: b"{}",
        },
    )
    .await;
    assert_eq!(
        out,
        Outcome::from(Reply::error(401, "missing bearer token"))
    );
    arm_once(&sim, Fault::slow(Endpoint::Renew, 30));
    let body = br#"{"ttl_seconds":60}"#;
    let out = dispatch(&sim, Some(&auth), Call::Renew { id: &id, body }).await;
    assert_eq!(out.reply.status, 200);
    assert_eq!(out.after, After::Delay(Duration::from_millis(30)));
}

#[tokio::test]
async fn a_late_claim_is_made_after_its_client_has_gone() {
    let sim = sim();
    arm_once(&sim, Fault::claim_persists_late(150));
    let gave_up = tokio::time::timeout(Duration::from_millis(20), claim(&sim)).await;
    assert!(gave_up.is_err(), "the client gives up first");
    assert!(sim.claims().is_empty(), "nothing yet");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(sim.claims().len(), 1, "made on its own task");
}

#[tokio::test]
async fn transition_faults_reach_the_model() {
    let sim = sim();
    let (id, auth) = claimed(&sim).await;
    arm_once(&sim, Fault::fail(Endpoint::Hibernate));
    let out = dispatch(&sim, Some(&auth), Call::Hibernate { id: &id }).await;
    assert_eq!(out, Outcome::from(Reply::error(500, "hibernate failed")));
    assert!(!sim.claims()[0].hibernated, "the VM keeps running");

    arm_once(&sim, Fault::slow_hibernate(60));
    let started = Instant::now();
    let out = dispatch(&sim, Some(&auth), Call::Hibernate { id: &id }).await;
    assert_eq!(out, Outcome::from(Reply::empty(204)));
    assert!(started.elapsed() >= Duration::from_millis(60));
    assert!(sim.claims()[0].hibernated);

    arm_once(&sim, Fault::fail(Endpoint::Wake));
    let out = dispatch(&sim, Some(&auth), Call::Wake { id: &id }).await;
    assert_eq!(out, Outcome::from(Reply::error(500, "wake failed")));
    assert!(sim.claims()[0].hibernated, "it stays paused");
}

#[tokio::test]
async fn release_failures_reach_the_model() {
    let sim = sim();
    let (id, auth) = claimed(&sim).await;
    arm_once(
        &sim,
        Fault::new(Endpoint::Release, FaultKind::ReleaseFailKeep),
    );
    let out = dispatch(&sim, Some(&auth), Call::Release { id: &id }).await;
    assert_eq!(out, Outcome::from(Reply::error(500, "release failed")));
    assert_eq!(sim.claims().len(), 1, "kept");
    arm_once(
        &sim,
        Fault::new(Endpoint::Release, FaultKind::ReleaseFailDrop),
    );
    let out = dispatch(&sim, Some(&auth), Call::Release { id: &id }).await;
    assert_eq!(out, Outcome::from(Reply::error(500, "release failed")));
    assert!(sim.claims().is_empty(), "dropped");
}

#[tokio::test]
async fn an_upgrade_takes_a_replacing_fault_before_its_checks() {
    let sim = sim();
    let (id, _) = claimed(&sim).await;
    arm_once(&sim, Fault::status(Endpoint::Agent, 502));
    let refused = open_relay(&sim, None, None, Relay::Agent { id: &id }).await;
    let out = refused.expect_err("the fault answers");
    assert_eq!(out.reply.status, 502);
    arm_once(&sim, Fault::drop_before(Endpoint::Ports));
    let port = Relay::Port {
        id: &id,
        port: "22",
    };
    let out = open_relay(&sim, None, None, port)
        .await
        .expect_err("dropped");
    assert_eq!(out.after, After::Drop);
    // No fault: the model's own refusal.
    let out = open_relay(&sim, None, None, port)
        .await
        .expect_err("no bearer");
    assert_eq!(
        out,
        Outcome::from(Reply::error(401, "missing bearer token"))
    );
}
