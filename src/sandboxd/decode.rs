//! Reply decoding as pure functions of (status, body bytes), so every mapping
//! (docs/architecture.md#sandboxd-api) can be tested without a network, and
//! so no reply, however malformed, can do more than produce an error.

use serde::Deserialize;

use super::error::{Op, SandboxdError};
use super::types::{ClaimReply, Granted, ListReply, NodeInfo, ReleaseOutcome, SandboxRow, Token};

/// Largest error body read; longer bodies are cut.
pub const ERROR_BODY_LIMIT: usize = 64 * 1024;
/// Largest JSON success body accepted, but a listing's.
pub const JSON_BODY_LIMIT: usize = 1024 * 1024;
/// Largest listing accepted (`GET /v1/sandboxes`). A row is about 300
/// bytes with vk-sandbox's tagged `claim_ref`, so 1 MiB failed every
/// listing from about 3,500 rows on — every client's rows together, fewer
/// than twice the default `--node-pods` (2000) — and a node whose listing
/// fails never verifies a claim again. 32 MiB holds over 100,000 rows: 50
/// times the default `--node-pods`, with room for the neighbours that share
/// the sandboxd; the cap only bounds what a broken reply can make us hold.
pub const LIST_BODY_LIMIT: usize = 32 * 1024 * 1024;

/// A reply as read off the wire: its status and at most the body limit's
/// worth of bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawReply {
    pub status: u16,
    pub body: Vec<u8>,
    /// The body was longer than the limit and `body` holds only its start.
    pub over_limit: bool,
}

impl RawReply {
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        RawReply {
            status,
            body: body.into(),
            over_limit: false,
        }
    }
}

/// How many body bytes to read for a reply to `op` with this status.
pub fn body_limit(op: Op, status: u16) -> usize {
    match op {
        _ if !(200..300).contains(&status) => ERROR_BODY_LIMIT,
        Op::List => LIST_BODY_LIMIT,
        _ => JSON_BODY_LIMIT,
    }
}

pub use super::refusal::json_error_message;

/// The message for an `Http` error: the decoded `error` field, or empty.
pub fn error_message(body: &[u8]) -> String {
    json_error_message(body).unwrap_or_default()
}

fn decode_json<'a, T: Deserialize<'a>>(op: Op, reply: &'a RawReply) -> Result<T, SandboxdError> {
    if reply.over_limit {
        return Err(SandboxdError::Decode {
            op,
            status: reply.status,
            message: format!("reply body exceeds {} bytes", body_limit(op, reply.status)),
        });
    }
    // Every sandboxd reply is a JSON object. serde's derived structs also
    // take an array (fields by position), which read `[[]]` as an empty
    // listing and `["sb_1","t"]` as a claim.
    if reply.body.trim_ascii_start().first() != Some(&b'{') {
        return Err(SandboxdError::Decode {
            op,
            status: reply.status,
            message: "reply body is not a JSON object".to_string(),
        });
    }
    serde_json::from_slice(&reply.body).map_err(|e| SandboxdError::Decode {
        op,
        status: reply.status,
        message: e.to_string(),
    })
}

fn http_error(op: Op, reply: &RawReply) -> SandboxdError {
    SandboxdError::Http {
        op,
        status: reply.status,
        message: error_message(&reply.body),
    }
}

/// `POST /v1/claim`: `200` with an `id` is a claim; `200`
/// without one (empty or redirect) and `429` are a capacity miss; any other
/// status is `Http`; an undecodable `200` is `Decode`.
pub fn decode_claim(reply: &RawReply) -> Result<Granted, SandboxdError> {
    match reply.status {
        200 => {
            let raw: ClaimReply = decode_json(Op::Claim, reply)?;
            let id = raw.id.unwrap_or_default();
            if id.is_empty() {
                let message = match &raw.redirect {
                    Some(serde_json::Value::Array(peers)) if !peers.is_empty() => {
                        let peers: Vec<String> = peers
                            .iter()
                            .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_string))
                            .collect();
                        format!("redirected to {} (not followed)", peers.join(", "))
                    }
                    _ => "reply carried no sandbox id".to_string(),
                };
                return Err(SandboxdError::CapacityMiss { message });
            }
            let Some(token) = Token::new(raw.token.unwrap_or_default()) else {
                return Err(SandboxdError::Decode {
                    op: Op::Claim,
                    status: reply.status,
                    message: format!("claim reply for sandbox {id:?} carries no token"),
                });
            };
            let owner_addr = match raw.owner_addr {
                Some(serde_json::Value::String(s)) => s,
                _ => String::new(),
            };
            let from_checkpoint = match raw.from_checkpoint {
                Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s),
                _ => None,
            };
            Ok(Granted {
                id,
                token,
                deadline: raw.deadline,
                owner_addr,
                from_checkpoint,
            })
        }
        429 => Err(SandboxdError::CapacityMiss {
            message: error_message(&reply.body),
        }),
        _ => Err(http_error(Op::Claim, reply)),
    }
}

/// `POST /v1/sandboxes/{id}/release`:
/// `204` is released; `404` with sandboxd's JSON error is "already gone";
/// a `404` without it (the router's plain-text reply, i.e. a wrong base URL)
/// and every other status, other 2xx included, are errors.
pub fn decode_release(reply: &RawReply) -> Result<ReleaseOutcome, SandboxdError> {
    match reply.status {
        204 => Ok(ReleaseOutcome::Released),
        404 => match json_error_message(&reply.body) {
            Some(_) => Ok(ReleaseOutcome::AlreadyGone),
            None => Err(SandboxdError::Http {
                op: Op::Release,
                status: 404,
                message: "not sandboxd's JSON error (a router 404: is the sandboxd URL right?)"
                    .to_string(),
            }),
        },
        _ => Err(http_error(Op::Release, reply)),
    }
}

/// `GET /v1/sandboxes`: only a `200` with a decodable
/// `{"sandboxes":[…]}` is a listing. A failure is never an empty list.
pub fn decode_list(reply: &RawReply) -> Result<Vec<SandboxRow>, SandboxdError> {
    match reply.status {
        200 => decode_json::<ListReply>(Op::List, reply).map(|l| l.sandboxes),
        _ => Err(http_error(Op::List, reply)),
    }
}

/// `GET /v1/info`: only a `200` is node info; anything
/// else is an error, never "zero capacity".
pub fn decode_info(reply: &RawReply) -> Result<NodeInfo, SandboxdError> {
    match reply.status {
        200 => decode_json(Op::Info, reply),
        _ => Err(http_error(Op::Info, reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandboxd::lease_deadline::Deadline;

    fn r(status: u16, body: &str) -> RawReply {
        RawReply::new(status, body.as_bytes())
    }

    #[test]
    fn claim_mapping() {
        let ok = decode_claim(&r(
            200,
            r#"{"id":"sb_77ace349e7cc1db6","token":"t","deadline":"2026-07-07T10:00:00.25Z","owner_addr":"10.0.0.5:7777","extra":1}"#,
        ))
        .expect("claim");
        assert_eq!(ok.id, "sb_77ace349e7cc1db6");
        assert_eq!(ok.token.expose(), "t");
        assert!(matches!(ok.deadline, Deadline::At(_)));
        assert_eq!(ok.owner_addr, "10.0.0.5:7777");

        for body in ["{}", r#"{"redirect":["10.0.0.6:7777"]}"#, r#"{"id":""}"#] {
            let err = decode_claim(&r(200, body)).expect_err(body);
            assert!(err.is_capacity_miss(), "{body}: {err}");
            assert!(!err.is_outcome_unknown());
        }
        let err = decode_claim(&r(
            429,
            r#"{"error":"node claim quota reached: node draining"}"#,
        ))
        .expect_err("429");
        assert!(
            matches!(&err, SandboxdError::CapacityMiss { message } if message.contains("draining"))
        );

        for status in [400, 401, 404, 409, 500, 503, 201, 204] {
            let err = decode_claim(&r(status, r#"{"error":"boom"}"#)).expect_err("status");
            assert!(
                matches!(&err, SandboxdError::Http { op: Op::Claim, status: s, message } if *s == status && message == "boom"),
                "{status}: {err:?}"
            );
        }
        let err = decode_claim(&r(500, "plain text")).expect_err("500");
        assert!(matches!(&err, SandboxdError::Http { message, .. } if message.is_empty()));

        let err = decode_claim(&r(200, "not json")).expect_err("garbage");
        assert!(matches!(err, SandboxdError::Decode { op: Op::Claim, .. }));
        assert!(err.is_outcome_unknown());
        let err = decode_claim(&r(200, r#"{"id":"sb_1"}"#)).expect_err("no token");
        assert!(err.is_outcome_unknown(), "{err}");
    }

    #[test]
    fn release_mapping() {
        assert_eq!(
            decode_release(&r(204, "")).ok(),
            Some(ReleaseOutcome::Released)
        );
        assert_eq!(
            decode_release(&r(404, r#"{"error":"unknown sandbox"}"#)).ok(),
            Some(ReleaseOutcome::AlreadyGone)
        );
        let err = decode_release(&r(404, "404 page not found\n")).expect_err("router 404");
        assert!(matches!(err, SandboxdError::Http { status: 404, .. }));
        for status in [200, 201, 202, 401, 500] {
            assert!(
                decode_release(&r(status, r#"{"error":"x"}"#)).is_err(),
                "{status}"
            );
        }
    }

    #[test]
    fn list_and_info_failures_are_never_empty() {
        assert_eq!(
            decode_list(&r(200, r#"{"sandboxes":[]}"#)).ok(),
            Some(vec![])
        );
        for (status, body) in [
            (200, "{}"),
            (200, r#"{"sandboxes":null}"#),
            (200, "<html>"),
            (200, r#"{"sandboxes":[{"id":"sb_1"#),
            (500, r#"{"error":"x"}"#),
            (503, ""),
        ] {
            assert!(decode_list(&r(status, body)).is_err(), "{status} {body}");
            assert!(decode_info(&r(status, body)).is_err(), "{status} {body}");
        }
        // Found with the sandboxd_reply fuzz target's checks: a JSON array decoded
        // field by field, so `[[]]` was an empty listing.
        for body in ["[[]]", "[[{\"id\":\"sb_1\"}]]", " []"] {
            let err = decode_list(&r(200, body)).expect_err(body);
            assert!(
                matches!(&err, SandboxdError::Decode { message, .. } if message.contains("not a JSON object")),
                "{body}: {err:?}"
            );
            assert!(decode_info(&r(200, body)).is_err(), "{body}");
        }
        let err = decode_claim(&r(200, r#"["sb_1","tok"]"#)).expect_err("array claim");
        assert!(err.is_outcome_unknown(), "{err}");
        let over = RawReply {
            status: 200,
            body: br#"{"sandboxes":[]}"#.to_vec(),
            over_limit: true,
        };
        assert!(matches!(
            decode_list(&over),
            Err(SandboxdError::Decode { .. })
        ));
    }
}
