//! `sandboxd-sim`: run the sandboxd simulator, or drive a running one's
//! admin API (`sandboxd-sim ctl …`). See e2e/README.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use http::Method;
use sandboxd_sim::{PoolConfig, PortMapping, SimConfig, TenantConfig, ctl};
use serde_json::json;

const ADMIN_HELP: &str = "\
ADMIN API (under /_sim on the API port, and on --admin-listen if given):
  GET    /_sim/state                 config, clock, pools, claims (with tokens), faults
  GET    /_sim/requests[?path=P&method=M]   request log: method, path, authorization, body, status, note
  DELETE /_sim/requests              clear the request log
  GET    /_sim/faults                armed faults
  POST   /_sim/faults  {\"endpoint\":E,\"kind\":K,...,\"times\":N}
         E = claim | release | list | info | hibernate | wake | renew | get | stats
           | owner | exec | agent | ports
         K = status {status,error?,body?,content_type?} | redirect {peers?} | garbage
           | truncate | slow {ms} | drop_after | drop_before
           | persist_late {ms}  (claim, hibernate, wake, renew: no effect for ms, then
                                 the effect lands even after the client gave up:
                                 a claim persisted late, a slow hibernate or wake)
           | fail               (hibernate, wake, renew: their 500 after the usual time)
           | release_fail_keep | release_fail_drop       (times absent = always)
         agent and ports take only status and drop_before
  DELETE /_sim/faults                disarm all faults
  GET|PATCH /_sim/config             change api_token (rotation), tenants, tenant_list, max_claims,
                                     draining, peers, egress, advertise_addr, owner_addr_mode
                                     (host_port|host_less|omit|origin), origin, delays
                                     (provision, claim, refill, hibernate, wake), idle_hibernate_seconds,
                                     archive_after_seconds, archive_delete_after_seconds, max_running,
                                     agent_shell, passive_root_ports, quirks
                                     {deadline: normal|missing|zero|unparseable,
                                      deadline_offset_minutes, extra_fields, engine_in_key,
                                      no_token_in_get}
  POST   /_sim/pools   {\"template\":T,\"net\":N,\"size\":S,\"warm\":W,\"target\":T,\"golden\":B,...}
  GET|POST /_sim/clock {\"advance_seconds\":N | \"advance_ms\":N | \"set\":RFC3339 | \"frozen\":B}
  POST   /_sim/reap                  run the reaper now
  GET    /_sim/claims[?claim_ref=R]  live claims with tokens
  GET    /_sim/claims/{id}           one claim and its guest side (processes, relays, scratch dir,
                                     netns: its network namespace, e.g. nsenter --net=PATH)
  POST   /_sim/claims/{id}  {\"hibernated\":B,\"archived\":B,\"deadline\":RFC3339|\"zero\",\"deadline_in_seconds\":N,
                             \"failed\":\"reason\"|\"\",\"volumes\":[..],\"mem_used_bytes\":N,\"idle_seconds\":N}
  GET|POST|DELETE /_sim/ports {\"sandbox\"|\"template\":S,\"guest_port\":N,\"target\":\"127.0.0.1:P\",\"remove\":B}
                                     where a guest port leads (loopback only)
  POST   /_sim/sweep                 run the idle-hibernation and archive sweep now
  POST   /_sim/restart {\"drop_ids\":[..],\"drop_connections\":B}   reload from the persisted claims
  GET|POST /_sim/listener {\"accepting\":false,\"resume_after_ms\":N}  refuse API connections";

/// A sandboxd simulator (e2e/README.md) for vk-sandbox's tests and demo.
#[derive(Debug, Parser)]
#[command(
    name = "sandboxd-sim",
    version,
    args_conflicts_with_subcommands = true,
    after_long_help = ADMIN_HELP
)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// JSON config file (every field optional); flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// API listen address (the admin API is also served here under /_sim).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Extra listener for the admin API only; it stays up while the API
    /// listener refuses connections.
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<SocketAddr>,
    /// A pool, repeatable, e.g. base:24.04=4 or rt:24.04@egress/medium=1/2.
    #[arg(long = "pool", value_name = "TEMPLATE[@NET[/SIZE]]=WARM[/TARGET]")]
    pools: Vec<String>,
    /// File holding the root api_token (whitespace trimmed). Without it and
    /// without tenants the simulator runs in open mode.
    #[arg(long, value_name = "FILE")]
    api_token_file: Option<PathBuf>,
    /// A tenant token, repeatable: NAME=TOKEN or NAME=TOKEN/CAP.
    #[arg(long = "tenant", value_name = "NAME=TOKEN[/CAP]")]
    tenants: Vec<String>,
    /// Whether tenants may list their own claims (newer builds) or get 403.
    #[arg(long, value_name = "forbidden|own")]
    tenant_list: Option<String>,
    /// owner_addr in claim replies [default: 10.0.0.5:7777].
    #[arg(long, value_name = "HOST:PORT")]
    advertise_addr: Option<String>,
    /// host_port (default), host_less (":7777"), omit, or origin.
    #[arg(long, value_name = "MODE")]
    owner_addr_mode: Option<String>,
    /// Live-claim cap (0 = unlimited).
    #[arg(long, value_name = "N")]
    max_claims: Option<u32>,
    /// Start draining (claims get 429, or a redirect with peers).
    #[arg(long)]
    drain: bool,
    /// A peer address, repeatable; enables redirects.
    #[arg(long = "peer", value_name = "HOST:PORT")]
    peers: Vec<String>,
    /// The node has no egress attachment (net "egress" gets 409).
    #[arg(long)]
    no_egress: bool,
    /// Warm-miss provisioning time [default: 100].
    #[arg(long, value_name = "MS")]
    provision_delay_ms: Option<u64>,
    /// Extra time every claim takes before it answers, warm hit or miss
    /// (models the real daemon's 0.2–0.7 ms hand-over) [default: 0].
    #[arg(long, value_name = "US")]
    claim_delay_us: Option<u64>,
    /// Time to refill one warm VM [default: 1000].
    #[arg(long, value_name = "MS")]
    refill_delay_ms: Option<u64>,
    /// Reaper period, 0 = only on demand [default: 5000].
    #[arg(long, value_name = "MS")]
    reap_interval_ms: Option<u64>,
    /// Persist claims here and reload them at start-up.
    #[arg(long, value_name = "FILE")]
    state_file: Option<PathBuf>,
    /// Freeze the simulated clock (it then moves only via /_sim/clock).
    #[arg(long)]
    frozen_clock: bool,
    /// How long a hibernate takes [default: 250].
    #[arg(long, value_name = "MS")]
    hibernate_delay_ms: Option<u64>,
    /// How long a wake takes [default: 55].
    #[arg(long, value_name = "MS")]
    wake_delay_ms: Option<u64>,
    /// Hibernate claims idle this long (simulated clock), 0 = off [default: 0].
    #[arg(long, value_name = "SECONDS")]
    idle_hibernate_seconds: Option<u64>,
    /// Archive hibernated claims idle this long, 0 = off [default: 0].
    #[arg(long, value_name = "SECONDS")]
    archive_after_seconds: Option<u64>,
    /// Retention of archived claims, 0 = for ever [default: 0].
    #[arg(long, value_name = "SECONDS")]
    archive_delete_after_seconds: Option<u64>,
    /// Running slots (hibernated VMs use none), 0 = unlimited [default: 0].
    #[arg(long, value_name = "N")]
    max_running: Option<u32>,
    /// Where a guest port leads, repeatable: TEMPLATE or sb_ID, guest port,
    /// loopback target, e.g. base:24.04:8080=127.0.0.1:18080.
    #[arg(long = "port", value_name = "SCOPE:GUEST_PORT=127.0.0.1:PORT")]
    ports: Vec<String>,
    /// Where VMs' scratch directories go [default: a fresh temp directory].
    #[arg(long, value_name = "DIR")]
    scratch_dir: Option<PathBuf>,
    /// The shell pty_open starts [default: /bin/bash, else /bin/sh].
    #[arg(long, value_name = "PATH")]
    agent_shell: Option<String>,
    /// Each VM's guest network: `namespaces` (a network namespace per VM,
    /// its own loopback; needs root), `host` (the host's loopback, shared:
    /// guest port N is the host's 127.0.0.1:N), or `auto`: namespaces when
    /// the simulator may make them, else the host's loopback, said at
    /// start-up [default: auto].
    #[arg(long, value_name = "auto|namespaces|host")]
    guest_network: Option<sandboxd_sim::GuestNetworkMode>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Drive a running simulator's admin API.
    Ctl(CtlArgs),
}

#[derive(Debug, Args)]
struct CtlArgs {
    /// The simulator's API or admin base URL.
    #[arg(
        long,
        env = "SANDBOXD_SIM_URL",
        default_value = "http://127.0.0.1:7777"
    )]
    url: String,
    #[command(subcommand)]
    cmd: CtlCmd,
}

#[derive(Debug, Subcommand)]
enum CtlCmd {
    /// Print the whole state (config, clock, pools, claims, faults).
    State,
    /// Print (or clear) the request log.
    Requests {
        /// Only requests whose path starts with this.
        #[arg(long)]
        path: Option<String>,
        #[arg(long)]
        clear: bool,
    },
    /// Arm a fault, e.g. '{"endpoint":"claim","kind":"status","status":429,"times":2}'.
    Fault { json: String },
    /// Print (or clear) the armed faults.
    Faults {
        #[arg(long)]
        clear: bool,
    },
    /// Print the config, or patch it, e.g. '{"api_token":"new"}'.
    Config { json: Option<String> },
    /// Add or replace a pool, e.g. '{"template":"base:24.04","warm":4}'.
    Pool { json: String },
    /// Read or move the simulated clock.
    Clock {
        #[arg(long, value_name = "SECONDS", allow_hyphen_values = true)]
        advance: Option<i64>,
        #[arg(long, value_name = "RFC3339")]
        set: Option<String>,
        #[arg(long)]
        freeze: bool,
        #[arg(long)]
        unfreeze: bool,
    },
    /// Run the reaper now.
    Reap,
    /// List live claims (with tokens).
    Claims {
        #[arg(long)]
        claim_ref: Option<String>,
    },
    /// Show one claim and its guest side, or change it, e.g.
    /// '{"hibernated":true}' or '{"archived":true,"deadline":"zero"}'.
    Sandbox { id: String, json: Option<String> },
    /// List the guest port mappings, or add one, e.g.
    /// '{"template":"base:24.04","guest_port":8080,"target":"127.0.0.1:18080"}'.
    Port { json: Option<String> },
    /// Run the idle-hibernation and archive sweep now.
    Sweep,
    /// Simulate a restart from the persisted claims.
    Restart {
        /// Lose this claim silently, repeatable.
        #[arg(long = "drop", value_name = "ID")]
        drop_ids: Vec<String>,
        #[arg(long)]
        drop_connections: bool,
    },
    /// Stop or resume accepting API connections.
    Listener {
        #[arg(long, conflicts_with = "start")]
        stop: bool,
        #[arg(long)]
        start: bool,
        #[arg(long, value_name = "MS")]
        resume_after_ms: Option<u64>,
    },
    /// Any admin call: METHOD PATH [JSON].
    Raw {
        method: String,
        path: String,
        body: Option<String>,
    },
}

fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' | b':' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn from_json<T: serde::de::DeserializeOwned>(what: &str, v: &str) -> Result<T, String> {
    serde_json::from_value(json!(v)).map_err(|e| format!("--{what} {v:?}: {e}"))
}

fn build_config(args: ServeArgs) -> Result<SimConfig, String> {
    let mut cfg = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("read config {}: {e}", path.display()))?;
            serde_json::from_str::<SimConfig>(&text)
                .map_err(|e| format!("config {}: {e}", path.display()))?
        }
        None => SimConfig::default(),
    };
    if let Some(l) = args.listen {
        cfg.listen = Some(l);
    }
    if let Some(l) = args.admin_listen {
        cfg.admin_listen = Some(l);
    }
    for spec in &args.pools {
        cfg.pools.push(PoolConfig::parse_spec(spec)?);
    }
    if let Some(path) = &args.api_token_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("read api token file {}: {e}", path.display()))?;
        cfg.api_token = text.trim().to_string();
    }
    for spec in &args.tenants {
        let (name, rest) = spec
            .split_once('=')
            .ok_or_else(|| format!("tenant {spec:?}: want NAME=TOKEN[/CAP]"))?;
        let (token, cap) = match rest.rsplit_once('/') {
            Some((t, c)) => (
                t,
                c.parse::<u32>()
                    .map_err(|_| format!("tenant {spec:?}: cap {c:?} is not a number"))?,
            ),
            None => (rest, 0),
        };
        if name.is_empty() || token.is_empty() {
            return Err(format!("tenant {spec:?}: empty name or token"));
        }
        cfg.tenants.push(TenantConfig {
            name: name.to_string(),
            token: token.to_string(),
            max_claims: cap,
        });
    }
    if let Some(v) = &args.tenant_list {
        cfg.tenant_list = from_json("tenant-list", v)?;
    }
    if let Some(v) = &args.owner_addr_mode {
        cfg.owner_addr_mode = from_json("owner-addr-mode", &v.replace('-', "_"))?;
    }
    if let Some(v) = args.advertise_addr {
        cfg.advertise_addr = v;
    }
    if let Some(v) = args.max_claims {
        cfg.max_claims = v;
    }
    cfg.draining |= args.drain;
    cfg.peers.extend(args.peers);
    if args.no_egress {
        cfg.egress = false;
    }
    if let Some(v) = args.provision_delay_ms {
        cfg.provision_delay_ms = v;
    }
    if let Some(v) = args.claim_delay_us {
        cfg.claim_delay_us = v;
    }
    if let Some(v) = args.refill_delay_ms {
        cfg.refill_delay_ms = v;
    }
    if let Some(v) = args.reap_interval_ms {
        cfg.reap_interval_ms = v;
    }
    if let Some(v) = args.state_file {
        cfg.state_file = Some(v);
    }
    cfg.clock_frozen |= args.frozen_clock;
    macro_rules! take {
        ($($f:ident),*) => {$(if let Some(v) = args.$f { cfg.$f = v; })*};
    }
    take!(
        hibernate_delay_ms,
        wake_delay_ms,
        idle_hibernate_seconds,
        archive_after_seconds,
        archive_delete_after_seconds,
        max_running,
        agent_shell
    );
    for spec in &args.ports {
        cfg.port_map.push(PortMapping::parse_spec(spec)?);
    }
    if let Some(dir) = args.scratch_dir {
        cfg.scratch_dir = Some(dir);
    }
    if let Some(mode) = args.guest_network {
        cfg.guest_network = mode;
    }
    Ok(cfg)
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    let cfg = build_config(args)?;
    let mode = if cfg.api_token.is_empty() && cfg.tenants.is_empty() {
        "open mode"
    } else {
        "token auth"
    };
    let handle = sandboxd_sim::start(cfg).await.map_err(|e| e.to_string())?;
    println!(
        "sandboxd-sim listening on {} ({mode}); admin API under {}/_sim{}",
        handle.base_url(),
        handle.base_url(),
        handle
            .admin_addr()
            .map(|a| format!(" and http://{a}/_sim"))
            .unwrap_or_default()
    );

    wait_for_shutdown().await;
    println!("sandboxd-sim: shutting down");
    // Unlike sandboxd, whose VMs outlive it, the simulator's guests are
    // processes of this machine: they end with it (claims persisted in the
    // state file survive; what their guests ran does not).
    handle.guests().destroy_all();
    Ok(())
}

async fn wait_for_shutdown() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    () = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => ctrl_c.await,
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}

async fn run_ctl(args: CtlArgs) -> Result<(), String> {
    let (method, path, body): (Method, String, Option<String>) = match args.cmd {
        CtlCmd::State => (Method::GET, "/_sim/state".into(), None),
        CtlCmd::Requests { clear: true, .. } => (Method::DELETE, "/_sim/requests".into(), None),
        CtlCmd::Requests { path, .. } => (
            Method::GET,
            match path {
                Some(p) => format!("/_sim/requests?path={}", query_escape(&p)),
                None => "/_sim/requests".into(),
            },
            None,
        ),
        CtlCmd::Fault { json } => (Method::POST, "/_sim/faults".into(), Some(json)),
        CtlCmd::Faults { clear: true } => (Method::DELETE, "/_sim/faults".into(), None),
        CtlCmd::Faults { clear: false } => (Method::GET, "/_sim/faults".into(), None),
        CtlCmd::Config { json: None } => (Method::GET, "/_sim/config".into(), None),
        CtlCmd::Config { json } => (Method::PATCH, "/_sim/config".into(), json),
        CtlCmd::Pool { json } => (Method::POST, "/_sim/pools".into(), Some(json)),
        CtlCmd::Clock {
            advance,
            set,
            freeze,
            unfreeze,
        } => {
            let mut patch = serde_json::Map::new();
            if let Some(a) = advance {
                patch.insert("advance_seconds".into(), json!(a));
            }
            if let Some(s) = set {
                patch.insert("set".into(), json!(s));
            }
            if freeze || unfreeze {
                patch.insert("frozen".into(), json!(freeze));
            }
            if patch.is_empty() {
                (Method::GET, "/_sim/clock".into(), None)
            } else {
                (
                    Method::POST,
                    "/_sim/clock".into(),
                    Some(serde_json::Value::Object(patch).to_string()),
                )
            }
        }
        CtlCmd::Reap => (Method::POST, "/_sim/reap".into(), None),
        CtlCmd::Claims { claim_ref } => (
            Method::GET,
            match claim_ref {
                Some(r) => format!("/_sim/claims?claim_ref={}", query_escape(&r)),
                None => "/_sim/claims".into(),
            },
            None,
        ),
        CtlCmd::Sandbox { id, json: None } => (
            Method::GET,
            format!("/_sim/claims/{}", query_escape(&id)),
            None,
        ),
        CtlCmd::Sandbox { id, json } => (
            Method::POST,
            format!("/_sim/claims/{}", query_escape(&id)),
            json,
        ),
        CtlCmd::Port { json: None } => (Method::GET, "/_sim/ports".into(), None),
        CtlCmd::Port { json } => (Method::POST, "/_sim/ports".into(), json),
        CtlCmd::Sweep => (Method::POST, "/_sim/sweep".into(), None),
        CtlCmd::Restart {
            drop_ids,
            drop_connections,
        } => (
            Method::POST,
            "/_sim/restart".into(),
            Some(json!({ "drop_ids": drop_ids, "drop_connections": drop_connections }).to_string()),
        ),
        CtlCmd::Listener {
            stop,
            start,
            resume_after_ms,
        } => {
            if !stop && !start {
                (Method::GET, "/_sim/listener".into(), None)
            } else {
                let mut v = json!({ "accepting": start });
                if let Some(ms) = resume_after_ms {
                    v["resume_after_ms"] = json!(ms);
                }
                (Method::POST, "/_sim/listener".into(), Some(v.to_string()))
            }
        }
        CtlCmd::Raw { method, path, body } => (
            Method::from_bytes(method.to_ascii_uppercase().as_bytes())
                .map_err(|_| format!("bad method {method:?}"))?,
            path,
            body,
        ),
    };
    let (status, text) = ctl::call(&args.url, method, &path, body).await?;
    if !text.is_empty() {
        println!("{text}");
    }
    if status >= 400 {
        return Err(format!("admin call failed with status {status}"));
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Some(Command::Ctl(args)) => run_ctl(args).await,
        None => serve(cli.serve).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandboxd-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_builds_a_config() {
        let cli = Cli::try_parse_from([
            "sandboxd-sim",
            "--listen",
            "127.0.0.1:7777",
            "--pool",
            "base:24.04=4",
            "--tenant",
            "acme=t1/5",
            "--owner-addr-mode",
            "host-less",
            "--peer",
            "10.0.0.6:7777",
            "--wake-delay-ms",
            "0",
            "--idle-hibernate-seconds",
            "60",
            "--port",
            "base:24.04:8080=127.0.0.1:18080",
        ])
        .expect("parse");
        let cfg = build_config(cli.serve).expect("config");
        assert_eq!((cfg.wake_delay_ms, cfg.hibernate_delay_ms), (0, 250));
        assert_eq!(cfg.idle_hibernate_seconds, 60);
        assert_eq!(cfg.port_map[0].guest_port, 8080);
        assert_eq!(cfg.pools.len(), 1);
        assert_eq!(cfg.tenants[0].max_claims, 5);
        assert_eq!(cfg.owner_addr_mode, sandboxd_sim::OwnerAddrMode::HostLess);
        assert_eq!(cfg.peers, vec!["10.0.0.6:7777".to_string()]);
        let cli = Cli::try_parse_from(["sandboxd-sim", "ctl", "clock", "--advance", "-60"])
            .expect("parse ctl");
        assert!(matches!(cli.command, Some(Command::Ctl(_))));
    }
}
