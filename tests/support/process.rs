//! Runs the vk-sandbox binary as a child process for end-to-end tests.

use std::fs::File;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The vk-sandbox binary cargo built for this test (or bench) binary.
pub const BIN: &str = env!("CARGO_BIN_EXE_vk-sandbox");

/// `RUST_LOG` of processes under test unless a test asks for more.
pub const DEFAULT_RUST_LOG: &str = "info,vk_sandbox=debug";

/// Ports handed out by [`free_port`]: below the kernel's ephemeral range
/// (32768 and up by default), so an outgoing connection of another process
/// never takes one between our check and its user's bind (50 vk-sandbox
/// processes starting at once, each connecting out, did), and above the
/// local plane's fixed ports (16xxx, 17xxx, 23xxx).
const PORTS: std::ops::Range<u16> = 24_500..32_700;

/// A free loopback port (bound then released): taken in turn from
/// [`PORTS`], starting at an offset of this process's own, so concurrent
/// test and bench processes rarely meet.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = u32::from(PORTS.end - PORTS.start);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7_919) % span,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::SeqCst) % span;
        let port = PORTS.start + n as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a loopback port")
}

/// Writes `<dir>/dead.kubeconfig`, a kubeconfig whose server refuses
/// connections (readable by any user); returns its path.
pub fn dead_kubeconfig(dir: &Path) -> PathBuf {
    let path = dir.join("dead.kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: dead\n  cluster:\n    server: https://127.0.0.1:1\n\
         users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: dead\n  context:\n    cluster: dead\n    user: u\n\
         current-context: dead\n",
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
    path
}

pub struct VkProcess {
    pub child: Option<Child>,
    pub log: PathBuf,
    pub kubelet_port: u16,
    pub admin_port: u16,
}

impl VkProcess {
    /// Starts `vk-sandbox` with `args` (plus the kubeconfig and ports chosen
    /// here); stdout and stderr go to `<dir>/<name>.log`.
    pub fn start(dir: &Path, name: &str, kubeconfig: &Path, args: &[&str]) -> VkProcess {
        let kubelet_port = free_port();
        let admin_port = free_port();
        let log = dir.join(format!("{name}.log"));
        Self::start_with_ports(kubeconfig, args, log, kubelet_port, admin_port)
    }

    pub fn start_with_ports(
        kubeconfig: &Path,
        args: &[&str],
        log: PathBuf,
        kubelet_port: u16,
        admin_port: u16,
    ) -> VkProcess {
        Self::start_with_ports_log(
            kubeconfig,
            args,
            log,
            kubelet_port,
            admin_port,
            DEFAULT_RUST_LOG,
        )
    }

    /// A placeholder with no process (replaced before use).
    pub fn none() -> VkProcess {
        VkProcess {
            child: None,
            log: PathBuf::new(),
            kubelet_port: 0,
            admin_port: 0,
        }
    }

    /// [`VkProcess::start_with_ports`] with `RUST_LOG` set to `rust_log`.
    pub fn start_with_ports_log(
        kubeconfig: &Path,
        args: &[&str],
        log: PathBuf,
        kubelet_port: u16,
        admin_port: u16,
        rust_log: &str,
    ) -> VkProcess {
        Self::start_binary(
            Path::new(BIN),
            kubeconfig,
            args,
            log,
            (kubelet_port, admin_port),
            rust_log,
        )
    }

    /// Starts the vk-sandbox binary `bin` (e.g. another build than
    /// [`BIN`]) with `args`, the kubeconfig and the (kubelet, admin) ports;
    /// stdout and stderr are appended to `log`.
    pub fn start_binary(
        bin: &Path,
        kubeconfig: &Path,
        args: &[&str],
        log: PathBuf,
        (kubelet_port, admin_port): (u16, u16),
        rust_log: &str,
    ) -> VkProcess {
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("open process log {}: {e}", log.display()));
        let err = out.try_clone().expect("clone log handle");
        let child = Command::new(bin)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg(format!("--listen-addr=127.0.0.1:{kubelet_port}"))
            .arg(format!("--admin-addr=127.0.0.1:{admin_port}"))
            .args(args)
            .env_remove("KUBECONFIG")
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        VkProcess {
            child: Some(child),
            log,
            kubelet_port,
            admin_port,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The admin port's `/metrics` text.
    pub async fn metrics(&self) -> Result<String, String> {
        let url = format!("http://127.0.0.1:{}/metrics", self.admin_port);
        let resp = reqwest::get(&url)
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        resp.text().await.map_err(|e| format!("GET {url}: {e}"))
    }

    /// Sends a signal (e.g. libc SIGTERM) by pid.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(c) = &self.child {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
        }
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                self.child = None;
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for VkProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs the binary to completion (for flag/refusal tests).
pub fn run_to_exit(args: &[&str], envs: &[(&str, &str)]) -> (ExitStatus, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env_remove("KUBECONFIG");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run vk-sandbox");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status, text)
}
