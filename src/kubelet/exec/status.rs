//! How an exec ended, and the `v1.Status` that tells the client on the
//! error channel (remote-command protocols v4 and v5). Pure.
//!
//! The client reads `Success` as exit code 0, a `Failure` with reason
//! `NonZeroExitCode` and an `ExitCode` cause (1–255) as that exit code
//! (`kubectl` prints "command terminated with exit code N" and exits with
//! it), and any other `Failure` as an error with the status's message.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};

/// How an exec, attach or shell session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The process exited with this code (`-1`: killed, or the agent lost
    /// its status).
    Exited(i32),
    /// The guest agent refused or failed the request.
    AgentError { kind: String, message: String },
    /// The guest agent could not be reached, or the relay broke.
    Unreachable(String),
    /// Nothing was run: the request cannot be served (no claim, attach).
    Refused {
        reason: &'static str,
        message: String,
    },
}

fn failure(code: i32, reason: &str, message: String) -> Status {
    Status {
        status: Some("Failure".into()),
        code: Some(code),
        reason: Some(reason.into()),
        message: Some(message),
        ..Status::default()
    }
}

/// The status for `outcome`; `argv` names the command in messages.
pub fn status(outcome: &Outcome, argv: &[String]) -> Status {
    match outcome {
        Outcome::Exited(0) => Status {
            status: Some("Success".into()),
            ..Status::default()
        },
        Outcome::Exited(code @ 1..=255) => Status {
            status: Some("Failure".into()),
            message: Some(format!(
                "command terminated with non-zero exit code: command {argv:?} exited with {code}"
            )),
            reason: Some("NonZeroExitCode".into()),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some(code.to_string()),
                    field: None,
                }]),
                ..StatusDetails::default()
            }),
            ..Status::default()
        },
        Outcome::Exited(-1) => failure(
            500,
            "InternalError",
            format!(
                "command {argv:?} ended without an exit status: it was killed, or the \
                 sandbox's guest agent lost its status"
            ),
        ),
        Outcome::Exited(code) => failure(
            500,
            "InternalError",
            format!("command {argv:?} ended with status {code}, outside the 0-255 exit codes"),
        ),
        Outcome::AgentError { kind, message } if kind == "bad_request" => failure(
            400,
            "BadRequest",
            format!("cannot run {argv:?} in the sandbox: {message}"),
        ),
        Outcome::AgentError { kind, message } => failure(
            500,
            "InternalError",
            format!("the sandbox's guest agent failed {argv:?} ({kind}): {message}"),
        ),
        Outcome::Unreachable(why) => failure(
            503,
            "ServiceUnavailable",
            format!("cannot reach the sandbox's guest agent: {why}"),
        ),
        Outcome::Refused { reason, message } => {
            let code = match *reason {
                "NotFound" => 404,
                "BadRequest" => 400,
                _ => 500,
            };
            failure(code, reason, message.clone())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn argv() -> Vec<String> {
        vec!["sh".into(), "-c".into(), "exit 3".into()]
    }

    /// The status as the client reads it (the JSON of v4 and v5).
    fn wire(outcome: &Outcome) -> serde_json::Value {
        serde_json::to_value(status(outcome, &argv())).expect("JSON")
    }

    fn message(s: &Status) -> &str {
        s.message.as_deref().unwrap_or_default()
    }

    #[test]
    fn success_and_exit_codes() {
        assert_eq!(
            wire(&Outcome::Exited(0)),
            json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success"})
        );
        assert_eq!(
            wire(&Outcome::Exited(3)),
            json!({
                "apiVersion": "v1",
                "kind": "Status",
                "metadata": {},
                "status": "Failure",
                "message": "command terminated with non-zero exit code: command [\"sh\", \"-c\", \"exit 3\"] exited with 3",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
            })
        );
        for code in [1, 3, 255] {
            let s = wire(&Outcome::Exited(code));
            assert_eq!(s["status"], "Failure");
            assert_eq!(s["reason"], "NonZeroExitCode");
            assert_eq!(s["details"]["causes"][0]["reason"], "ExitCode");
            assert_eq!(s["details"]["causes"][0]["message"], code.to_string());
            assert!(s.get("code").is_none(), "{s}");
        }
    }

    #[test]
    fn codes_a_client_cannot_carry_are_errors_with_a_message() {
        for code in [-1, -2, 256, 1000] {
            let s = wire(&Outcome::Exited(code));
            assert_eq!(s["status"], "Failure");
            assert_eq!(s["reason"], "InternalError", "{code}");
            assert_eq!(s["code"], 500, "{code}");
            assert!(s.get("details").is_none());
        }
        let s = status(&Outcome::Exited(-1), &argv());
        assert!(message(&s).contains("killed"));
    }

    #[test]
    fn agent_errors_and_refusals() {
        let s = status(
            &Outcome::AgentError {
                kind: "bad_request".into(),
                message: "exec: \"nope\": not found".into(),
            },
            &["nope".into()],
        );
        assert_eq!(s.reason.as_deref(), Some("BadRequest"));
        assert_eq!(s.code, Some(400));
        assert!(message(&s).contains("not found"));
        let s = status(
            &Outcome::AgentError {
                kind: "internal".into(),
                message: "boom".into(),
            },
            &argv(),
        );
        assert_eq!(s.code, Some(500));
        let s = status(
            &Outcome::Unreachable("502 guest agent unreachable".into()),
            &argv(),
        );
        assert_eq!(s.code, Some(503));
        assert!(message(&s).contains("guest agent unreachable"));
        let s = wire(&Outcome::Refused {
            reason: "NotFound",
            message: "no sandbox".into(),
        });
        assert_eq!(
            s,
            json!({
                "apiVersion": "v1",
                "kind": "Status",
                "metadata": {},
                "status": "Failure",
                "message": "no sandbox",
                "reason": "NotFound",
                "code": 404,
            })
        );
        let s = status(
            &Outcome::Refused {
                reason: "BadRequest",
                message: "attach".into(),
            },
            &argv(),
        );
        assert_eq!(s.code, Some(400));
        let s = status(
            &Outcome::Refused {
                reason: "Conflict",
                message: "x".into(),
            },
            &argv(),
        );
        assert_eq!(s.code, Some(500));
    }
}
