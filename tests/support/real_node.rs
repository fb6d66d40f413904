//! A real node (kubelet + containerd) joined to the local control plane,
//! through `e2e/real-node.sh`, and the images it runs, through
//! `e2e/image/build.sh` (made here, imported, never pulled).
//!
//! Where the machine cannot run containers the test says why and skips —
//! unless `VK_REQUIRE_REAL_NODE=1` (CI), then it fails. The node is torn
//! down by [`RealNode::down`] (which reports whether the host was left as
//! found), by `Drop` if a test panics first, and by the script's guard
//! process if this process dies without either.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn script() -> PathBuf {
    repo().join("e2e/real-node.sh")
}

/// Runs `e2e/real-node.sh <args>`; (success, exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (bool, Option<i32>, String, String) {
    let out = Command::new(script())
        .args(args)
        .env("VK_REAL_NODE_OWNER_PID", std::process::id().to_string())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script().display()));
    (
        out.status.success(),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

pub struct RealNode {
    /// The Node's name (127.0.0.1: its InternalIP as well).
    pub name: String,
    down: bool,
}

impl RealNode {
    /// Starts the node, or says why this machine cannot (a skip, or a
    /// failure when `VK_REQUIRE_REAL_NODE=1`).
    pub fn up_or_skip(what: &str) -> Option<RealNode> {
        let required = std::env::var("VK_REQUIRE_REAL_NODE").is_ok_and(|v| v == "1");
        let (ok, code, stdout, stderr) = run(&["check"]);
        if !ok {
            let why = if code == Some(3) {
                stdout
            } else {
                format!("{stdout}\n{stderr}")
            };
            if required {
                panic!("{what} needs a real node and VK_REQUIRE_REAL_NODE=1, but: {why}");
            }
            eprintln!("SKIPPED: {what}: {why}");
            return None;
        }
        eprintln!("real node: {stdout}");
        let (ok, _, stdout, stderr) = run(&["up"]);
        assert!(ok, "e2e/real-node.sh up failed:\n{stderr}");
        eprintln!("{stderr}");
        Some(RealNode {
            name: stdout.lines().last().unwrap_or_default().to_string(),
            down: false,
        })
    }

    /// A node reboot: kubelet and containerd stopped, every container
    /// killed, tmpfs state dropped, both started again.
    pub fn reboot(&self) {
        let (ok, _, _, stderr) = run(&["reboot"]);
        assert!(ok, "e2e/real-node.sh reboot failed:\n{stderr}");
        eprintln!("{stderr}");
    }

    /// `ctr images import` of docker-archive tarballs.
    pub fn import(&self, tars: &[&Path]) {
        let mut args = vec!["import".to_string()];
        args.extend(tars.iter().map(|t| t.display().to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, _, _, stderr) = run(&args);
        assert!(ok, "importing images failed:\n{stderr}");
    }

    /// Tears the node down; returns the script's report (what it restored
    /// and whether the host is as found) and whether it succeeded.
    pub fn down(mut self) -> (bool, String) {
        self.down = true;
        let (ok, _, _, stderr) = run(&["down"]);
        (ok, stderr)
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if !self.down {
            let (_, _, _, stderr) = run(&["down"]);
            eprintln!("{stderr}");
        }
    }
}

/// Builds an image with `e2e/image/build.sh <args>` into `out`.
pub fn build_image(args: &[&str], envs: &[(&str, &Path)]) {
    let mut cmd = Command::new(repo().join("e2e/image/build.sh"));
    cmd.args(args).stdin(Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run e2e/image/build.sh: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "e2e/image/build.sh {args:?} failed:\n{stderr}"
    );
    eprintln!("{}", stderr.trim());
}

/// The static musl binary of vk-sandbox the packaging check builds too
/// (`e2e/musl-build.sh`, dev profile: the release build's target, linker
/// and static linkage without its LTO): `VK_STATIC_BIN` (e2e/run-tests.sh
/// builds it first), else built here when missing or stale.
pub fn static_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("VK_STATIC_BIN").map(PathBuf::from) {
        return bin;
    }
    let out = repo().join("target/check-packaging/vk-sandbox-static");
    let status = Command::new(repo().join("e2e/musl-build.sh"))
        .arg("x86_64-unknown-linux-musl")
        .arg(&out)
        .env("VK_MUSL_PROFILE", "dev")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("run e2e/musl-build.sh: {e}"));
    assert!(status.success(), "e2e/musl-build.sh failed ({status})");
    out
}

/// Processes on this host running `/usr/local/bin/vk-sandbox` inside a
/// kubepods cgroup (the DaemonSet's containers), by PID.
pub fn daemon_pids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let first = cmd.split(|b| *b == 0).next().unwrap_or_default();
            first == b"/usr/local/bin/vk-sandbox"
                && std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                    .is_ok_and(|c| c.contains("kubepods"))
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// What [`OverlapWatch`] saw.
#[derive(Debug, Default, Clone)]
pub struct Overlap {
    /// The most DaemonSet processes seen alive at once.
    pub max_at_once: usize,
    /// Every PID seen, in order of appearance.
    pub pids: Vec<u32>,
    pub samples: usize,
}

/// Samples [`daemon_pids`] every 20 ms on a thread until stopped.
pub struct OverlapWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<Overlap>>,
}

impl OverlapWatch {
    pub fn start() -> OverlapWatch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut seen = Overlap::default();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let now = daemon_pids();
                seen.max_at_once = seen.max_at_once.max(now.len());
                for p in now {
                    if !seen.pids.contains(&p) {
                        seen.pids.push(p);
                    }
                }
                seen.samples += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            seen
        });
        OverlapWatch {
            stop,
            handle: Some(handle),
        }
    }

    pub fn finish(mut self) -> Overlap {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for OverlapWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `/proc/<pid>/status` fields and the root mount's options of a process.
pub fn process_facts(pid: u32) -> (String, String, String, String) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    let root_opts = mountinfo
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(4) == Some(&"/")).then(|| f.get(5).copied().unwrap_or_default().to_string())
        })
        .unwrap_or_default();
    (
        field("Uid:"),
        field("CapEff:"),
        field("NoNewPrivs:"),
        root_opts,
    )
}
