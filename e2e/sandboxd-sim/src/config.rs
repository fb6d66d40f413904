//! Simulator configuration: the `--config` JSON file, the command-line
//! flags layered over it, and the parts that can change at run time.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Everything the simulator can be configured with. Every field has a
/// default, so `{}` is a valid config file (open mode, no pools).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// API (and admin, under `/_sim`) listen address.
    pub listen: Option<SocketAddr>,
    /// Optional second listener serving only the admin API; it stays up
    /// while the API listener refuses connections.
    pub admin_listen: Option<SocketAddr>,
    /// Where claims are persisted (atomic rename on every change) and
    /// reloaded from at start-up and on a simulated restart.
    pub state_file: Option<PathBuf>,
    /// Root token; empty together with no tenants means open mode.
    pub api_token: String,
    pub tenants: Vec<TenantConfig>,
    /// Whether a tenant token may list (newer builds: its own claims only)
    /// or gets 403 (older builds).
    pub tenant_list: TenantList,
    /// `owner_addr` in claim replies, `host:port`.
    pub advertise_addr: String,
    pub owner_addr_mode: OwnerAddrMode,
    /// The origin emitted in `origin` mode.
    pub origin: String,
    /// Live-claim cap; 0 is unlimited.
    pub max_claims: u32,
    pub draining: bool,
    /// Peer addresses; when non-empty, warm misses and quota/drain refusals
    /// become `200 {"redirect":[…]}`.
    pub peers: Vec<String>,
    /// Whether the node has an egress attachment (`net:"egress"` else 409).
    pub egress: bool,
    pub pools: Vec<PoolConfig>,
    /// How long a warm miss takes to provision before it succeeds.
    pub provision_delay_ms: u64,
    /// Extra time every claim (warm hit or miss) takes before it is
    /// decided, in microseconds: models the real daemon's VM hand-over
    /// (0.2–0.7 ms). 0 (the default) answers at once.
    pub claim_delay_us: u64,
    /// How long a refill of one warm VM takes.
    pub refill_delay_ms: u64,
    /// Reaper period; 0 disables the periodic reaper (`reap now` still works).
    pub reap_interval_ms: u64,
    /// A provisioning claim completes even when its client hangs up.
    pub provision_survives_disconnect: bool,
    /// Start the simulated clock at this instant instead of real time.
    pub clock_start: Option<jiff::Timestamp>,
    /// Freeze the simulated clock (it then moves only by admin calls).
    pub clock_frozen: bool,
    /// How long a hibernate takes (memory snapshot and VM stop; sandboxd
    /// measures 0.17–0.27 s for a 512 MiB VM). 0 for fast tests.
    pub hibernate_delay_ms: u64,
    /// How long a wake takes (memory restore; ~55 ms median). Also the
    /// implicit wake of a relay call. 0 for fast tests.
    pub wake_delay_ms: u64,
    /// Idle hibernation: a claim with no data-plane activity (and no open
    /// relay) for this long on the simulated clock is hibernated by the
    /// sweep. 0 (the default) turns it off, as sandboxd's default.
    pub idle_hibernate_seconds: u64,
    /// Archive tier: a hibernated claim idle this long is archived (VM
    /// dropped, deadline becomes the retention window). 0 = off.
    pub archive_after_seconds: u64,
    /// Retention of a claim archived by the archive tier; 0 keeps it for
    /// ever (zero deadline).
    pub archive_delete_after_seconds: u64,
    /// VMs that can run at once (warm, refilling and running claims;
    /// hibernated and archived ones use no slot). 0 = unlimited. At the
    /// limit refills park (`at_capacity` in info), warm misses and wakes
    /// fail with 500.
    pub max_running: u32,
    /// Where each VM's scratch directory is made (the agent runs commands
    /// there). Default: a fresh directory in the system's temp directory,
    /// removed when the simulator stops.
    pub scratch_dir: Option<PathBuf>,
    /// The guest shell `pty_open` starts; empty = `/bin/bash` if present,
    /// else `/bin/sh`.
    pub agent_shell: String,
    /// Where guest ports lead: `(sandbox or template, guest port) →
    /// 127.0.0.1:PORT`, an explicit override of the guest's own port. A
    /// relay to an unmapped port dials the guest's 127.0.0.1:PORT (inside
    /// its network namespace); nothing listening there is a 502.
    pub port_map: Vec<PortMapping>,
    /// Each VM's guest network: a network namespace per VM (`namespaces`),
    /// the host's loopback (`host`), or namespaces where the simulator may
    /// make them and the host's loopback otherwise (`auto`, the default).
    pub guest_network: GuestNetworkMode,
    /// Late builds: the root token on `/ports` opens a passive relay (no
    /// wake, 409 for a paused sandbox). Off: root gets 404 like a wrong
    /// token (mid builds).
    pub passive_root_ports: bool,
    pub quirks: Quirks,
}

/// One guest port's destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortMapping {
    /// This sandbox only (takes precedence over a template mapping).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// Every sandbox of this template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    pub guest_port: u16,
    /// A loopback address.
    pub target: SocketAddr,
}

impl PortMapping {
    pub fn validate(&self) -> Result<(), String> {
        if self.sandbox.is_some() == self.template.is_some() {
            return Err("a port mapping names exactly one of sandbox and template".into());
        }
        if self.guest_port == 0 {
            return Err("guest_port must be 1-65535".into());
        }
        if !self.target.ip().is_loopback() {
            return Err(format!(
                "target {} is not a loopback address (the simulator relays to 127.0.0.0/8 and ::1 only)",
                self.target
            ));
        }
        Ok(())
    }

    /// Parse `SANDBOX_OR_TEMPLATE:GUEST_PORT=HOST:PORT`; a first part that
    /// starts with `sb_` is a sandbox id, anything else a template.
    pub fn parse_spec(spec: &str) -> Result<PortMapping, String> {
        let want = || format!("port {spec:?}: want SANDBOX_OR_TEMPLATE:GUEST_PORT=127.0.0.1:PORT");
        let (left, target) = spec.rsplit_once('=').ok_or_else(want)?;
        let (scope, port) = left.rsplit_once(':').ok_or_else(want)?;
        let guest_port = port.parse::<u16>().map_err(|_| want())?;
        let target = target.parse::<SocketAddr>().map_err(|_| want())?;
        let (sandbox, template) = if scope.starts_with("sb_") {
            (Some(scope.to_string()), None)
        } else {
            (None, Some(scope.to_string()))
        };
        let m = PortMapping {
            sandbox,
            template,
            guest_port,
            target,
        };
        m.validate().map_err(|e| format!("port {spec:?}: {e}"))?;
        Ok(m)
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            listen: None,
            admin_listen: None,
            state_file: None,
            api_token: String::new(),
            tenants: Vec::new(),
            tenant_list: TenantList::Forbidden,
            advertise_addr: "10.0.0.5:7777".to_string(),
            owner_addr_mode: OwnerAddrMode::HostPort,
            origin: "https://node-a.example:7777".to_string(),
            max_claims: 0,
            draining: false,
            peers: Vec::new(),
            egress: true,
            pools: Vec::new(),
            provision_delay_ms: 100,
            claim_delay_us: 0,
            refill_delay_ms: 1000,
            reap_interval_ms: 5000,
            provision_survives_disconnect: true,
            clock_start: None,
            clock_frozen: false,
            hibernate_delay_ms: 250,
            wake_delay_ms: 55,
            idle_hibernate_seconds: 0,
            archive_after_seconds: 0,
            archive_delete_after_seconds: 0,
            max_running: 0,
            scratch_dir: None,
            agent_shell: String::new(),
            port_map: Vec::new(),
            guest_network: GuestNetworkMode::Auto,
            passive_root_ports: true,
            quirks: Quirks::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    pub token: String,
    /// Live-claim cap for this tenant; 0 is unlimited.
    #[serde(default)]
    pub max_claims: u32,
}

/// Where the VMs' guest networks are (`guest_network`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum GuestNetworkMode {
    /// A namespace per VM where the simulator may make them (root), else
    /// the host's loopback, said at start-up.
    #[default]
    Auto,
    /// A namespace per VM; the simulator does not start without them.
    Namespaces,
    /// The host's loopback: guest port N is the host's 127.0.0.1:N.
    Host,
}

impl std::str::FromStr for GuestNetworkMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(GuestNetworkMode::Auto),
            "namespaces" => Ok(GuestNetworkMode::Namespaces),
            "host" => Ok(GuestNetworkMode::Host),
            other => Err(format!(
                "guest network {other:?}: want auto, namespaces or host"
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TenantList {
    /// Older builds: listing is root-only, a tenant gets 403.
    #[default]
    Forbidden,
    /// Newer builds: a tenant sees only its own claims.
    Own,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OwnerAddrMode {
    /// `advertise_addr` as is (default `10.0.0.5:7777`).
    #[default]
    HostPort,
    /// Older builds without an advertise host: `":7777"`.
    HostLess,
    /// Newer builds without an advertise host: field left out.
    Omit,
    /// `client_advertise`: the configured origin.
    Origin,
}

/// One configured pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub template: String,
    #[serde(default = "default_net")]
    pub net: String,
    #[serde(default = "default_size")]
    pub size: String,
    /// Warm VMs at start.
    #[serde(default)]
    pub warm: u32,
    /// Refill target; defaults to `warm`.
    #[serde(default)]
    pub target: Option<u32>,
    #[serde(default = "yes")]
    pub golden: bool,
    /// Hibernated claims of this pool are archived, not destroyed, at their
    /// deadline.
    #[serde(default)]
    pub archive_on_expire: bool,
    /// Retention of an archived claim; 0 keeps it forever (zero deadline).
    #[serde(default)]
    pub archive_retention_seconds: u64,
}

fn default_net() -> String {
    "none".to_string()
}

fn default_size() -> String {
    "small".to_string()
}

fn yes() -> bool {
    true
}

impl PoolConfig {
    /// Parse `TEMPLATE[@NET[/SIZE]]=WARM[/TARGET]`, e.g. `base:24.04=4` or
    /// `rt:24.04@egress/medium=1/2`.
    pub fn parse_spec(spec: &str) -> Result<PoolConfig, String> {
        let (key, counts) = spec
            .rsplit_once('=')
            .ok_or_else(|| format!("pool {spec:?}: want TEMPLATE[@NET[/SIZE]]=WARM[/TARGET]"))?;
        let (template, lane) = match key.split_once('@') {
            Some((t, lane)) => (t, Some(lane)),
            None => (key, None),
        };
        if template.is_empty() {
            return Err(format!("pool {spec:?}: empty template"));
        }
        let (net, size) = match lane {
            None => (default_net(), default_size()),
            Some(lane) => match lane.split_once('/') {
                Some((n, s)) => (n.to_string(), s.to_string()),
                None => (lane.to_string(), default_size()),
            },
        };
        let number = |s: &str| {
            s.parse::<u32>()
                .map_err(|_| format!("pool {spec:?}: {s:?} is not a count"))
        };
        let (warm, target) = match counts.split_once('/') {
            Some((w, t)) => (number(w)?, Some(number(t)?)),
            None => (number(counts)?, None),
        };
        Ok(PoolConfig {
            template: template.to_string(),
            net,
            size,
            warm,
            target,
            golden: true,
            archive_on_expire: false,
            archive_retention_seconds: 0,
        })
    }
}

/// Malformed or version-dependent reply shapes (deadline, engine, extra fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Quirks {
    /// How `deadline` is written in claim replies and list rows.
    pub deadline: DeadlineQuirk,
    /// Write deadlines in this fixed UTC offset (minutes), like a sandboxd
    /// host whose local zone is not UTC.
    pub deadline_offset_minutes: i32,
    /// Add unknown fields to every reply object.
    pub extra_fields: bool,
    /// Add `"engine":"ch"` to every pool key, as intermediate builds did.
    pub engine_in_key: bool,
    /// Leave `token` out of `GET /v1/sandboxes/{id}` (mid builds; late
    /// builds hand it to the root token).
    pub no_token_in_get: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DeadlineQuirk {
    #[default]
    Normal,
    Missing,
    Zero,
    Unparseable,
}

/// Run-time changes through the admin API: only the fields given change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConfigPatch {
    pub api_token: Option<String>,
    pub tenants: Option<Vec<TenantConfig>>,
    pub tenant_list: Option<TenantList>,
    pub advertise_addr: Option<String>,
    pub owner_addr_mode: Option<OwnerAddrMode>,
    pub origin: Option<String>,
    pub max_claims: Option<u32>,
    pub draining: Option<bool>,
    pub peers: Option<Vec<String>>,
    pub egress: Option<bool>,
    pub provision_delay_ms: Option<u64>,
    pub claim_delay_us: Option<u64>,
    pub refill_delay_ms: Option<u64>,
    pub provision_survives_disconnect: Option<bool>,
    pub hibernate_delay_ms: Option<u64>,
    pub wake_delay_ms: Option<u64>,
    pub idle_hibernate_seconds: Option<u64>,
    pub archive_after_seconds: Option<u64>,
    pub archive_delete_after_seconds: Option<u64>,
    pub max_running: Option<u32>,
    pub agent_shell: Option<String>,
    pub passive_root_ports: Option<bool>,
    pub quirks: Option<Quirks>,
}

impl ConfigPatch {
    pub fn apply(self, cfg: &mut SimConfig) {
        macro_rules! set {
            ($($f:ident),*) => {$(if let Some(v) = self.$f { cfg.$f = v; })*};
        }
        set!(
            api_token,
            tenants,
            tenant_list,
            advertise_addr,
            owner_addr_mode,
            origin,
            max_claims,
            draining,
            peers,
            egress,
            provision_delay_ms,
            claim_delay_us,
            refill_delay_ms,
            provision_survives_disconnect,
            hibernate_delay_ms,
            wake_delay_ms,
            idle_hibernate_seconds,
            archive_after_seconds,
            archive_delete_after_seconds,
            max_running,
            agent_shell,
            passive_root_ports,
            quirks
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_specs() {
        let p = PoolConfig::parse_spec("base:24.04=4").expect("spec");
        assert_eq!(
            (
                p.template.as_str(),
                p.net.as_str(),
                p.size.as_str(),
                p.warm,
                p.target
            ),
            ("base:24.04", "none", "small", 4, None)
        );
        let p = PoolConfig::parse_spec("rt:24.04@egress/medium=1/2").expect("spec");
        assert_eq!(
            (
                p.template.as_str(),
                p.net.as_str(),
                p.size.as_str(),
                p.warm,
                p.target
            ),
            ("rt:24.04", "egress", "medium", 1, Some(2))
        );
        for bad in ["base", "=3", "base=x", "base=1/y"] {
            assert!(PoolConfig::parse_spec(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn claim_delay_us_is_configurable_and_patchable() {
        let cfg: SimConfig = serde_json::from_str(r#"{"claim_delay_us":500}"#).expect("config");
        assert_eq!(cfg.claim_delay_us, 500);
        assert_eq!(SimConfig::default().claim_delay_us, 0);
        let mut cfg = SimConfig::default();
        let patch: ConfigPatch = serde_json::from_str(r#"{"claim_delay_us":250}"#).expect("patch");
        patch.apply(&mut cfg);
        assert_eq!(cfg.claim_delay_us, 250);
        ConfigPatch::default().apply(&mut cfg);
        assert_eq!(
            cfg.claim_delay_us, 250,
            "an absent field leaves it unchanged"
        );
    }

    #[test]
    fn port_mappings() {
        let m = PortMapping::parse_spec("base:24.04:8080=127.0.0.1:18080").expect("template");
        assert_eq!(m.template.as_deref(), Some("base:24.04"));
        assert_eq!((m.guest_port, m.target.port()), (8080, 18080));
        let m = PortMapping::parse_spec("sb_0123456789abcdef:22=127.0.0.2:2222").expect("sandbox");
        assert_eq!(m.sandbox.as_deref(), Some("sb_0123456789abcdef"));
        for bad in [
            "base:8080",
            "base:0=127.0.0.1:1",
            "base:x=127.0.0.1:1",
            "base:80=10.0.0.1:80",
            "base:80=localhost:80",
        ] {
            assert!(PortMapping::parse_spec(bad).is_err(), "{bad}");
        }
        let both = PortMapping {
            sandbox: Some("sb_1".into()),
            template: Some("t".into()),
            guest_port: 1,
            target: "127.0.0.1:1".parse().expect("addr"),
        };
        assert!(both.validate().is_err());
    }

    #[test]
    fn empty_config_file_is_valid() {
        let cfg: SimConfig = serde_json::from_str("{}").expect("config");
        assert_eq!(cfg, SimConfig::default());
        assert!(serde_json::from_str::<SimConfig>(r#"{"bogus":1}"#).is_err());
    }
}
