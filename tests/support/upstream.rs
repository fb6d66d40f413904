//! What e2e/agent-sandbox.sh builds besides the controller, for the tests
//! that run agent-sandbox's own clients: its in-sandbox runtime
//! (`packages/sandboxd`), the driver of its Go SDK, its sandbox-router and
//! its legacy Python runtime.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use super::vk::{VkUnderTest, tail};
use super::wait_for;

/// `e2e/agent-sandbox.sh WHAT`'s output lines (paths), or a panic saying
/// what failed.
pub fn built(what: &str) -> Vec<PathBuf> {
    let out =
        std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/e2e/agent-sandbox.sh"))
            .arg(what)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("run e2e/agent-sandbox.sh {what}: {e}"));
    assert!(
        out.status.success(),
        "e2e/agent-sandbox.sh {what} failed ({:?})",
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<PathBuf> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(PathBuf::from)
        .collect();
    assert!(
        !lines.is_empty(),
        "e2e/agent-sandbox.sh {what} printed {text:?}"
    );
    lines
}

/// The runtime and the SDK driver.
pub fn sdk() -> (PathBuf, PathBuf) {
    let mut lines = built("sdk").into_iter();
    match (lines.next(), lines.next()) {
        (Some(runtime), Some(driver)) => (runtime, driver),
        _ => panic!("e2e/agent-sandbox.sh sdk printed fewer than two paths"),
    }
}

/// A child process killed when dropped.
pub struct Child(pub std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Until `url` answers with a success status.
async fn healthy(what: &str, url: &str) {
    wait_for(what, Duration::from_secs(30), || async {
        let r = reqwest::get(url).await.map_err(|e| e.to_string())?;
        r.status()
            .is_success()
            .then_some(())
            .ok_or(r.status().to_string())
    })
    .await;
}

/// The runtime on loopback ports of its own; killed when dropped.
pub struct Runtime {
    _child: Child,
    pub rest: u16,
    pub grpc: u16,
    pub root: PathBuf,
}

impl Runtime {
    pub async fn start(bin: &PathBuf) -> Runtime {
        let (rest, grpc) = (super::process::free_port(), super::process::free_port());
        let root = super::vk::test_dir("sdk-root");
        let child = std::process::Command::new(bin)
            .args(["--listen-host", "127.0.0.1"])
            .args(["--rest-port", &rest.to_string()])
            .args(["--grpc-port", &grpc.to_string()])
            .arg("--root-dir")
            .arg(&root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start agent-sandbox's runtime");
        let rt = Runtime {
            _child: Child(child),
            rest,
            grpc,
            root,
        };
        healthy(
            "the runtime's health",
            &format!("http://127.0.0.1:{rest}/v1/health"),
        )
        .await;
        rt
    }
}

/// The legacy Python runtime (the API the SDK speaks through the
/// router) on a loopback port of its own: (process, port).
pub async fn legacy_runtime() -> (Child, u16) {
    let launcher = built("python-runtime").remove(0);
    let port = super::process::free_port();
    let dir = super::vk::test_dir("legacy-root");
    let child = std::process::Command::new(&launcher)
        .arg(port.to_string())
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the legacy runtime");
    let child = Child(child);
    healthy(
        "the legacy runtime's health",
        &format!("http://127.0.0.1:{port}/"),
    )
    .await;
    (child, port)
}

/// The SDK driver's JSON lines, or a failure with everything said.
pub async fn drive(cmd: &mut tokio::process::Command, vk: &VkUnderTest, what: &str) -> Vec<Value> {
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        cmd.stdin(Stdio::null()).kill_on_drop(true).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{what}: the SDK driver within 5 minutes"))
    .unwrap_or_else(|e| panic!("{what}: run the SDK driver: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "{what}: the SDK driver failed:\nstdout:\n{stdout}\nstderr (last 2000 bytes):\n{}\nvk-sandbox log:\n{}",
        &stderr[stderr.len().saturating_sub(2000)..],
        tail(&vk.logs(), 20)
    );
    println!("router e2e: {what}:\n{stdout}");
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The port of the apiserver a kubeconfig names.
pub fn apiserver_port(kubeconfig: &std::path::Path) -> u16 {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
    let server = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .expect("the kubeconfig's server");
    server
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {server}"))
}

/// The driver ran its command (exit 4, its output) and read back the
/// file it wrote.
pub fn ran_and_moved_a_file(steps: &[Value]) {
    let run = step(steps, "run");
    assert_eq!(run["exit_code"], 4, "{steps:?}");
    assert_eq!(run["stdout"], "hello from the sandbox\n", "{steps:?}");
    assert_eq!(
        step(steps, "read")["content"],
        "written through vk-sandbox's port-forward\n",
        "{steps:?}"
    );
}

pub fn step<'a>(steps: &'a [Value], name: &str) -> &'a Value {
    steps
        .iter()
        .find(|s| s["step"] == name)
        .unwrap_or_else(|| panic!("no {name} step in {steps:?}"))
}
