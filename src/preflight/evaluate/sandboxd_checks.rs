//! The sandboxd lines of preflight: reachability and auth from
//! `GET /v1/info`, then which warm pools are warm.

use std::path::Path;

use super::super::check::CheckResult;
use crate::sandboxd::{NodeInfo, PoolInfo, SandboxdError};

/// A failed sandboxd call, reduced to what the checks distinguish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxdProblem {
    /// sandboxd (or something in front of it) answered with this status;
    /// `json` when the body was sandboxd's JSON error.
    Status {
        status: u16,
        message: String,
        json: bool,
    },
    /// Connection refused, reset, timed out.
    Unreachable(String),
    /// A reply that is not sandboxd's (decode error, bad URL).
    Unexpected(String),
}

impl From<&SandboxdError> for SandboxdProblem {
    fn from(e: &SandboxdError) -> Self {
        match e {
            SandboxdError::Http {
                status, message, ..
            } => SandboxdProblem::Status {
                status: *status,
                message: message.clone(),
                json: !message.is_empty(),
            },
            SandboxdError::Transport { .. } => SandboxdProblem::Unreachable(e.to_string()),
            other => SandboxdProblem::Unexpected(other.to_string()),
        }
    }
}

/// The sandboxd line and the warm pools line from `GET /v1/info`.
/// `token_file`: the configured `--sandboxd-token-file`, if a token was read.
pub fn sandboxd(
    url: &str,
    token_file: Option<&Path>,
    info: &Result<NodeInfo, SandboxdProblem>,
) -> Vec<CheckResult> {
    let name = "sandboxd";
    let info = match info {
        Ok(info) => info,
        Err(problem) => {
            return vec![
                sandboxd_failure(url, token_file, problem),
                CheckResult::not_checked("warm pools", "sandboxd did not answer /v1/info"),
            ];
        }
    };
    let token = match token_file {
        Some(path) => format!("token from {} accepted", path.display()),
        None => "no token configured and none required".to_string(),
    };
    let line = if info.draining {
        CheckResult::warn(
            name,
            format!("{url} answered /v1/info ({token}), but sandboxd is draining"),
            Some("new claims are refused while sandboxd drains; undrain it".into()),
        )
    } else {
        CheckResult::ok(
            name,
            format!(
                "{url} answered /v1/info ({token}); {} claimed",
                info.claimed
            ),
        )
    };
    vec![line, pools(&info.pools)]
}

fn sandboxd_failure(
    url: &str,
    token_file: Option<&Path>,
    problem: &SandboxdProblem,
) -> CheckResult {
    let name = "sandboxd";
    let set_token = match token_file {
        Some(path) => format!(
            "put sandboxd's node (root) API token in {} (--sandboxd-token-file, env \
             SANDBOXD_TOKEN_FILE)",
            path.display()
        ),
        None => "sandboxd requires a token: point --sandboxd-token-file (env \
                 SANDBOXD_TOKEN_FILE) at a file holding its node (root) API token"
            .to_string(),
    };
    let with = |message: &str| {
        if message.is_empty() {
            String::new()
        } else {
            format!(": {message}")
        }
    };
    match problem {
        SandboxdProblem::Status {
            status: 401,
            message,
            ..
        } => CheckResult::fail(
            name,
            format!("{url} rejected the token (HTTP 401{})", with(message)),
            set_token,
        ),
        SandboxdProblem::Status {
            status: 403,
            message,
            ..
        } => CheckResult::fail(
            name,
            format!(
                "{url} refused /v1/info (HTTP 403{}): the token is not the node (root) token",
                with(message)
            ),
            format!("{set_token}; a tenant token cannot list or release"),
        ),
        SandboxdProblem::Status {
            status,
            message,
            json: false,
        } => CheckResult::fail(
            name,
            format!(
                "{url}/v1/info answered HTTP {status}{} without sandboxd's JSON error",
                with(message)
            ),
            "point --sandboxd-url (env SANDBOXD_URL) at sandboxd's API base URL, e.g. \
             http://127.0.0.1:7777",
        ),
        SandboxdProblem::Status {
            status, message, ..
        } => CheckResult::fail(
            name,
            format!("{url}/v1/info answered HTTP {status}{}", with(message)),
            "check sandboxd's health (journalctl -u sandboxd)",
        ),
        SandboxdProblem::Unreachable(e) => CheckResult::fail(
            name,
            format!("cannot reach sandboxd at {url}: {e}"),
            "start sandboxd (systemctl status sandboxd), or correct --sandboxd-url (env \
             SANDBOXD_URL)",
        ),
        SandboxdProblem::Unexpected(e) => CheckResult::fail(
            name,
            format!("{url}/v1/info: {e}"),
            "point --sandboxd-url (env SANDBOXD_URL) at sandboxd's API base URL",
        ),
    }
}

/// `template (net, size)`, leaving out empty parts.
pub fn pool_label(pool: &PoolInfo) -> String {
    let k = &pool.key;
    let rest: Vec<&str> = [k.net.as_str(), k.size.as_str()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    if rest.is_empty() {
        k.template.clone()
    } else {
        format!("{} ({})", k.template, rest.join(", "))
    }
}

/// Which pools are warm, `key warm W/T` each.
pub fn pools(pools: &[PoolInfo]) -> CheckResult {
    let name = "warm pools";
    if pools.is_empty() {
        return CheckResult::warn(
            name,
            "sandboxd reports no pools: every Pod will wait with NoWarmCapacity",
            Some("configure warm pools in sandboxd for the templates your Sandboxes use".into()),
        );
    }
    let list = pools
        .iter()
        .map(|p| format!("{} warm {}/{}", pool_label(p), p.warm, p.target))
        .collect::<Vec<_>>()
        .join("; ");
    let warm = pools.iter().filter(|p| p.warm > 0).count();
    if warm == 0 {
        CheckResult::warn(
            name,
            format!("no pool has a warm VM: {list}"),
            Some("new Pods wait with NoWarmCapacity until sandboxd refills its pools".into()),
        )
    } else {
        CheckResult::ok(name, format!("{warm} of {} warm: {list}", pools.len()))
    }
}
