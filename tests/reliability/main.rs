//! The reliability suite: scenarios that try to make vk-sandbox
//! release a VM whose owner lives, leak one whose owner is gone, or lose a
//! release credential, on the real local control plane + the sandboxd
//! simulator, with invariants checked after each and a report table.
//!
//! `VK_RELIABILITY=short` (default, run by `make test`): every scenario
//! but 5, small counts. `VK_RELIABILITY=full` (`make reliability`): more runs
//! and larger counts. `VK_RELIABILITY_SEED` fixes the seed (printed either
//! way); `VK_RELIABILITY_ONLY=kill9,eviction` picks scenarios.
//! `VK_CLUSTER_CONTROL` names `e2e/cluster.sh` when the suite may restart
//! control-plane components (the apiserver outage scenario). The Sandbox
//! controller is the upstream agent-sandbox controller (the stand-in only
//! where it cannot be fetched; the first line of output says which).

#[path = "../support/mod.rs"]
mod support;

mod fleet;
mod podnet;
mod scenarios;
mod world;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use world::{Tally, World};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    Short,
    Full,
}

impl Size {
    pub fn pick(self, short: usize, full: usize) -> usize {
        match self {
            Size::Short => short,
            Size::Full => full,
        }
    }
}

/// `e2e/cluster.sh` when the harness may restart control-plane components.
pub fn cluster_control() -> Option<PathBuf> {
    let p = PathBuf::from(std::env::var_os("VK_CLUSTER_CONTROL")?);
    p.exists().then_some(p)
}

type Scenario = fn(&mut World, Size) -> std::pin::Pin<Box<dyn Future<Output = ()> + '_>>;

fn scenarios() -> Vec<(&'static str, &'static str, Scenario, bool)> {
    // (key, title, body, in the short run)
    vec![
        (
            "kill9",
            "1 kill -9 during bursts",
            |w, s| Box::pin(scenarios::kill9(w, s)),
            true,
        ),
        (
            "eviction",
            "2 eviction storm (SIGSTOP)",
            |w, s| Box::pin(scenarios::eviction(w, s)),
            true,
        ),
        (
            "sandboxd",
            "3 sandboxd faults",
            |w, s| Box::pin(scenarios::sandboxd_faults(w, s)),
            true,
        ),
        (
            "apiserver",
            "4 apiserver outage + etcd restart",
            |w, s| Box::pin(scenarios::apiserver_outage(w, s)),
            true,
        ),
        (
            "state",
            "5 state store faults",
            |w, s| Box::pin(scenarios::state_faults(w, s)),
            false,
        ),
        (
            "churn",
            "6 owner churn (same name)",
            |w, s| Box::pin(scenarios::owner_churn(w, s)),
            true,
        ),
        (
            "warmpool",
            "8 warm-pool churn (claims, pool scaling, kill -9)",
            |w, s| Box::pin(scenarios::warm_pool_churn(w, s)),
            true,
        ),
        (
            "neighbours",
            "9 neighbours' claims (same claim_ref)",
            |w, s| Box::pin(scenarios::neighbours(w, s)),
            true,
        ),
        (
            "suspend",
            "10 suspend/resume churn (kill -9, hibernate/wake/renew faults)",
            |w, s| Box::pin(scenarios::suspend_churn(w, s)),
            true,
        ),
        (
            "relays",
            "11 relays across suspends, sandboxd's idle tiers (kill -9, new generations)",
            |w, s| Box::pin(scenarios::relays_idle(w, s)),
            true,
        ),
        (
            "podnet",
            "12 Pod-address connections across suspends, deletes, kill -9",
            |w, s| Box::pin(scenarios::pod_addresses(w, s)),
            true,
        ),
        (
            "fleet",
            "13 a fleet of three: sandboxd filled, drained, stopped, restarted under a stream of Sandboxes",
            |w, s| Box::pin(fleet::troubles(w, s)),
            true,
        ),
    ]
}

struct Row {
    title: &'static str,
    runs: usize,
    tally: Tally,
    converge_max: Duration,
}

fn main() -> ExitCode {
    let size = match std::env::var("VK_RELIABILITY").as_deref() {
        Ok("full") => Size::Full,
        _ => Size::Short,
    };
    let seed: u64 = std::env::var("VK_RELIABILITY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::random::<u32>() as u64);
    let only: Option<Vec<String>> = std::env::var("VK_RELIABILITY_ONLY")
        .ok()
        .map(|s| s.split(',').map(|x| x.trim().to_string()).collect());
    println!(
        "reliability suite: {size:?} run, seed {seed} (VK_RELIABILITY_SEED={seed} repeats it)"
    );
    let controller = support::controller::describe(support::controller::kind());
    println!("{controller}");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let started = Instant::now();
    let mut planned = Vec::new();
    for (key, title, body, short) in scenarios() {
        if only.as_ref().is_some_and(|o| !o.iter().any(|k| k == key)) {
            continue;
        }
        if size == Size::Short && !short {
            continue;
        }
        if key == "apiserver" && cluster_control().is_none() {
            println!(
                "SKIPPED {title}: VK_CLUSTER_CONTROL does not name e2e/cluster.sh (not the local plane)"
            );
            continue;
        }
        planned.push((key, title, body));
    }
    let runs = size.pick(1, 3);
    let total_runs = planned.len() * runs;
    let mut progress = support::progress::Progress::new("reliability", total_runs, started);
    let rows = runtime.block_on(async {
        let mut rows = Vec::new();
        for (key, title, body) in planned {
            let mut row = Row {
                title,
                runs,
                tally: Tally::default(),
                converge_max: Duration::ZERO,
            };
            for run in 0..runs {
                let run_seed = seed.wrapping_add(run as u64 * 7919);
                let cluster = support::cluster().await?;
                let t0 = Instant::now();
                progress.step(&format!(
                    "{title}: run {} of {runs}, seed {run_seed}",
                    run + 1
                ));
                let mut w = World::new(cluster, &format!("rel-{key}"), run_seed, 64).await;
                body(&mut w, size).await;
                let t = w.finish(Duration::from_secs(240)).await;
                println!(
                    "   {} Pods, {} faults, converged in {:.1}s, run took {:.0}s",
                    t.pods,
                    t.faults,
                    t.converge.as_secs_f64(),
                    t0.elapsed().as_secs_f64()
                );
                for n in &t.notes {
                    println!("   note: {n}");
                }
                row.converge_max = row.converge_max.max(t.converge);
                add(&mut row.tally, t);
            }
            rows.push(row);
        }
        Some(rows)
    });
    let Some(rows) = rows else {
        return ExitCode::SUCCESS;
    };
    if rows.is_empty() {
        println!(
            "FAILED: no scenario ran (VK_RELIABILITY_ONLY names: kill9, eviction, sandboxd, apiserver, state, churn, warmpool, neighbours, suspend, relays, podnet, fleet)"
        );
        return ExitCode::FAILURE;
    }
    let report = table(&rows, seed, size, started.elapsed(), &controller);
    println!("\n{report}");
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/reliability-report.md");
    if let Err(e) = std::fs::write(&out, &report) {
        println!("(could not write {}: {e})", out.display());
    } else {
        println!("report written to {}", out.display());
    }
    let rows_len = rows.len();
    let failed = rows.iter().any(|r| {
        let t = &r.tally;
        t.wrongly_released
            + t.leaked
            + t.creds_lost
            + t.not_converged
            + t.bad_state_file
            + t.leases_expired
            + t.running_suspended
            + t.given_to_another
            + t.address_faults
            + t.stuck_pending
            > 0
    });
    let mut total = Tally::default();
    for r in rows {
        add(&mut total, r.tally);
    }
    let summary = format!(
        "{} scenarios, {total_runs} runs, {} Pods, {} faults, seed {seed} (total {})",
        rows_len,
        total.pods,
        total.faults,
        progress.elapsed()
    );
    if failed {
        println!(
            "reliability: FAILED: an invariant column is not zero: {} wrongly released, {} leaked, \
             {} credentials lost, {} not converged, {} bad state files, {} leases expired under \
             a living owner, {} VMs running for a suspended Sandbox, {} VMs given to another \
             owner generation, {} Pod-address faults, {} Pods stuck Pending; {summary}",
            total.wrongly_released,
            total.leaked,
            total.creds_lost,
            total.not_converged,
            total.bad_state_file,
            total.leases_expired,
            total.running_suspended,
            total.given_to_another,
            total.address_faults,
            total.stuck_pending
        );
        ExitCode::FAILURE
    } else {
        println!("reliability: passed, every invariant held: {summary}");
        ExitCode::SUCCESS
    }
}

fn add(total: &mut Tally, t: Tally) {
    total.pods += t.pods;
    total.faults += t.faults;
    total.wrongly_released += t.wrongly_released;
    total.leaked += t.leaked;
    total.creds_lost += t.creds_lost;
    total.not_converged += t.not_converged;
    total.bad_state_file += t.bad_state_file;
    total.leases_expired += t.leases_expired;
    total.running_suspended += t.running_suspended;
    total.given_to_another += t.given_to_another;
    total.address_faults += t.address_faults;
    total.stuck_pending += t.stuck_pending;
}

fn table(rows: &[Row], seed: u64, size: Size, took: Duration, controller: &str) -> String {
    let mut s = format!(
        "Reliability suite ({size:?}, seed {seed}, {:.0} s)\n{controller}\n\n\
         | scenario | runs | Pods | faults | VMs wrongly released | VMs leaked | credentials lost | Pods not converged | bad state file | leases expired, owner alive | VMs running, Sandbox suspended | VMs given to another generation | Pod addresses: other VM reached, shared or leaked | Pods stuck Pending | max time to converge |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        took.as_secs_f64()
    );
    for r in rows {
        let t = &r.tally;
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} s |\n",
            r.title,
            r.runs,
            t.pods,
            t.faults,
            t.wrongly_released,
            t.leaked,
            t.creds_lost,
            t.not_converged,
            t.bad_state_file,
            t.leases_expired,
            t.running_suspended,
            t.given_to_another,
            t.address_faults,
            t.stuck_pending,
            r.converge_max.as_secs_f64()
        ));
    }
    s
}
