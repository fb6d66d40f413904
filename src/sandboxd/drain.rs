//! sandboxd's own drain (`POST`/`DELETE /v1/drain`, operator-only): while
//! draining, claims get `429` (or a redirect to warm peers) and Running
//! sandboxes are untouched. vk-sandbox calls it only for a cordoned Node
//! with `--drain-sandboxd-on-cordon` (src/cordon).

use super::auth::Credential;
use super::client::SandboxdClient;
use super::decode::RawReply;
use super::error::{Op, SandboxdError};
use super::verbs_decode::refused;

impl SandboxdClient {
    /// `POST /v1/drain` with the node token: take no new claims. Idempotent.
    pub async fn drain(&self) -> Result<(), SandboxdError> {
        let req = self.inner.http.post(self.drain_url());
        self.call(Op::Drain, "", req, Credential::NodeIfAny, |r| {
            decode_drain(Op::Drain, r)
        })
        .await
    }

    /// `DELETE /v1/drain` with the node token: take claims again. Idempotent.
    pub async fn undrain(&self) -> Result<(), SandboxdError> {
        let req = self.inner.http.delete(self.drain_url());
        self.call(Op::Undrain, "", req, Credential::NodeIfAny, |r| {
            decode_drain(Op::Undrain, r)
        })
        .await
    }

    fn drain_url(&self) -> String {
        format!("{}/v1/drain", self.inner.base)
    }
}

/// Any `2xx` is done (builds answer `204`; a body, if any, says nothing
/// more); anything else is a refusal with its kind (`401`/`403`: not the
/// node token; the router's plain `404`/`405`: a build without drain).
pub fn decode_drain(op: Op, reply: &RawReply) -> Result<(), SandboxdError> {
    match reply.status {
        200..=299 => Ok(()),
        _ => Err(refused(op, reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandboxd::Refusal;

    fn reply(status: u16, body: &str) -> RawReply {
        RawReply::new(status, body.as_bytes().to_vec())
    }

    #[test]
    fn a_drain_is_done_on_any_success_and_refused_otherwise() {
        assert!(decode_drain(Op::Drain, &reply(204, "")).is_ok());
        assert!(decode_drain(Op::Undrain, &reply(200, "{}")).is_ok());
        let err = decode_drain(Op::Drain, &reply(403, r#"{"error":"forbidden"}"#)).unwrap_err();
        assert!(
            matches!(
                &err,
                SandboxdError::Refused {
                    reason: Refusal::Forbidden,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(decode_drain(Op::Undrain, &reply(500, r#"{"error":"x"}"#)).is_err());
    }
}
