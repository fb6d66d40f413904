//! `vk-sandbox claims`: the durable claims state, inspected offline or
//! beside a running daemon. Read only: it never writes, never takes the
//! state lock exclusively, and holds a shared lock only for the instant of
//! asking whether a daemon runs.
//!
//! - `list`: every claim (key, sandbox id, Pod UID, claimed at, deadline,
//!   state); tokens only with `--show-tokens`;
//! - `show KEY`: one claim with every field;
//! - `verify`: the claims against sandboxd's listing (held and listed, held
//!   and missing, listed under a held key but not held);
//! - `export`: the state as a Go `claims.json` on stdout (tokens included:
//!   the file exists to carry them).
//!
//! The state is the snapshot plus its journal(s), read consistently while a
//! daemon appends and compacts ([`crate::claims::read`]).

pub mod state;
mod view;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::claims::StatePaths;
use crate::claims::read::StateView;
use crate::config::{ClaimsArgs, ClaimsCommand, Output, SandboxdArgs, StateArg};
use crate::sandboxd::SandboxdClient;
use state::Daemon;

/// Exit codes of `verify`.
const EXIT_INCONSISTENT: u8 = 1;
const EXIT_TROUBLE: u8 = 2;

/// Entry point: runs the subcommand, output on stdout, notes and errors on
/// stderr; returns the exit code.
pub fn main(args: &ClaimsArgs) -> ExitCode {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    ExitCode::from(run(&args.command, &mut stdout.lock(), &mut stderr.lock()))
}

/// Run `command`, writing to `out` and `err`; the exit code.
pub fn run(command: &ClaimsCommand, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let trouble = if matches!(command, ClaimsCommand::Verify { .. }) {
        EXIT_TROUBLE
    } else {
        1
    };
    match execute(command, out, err) {
        Ok(code) => code,
        Err(problem) => {
            let _ = writeln!(err, "vk-sandbox claims: error: {problem}");
            trouble
        }
    }
}

fn state_paths(arg: &StateArg) -> Result<StatePaths, String> {
    if arg.state_path.is_empty() {
        return Err(
            "--state-path (env VK_STATE_PATH) is empty; give the daemon's state \
                    path, e.g. /var/lib/vk-sandbox/claims.json"
                .into(),
        );
    }
    Ok(StatePaths::new(&PathBuf::from(&arg.state_path)))
}

/// Probe the daemon, read the state, and say both on `err`.
fn load(arg: &StateArg, err: &mut dyn Write) -> Result<(StatePaths, Daemon, StateView), String> {
    let paths = state_paths(arg)?;
    let daemon = state::probe_daemon(&paths.lock);
    let _ = writeln!(
        err,
        "{}: {}",
        paths.snapshot.display(),
        daemon.describe(&paths.lock)
    );
    let view = crate::claims::read::read(&paths, jiff::Timestamp::UNIX_EPOCH)
        .map_err(|e| e.to_string())?;
    for (file, bytes) in &view.loaded.torn_tails {
        let _ = writeln!(
            err,
            "note: {} ends in an incomplete record ({bytes} bytes{}); ignored, as the daemon \
             ignores it",
            paths.of(*file).display(),
            if matches!(daemon, Daemon::Running { .. }) {
                ": most likely a write in progress"
            } else {
                ": a write cut short by a crash, never acknowledged"
            }
        );
    }
    if !view.snapshot_found && !view.journal_found {
        let _ = writeln!(
            err,
            "note: {} does not exist (no claims yet, or a wrong --state-path)",
            paths.snapshot.display()
        );
    }
    Ok((paths, daemon, view))
}

fn write_out(out: &mut dyn Write, text: &[u8]) -> Result<(), String> {
    out.write_all(text)
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write the output: {e}"))
}

fn execute(
    command: &ClaimsCommand,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, String> {
    let now = jiff::Timestamp::now();
    match command {
        ClaimsCommand::List { view, show_tokens } => {
            let (paths, daemon, state) = load(&view.state, err)?;
            let text = match view.output {
                Output::Table => view::list_table(&state, now, *show_tokens),
                Output::Json => {
                    view::list_json(&paths, &daemon, &state, now, *show_tokens).to_string() + "\n"
                }
            };
            write_out(out, text.as_bytes())?;
            Ok(0)
        }
        ClaimsCommand::Show {
            key,
            view,
            show_tokens,
        } => {
            let (paths, _, state) = load(&view.state, err)?;
            let Some(claim) = state.loaded.rows.get(key) else {
                return Err(format!(
                    "no claim has the key {key:?} in {} ({} claims; `vk-sandbox claims list` \
                     shows their keys, `<namespace>/<pod name>`)",
                    paths.snapshot.display(),
                    state.loaded.rows.len()
                ));
            };
            let source = view::source(&state, key);
            let text = match view.output {
                Output::Table => view::show_text(key, claim, source, now, *show_tokens),
                Output::Json => {
                    view::claim_json(key, claim, source, now, *show_tokens).to_string() + "\n"
                }
            };
            write_out(out, text.as_bytes())?;
            Ok(0)
        }
        ClaimsCommand::Verify { view, sandboxd } => {
            let (paths, daemon, state) = load(&view.state, err)?;
            let listing = list_sandboxd(sandboxd)?;
            let report = view::Verification::new(&state.loaded.rows, &listing);
            let text = match view.output {
                Output::Table => report.text(),
                Output::Json => {
                    report
                        .json(&paths, &daemon, &sandboxd.sandboxd_url)
                        .to_string()
                        + "\n"
                }
            };
            write_out(out, text.as_bytes())?;
            if matches!(daemon, Daemon::Running { .. }) && !report.consistent() {
                let _ = writeln!(
                    err,
                    "note: the daemon is running: a claim being made shows as listed and not \
                     held until it is durable, and one being released as held and missing; \
                     verify again to tell those from lasting differences"
                );
            }
            Ok(if report.consistent() {
                0
            } else {
                EXIT_INCONSISTENT
            })
        }
        ClaimsCommand::Export { state: arg } => {
            let (_, _, state) = load(arg, err)?;
            write_out(
                out,
                &crate::claims::format::encode_snapshot(&state.loaded.rows),
            )?;
            Ok(0)
        }
    }
}

/// sandboxd's listing, with the token read as the daemon reads it.
fn list_sandboxd(args: &SandboxdArgs) -> Result<Vec<crate::sandboxd::SandboxRow>, String> {
    let token = if args.sandboxd_token_file.is_empty() {
        None
    } else {
        crate::sandboxd::read_token_file(&args.sandboxd_token_file).map_err(|e| {
            format!(
                "--sandboxd-token-file (env SANDBOXD_TOKEN_FILE): {e}; give the daemon's token \
                 file, readable by this user"
            )
        })?
    };
    let client = SandboxdClient::builder(args.sandboxd_url.clone())
        .token(token)
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| format!("--sandboxd-url (env SANDBOXD_URL): {e}"))?;
    let runtime =
        crate::runtime::build(crate::runtime::Threads::Current).map_err(|e| e.to_string())?;
    runtime
        .block_on(client.list())
        .map_err(|e| format!("cannot list sandboxd at {}: {e}", client.base_url()))
}

#[cfg(test)]
mod tests;
