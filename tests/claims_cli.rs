//! `vk-sandbox claims …` run as a process: a state written by the Go
//! vk-sandbox, a state written by the claims store with a torn journal
//! tail, a daemon holding the state lock, and `verify` against the sandboxd
//! simulator. Nothing the command reads is ever changed.

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use vk_sandbox::claims::{Claim, ClaimsStore};
use vk_sandbox::sandboxd::{ClaimRequest, SandboxdClient};

const GO_STATE: &str = r#"{"claims":{"ns/a":{"id":"sb_a","token":"secret-a","address":"10.0.0.5:7777","podUID":"uid-a","claimedAt":"2026-01-01T00:00:00Z","deadline":"2999-01-02T03:04:05Z"},"ns/b":{"id":"sb_b","token":"secret-b","podUID":"","claimedAt":"2026-01-01T00:00:01Z","deadline":"2026-01-02T00:00:00Z"},"ns/c":{"id":"sb_c","token":"secret-c","podUID":"uid-c"}}}"#;

fn vk(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(support::process::BIN);
    cmd.args(args)
        .env_remove("VK_STATE_PATH")
        .env_remove("SANDBOXD_URL")
        .env_remove("SANDBOXD_TOKEN_FILE")
        .env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run vk-sandbox")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exit code")
}

/// Every file in `dir` with its bytes and modification time.
fn files(dir: &Path) -> BTreeMap<String, (Vec<u8>, std::time::SystemTime)> {
    fs::read_dir(dir)
        .expect("read dir")
        .flatten()
        .map(|e| {
            let m = e.metadata().expect("meta");
            (
                e.file_name().to_string_lossy().into_owned(),
                (
                    fs::read(e.path()).unwrap_or_default(),
                    m.modified().expect("mtime"),
                ),
            )
        })
        .collect()
}

fn go_state() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    fs::write(&path, GO_STATE).expect("write");
    (dir, path)
}

#[test]
fn list_a_go_written_state_without_tokens() {
    let (dir, path) = go_state();
    let before = files(dir.path());
    let state = format!("--state-path={}", path.display());
    let out = vk(&["claims", "list", &state], &[]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    for h in [
        "KEY",
        "SANDBOX",
        "POD UID",
        "CLAIMED AT",
        "DEADLINE",
        "STATE",
    ] {
        assert!(lines[0].contains(h), "{table}");
    }
    assert!(!lines[0].contains("TOKEN"), "{table}");
    assert!(
        lines[1].starts_with("ns/a") && lines[1].contains("sb_a") && lines[1].contains("uid-a"),
        "{table}"
    );
    assert!(lines[1].contains("2026-01-01T00:00:00Z") && lines[1].ends_with("active"));
    assert!(lines[2].contains("2026-01-02T00:00:00Z") && lines[2].ends_with("expired"));
    // No claimedAt, no deadline in the Go file: shown as unset.
    assert!(
        lines[3].starts_with("ns/c") && lines[3].contains(" - "),
        "{table}"
    );
    assert!(!table.contains("secret"), "a token was printed:\n{table}");
    assert!(!text(&out.stderr).contains("secret"));
    assert!(
        text(&out.stderr).contains("no state lock at"),
        "the lock's absence is said: {}",
        text(&out.stderr)
    );

    let out = vk(&["claims", "list", &state, "--show-tokens"], &[]);
    assert_eq!(code(&out), 0);
    let table = text(&out.stdout);
    assert!(table.lines().next().is_some_and(|h| h.ends_with("TOKEN")));
    assert!(table.contains("secret-a") && table.contains("secret-c"));

    // The environment variable of the daemon names the state too.
    let out = vk(
        &["claims", "list", "-o", "json"],
        &[("VK_STATE_PATH", path.to_str().expect("utf8"))],
    );
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let claims = v["claims"].as_array().expect("claims");
    assert_eq!(claims.len(), 3);
    assert_eq!(claims[0]["key"], "ns/a");
    assert_eq!(claims[0]["id"], "sb_a");
    assert_eq!(claims[0]["podUID"], "uid-a");
    assert_eq!(claims[0]["address"], "10.0.0.5:7777");
    assert_eq!(claims[0]["claimedAt"], "2026-01-01T00:00:00Z");
    assert_eq!(claims[0]["deadline"], "2999-01-02T03:04:05Z");
    assert_eq!(claims[0]["state"], "active");
    assert_eq!(claims[0]["source"], "snapshot");
    assert_eq!(claims[1]["state"], "expired");
    assert_eq!(claims[2]["claimedAt"], Value::Null);
    assert_eq!(claims[2]["deadline"], Value::Null);
    assert!(claims.iter().all(|c| c.get("token").is_none()));
    assert_eq!(v["daemon"]["running"], Value::Null, "no lock file: unknown");
    assert_eq!(v["daemon"]["lockFile"], false);
    assert_eq!(v["statePath"], path.display().to_string());

    assert_eq!(before, files(dir.path()), "the state was changed");
}

#[test]
fn show_one_claim_or_say_which_keys_exist() {
    let (dir, path) = go_state();
    let before = files(dir.path());
    let state = format!("--state-path={}", path.display());
    let out = vk(&["claims", "show", "ns/a", &state], &[]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    for line in [
        "key:        ns/a",
        "sandbox:    sb_a",
        "pod UID:    uid-a",
        "address:    10.0.0.5:7777",
        "claimed at: 2026-01-01T00:00:00Z",
        "deadline:   2999-01-02T03:04:05Z",
        "state:      active",
        "token:      (hidden; --show-tokens shows it)",
    ] {
        assert!(shown.lines().any(|l| l == line), "no {line:?} in\n{shown}");
    }
    let out = vk(
        &[
            "claims",
            "show",
            "ns/a",
            &state,
            "-o",
            "json",
            "--show-tokens",
        ],
        &[],
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["token"], "secret-a");
    assert_eq!(v["id"], "sb_a");

    let out = vk(&["claims", "show", "ns/zz", &state], &[]);
    assert_eq!(code(&out), 1);
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert!(
        err.contains("no claim has the key \"ns/zz\"") && err.contains("3 claims"),
        "{err}"
    );
    assert_eq!(before, files(dir.path()));
}

#[test]
fn export_of_a_go_state_is_the_go_file_byte_for_byte() {
    let (dir, path) = go_state();
    let out = vk(
        &[
            "claims",
            "export",
            &format!("--state-path={}", path.display()),
        ],
        &[],
    );
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), GO_STATE);
    // An indented Go file exports compact, with the same rows.
    let indented: Value = serde_json::from_str(GO_STATE).expect("json");
    fs::write(
        &path,
        serde_json::to_string_pretty(&indented).expect("pretty"),
    )
    .expect("write");
    let out = vk(
        &[
            "claims",
            "export",
            &format!("--state-path={}", path.display()),
        ],
        &[],
    );
    assert_eq!(text(&out.stdout), GO_STATE);
    drop(dir);
}

fn claim(id: &str, uid: &str) -> Claim {
    Claim {
        id: id.into(),
        token: vk_sandbox::sandboxd::Token::new(format!("tok-{id}")),
        address: "10.0.0.9:7777".into(),
        pod_uid: uid.into(),
        claimed_at: "2026-03-01T10:00:00Z".parse().expect("ts"),
        deadline: None,
        lifecycle: Default::default(),
    }
}

/// A state the claims store wrote: a snapshot of one row, then a journal
/// (two commits and a removal since), then half of another frame, as a
/// crash leaves it.
#[tokio::test]
async fn journal_is_folded_in_and_a_torn_tail_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    {
        let store = ClaimsStore::open(&path).await.expect("open");
        store
            .commit("ns/old", claim("sb_old", "u0"))
            .await
            .expect("commit");
        store.compact().await.expect("compact");
        store.commit("ns/x", claim("sb_x", "ux")).await.expect("x");
        store.commit("ns/y", claim("sb_y", "uy")).await.expect("y");
        assert!(store.remove("ns/old", "sb_old").await.expect("remove"));
    }
    let journal = dir.path().join("claims.json.journal");
    let mut bytes = fs::read(&journal).expect("a journal was written");
    let frame = vk_sandbox::claims::format::encode_frame(
        &[vk_sandbox::claims::format::JournalOp::Put {
            key: "ns/torn".into(),
            claim: claim("sb_torn", "ut"),
        }],
        None,
    );
    bytes.extend_from_slice(&frame[..frame.len() / 2]);
    fs::write(&journal, &bytes).expect("tear");
    let before = files(dir.path());

    let state = format!("--state-path={}", path.display());
    let out = vk(&["claims", "list", &state, "-o", "json"], &[]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let keys: Vec<&str> = v["claims"]
        .as_array()
        .expect("claims")
        .iter()
        .map(|c| c["key"].as_str().expect("key"))
        .collect();
    assert_eq!(keys, vec!["ns/x", "ns/y"], "journal not folded in: {v}");
    assert_eq!(v["claims"][0]["source"], "journal");
    assert_eq!(v["journalRecords"], 3);
    assert_eq!(v["tornTailBytes"], frame.len() / 2);
    let err = text(&out.stderr);
    assert!(
        err.contains("claims.json.journal ends in an incomplete record"),
        "{err}"
    );

    // The export is the Go file the daemon's clean shutdown would leave.
    let out = vk(&["claims", "export", &state], &[]);
    assert_eq!(code(&out), 0);
    let exported = text(&out.stdout);
    assert!(exported.starts_with(r#"{"claims":{"ns/x":{"id":"sb_x","token":"tok-sb_x","address":"10.0.0.9:7777","podUID":"ux","claimedAt":"2026-03-01T10:00:00Z"}"#), "{exported}");
    assert!(!exported.contains("sb_old") && !exported.contains("sb_torn"));
    assert_eq!(before, files(dir.path()), "the state was changed");

    // The store itself loads the same rows from the same files.
    let reopened = ClaimsStore::open(&path).await.expect("reopen");
    let rows: Vec<String> = reopened.all().into_iter().map(|(k, _, _)| k).collect();
    assert_eq!(rows, vec!["ns/x", "ns/y"]);
}

#[test]
fn a_damaged_state_is_refused_with_the_problem_and_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    fs::write(&path, br#"{"claims":{"ns/a":{"id":5}}}"#).expect("write");
    let before = files(dir.path());
    for sub in ["list", "export"] {
        let out = vk(
            &["claims", sub, &format!("--state-path={}", path.display())],
            &[],
        );
        assert_eq!(code(&out), 1, "{sub}");
        assert!(out.stdout.is_empty(), "{sub}");
        let err = text(&out.stderr);
        assert!(
            err.contains("claims.json: row \"ns/a\": field \"id\" is a number"),
            "{sub}: {err}"
        );
    }
    assert_eq!(before, files(dir.path()));
}

#[test]
fn a_running_daemon_is_detected_through_its_lock() {
    let (dir, path) = go_state();
    let lock_path = dir.path().join("claims.json.lock");
    fs::write(&lock_path, b"31337\n").expect("lock file");
    let lock = fs::File::open(&lock_path).expect("open");
    lock.try_lock()
        .expect("exclusive lock, as the daemon holds it");
    let state = format!("--state-path={}", path.display());
    let out = vk(&["claims", "list", &state], &[]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("daemon running (pid 31337); reading a live state"),
        "{}",
        text(&out.stderr)
    );
    let out = vk(&["claims", "list", &state, "-o", "json"], &[]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["daemon"]["running"], true);
    assert_eq!(v["daemon"]["pid"], 31337);
    // The CLI took no lock that outlives it, and wrote nothing.
    lock.unlock().expect("unlock");
    let again = fs::File::open(&lock_path).expect("open");
    again.try_lock().expect("free");
    again.unlock().expect("unlock");
    let out = vk(&["claims", "list", &state], &[]);
    assert!(
        text(&out.stderr).contains("no daemon running on this state"),
        "{}",
        text(&out.stderr)
    );
    let out = vk(&["claims", "list", &state, "-o", "json"], &[]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["daemon"], serde_json::json!({"running": false}));
    assert_eq!(fs::read(&lock_path).expect("lock"), b"31337\n");
}

/// `verify` against the simulator: one claim held and listed, one held but
/// gone from sandboxd, one listed under a held key but not held, and one
/// under a key the state does not hold (not a discrepancy).
#[tokio::test(flavor = "multi_thread")]
async fn verify_against_the_sandboxd_simulator() {
    const TOKEN: &str = "claims-cli-node-token";
    let sim = support::sim::start(support::sim::config(TOKEN, &["base:24.04=6"])).await;
    let client = SandboxdClient::builder(sim.base_url())
        .token(Some(TOKEN.into()))
        .build()
        .expect("client");
    let claim_for = |key: &str| {
        let client = client.clone();
        let request = ClaimRequest {
            template: "base:24.04".into(),
            claim_ref: key.into(),
            ..Default::default()
        };
        async move { client.claim(&request).await.expect("claim") }
    };
    let listed = claim_for("ns/listed").await;
    let gone = claim_for("ns/gone").await;
    let stray = claim_for("ns/listed").await; // a second claim under a held key
    let _other = claim_for("other/pod").await;
    client
        .release(&gone.id, &gone.token)
        .await
        .expect("release");

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let row = |c: &vk_sandbox::sandboxd::Granted| serde_json::json!({"id": c.id, "token": c.token.expose(), "podUID": "u"});
    let state_json = serde_json::json!({"claims": {
        "ns/listed": row(&listed),
        "ns/gone": row(&gone),
    }});
    fs::write(&path, state_json.to_string()).expect("state");
    let token_file = support::sim::token_file(dir.path(), &format!("{TOKEN}\n"));

    let url = sim.base_url();
    let token_path = token_file.display().to_string();
    let state = format!("--state-path={}", path.display());
    let run = move |args: Vec<String>, env: Vec<(String, String)>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            vk(&args, &env)
        })
    };
    let args = |extra: &[&str]| {
        let mut v = vec!["claims".to_string(), "verify".into(), state.clone()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    // Flags.
    let out = run(
        args(&[
            &format!("--sandboxd-url={url}"),
            &format!("--sandboxd-token-file={token_path}"),
            "-o",
            "json",
        ]),
        vec![],
    )
    .await
    .expect("join");
    assert_eq!(code(&out), 1, "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["consistent"], false);
    assert_eq!(
        v["heldListed"],
        serde_json::json!([{"key": "ns/listed", "id": listed.id}])
    );
    assert_eq!(
        v["heldMissing"],
        serde_json::json!([{"key": "ns/gone", "id": gone.id, "expired": false}])
    );
    assert_eq!(
        v["listedNotHeld"],
        serde_json::json!([{"key": "ns/listed", "id": stray.id}])
    );
    assert_eq!(v["external"].as_array().expect("external").len(), 1);
    assert_eq!(v["external"][0]["claimRef"], "other/pod");

    // The daemon's environment variables, table output.
    let env = vec![
        ("SANDBOXD_URL".to_string(), url.clone()),
        ("SANDBOXD_TOKEN_FILE".to_string(), token_path.clone()),
    ];
    let out = run(args(&[]), env.clone()).await.expect("join");
    assert_eq!(code(&out), 1, "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.contains("ok: held and listed"), "{table}");
    assert!(table.contains("MISSING: held, not listed"), "{table}");
    assert!(table.contains("NOT HELD: listed under this key"), "{table}");
    assert!(
        table
            .contains("INCONSISTENT: 1 held and listed, 1 held and missing, 1 listed and not held"),
        "{table}"
    );
    assert!(
        !table.contains(listed.token.expose()),
        "a token was printed"
    );

    // Consistent once the stray is returned and the gone row dropped.
    client.release_as_node(&stray.id).await.expect("release");
    let consistent = serde_json::json!({"claims": {"ns/listed": row(&listed)}});
    fs::write(&path, consistent.to_string()).expect("state");
    let out = run(args(&[]), env.clone()).await.expect("join");
    assert_eq!(code(&out), 0, "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        text(&out.stdout)
            .contains("consistent: 1 held and listed, 0 held and missing, 0 listed and not held")
    );

    // sandboxd unreachable or refusing: exit 2, never "consistent".
    let out = run(args(&["--sandboxd-url=http://127.0.0.1:1"]), env.clone())
        .await
        .expect("join");
    assert_eq!(code(&out), 2);
    assert!(out.stdout.is_empty());
    assert!(
        text(&out.stderr).contains("cannot list sandboxd at http://127.0.0.1:1"),
        "{}",
        text(&out.stderr)
    );
    let wrong = dir.path().join("wrong");
    fs::write(&wrong, "nope").expect("token");
    let out = run(
        args(&[&format!("--sandboxd-token-file={}", wrong.display())]),
        env,
    )
    .await
    .expect("join");
    assert_eq!(code(&out), 2, "{}", text(&out.stderr));
    let after = files(dir.path());
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        vec!["claims.json", "sandboxd-token", "wrong"],
        "verify created a file"
    );
    assert_eq!(after["claims.json"].0, consistent.to_string().into_bytes());
}
