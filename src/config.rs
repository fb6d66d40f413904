//! Command line and environment (behaviour.md §1.1, decisions.md D1, D5).
//!
//! Two steps, both before anything touches the cluster:
//!
//! 1. [`parse_from`] turns argv plus an environment lookup into [`Cli`].
//!    An environment variable only supplies a flag's *default*: an explicit
//!    flag always wins, and a variable set to the empty string counts as
//!    unset. clap's own `env` support treats an empty variable as set, so the
//!    `env = "…"` attributes below only *name* the variable; [`parse_from`]
//!    strips clap's reading and feeds non-empty values in as defaults.
//! 2. [`Config::from_args`] validates every value into a typed [`Config`]:
//!    quantities, listen addresses, intervals, the sandboxd URL, labels, the
//!    token file (read once, trimmed), and the state directory (created 0700
//!    if missing, then proved writable). Every problem found is reported at
//!    once, each naming the flag, its environment variable, the value and the
//!    fix.
//!
//! The flags live in [`RunArgs`], flattened into the top-level command (no
//! subcommand = run). `vk-sandbox preflight [flags]` ([`Command::Preflight`])
//! takes the same flags and environment and checks them against the world
//! instead of running (see [`crate::preflight`]).
//!
//! `KUBECONFIG` is deliberately not a clap env var: credentials come from
//! kube's default order (in-cluster, then `--kubeconfig`, then
//! `$KUBECONFIG`, then `~/.kube/config`; decisions.md D1).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, CommandFactory, FromArgMatches, Parser, ValueEnum};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::error::{Error, Result};
use crate::sandboxd::Secret;

/// Defaults of behaviour.md §1.1 (and D1/D2/D5), shared by `--help` and tests.
pub mod defaults {
    pub const NODE_NAME: &str = "vk-sandboxd";
    pub const LISTEN_ADDR: &str = ":10260";
    pub const ADMIN_ADDR: &str = ":10261";
    pub const NODE_CPU: &str = "4000";
    pub const NODE_MEMORY: &str = "8Ti";
    pub const NODE_PODS: &str = "2000";
    pub const KUBE_API_QPS: f32 = 200.0;
    pub const KUBE_API_BURST: u32 = 400;
    pub const SANDBOXD_URL: &str = "http://127.0.0.1:7777";
    pub const STATE_PATH: &str = "/var/lib/vk-sandbox/claims.json";
    pub const ORPHAN_SCAN_INTERVAL: &str = "60s";
    pub const PUBLISH_INTERVAL: &str = "30s";
    pub const NODE_LABELS: &str = "sandbox.cocoonstack.io/runtime=sandboxd";
    pub const INVENTORY_GROUP: &str = "sandbox.cocoonstack.io";
}

/// vk-sandbox registers a virtual Node and turns sandbox Pods bound to it
/// into sandboxd microVM claims.
///
/// Environment variables only supply defaults: an explicit flag always wins,
/// and a variable set to the empty string counts as unset. Kubernetes
/// credentials: in-cluster service account, else --kubeconfig, else
/// $KUBECONFIG, else ~/.kube/config.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "vk-sandbox",
    version = crate::build_info::VERSION_LINE,
    max_term_width = 100,
    args_conflicts_with_subcommands = true,
    disable_help_subcommand = true
)]
pub struct Cli {
    /// `None`: run the virtual node with the flags in `run`.
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands; without one, `vk-sandbox [flags]` runs the daemon.
// Parsed once per process: the size of the preflight variant is no cost.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Check, without changing anything, that this configuration can start:
    /// apiserver and credentials, RBAC, the NodeInventory CRD, sandboxd and
    /// its warm pools, the state path, the listen ports and the node name.
    /// Takes the same flags and environment as the run command; exits 1
    /// when any check fails.
    Preflight(RunArgs),
    /// Inspect the claims state without changing it (safe while the daemon
    /// runs): list, show, verify against sandboxd, export as a Go
    /// claims.json.
    Claims(crate::claims_cli::ClaimsArgs),
}

/// Every flag of the run command (behaviour.md §1.1 plus D1/D5 additions).
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Node object name; also the Lease name, a serving-cert SAN and the
    /// inventory name. Must differ from any other node's name.
    #[arg(long, env = "VK_NODE_NAME", default_value = defaults::NODE_NAME, value_name = "NAME")]
    pub node_name: String,

    /// Advertised InternalIP of the Node (omitted when empty); also a
    /// serving-cert SAN.
    #[arg(long, env = "VK_NODE_IP", default_value = "", value_name = "IP")]
    pub node_ip: String,

    /// Kubelet API (HTTPS) bind address, host:port with a numeric port;
    /// ":10260" listens on every interface. vk-cocoon uses :10250.
    #[arg(long, env = "VK_LISTEN_ADDR", default_value = defaults::LISTEN_ADDR, value_name = "HOST:PORT")]
    pub listen_addr: String,

    /// PEM certificate (chain) for the kubelet API. Used, and reloaded when
    /// it changes, when both --tls-cert and --tls-key name regular files;
    /// otherwise a self-signed certificate is generated in memory.
    #[arg(long, env = "VK_TLS_CERT", default_value = "", value_name = "FILE")]
    pub tls_cert: String,

    /// PEM private key matching --tls-cert.
    #[arg(long, env = "VK_TLS_KEY", default_value = "", value_name = "FILE")]
    pub tls_key: String,

    /// Node CPU capacity (a Kubernetes quantity; scheduling budget only).
    #[arg(long, env = "VK_NODE_CPU", default_value = defaults::NODE_CPU, value_name = "QUANTITY")]
    pub node_cpu: String,

    /// Node memory capacity (a Kubernetes quantity).
    #[arg(long, env = "VK_NODE_MEMORY", default_value = defaults::NODE_MEMORY, value_name = "QUANTITY")]
    pub node_memory: String,

    /// Node Pod capacity (a Kubernetes quantity).
    #[arg(long, env = "VK_NODE_PODS", default_value = defaults::NODE_PODS, value_name = "QUANTITY")]
    pub node_pods: String,

    /// Client-side QPS for every Kubernetes client (never a stricter limit).
    #[arg(long, default_value_t = defaults::KUBE_API_QPS, value_name = "QPS")]
    pub kube_api_qps: f32,

    /// Client-side burst for every Kubernetes client.
    #[arg(long, default_value_t = defaults::KUBE_API_BURST, value_name = "N")]
    pub kube_api_burst: u32,

    /// Path of a kubeconfig file (used when not running in a cluster;
    /// takes precedence over $KUBECONFIG).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// sandboxd base URL (http(s)://host[:port]; trailing "/" trimmed).
    #[arg(long, env = "SANDBOXD_URL", default_value = defaults::SANDBOXD_URL, value_name = "URL")]
    pub sandboxd_url: String,

    /// host:port published in the NodeInventory for clients to reach
    /// sandboxd. Default: the host[:port] of --sandboxd-url (loopback by
    /// default, so operators should set it).
    #[arg(
        long,
        env = "SANDBOXD_ADVERTISE_ADDR",
        default_value = "",
        value_name = "HOST:PORT"
    )]
    pub sandboxd_advertise_addr: String,

    /// File holding the sandboxd node (root) API token, read once at start
    /// (whitespace trimmed). Unset or empty file: no Authorization header.
    #[arg(
        long,
        env = "SANDBOXD_TOKEN_FILE",
        default_value = "",
        value_name = "FILE"
    )]
    pub sandboxd_token_file: String,

    /// Claims table file (release credentials). Its directory is created
    /// with mode 0700 if missing and must be writable.
    #[arg(long, env = "VK_STATE_PATH", default_value = defaults::STATE_PATH, value_name = "FILE")]
    pub state_path: String,

    /// Cadence of the sandboxd orphan audit (Go duration, e.g. 60s, 1m30s);
    /// 0 or negative disables it.
    #[arg(long, default_value = defaults::ORPHAN_SCAN_INTERVAL, value_name = "DURATION", allow_hyphen_values = true)]
    pub orphan_scan_interval: String,

    /// Publish the NodeInventory object (--publish-inventory or
    /// --publish-inventory=true|false).
    #[arg(
        long,
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = BoolishValueParser::new(),
        value_name = "BOOL"
    )]
    pub publish_inventory: bool,

    /// NodeInventory publish cadence (Go duration; must be > 0 when
    /// publishing).
    #[arg(long, default_value = defaults::PUBLISH_INTERVAL, value_name = "DURATION", allow_hyphen_values = true)]
    pub publish_interval: String,

    /// API group of the published NodeInventory (e.g.
    /// extensions.agents.x-k8s.io for operators that read that group).
    #[arg(long, env = "VK_INVENTORY_GROUP", default_value = defaults::INVENTORY_GROUP, value_name = "GROUP")]
    pub inventory_group: String,

    /// Extra Node labels "k=v,k2=v2" (items without "=" or with an empty
    /// key are skipped; later duplicates win). Setting it replaces the
    /// default.
    #[arg(long, default_value = defaults::NODE_LABELS, value_name = "K=V,...")]
    pub node_labels: String,

    /// Admin (plain HTTP) bind address for /metrics, /livez and /readyz.
    #[arg(long, env = "VK_ADMIN_ADDR", default_value = defaults::ADMIN_ADDR, value_name = "HOST:PORT")]
    pub admin_addr: String,

    /// Authenticate (client certificate or bearer token) and authorize
    /// (SubjectAccessReview on nodes/proxy, nodes/log, nodes/stats,
    /// nodes/metrics) every kubelet API request but /healthz.
    /// --kubelet-auth=false serves the API to anyone who reaches the port.
    #[arg(
        long,
        env = "VK_KUBELET_AUTH",
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = BoolishValueParser::new(),
        value_name = "BOOL"
    )]
    pub kubelet_auth: bool,

    /// PEM bundle of CAs that sign kubelet API client certificates. Default:
    /// the key "client-ca-file" of the ConfigMap
    /// kube-system/extension-apiserver-authentication, read once at start.
    #[arg(
        long,
        env = "VK_CLIENT_CA_FILE",
        default_value = "",
        value_name = "FILE"
    )]
    pub client_ca_file: String,

    /// Let unauthenticated kubelet API requests through as
    /// system:anonymous (still subject to authorization).
    #[arg(
        long,
        env = "VK_ANONYMOUS_AUTH",
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = BoolishValueParser::new(),
        value_name = "BOOL"
    )]
    pub anonymous_auth: bool,

    /// Log line format on stderr.
    #[arg(long, env = "VK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// How often the Node status heartbeat is written (at most 60s keeps
    /// the node lifecycle controller content). Hidden: for tests.
    #[arg(long, default_value = "60s", value_name = "DURATION", hide = true)]
    pub node_status_interval: String,
}

/// Log output format (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The clap command with environment defaults applied from `env`.
///
/// For each argument that names an environment variable: clap's own
/// (process-environment, empty-counts-as-set) reading is removed, a
/// non-empty value from `env` becomes the argument's default, and the
/// variable's name is appended to the help text.
pub fn command(env: &dyn Fn(&str) -> Option<String>) -> clap::Command {
    with_env(Cli::command(), env)
}

/// [`command`]'s environment defaults on `cmd` and, recursively, on its
/// subcommands (`preflight`, `claims list`, …).
fn with_env(cmd: clap::Command, env: &dyn Fn(&str) -> Option<String>) -> clap::Command {
    let subcommands: Vec<String> = cmd
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    let mut cmd = cmd.mut_args(|arg| {
        let Some(var) = arg.get_env().and_then(|v| v.to_str()).map(str::to_owned) else {
            return arg;
        };
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        let mut arg = arg
            .env(None::<&'static str>)
            .help(format!("{help} [env: {var}]"));
        if let Some(value) = env(&var).filter(|v| !v.is_empty()) {
            arg = arg.default_value(value);
        }
        arg
    });
    for name in subcommands {
        cmd = cmd.mut_subcommand(name, |c| with_env(c, env));
    }
    cmd
}

/// Parse `args` (argv, including the program name) with environment
/// defaults from `env`. Errors include `--help` and `--version`, which the
/// caller shows with `clap::Error::exit` (exit 0 for those, 2 for usage).
pub fn parse_from<I, T>(args: I, env: &dyn Fn(&str) -> Option<String>) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut matches = command(env).try_get_matches_from(args)?;
    Cli::from_arg_matches_mut(&mut matches)
}

/// [`parse_from`] on the process's argv and environment; prints help,
/// version or the usage error and exits as clap does.
pub fn parse_process_args() -> Cli {
    let env = |name: &str| std::env::var(name).ok();
    parse_from(std::env::args_os(), &env).unwrap_or_else(|e| e.exit())
}

/// A validated `host:port` bind address (`:port` = every interface).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddr {
    /// Empty for "every interface"; else an IP or a host name (no brackets).
    pub host: String,
    pub port: u16,
}

impl ListenAddr {
    /// Parse like Go's `net.SplitHostPort` followed by a numeric port in
    /// 1–65535. `10260`, `:0`, `:70000` and `:http` are refused.
    pub fn parse(raw: &str) -> std::result::Result<Self, String> {
        let (host, port) = split_host_port(raw)?;
        if port.is_empty() {
            return Err("the port is empty".into());
        }
        if !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("the port {port:?} is not a number"));
        }
        let port = match port.parse::<u32>() {
            Ok(p) if (1..=65535).contains(&p) => p as u16,
            _ => return Err(format!("the port {port} is outside 1-65535")),
        };
        Ok(ListenAddr {
            host: host.to_string(),
            port,
        })
    }

    /// Socket addresses to bind: for an empty host `[::]` (dual stack where
    /// the kernel allows) then `0.0.0.0`; else the host resolved.
    pub async fn socket_addrs(&self) -> std::io::Result<Vec<SocketAddr>> {
        if self.host.is_empty() {
            return Ok(vec![
                SocketAddr::from(([0u16; 8], self.port)),
                SocketAddr::from(([0u8; 4], self.port)),
            ]);
        }
        if let Ok(ip) = self.host.parse::<std::net::IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, self.port)]);
        }
        Ok(tokio::net::lookup_host((self.host.as_str(), self.port))
            .await?
            .collect())
    }

    /// Bind a TCP listener on the first address that works.
    pub async fn bind(&self) -> std::io::Result<tokio::net::TcpListener> {
        let mut last = None;
        for addr in self.socket_addrs().await? {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(listener) => return Ok(listener),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            std::io::Error::new(
                ErrorKind::AddrNotAvailable,
                format!("{self} resolves to no address"),
            )
        }))
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Go's `net.SplitHostPort`: `host:port`, `[v6]:port`; exactly one colon
/// outside brackets.
fn split_host_port(raw: &str) -> std::result::Result<(&str, &str), String> {
    if let Some(rest) = raw.strip_prefix('[') {
        let Some(end) = rest.find(']') else {
            return Err("missing ']' in the address".into());
        };
        let host = &rest[..end];
        let after = &rest[end + 1..];
        let Some(port) = after.strip_prefix(':') else {
            return Err("missing port in the address".into());
        };
        if port.contains(':') || host.contains('[') || host.contains(']') {
            return Err("too many colons in the address".into());
        }
        return Ok((host, port));
    }
    let Some(colon) = raw.rfind(':') else {
        return Err("missing port in the address".into());
    };
    let (host, port) = (&raw[..colon], &raw[colon + 1..]);
    if host.contains(':') {
        return Err("too many colons in the address (write IPv6 as [addr]:port)".into());
    }
    if host.contains('[') || host.contains(']') || port.contains('[') || port.contains(']') {
        return Err("unexpected bracket in the address".into());
    }
    Ok((host, port))
}

/// Checks a Kubernetes resource quantity (`<number><suffix>`):
/// digits with an optional decimal part, then nothing, a binary suffix
/// (Ki…Ei), a decimal suffix (n, u, m, k, M, G, T, P, E) or a decimal
/// exponent (e/E followed by an optional sign and digits). A leading `+` is
/// allowed; negative values are refused, and so is zero (a zero capacity
/// makes the scheduler reject every Pod).
pub fn validate_quantity(raw: &str) -> std::result::Result<Quantity, String> {
    let s = raw.strip_prefix('+').unwrap_or(raw);
    if s.starts_with('-') {
        return Err("it is negative".into());
    }
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    if number.is_empty() {
        return Err("it does not start with a number".into());
    }
    let mut parts = number.split('.');
    let whole = parts.next().unwrap_or("");
    let frac = parts.next();
    if parts.next().is_some() {
        return Err("the number has more than one '.'".into());
    }
    if whole.is_empty() && frac.is_none_or(str::is_empty) {
        return Err("it does not start with a number".into());
    }
    let valid_suffix = match suffix {
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T"
        | "P" | "E" => true,
        _ => match suffix.strip_prefix(['e', 'E']) {
            Some(exp) => {
                let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
                !exp.is_empty() && exp.bytes().all(|b| b.is_ascii_digit())
            }
            None => false,
        },
    };
    if !valid_suffix {
        return Err(format!(
            "the suffix {suffix:?} is not one of Ki Mi Gi Ti Pi Ei n u m k M G T P E or e<exponent>"
        ));
    }
    if !number.bytes().any(|b| matches!(b, b'1'..=b'9')) {
        return Err("it is zero".into());
    }
    Ok(Quantity(raw.to_string()))
}

/// A Go duration (`time.ParseDuration`) in signed nanoseconds: an optional
/// sign, then one or more `<decimal><unit>` with units ns, us (µs), ms, s,
/// m, h; `0` alone needs no unit.
pub fn parse_go_duration(raw: &str) -> std::result::Result<i128, String> {
    let (negative, mut rest) = match raw.as_bytes().first() {
        Some(b'-') => (true, &raw[1..]),
        Some(b'+') => (false, &raw[1..]),
        _ => (false, raw),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err("it is empty (write e.g. 30s, 1m30s or 500ms)".into());
    }
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(num_end);
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && frac.is_empty() || frac.contains('.') {
            return Err(format!("{number:?} is not a number"));
        }
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let unit_nanos: i128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err("a unit is missing (ns, us, ms, s, m or h)".into()),
            other => {
                return Err(format!(
                    "unknown unit {other:?} (want ns, us, ms, s, m or h)"
                ));
            }
        };
        let whole_v: i128 = if whole.is_empty() {
            0
        } else {
            whole
                .parse::<i128>()
                .map_err(|_| format!("{whole:?} is too large"))?
        };
        let mut value = whole_v
            .checked_mul(unit_nanos)
            .ok_or_else(|| "the duration is too large".to_string())?;
        // The fractional part, truncated to nanoseconds like Go.
        let mut scale = unit_nanos;
        for digit in frac.bytes().take(30) {
            scale /= 10;
            if scale == 0 {
                break;
            }
            value += i128::from(digit - b'0') * scale;
        }
        total = total
            .checked_add(value)
            .filter(|t| *t <= i128::from(i64::MAX))
            .ok_or_else(|| "the duration is too large".to_string())?;
        rest = next;
    }
    Ok(if negative { -total } else { total })
}

/// `--node-labels` per behaviour.md §2.1: split on `,`, trim, split at the
/// first `=`; items without `=` or with an empty key are skipped; empty
/// values are allowed; later duplicates win.
pub fn parse_node_labels(raw: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    for item in raw.split(',') {
        let item = item.trim();
        let Some((key, value)) = item.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty() {
            continue;
        }
        labels.insert(key.to_string(), value.trim().to_string());
    }
    labels
}

/// Kubernetes label key syntax: `[prefix/]name`, prefix a DNS subdomain of
/// at most 253 characters, name at most 63 of `[A-Za-z0-9-_.]`, starting
/// and ending alphanumeric.
fn check_label_key(key: &str) -> std::result::Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let dns_ok = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|part| {
                !part.is_empty()
                    && part.len() <= 63
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !dns_ok {
            return Err(format!(
                "label key {key:?}: prefix {prefix:?} is not a lowercase DNS subdomain"
            ));
        }
    }
    check_label_name(name).map_err(|why| format!("label key {key:?}: name {why}"))
}

fn check_label_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > 63 {
        return Err("must be 1-63 characters".into());
    }
    check_label_chars(name)
}

fn check_label_value(value: &str) -> std::result::Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > 63 {
        return Err(format!(
            "label value {value:?} is longer than 63 characters"
        ));
    }
    check_label_chars(value).map_err(|why| format!("label value {value:?} {why}"))
}

fn check_label_chars(s: &str) -> std::result::Result<(), String> {
    let ok_inner = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let ok_ends = s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    if ok_inner && ok_ends {
        Ok(())
    } else {
        Err("must use only A-Z a-z 0-9 - _ . and start and end alphanumeric".into())
    }
}

/// `--tls-cert` / `--tls-key` as given (empty = unset). Whether the pair is
/// usable (both regular files) is decided when the kubelet API starts and
/// again on every reload check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// Kubelet API authentication/authorization (decisions.md D5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletAuthConfig {
    /// `--kubelet-auth`: false serves every route to anyone.
    pub enabled: bool,
    /// `--anonymous-auth`: unauthenticated requests become system:anonymous.
    pub anonymous: bool,
    /// `--client-ca-file`; `None` = read the cluster's
    /// kube-system/extension-apiserver-authentication `client-ca-file`.
    pub client_ca_file: Option<PathBuf>,
}

/// Node capacity (= allocatable).
#[derive(Debug, Clone, PartialEq)]
pub struct Capacity {
    pub cpu: Quantity,
    pub memory: Quantity,
    pub pods: Quantity,
}

/// Kubernetes client settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeClientConfig {
    pub kubeconfig: Option<PathBuf>,
    pub qps: f32,
    pub burst: u32,
}

/// sandboxd connection settings.
#[derive(Debug, Clone)]
pub struct SandboxdConfig {
    /// Base URL, trailing `/` trimmed.
    pub url: String,
    /// `host[:port]` for the NodeInventory.
    pub advertise_addr: String,
    /// The node (root) token; `None` = no Authorization header.
    pub token: Option<Secret>,
    /// Where the token came from (for messages only).
    pub token_file: Option<PathBuf>,
}

/// NodeInventory publishing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InventoryConfig {
    pub publish: bool,
    /// Positive whenever `publish`; zero when publishing is off and the
    /// flag was `<= 0`.
    pub interval: Duration,
    pub group: String,
}

/// Everything validated, ready to run.
#[derive(Debug, Clone)]
pub struct Config {
    pub node_name: String,
    /// `None` when `--node-ip` is empty.
    pub node_ip: Option<String>,
    pub listen_addr: ListenAddr,
    pub admin_addr: ListenAddr,
    pub tls: TlsFiles,
    pub capacity: Capacity,
    pub kube: KubeClientConfig,
    pub sandboxd: SandboxdConfig,
    /// The claims file; its directory exists and is writable.
    pub state_path: PathBuf,
    /// `None` = the orphan audit is disabled (`<= 0`).
    pub orphan_scan_interval: Option<Duration>,
    pub inventory: InventoryConfig,
    /// Extra Node labels from `--node-labels`.
    pub node_labels: BTreeMap<String, String>,
    pub kubelet_auth: KubeletAuthConfig,
    pub log_format: LogFormat,
    /// Node status heartbeat period (> 0).
    pub node_status_interval: Duration,
}

/// Collects problems so one run reports all of them.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn push(&mut self, flag: &str, env: Option<&str>, value: &str, problem: &str, fix: &str) {
        let name = match env {
            Some(env) => format!("--{flag} (env {env})"),
            None => format!("--{flag}"),
        };
        self.0.push(format!("{name}={value:?}: {problem}; {fix}"));
    }
}

fn non_empty_path(s: &str) -> Option<PathBuf> {
    (!s.is_empty()).then(|| PathBuf::from(s))
}

impl Config {
    /// Validate `args`; read the token file; create (0700) and prove
    /// writable the state directory. Touches no cluster.
    pub fn from_args(args: &RunArgs) -> Result<Config> {
        Self::validate(args, true)
    }

    /// [`Config::from_args`] without the state directory step: nothing on
    /// disk is created or probed (`vk-sandbox preflight` checks the state
    /// path itself, read-only).
    pub fn from_args_without_state_check(args: &RunArgs) -> Result<Config> {
        Self::validate(args, false)
    }

    fn validate(args: &RunArgs, check_state: bool) -> Result<Config> {
        let mut p = Problems::default();

        let listen_addr = ListenAddr::parse(&args.listen_addr)
            .map_err(|why| {
                p.push(
                    "listen-addr",
                    Some("VK_LISTEN_ADDR"),
                    &args.listen_addr,
                    &format!("parse --listen-addr: {why}"),
                    "give host:port with a port in 1-65535, e.g. :10260 or 10.0.0.5:10260",
                )
            })
            .ok();
        let admin_addr = ListenAddr::parse(&args.admin_addr)
            .map_err(|why| {
                p.push(
                    "admin-addr",
                    Some("VK_ADMIN_ADDR"),
                    &args.admin_addr,
                    &format!("parse --admin-addr: {why}"),
                    "give host:port with a port in 1-65535, e.g. :10261 or 127.0.0.1:10261",
                )
            })
            .ok();

        let mut quantity = |flag: &str, env: &str, value: &str| {
            validate_quantity(value)
                .map_err(|why| {
                    p.push(
                        flag,
                        Some(env),
                        value,
                        &format!("not a usable Kubernetes quantity: {why}"),
                        "give a positive quantity such as 4000, 500m, 8Ti or 64Gi",
                    )
                })
                .ok()
        };
        let cpu = quantity("node-cpu", "VK_NODE_CPU", &args.node_cpu);
        let memory = quantity("node-memory", "VK_NODE_MEMORY", &args.node_memory);
        let pods = quantity("node-pods", "VK_NODE_PODS", &args.node_pods);

        if !(args.kube_api_qps.is_finite() && args.kube_api_qps > 0.0) {
            p.push(
                "kube-api-qps",
                None,
                &args.kube_api_qps.to_string(),
                "must be a positive number",
                "give e.g. --kube-api-qps=200",
            );
        }
        if args.kube_api_burst == 0 {
            p.push(
                "kube-api-burst",
                None,
                "0",
                "must be at least 1",
                "give e.g. --kube-api-burst=400",
            );
        }

        if args.node_name.trim().is_empty() {
            p.push(
                "node-name",
                Some("VK_NODE_NAME"),
                &args.node_name,
                "the node name is empty",
                "give a DNS name such as node-a-sandboxd",
            );
        }

        let url = crate::sandboxd::normalise_base_url(&args.sandboxd_url)
            .map_err(|e| {
                p.push(
                    "sandboxd-url",
                    Some("SANDBOXD_URL"),
                    &args.sandboxd_url,
                    &e.to_string(),
                    "give e.g. http://127.0.0.1:7777",
                )
            })
            .ok();
        let advertise_addr = if args.sandboxd_advertise_addr.is_empty() {
            advertise_default(url.as_deref().unwrap_or(&args.sandboxd_url))
        } else {
            args.sandboxd_advertise_addr.clone()
        };

        let orphan_scan_interval = match parse_go_duration(&args.orphan_scan_interval) {
            Ok(n) if n <= 0 => None,
            Ok(n) => Some(nanos_to_duration(n)),
            Err(why) => {
                p.push(
                    "orphan-scan-interval",
                    None,
                    &args.orphan_scan_interval,
                    &format!("not a Go duration: {why}"),
                    "give e.g. 60s or 5m (0 disables the scan)",
                );
                None
            }
        };
        let node_status_interval = match parse_go_duration(&args.node_status_interval) {
            Ok(n) if n > 0 => nanos_to_duration(n),
            Ok(_) | Err(_) => {
                p.push(
                    "node-status-interval",
                    None,
                    &args.node_status_interval,
                    "must be a Go duration greater than zero",
                    "give e.g. 60s",
                );
                Duration::from_secs(60)
            }
        };
        let publish_interval = match parse_go_duration(&args.publish_interval) {
            Ok(n) if n > 0 => nanos_to_duration(n),
            Ok(_) if args.publish_inventory => {
                p.push(
                    "publish-interval",
                    None,
                    &args.publish_interval,
                    "must be greater than zero while --publish-inventory is on",
                    "give e.g. 30s",
                );
                Duration::ZERO
            }
            Ok(_) => Duration::ZERO,
            Err(why) => {
                p.push(
                    "publish-interval",
                    None,
                    &args.publish_interval,
                    &format!("not a Go duration: {why}"),
                    "give e.g. 30s",
                );
                Duration::ZERO
            }
        };
        if args.inventory_group.trim().is_empty() || args.inventory_group.contains('/') {
            p.push(
                "inventory-group",
                Some("VK_INVENTORY_GROUP"),
                &args.inventory_group,
                "not an API group name",
                "give e.g. sandbox.cocoonstack.io or extensions.agents.x-k8s.io",
            );
        }

        let node_labels = parse_node_labels(&args.node_labels);
        for (key, value) in &node_labels {
            if let Err(why) = check_label_key(key).and_then(|()| check_label_value(value)) {
                p.push(
                    "node-labels",
                    None,
                    &args.node_labels,
                    &why,
                    "use Kubernetes label syntax, e.g. --node-labels=zone=a,team=infra",
                );
            }
        }

        let client_ca_file = non_empty_path(&args.client_ca_file);
        if let Some(path) = &client_ca_file
            && let Err(e) = std::fs::metadata(path)
        {
            p.push(
                "client-ca-file",
                Some("VK_CLIENT_CA_FILE"),
                &args.client_ca_file,
                &format!("cannot read it: {e}"),
                "give a readable PEM CA bundle, or leave it empty to use the cluster's \
                 kube-system/extension-apiserver-authentication client CA",
            );
        }

        // Token: read once, trimmed; an empty file means no token.
        let token_file = non_empty_path(&args.sandboxd_token_file);
        let token = match &token_file {
            None => None,
            Some(path) => match std::fs::read_to_string(path) {
                Ok(text) => {
                    let t = text.trim();
                    (!t.is_empty()).then(|| Secret::new(t))
                }
                Err(e) => {
                    p.push(
                        "sandboxd-token-file",
                        Some("SANDBOXD_TOKEN_FILE"),
                        &args.sandboxd_token_file,
                        &format!("cannot read the sandboxd token file: {e}"),
                        "make the file readable by this process, or unset the flag to send \
                         no token",
                    );
                    None
                }
            },
        };

        // State path last: only touch the disk when it can matter.
        let state_path = if args.state_path.is_empty() {
            p.push(
                "state-path",
                Some("VK_STATE_PATH"),
                "",
                "--state-path is required (it holds the claims' release credentials)",
                "give a file path such as /var/lib/vk-sandbox/claims.json",
            );
            None
        } else if !check_state {
            Some(PathBuf::from(&args.state_path))
        } else if p.0.is_empty() {
            let path = PathBuf::from(&args.state_path);
            match ensure_state_writable(&path) {
                Ok(()) => Some(path),
                Err(why) => {
                    p.push(
                        "state-path",
                        Some("VK_STATE_PATH"),
                        &args.state_path,
                        &format!("claims state is not writable: {why}"),
                        "make the directory writable by this process's user (chown, fsGroup, \
                         or a writable volume), or point the flag elsewhere",
                    );
                    None
                }
            }
        } else {
            None
        };

        if !p.0.is_empty() {
            return Err(Error::Config(if p.0.len() == 1 {
                p.0.remove(0)
            } else {
                format!("{} problems:\n  {}", p.0.len(), p.0.join("\n  "))
            }));
        }
        // Every Option below is Some when no problem was recorded.
        let missing = || Error::Config("internal: a validated value is missing".into());
        Ok(Config {
            node_name: args.node_name.clone(),
            node_ip: (!args.node_ip.is_empty()).then(|| args.node_ip.clone()),
            listen_addr: listen_addr.ok_or_else(missing)?,
            admin_addr: admin_addr.ok_or_else(missing)?,
            tls: TlsFiles {
                cert: non_empty_path(&args.tls_cert),
                key: non_empty_path(&args.tls_key),
            },
            capacity: Capacity {
                cpu: cpu.ok_or_else(missing)?,
                memory: memory.ok_or_else(missing)?,
                pods: pods.ok_or_else(missing)?,
            },
            kube: KubeClientConfig {
                kubeconfig: args.kubeconfig.clone(),
                qps: args.kube_api_qps,
                burst: args.kube_api_burst,
            },
            sandboxd: SandboxdConfig {
                url: url.ok_or_else(missing)?,
                advertise_addr,
                token,
                token_file,
            },
            state_path: state_path.ok_or_else(missing)?,
            orphan_scan_interval,
            inventory: InventoryConfig {
                publish: args.publish_inventory,
                interval: publish_interval,
                group: args.inventory_group.trim().to_string(),
            },
            node_labels,
            kubelet_auth: KubeletAuthConfig {
                enabled: args.kubelet_auth,
                anonymous: args.anonymous_auth,
                client_ca_file,
            },
            log_format: args.log_format,
            node_status_interval,
        })
    }
}

fn nanos_to_duration(n: i128) -> Duration {
    let n = u128::try_from(n).unwrap_or(0);
    Duration::new(
        u64::try_from(n / 1_000_000_000).unwrap_or(u64::MAX),
        (n % 1_000_000_000) as u32,
    )
}

/// behaviour.md §1.1: the URL's `host[:port]` authority; if the value does
/// not parse as a URL with a host, the raw value minus trailing `/`.
pub fn advertise_default(sandboxd_url: &str) -> String {
    match url::Url::parse(sandboxd_url) {
        Ok(u) if u.host_str().is_some() => {
            let host = match u.host() {
                Some(url::Host::Ipv6(ip)) => format!("[{ip}]"),
                Some(h) => h.to_string(),
                None => String::new(),
            };
            match u.port() {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }
        }
        _ => sandboxd_url.trim_end_matches('/').to_string(),
    }
}

/// Create the state file's directory (mode 0700, with missing parents) if
/// it does not exist, then prove it writable by creating and removing a
/// probe file (a mode check would lie for root and for ACLs). An existing
/// state file must be openable for writing.
///
/// Note: root bypasses directory permission bits, so a mode-0500 directory
/// passes this check when running as root; the check still refuses when
/// the write really fails (read-only mounts, a parent that is a file, an
/// unprivileged user).
pub fn ensure_state_writable(state_path: &Path) -> std::result::Result<(), String> {
    if state_path.is_dir() {
        return Err(format!(
            "{} is a directory; the flag names the claims file inside it",
            state_path.display()
        ));
    }
    let dir = match state_path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("mkdir state dir {}: {e}", dir.display()))?;
    }
    let probe = dir.join(format!(
        ".vk-sandbox-write-probe-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| format!("cannot create a file in {}: {e}", dir.display()))?;
    std::fs::remove_file(&probe)
        .map_err(|e| format!("cannot remove the probe file {}: {e}", probe.display()))?;
    if state_path.exists() {
        std::fs::OpenOptions::new()
            .append(true)
            .open(state_path)
            .map_err(|e| format!("cannot open {} for writing: {e}", state_path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::os::unix::fs::PermissionsExt;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| map.get(k).cloned()
    }

    fn parse(args: &[&str], env: &[(&str, &str)]) -> Cli {
        let mut argv = vec!["vk-sandbox"];
        argv.extend_from_slice(args);
        parse_from(argv, &env_of(env)).expect("parse")
    }

    /// Args that validate without touching /var/lib: state in a temp dir.
    fn valid(dir: &Path, extra: &[&str]) -> RunArgs {
        let state = format!("--state-path={}", dir.join("claims.json").display());
        let mut args = vec![state.as_str()];
        args.extend_from_slice(extra);
        parse(&args, &[]).run
    }

    #[test]
    fn defaults_match_behaviour_1_1() {
        let cli = parse(&[], &[]);
        let r = &cli.run;
        assert_eq!(r.node_name, "vk-sandboxd");
        assert_eq!(r.node_ip, "");
        assert_eq!(r.listen_addr, ":10260");
        assert_eq!(r.node_cpu, "4000");
        assert_eq!(r.node_memory, "8Ti");
        assert_eq!(r.node_pods, "2000");
        assert_eq!(r.kube_api_qps, 200.0);
        assert_eq!(r.kube_api_burst, 400);
        assert_eq!(r.sandboxd_url, "http://127.0.0.1:7777");
        assert_eq!(r.state_path, "/var/lib/vk-sandbox/claims.json");
        assert_eq!(r.orphan_scan_interval, "60s");
        assert!(!r.publish_inventory);
        assert_eq!(r.publish_interval, "30s");
        assert_eq!(r.node_labels, "sandbox.cocoonstack.io/runtime=sandboxd");
        assert_eq!(r.admin_addr, ":10261");
        assert_eq!(r.inventory_group, "sandbox.cocoonstack.io");
        assert!(r.kubelet_auth);
        assert!(!r.anonymous_auth);
        assert_eq!(r.client_ca_file, "");
        assert_eq!(r.log_format, LogFormat::Text);
        assert_eq!(r.kubeconfig, None);
    }

    // Acceptance test 7.
    #[test]
    fn flag_beats_env_and_empty_env_is_unset() {
        let both = parse(&["--node-name=b"], &[("VK_NODE_NAME", "a")]);
        assert_eq!(both.run.node_name, "b");
        let spaced = parse(&["--node-name", "b"], &[("VK_NODE_NAME", "a")]);
        assert_eq!(spaced.run.node_name, "b");
        let env_only = parse(&[], &[("VK_NODE_NAME", "a")]);
        assert_eq!(env_only.run.node_name, "a");
        let empty = parse(&[], &[("VK_NODE_NAME", "")]);
        assert_eq!(empty.run.node_name, "vk-sandboxd");
        // Empty env for a flag whose default is not empty, and for bools.
        let empty_state = parse(&[], &[("VK_STATE_PATH", ""), ("VK_KUBELET_AUTH", "")]);
        assert_eq!(empty_state.run.state_path, defaults::STATE_PATH);
        assert!(empty_state.run.kubelet_auth);
    }

    #[test]
    fn every_env_var_supplies_a_default() {
        let env = [
            ("VK_NODE_NAME", "n1"),
            ("VK_NODE_IP", "10.1.2.3"),
            ("VK_LISTEN_ADDR", ":1"),
            ("VK_TLS_CERT", "/c"),
            ("VK_TLS_KEY", "/k"),
            ("VK_NODE_CPU", "8"),
            ("VK_NODE_MEMORY", "1Gi"),
            ("VK_NODE_PODS", "10"),
            ("SANDBOXD_URL", "http://h:1"),
            ("SANDBOXD_ADVERTISE_ADDR", "h:2"),
            ("SANDBOXD_TOKEN_FILE", "/t"),
            ("VK_STATE_PATH", "/s"),
            ("VK_ADMIN_ADDR", ":2"),
            ("VK_INVENTORY_GROUP", "g.example"),
            ("VK_CLIENT_CA_FILE", "/ca"),
            ("VK_KUBELET_AUTH", "false"),
            ("VK_ANONYMOUS_AUTH", "true"),
            ("VK_LOG_FORMAT", "json"),
        ];
        let r = parse(&[], &env).run;
        assert_eq!(r.node_name, "n1");
        assert_eq!(r.node_ip, "10.1.2.3");
        assert_eq!(r.listen_addr, ":1");
        assert_eq!(r.tls_cert, "/c");
        assert_eq!(r.tls_key, "/k");
        assert_eq!(r.node_cpu, "8");
        assert_eq!(r.node_memory, "1Gi");
        assert_eq!(r.node_pods, "10");
        assert_eq!(r.sandboxd_url, "http://h:1");
        assert_eq!(r.sandboxd_advertise_addr, "h:2");
        assert_eq!(r.sandboxd_token_file, "/t");
        assert_eq!(r.state_path, "/s");
        assert_eq!(r.admin_addr, ":2");
        assert_eq!(r.inventory_group, "g.example");
        assert_eq!(r.client_ca_file, "/ca");
        assert!(!r.kubelet_auth);
        assert!(r.anonymous_auth);
        assert_eq!(r.log_format, LogFormat::Json);
    }

    #[test]
    fn kubeconfig_is_not_read_from_env() {
        let r = parse(&[], &[("KUBECONFIG", "/x")]).run;
        assert_eq!(r.kubeconfig, None);
        let r = parse(&["--kubeconfig=/y"], &[]).run;
        assert_eq!(r.kubeconfig, Some(PathBuf::from("/y")));
    }

    #[test]
    fn bool_flags_take_go_forms() {
        assert!(parse(&["--publish-inventory"], &[]).run.publish_inventory);
        assert!(
            parse(&["--publish-inventory=true"], &[])
                .run
                .publish_inventory
        );
        assert!(
            !parse(&["--publish-inventory=false"], &[])
                .run
                .publish_inventory
        );
        assert!(!parse(&["--kubelet-auth=false"], &[]).run.kubelet_auth);
        assert!(
            parse(&["--kubelet-auth=true"], &[("VK_KUBELET_AUTH", "false")])
                .run
                .kubelet_auth
        );
        assert!(parse(&["--anonymous-auth"], &[]).run.anonymous_auth);
    }

    #[test]
    fn unknown_flag_is_a_usage_error() {
        let err = parse_from(["vk-sandbox", "--no-such-flag"], &env_of(&[])).unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }

    // Acceptance test 1 (the parsing half; the binary test runs --version).
    #[test]
    fn version_prints_version_line() {
        let err = parse_from(["vk-sandbox", "--version"], &env_of(&[])).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::DisplayVersion);
        assert_eq!(err.exit_code(), 0);
        let text = err.render().to_string();
        assert!(text.starts_with("vk-sandbox "), "{text}");
        assert!(text.contains(" (rev="), "{text}");
        assert!(text.contains(" built="), "{text}");
        assert_eq!(
            text.trim_end(),
            format!("vk-sandbox {}", crate::build_info::VERSION_LINE)
        );
    }

    #[test]
    fn help_names_every_env_var_and_default() {
        let err = parse_from(["vk-sandbox", "--help"], &env_of(&[])).unwrap_err();
        assert_eq!(err.exit_code(), 0);
        let help = err.render().to_string();
        for needle in [
            "--node-name",
            "[env: VK_NODE_NAME]",
            "[default: vk-sandboxd]",
            "[env: VK_LISTEN_ADDR]",
            "[default: :10260]",
            "[env: SANDBOXD_TOKEN_FILE]",
            "[env: VK_STATE_PATH]",
            "[default: /var/lib/vk-sandbox/claims.json]",
            "--kube-api-qps",
            "[default: 200]",
            "--node-labels",
            "[default: sandbox.cocoonstack.io/runtime=sandboxd]",
            "--kubeconfig",
            "[env: VK_ADMIN_ADDR]",
            "[default: :10261]",
            "[env: VK_INVENTORY_GROUP]",
            "--kubelet-auth",
            "[env: VK_KUBELET_AUTH]",
            "--client-ca-file",
            "[env: VK_CLIENT_CA_FILE]",
            "--anonymous-auth",
            "[env: VK_LOG_FORMAT]",
            "--version",
        ] {
            assert!(help.contains(needle), "help lacks {needle:?}:\n{help}");
        }
        assert!(!help.contains("[env: KUBECONFIG"), "{help}");
    }

    #[test]
    fn valid_defaults_build_a_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = Config::from_args(&valid(dir.path(), &[])).expect("config");
        assert_eq!(cfg.node_name, "vk-sandboxd");
        assert_eq!(cfg.node_ip, None);
        assert_eq!(
            cfg.listen_addr,
            ListenAddr {
                host: String::new(),
                port: 10260
            }
        );
        assert_eq!(cfg.admin_addr.port, 10261);
        assert_eq!(cfg.capacity.cpu, Quantity("4000".into()));
        assert_eq!(cfg.capacity.memory, Quantity("8Ti".into()));
        assert_eq!(cfg.capacity.pods, Quantity("2000".into()));
        assert_eq!(cfg.sandboxd.url, "http://127.0.0.1:7777");
        assert_eq!(cfg.sandboxd.advertise_addr, "127.0.0.1:7777");
        assert!(cfg.sandboxd.token.is_none());
        assert_eq!(cfg.orphan_scan_interval, Some(Duration::from_secs(60)));
        assert_eq!(cfg.inventory.interval, Duration::from_secs(30));
        assert!(!cfg.inventory.publish);
        assert_eq!(
            cfg.node_labels,
            BTreeMap::from([(
                "sandbox.cocoonstack.io/runtime".to_string(),
                "sandboxd".to_string()
            )])
        );
        assert_eq!(
            cfg.kubelet_auth,
            KubeletAuthConfig {
                enabled: true,
                anonymous: false,
                client_ca_file: None
            }
        );
        assert_eq!(cfg.tls, TlsFiles::default());
    }

    // Acceptance test 2.
    #[test]
    fn empty_state_path_is_refused() {
        let args = parse(&["--state-path="], &[]).run;
        let err = Config::from_args(&args).unwrap_err().to_string();
        assert!(err.contains("--state-path (env VK_STATE_PATH)"), "{err}");
        assert!(err.contains("--state-path is required"), "{err}");
    }

    #[test]
    fn empty_state_path_from_env_falls_back_to_default() {
        // An empty VK_STATE_PATH counts as unset, so the default applies.
        let args = parse(&[], &[("VK_STATE_PATH", "")]).run;
        assert_eq!(args.state_path, defaults::STATE_PATH);
    }

    // Acceptance test 3 (root-proof variant): a parent that is a regular file.
    #[test]
    fn unwritable_state_dir_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"x").expect("write");
        let state = format!("--state-path={}/sub/claims.json", file.display());
        let args = parse(&[&state], &[]).run;
        let err = Config::from_args(&args).unwrap_err().to_string();
        assert!(err.contains("claims state is not writable"), "{err}");
        assert!(err.contains("mkdir state dir"), "{err}");
        assert!(err.contains("VK_STATE_PATH"), "{err}");
    }

    // Acceptance test 3: a 0500 directory. Root bypasses permission bits,
    // so as root this only checks the probe does not lie in the other
    // direction; as an unprivileged user it must refuse.
    #[test]
    fn mode_0500_state_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state_dir = dir.path().join("state");
        std::fs::create_dir(&state_dir).expect("mkdir");
        std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o500))
            .expect("chmod");
        let result = ensure_state_writable(&state_dir.join("claims.json"));
        let is_root = nix::unistd::Uid::effective().is_root();
        if is_root {
            assert!(result.is_ok(), "root can write anywhere: {result:?}");
        } else {
            let err = result.unwrap_err();
            assert!(err.contains("cannot create a file"), "{err}");
        }
        std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o700))
            .expect("chmod back");
        // The probe leaves nothing behind.
        assert_eq!(std::fs::read_dir(&state_dir).expect("ls").count(), 0);
    }

    #[test]
    fn state_dir_is_created_0700() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("a/b/claims.json");
        ensure_state_writable(&state).expect("writable");
        let mode = std::fs::metadata(dir.path().join("a/b"))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(
            !state.exists(),
            "the claims file itself is not created here"
        );
    }

    #[test]
    fn state_path_that_is_a_directory_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = ensure_state_writable(dir.path()).unwrap_err();
        assert!(err.contains("is a directory"), "{err}");
    }

    // Acceptance test 8.
    #[test]
    fn listen_addr_validation() {
        for bad in [
            "10260", ":0", ":70000", ":http", "", ":", "a:b:1", "[::1]", "[::1:1",
        ] {
            assert!(ListenAddr::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            ListenAddr::parse(":10260").unwrap(),
            ListenAddr {
                host: String::new(),
                port: 10260
            }
        );
        assert_eq!(ListenAddr::parse("127.0.0.1:1").unwrap().host, "127.0.0.1");
        assert_eq!(ListenAddr::parse("[::1]:65535").unwrap().host, "::1");
        assert_eq!(ListenAddr::parse("localhost:80").unwrap().port, 80);
        assert_eq!(ListenAddr::parse("[::1]:8").unwrap().to_string(), "[::1]:8");

        let dir = tempfile::tempdir().expect("tempdir");
        for bad in ["10260", ":0", ":70000", ":http"] {
            let flag = format!("--listen-addr={bad}");
            let err = Config::from_args(&valid(dir.path(), &[&flag]))
                .unwrap_err()
                .to_string();
            assert!(err.contains("parse --listen-addr"), "{err}");
            assert!(err.contains("VK_LISTEN_ADDR"), "{err}");
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
        let err = Config::from_args(&valid(dir.path(), &["--admin-addr=:0"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--admin-addr (env VK_ADMIN_ADDR)"), "{err}");
    }

    #[tokio::test]
    async fn listen_addr_binds() {
        let addr = ListenAddr::parse("127.0.0.1:1").unwrap();
        assert_eq!(
            addr.socket_addrs().await.unwrap(),
            vec![SocketAddr::from(([127, 0, 0, 1], 1))]
        );
        let any = ListenAddr::parse(":10260").unwrap();
        assert_eq!(any.socket_addrs().await.unwrap().len(), 2);
    }

    // Acceptance test 9.
    #[test]
    fn quantity_validation() {
        for good in [
            "4000", "8Ti", "2000", "500m", "1.5", "0.5Gi", ".5", "1e3", "1E-2", "+1", "1k", "1M",
            "2Ei", "3n", "7u",
        ] {
            assert!(validate_quantity(good).is_ok(), "{good:?} refused");
        }
        for bad in [
            "abc", "", "0", "0.0", "0Gi", "-1", "1.2.3", "1KB", "1ki", "Gi", "1e", "1 Gi", "1Gi ",
            ".", "1x",
        ] {
            assert!(validate_quantity(bad).is_err(), "{bad:?} accepted");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let err = Config::from_args(&valid(dir.path(), &["--node-cpu=abc"]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--node-cpu (env VK_NODE_CPU)=\"abc\""),
            "{err}"
        );
        assert!(err.contains("Kubernetes quantity"), "{err}");
        let err = Config::from_args(&valid(dir.path(), &["--node-pods=0"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("it is zero"), "{err}");
    }

    #[test]
    fn several_problems_are_reported_together_and_disk_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("new/claims.json");
        let flag = format!("--state-path={}", state.display());
        let args = parse(&[&flag, "--node-cpu=abc", "--node-memory=-1"], &[]).run;
        let err = Config::from_args(&args).unwrap_err().to_string();
        assert!(
            err.starts_with("invalid configuration: 2 problems"),
            "{err}"
        );
        assert!(err.contains("--node-cpu"), "{err}");
        assert!(err.contains("--node-memory"), "{err}");
        assert!(
            !dir.path().join("new").exists(),
            "no state dir when invalid"
        );
    }

    #[test]
    fn go_durations() {
        let s = 1_000_000_000i128;
        for (raw, want) in [
            ("0", 0),
            ("60s", 60 * s),
            ("1m30s", 90 * s),
            ("500ms", s / 2),
            ("1h", 3600 * s),
            ("1.5s", 3 * s / 2),
            (".5s", s / 2),
            ("-1s", -s),
            ("+2m", 120 * s),
            ("-0", 0),
            ("1us", 1000),
            ("1µs", 1000),
            ("3ns", 3),
            ("1h2m3s4ms", 3723 * s + 4_000_000),
        ] {
            assert_eq!(parse_go_duration(raw), Ok(want), "{raw}");
        }
        for bad in ["", "60", "1x", "s", "1..5s", "1s2", "-", "1 s", "10d"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn intervals() {
        let dir = tempfile::tempdir().expect("tempdir");
        for off in ["0", "-5s"] {
            let flag = format!("--orphan-scan-interval={off}");
            let cfg = Config::from_args(&valid(dir.path(), &[&flag])).expect("config");
            assert_eq!(cfg.orphan_scan_interval, None, "{off}");
        }
        let cfg =
            Config::from_args(&valid(dir.path(), &["--orphan-scan-interval", "-5s"])).unwrap();
        assert_eq!(cfg.orphan_scan_interval, None);
        let err = Config::from_args(&valid(dir.path(), &["--orphan-scan-interval=60"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--orphan-scan-interval=\"60\""), "{err}");

        let err = Config::from_args(&valid(
            dir.path(),
            &["--publish-inventory", "--publish-interval=0"],
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("greater than zero"), "{err}");
        let cfg = Config::from_args(&valid(dir.path(), &["--publish-interval=0"])).unwrap();
        assert_eq!(cfg.inventory.interval, Duration::ZERO);
        let cfg = Config::from_args(&valid(
            dir.path(),
            &["--publish-inventory", "--publish-interval=1m30s"],
        ))
        .unwrap();
        assert!(cfg.inventory.publish);
        assert_eq!(cfg.inventory.interval, Duration::from_secs(90));
    }

    // Acceptance test 10 (configuration half).
    #[test]
    fn token_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, " tok\n").unwrap();
        let flag = format!("--sandboxd-token-file={}", path.display());
        let cfg = Config::from_args(&valid(dir.path(), &[&flag])).unwrap();
        let token = cfg.sandboxd.token.as_ref().expect("token");
        assert_eq!(token.expose(), "tok");
        assert!(!format!("{cfg:?}").contains("tok\""), "token is redacted");

        std::fs::write(&path, " \n").unwrap();
        let cfg = Config::from_args(&valid(dir.path(), &[&flag])).unwrap();
        assert!(cfg.sandboxd.token.is_none(), "empty file = no token");

        let missing = format!(
            "--sandboxd-token-file={}",
            dir.path().join("nope").display()
        );
        let err = Config::from_args(&valid(dir.path(), &[&missing]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--sandboxd-token-file (env SANDBOXD_TOKEN_FILE)"),
            "{err}"
        );
        assert!(err.contains("cannot read the sandboxd token file"), "{err}");
        // A directory is unreadable as a token file too (even for root).
        let dir_flag = format!("--sandboxd-token-file={}", dir.path().display());
        assert!(Config::from_args(&valid(dir.path(), &[&dir_flag])).is_err());
    }

    // Acceptance test 14 (configuration half).
    #[test]
    fn node_labels_parsing() {
        let labels = parse_node_labels("a=b, c=,bad,=x,type=vk");
        assert_eq!(
            labels,
            BTreeMap::from([
                ("a".to_string(), "b".to_string()),
                ("c".to_string(), String::new()),
                ("type".to_string(), "vk".to_string()),
            ])
        );
        let labels = parse_node_labels("a=1,a=2, x = y=z ");
        assert_eq!(labels["a"], "2");
        assert_eq!(labels["x"], "y=z");
        assert!(parse_node_labels("").is_empty());

        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = Config::from_args(&valid(
            dir.path(),
            &["--node-labels=a=b, c=,bad,=x,type=vk"],
        ))
        .unwrap();
        assert_eq!(cfg.node_labels.len(), 3);
        assert!(
            !cfg.node_labels
                .contains_key("sandbox.cocoonstack.io/runtime"),
            "setting the flag replaces the default"
        );
        let err = Config::from_args(&valid(dir.path(), &["--node-labels=a=b c"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("label value"), "{err}");
        let err = Config::from_args(&valid(dir.path(), &["--node-labels=Bad_/x=1"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("DNS subdomain"), "{err}");
    }

    #[test]
    fn label_syntax() {
        assert!(check_label_key("kubernetes.io/role").is_ok());
        assert!(check_label_key("a").is_ok());
        assert!(check_label_key("-a").is_err());
        assert!(check_label_key("/a").is_err());
        assert!(check_label_key(&"a".repeat(64)).is_err());
        assert!(check_label_value("").is_ok());
        assert!(check_label_value("v1.2_3-x").is_ok());
        assert!(check_label_value("x-").is_err());
    }

    #[test]
    fn sandboxd_url_and_advertise() {
        assert_eq!(advertise_default("http://127.0.0.1:7777"), "127.0.0.1:7777");
        assert_eq!(advertise_default("http://sbx.local/"), "sbx.local");
        assert_eq!(advertise_default("https://[::1]:9/"), "[::1]:9");
        assert_eq!(advertise_default("not a url/"), "not a url");
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = Config::from_args(&valid(
            dir.path(),
            &["--sandboxd-url=http://10.0.0.1:7777/"],
        ))
        .unwrap();
        assert_eq!(cfg.sandboxd.url, "http://10.0.0.1:7777");
        assert_eq!(cfg.sandboxd.advertise_addr, "10.0.0.1:7777");
        let cfg = Config::from_args(&valid(
            dir.path(),
            &["--sandboxd-advertise-addr=sbx.example:7777"],
        ))
        .unwrap();
        assert_eq!(cfg.sandboxd.advertise_addr, "sbx.example:7777");
        let err = Config::from_args(&valid(dir.path(), &["--sandboxd-url=ftp://x"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--sandboxd-url (env SANDBOXD_URL)"), "{err}");
    }

    #[test]
    fn kubelet_auth_flags() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "x").unwrap();
        let flag = format!("--client-ca-file={}", ca.display());
        let cfg = Config::from_args(&valid(
            dir.path(),
            &["--kubelet-auth=false", "--anonymous-auth", &flag],
        ))
        .unwrap();
        assert!(!cfg.kubelet_auth.enabled);
        assert!(cfg.kubelet_auth.anonymous);
        assert_eq!(cfg.kubelet_auth.client_ca_file, Some(ca));
        let err = Config::from_args(&valid(dir.path(), &["--client-ca-file=/nonexistent"]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--client-ca-file (env VK_CLIENT_CA_FILE)"),
            "{err}"
        );
    }

    #[test]
    fn tls_and_node_ip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = Config::from_args(&valid(
            dir.path(),
            &[
                "--tls-cert=/c.pem",
                "--tls-key=/k.pem",
                "--node-ip=10.1.2.3",
            ],
        ))
        .unwrap();
        assert_eq!(cfg.tls.cert, Some(PathBuf::from("/c.pem")));
        assert_eq!(cfg.tls.key, Some(PathBuf::from("/k.pem")));
        assert_eq!(cfg.node_ip.as_deref(), Some("10.1.2.3"));
    }

    #[test]
    fn qps_and_burst() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = Config::from_args(&valid(dir.path(), &["--kube-api-qps=0"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--kube-api-qps"), "{err}");
        let err = parse_from(["vk-sandbox", "--kube-api-burst=x"], &env_of(&[])).unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn preflight_subcommand_takes_the_same_flags_and_env() {
        let plain = parse(&["--node-name=a"], &[]);
        assert!(plain.command.is_none());
        assert_eq!(plain.run.node_name, "a");

        let cli = parse(
            &["preflight", "--node-name=b", "--publish-inventory"],
            &[("VK_STATE_PATH", "/s"), ("VK_NODE_NAME", "ignored")],
        );
        let Some(Command::Preflight(args)) = cli.command else {
            panic!("no preflight subcommand: {cli:?}");
        };
        assert_eq!(args.node_name, "b");
        assert_eq!(args.state_path, "/s", "env supplies preflight defaults too");
        assert!(args.publish_inventory);
        assert_eq!(args.listen_addr, defaults::LISTEN_ADDR);

        // Flags belong after the subcommand.
        let err =
            parse_from(["vk-sandbox", "--node-name=a", "preflight"], &env_of(&[])).unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn validation_without_state_check_touches_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("missing/claims.json");
        let args = parse(&[&format!("--state-path={}", state.display())], &[]).run;
        let cfg = Config::from_args_without_state_check(&args).unwrap();
        assert_eq!(cfg.state_path, state);
        assert!(!dir.path().join("missing").exists());
        let bad = parse(&["--listen-addr=x"], &[]).run;
        assert!(Config::from_args_without_state_check(&bad).is_err());
    }
}
