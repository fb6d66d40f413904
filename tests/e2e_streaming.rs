//! Into the sandbox with kubectl, end to end: the real kubectl through the
//! real apiserver to the vk-sandbox binary, and on to the sandboxd
//! simulator's guest agent (which really runs the commands, with a real
//! pseudo-terminal for the shell) and guest port relays (to listeners of
//! this test). The Node declares `ExtendWebSocketsToKubelet`, so kubectl's
//! WebSocket streams reach vk-sandbox as they are; the SPDY variants are
//! what kubectl falls back to (and what other clients speak).

mod support;

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DynamicObject, PostParams};
use kube::{Api, Client};
use sandboxd_sim::{PortMapping, SimHandle};
use serde_json::json;
use support::kubectl::{Ran, run_with};
use support::vk::{StartOpts, VkUnderTest, tail};
use support::{TestCluster, wait_for};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TOKEN: &str = "root-token-stream";
const TEMPLATE: &str = "base:24.04";
/// kubectl speaking SPDY instead of WebSocket.
const SPDY_EXEC: (&str, &str) = ("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false");
const SPDY_PORT_FORWARD: (&str, &str) = ("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false");

struct Env {
    cluster: TestCluster,
    sim: SimHandle,
    vk: VkUnderTest,
    ns: String,
    /// The sandbox of Pod `p`.
    id: String,
    /// The Sandbox controller that makes the Pods.
    _controller: support::controller::SandboxController,
}

/// A guest service: answers an HTTP GET with a greeting, echoes anything
/// else until EOF (then closes its side).
async fn guest_service() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind guest");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut first = [0u8; 4];
                if c.read_exact(&mut first).await.is_err() {
                    return;
                }
                if &first == b"GET " {
                    let body = "hello from the guest\n";
                    let _ = c
                        .write_all(
                            format!(
                                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                                body.len()
                            )
                            .as_bytes(),
                        )
                        .await;
                    let _ = c.shutdown().await;
                    return;
                }
                let _ = c.write_all(&first).await;
                let (mut r, mut w) = c.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

async fn setup(prefix: &str) -> Option<Env> {
    setup_with(prefix, &[]).await
}

/// A guest service that accepts connections and never reads them (nor
/// closes them).
async fn sink_service() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind sink");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = l.accept().await {
            held.push(c);
        }
    });
    addr
}

/// [`setup`] with `extra` flags for vk-sandbox; guest port 8082 leads to a
/// [`sink_service`].
async fn setup_with(prefix: &str, extra: &[&str]) -> Option<Env> {
    let cluster = support::cluster().await?;
    let guest = guest_service().await;
    let sink = sink_service().await;
    let mut cfg = support::sim::config(TOKEN, &[&format!("{TEMPLATE}=4")]);
    cfg.wake_delay_ms = 0;
    for port in [8080, 8081] {
        cfg.port_map.push(PortMapping {
            sandbox: None,
            template: Some(TEMPLATE.into()),
            guest_port: port,
            target: guest,
        });
    }
    cfg.port_map.push(PortMapping {
        sandbox: None,
        template: Some(TEMPLATE.into()),
        guest_port: 8082,
        target: sink,
    });
    let sim = support::sim::start(cfg).await;
    let token_file = support::sim::token_file(&support::vk::test_dir(prefix), TOKEN);
    let mut args = support::sim::vk_args(&sim, Some(&token_file));
    // The status (and its declared features) applied within seconds.
    args.push("--node-status-interval=2s".into());
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let vk = VkUnderTest::start_with(&cluster, prefix, &args, StartOpts::default()).await;
    vk.wait_ready(&cluster.client, Duration::from_secs(30))
        .await;
    let ns = cluster.namespace(prefix).await;
    let controller = support::controller::start(&cluster.client, &cluster.kubeconfig, &ns).await;
    let env = Env {
        cluster,
        sim,
        vk,
        ns,
        id: String::new(),
        _controller: controller,
    };
    let id = env.sandbox_pod("p", None).await;
    env.wait_declared().await;
    Some(Env { id, ..env })
}

impl Env {
    fn client(&self) -> Client {
        self.cluster.client.clone()
    }

    /// A Pod owned by a Sandbox, as agent-sandbox makes it, waited for
    /// Running with a claim (returns the claim id); with `ttl` (an invalid
    /// one, say) not waited for.
    async fn sandbox_pod(&self, name: &str, ttl: Option<&str>) -> String {
        let template = TEMPLATE;
        let sandboxes: Api<DynamicObject> = Api::namespaced_with(
            self.client(),
            &self.ns,
            &support::controller::resource("Sandbox"),
        );
        // The controller makes the Pod from the template (creating it here
        // too raced the controller for the name: 409 AlreadyExists).
        let mut owner = support::controller::contract_sandbox(name, template, Some(&self.vk.node));
        owner["spec"]["podTemplate"]["metadata"]["annotations"]["sandbox.cocoonstack.io/ttl-seconds"] =
            json!(ttl.unwrap_or("3600"));
        let owner: DynamicObject = serde_json::from_value(owner).expect("sandbox json");
        sandboxes
            .create(&PostParams::default(), &owner)
            .await
            .expect("create Sandbox");
        let pods: Api<Pod> = Api::namespaced(self.client(), &self.ns);
        if ttl.is_some() {
            return String::new();
        }
        wait_for(
            &format!("Pod {name} Running"),
            Duration::from_secs(60),
            || async {
                let p = pods.get(name).await.map_err(|e| e.to_string())?;
                let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                let id = p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("sandbox.cocoonstack.io/claim-id").cloned());
                match (phase.as_deref(), id) {
                    (Some("Running"), Some(id)) => Ok(id),
                    other => Err(format!("{other:?}; log:\n{}", tail(&self.vk.logs(), 15))),
                }
            },
        )
        .await
    }

    /// The Node declares ExtendWebSocketsToKubelet (the first status apply).
    async fn wait_declared(&self) {
        let client = self.client();
        let path = format!("/api/v1/nodes/{}", self.vk.node);
        wait_for(
            "the Node to declare ExtendWebSocketsToKubelet (first status apply)",
            Duration::from_secs(120),
            || async {
                // Untyped: the typed Node of the API version the crate
                // builds against has no declaredFeatures.
                let req = http::Request::get(path.as_str())
                    .body(Vec::new())
                    .map_err(|e| e.to_string())?;
                let v: serde_json::Value = client.request(req).await.map_err(|e| e.to_string())?;
                let declared = v["status"]["declaredFeatures"].clone();
                declared
                    .as_array()
                    .is_some_and(|a| a.iter().any(|f| f == "ExtendWebSocketsToKubelet"))
                    .then_some(())
                    .ok_or(format!(
                        "declaredFeatures {declared}, heartbeat {}",
                        v["status"]["conditions"][0]["lastHeartbeatTime"]
                    ))
            },
        )
        .await;
    }

    async fn kubectl(&self, args: &[&str], stdin: Option<&[u8]>, env: &[(&str, &str)]) -> Ran {
        let args: Vec<&str> = ["-n", self.ns.as_str()]
            .iter()
            .chain(args.iter())
            .copied()
            .collect();
        run_with(
            &self.cluster.kubeconfig,
            &args,
            stdin,
            env,
            Duration::from_secs(60),
        )
        .await
    }

    /// The guest's processes of the sandbox (the simulator's admin view).
    fn processes(&self) -> Vec<serde_json::Value> {
        self.sim
            .sim()
            .claim_state(&self.id)
            .and_then(|s| s["processes"].as_array().cloned())
            .unwrap_or_default()
    }

    async fn finish(self) {
        self.cluster.drop_namespace(&self.ns).await;
        self.vk.delete_node(&self.cluster.client).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_streams_exit_codes_stdin_and_hang_up() {
    let Some(env) = setup("vk-exec").await else {
        return;
    };
    for transport in [&[][..], &[SPDY_EXEC][..]] {
        let ran = env
            .kubectl(
                &[
                    "exec",
                    "p",
                    "--",
                    "sh",
                    "-c",
                    "echo out; echo err >&2; exit 3",
                ],
                None,
                transport,
            )
            .await;
        assert_eq!(ran.stdout_text(), "out\n", "{transport:?}: {ran:?}");
        assert!(ran.stderr.contains("err\n"), "{transport:?}: {ran:?}");
        assert!(
            ran.stderr.contains("command terminated with exit code 3"),
            "{transport:?}: {ran:?}"
        );
        assert_eq!(ran.code, Some(3), "{transport:?}: {ran:?}");

        let ran = env
            .kubectl(&["exec", "-i", "p", "--", "cat"], Some(b"hi\n"), transport)
            .await;
        assert_eq!(
            (ran.code, ran.stdout_text().as_str()),
            (Some(0), "hi\n"),
            "{ran:?}"
        );

        // A program the VM lacks: the agent's reason, not an internal error.
        let ran = env
            .kubectl(&["exec", "p", "--", "no-such-program"], None, transport)
            .await;
        assert_ne!(ran.code, Some(0));
        assert!(ran.stderr.contains("cannot run"), "{ran:?}");
        assert!(!ran.stderr.contains("Internal error"), "{ran:?}");
    }

    // A larger output arrives whole.
    let ran = env
        .kubectl(
            &[
                "exec",
                "p",
                "--",
                "sh",
                "-c",
                "head -c 3000000 /dev/zero | tr '\\0' x",
            ],
            None,
            &[],
        )
        .await;
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.stdout.len(), 3_000_000);
    assert!(ran.stdout.iter().all(|&b| b == b'x'));

    // kubectl interrupted (Ctrl-C) while a quiet command runs: the command
    // is killed in the guest.
    let mut cmd = tokio::process::Command::new(support::kubectl::path());
    cmd.arg("--kubeconfig")
        .arg(&env.cluster.kubeconfig)
        .args(["-n", &env.ns, "exec", "p", "--", "sleep", "600"])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    // As at a terminal, where Ctrl-C works: a test run in a background job
    // (make test started with `&`, a CI runner) inherits SIGINT ignored,
    // and Go keeps an inherited SIG_IGN, so kubectl would not die of it.
    // SAFETY: between fork and exec only sigaction runs (async-signal-safe).
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGINT,
                nix::sys::signal::SigHandler::SigDfl,
            )
            .map(|_| ())
            .map_err(std::io::Error::from)
        });
    }
    let mut child = cmd.spawn().expect("kubectl exec sleep");
    wait_for(
        "the sleep to run in the guest",
        Duration::from_secs(30),
        || async {
            let ps = env.processes();
            ps.iter()
                .any(|p| p["argv"][0] == "sleep" && p["state"] == "running")
                .then_some(())
                .ok_or(format!("{ps:?}"))
        },
    )
    .await;
    let pid = child.id().expect("kubectl pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("interrupt kubectl");
    let kubectl_exit = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    wait_for(
        "the sleep to be killed",
        Duration::from_secs(30),
        || async {
            let ps = env.processes();
            (!ps.iter()
                .any(|p| p["argv"][0] == "sleep" && p["state"] == "running"))
            .then_some(())
            .ok_or(format!(
                "{ps:?}; kubectl after SIGINT: {kubectl_exit:?}; log:\n{}",
                tail(&env.vk.logs(), 10)
            ))
        },
    )
    .await;

    // logs and attach: the reasons, as a user reads them.
    let ran = env.kubectl(&["logs", "p"], None, &[]).await;
    assert_ne!(ran.code, Some(0));
    assert!(ran.stderr.contains("has no container log"), "{ran:?}");
    let ran = env.kubectl(&["attach", "p"], None, &[]).await;
    assert_ne!(ran.code, Some(0));
    assert!(
        ran.stderr.contains("no container process to attach to"),
        "{ran:?}"
    );

    // A Pod bound here without a sandbox (vk-sandbox refuses its TTL).
    env.sandbox_pod("waiting", Some("-1")).await;
    let pods: Api<Pod> = Api::namespaced(env.client(), &env.ns);
    wait_for("the Pod to be bound", Duration::from_secs(30), || async {
        let p = pods.get("waiting").await.map_err(|e| e.to_string())?;
        p.spec
            .and_then(|s| s.node_name)
            .filter(|n| *n == env.vk.node)
            .map(|_| ())
            .ok_or("not bound yet".to_string())
    })
    .await;
    let ran = env
        .kubectl(&["exec", "waiting", "--", "true"], None, &[])
        .await;
    assert_ne!(ran.code, Some(0));
    assert!(ran.stderr.contains("has no sandbox"), "{ran:?}");
    assert!(!ran.stderr.contains("Internal error"), "{ran:?}");
    env.finish().await;
}

/// SIGTERM during an open exec: the session is inside the kubelet API's
/// shutdown grace (docs/streaming.md, "Limits"): the command is killed in
/// the guest before vk-sandbox exits, the process exits 0 within the
/// grace (and a margin for the rest of the shutdown), and kubectl's exec
/// ends.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_an_exec_kills_it_within_the_grace_and_exits_0() {
    let Some(mut env) = setup("vk-exec-term").await else {
        return;
    };
    let mut child = tokio::process::Command::new(support::kubectl::path())
        .arg("--kubeconfig")
        .arg(&env.cluster.kubeconfig)
        .args(["-n", &env.ns, "exec", "p", "--", "sleep", "600"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl exec sleep");
    let sleeping = |ps: &[serde_json::Value]| {
        ps.iter()
            .any(|p| p["argv"][0] == "sleep" && p["state"] == "running")
    };
    wait_for(
        "the sleep to run in the guest",
        Duration::from_secs(30),
        || async {
            let ps = env.processes();
            sleeping(&ps).then_some(()).ok_or(format!("{ps:?}"))
        },
    )
    .await;
    let signalled = std::time::Instant::now();
    env.vk.process.signal(nix::sys::signal::Signal::SIGTERM);
    let grace = vk_sandbox::kubelet::server::SHUTDOWN_GRACE;
    let st = env
        .vk
        .process
        .wait_exit(grace + Duration::from_secs(5))
        .unwrap_or_else(|| panic!("no exit within the grace:\n{}", tail(&env.vk.logs(), 40)));
    let took = signalled.elapsed();
    assert!(
        st.success(),
        "exit status {st:?}:\n{}",
        tail(&env.vk.logs(), 40)
    );
    let ps = env.processes();
    assert!(
        !sleeping(&ps),
        "the sleep still runs after vk-sandbox exited ({took:?}): {ps:?}\n{}",
        tail(&env.vk.logs(), 40)
    );
    assert!(took < grace, "exited {took:?} after SIGTERM");
    let kubectl = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("kubectl exec ends with the session")
        .expect("kubectl status");
    assert!(!kubectl.success(), "{kubectl:?}");
    env.finish().await;
}

/// What a terminal showed, read as it comes.
struct Terminal {
    rx: tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    screen: String,
}

impl Terminal {
    /// Wait (30 s at most) until the screen shows `what`.
    async fn expect(&mut self, what: &str, log: impl Fn() -> String) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !self.screen.contains(what) {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(b)) => self.screen.push_str(&String::from_utf8_lossy(&b)),
                _ => panic!(
                    "no {what:?} on the terminal; it shows:\n{}\nlog:\n{}",
                    self.screen,
                    log()
                ),
            }
        }
    }
}

/// A pseudo-terminal pair; the slave end becomes kubectl's terminal.
fn pty(rows: u16, cols: u16) -> (OwnedFd, OwnedFd) {
    let ws = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let p = nix::pty::openpty(Some(&ws), None).expect("openpty");
    (p.master, p.slave)
}

fn resize(master: &OwnedFd, rows: u16, cols: u16) {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: a valid pty master descriptor and a winsize that outlives
    // the call.
    let rc = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    assert_eq!(rc, 0, "TIOCSWINSZ");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_terminal_with_resize() {
    let Some(env) = setup("vk-tty").await else {
        return;
    };
    let (master, slave) = pty(30, 100);
    let slave_fd = slave.as_raw_fd();
    let mut cmd = std::process::Command::new(support::kubectl::path());
    cmd.arg("--kubeconfig")
        .arg(&env.cluster.kubeconfig)
        .args(["-n", &env.ns, "exec", "-it", "p", "--", "sh"])
        .env("TERM", "xterm")
        .stdin(std::process::Stdio::from(slave.try_clone().expect("dup")))
        .stdout(std::process::Stdio::from(slave.try_clone().expect("dup")))
        .stderr(std::process::Stdio::from(slave));
    // SAFETY: only async-signal-safe calls between fork and exec: a new
    // session whose controlling terminal is the pty, so kubectl sees a
    // terminal and gets SIGWINCH when it is resized.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let _ = slave_fd;
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("kubectl exec -it");
    // Read the terminal on a thread; write to it from here.
    let reader = std::fs::File::from(master.try_clone().expect("dup master"));
    let mut writer = std::fs::File::from(master.try_clone().expect("dup master"));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut reader = reader;
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let mut term = Terminal {
        rx,
        screen: String::new(),
    };
    let mut type_line = |line: &str| {
        use std::io::Write;
        writer.write_all(line.as_bytes()).expect("type");
    };
    let log = || tail(&env.vk.logs(), 20);
    // A computed marker: neither the echoed line nor the prompt (its path
    // carries the random sandbox id) can contain it.
    type_line("echo tty=$(tty | cut -c1-8) done-$((6*7))\r");
    term.expect("done-42", log).await;
    assert!(
        term.screen.contains("tty=/dev/pts"),
        "a real terminal: {}",
        term.screen
    );
    type_line("stty size\r");
    term.expect("30 100", log).await;
    resize(&master, 40, 120);
    // kubectl notices the SIGWINCH, the agent resizes on a second relay.
    tokio::time::sleep(Duration::from_millis(500)).await;
    type_line("stty size\r");
    term.expect("40 120", log).await;
    type_line("exit 7\r");
    let status = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Some(st) = child.try_wait().expect("wait") {
                return st;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("kubectl ends with the shell");
    let screen = term.screen;
    assert_eq!(status.code(), Some(7), "{screen}");
    // The preamble (the guest shell's prompt and the injected line) never
    // shows.
    assert!(!screen.contains("printf"), "{screen}");
    drop(master);
    env.finish().await;
}

/// `kubectl port-forward` in the background; the local ports it listens on.
async fn port_forward(
    env: &Env,
    specs: &[&str],
    transport: &[(&str, &str)],
) -> tokio::process::Child {
    let mut child = tokio::process::Command::new(support::kubectl::path())
        .arg("--kubeconfig")
        .arg(&env.cluster.kubeconfig)
        .args(["-n", &env.ns, "port-forward", "pod/p"])
        .args(specs)
        .envs(transport.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl port-forward");
    let mut out = child.stdout.take().expect("stdout");
    let mut seen = String::new();
    let mut buf = [0u8; 1024];
    let want = specs.len();
    tokio::time::timeout(Duration::from_secs(30), async {
        while seen.matches("Forwarding from 127.0.0.1").count() < want {
            let n = out.read(&mut buf).await.expect("read kubectl");
            assert!(n > 0, "kubectl port-forward ended: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("kubectl port-forward not ready: {seen}"));
    // Keep draining ("Handling connection for …") so kubectl never blocks.
    tokio::spawn(async move { while out.read(&mut buf).await.is_ok_and(|n| n > 0) {} });
    child
}

async fn http_get(port: u16) -> String {
    let mut c = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    c.write_all(b"GET / HTTP/1.0\r\n\r\n").await.expect("send");
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(20), c.read_to_string(&mut out))
        .await
        .expect("an answer")
        .expect("read");
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn port_forward_and_stats() {
    let Some(env) = setup("vk-pf").await else {
        return;
    };
    let (a, b) = (support::process::free_port(), support::process::free_port());
    let pf = port_forward(&env, &[&format!("{a}:8080"), &format!("{b}:8081")], &[]).await;
    // An HTTP request through the first port.
    let answer = http_get(a).await;
    assert!(answer.starts_with("HTTP/1.0 200 OK"), "{answer}");
    assert!(answer.ends_with("hello from the guest\n"), "{answer}");
    // Two connections at once, each its own.
    let mut c1 = TcpStream::connect(("127.0.0.1", a)).await.expect("c1");
    let mut c2 = TcpStream::connect(("127.0.0.1", b)).await.expect("c2");
    c1.write_all(b"one-").await.expect("c1 write");
    c2.write_all(b"two-").await.expect("c2 write");
    c1.write_all(b"1").await.expect("c1 write");
    c2.write_all(b"2").await.expect("c2 write");
    let mut got = [0u8; 5];
    c2.read_exact(&mut got).await.expect("c2 echo");
    assert_eq!(&got, b"two-2");
    c1.read_exact(&mut got).await.expect("c1 echo");
    assert_eq!(&got, b"one-1");
    drop((c1, c2));
    // 64 MiB there and back, byte for byte.
    let size = 64 * 1024 * 1024;
    let data: Vec<u8> = (0..size)
        .map(|i: usize| (i * 31 + i / 7919) as u8)
        .collect();
    let c = TcpStream::connect(("127.0.0.1", b)).await.expect("connect");
    let (mut r, mut w) = c.into_split();
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        w.write_all(&sent).await.expect("send 64 MiB");
        w.shutdown().await.expect("half-close");
    });
    let mut back = Vec::with_capacity(size);
    tokio::time::timeout(Duration::from_secs(300), r.read_to_end(&mut back))
        .await
        .expect("64 MiB back within 5 minutes")
        .expect("read");
    writer.await.expect("writer");
    assert_eq!(back.len(), size);
    assert!(back == data, "the 64 MiB came back byte for byte");
    drop(pf);

    // The same over SPDY (kubectl's fallback, and other clients' protocol).
    let s = support::process::free_port();
    let pf = port_forward(&env, &[&format!("{s}:8080")], &[SPDY_PORT_FORWARD]).await;
    assert!(http_get(s).await.ends_with("hello from the guest\n"));
    drop(pf);

    // What metrics-server reads from a kubelet, read as it does: directly
    // (the apiserver's node proxy refuses loopback addresses), with a
    // token allowed nodes/stats and nodes/metrics.
    let role = support::rbac::grant(
        &env.cluster.client,
        &env.ns,
        "scraper",
        json!({"apiGroups": [""], "resources": ["nodes/stats", "nodes/metrics"], "verbs": ["get"]}),
    )
    .await;
    let token = support::rbac::sa_token(&env.cluster.client, &env.ns, "scraper").await;
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let kubelet = format!("https://127.0.0.1:{}", env.vk.process.kubelet_port);
    let summary: serde_json::Value = wait_for(
        "the summary as the scraper",
        Duration::from_secs(30),
        || async {
            let r = http
                .get(format!("{kubelet}/stats/summary"))
                .bearer_auth(&token)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if r.status() != reqwest::StatusCode::OK {
                return Err(format!(
                    "{}: {}",
                    r.status(),
                    r.text().await.unwrap_or_default()
                ));
            }
            r.json().await.map_err(|e| e.to_string())
        },
    )
    .await;
    let pod = summary["pods"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["podRef"]["name"] == "p"))
        .unwrap_or_else(|| panic!("pod p in {summary}"));
    let ws = pod["memory"]["workingSetBytes"]
        .as_u64()
        .expect("measured memory");
    assert!(ws > 0, "{pod}");
    assert_eq!(
        pod["containers"][0]["memory"]["workingSetBytes"].as_u64(),
        Some(ws)
    );
    assert!(pod.get("cpu").is_none(), "sandboxd measures no CPU: {pod}");
    let text = http
        .get(format!("{kubelet}/metrics/resource"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("metrics/resource")
        .text()
        .await
        .expect("text");
    assert!(
        text.lines().any(|l| l
            .starts_with("container_memory_working_set_bytes{container=\"agent\"")
            && l.contains("pod=\"p\"")
            && l.contains(&format!(" {ws}"))),
        "{text}"
    );
    support::rbac::revoke(&env.cluster.client, &role).await;
    env.finish().await;
}

/// metrics-server built from its Go module (e2e/metrics-server.sh), or
/// `None` (the reason printed) where it cannot be built here.
fn metrics_server_or_skip() -> Option<std::path::PathBuf> {
    let out = std::process::Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/e2e/metrics-server.sh"
    ))
    .arg("build")
    .stdin(std::process::Stdio::null())
    .stderr(std::process::Stdio::inherit())
    .output()
    .expect("run e2e/metrics-server.sh build");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match out.status.code() {
        Some(0) => Some(text.into()),
        Some(3) => {
            eprintln!("SKIPPED: kubectl top through metrics-server: {text}");
            None
        }
        _ => panic!("e2e/metrics-server.sh build: {:?} {text}", out.status),
    }
}

/// metrics-server as an aggregated API of the plane: the process on
/// loopback, an ExternalName Service naming `localhost`, the APIService
/// `v1beta1.metrics.k8s.io`. Dropping it deregisters the APIService first
/// (even when the test panics: a dead aggregated API would stall namespace
/// deletion for every other test), then stops the process.
struct MetricsServer {
    child: std::process::Child,
    kubeconfig: std::path::PathBuf,
    /// The ClusterRole and binding of its ServiceAccount.
    role: String,
}

const METRICS_API: &str = "v1beta1.metrics.k8s.io";

impl Drop for MetricsServer {
    fn drop(&mut self) {
        let _ = std::process::Command::new(support::kubectl::path())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["delete", "apiservice", METRICS_API, "--ignore-not-found"])
            .stdin(std::process::Stdio::null())
            .output();
        for kind in ["clusterrolebinding", "clusterrole"] {
            let _ = std::process::Command::new(support::kubectl::path())
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(["delete", kind, &self.role, "--ignore-not-found"])
                .stdin(std::process::Stdio::null())
                .output();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_metrics_server(env: &Env, bin: &std::path::Path) -> MetricsServer {
    let sa = "metrics-server";
    let _ = support::rbac::sa_token(&env.client(), &env.ns, sa).await;
    let role = support::rbac::grant(
        &env.client(),
        &env.ns,
        sa,
        json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}),
    )
    .await;
    let dir = support::vk::test_dir("metrics-server");
    let kubeconfig = support::rbac::token_kubeconfig(
        &env.client(),
        &env.cluster.kubeconfig,
        &env.ns,
        sa,
        &dir.join("kubeconfig"),
    )
    .await
    .expect("metrics-server's kubeconfig");
    let port = support::process::free_port();
    let log = std::fs::File::create(dir.join("metrics-server.log")).expect("log file");
    let child = std::process::Command::new(bin)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!(
            "--authentication-kubeconfig={}",
            kubeconfig.display()
        ))
        .arg(format!(
            "--authorization-kubeconfig={}",
            kubeconfig.display()
        ))
        .arg(format!("--cert-dir={}", dir.join("certs").display()))
        .args(["--bind-address=127.0.0.1", &format!("--secure-port={port}")])
        // vk-sandbox's serving certificate is self-signed; its address
        // (127.0.0.1) and kubelet port are the Node's status.
        .args([
            "--kubelet-insecure-tls",
            "--kubelet-preferred-address-types=InternalIP",
            "--kubelet-use-node-status-port",
            "--kubelet-request-timeout=5s",
            "--metric-resolution=10s",
        ])
        // Only this test's node: the plane may hold dead ones.
        .arg(format!(
            "--node-selector=kubernetes.io/hostname={}",
            env.vk.node
        ))
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .spawn()
        .expect("start metrics-server");
    let ms = MetricsServer {
        child,
        kubeconfig: env.cluster.kubeconfig.clone(),
        role,
    };
    // Registered only once it serves: an aggregated API that does not
    // answer stalls namespace deletion for the other tests meanwhile.
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .expect("client");
    wait_for(
        "metrics-server's /livez",
        Duration::from_secs(60),
        || async {
            let r = http
                .get(format!("https://127.0.0.1:{port}/livez"))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            (r.status() == reqwest::StatusCode::OK)
                .then_some(())
                .ok_or(r.status().to_string())
        },
    )
    .await;
    let manifest = format!(
        r#"{{"apiVersion": "v1", "kind": "Service",
  "metadata": {{"name": "metrics-server", "namespace": "{ns}"}},
  "spec": {{"type": "ExternalName", "externalName": "localhost"}}}}
---
{{"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
  "metadata": {{"name": "{METRICS_API}"}},
  "spec": {{"group": "metrics.k8s.io", "version": "v1beta1",
    "service": {{"namespace": "{ns}", "name": "metrics-server", "port": {port}}},
    "insecureSkipTLSVerify": true, "groupPriorityMinimum": 100, "versionPriority": 100}}}}
"#,
        ns = env.ns
    );
    let file = dir.join("apiservice.yaml");
    std::fs::write(&file, manifest).expect("write the manifests");
    let (ok, out) = support::kubectl::run(
        &env.cluster.kubeconfig,
        &["apply", "-f", file.to_str().expect("utf-8 path")],
    )
    .await;
    assert!(ok, "register metrics-server: {out}");
    ms
}

/// `kubectl top pod`, with metrics-server built from its Go module, scraping
/// vk-sandbox's `/metrics/resource` as it scrapes any kubelet.
#[tokio::test(flavor = "multi_thread")]
async fn kubectl_top_pod_through_metrics_server() {
    let Some(bin) = metrics_server_or_skip() else {
        return;
    };
    let Some(env) = setup("vk-top").await else {
        return;
    };
    let ms = start_metrics_server(&env, &bin).await;
    let line = wait_for("kubectl top pod p", Duration::from_secs(120), || async {
        let (ok, out) = support::kubectl::run(
            &env.cluster.kubeconfig,
            &["-n", &env.ns, "top", "pod", "p", "--no-headers"],
        )
        .await;
        if ok && out.starts_with("p ") {
            Ok(out)
        } else {
            Err(out)
        }
    })
    .await;
    eprintln!("kubectl top pod: {}", line.trim());
    let cols: Vec<&str> = line.split_whitespace().collect();
    // NAME CPU(cores) MEMORY(bytes): CPU is not measured (a constant
    // counter reads as 0), memory is sandboxd's figure for the VM.
    assert_eq!(cols.len(), 3, "{line}");
    assert_eq!(cols[1], "0m", "{line}");
    let mib: u64 = cols[2]
        .strip_suffix("Mi")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("memory in Mi: {line}"));
    let reply: serde_json::Value = reqwest::Client::new()
        .get(format!(
            "{}/v1/sandboxes/{}/stats",
            env.sim.base_url(),
            env.id
        ))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("sandboxd /stats")
        .json()
        .await
        .expect("sandboxd /stats JSON");
    let stats = reply["mem_used_bytes"].as_u64().expect("mem_used_bytes");
    let expected = stats / (1024 * 1024);
    assert!(
        mib == expected || mib == expected + 1,
        "kubectl top shows {mib} Mi; sandboxd measures {stats} bytes"
    );
    drop(ms);
    env.finish().await;
}

/// The resident set of process `pid`, in bytes (`VmRSS` of
/// /proc/PID/status).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// Finding 5 of the 2026-12-b review, measured on the vk-sandbox binary:
/// one port-forward session (the kubelet API over TLS, straight to the
/// node, as the apiserver would reach it) gets 100 000 RST_STREAMs for ids
/// never opened, then maximum-size DATA frames on 8 connections to a guest
/// port whose listener accepts and never reads. The process's RSS stays
/// within 20 MiB of its idle figure (it used to grow with every reset and
/// hold 16 frames of up to 1 MiB per stream).
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_against_one_port_forward_session_leaves_rss_flat() {
    let Some(env) = setup_with("vk-rss", &["--kubelet-auth=false"]).await else {
        return;
    };
    let pid = env.vk.process.pid();
    let port = env.vk.process.kubelet_port;
    const PF: [(&str, &str); 1] = [("X-Stream-Protocol-Version", "portforward.k8s.io")];
    let path = format!("/portForward/{}/p", env.ns);
    let c = std::sync::Arc::new(
        support::spdy::connect(port, "POST", &path, &PF)
            .await
            .unwrap_or_else(|h| panic!("upgrade: {}", h.text)),
    );
    // Idle: the session open, nothing sent yet.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            rss(pid)
        })
        .max()
        .expect("samples");
    let mut peak = idle;
    let mut sample = || {
        peak = peak.max(rss(pid));
    };
    // 100 000 resets of ids never opened.
    for i in 0..100_000u32 {
        c.reset(1_000_001 + 2 * i).await;
        if i % 10_000 == 0 {
            sample();
        }
    }
    // The session went through them all: a new connection still works
    // (client stream ids go on from 1: the server takes any id above the
    // last one it opened).
    let open_pair = |request: u32, guest: u16| {
        let c = std::sync::Arc::clone(&c);
        async move {
            let (p, r) = (guest.to_string(), request.to_string());
            let mut e = c
                .open(&[("streamType", "error"), ("port", &p), ("requestID", &r)])
                .await;
            assert_eq!(e.next().await, Some(support::spdy::Event::Reply));
            let mut d = c
                .open(&[("streamType", "data"), ("port", &p), ("requestID", &r)])
                .await;
            assert_eq!(d.next().await, Some(support::spdy::Event::Reply));
            (e, d)
        }
    };
    sample();
    // Maximum-size frames, 16 MiB per connection, to a guest that never
    // reads: the writers block once vk-sandbox stops taking them. (The
    // connections are opened first: once a stream's budget is spent the
    // session reads nothing more, new streams included.)
    let frame = vk_sandbox::spdy::session::MAX_INBOUND_FRAME;
    let mut held = Vec::new();
    for request in 0..8u32 {
        held.push(open_pair(request, 8082).await);
    }
    let mut writers = Vec::new();
    for (_, d) in &held {
        let (c2, id) = (std::sync::Arc::clone(&c), d.id);
        writers.push(tokio::spawn(async move {
            let data = vec![0x5a; 16 * 1024 * 1024];
            c2.write_frames(id, &data, frame).await;
        }));
        sample();
    }
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        sample();
    }
    assert!(
        writers.iter().any(|w| !w.is_finished()),
        "vk-sandbox pushes back: the client's writes are blocked"
    );
    let metrics = env.vk.metrics().await;
    let queued: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("vk_sandbox_streaming_queued_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the queued-bytes gauge");
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    eprintln!(
        "RSS idle {:.1} MiB, peak {:.1} MiB (+{:.1} MiB); queued {:.0} KiB",
        mib(idle),
        mib(peak),
        mib(peak.saturating_sub(idle)),
        queued / 1024.0
    );
    assert!(
        queued > 0.0 && queued <= 1024.0 * 1024.0,
        "the session holds data, within its 1 MiB budget: {queued}"
    );
    assert!(
        peak <= idle + 20 * 1024 * 1024,
        "RSS grew from {:.1} to {:.1} MiB",
        mib(idle),
        mib(peak)
    );
    for w in writers {
        w.abort();
    }
    drop(held);
    env.finish().await;
}
