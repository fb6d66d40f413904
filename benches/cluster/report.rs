//! The report of `make bench`: one Markdown table of the figures the runs
//! took (benches/cluster.rs) and the claims-store medians Criterion left in
//! target/criterion, with the machine it ran on and the targets met or
//! missed; written between the markers of docs/benchmarks.md.

use std::fmt::Write as _;
use std::process::Command;

use serde_json::Value;

use super::support::controller;
use super::{BurstResult, HistQ, Load, MIB, Quantiles, Startup, env_scale, median, only, repo};

/// Median (ns) of a Criterion benchmark's last run.
fn criterion_median(id: &str) -> Option<f64> {
    let path = repo()
        .join("target/criterion")
        .join(id)
        .join("new/estimates.json");
    let v: Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    v["median"]["point_estimate"].as_f64()
}

/// What the figures were taken on.
fn machine() -> Vec<(String, String)> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown".to_string(), |(_, m)| m.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or("unknown".to_string(), |kb| {
            format!("{:.1} GiB", kb / 1024.0 / 1024.0)
        });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let rev = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(repo())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let k8s = std::fs::read_to_string(repo().join("e2e/k8s-version")).unwrap_or_default();
    vec![
        (
            "date".into(),
            jiff::Zoned::now().strftime("%Y-%m-%d %H:%M %Z").to_string(),
        ),
        ("CPU".into(), format!("{model}, {cores} cores")),
        ("memory".into(), mem),
        ("kernel".into(), kernel.trim().to_string()),
        (
            "vk-sandbox".into(),
            match std::env::var("BENCH_VK_BIN") {
                Ok(bin) if bin.ends_with("target/bench-bin/vk-sandbox") => {
                    format!("static musl release build (as shipped), revision {rev}")
                }
                Ok(bin) => format!("{bin} (BENCH_VK_BIN), tree at revision {rev}"),
                Err(_) => format!("release build (glibc), revision {rev}"),
            },
        ),
        (
            "control plane".into(),
            format!(
                "local etcd + kube-apiserver {} (e2e/cluster.sh), sandboxd simulator in the bench process",
                k8s.trim()
            ),
        ),
        (
            "Sandbox controller".into(),
            controller::describe(controller::kind())
                .trim_start_matches("Sandbox controller: ")
                .to_string(),
        ),
        ("BENCH_SCALE".into(), format!("{}", env_scale())),
    ]
}

fn ms(v: f64) -> String {
    if v.is_nan() {
        "–".into()
    } else if v < 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.0}")
    }
}

fn bucket_ms(q: Option<(f64, f64, f64)>) -> String {
    match q {
        Some((_, lo, hi)) if hi.is_infinite() => format!("> {}", ms(lo * 1e3)),
        Some((v, lo, hi)) => format!("{} ({}–{})", ms(v * 1e3), ms(lo * 1e3), ms(hi * 1e3)),
        None => "–".into(),
    }
}

fn met(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "inconclusive",
    }
}

/// Everything one run measured.
pub struct Report {
    /// One status write's round trip.
    pub rtt: Quantiles,
    /// Each claim-path scenario with its repeated runs.
    pub rows: Vec<(String, Vec<BurstResult>)>,
    /// (moment, VmRSS, VmHWM) of the vk-sandbox process.
    pub memory: Vec<(String, f64, f64)>,
    pub startup: Option<Startup>,
    pub load: Option<Load>,
}

/// Median across repeats of each figure.
fn med(rs: &[BurstResult], f: impl Fn(&BurstResult) -> f64) -> f64 {
    median(rs.iter().map(f).collect())
}

fn med_hist(rs: &[BurstResult], f: impl Fn(&BurstResult) -> HistQ) -> HistQ {
    let mut v: Vec<(f64, f64, f64)> = rs.iter().filter_map(f).collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v.get(v.len() / 2).copied()
}

/// The Markdown table of `r`.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| Machine | |\n|---|---|");
    for (k, v) in machine() {
        let _ = writeln!(s, "| {k} | {v} |");
    }

    let _ = writeln!(
        s,
        "\n### Claim path: Pod bound → Running stored (ms; median of the runs' figures)\n\n\
         One apiserver status write round trip (admin `patch_status`, median of 20): **{} ms** (p90 {}).\n\n\
         | scenario | runs | Pods | bind→Running p50 | p90 | p99 | max | provider p50 | provider p99 | rest p50 | Running/s | releases/s |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|",
        ms(r.rtt.p50),
        ms(r.rtt.p90)
    );
    for (name, rs) in &r.rows {
        let p50 = med(rs, |b| b.e2e.p50);
        let prov = med_hist(rs, |b| b.provider_p50);
        // Medians of two distributions do not subtract exactly; a negative
        // difference (bursts: the provider's queueing dominates) is shown as –.
        let rest = prov.map_or(f64::NAN, |(v, _, _)| p50 - v * 1e3);
        let rest = if rest < 0.0 { f64::NAN } else { rest };
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {} |",
            rs.len(),
            rs.first().map_or(0, |b| b.n),
            ms(p50),
            ms(med(rs, |b| b.e2e.p90)),
            ms(med(rs, |b| b.e2e.p99)),
            ms(med(rs, |b| b.e2e.max)),
            bucket_ms(prov),
            bucket_ms(med_hist(rs, |b| b.provider_p99)),
            ms(rest),
            med(rs, |b| b.running_per_s),
            {
                let v = med(rs, |b| b.releases_per_s);
                if v.is_nan() {
                    "–".to_string()
                } else {
                    format!("{v:.0}")
                }
            },
        );
    }
    let _ = writeln!(
        s,
        "\nbind = the Pod's first watch event (created with `spec.nodeName` set); Running = the watch \
         event carrying `status.phase=Running`. Provider = vk-sandbox's \
         `vk_sandbox_claim_provider_seconds` (reconcile start → Running status write sent: sandboxd \
         claim and claims-store commit included), interpolated inside its bucket (bucket bounds in \
         brackets); rest = bind→Running p50 − provider p50 (watch delivery to vk-sandbox, queueing \
         before the reconcile, the status write's round trip, watch delivery to the observer). Running/s: Pods / (last Running − \
         first bound); releases/s: released sandboxes / (delete call → last release), bare Pods \
         deleted 64 at a time."
    );

    let _ = writeln!(
        s,
        "\n#### What the provider's share is made of (vk-sandbox's histograms, ms)\n\n\
         | scenario | Pods | provider p50 | provider p99 | sandboxd claim p50 | sandboxd claim p99 | claims-store batch p50 | batch p99 |\n\
         |---|---|---|---|---|---|---|---|"
    );
    for (name, rs) in &r.rows {
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} | {} | {} | {} | {} |",
            rs.first().map_or(0, |b| b.n),
            bucket_ms(med_hist(rs, |b| b.provider_p50)),
            bucket_ms(med_hist(rs, |b| b.provider_p99)),
            bucket_ms(med_hist(rs, |b| b.sandboxd.p50)),
            bucket_ms(med_hist(rs, |b| b.sandboxd.p99)),
            bucket_ms(med_hist(rs, |b| b.store.p50)),
            bucket_ms(med_hist(rs, |b| b.store.p99)),
        );
    }
    let _ = writeln!(
        s,
        "\nsandboxd claim = `vk_sandbox_sandboxd_request_duration_seconds{{endpoint=\"claim\"}}` \
         (the HTTP call as vk-sandbox sees it; the simulator runs in the bench process on a \
         runtime thread of its own); claims-store batch = \
         `vk_sandbox_claims_store_write_duration_seconds` (one journal append + fsync, shared by \
         the commits waiting at that moment). The provider's own code is what is left."
    );

    let _ = writeln!(
        s,
        "\n### Claims store: one commit, fsync included (Criterion medians)\n\n\
         | claims held | commit (journal) | whole-table rewrite (Go) | rewrite ÷ commit |\n|---|---|---|---|"
    );
    for n in [0u64, 1_000, 10_000, 100_000] {
        let one = criterion_median(&format!("claims_commit/one/{n}"));
        let go = criterion_median(&format!("claims_commit/go_rewrite/{n}"));
        let fmt = |v: Option<f64>| v.map_or("–".to_string(), |ns| format!("{} ms", ms(ns / 1e6)));
        let ratio = match (one, go) {
            (Some(a), Some(b)) => format!("{:.1}×", b / a),
            _ => "–".into(),
        };
        let _ = writeln!(s, "| {n} | {} | {} | {ratio} |", fmt(one), fmt(go));
    }
    let conc = criterion_median("claims_commit/concurrent32/1000");
    let _ = writeln!(
        s,
        "| 32 concurrent commits, 1000 held | {} for all 32 ({} per commit) | | |",
        conc.map_or("–".into(), |ns| format!("{} ms", ms(ns / 1e6))),
        conc.map_or("–".into(), |ns| format!("{} ms", ms(ns / 32.0 / 1e6))),
    );

    let _ = writeln!(
        s,
        "\n### Memory of the vk-sandbox process\n\n| moment | VmRSS | VmHWM |\n|---|---|---|"
    );
    for (k, rss, hwm) in &r.memory {
        let _ = writeln!(s, "| {k} | {:.1} MiB | {:.1} MiB |", rss / MIB, hwm / MIB);
    }

    if let Some(st) = &r.startup {
        let _ = writeln!(
            s,
            "\n### Start-up with {} persisted claims\n\n\
             | case | process start → ready | → every Pod done | pods/status writes | sandboxd list calls |\n\
             |---|---|---|---|---|\n\
             | Go claims.json, Pods without status (every Pod re-published) | {:.2} s (Node Ready) | {:.2} s (Running stored) | {} | {:.0} |\n\
             | restart (SIGTERM, start again) over those Pods, Running already | {:.2} s (`/readyz`) | {:.2} s (every Pod reconciled) | {:.0} | – |",
            st.n,
            st.ready_s,
            st.running_s,
            st.n,
            st.sandboxd_lists,
            st.restart_ready_s,
            st.restart_resumed_s,
            st.restart_status_writes
        );
    }

    match &r.load {
        Some(l) => {
            let _ = writeln!(
                s,
                "\n### Apiserver load (audit log of a dedicated apiserver, vk-sandbox's ServiceAccount only)\n\n\
                 Per Pod lifecycle (Sandbox created → the Sandbox controller's Pod Running → Sandbox \
                 deleted → released → Pod gone; {} lifecycles): **{:.2} writes** per Pod.\n\n| request | per Pod |\n|---|---|",
                l.lifecycles, l.writes_per_pod
            );
            for (k, v) in &l.per_pod {
                let _ = writeln!(s, "| {k} | {v:.2} |");
            }
            let _ = writeln!(
                s,
                "\nIdle ({:.1} min, no Pods): **{:.1} requests/min**; LISTs at start-up: {}, after start-up: **{}**.\n\n| request | per minute |\n|---|---|",
                l.idle_minutes, l.idle_total_per_min, l.lists_at_start, l.lists_after_start
            );
            for (k, v) in &l.idle_per_min {
                let _ = writeln!(s, "| {k} | {v:.1} |");
            }
        }
        None => {
            let _ = writeln!(
                s,
                "\n### Apiserver load\n\nnot measured (BENCH_AUDIT unset: run through `make bench`)."
            );
        }
    }

    // Targets.
    let burst500 = r
        .rows
        .iter()
        .find(|(n, rs)| {
            n.starts_with("burst") && n.contains("0 µs") && rs.first().is_some_and(|b| b.n == 500)
        })
        .or_else(|| {
            r.rows
                .iter()
                .find(|(n, _)| n.starts_with("burst") && n.contains("0 µs"))
        });
    let prov99 = burst500.and_then(|(_, rs)| med_hist(rs, |b| b.provider_p99));
    let prov_ok = prov99.map(|(v, lo, hi)| {
        if hi <= 0.002 {
            true
        } else if lo >= 0.002 {
            false
        } else {
            v < 0.002
        }
    });
    let idle0 = r
        .rows
        .iter()
        .find(|(n, _)| n.starts_with("idle") && n.contains("0 µs"));
    let idle_p50 = idle0.map(|(_, rs)| med(rs, |b| b.e2e.p50));
    let one0 = criterion_median("claims_commit/one/0");
    let one100k = criterion_median("claims_commit/one/100000");
    let one10k = criterion_median("claims_commit/one/10000");
    let go10k = criterion_median("claims_commit/go_rewrite/10000");
    let hold = r.memory.iter().find(|(k, _, _)| k.starts_with("holding"));
    let _ = writeln!(s, "\n### Targets\n\n| target | measured | |\n|---|---|---|");
    let rows: Vec<(String, String, Option<bool>)> = vec![
        (
            format!(
                "provider overhead p99 < 2 ms at a {}-Pod burst",
                burst500.and_then(|(_, rs)| rs.first()).map_or(0, |b| b.n)
            ),
            bucket_ms(prov99) + " ms",
            prov_ok,
        ),
        (
            "bind→Running p50 ≤ 2 × one status write at idle".into(),
            format!(
                "{} ms vs 2 × {} ms",
                idle_p50.map_or("–".into(), ms),
                ms(r.rtt.p50)
            ),
            idle_p50.map(|p| p <= 2.0 * r.rtt.p50),
        ),
        (
            "commit at 100 000 claims ≤ 1.5 × commit at 0".into(),
            match (one100k, one0) {
                (Some(a), Some(b)) => format!("{:.2}×", a / b),
                _ => "–".into(),
            },
            one100k.zip(one0).map(|(a, b)| a <= 1.5 * b),
        ),
        (
            "commit ≥ 10 × cheaper than the whole-table rewrite at 10 000".into(),
            match (go10k, one10k) {
                (Some(a), Some(b)) => format!("{:.1}×", a / b),
                _ => "–".into(),
            },
            go10k.zip(one10k).map(|(a, b)| a >= 10.0 * b),
        ),
        (
            format!(
                "RSS < 40 MiB holding {} Pods",
                hold.map_or(0, |_| r
                    .rows
                    .iter()
                    .flat_map(|(_, rs)| rs.iter().map(|b| b.n))
                    .max()
                    .unwrap_or(0))
            ),
            hold.map_or("–".into(), |(_, rss, hwm)| {
                format!("RSS {:.1} MiB, HWM {:.1} MiB", rss / MIB, hwm / MIB)
            }),
            hold.map(|(_, rss, hwm)| rss.max(*hwm) < 40.0 * MIB),
        ),
        (
            "≤ 6 apiserver writes per Pod lifecycle".into(),
            r.load
                .as_ref()
                .map_or("–".into(), |l| format!("{:.2}", l.writes_per_pod)),
            r.load.as_ref().map(|l| l.writes_per_pod <= 6.0),
        ),
        (
            "zero LISTs after start-up".into(),
            r.load
                .as_ref()
                .map_or("–".into(), |l| l.lists_after_start.to_string()),
            r.load.as_ref().map(|l| l.lists_after_start == 0),
        ),
        (
            format!(
                "start-up with {} claims to all Running < 10 s",
                r.startup.as_ref().map_or(0, |s| s.n)
            ),
            r.startup
                .as_ref()
                .map_or("–".into(), |s| format!("{:.2} s", s.running_s)),
            r.startup.as_ref().map(|s| s.running_s < 10.0),
        ),
    ];
    for (t, m, ok) in rows {
        let _ = writeln!(s, "| {t} | {m} | {} |", met(ok));
    }
    s
}

const BEGIN: &str = "<!-- bench:begin (written by `make bench`; edits inside are lost) -->";
const END: &str = "<!-- bench:end -->";

/// Writes `table` between the markers of the file `BENCH_DOC` names
/// (default docs/benchmarks.md, or none when `BENCH_ONLY` picks parts;
/// `-`: none), keeping the prose around them.
pub fn write_doc(table: &str) {
    let default = if only().is_some() {
        "-"
    } else {
        "docs/benchmarks.md"
    };
    let target = std::env::var("BENCH_DOC").unwrap_or_else(|_| default.into());
    if target == "-" {
        return;
    }
    let path = repo().join(target);
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let block = format!("{BEGIN}\n{table}{END}");
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if e > b => format!("{}{block}{}", &old[..b], &old[e + END.len()..]),
        _ => format!("# Benchmarks\n\n`make bench` measured:\n\n{block}\n"),
    };
    match std::fs::write(&path, new) {
        Ok(()) => eprintln!("bench: wrote {}", path.display()),
        Err(e) => eprintln!("bench: cannot write {}: {e}", path.display()),
    }
}
