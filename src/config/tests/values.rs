//! Value parsing and validation: quantities, durations, the token file, labels, addresses, flags of the kubelet API and the client.

use super::*;

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

/// `--inventory-group`: unset or empty means "where the CRD is served";
/// a value is trimmed; something that is not a group name is refused.
#[test]
fn inventory_group_is_optional() {
    let dir = tempfile::tempdir().expect("tempdir");
    let group =
        |args: &[&str]| Config::from_args(&valid(dir.path(), args)).map(|c| c.inventory.group);
    assert_eq!(group(&[]).expect("unset"), None);
    assert_eq!(group(&["--inventory-group="]).expect("empty"), None);
    assert_eq!(group(&["--inventory-group=  "]).expect("blank"), None);
    assert_eq!(
        group(&["--inventory-group= extensions.agents.x-k8s.io "]).expect("trimmed"),
        Some("extensions.agents.x-k8s.io".to_string())
    );
    for bad in ["--inventory-group=a/b", "--inventory-group=a b"] {
        let err = group(&[bad]).expect_err(bad).to_string();
        assert!(err.contains("--inventory-group"), "{err}");
    }
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
    // A rate so low that its wait overflowed is refused with the bound.
    for bad in [
        "--kube-api-qps=1e-30",
        "--kube-api-qps=0.009",
        "--kube-api-qps=NaN",
        "--kube-api-qps=inf",
        "--event-qps=0",
        "--event-qps=1e-30",
        "--event-burst=0",
    ] {
        let err = Config::from_args(&valid(dir.path(), &[bad]))
            .map(|_| ())
            .expect_err(bad)
            .to_string();
        let flag = bad.split('=').next().unwrap_or_default();
        assert!(err.contains(flag), "{bad}: {err}");
        if bad.contains("qps") {
            assert!(err.contains("at least 0.01"), "{bad}: {err}");
        }
    }
    let cfg = Config::from_args(&valid(
        dir.path(),
        &["--kube-api-qps=0.01", "--event-qps=5", "--event-burst=7"],
    ))
    .expect("bounds are inclusive");
    assert_eq!(
        (cfg.kube.qps, cfg.kube.event_qps, cfg.kube.event_burst),
        (0.01, 5.0, 7)
    );
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
