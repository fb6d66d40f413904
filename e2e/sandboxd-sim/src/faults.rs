//! Fault injection: the failures vk-sandbox must survive (e2e/README.md).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    Claim,
    Release,
    List,
    Info,
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
        let i = self
            .armed
            .iter()
            .position(|a| a.fault.endpoint == endpoint)?;
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
}
