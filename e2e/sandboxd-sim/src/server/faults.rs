//! The transport faults, applied where a request meets the model. This is
//! the one place that takes a request's armed fault: the faults that
//! replace the reply (`status`, `redirect`, `garbage`, `drop_before`) are
//! answered here without calling the model, so they have no side effect;
//! the model's reply is then sent late, lost or cut (`slow`, `drop_after`,
//! `truncate`). The faults that happen inside sandboxd (`persist_late`,
//! `fail`, `release_fail_*`) are handed to the model as named arguments:
//! only it can act them out (a late claim survives its client's hang-up).

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::faults::{Endpoint, FaultKind};
use crate::sim::{Answer, Body, Refused, RelayGrant, ReleaseFailure, Reply, Sim, TransitionFault};

/// Made-up peers for a redirect fault when none are configured.
const DEFAULT_FAULT_PEERS: [&str; 2] = ["10.0.0.6:7777", "10.0.0.7:7777"];

/// What to do with a reply on the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum After {
    Send,
    /// Send after this long (the effect is already applied).
    Delay(Duration),
    /// Close the connection without replying.
    Drop,
    /// Send the headers and half the body, then close.
    Truncate,
}

/// A reply and what the connection does with it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Outcome {
    pub(crate) reply: Reply,
    pub(crate) after: After,
}

impl From<Reply> for Outcome {
    fn from(reply: Reply) -> Outcome {
        Outcome {
            reply,
            after: After::Send,
        }
    }
}

/// One API request that faults apply to, as the model is asked it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Call<'a> {
    Claim { body: &'a [u8] },
    Release { id: &'a str },
    List,
    Info,
    Hibernate { id: &'a str },
    Wake { id: &'a str },
    Renew { id: &'a str, body: &'a [u8] },
    Get { id: &'a str },
    Stats { id: &'a str },
    Owner { id: &'a str },
    Exec { id: &'a str, body: &'a [u8] },
}

impl Call<'_> {
    fn endpoint(&self) -> Endpoint {
        match self {
            Call::Claim { .. } => Endpoint::Claim,
            Call::Release { .. } => Endpoint::Release,
            Call::List => Endpoint::List,
            Call::Info => Endpoint::Info,
            Call::Hibernate { .. } => Endpoint::Hibernate,
            Call::Wake { .. } => Endpoint::Wake,
            Call::Renew { .. } => Endpoint::Renew,
            Call::Get { .. } => Endpoint::Get,
            Call::Stats { .. } => Endpoint::Stats,
            Call::Owner { .. } => Endpoint::Owner,
            Call::Exec { .. } => Endpoint::Exec,
        }
    }
}

/// An upgrade request (`/agent`, `/ports/{port}`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Relay<'a> {
    Agent { id: &'a str },
    Port { id: &'a str, port: &'a str },
}

/// Serve one API request: take its fault (one use, before anything else),
/// answer a replacing fault without the model, else call the model and
/// deliver its answer as the fault says.
pub(crate) async fn dispatch(sim: &Arc<Sim>, auth: Option<&str>, call: Call<'_>) -> Outcome {
    let endpoint = call.endpoint();
    let fault = take_fault(sim, endpoint);
    if let Some(outcome) = pre_fault(sim, fault.as_ref()) {
        return outcome;
    }
    let answer = call_model(sim, auth, call, fault.as_ref()).await;
    post_fault(endpoint, fault.as_ref(), answer)
}

/// Open a relay. Only the faults that act before the `101` are armed on
/// upgrades ([`crate::Fault::validate`]); a refusal is an outcome to send.
pub(crate) async fn open_relay(
    sim: &Arc<Sim>,
    auth: Option<&str>,
    upgrade: Option<&str>,
    relay: Relay<'_>,
) -> Result<RelayGrant, Outcome> {
    let endpoint = match relay {
        Relay::Agent { .. } => Endpoint::Agent,
        Relay::Port { .. } => Endpoint::Ports,
    };
    let fault = take_fault(sim, endpoint);
    if let Some(outcome) = pre_fault(sim, fault.as_ref()) {
        return Err(outcome);
    }
    let opened = match relay {
        Relay::Agent { id } => sim.open_agent(auth, upgrade, id).await,
        Relay::Port { id, port } => sim.open_port(auth, upgrade, id, port).await,
    };
    opened.map_err(Outcome::from)
}

fn take_fault(sim: &Sim, endpoint: Endpoint) -> Option<FaultKind> {
    sim.armed().take(endpoint)
}

/// The model's call, with the part of the fault that happens inside
/// sandboxd.
async fn call_model(
    sim: &Arc<Sim>,
    auth: Option<&str>,
    call: Call<'_>,
    fault: Option<&FaultKind>,
) -> Answer {
    let transition = TransitionFault::of(fault);
    match call {
        Call::Claim { body } => Ok(match fault {
            Some(FaultKind::PersistLate { ms }) => {
                sim.claim_late(auth, body, Duration::from_millis(*ms)).await
            }
            _ => sim.claim(auth, body).await,
        }),
        Call::Release { id } => {
            let failure = match fault {
                Some(FaultKind::ReleaseFailKeep) => Some(ReleaseFailure::Keep),
                Some(FaultKind::ReleaseFailDrop) => Some(ReleaseFailure::Drop),
                _ => None,
            };
            sim.release(auth, id, failure)
        }
        Call::List => sim.list(auth),
        Call::Info => sim.info(auth),
        Call::Hibernate { id } => sim.hibernate(auth, id, transition).await,
        Call::Wake { id } => sim.wake(auth, id, transition).await,
        Call::Renew { id, body } => sim.renew(auth, id, body, transition).await,
        Call::Get { id } => sim.get(auth, id),
        Call::Stats { id } => sim.stats(auth, id),
        Call::Owner { id } => sim.owner(auth, id),
        Call::Exec { id, body } => sim.exec(auth, id, body).await,
    }
}

fn default_status_message(status: u16) -> &'static str {
    match status {
        429 => "node claim quota reached: injected by sandboxd-sim",
        500 => "internal error (injected by sandboxd-sim)",
        503 => "service unavailable (injected by sandboxd-sim)",
        _ => "injected by sandboxd-sim",
    }
}

/// Faults that replace the reply outright, with no side effect.
fn pre_fault(sim: &Sim, fault: Option<&FaultKind>) -> Option<Outcome> {
    match fault? {
        FaultKind::Status {
            status,
            error,
            body,
            content_type,
        } => Some(
            match body {
                Some(body) => Reply {
                    status: *status,
                    body: Body::Raw {
                        content_type: content_type
                            .clone()
                            .unwrap_or_else(|| "application/json".to_string()),
                        bytes: body.clone().into_bytes(),
                    },
                },
                None => Reply::error(
                    *status,
                    error
                        .clone()
                        .unwrap_or_else(|| default_status_message(*status).to_string()),
                ),
            }
            .into(),
        ),
        FaultKind::Redirect { peers } => {
            let peers = if !peers.is_empty() {
                peers.clone()
            } else {
                let configured = sim.peers();
                if configured.is_empty() {
                    DEFAULT_FAULT_PEERS.iter().map(|p| p.to_string()).collect()
                } else {
                    configured
                }
            };
            Some(Reply::json(200, json!({ "redirect": peers })).into())
        }
        FaultKind::Garbage => Some(
            Reply {
                status: 200,
                body: Body::Raw {
                    content_type: "application/json".to_string(),
                    bytes: b"<html>sandboxd-sim: this is not JSON {".to_vec(),
                },
            }
            .into(),
        ),
        FaultKind::DropBefore => Some(Outcome {
            reply: Reply::empty(500),
            after: After::Drop,
        }),
        _ => None,
    }
}

/// Faults that change how the reply of work done is delivered. A refusal
/// (no work done) goes out as it is.
fn post_fault(endpoint: Endpoint, fault: Option<&FaultKind>, answer: Answer) -> Outcome {
    let reply = match answer {
        Ok(reply) => reply,
        Err(Refused(reply)) => return reply.into(),
    };
    let after = match fault {
        Some(FaultKind::Slow { ms }) => After::Delay(Duration::from_millis(*ms)),
        Some(FaultKind::DropAfter) => After::Drop,
        // A release's 204 has no body to cut: the reply is lost instead.
        Some(FaultKind::Truncate) if endpoint == Endpoint::Release => After::Drop,
        Some(FaultKind::Truncate) => After::Truncate,
        _ => After::Send,
    };
    Outcome { reply, after }
}

#[cfg(test)]
mod tests;
