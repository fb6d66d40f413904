//! How an exec ended, and the `v1.Status` that tells the client on the
//! error channel (remote-command protocols v4 and v5). Pure.
//!
//! The client reads `Success` as exit code 0, a `Failure` with reason
//! `NonZeroExitCode` and an `ExitCode` cause (1–255) as that exit code
//! (`kubectl` prints "command terminated with exit code N" and exits with
//! it), and any other `Failure` as an error with the status's message.

use serde_json::{Value, json};

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

fn failure(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// The status for `outcome`; `argv` names the command in messages.
pub fn status(outcome: &Outcome, argv: &[String]) -> Value {
    match outcome {
        Outcome::Exited(0) => json!({"metadata": {}, "status": "Success"}),
        Outcome::Exited(code @ 1..=255) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!(
                "command terminated with non-zero exit code: command {argv:?} exited with {code}"
            ),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        Outcome::Exited(-1) => failure(
            500,
            "InternalError",
            &format!(
                "command {argv:?} ended without an exit status: it was killed, or the \
                 sandbox's guest agent lost its status"
            ),
        ),
        Outcome::Exited(code) => failure(
            500,
            "InternalError",
            &format!("command {argv:?} ended with status {code}, outside the 0-255 exit codes"),
        ),
        Outcome::AgentError { kind, message } if kind == "bad_request" => failure(
            400,
            "BadRequest",
            &format!("cannot run {argv:?} in the sandbox: {message}"),
        ),
        Outcome::AgentError { kind, message } => failure(
            500,
            "InternalError",
            &format!("the sandbox's guest agent failed {argv:?} ({kind}): {message}"),
        ),
        Outcome::Unreachable(why) => failure(
            503,
            "ServiceUnavailable",
            &format!("cannot reach the sandbox's guest agent: {why}"),
        ),
        Outcome::Refused { reason, message } => {
            let code = match *reason {
                "NotFound" => 404,
                "BadRequest" => 400,
                _ => 500,
            };
            failure(code, reason, message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv() -> Vec<String> {
        vec!["sh".into(), "-c".into(), "exit 3".into()]
    }

    #[test]
    fn success_and_exit_codes() {
        assert_eq!(
            status(&Outcome::Exited(0), &argv()),
            json!({"metadata": {}, "status": "Success"})
        );
        for code in [1, 3, 255] {
            let s = status(&Outcome::Exited(code), &argv());
            assert_eq!(s["status"], "Failure");
            assert_eq!(s["reason"], "NonZeroExitCode");
            assert_eq!(s["details"]["causes"][0]["reason"], "ExitCode");
            assert_eq!(s["details"]["causes"][0]["message"], code.to_string());
        }
    }

    #[test]
    fn codes_a_client_cannot_carry_are_errors_with_a_message() {
        for code in [-1, -2, 256, 1000] {
            let s = status(&Outcome::Exited(code), &argv());
            assert_eq!(s["status"], "Failure");
            assert_eq!(s["reason"], "InternalError", "{code}");
            assert!(s.get("details").is_none());
        }
        let s = status(&Outcome::Exited(-1), &argv());
        assert!(s["message"].as_str().unwrap().contains("killed"));
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
        assert_eq!(s["reason"], "BadRequest");
        assert_eq!(s["code"], 400);
        assert!(s["message"].as_str().unwrap().contains("not found"));
        let s = status(
            &Outcome::AgentError {
                kind: "internal".into(),
                message: "boom".into(),
            },
            &argv(),
        );
        assert_eq!(s["code"], 500);
        let s = status(
            &Outcome::Unreachable("502 guest agent unreachable".into()),
            &argv(),
        );
        assert_eq!(s["code"], 503);
        assert!(
            s["message"]
                .as_str()
                .unwrap()
                .contains("guest agent unreachable")
        );
        let s = status(
            &Outcome::Refused {
                reason: "NotFound",
                message: "no sandbox".into(),
            },
            &argv(),
        );
        assert_eq!(s["code"], 404);
        assert_eq!(s["message"], "no sandbox");
        let s = status(
            &Outcome::Refused {
                reason: "BadRequest",
                message: "attach".into(),
            },
            &argv(),
        );
        assert_eq!(s["code"], 400);
        let s = status(
            &Outcome::Refused {
                reason: "Conflict",
                message: "x".into(),
            },
            &argv(),
        );
        assert_eq!(s["code"], 500);
    }
}
