//! The state path's checks (empty, unwritable, created 0700), the listen address, capacity, fleet and webhook flags.

use super::*;

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

#[test]
fn a_capacity_flag_given_is_fixed_and_the_fleet_flags_parse() {
    let dir = tempfile::tempdir().expect("dir");
    let cfg = Config::from_args(&valid(
        dir.path(),
        &[
            "--node-pods=50",
            "--sandboxd-max-claims=40",
            "--sandboxd-info-interval=500ms",
            "--node-taints-from-sandboxd=false",
        ],
    ))
    .expect("valid");
    assert!(cfg.capacity.pods_fixed && !cfg.capacity.cpu_fixed);
    assert_eq!(cfg.capacity.pods, Quantity("50".into()));
    assert_eq!(cfg.fleet.max_claims, Some(40));
    assert_eq!(cfg.fleet.info_interval, Duration::from_millis(500));
    assert!(!cfg.fleet.taints && cfg.fleet.conditions);
    let err = Config::from_args(&valid(dir.path(), &["--sandboxd-info-interval=0s"]))
        .expect_err("zero interval")
        .to_string();
    assert!(err.contains("--sandboxd-info-interval"), "{err}");
}

#[test]
fn hand_back_is_on_at_10s_by_default_off_at_0_and_refuses_a_negative() {
    let dir = tempfile::tempdir().expect("dir");
    let at = |flags: &[&str]| Config::from_args(&valid(dir.path(), flags));
    let default = at(&[]).expect("defaults");
    assert_eq!(default.fleet.hand_back_after, Some(Duration::from_secs(10)));
    let off = at(&["--hand-back-after=0"]).expect("0");
    assert_eq!(off.fleet.hand_back_after, None);
    let short = at(&["--hand-back-after=1500ms"]).expect("1.5 s");
    assert_eq!(
        short.fleet.hand_back_after,
        Some(Duration::from_millis(1500))
    );
    assert_eq!(default.fleet.vm_holder_gone_after, Duration::from_secs(300));
    let gone = at(&["--vm-holder-gone-after=15s"]).expect("15 s");
    assert_eq!(gone.fleet.vm_holder_gone_after, Duration::from_secs(15));
    let err = at(&["--vm-holder-gone-after=-1m"])
        .expect_err("negative")
        .to_string();
    assert!(err.contains("--vm-holder-gone-after"), "{err}");
    for bad in ["--hand-back-after=-1s", "--hand-back-after=soon"] {
        let err = at(&[bad]).expect_err(bad).to_string();
        assert!(err.contains("--hand-back-after"), "{bad}: {err}");
        assert!(err.contains("0 to never hand a Pod back"), "{bad}: {err}");
    }
}

#[test]
fn the_webhook_is_off_unless_its_address_is_given_and_needs_its_pair() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::from_args(&valid(dir.path(), &[])).expect("defaults");
    assert_eq!(cfg.webhook, None);

    let err = Config::from_args(&valid(dir.path(), &["--webhook-addr=:10262"]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--webhook-tls-cert (env VK_WEBHOOK_TLS_CERT)"),
        "{err}"
    );
    assert!(
        err.contains("--webhook-tls-key (env VK_WEBHOOK_TLS_KEY)"),
        "{err}"
    );

    let err = Config::from_args(&valid(
        dir.path(),
        &[
            "--webhook-addr=10262",
            "--webhook-tls-cert=/c",
            "--webhook-tls-key=/k",
        ],
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("--webhook-addr (env VK_WEBHOOK_ADDR)"),
        "{err}"
    );

    let cfg = Config::from_args(&valid(
        dir.path(),
        &[
            "--webhook-addr=127.0.0.1:10262",
            "--webhook-tls-cert=/c",
            "--webhook-tls-key=/k",
        ],
    ))
    .expect("webhook");
    assert_eq!(
        cfg.webhook,
        Some(WebhookConfig {
            addr: ListenAddr {
                host: "127.0.0.1".into(),
                port: 10262
            },
            cert: PathBuf::from("/c"),
            key: PathBuf::from("/k"),
            tolerations: true,
        })
    );

    // From the environment, tolerations off.
    let mut args = valid(dir.path(), &[]);
    let env = parse(
        &[],
        &[
            ("VK_WEBHOOK_ADDR", ":10262"),
            ("VK_WEBHOOK_TLS_CERT", "/c"),
            ("VK_WEBHOOK_TLS_KEY", "/k"),
            ("VK_WEBHOOK_TOLERATIONS", "false"),
        ],
    )
    .run;
    args.webhook = env.webhook;
    let webhook = Config::from_args(&args)
        .expect("env")
        .webhook
        .expect("served");
    assert_eq!(webhook.addr.port, 10262);
    assert!(!webhook.tolerations);
}
