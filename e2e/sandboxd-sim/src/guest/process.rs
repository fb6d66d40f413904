//! Starting a command the way the agent does: the environment cleared to
//! `PATH`, `TERM` and the request's `env` (`HOME`/`USER` only when a `user`
//! is named), the working directory inside the VM's scratch directory
//! unless an absolute one is asked for, in a process group of its own,
//! inside the VM's network namespace when it has one.
//!
//! The simulator cannot switch users: a `user` only sets `HOME` (the
//! scratch directory) and `USER`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::{Child, Command};

use super::frames::ErrorKind;
use super::netns::NetNs;

/// `PATH` when the simulator's own environment has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What to start.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    pub argv: &'a [String],
    pub cwd: Option<&'a str>,
    pub env: &'a BTreeMap<String, String>,
    pub user: Option<&'a str>,
    pub term: &'a str,
    /// The VM's network namespace, entered between fork and exec.
    pub net: Option<&'a NetNs>,
}

/// A refusal as the agent reports it: an `error` frame's kind and message.
pub type Refused = (ErrorKind, String);

/// The working directory: the scratch directory, a path relative to it,
/// or an absolute path. It must exist.
pub fn working_dir(scratch: &Path, cwd: Option<&str>) -> Result<PathBuf, Refused> {
    let dir = match cwd {
        None | Some("") => scratch.to_path_buf(),
        Some(c) if Path::new(c).is_absolute() => PathBuf::from(c),
        Some(c) => scratch.join(c),
    };
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err((
            ErrorKind::BadRequest,
            format!("bad cwd {:?}: not a directory", cwd.unwrap_or_default()),
        ))
    }
}

/// A command ready to spawn (stdio not set).
pub fn command(scratch: &Path, launch: &Launch<'_>) -> Result<Command, Refused> {
    let Some((program, args)) = launch.argv.split_first() else {
        return Err((
            ErrorKind::BadRequest,
            "missing command: argv is empty".into(),
        ));
    };
    if program.is_empty() {
        return Err((
            ErrorKind::BadRequest,
            "missing command: argv[0] is empty".into(),
        ));
    }
    let dir = working_dir(scratch, launch.cwd)?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into()),
        )
        .env("TERM", launch.term);
    if let Some(user) = launch.user.filter(|u| !u.is_empty()) {
        cmd.env("HOME", scratch).env("USER", user);
    }
    cmd.envs(launch.env);
    if let Some(net) = launch.net {
        // SAFETY: the closure makes one system call (setns), which is
        // async-signal-safe and allocates nothing.
        unsafe {
            cmd.pre_exec(net.enter_in_child());
        }
    }
    Ok(cmd)
}

/// Spawn a piped command in a process group of its own. `stdin: false`
/// gives it an empty stdin (the buffered exec, a detached command).
pub fn spawn_piped(scratch: &Path, launch: &Launch<'_>, stdin: bool) -> Result<Child, Refused> {
    let mut cmd = command(scratch, launch)?;
    cmd.stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    cmd.spawn().map_err(|e| spawn_refusal(launch.argv, &e))
}

/// A command that cannot start is the caller's error when it does not
/// exist or cannot be executed.
pub fn spawn_refusal(argv: &[String], e: &std::io::Error) -> Refused {
    let program = argv.first().map(String::as_str).unwrap_or_default();
    match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => (
            ErrorKind::BadRequest,
            format!("cannot execute {program:?}: {e}"),
        ),
        _ => (ErrorKind::Internal, format!("start {program:?}: {e}")),
    }
}

/// The exit code the agent reports: the code, or `-1` when a signal ended
/// the process (or nobody knows).
pub fn exit_code(status: std::io::Result<std::process::ExitStatus>) -> i32 {
    status.ok().and_then(|s| s.code()).unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn working_dirs() {
        let dir = tempfile_dir();
        std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
        assert_eq!(working_dir(&dir, None).expect("default"), dir);
        assert_eq!(
            working_dir(&dir, Some("sub")).expect("relative"),
            dir.join("sub")
        );
        assert_eq!(
            working_dir(&dir, Some("/")).expect("absolute"),
            PathBuf::from("/")
        );
        let (kind, msg) = working_dir(&dir, Some("nope")).expect_err("missing");
        assert_eq!(kind, ErrorKind::BadRequest);
        assert!(msg.contains("nope"), "{msg}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn empty_argv_is_a_bad_request() {
        let env = BTreeMap::new();
        let launch = Launch {
            argv: &[],
            cwd: None,
            env: &env,
            user: None,
            term: "dumb",
            net: None,
        };
        let Err((kind, _)) = command(Path::new("/"), &launch) else {
            panic!("empty argv accepted")
        };
        assert_eq!(kind, ErrorKind::BadRequest);
    }

    fn tempfile_dir() -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("sandboxd-sim-test-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }
}
