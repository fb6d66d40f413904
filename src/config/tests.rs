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
    assert_eq!(r.node.node_name, "vk-sandboxd");
    assert_eq!(r.node.node_ip, "");
    assert_eq!(r.kubelet.listen_addr, ":10260");
    assert_eq!(r.node.node_cpu, "4000");
    assert_eq!(r.node.node_memory, "8Ti");
    assert_eq!(r.node.node_pods, "2000");
    assert_eq!(r.kube.kube_api_qps, 200.0);
    assert_eq!(r.kube.kube_api_burst, 400);
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
    assert_eq!(r.inventory.inventory_group, "sandbox.cocoonstack.io");
    assert!(r.kubelet.kubelet_auth);
    assert!(!r.kubelet.anonymous_auth);
    assert_eq!(r.kubelet.client_ca_file, "");
    assert_eq!(r.admin.log_format, LogFormat::Text);
    assert_eq!(r.kube.kubeconfig, None);
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
    assert_eq!(r.inventory.inventory_group, "g.example");
    assert_eq!(r.kubelet.client_ca_file, "/ca");
    assert!(!r.kubelet.kubelet_auth);
    assert!(r.kubelet.anonymous_auth);
    assert_eq!(r.admin.log_format, LogFormat::Json);
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

// An explicitly empty `--state-path` refuses to start.
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
    assert_eq!(args.state.state_path, defaults::STATE_PATH);
}

// An unwritable state directory refuses to start (root-proof variant: a
// parent that is a regular file).
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

// An unwritable state directory: mode 0500. Root bypasses permission bits,
// so as root this only checks the probe does not lie in the other
// direction; as an unprivileged user it must refuse.
#[test]
fn mode_0500_state_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state_dir = dir.path().join("state");
    std::fs::create_dir(&state_dir).expect("mkdir");
    std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o500)).expect("chmod");
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

// `--listen-addr` must be `host:port` with a numeric port in 1-65535.
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

// Capacity flags must be non-zero Kubernetes quantities.
#[test]
fn quantity_validation() {
    for good in [
        "4000", "8Ti", "2000", "500m", "1.5", "0.5Gi", ".5", "1e3", "1E-2", "+1", "1k", "1M",
        "2Ei", "3n", "7u",
    ] {
        assert!(validate_quantity(good).is_ok(), "{good:?} refused");
    }
    for bad in [
        "abc", "", "0", "0.0", "0Gi", "-1", "1.2.3", "1KB", "1ki", "Gi", "1e", "1 Gi", "1Gi ", ".",
        "1x",
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
    let cfg = Config::from_args(&valid(dir.path(), &["--orphan-scan-interval", "-5s"])).unwrap();
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

// The sandboxd token file: trimmed, empty means no token, unreadable refuses
// to start (the configuration half; the headers sent are tested elsewhere).
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

// `--node-labels`: bad items skipped, empty values kept, later duplicates
// win, and the flag replaces the default (the configuration half).
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
    assert_eq!(plain.run.node.node_name, "a");

    let cli = parse(
        &["preflight", "--node-name=b", "--publish-inventory"],
        &[("VK_STATE_PATH", "/s"), ("VK_NODE_NAME", "ignored")],
    );
    let Some(Command::Preflight(args)) = cli.command else {
        panic!("no preflight subcommand: {cli:?}");
    };
    assert_eq!(args.node.node_name, "b");
    assert_eq!(
        args.state.state_path, "/s",
        "env supplies preflight defaults too"
    );
    assert!(args.inventory.publish_inventory);
    assert_eq!(args.kubelet.listen_addr, defaults::LISTEN_ADDR);

    // Flags belong after the subcommand.
    let err = parse_from(["vk-sandbox", "--node-name=a", "preflight"], &env_of(&[])).unwrap_err();
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
