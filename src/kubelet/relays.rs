//! sandboxd's data plane through the sandboxd client: the guest agent and
//! guest port relays with the claim's token, stats with the node token.

use futures::future::BoxFuture;

use crate::kubelet::sandbox::{DataPlane, Relay, RelayError, SandboxRef, SandboxStats};
use crate::sandboxd::{Refusal, SandboxdClient, SandboxdError};

/// The [`DataPlane`] of a sandboxd.
#[derive(Debug, Clone)]
pub struct SandboxdPlane {
    client: SandboxdClient,
}

impl SandboxdPlane {
    pub fn new(client: SandboxdClient) -> SandboxdPlane {
        SandboxdPlane { client }
    }
}

/// What a failed relay or stats call means to the kubelet API. Pure.
pub fn relay_error(e: &SandboxdError) -> RelayError {
    match e {
        SandboxdError::Refused {
            status,
            reason,
            message,
            ..
        } => {
            let message = if message.is_empty() {
                reason.describe().to_string()
            } else {
                message.clone()
            };
            match reason {
                Refusal::GuestUnreachable => {
                    RelayError::Unreachable(format!("sandboxd answered {status}: {message}"))
                }
                Refusal::UnknownSandbox | Refusal::Conflict => RelayError::Gone {
                    status: *status,
                    message,
                },
                _ => RelayError::Status {
                    status: *status,
                    message,
                },
            }
        }
        other => RelayError::Transport(other.to_string()),
    }
}

impl DataPlane for SandboxdPlane {
    fn agent<'a>(&'a self, sandbox: &'a SandboxRef) -> BoxFuture<'a, Result<Relay, RelayError>> {
        Box::pin(async move {
            self.client
                .agent(&sandbox.id, &sandbox.token)
                .await
                .map(|r| Box::new(r) as Relay)
                .map_err(|e| relay_error(&e))
        })
    }

    fn port<'a>(
        &'a self,
        sandbox: &'a SandboxRef,
        port: u16,
    ) -> BoxFuture<'a, Result<Relay, RelayError>> {
        Box::pin(async move {
            self.client
                .port(&sandbox.id, &sandbox.token, port)
                .await
                .map(|r| Box::new(r) as Relay)
                .map_err(|e| relay_error(&e))
        })
    }

    fn stats<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<SandboxStats, RelayError>> {
        Box::pin(async move {
            let s = self.client.stats(id).await.map_err(|e| relay_error(&e))?;
            Ok(SandboxStats {
                mem_used_bytes: s.mem_used_bytes,
                mem_total_bytes: s.mem_total_bytes,
                hibernated: s.hibernated,
                measured_at: s.measured_at,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandboxd::Op;

    fn refused(status: u16, reason: Refusal, message: &str) -> SandboxdError {
        SandboxdError::Refused {
            op: Op::Port,
            status,
            reason,
            message: message.into(),
        }
    }

    #[test]
    fn refusals_map_to_what_the_client_is_told() {
        assert_eq!(
            relay_error(&refused(
                502,
                Refusal::GuestUnreachable,
                "guest port unreachable"
            )),
            RelayError::Unreachable("sandboxd answered 502: guest port unreachable".into())
        );
        assert_eq!(
            relay_error(&refused(404, Refusal::UnknownSandbox, "unknown sandbox")),
            RelayError::Gone {
                status: 404,
                message: "unknown sandbox".into()
            }
        );
        assert!(matches!(
            relay_error(&refused(409, Refusal::Conflict, "")),
            RelayError::Gone { status: 409, message } if !message.is_empty()
        ));
        assert_eq!(
            relay_error(&refused(500, Refusal::Failed, "sandbox lookup failed")),
            RelayError::Status {
                status: 500,
                message: "sandbox lookup failed".into()
            }
        );
        let e = SandboxdError::InvalidRequest {
            op: Op::Agent,
            message: "bad id".into(),
        };
        assert!(matches!(relay_error(&e), RelayError::Transport(m) if m.contains("bad id")));
    }
}
