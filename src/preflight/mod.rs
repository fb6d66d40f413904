//! `vk-sandbox preflight`: checks, without changing anything, that a
//! configuration can start (docs/operations.md#preflight).
//!
//! The same flags and environment as the run command are validated first;
//! then every check runs, each bounded by [`CHECK_TIMEOUT`], and the results
//! print as a checklist:
//!
//! ```text
//! [ok]   apiserver: https://10.0.0.1:6443 (v1.33.4), authenticated as system:serviceaccount:sandbox-system:vk-sandbox
//! [FAIL] sandboxd: http://127.0.0.1:7777 rejected the token (HTTP 401)
//!        fix: put sandboxd's node (root) API token in the file named by --sandboxd-token-file (env SANDBOXD_TOKEN_FILE)
//! ```
//!
//! Exit code 0 when nothing fails (warnings allowed), 1 otherwise.
//!
//! Layout: [`check`] is one checklist line ([`CheckResult`]); [`evaluate`]
//! and [`rbac`] turn observations into such lines as pure functions
//! (unit-tested); [`probe`] makes the observations (apiserver, sandboxd,
//! ports); [`state`] checks the state path on the local disk without
//! creating or modifying the state file.

pub mod check;
pub mod evaluate;
pub mod probe;
pub mod rbac;
pub mod state;

use std::process::ExitCode;
use std::time::Duration;

pub use check::{CHECK_TIMEOUT, CheckResult, Status};

use crate::config::{Config, RunArgs};

/// The checklist, one line per result (fixes indented beneath), and a
/// summary line.
pub fn render(results: &[CheckResult]) -> String {
    let mut out = String::new();
    for r in results {
        out.push_str(&r.to_string());
        out.push('\n');
    }
    let count = |s: Status| results.iter().filter(|r| r.status == s).count();
    let (fails, warns) = (count(Status::Fail), count(Status::Warn));
    if fails == 0 {
        out.push_str(&format!(
            "preflight passed ({} checks, {warns} warnings)\n",
            results.len()
        ));
    } else {
        out.push_str(&format!(
            "preflight failed: {fails} of {} checks failed; vk-sandbox would not start or \
             could not work\n",
            results.len()
        ));
    }
    out
}

/// 0 when nothing failed (warnings allowed), 1 otherwise.
pub fn exit_code(results: &[CheckResult]) -> u8 {
    u8::from(results.iter().any(|r| r.status == Status::Fail))
}

/// Validate `args` (without touching the disk), then run every check.
pub async fn run(args: &RunArgs) -> Vec<CheckResult> {
    let cfg = match Config::from_args_without_state_check(args) {
        Ok(cfg) => cfg,
        Err(e) => {
            return vec![CheckResult::fail(
                "configuration",
                e.to_string(),
                "correct the flags or environment variables named above (vk-sandbox --help \
                 lists them)",
            )];
        }
    };
    let mut results = vec![CheckResult::ok(
        "configuration",
        format!(
            "flags and environment valid (node {}, sandboxd {}, state {})",
            cfg.node_name,
            cfg.sandboxd.url,
            cfg.state_path.display()
        ),
    )];
    results.extend(probe::run_all(&cfg).await);
    results
}

/// Entry point of the subcommand: prints the checklist on stdout and
/// returns the exit code. Logs go to stderr only when `RUST_LOG` is set.
pub fn main(args: &RunArgs) -> ExitCode {
    if std::env::var_os("RUST_LOG").is_some() {
        crate::telemetry::init(args.admin.log_format);
    }
    let runtime = match crate::runtime::build(crate::runtime::Threads::Multi) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("vk-sandbox preflight: {e}");
            return ExitCode::from(1);
        }
    };
    let results = runtime.block_on(run(args));
    print!("{}", render(&results));
    // Pending requests cut short by a timeout must not hold the exit.
    runtime.shutdown_timeout(Duration::from_millis(100));
    ExitCode::from(exit_code(&results))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checklist_lines_and_fix_indentation() {
        let results = vec![
            CheckResult::ok("apiserver", "reachable"),
            CheckResult::warn("warm pools", "none warm", None),
            CheckResult::fail("sandboxd", "token rejected\n(HTTP 401)", "set the token"),
        ];
        let text = render(&results);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "[ok]   apiserver: reachable");
        assert_eq!(lines[1], "[warn] warm pools: none warm");
        assert_eq!(lines[2], "[FAIL] sandboxd: token rejected; (HTTP 401)");
        assert_eq!(lines[3], "       fix: set the token");
        assert!(lines[4].starts_with("preflight failed: 1 of 3 checks failed"));
        assert_eq!(exit_code(&results), 1);
    }

    #[test]
    fn warnings_do_not_fail() {
        let results = vec![
            CheckResult::ok("a", "fine"),
            CheckResult::not_checked("b", "a failed"),
        ];
        assert_eq!(exit_code(&results), 0);
        assert!(render(&results).ends_with("preflight passed (2 checks, 1 warnings)\n"));
        assert_eq!(exit_code(&[]), 0);
    }
}
