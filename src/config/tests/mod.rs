use super::cli::*;
use super::settings::*;
use super::values::*;
use super::*;
use crate::claims::dir::ensure_state_writable;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod values;

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
fn defaults_match_the_documented_defaults() {
    let cli = parse(&[], &[]);
    let r = &cli.run;
    assert_eq!(r.node.node_name, "vk-sandboxd");
    assert_eq!(r.node.node_ip, "");
    assert_eq!(r.kubelet.listen_addr, ":10260");
    // Unset: sized by sandboxd's claim cap when known, else the defaults.
    assert_eq!(r.node.node_cpu, "");
    assert_eq!(r.node.node_memory, "");
    assert_eq!(r.node.node_pods, "");
    assert!(r.fleet.node_capacity_from_sandboxd);
    assert!(r.fleet.node_conditions_from_sandboxd);
    assert!(r.fleet.node_taints_from_sandboxd);
    assert_eq!(r.fleet.sandboxd_max_claims, 0);
    assert_eq!(r.fleet.sandboxd_info_interval, "2s");
    assert_eq!(r.kube.kube_api_qps, 200.0);
    assert_eq!(r.kube.kube_api_burst, 400);
    assert_eq!((r.kube.event_qps, r.kube.event_burst), (200.0, 400));
    assert_eq!(r.sandboxd.sandboxd_url, "http://127.0.0.1:7777");
    assert_eq!(r.state.state_path, "/var/lib/vk-sandbox/claims.json");
    assert_eq!(r.audit.orphan_scan_interval, "60s");
    assert!(!r.inventory.publish_inventory);
    assert_eq!(r.inventory.publish_interval, "30s");
    assert_eq!(
        r.node.node_labels,
        "sandbox.cocoonstack.io/runtime=sandboxd"
    );
    assert_eq!(r.admin.admin_addr, ":10261");
    assert_eq!(r.inventory.inventory_group, None, "unset: discovered");
    assert!(r.kubelet.kubelet_auth);
    assert!(!r.kubelet.anonymous_auth);
    assert_eq!(r.kubelet.client_ca_file, "");
    assert_eq!(r.admin.log_format, LogFormat::Text);
    assert_eq!(r.kube.kubeconfig, None);
    assert!(r.lifecycle.hibernate_on_suspend);
    assert_eq!(r.lifecycle.lease_renew_margin, "12h");
}

// An explicit flag beats its environment variable; an empty variable is unset.
#[test]
fn flag_beats_env_and_empty_env_is_unset() {
    let both = parse(&["--node-name=b"], &[("VK_NODE_NAME", "a")]);
    assert_eq!(both.run.node.node_name, "b");
    let spaced = parse(&["--node-name", "b"], &[("VK_NODE_NAME", "a")]);
    assert_eq!(spaced.run.node.node_name, "b");
    let env_only = parse(&[], &[("VK_NODE_NAME", "a")]);
    assert_eq!(env_only.run.node.node_name, "a");
    let empty = parse(&[], &[("VK_NODE_NAME", "")]);
    assert_eq!(empty.run.node.node_name, "vk-sandboxd");
    // Empty env for a flag whose default is not empty, and for bools.
    let empty_state = parse(&[], &[("VK_STATE_PATH", ""), ("VK_KUBELET_AUTH", "")]);
    assert_eq!(empty_state.run.state.state_path, defaults::STATE_PATH);
    assert!(empty_state.run.kubelet.kubelet_auth);
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
        ("VK_HIBERNATE_ON_SUSPEND", "false"),
        ("VK_LEASE_RENEW_MARGIN", "1h"),
    ];
    let r = parse(&[], &env).run;
    assert_eq!(r.node.node_name, "n1");
    assert_eq!(r.node.node_ip, "10.1.2.3");
    assert_eq!(r.kubelet.listen_addr, ":1");
    assert_eq!(r.kubelet.tls_cert, "/c");
    assert_eq!(r.kubelet.tls_key, "/k");
    assert_eq!(r.node.node_cpu, "8");
    assert_eq!(r.node.node_memory, "1Gi");
    assert_eq!(r.node.node_pods, "10");
    assert_eq!(r.sandboxd.sandboxd_url, "http://h:1");
    assert_eq!(r.inventory.sandboxd_advertise_addr, "h:2");
    assert_eq!(r.sandboxd.sandboxd_token_file, "/t");
    assert_eq!(r.state.state_path, "/s");
    assert_eq!(r.admin.admin_addr, ":2");
    assert_eq!(r.inventory.inventory_group.as_deref(), Some("g.example"));
    assert_eq!(r.kubelet.client_ca_file, "/ca");
    assert!(!r.kubelet.kubelet_auth);
    assert!(r.kubelet.anonymous_auth);
    assert_eq!(r.admin.log_format, LogFormat::Json);
    assert!(!r.lifecycle.hibernate_on_suspend);
    assert_eq!(r.lifecycle.lease_renew_margin, "1h");
}

#[test]
fn kubeconfig_is_not_read_from_env() {
    let r = parse(&[], &[("KUBECONFIG", "/x")]).run;
    assert_eq!(r.kube.kubeconfig, None);
    let r = parse(&["--kubeconfig=/y"], &[]).run;
    assert_eq!(r.kube.kubeconfig, Some(PathBuf::from("/y")));
}

#[test]
fn bool_flags_take_go_forms() {
    assert!(
        parse(&["--publish-inventory"], &[])
            .run
            .inventory
            .publish_inventory
    );
    assert!(
        parse(&["--publish-inventory=true"], &[])
            .run
            .inventory
            .publish_inventory
    );
    assert!(
        !parse(&["--publish-inventory=false"], &[])
            .run
            .inventory
            .publish_inventory
    );
    assert!(
        !parse(&["--kubelet-auth=false"], &[])
            .run
            .kubelet
            .kubelet_auth
    );
    assert!(
        parse(&["--kubelet-auth=true"], &[("VK_KUBELET_AUTH", "false")])
            .run
            .kubelet
            .kubelet_auth
    );
    assert!(parse(&["--anonymous-auth"], &[]).run.kubelet.anonymous_auth);
}

#[test]
fn unknown_flag_is_a_usage_error() {
    let err = parse_from(["vk-sandbox", "--no-such-flag"], &env_of(&[])).unwrap_err();
    assert_eq!(err.exit_code(), 2);
}

// `--version` prints the version line and exits 0 (the parsing half; the
// binary test runs --version).
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
        "--hibernate-on-suspend",
        "[env: VK_HIBERNATE_ON_SUSPEND]",
        "--lease-renew-margin",
        "[env: VK_LEASE_RENEW_MARGIN]",
        "[default: 12h]",
        "--streaming-idle-timeout",
        "[env: VK_STREAMING_IDLE_TIMEOUT]",
        "[default: 4h]",
        "--max-streaming-sessions",
        "[env: VK_MAX_STREAMING_SESSIONS]",
        "--max-streaming-sessions-per-pod",
        "--max-streams-per-session",
        "[env: VK_MAX_STREAMS_PER_SESSION]",
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
    assert!(!(cfg.capacity.cpu_fixed || cfg.capacity.memory_fixed || cfg.capacity.pods_fixed));
    assert_eq!(
        (cfg.fleet.max_claims, cfg.fleet.info_interval),
        (None, Duration::from_secs(2))
    );
    assert!(cfg.fleet.capacity && cfg.fleet.conditions && cfg.fleet.taints);
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
    assert_eq!(
        cfg.lifecycle,
        LifecycleConfig {
            hibernate_on_suspend: true,
            renew_margin: Duration::from_secs(12 * 3600),
        }
    );
}

#[test]
fn lease_renew_margin_is_a_duration_zero_or_more() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (flag, want) in [
        ("--lease-renew-margin=0", Duration::ZERO),
        ("--lease-renew-margin=90m", Duration::from_secs(5400)),
        ("--lease-renew-margin=1h30m", Duration::from_secs(5400)),
    ] {
        let cfg = Config::from_args(&valid(dir.path(), &[flag])).expect(flag);
        assert_eq!(cfg.lifecycle.renew_margin, want, "{flag}");
    }
    let cfg =
        Config::from_args(&valid(dir.path(), &["--hibernate-on-suspend=false"])).expect("bool");
    assert!(!cfg.lifecycle.hibernate_on_suspend);
    for bad in ["--lease-renew-margin=-1h", "--lease-renew-margin=soon"] {
        let err = Config::from_args(&valid(dir.path(), &[bad]))
            .expect_err(bad)
            .to_string();
        assert!(
            err.contains("--lease-renew-margin (env VK_LEASE_RENEW_MARGIN)") && err.contains("12h"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn streaming_limits_default_to_the_kubelets_and_are_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = Config::from_args(&valid(dir.path(), &[])).expect("defaults");
    assert_eq!(cfg.streaming, StreamingConfig::default());
    assert_eq!(
        cfg.streaming,
        StreamingConfig {
            idle_timeout: Some(Duration::from_secs(4 * 3600)),
            max_sessions: 512,
            max_sessions_per_pod: 16,
            max_streams_per_session: 512,
        },
        "the documented defaults"
    );
    assert_eq!(cfg.kubelet().streaming, cfg.streaming);
    let args = parse(
        &[
            "--state-path=/x",
            "--max-streaming-sessions=9",
            "--streaming-idle-timeout=0",
        ],
        &[
            ("VK_MAX_STREAMING_SESSIONS_PER_POD", "3"),
            ("VK_MAX_STREAMS_PER_SESSION", "5"),
            ("VK_MAX_STREAMING_SESSIONS", "7"),
            ("VK_STREAMING_IDLE_TIMEOUT", "1m"),
        ],
    )
    .run;
    let s = &args.streaming;
    assert_eq!(
        (
            s.max_streaming_sessions,
            s.max_streaming_sessions_per_pod,
            s.max_streams_per_session,
            s.streaming_idle_timeout.as_str()
        ),
        (9, 3, 5, "0"),
        "flags win over the environment"
    );
    let cfg = Config::from_args(&valid(
        dir.path(),
        &["--streaming-idle-timeout=0", "--max-streams-per-session=5"],
    ))
    .expect("zero idle timeout, least streams");
    assert_eq!(cfg.streaming.idle_timeout, None);
    assert_eq!(cfg.streaming.max_streams_per_session, 5);
    let cfg =
        Config::from_args(&valid(dir.path(), &["--streaming-idle-timeout=90s"])).expect("90s");
    assert_eq!(cfg.streaming.idle_timeout, Some(Duration::from_secs(90)));
    for (bad, names) in [
        (
            "--streaming-idle-timeout=-1s",
            "--streaming-idle-timeout (env VK_STREAMING_IDLE_TIMEOUT)",
        ),
        (
            "--streaming-idle-timeout=later",
            "--streaming-idle-timeout (env VK_STREAMING_IDLE_TIMEOUT)",
        ),
        (
            "--max-streaming-sessions=0",
            "--max-streaming-sessions (env VK_MAX_STREAMING_SESSIONS)",
        ),
        (
            "--max-streaming-sessions-per-pod=0",
            "--max-streaming-sessions-per-pod (env VK_MAX_STREAMING_SESSIONS_PER_POD)",
        ),
        (
            "--max-streams-per-session=4",
            "--max-streams-per-session (env VK_MAX_STREAMS_PER_SESSION)",
        ),
    ] {
        let err = Config::from_args(&valid(dir.path(), &[bad]))
            .expect_err(bad)
            .to_string();
        assert!(err.contains(names), "{bad}: {err}");
    }
    let err = Config::from_args(&valid(dir.path(), &["--max-streams-per-session=4"]))
        .expect_err("4")
        .to_string();
    assert!(err.contains("at least 5"), "{err}");
}

mod paths_and_ports;
