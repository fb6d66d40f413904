//! The simulator run without the privilege to make network namespaces
//! (as an unprivileged user, through `setpriv`): it says so at start-up
//! and its guests share the host's loopback; asked for namespaces, it
//! does not start. Skipped (with the reason) unless run as root with
//! `setpriv` installed.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_sandboxd-sim");

fn can_drop_privileges() -> bool {
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
    });
    let setpriv = Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !(root && setpriv) {
        eprintln!("SKIPPED: needs root and setpriv (root: {root}, setpriv: {setpriv})");
    }
    root && setpriv
}

/// The simulator as user `nobody`, without capabilities.
fn unprivileged(args: &[&str]) -> Child {
    Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            BIN,
            "--listen=127.0.0.1:0",
        ])
        .args(args)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the simulator through setpriv")
}

#[test]
fn without_the_privilege_it_says_so_and_uses_the_hosts_loopback() {
    if !can_drop_privileges() {
        return;
    }
    let mut child = unprivileged(&[]);
    let stderr = child.stderr.take().expect("stderr");
    let mut said = String::new();
    for line in BufReader::new(stderr).lines() {
        let line = line.expect("read stderr");
        if line.contains("guest network") {
            said = line;
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        said.contains("WARN")
            && said.contains("the host's loopback")
            && said.contains("cannot make a network namespace")
            && said.contains("run the simulator as root"),
        "{said:?}"
    );
}

#[test]
fn asked_for_namespaces_without_the_privilege_it_does_not_start() {
    if !can_drop_privileges() {
        return;
    }
    let out = unprivileged(&["--guest-network=namespaces"])
        .wait_with_output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("guest_network: namespaces")
            && text.contains("cannot make a network namespace"),
        "{text}"
    );
}
