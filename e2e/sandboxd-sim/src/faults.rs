//! Fault injection: the failures vk-sandbox must survive (e2e/README.md).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    Claim,
    Release,
    List,
    Info,
    Hibernate,
    /// Explicit wakes, and the implicit wake of a relay call (`fail` and
    /// `persist_late` only).
    Wake,
    Renew,
    /// `GET /v1/sandboxes/{id}`.
    Get,
    Stats,
    Owner,
    Exec,
    Agent,
    Ports,
}

impl Endpoint {
    /// The transitions that run to completion on a task of their own.
    fn is_transition(self) -> bool {
        matches!(self, Endpoint::Hibernate | Endpoint::Wake | Endpoint::Renew)
    }

    /// The upgrades: only faults that act before the `101` make sense.
    fn is_upgrade(self) -> bool {
        matches!(self, Endpoint::Agent | Endpoint::Ports)
    }
}

/// What a fault does to the next matching request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum FaultKind {
    /// Reply with this status and no side effect, before auth. The body is
    /// `body` verbatim when given, else `{"error": error}` (a default
    /// message when `error` is absent).
    Status {
        status: u16,
        #[serde(default)]
        error: Option<String>,
        #[serde(default)]
        body: Option<String>,
        #[serde(default)]
        content_type: Option<String>,
    },
    /// Claim only: `200 {"redirect":[…]}` with nothing created. `peers`
    /// defaults to the configured peers, else two made-up ones.
    Redirect {
        #[serde(default)]
        peers: Vec<String>,
    },
    /// `200` with a body that is not JSON, no side effect.
    Garbage,
    /// Process normally (side effect applied), then send the headers and
    /// half the body, and close the connection.
    Truncate,
    /// Process normally (side effect applied), then wait `ms` before
    /// replying: a reply slower than the client's timeout.
    Slow { ms: u64 },
    /// Claim, hibernate, wake, renew: nothing happens for `ms`; then the
    /// request is processed as usual (claim created and persisted, VM
    /// hibernated or woken, lease moved) whether or not its client is still
    /// connected, and the reply goes to whatever is left of the connection.
    /// sandboxd's handler goes on after its client has gone, so with `ms`
    /// past the client's timeout the reply times out and the claim appears
    /// later: the row is listed under its `claim_ref` and nobody holds its
    /// token. (`slow` applies the effect first and cannot model this.) On
    /// wake it is a slow wake (also of a relay's implicit wake), on
    /// hibernate a slow hibernate.
    PersistLate { ms: u64 },
    /// Hibernate, wake, renew: the operation fails in sandboxd after its
    /// usual time — `500 hibernate failed` (the VM keeps running), `500
    /// wake failed` (it stays paused; a relay's implicit wake answers `500
    /// sandbox lookup failed`), `500 renew failed` (the lease is
    /// unchanged).
    Fail,
    /// Process normally (side effect applied and persisted), then close the
    /// TCP connection without a reply: the lost-reply scenario.
    DropAfter,
    /// Close the TCP connection without a reply and without any effect.
    DropBefore,
    /// Release only: `500 {"error":"release failed"}`, claim kept (persisting
    /// the removal failed; a retry can succeed).
    ReleaseFailKeep,
    /// Release only: the claim is dropped and persisted, then
    /// `500 {"error":"release failed"}` (the VM survived; a retry gets 404).
    ReleaseFailDrop,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub endpoint: Endpoint,
    #[serde(flatten)]
    pub kind: FaultKind,
    /// How many requests it applies to; absent means every request until
    /// the faults are cleared.
    #[serde(default)]
    pub times: Option<u32>,
}

impl Fault {
    /// A fault for every matching request until cleared.
    pub fn new(endpoint: Endpoint, kind: FaultKind) -> Fault {
        Fault {
            endpoint,
            kind,
            times: None,
        }
    }

    /// Limit the fault to the next `n` matching requests.
    pub fn times(mut self, n: u32) -> Fault {
        self.times = Some(n);
        self
    }

    /// Reply `status` with `{"error": …}` (a default message), no effect.
    pub fn status(endpoint: Endpoint, status: u16) -> Fault {
        Fault::new(
            endpoint,
            FaultKind::Status {
                status,
                error: None,
                body: None,
                content_type: None,
            },
        )
    }

    /// Effect applied at once, reply after `ms`.
    pub fn slow(endpoint: Endpoint, ms: u64) -> Fault {
        Fault::new(endpoint, FaultKind::Slow { ms })
    }

    /// Claim: no effect for `ms`, then the claim is created and persisted
    /// even if the client has given up (see [`FaultKind::PersistLate`]).
    pub fn claim_persists_late(ms: u64) -> Fault {
        Fault::new(Endpoint::Claim, FaultKind::PersistLate { ms })
    }

    /// A wake (explicit or a relay's) that takes `ms` longer.
    pub fn slow_wake(ms: u64) -> Fault {
        Fault::new(Endpoint::Wake, FaultKind::PersistLate { ms })
    }

    /// A hibernate that takes `ms` longer.
    pub fn slow_hibernate(ms: u64) -> Fault {
        Fault::new(Endpoint::Hibernate, FaultKind::PersistLate { ms })
    }

    /// Hibernate, wake or renew fails with its `500`.
    pub fn fail(endpoint: Endpoint) -> Fault {
        Fault::new(endpoint, FaultKind::Fail)
    }

    /// Effect applied, then the connection closes without a reply.
    pub fn drop_after(endpoint: Endpoint) -> Fault {
        Fault::new(endpoint, FaultKind::DropAfter)
    }

    /// The connection closes without a reply and without an effect.
    pub fn drop_before(endpoint: Endpoint) -> Fault {
        Fault::new(endpoint, FaultKind::DropBefore)
    }

    pub fn validate(&self) -> Result<(), String> {
        match (&self.kind, self.endpoint) {
            (FaultKind::Redirect { .. }, e) if e != Endpoint::Claim => {
                Err("redirect faults apply to claim only".into())
            }
            (FaultKind::ReleaseFailKeep | FaultKind::ReleaseFailDrop, e)
                if e != Endpoint::Release =>
            {
                Err("release_fail_* faults apply to release only".into())
            }
            (FaultKind::PersistLate { .. }, e) if e != Endpoint::Claim && !e.is_transition() => {
                Err("persist_late faults apply to claim, hibernate, wake and renew only".into())
            }
            (FaultKind::Fail, e) if !e.is_transition() => {
                Err("fail faults apply to hibernate, wake and renew only".into())
            }
            (
                FaultKind::Slow { .. }
                | FaultKind::Truncate
                | FaultKind::DropAfter
                | FaultKind::Garbage,
                e,
            ) if e.is_upgrade() => {
                Err("agent and ports take only status and drop_before faults".into())
            }
            (FaultKind::Status { status, .. }, _) if !(100..=999).contains(status) => {
                Err(format!("status {status} is not an HTTP status"))
            }
            (_, _) if self.times == Some(0) => Err("times must be at least 1".into()),
            _ => Ok(()),
        }
    }
}

/// An armed fault with its remaining count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArmedFault {
    pub id: u64,
    #[serde(flatten)]
    pub fault: Fault,
    pub remaining: Option<u32>,
}

#[derive(Debug, Default)]
pub struct Faults {
    armed: Vec<ArmedFault>,
    next_id: u64,
}

impl Faults {
    pub fn arm(&mut self, fault: Fault) -> u64 {
        self.next_id += 1;
        let remaining = fault.times;
        self.armed.push(ArmedFault {
            id: self.next_id,
            fault,
            remaining,
        });
        self.next_id
    }

    /// The first armed fault for this endpoint, consuming one use.
    pub fn take(&mut self, endpoint: Endpoint) -> Option<FaultKind> {
        self.take_if(endpoint, |_| true)
    }

    /// The first armed fault for this endpoint whose kind passes `want`,
    /// consuming one use.
    pub fn take_if(
        &mut self,
        endpoint: Endpoint,
        want: impl Fn(&FaultKind) -> bool,
    ) -> Option<FaultKind> {
        let i = self
            .armed
            .iter()
            .position(|a| a.fault.endpoint == endpoint && want(&a.fault.kind))?;
        let kind = self.armed[i].fault.kind.clone();
        if let Some(n) = &mut self.armed[i].remaining {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.armed.remove(i);
            }
        }
        Some(kind)
    }

    pub fn list(&self) -> Vec<ArmedFault> {
        self.armed.clone()
    }

    pub fn clear(&mut self) {
        self.armed.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_consumed_in_order() {
        let mut f = Faults::default();
        let fault: Fault =
            serde_json::from_str(r#"{"endpoint":"claim","kind":"status","status":429,"times":2}"#)
                .expect("fault");
        fault.validate().expect("valid");
        f.arm(fault);
        f.arm(Fault {
            endpoint: Endpoint::Claim,
            kind: FaultKind::Garbage,
            times: None,
        });
        assert!(f.take(Endpoint::List).is_none());
        assert!(matches!(
            f.take(Endpoint::Claim),
            Some(FaultKind::Status { status: 429, .. })
        ));
        assert!(matches!(
            f.take(Endpoint::Claim),
            Some(FaultKind::Status { .. })
        ));
        assert!(matches!(f.take(Endpoint::Claim), Some(FaultKind::Garbage)));
        assert!(matches!(f.take(Endpoint::Claim), Some(FaultKind::Garbage)));
        assert!(
            serde_json::from_str::<Fault>(r#"{"endpoint":"list","kind":"redirect"}"#)
                .expect("parse")
                .validate()
                .is_err()
        );
    }

    #[test]
    fn persist_late_is_a_claim_fault_with_a_typed_constructor() {
        let parsed: Fault = serde_json::from_str(
            r#"{"endpoint":"claim","kind":"persist_late","ms":1500,"times":1}"#,
        )
        .expect("parse");
        assert_eq!(parsed, Fault::claim_persists_late(1500).times(1));
        parsed.validate().expect("valid on claim");
        let on_list: Fault =
            serde_json::from_str(r#"{"endpoint":"list","kind":"persist_late","ms":1}"#)
                .expect("parse");
        assert!(on_list.validate().is_err(), "not on list");
        assert!(Fault::slow_wake(55).validate().is_ok());
        assert!(Fault::fail(Endpoint::Renew).validate().is_ok());
        assert!(Fault::fail(Endpoint::Claim).validate().is_err());
        assert!(Fault::slow(Endpoint::Agent, 5).validate().is_err());
        assert!(Fault::status(Endpoint::Ports, 502).validate().is_ok());
        assert_eq!(
            Fault::slow(Endpoint::List, 40),
            Fault {
                endpoint: Endpoint::List,
                kind: FaultKind::Slow { ms: 40 },
                times: None
            }
        );
        assert!(Fault::status(Endpoint::Info, 503).validate().is_ok());
        assert!(Fault::status(Endpoint::Info, 7).validate().is_err());
    }
}
