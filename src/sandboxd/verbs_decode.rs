//! Reply decoding of the lifecycle and data-plane calls as pure functions
//! of (status, body), like [`super::decode`] for the first four calls. Any
//! failure status becomes [`SandboxdError::Refused`] with its
//! [`Refusal`] kind; only the status each call succeeds with is a success.

use serde::Deserialize;

use super::decode::JSON_BODY_LIMIT;
use super::decode::{RawReply, error_message};
use super::error::{Op, SandboxdError};
use super::lease_deadline::Deadline;
use super::refusal::Refusal;
use super::verbs_types::{
    ExecOutput, OwnerProbe, OwnerReply, RenewReply, SandboxInfo, SandboxInfoReply, SandboxStats,
    StatsReply, deadline_from_json,
};

/// The error for a reply that is not the call's success.
pub fn refused(op: Op, reply: &RawReply) -> SandboxdError {
    SandboxdError::Refused {
        op,
        status: reply.status,
        reason: Refusal::classify(reply.status, &reply.body),
        message: error_message(&reply.body),
    }
}

fn decode_object<'a, T: Deserialize<'a>>(op: Op, reply: &'a RawReply) -> Result<T, SandboxdError> {
    let fail = |message: String| SandboxdError::Decode {
        op,
        status: reply.status,
        message,
    };
    if reply.over_limit {
        return Err(fail(format!("reply body exceeds {JSON_BODY_LIMIT} bytes")));
    }
    // serde's derived structs would also take a JSON array, field by field.
    if reply.body.trim_ascii_start().first() != Some(&b'{') {
        return Err(fail("reply body is not a JSON object".to_string()));
    }
    serde_json::from_slice(&reply.body).map_err(|e| fail(e.to_string()))
}

/// Hibernate and wake: `204` is done (also when there was nothing to do:
/// both are idempotent); anything else, other 2xx included, is refused.
pub fn decode_no_content(op: Op, reply: &RawReply) -> Result<(), SandboxdError> {
    match reply.status {
        204 => Ok(()),
        _ => Err(refused(op, reply)),
    }
}

/// Renew: `200 {"deadline": …}`, the granted deadline. A reply without a
/// readable deadline is a decode error (the caller records the deadline it
/// gets; sandboxd did move it, so the outcome is unknown).
pub fn decode_renew(reply: &RawReply) -> Result<Deadline, SandboxdError> {
    if reply.status != 200 {
        return Err(refused(Op::Renew, reply));
    }
    let raw: RenewReply = decode_object(Op::Renew, reply)?;
    match deadline_from_json(raw.deadline.as_ref()) {
        Deadline::At(t) => Ok(Deadline::At(t)),
        Deadline::Never if raw.deadline.is_some() => Ok(Deadline::Never),
        other => Err(SandboxdError::Decode {
            op: Op::Renew,
            status: reply.status,
            message: match other {
                Deadline::Unparseable(text) => format!("unparseable deadline {text:?}"),
                _ => "renew reply carries no deadline".to_string(),
            },
        }),
    }
}

/// The single-sandbox read: `200` with the row; a row without an `id` is
/// a decode error.
pub fn decode_get(reply: &RawReply) -> Result<SandboxInfo, SandboxdError> {
    if reply.status != 200 {
        return Err(refused(Op::Get, reply));
    }
    let raw: SandboxInfoReply = decode_object(Op::Get, reply)?;
    if raw.id.is_empty() {
        return Err(SandboxdError::Decode {
            op: Op::Get,
            status: reply.status,
            message: "sandbox reply carries no id".to_string(),
        });
    }
    Ok(raw.into())
}

/// Stats: `200` with the figures; `mem_used_measured: false` becomes "no
/// figure", never zero.
pub fn decode_stats(reply: &RawReply) -> Result<SandboxStats, SandboxdError> {
    if reply.status != 200 {
        return Err(refused(Op::Stats, reply));
    }
    decode_object::<StatsReply>(Op::Stats, reply).map(SandboxStats::from)
}

/// The owner probe: `200` is owned here; sandboxd's JSON `404` is "not
/// owned here"; the router's plain-text `404` (a build without the route)
/// and every other status are refused.
pub fn decode_owner(reply: &RawReply) -> Result<OwnerProbe, SandboxdError> {
    match reply.status {
        200 => {
            let raw: OwnerReply = decode_object(Op::Owner, reply)?;
            let owner_addr = match raw.owner_addr {
                Some(serde_json::Value::String(s)) => s,
                _ => String::new(),
            };
            Ok(OwnerProbe::Owned { owner_addr })
        }
        404 if Refusal::classify(404, &reply.body) == Refusal::UnknownSandbox => {
            Ok(OwnerProbe::NotOwnedHere)
        }
        _ => Err(refused(Op::Owner, reply)),
    }
}

/// The buffered exec: `200 {"exit_code", "stdout", "stderr"}`. A non-zero
/// exit is a success of the call; `504` (timed out), `413` (too much
/// output), `503` (busy) and the rest are refused.
pub fn decode_exec(reply: &RawReply) -> Result<ExecOutput, SandboxdError> {
    if reply.status != 200 {
        return Err(refused(Op::Exec, reply));
    }
    decode_object(Op::Exec, reply)
}

/// An upgrade (`/agent`, `/ports`): `101` naming the protocol asked for
/// (case-insensitively) is a relay; a `101` for another protocol is a
/// decode error; any other status is refused.
pub fn decode_upgrade(
    op: Op,
    reply: &RawReply,
    upgrade: Option<&str>,
    want: &str,
) -> Result<(), SandboxdError> {
    match reply.status {
        101 if upgrade.is_some_and(|u| u.trim().eq_ignore_ascii_case(want)) => Ok(()),
        101 => Err(SandboxdError::Decode {
            op,
            status: 101,
            message: format!(
                "switched to {:?}, not {want:?}",
                upgrade.unwrap_or("<no Upgrade header>")
            ),
        }),
        _ => Err(refused(op, reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(status: u16, body: &str) -> RawReply {
        RawReply::new(status, body.as_bytes())
    }

    #[track_caller]
    fn assert_refused(
        result: Result<impl std::fmt::Debug, SandboxdError>,
        op: Op,
        reason: Refusal,
    ) {
        match result {
            Err(SandboxdError::Refused {
                op: o, reason: r, ..
            }) => assert_eq!((o, r), (op, reason)),
            other => panic!("want Refused {op} {reason:?}, got {other:?}"),
        }
    }

    #[test]
    fn hibernate_and_wake_succeed_only_with_204() {
        assert!(decode_no_content(Op::Hibernate, &r(204, "")).is_ok());
        assert_refused(
            decode_no_content(Op::Wake, &r(200, "{}")),
            Op::Wake,
            Refusal::Other,
        );
        assert_refused(
            decode_no_content(Op::Hibernate, &r(409, r#"{"error":"egress lane"}"#)),
            Op::Hibernate,
            Refusal::Conflict,
        );
        assert_refused(
            decode_no_content(Op::Wake, &r(404, "404 page not found\n")),
            Op::Wake,
            Refusal::Unsupported,
        );
        let err = decode_no_content(Op::Hibernate, &r(500, r#"{"error":"hibernate failed"}"#))
            .expect_err("500");
        assert_eq!(
            err.to_string(),
            "sandboxd hibernate: failed in sandboxd (status 500): hibernate failed"
        );
        assert_eq!(err.metric_label(), "sandboxd_refused");
        assert_eq!(err.status(), Some(500));
        let gone = decode_no_content(Op::Wake, &r(404, r#"{"error":"unknown sandbox"}"#))
            .expect_err("404");
        assert!(gone.is_unknown_sandbox());
    }

    #[test]
    fn renew_needs_a_deadline() {
        let d =
            decode_renew(&r(200, r#"{"deadline":"2026-07-06T00:05:00.5+08:00"}"#)).expect("renew");
        assert!(matches!(d, Deadline::At(_)));
        // Go's zero time is sandboxd's "no expiry": a deadline granted, not
        // a missing one.
        assert_eq!(
            decode_renew(&r(200, r#"{"deadline":"0001-01-01T00:00:00Z"}"#)).expect("no expiry"),
            Deadline::Never
        );
        for (body, why) in [
            ("{}", "renew reply carries no deadline"),
            (r#"{"deadline":null}"#, "renew reply carries no deadline"),
            (r#"{"deadline":"soon"}"#, r#"unparseable deadline "soon""#),
            (r#"{"deadline":7}"#, r#"unparseable deadline "7""#),
        ] {
            assert_eq!(
                decode_renew(&r(200, body)).expect_err(body).to_string(),
                format!("sandboxd renew: decode (status 200): {why}")
            );
        }
        for body in [
            "{}",
            r#"{"deadline":null}"#,
            r#"{"deadline":"soon"}"#,
            r#"{"deadline":7}"#,
            "[]",
            "x",
        ] {
            let err = decode_renew(&r(200, body)).expect_err(body);
            assert!(
                matches!(err, SandboxdError::Decode { op: Op::Renew, .. }),
                "{body}: {err:?}"
            );
            assert!(err.is_outcome_unknown(), "{body}");
        }
        assert_refused(
            decode_renew(&r(409, r#"{"error":"sandbox is archived"}"#)),
            Op::Renew,
            Refusal::Conflict,
        );
        assert_refused(
            decode_renew(&r(404, "404 page not found\n")),
            Op::Renew,
            Refusal::Unsupported,
        );
    }

    #[test]
    fn get_and_stats() {
        let info = decode_get(&r(
            200,
            r#"{"id":"sb_1","key":{"template":"t"},"deadline":"2026-07-06T00:00:00Z","hibernated":true}"#,
        ))
        .expect("get");
        assert!(info.hibernated && info.token.is_none() && info.failed.is_none());
        assert!(decode_get(&r(200, r#"{"id":""}"#)).is_err());
        assert!(decode_get(&r(200, r#"{}"#)).is_err());
        assert_refused(
            decode_get(&r(403, r#"{"error":"operator token required"}"#)),
            Op::Get,
            Refusal::Forbidden,
        );
        let stats = decode_stats(&r(
            200,
            r#"{"id":"sb_1","cpu_count":2,"mem_total_bytes":1073741824,"mem_used_bytes":1000,"mem_used_measured":true}"#,
        ))
        .expect("stats");
        assert_eq!((stats.cpu_count, stats.mem_used_bytes), (2, Some(1000)));
        assert_refused(
            decode_stats(&r(401, r#"{"error":"invalid api token"}"#)),
            Op::Stats,
            Refusal::Unauthorized,
        );
        let over = RawReply {
            status: 200,
            body: b"{}".to_vec(),
            over_limit: true,
        };
        assert!(matches!(
            decode_stats(&over),
            Err(SandboxdError::Decode { .. })
        ));
    }

    #[test]
    fn owner_probe() {
        assert_eq!(
            decode_owner(&r(200, r#"{"owner_addr":"10.0.0.5:7777"}"#)).expect("owned"),
            OwnerProbe::Owned {
                owner_addr: "10.0.0.5:7777".into()
            }
        );
        assert_eq!(
            decode_owner(&r(200, "{}")).expect("owned"),
            OwnerProbe::Owned {
                owner_addr: String::new()
            }
        );
        assert_eq!(
            decode_owner(&r(404, r#"{"error":"not owned here"}"#)).expect("not here"),
            OwnerProbe::NotOwnedHere
        );
        assert_refused(
            decode_owner(&r(404, "404 page not found\n")),
            Op::Owner,
            Refusal::Unsupported,
        );
        assert_refused(
            decode_owner(&r(401, r#"{"error":"missing bearer token"}"#)),
            Op::Owner,
            Refusal::Unauthorized,
        );
    }

    #[test]
    fn exec_replies() {
        let out = decode_exec(&r(
            200,
            r#"{"exit_code":3,"stdout":"out\n","stderr":"err\n"}"#,
        ))
        .expect("exec");
        assert_eq!((out.exit_code, out.stdout.as_str()), (3, "out\n"));
        assert!(
            decode_exec(&r(200, r#"{"stdout":"x"}"#)).is_err(),
            "exit_code is required"
        );
        for (status, reason) in [
            (400, Refusal::BadRequest),
            (409, Refusal::Conflict),
            (413, Refusal::TooLarge),
            (502, Refusal::GuestUnreachable),
            (503, Refusal::Busy),
            (504, Refusal::TimedOut),
        ] {
            assert_refused(
                decode_exec(&r(status, r#"{"error":"e"}"#)),
                Op::Exec,
                reason,
            );
        }
    }

    #[test]
    fn upgrades() {
        assert!(decode_upgrade(Op::Agent, &r(101, ""), Some("SilkD"), "silkd").is_ok());
        assert!(matches!(
            decode_upgrade(Op::Port, &r(101, ""), Some("websocket"), "tcp"),
            Err(SandboxdError::Decode { .. })
        ));
        assert!(decode_upgrade(Op::Port, &r(101, ""), None, "tcp").is_err());
        assert_refused(
            decode_upgrade(
                Op::Port,
                &r(502, r#"{"error":"guest port unreachable"}"#),
                None,
                "tcp",
            ),
            Op::Port,
            Refusal::GuestUnreachable,
        );
        assert_refused(
            decode_upgrade(
                Op::Agent,
                &r(426, r#"{"error":"upgrade required"}"#),
                None,
                "silkd",
            ),
            Op::Agent,
            Refusal::UpgradeRequired,
        );
        assert_refused(
            decode_upgrade(
                Op::Agent,
                &r(404, r#"{"error":"unknown sandbox"}"#),
                None,
                "silkd",
            ),
            Op::Agent,
            Refusal::UnknownSandbox,
        );
        assert_refused(
            decode_upgrade(Op::Agent, &r(200, "{}"), None, "silkd"),
            Op::Agent,
            Refusal::Other,
        );
    }
}
