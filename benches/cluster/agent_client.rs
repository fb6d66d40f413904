//! The guest agent relay driven from a process of its own, on one thread,
//! as vk-sandbox's kubelet API drives it: the reference the stream part
//! subtracts from a kubelet API exec to leave what vk-sandbox adds.
//!
//! The bench's own relay client shares a process and a runtime with the
//! simulator, so its hops to sandboxd are task switches on a thread already
//! awake. vk-sandbox never has that: sandboxd is another process, and so
//! every frame of its relay wakes another process. Measured from a child,
//! the relay pays those hops as vk-sandbox does (docs/benchmarks.md,
//! "Exec: sandboxd's share measured from another process").
//!
//! The child reads one line per exec on stdin and answers with the exec's
//! time in ms (timed inside the child, so the pipe is not in it); it exits
//! when its stdin closes.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Instant;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use vk_sandbox::kubelet::SandboxdPlane;
use vk_sandbox::kubelet::exec;
use vk_sandbox::kubelet::sandbox::{DataPlane, SandboxRef};
use vk_sandbox::sandboxd::{SandboxdClient, Secret};

use super::die;
use super::stream::exec_true;

/// Set (to anything) in the environment of the bench binary's child that
/// drives the relay.
pub const MODE_VAR: &str = "BENCH_AGENT_CLIENT";
const URL_VAR: &str = "BENCH_AGENT_URL";
const ID_VAR: &str = "BENCH_AGENT_ID";
const CLAIM_TOKEN_VAR: &str = "BENCH_AGENT_CLAIM_TOKEN";
const NODE_TOKEN_VAR: &str = "BENCH_AGENT_NODE_TOKEN";

/// A running relay client; the process ends when this is dropped.
pub struct AgentClient {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl AgentClient {
    /// Start the child for sandbox `id` of the sandboxd at `url`.
    pub async fn start(url: &str, id: &str, claim_token: &str, node_token: &str) -> AgentClient {
        let exe =
            std::env::current_exe().unwrap_or_else(|e| die(&format!("the bench binary: {e}")));
        let mut child = tokio::process::Command::new(exe)
            .env(MODE_VAR, "1")
            .env(URL_VAR, url)
            .env(ID_VAR, id)
            .env(CLAIM_TOKEN_VAR, claim_token)
            .env(NODE_TOKEN_VAR, node_token)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| die(&format!("start the relay client: {e}")));
        let stdin = child
            .stdin
            .take()
            .unwrap_or_else(|| die("the relay client's stdin"));
        let stdout = child
            .stdout
            .take()
            .unwrap_or_else(|| die("the relay client's stdout"));
        AgentClient {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// One exec of `true` through the relay; its time in ms.
    pub async fn exec(&mut self) -> f64 {
        if let Err(e) = self.stdin.write_all(b"exec\n").await {
            die(&format!("the relay client: {e}"));
        }
        match self.lines.next_line().await {
            Ok(Some(line)) => line.trim().parse().unwrap_or_else(|_| {
                die(&format!("the relay client answered {line:?}"));
            }),
            Ok(None) => die(&format!(
                "the relay client exited ({:?})",
                self.child.try_wait()
            )),
            Err(e) => die(&format!("the relay client: {e}")),
        }
    }
}

/// The child's whole life: one exec per line of stdin.
pub fn serve() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| die(&format!("{name} unset")));
    // One thread, as vk-sandbox's kubelet API has.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| die(&format!("tokio runtime: {e}")));
    vk_sandbox::crypto::install_provider();
    rt.block_on(async {
        let client = SandboxdClient::builder(var(URL_VAR))
            .token(Some(var(NODE_TOKEN_VAR)))
            .build()
            .unwrap_or_else(|e| die(&format!("sandboxd client: {e}")));
        let plane: Arc<dyn DataPlane> = Arc::new(SandboxdPlane::new(client));
        let sandbox = SandboxRef {
            id: var(ID_VAR),
            token: Secret::new(var(CLAIM_TOKEN_VAR)),
        };
        // Blocking reads of stdin are fine here: between two execs nothing
        // else runs on this thread.
        let mut lines = std::io::stdin().lines();
        while let Some(Ok(_)) = lines.next() {
            let t = Instant::now();
            let outcome = exec_true(Arc::clone(&plane), sandbox.clone()).await;
            if outcome != exec::Outcome::Exited(0) {
                die(&format!("agent exec from the child: {outcome:?}"));
            }
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            let mut out = std::io::stdout().lock();
            if writeln!(out, "{ms}").is_err() || out.flush().is_err() {
                return;
            }
        }
    });
}
