//! kubectl of the local control plane's binaries, run as a user runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `kubectl` in `VK_K8S_BIN_DIR`, else in the folder `e2e/cluster.sh bin`
/// names (where the control plane's binaries are built).
pub fn path() -> PathBuf {
    let dir = std::env::var_os("VK_K8S_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/e2e/cluster.sh"))
                .arg("bin")
                .stdin(Stdio::null())
                .output()
                .expect("run e2e/cluster.sh bin");
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        });
    dir.join("kubectl")
}

/// `kubectl --kubeconfig <kubeconfig> <args>`, killed after 60 s; whether
/// it succeeded, and its stdout then stderr. Awaited, so the test's runtime
/// keeps serving meanwhile (e.g. an in-process kubelet API kubectl reaches).
pub async fn run(kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let child = tokio::process::Command::new(path())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(Duration::from_secs(60), child).await {
        Ok(Ok(out)) => (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Ok(Err(e)) => panic!("run kubectl {}: {e}", path().display()),
        Err(_) => (false, format!("kubectl {args:?} timed out after 60 s")),
    }
}

/// What a kubectl run left: its exit code, stdout and stderr apart.
#[derive(Debug)]
pub struct Ran {
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Ran {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// `kubectl --kubeconfig <kubeconfig> <args>` with `stdin` piped in (or
/// none) and extra environment, killed after `limit`.
pub async fn run_with(
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&[u8]>,
    env: &[(&str, &str)],
    limit: Duration,
) -> Ran {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(path());
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .envs(env.iter().copied())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("run kubectl {}: {e}", path().display()));
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        let data = data.to_vec();
        tokio::spawn(async move {
            let _ = pipe.write_all(&data).await;
            let _ = pipe.shutdown().await;
        });
    }
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(Ok(out)) => Ran {
            code: out.status.code(),
            stdout: out.stdout,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Ok(Err(e)) => panic!("kubectl {args:?}: {e}"),
        Err(_) => panic!("kubectl {args:?} still running after {limit:?}"),
    }
}
