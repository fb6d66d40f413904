//! The binary as a process, without a cluster: `--version` and `--help`,
//! the refusals to start — each exits before touching Kubernetes (the
//! kubeconfig here names a server nobody listens on, so reaching the
//! cluster would fail differently) and says which flag is wrong —, the
//! claims state file as start-up finds or creates it, and JSON log lines.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use support::process::{BIN, dead_kubeconfig, free_port};
/// The distroless image's nonroot user and group.
const NONROOT: u32 = 65532;

fn command(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("KUBECONFIG", dead_kubeconfig(dir))
        .env("VK_STATE_PATH", dir.join("state/claims.json"))
        .env("VK_LISTEN_ADDR", format!("127.0.0.1:{}", free_port()))
        .env("VK_ADMIN_ADDR", format!("127.0.0.1:{}", free_port()))
        .args(args)
        .stdin(std::process::Stdio::null());
    cmd
}

fn run(mut cmd: Command) -> (Output, String) {
    let started = Instant::now();
    let out = cmd.output().expect("run vk-sandbox");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a refusal must be quick"
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

fn tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    // Traversable by the nonroot user.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// `--version` prints the version line and creates no state directory.
#[test]
fn version_prints_and_touches_nothing() {
    let dir = tempdir();
    let (out, text) = run(command(dir.path(), &["--version"]));
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        format!("vk-sandbox {}", vk_sandbox::build_info::VERSION_LINE)
    );
    assert!(!dir.path().join("state").exists(), "no state directory");
}

#[test]
fn help_and_unknown_flags() {
    let dir = tempdir();
    let (out, text) = run(command(dir.path(), &["--help"]));
    assert_eq!(out.status.code(), Some(0));
    assert!(text.contains("[env: VK_NODE_NAME]"), "{text}");
    assert!(text.contains("--kubelet-auth"), "{text}");
    let (out, text) = run(command(dir.path(), &["--no-such-flag"]));
    assert_eq!(out.status.code(), Some(2), "{text}");
}

/// An empty `--state-path` is the one problem reported.
#[test]
fn empty_state_path_is_refused() {
    let dir = tempdir();
    let (out, text) = run(command(dir.path(), &["--state-path="]));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("--state-path is required"), "{text}");
    assert!(
        !text.contains("problems"),
        "only the state path is wrong: {text}"
    );
}

/// A `--listen-addr` that is not `[host]:port` with a numeric port from 1
/// to 65535 is refused.
#[test]
fn bad_listen_addresses_are_refused() {
    let dir = tempdir();
    for bad in ["10260", ":0", ":70000", ":http"] {
        let flag = format!("--listen-addr={bad}");
        let (out, text) = run(command(dir.path(), &[&flag]));
        assert_eq!(out.status.code(), Some(1), "{bad}: {text}");
        assert!(text.contains("parse --listen-addr"), "{bad}: {text}");
    }
}

/// Node capacities that are not Kubernetes quantities are refused, from
/// flags and from the environment (named as such).
#[test]
fn bad_quantities_are_refused() {
    let dir = tempdir();
    for flag in ["--node-cpu=abc", "--node-memory=-1", "--node-pods=0"] {
        let (out, text) = run(command(dir.path(), &[flag]));
        assert_eq!(out.status.code(), Some(1), "{flag}: {text}");
        assert!(text.contains("Kubernetes quantity"), "{flag}: {text}");
    }
    let mut cmd = command(dir.path(), &[]);
    cmd.env("VK_NODE_CPU", "abc");
    let (out, text) = run(cmd);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("VK_NODE_CPU"), "{text}");
}

/// A sandboxd token file that cannot be read stops start-up.
#[test]
fn unreadable_token_file_is_refused() {
    let dir = tempdir();
    let flag = format!(
        "--sandboxd-token-file={}",
        dir.path().join("missing").display()
    );
    let (out, text) = run(command(dir.path(), &[&flag]));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("sandboxd token file"), "{text}");
}

/// A state path under a regular file is refused as not writable, root
/// included.
#[test]
fn state_under_a_file_is_refused() {
    let dir = tempdir();
    std::fs::write(dir.path().join("file"), "x").unwrap();
    let flag = format!(
        "--state-path={}",
        dir.path().join("file/claims.json").display()
    );
    let (out, text) = run(command(dir.path(), &[&flag]));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("claims state is not writable"), "{text}");
}

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// Runs the binary as the distroless nonroot user (needs root to switch).
fn as_nonroot(mut cmd: Command) -> Command {
    cmd.uid(NONROOT).gid(NONROOT);
    cmd
}

/// A 0500 state directory is not writable for an unprivileged user; the
/// refusal names VK_STATE_PATH.
#[test]
fn mode_0500_state_dir_is_refused_for_a_normal_user() {
    if !is_root() {
        eprintln!("SKIPPED: switching to UID {NONROOT} needs root");
        return;
    }
    let dir = tempdir();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    nix::unistd::chown(
        &state,
        Some(nix::unistd::Uid::from_raw(NONROOT)),
        Some(nix::unistd::Gid::from_raw(NONROOT)),
    )
    .unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o500)).unwrap();
    let (out, text) = run(as_nonroot(command(dir.path(), &[])));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("claims state is not writable"), "{text}");
    assert!(text.contains("VK_STATE_PATH"), "{text}");
}

// UID 65532 with the default state path cannot create /var/lib/vk-sandbox;
// with a state directory it owns, configuration passes (and start-up goes
// on to the cluster, here unreachable).
#[test]
fn nonroot_needs_a_writable_state_dir() {
    if !is_root() {
        eprintln!("SKIPPED: switching to UID {NONROOT} needs root");
        return;
    }
    let default_dir = Path::new("/var/lib/vk-sandbox");
    if default_dir.exists() {
        eprintln!(
            "SKIPPED default-path half: {} exists here",
            default_dir.display()
        );
    } else {
        let dir = tempdir();
        let mut cmd = command(dir.path(), &[]);
        cmd.env_remove("VK_STATE_PATH");
        let (out, text) = run(as_nonroot(cmd));
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(text.contains("claims state is not writable"), "{text}");
        assert!(text.contains("/var/lib/vk-sandbox"), "{text}");
        assert!(!default_dir.exists());
    }

    let dir = tempdir();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    nix::unistd::chown(
        &state,
        Some(nix::unistd::Uid::from_raw(NONROOT)),
        Some(nix::unistd::Gid::from_raw(NONROOT)),
    )
    .unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let log_path = dir.path().join("run.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut cmd = as_nonroot(command(dir.path(), &[]));
    // Start-up must get past configuration; it then fails on (or waits
    // for) the unreachable cluster, which is all this test needs.
    let mut child = cmd
        .stdout(log.try_clone().expect("dup log"))
        .stderr(log)
        .spawn()
        .expect("spawn");
    let started = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if started.elapsed() > Duration::from_secs(15) {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(!text.contains("not writable"), "{text}");
    assert!(!text.contains("invalid configuration"), "{text}");
    assert!(!text.trim().is_empty(), "it went on and said so");
}

// A malformed state file stops start-up and is left byte for byte as it
// was.
#[test]
fn malformed_state_file_is_refused_and_kept() {
    let dir = tempdir();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("mkdir");
    let file = state.join("claims.json");
    let garbage = b"{\"claims\": {\"ns/p\": {\"id\": \"sb_1\", \"token\": ";
    std::fs::write(&file, garbage).expect("write");
    let (out, text) = run(command(dir.path(), &[]));
    assert!(
        !out.status.success(),
        "started on a malformed state file: {text}"
    );
    assert!(
        text.contains("claims.json"),
        "the message should name the file: {text}"
    );
    assert_eq!(
        std::fs::read(&file).expect("read"),
        garbage,
        "the state file was modified"
    );
}

// With no state file, start-up writes `{"claims":{}}` (0600) in a newly
// created 0700 directory — before anything else can fail.
#[test]
fn missing_state_file_is_created_empty_and_private() {
    let dir = tempdir();
    let file = dir.path().join("state/claims.json");
    // The dead kubeconfig makes start-up fail after the claims store opened.
    let (_out, text) = run(command(dir.path(), &[]));
    let content = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(content, "{\"claims\":{}}");
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(&dir.path().join("state")), 0o700);
}

/// `--log-format=json`: every line on stderr is one JSON object
/// with the fields log shippers expect, span fields included; the fatal
/// error is the last object, not an extra plain line. The dead kubeconfig
/// stops start-up after the kubelet certificate was made (inside the
/// `prepare` and `init` spans).
#[test]
fn json_log_lines_for_log_shippers() {
    let dir = tempdir();
    let mut cmd = command(dir.path(), &["--log-format=json"]);
    cmd.env("SANDBOXD_URL", "http://127.0.0.1:1");
    let (out, text) = run(cmd);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(lines.len() >= 3, "{stderr}");
    for l in &lines {
        let ts = l["timestamp"].as_str().unwrap_or_else(|| panic!("{l}"));
        ts.parse::<jiff::Timestamp>()
            .unwrap_or_else(|e| panic!("timestamp {ts}: {e}"));
        assert!(
            ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"]
                .contains(&l["level"].as_str().unwrap_or("")),
            "{l}"
        );
        assert!(l["target"].as_str().is_some_and(|t| !t.is_empty()), "{l}");
        assert!(l["message"].as_str().is_some_and(|m| !m.is_empty()), "{l}");
    }
    let tls = lines
        .iter()
        .find(|l| l["message"] == "kubelet cert absent; self-signing")
        .unwrap_or_else(|| panic!("no self-signing line in\n{stderr}"));
    assert_eq!(tls["target"], "vk_sandbox::kubelet::tls");
    assert_eq!(tls["span"]["name"], "init");
    assert_eq!(tls["span"]["node"], "vk-sandboxd");
    assert_eq!(tls["spans"][0]["name"], "prepare");
    assert!(tls["spans"][0]["addr"].as_str().is_some(), "{tls}");
    let last = lines.last().expect("lines");
    assert_eq!(last["level"], "ERROR", "{stderr}");
    assert_eq!(last["message"], "vk-sandbox failed");
    assert!(
        last["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{last}"
    );

    // The text format: plain lines, the fatal error repeated for people.
    let (out, text) = run(command(dir.path(), &["--log-format=text"]));
    assert_eq!(out.status.code(), Some(1), "{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_err())
    );
    assert!(stderr.contains(" INFO "), "{stderr}");
    assert!(
        stderr
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("vk-sandbox: ")),
        "{stderr}"
    );
}
