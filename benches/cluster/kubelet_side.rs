//! `BENCH_ONLY=kubelet`: a sandbox Pod on vk-sandbox side by side with a
//! container Pod on a real kubelet (e2e/real-node.sh: the kubelet of the
//! plane's release with Debian's containerd and runc), on the same
//! apiserver, in one run.
//!
//! Both sides: a burst of `n` Pods created bound (`spec.nodeName` set, so
//! creation is the binding) and timed from their first watch event to
//! `phase=Running`, then deleted; `kubectl exec -- true` round trips,
//! interleaved; `kubectl logs` answers; `kubectl port-forward` throughput
//! into a counting sink (`sink.c` in the container, the bench's own sink
//! behind the sandbox's guest port); the node agent's CPU time per Pod
//! lifecycle and its RSS per Running Pod. No image is pulled on either
//! side: the container runs Debian's busybox-static, imported.
//!
//! The node agent: vk-sandbox's process; for the real node the kubelet,
//! containerd and the Pods' containerd shims (the processes whose command
//! line names the node's folder). A shim's CPU is read while its Pod runs
//! (shims are reparented to init, so what they spend while their Pod is
//! torn down is not seen): the real node's CPU is a lower bound.

use std::path::Path;

use super::*;

/// Transfers per side through one port-forward, alternated between the
/// sides; the figure is their median.
const PF_ROUNDS: usize = 5;

/// The container's sink port and the sandbox's guest port of the sink.
const SINK_PORT: u16 = 9000;
const BUSYBOX: &str = "vk-sandbox.test/busybox:debian";

pub const CONTAINER: &str = "container Pod, real kubelet + containerd";
pub const SANDBOX: &str = "sandbox Pod, vk-sandbox + sandboxd simulator";

/// What one side measured.
pub struct Side {
    pub label: &'static str,
    /// First event → Running (ms), the burst's Pods.
    pub running: Quantiles,
    /// `kubectl exec -- true` (ms).
    pub exec: Quantiles,
    /// `kubectl logs` (ms), and its answer (`ok`, or the refusal).
    pub logs: (Quantiles, String),
    /// `kubectl port-forward`, `mib` MiB one way, the median of
    /// [`PF_ROUNDS`] alternated with the other side's (MiB/s).
    pub pf: f64,
    /// The node agent's CPU time per Pod lifecycle (ms).
    pub cpu_ms_per_pod: f64,
    /// The node agent's RSS per Running Pod (MiB): with the burst Running
    /// less before it.
    pub rss_mib_per_pod: f64,
}

pub struct KubeletFigures {
    pub sides: Vec<Side>,
    pub n: usize,
    pub execs: usize,
    pub mib: usize,
}

impl KubeletFigures {
    fn side(&self, label: &str) -> Option<&Side> {
        self.sides.iter().find(|s| s.label == label)
    }

    /// (sandbox, container) of one figure.
    fn pair(&self, f: impl Fn(&Side) -> f64) -> Option<(f64, f64)> {
        Some((f(self.side(SANDBOX)?), f(self.side(CONTAINER)?)))
    }

    pub fn render(&self, s: &mut String) {
        use std::fmt::Write as _;
        let _ = writeln!(
            s,
            "\n### Side by side with a real kubelet (same apiserver, one run)\n\n\
             | | {CONTAINER} | {SANDBOX} |\n|---|---|---|"
        );
        let row = |s: &mut String, what: String, f: &dyn Fn(&Side) -> String| {
            let cells: Vec<String> = [CONTAINER, SANDBOX]
                .iter()
                .map(|l| self.side(l).map_or("–".into(), f))
                .collect();
            let _ = writeln!(s, "| {what} | {} | {} |", cells[0], cells[1]);
        };
        let q = |q: &Quantiles| format!("{:.1} / {:.1} ms", q.p50, q.p99);
        row(
            s,
            format!("bind → Running, burst of {} (p50 / p99)", self.n),
            &|d| q(&d.running),
        );
        row(
            s,
            format!("`kubectl exec -- true`, {} each (p50 / p99)", self.execs),
            &|d| q(&d.exec),
        );
        row(s, "`kubectl logs` answered (p50 / p99)".into(), &|d| {
            let (t, answer) = &d.logs;
            if answer == "ok" {
                q(t)
            } else {
                format!("{} ({answer})", q(t))
            }
        });
        row(
            s,
            format!(
                "`kubectl port-forward`, {} MiB one way (median of {PF_ROUNDS}, alternated)",
                self.mib
            ),
            &|d| format!("{:.0} MiB/s", d.pf),
        );
        row(s, "node agent CPU per Pod lifecycle".into(), &|d| {
            format!("{:.1} ms", d.cpu_ms_per_pod)
        });
        row(s, "node agent RSS per Running Pod".into(), &|d| {
            format!("{:.2} MiB", d.rss_mib_per_pod)
        });
    }

    /// What each side's exec takes beyond what any `kubectl` call pays on
    /// the machine (the same side's `kubectl logs` p50: a new process, its
    /// TLS to the apiserver, one request to the node), and the ratio of
    /// those: the floor alone can keep the end-to-end ratio above ½.
    fn beyond_kubectl(&self) -> String {
        let beyond = |d: &Side| d.exec.p50 - d.logs.0.p50;
        let floor = self.pair(|d| d.logs.0.p50);
        match (self.pair(beyond), floor) {
            (Some((s, c)), Some((fs, fc))) if c > 0.0 => format!(
                " (beyond kubectl's own floor, its `kubectl logs` p50, {fs:.1} ms for the sandbox \
                 and {fc:.1} ms for the container: {s:.1} vs {c:.1} ms, {:.2}×)",
                s / c
            ),
            _ => String::new(),
        }
    }

    pub fn goals(&self) -> Vec<(String, String, Option<bool>)> {
        let running = self.pair(|d| d.running.p50);
        let exec = self.pair(|d| d.exec.p50);
        let pf = self.pair(|d| d.pf);
        let ratio = |p: Option<(f64, f64)>| p.map(|(s, c)| s / c);
        let shown = |r: Option<f64>| r.map_or("–".into(), |r| format!("{r:.2}×"));
        vec![
            (
                "bind → Running p50: sandbox Pod ≤ ⅕ of a container Pod's (real kubelet)".into(),
                shown(ratio(running)),
                ratio(running).map(|r| r <= 0.2),
            ),
            (
                "`kubectl exec` p50: sandbox Pod ≤ ½ of a container Pod's (real kubelet)".into(),
                format!("{}{}", shown(ratio(exec)), self.beyond_kubectl()),
                ratio(exec).map(|r| r <= 0.5),
            ),
            (
                "port-forward throughput: sandbox Pod ≥ a container Pod's (real kubelet)".into(),
                shown(ratio(pf)),
                ratio(pf).map(|r| r >= 1.0),
            ),
        ]
    }
}

/// A busybox container on the real node, its network the CNI's.
fn container_pod(name: &str, node: &str, command: &[&str], ext: &Path) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "enableServiceLinks": false,
            "containers": [{"name": "c", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": command,
                "ports": [{"containerPort": SINK_PORT}],
                "volumeMounts": [{"name": "ext", "mountPath": "/ext", "readOnly": true}]}],
            "volumes": [{"name": "ext", "hostPath": {"path": ext.display().to_string(), "type": "Directory"}}],
        },
    }))
    .unwrap_or_else(|e| die(&format!("container Pod json: {e}")))
}

/// Each process's CPU time so far (ms), from /proc/PID/stat.
fn cpu_ms(pids: &[u32]) -> HashMap<u32, f64> {
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    pids.iter()
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // After the command's closing parenthesis come fields 3.. of
            // proc(5): utime and stime, the 14th and 15th, are at 11, 12.
            let rest = stat.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
            Some((*pid, (ticks(11)? + ticks(12)?) / tick * 1000.0))
        })
        .collect()
}

/// The processes' summed VmRSS (bytes).
fn rss(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let kb = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()?;
            Some(kb * 1024.0)
        })
        .sum()
}

/// CPU spent between readings taken in order: each process's last reading
/// less its first (0 for one that appeared after the first), so a process
/// that ended between readings counts up to its last one.
fn cpu_spent(readings: &[HashMap<u32, f64>]) -> f64 {
    let mut first: HashMap<u32, f64> = HashMap::new();
    let mut last: HashMap<u32, f64> = HashMap::new();
    for (i, r) in readings.iter().enumerate() {
        for (pid, ms) in r {
            if i == 0 {
                first.insert(*pid, *ms);
            }
            last.insert(*pid, *ms);
        }
    }
    last.iter()
        .map(|(pid, ms)| ms - first.get(pid).copied().unwrap_or(0.0))
        .sum()
}

/// The real node's agent processes: kubelet, containerd, shims.
fn node_agent_pids() -> Vec<u32> {
    let dir =
        std::env::var("VK_REAL_NODE_DIR").unwrap_or_else(|_| "/tmp/vk-sandbox-real-node".into());
    let needle = format!("{dir}/");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(&needle)
            })
        })
        .collect()
}

/// A burst of `pods` created bound, Running, deleted and gone: (first
/// event → Running quantiles, agent CPU ms per Pod, agent RSS per Pod).
async fn burst(
    api: &Api<Pod>,
    rec: &Recorder,
    pods: Vec<Pod>,
    agent: &dyn Fn() -> Vec<u32>,
    what: &str,
) -> (Quantiles, f64, f64) {
    let n = pods.len();
    let names: Vec<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let before = agent();
    let (cpu0, rss0) = (cpu_ms(&before), rss(&before));
    create_pods(api, pods, 64).await;
    if !rec
        .wait_all(&names, Duration::from_secs(600), |t| t.running.is_some())
        .await
    {
        die(&format!(
            "{what}: the burst's Pods not all Running in 10 minutes"
        ));
    }
    // Read while every Pod runs: the shims' CPU so far, and the RSS.
    let running = agent();
    let (cpu1, rss1) = (cpu_ms(&running), rss(&running));
    delete_pods(api, &names, 64, what).await;
    if !rec
        .wait_all(&names, Duration::from_secs(600), |t| t.gone.is_some())
        .await
    {
        die(&format!(
            "{what}: the burst's Pods not all gone in 10 minutes"
        ));
    }
    let cpu2 = cpu_ms(&agent());
    let cpu = cpu_spent(&[cpu0, cpu1, cpu2]);
    let times = rec.snapshot(&names);
    let ms: Vec<f64> = times
        .iter()
        .filter_map(|t| Some(t.running?.duration_since(t.seen?).as_secs_f64() * 1000.0))
        .collect();
    (
        quantiles(ms),
        cpu / n as f64,
        (rss1 - rss0) / n as f64 / (1024.0 * 1024.0),
    )
}

/// Round trips of `kubectl ARGS` (`POD` replaced) on each Pod in turn, `n`
/// each: by Pod, in the order given, the quantiles and the answer (`ok`,
/// or the error's first line: a refusal is an answer too, timed alike).
async fn interleaved(
    env: &Env,
    ns: &str,
    pods: &[&str],
    n: usize,
    args: &[&str],
) -> Vec<(Quantiles, String)> {
    let mut ms: Vec<Vec<f64>> = vec![Vec::with_capacity(n); pods.len()];
    let mut answers = vec![String::from("ok"); pods.len()];
    for _ in 0..n {
        for (i, pod) in pods.iter().enumerate() {
            let mut all = vec!["-n", ns];
            all.extend(args.iter().map(|a| if *a == "POD" { *pod } else { *a }));
            let (t, answer) =
                super::stream::timed_kubectl_answer(&env.cluster.kubeconfig, &all).await;
            ms[i].push(t);
            if let Err(e) = answer {
                answers[i] = e.lines().next().unwrap_or_default().to_string();
            }
        }
    }
    ms.into_iter().map(quantiles).zip(answers).collect()
}

/// The sink, built static (the busybox image has no C library), in `ext`.
fn build_sink(ext: &Path) -> Result<(), String> {
    let out = std::process::Command::new("musl-gcc")
        .args(["-O2", "-static", "-s", "-o"])
        .arg(ext.join("sink"))
        .arg(repo().join("benches/cluster/sink.c"))
        .output()
        .map_err(|e| format!("musl-gcc (Debian package musl-tools): {e}"))?;
    out.status
        .success()
        .then_some(())
        .ok_or_else(|| format!("musl-gcc: {}", String::from_utf8_lossy(&out.stderr)))
}

pub async fn run(env: &Env, n: usize, execs: usize, mib: usize) -> Option<KubeletFigures> {
    let node = support::real_node::RealNode::up_or_skip("bench: the real-kubelet comparison")?;
    let ext = env.dir.join("kubelet-side");
    std::fs::create_dir_all(&ext).unwrap_or_else(|e| die(&format!("{}: {e}", ext.display())));
    if let Err(e) = build_sink(&ext) {
        eprintln!("bench: the real-kubelet comparison skipped: {e}");
        return None;
    }
    let busybox = ext.join("busybox.tar");
    support::real_node::build_image(&["busybox", &busybox.display().to_string(), BUSYBOX], &[]);
    node.import(&[&busybox]);

    let mut cfg = support::sim::config(TOKEN, &[&format!("{TEMPLATE}={}", n.min(200))]);
    cfg.wake_delay_ms = 0;
    let sink = super::stream::sized_sink().await;
    support::sim::lead_template_ports(&mut cfg, TEMPLATE, &[(SINK_PORT, sink.port())]);
    let sim = start_sim_cfg(cfg).await;
    let vnode = format!("bench-kubelet-{}", support::suffix());
    let vk = Vk::start(env, &vnode, &sim, &env.sa_kubeconfig, None);
    vk.wait_ready(&env.cluster.client, Duration::from_secs(60))
        .await;
    let ns = env.cluster.namespace("bench-kubelet").await;
    let api: Api<Pod> = Api::namespaced(env.cluster.client.clone(), &ns);
    let rec = Recorder::start(&env.cluster.client, &ns).await;

    // The bursts: the real node first, then vk-sandbox.
    let idle = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"];
    let containers: Vec<Pod> = (0..n)
        .map(|i| container_pod(&format!("c-{i}"), &node.name, &idle, &ext))
        .collect();
    let (c_running, c_cpu, c_rss) =
        burst(&api, &rec, containers, &node_agent_pids, "container burst").await;
    let vk_pid = vk.process.pid();
    let sandboxes: Vec<Pod> = (0..n)
        .map(|i| pod(&format!("s-{i}"), &vnode, None))
        .collect();
    let (s_running, s_cpu, s_rss) =
        burst(&api, &rec, sandboxes, &|| vec![vk_pid], "sandbox burst").await;

    eprintln!(
        "bench: kubelet side: bind → Running p50 {:.1} ms (containers) vs {:.1} ms (sandboxes); CPU per Pod {c_cpu:.1} vs {s_cpu:.1} ms; RSS per Pod {c_rss:.2} vs {s_rss:.2} MiB",
        c_running.p50, s_running.p50
    );
    // One Pod each for exec, logs and port-forward.
    let probes = [
        container_pod("c-probe", &node.name, &["/ext/sink", "9000"], &ext),
        pod("s-probe", &vnode, None),
    ];
    let names = ["c-probe".to_string(), "s-probe".to_string()];
    create_pods(&api, probes.to_vec(), 2).await;
    if !rec
        .wait_all(&names, Duration::from_secs(120), |t| t.running.is_some())
        .await
    {
        die("the probe Pods not Running in 2 minutes");
    }
    let order = ["c-probe", "s-probe"];
    let exec = interleaved(env, &ns, &order, execs, &["exec", "POD", "--", "true"]).await;
    if let Some((_, e)) = exec.iter().find(|(_, a)| a != "ok") {
        die(&format!("kubectl exec failed: {e}"));
    }
    eprintln!(
        "bench: kubelet side: kubectl exec p50 {:.1} ms (container) vs {:.1} ms (sandbox)",
        exec[0].0.p50, exec[1].0.p50
    );
    let logs = interleaved(env, &ns, &order, 20, &["logs", "POD"]).await;
    // One port-forward per Pod, their transfers alternated so that what
    // else the machine does falls on both sides alike.
    let forwards: Vec<super::stream::KubectlPf> = order
        .iter()
        .map(|pod| super::stream::KubectlPf::start(&env.cluster.kubeconfig, &ns, pod, SINK_PORT))
        .collect();
    let mut pf_runs: Vec<Vec<f64>> = vec![Vec::new(); order.len()];
    for _ in 0..PF_ROUNDS {
        for (runs, forward) in pf_runs.iter_mut().zip(&forwards) {
            runs.push(forward.push(mib, true).await);
        }
    }
    drop(forwards);
    eprintln!(
        "bench: kubelet side: port-forward MiB/s, alternated: container {:.0?}, sandbox {:.0?}",
        pf_runs[0], pf_runs[1]
    );
    let pf: Vec<f64> = pf_runs.into_iter().map(median).collect();
    let [(c_exec, _), (s_exec, _)] =
        <[(Quantiles, String); 2]>::try_from(exec).unwrap_or_else(|_| die("exec quantiles"));
    let [c_logs, s_logs] =
        <[(Quantiles, String); 2]>::try_from(logs).unwrap_or_else(|_| die("logs quantiles"));

    env.cluster.drop_namespace(&ns).await;
    vk.delete_node(&env.cluster.client).await;
    drop(vk);
    let (ok, report) = node.down();
    if !ok {
        eprintln!("bench: the real node's teardown left the host changed:\n{report}");
    }
    Some(KubeletFigures {
        sides: vec![
            Side {
                label: CONTAINER,
                running: c_running,
                exec: c_exec,
                logs: c_logs,
                pf: pf[0],
                cpu_ms_per_pod: c_cpu,
                rss_mib_per_pod: c_rss,
            },
            Side {
                label: SANDBOX,
                running: s_running,
                exec: s_exec,
                logs: s_logs,
                pf: pf[1],
                cpu_ms_per_pod: s_cpu,
                rss_mib_per_pod: s_rss,
            },
        ],
        n,
        execs,
        mib,
    })
}
