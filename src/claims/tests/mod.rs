//! Store tests: real files in temporary directories.

use std::collections::BTreeMap;

use crate::sandboxd::SandboxRow;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use proptest::prelude::*;

use super::*;
use crate::sandboxd::{Deadline, PoolKey};

fn ts(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

fn claim(id: &str) -> Claim {
    Claim {
        id: id.into(),
        token: crate::sandboxd::Token::new(format!("tok-{id}")),
        address: "10.0.0.5:7777".into(),
        pod_uid: format!("uid-{id}"),
        claimed_at: ts("2026-01-01T00:00:00Z"),
        deadline: Some(ts("2026-01-02T00:00:00Z")),
        lifecycle: Default::default(),
    }
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

fn journal_of(path: &Path) -> PathBuf {
    PathBuf::from(format!("{}.journal", path.display()))
}

/// (key, claim) of every row, ignoring states.
fn rows(store: &ClaimsStore) -> BTreeMap<String, Claim> {
    store.all().into_iter().map(|(k, c, _)| (k, c)).collect()
}

fn listed(id: &str, deadline: Deadline) -> SandboxRow {
    SandboxRow {
        id: id.into(),
        key: PoolKey::default(),
        deadline,
        hibernated: false,
        archived: false,
        claim_ref: String::new(),
    }
}

const GO_FULL: &str = r#"{"claims":{"ns/a":{"id":"sb_a","token":"ta","address":"10.0.0.5:7777","podUID":"ua","claimedAt":"2026-01-01T00:00:00Z","deadline":"2026-01-02T03:04:05Z"},"ns/b":{"id":"sb_b","token":"tb","podUID":"","claimedAt":"2026-01-01T00:00:01Z"}}}"#;

mod files;
mod verification;

#[tokio::test]
async fn go_fixtures_load_quarantined() {
    let fixtures = [
        (GO_FULL.to_string(), 2),
        (
            "{\n  \"claims\": {\n    \"ns/a\": {\n      \"id\": \"sb_a\",\n      \"token\": \"ta\",\n      \"podUID\": \"ua\",\n      \"claimedAt\": \"2026-01-01T00:00:00Z\"\n    }\n  }\n}\n"
                .to_string(),
            1,
        ),
        (r#"{"claims":null}"#.to_string(), 0),
        ("{}".to_string(), 0),
        (
            r#"{"claims":{"ns/a":{"id":"sb_a","token":"ta","podUID":"ua","future":{"x":1}}},"schema":2}"#
                .to_string(),
            1,
        ),
        (r#"{"claims":{"ns/a":{"id":"sb_a","token":"ta"}}}"#.to_string(), 1),
    ];
    for (text, n) in fixtures {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("claims.json");
        fs::write(&path, &text).expect("write");
        let before = Timestamp::now();
        let store = ClaimsStore::open(&path).await.expect(&text);
        assert_eq!(store.len(), n, "{text}");
        assert_eq!(
            store.counts(),
            ClaimCounts {
                quarantined: n,
                ..Default::default()
            }
        );
        if n > 0 {
            let (a, state) = store.get("ns/a").expect("row");
            assert_eq!(state, ClaimState::Quarantined);
            assert_eq!(
                (a.id.as_str(), a.token.as_deref().map_or("", |t| t.expose())),
                ("sb_a", "ta")
            );
            if !text.contains("claimedAt") {
                // Stamped now, and persisted by the start-up write so a
                // restart keeps the same value.
                assert!(a.claimed_at.as_second() >= before.as_second() - 1);
                drop(store);
                let again = ClaimsStore::open(&path).await.expect("reopen");
                assert_eq!(again.get("ns/a").expect("row").0.claimed_at, a.claimed_at);
            }
        }
    }
}

#[tokio::test]
async fn malformed_state_is_refused_and_left_byte_identical() {
    for bad in [
        "{\"claims\":{\"ns/a\":{\"id\":\"sb_a\",\"token\":",
        "",
        "[]",
        r#"{"claims":{"ns/a":{"id":"sb_a","deadline":"soon"}}}"#,
        r#"{"claims":{"ns/a":{"id":7}}}"#,
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("claims.json");
        fs::write(&path, bad).expect("write");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).expect("chmod");
        let err = ClaimsStore::open(&path).await.expect_err(bad);
        let msg = err.to_string();
        assert!(matches!(err, Error::State { .. }), "{msg}");
        assert_eq!(err.metric_label(), "state");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains("repair or restore"), "{msg}");
        assert_eq!(fs::read(&path).expect("read"), bad.as_bytes());
        assert_eq!(mode(&path), 0o640, "permissions untouched");
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec!["claims.json"], "nothing else written");
    }
}

#[tokio::test]
async fn unreadable_state_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A directory where the file should be: the read fails (EISDIR).
    let path = dir.path().join("claims.json");
    fs::create_dir(&path).expect("mkdir");
    let err = ClaimsStore::open(&path).await.expect_err("dir");
    assert!(matches!(err, Error::State { .. }), "{err}");
    assert!(err.to_string().contains("cannot be read"), "{err}");
    fs::remove_dir(&path).expect("rmdir");

    // An unreadable journal refuses too, and the snapshot is untouched.
    fs::write(&path, GO_FULL).expect("write");
    fs::create_dir(journal_of(&path)).expect("mkdir journal");
    let err = ClaimsStore::open(&path).await.expect_err("journal dir");
    assert!(
        err.to_string()
            .contains(&journal_of(&path).display().to_string()),
        "{err}"
    );
    assert_eq!(fs::read(&path).expect("read"), GO_FULL.as_bytes());

    // Mode 000 (only meaningful when not running as root).
    if !nix::unistd::Uid::effective().is_root() {
        fs::remove_dir(journal_of(&path)).expect("rmdir");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o000)).expect("chmod");
        let err = ClaimsStore::open(&path).await.expect_err("mode 000");
        assert!(err.to_string().contains("cannot be read"), "{err}");
    }
}

#[tokio::test]
async fn startup_write_creates_empty_file_0600_in_dir_0700() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state_dir = dir.path().join("var/lib/vk-sandbox");
    let path = state_dir.join("claims.json");
    let store = ClaimsStore::open(&path).await.expect("open");
    assert!(store.is_empty());
    assert_eq!(fs::read_to_string(&path).expect("read"), r#"{"claims":{}}"#);
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&state_dir), 0o700);
    assert_eq!(mode(&dir.path().join("var/lib")), 0o700);
    // A missing file: open, then compact, leaves the same empty table.
    store.compact().await.expect("compact");
    assert_eq!(fs::read_to_string(&path).expect("read"), r#"{"claims":{}}"#);
    assert!(!journal_of(&path).exists());
}

#[tokio::test]
async fn startup_write_failure_is_fatal() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The state directory's place is taken by a file: it cannot be created.
    let blocker = dir.path().join("state");
    fs::write(&blocker, "").expect("write");
    let err = ClaimsStore::open(&blocker.join("claims.json"))
        .await
        .expect_err("not writable");
    assert!(matches!(err, Error::StateWrite { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("claims state is not writable: "),
        "{err}"
    );
}

#[tokio::test]
async fn commit_is_durable_before_ok() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let store = ClaimsStore::open(&path).await.expect("open");
    store.commit("ns/a", claim("sb_1")).await.expect("commit");
    assert_eq!(
        store.get("ns/a").expect("row"),
        (claim("sb_1"), ClaimState::Settled)
    );
    assert_eq!(mode(&journal_of(&path)), 0o600);
    // Another process opening the same path now (a crash: no compact).
    let fresh = ClaimsStore::open(&path).await.expect("reopen");
    assert_eq!(
        fresh.get("ns/a").expect("row"),
        (claim("sb_1"), ClaimState::Quarantined)
    );
}

#[tokio::test]
async fn commit_normalises_times() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let store = ClaimsStore::open(&path).await.expect("open");
    let mut c = claim("sb_1");
    c.claimed_at = Timestamp::UNIX_EPOCH;
    c.deadline = Some(ts("2026-01-02T00:00:00.75Z"));
    store.commit("ns/a", c).await.expect("commit");
    let (got, _) = store.get("ns/a").expect("row");
    assert!(got.claimed_at > ts("2026-01-01T00:00:00Z"));
    assert_eq!(got.claimed_at.subsec_nanosecond(), 0);
    assert_eq!(got.deadline, Some(ts("2026-01-02T00:00:00Z")));
    drop(store);
    let again = ClaimsStore::open(&path).await.expect("reopen");
    assert_eq!(again.get("ns/a").expect("row").0, got);
}

/// Found by the claims_roundtrip fuzz target: a `claimed_at` within the
/// epoch's first second was truncated to the epoch after the "unset" check,
/// so memory held the epoch while the file (which writes the epoch as
/// unset) gave back "now" after a restart.
#[tokio::test]
async fn claimed_at_truncated_to_the_epoch_counts_as_unset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let store = ClaimsStore::open(&path).await.expect("open");
    let mut c = claim("sb_1");
    c.claimed_at = Timestamp::new(0, 500_000_000).expect("ts");
    store.commit("ns/a", c).await.expect("commit");
    let (got, _) = store.get("ns/a").expect("row");
    assert!(got.claimed_at > ts("2026-01-01T00:00:00Z"), "{got:?}");
    drop(store);
    let again = ClaimsStore::open(&path).await.expect("reopen");
    assert_eq!(again.get("ns/a").expect("row").0, got);
}

/// Found by the claims_roundtrip fuzz target (libFuzzer): a deadline of
/// Go's zero time was kept in memory (expired) but written as the text the
/// file reads as "no expiry".
#[tokio::test]
async fn deadline_of_go_zero_time_is_no_expiry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let store = ClaimsStore::open(&path).await.expect("open");
    let mut c = claim("sb_1");
    c.deadline = Some(ts("0001-01-01T00:00:00Z"));
    store.commit("ns/a", c).await.expect("commit");
    assert_eq!(store.get("ns/a").expect("row").0.deadline, None);
    let later = Some(ts("2026-01-02T00:00:00Z"));
    store
        .set_deadline("ns/a", "sb_1", later)
        .await
        .expect("set");
    assert_eq!(store.get("ns/a").expect("row").0.deadline, later);
    store
        .set_deadline("ns/a", "sb_1", Some(ts("0001-01-01T00:00:00Z")))
        .await
        .expect("set");
    assert_eq!(store.get("ns/a").expect("row").0.deadline, None);
    drop(store);
    let again = ClaimsStore::open(&path).await.expect("reopen");
    assert_eq!(again.get("ns/a").expect("row").0.deadline, None);
}

#[tokio::test]
async fn commit_over_a_different_claim_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ClaimsStore::open(&dir.path().join("c.json"))
        .await
        .expect("open");
    store.commit("ns/a", claim("sb_1")).await.expect("commit");
    let err = store
        .commit("ns/a", claim("sb_2"))
        .await
        .expect_err("conflict");
    assert!(matches!(err, Error::ClaimConflict { .. }), "{err}");
    assert_eq!(store.get("ns/a").expect("row").0.id, "sb_1");
    // The same id again is fine (fields replaced).
    let mut again = claim("sb_1");
    again.address = "10.0.0.6:7777".into();
    store.commit("ns/a", again.clone()).await.expect("recommit");
    assert_eq!(store.get("ns/a").expect("row").0, again);
}

#[tokio::test]
async fn remove_is_id_guarded_and_durable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let store = ClaimsStore::open(&path).await.expect("open");
    store.commit("ns/a", claim("sb_1")).await.expect("commit");
    store.commit("ns/b", claim("sb_2")).await.expect("commit");
    assert!(!store.remove("ns/a", "sb_other").await.expect("remove"));
    assert!(!store.remove("ns/zzz", "sb_1").await.expect("remove"));
    assert!(store.get("ns/a").is_some());
    assert!(store.remove("ns/a", "sb_1").await.expect("remove"));
    assert!(!store.remove("ns/a", "sb_1").await.expect("again"));
    let fresh = ClaimsStore::open(&path).await.expect("reopen");
    assert_eq!(fresh.all().len(), 1);
    assert!(fresh.get("ns/a").is_none());
    assert!(fresh.get("ns/b").is_some());
}

#[tokio::test]
async fn rebind_and_set_deadline_are_id_guarded_and_durable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let store = ClaimsStore::open(&path).await.expect("open");
    store.commit("ns/a", claim("sb_1")).await.expect("commit");
    store
        .rebind("ns/a", "sb_x", "uid-new")
        .await
        .expect("rebind");
    assert_eq!(store.get("ns/a").expect("row").0.pod_uid, "uid-sb_1");
    store
        .rebind("ns/a", "sb_1", "uid-new")
        .await
        .expect("rebind");
    store
        .set_deadline("ns/a", "sb_x", None)
        .await
        .expect("deadline");
    assert!(store.get("ns/a").expect("row").0.deadline.is_some());
    store
        .set_deadline("ns/a", "sb_1", None)
        .await
        .expect("deadline");
    let appends = store.stats().journal_appends;
    // Unchanged values write nothing.
    store
        .rebind("ns/a", "sb_1", "uid-new")
        .await
        .expect("rebind");
    store
        .set_deadline("ns/a", "sb_1", None)
        .await
        .expect("deadline");
    assert_eq!(store.stats().journal_appends, appends);
    // Neither resurrects a removed row.
    assert!(store.remove("ns/a", "sb_1").await.expect("remove"));
    store.rebind("ns/a", "sb_1", "uid-3").await.expect("rebind");
    store
        .set_deadline("ns/a", "sb_1", Some(ts("2027-01-01T00:00:00Z")))
        .await
        .expect("deadline");
    assert!(store.get("ns/a").is_none());
    store.commit("ns/b", claim("sb_2")).await.expect("commit");
    store.rebind("ns/b", "sb_2", "uid-b").await.expect("rebind");
    store
        .set_deadline("ns/b", "sb_2", None)
        .await
        .expect("deadline");
    let fresh = ClaimsStore::open(&path).await.expect("reopen");
    assert!(fresh.get("ns/a").is_none());
    let (b, _) = fresh.get("ns/b").expect("row");
    assert_eq!((b.pod_uid.as_str(), b.deadline), ("uid-b", None));
}

#[tokio::test]
async fn lifecycle_updates_are_id_guarded_and_durable() {
    use crate::claims::{OwnerRef, VmState};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let store = ClaimsStore::open(&path).await.expect("open");
    store.commit("ns/a", claim("sb_1")).await.expect("commit");
    let since = ts("2026-03-01T00:00:00Z");
    let renewed = ts("2026-03-02T00:00:00.7Z");
    let changed = store
        .update_lifecycle("ns/a", "sb_1", |l, deadline| {
            l.owner = Some(OwnerRef {
                api_version: "agents.x-k8s.io/v1beta1".into(),
                kind: "Sandbox".into(),
                name: "a".into(),
                uid: "o1".into(),
            });
            l.vm = VmState::Hibernated {
                why: "suspended".into(),
                since,
            };
            *deadline = Some(renewed);
        })
        .await
        .expect("update");
    assert!(changed);
    // Another id: nothing changes, nothing is written.
    let appends = store.stats().journal_appends;
    let other = store
        .update_lifecycle("ns/a", "sb_x", |l, _| l.hibernate_refused = true)
        .await
        .expect("update");
    assert!(!other);
    // The same values again: nothing written.
    store
        .update_lifecycle("ns/a", "sb_1", |l, deadline| {
            l.vm = VmState::Hibernated {
                why: "suspended".into(),
                since,
            };
            *deadline = Some(renewed);
        })
        .await
        .expect("update");
    assert_eq!(store.stats().journal_appends, appends);
    assert!(
        !store
            .update_lifecycle("ns/gone", "sb_1", |l, _| l.hibernate_refused = true)
            .await
            .expect("update"),
        "never creates a row"
    );
    assert!(store.get("ns/gone").is_none());
    // Durable, and the deadline at the file's precision.
    let fresh = ClaimsStore::open(&path).await.expect("reopen");
    let (a, _) = fresh.get("ns/a").expect("row");
    assert_eq!(a.deadline, Some(ts("2026-03-02T00:00:00Z")));
    assert_eq!(
        a.lifecycle.vm,
        VmState::Hibernated {
            why: "suspended".into(),
            since
        }
    );
    assert!(!a.lifecycle.hibernate_refused);
    assert_eq!(a.lifecycle.owner.map(|o| o.uid), Some("o1".to_string()));
}

#[test]
fn thirty_two_concurrent_commits_survive_reopen() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("claims.json");
        let store = ClaimsStore::open(&path).await.expect("open");
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    store
                        .commit(&format!("ns/p{i:02}"), claim(&format!("sb_{i}")))
                        .await
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("join").expect("commit");
        }
        let stats = store.stats();
        assert_eq!(stats.requests, 32);
        assert!(stats.batches <= 32, "{stats:?}");
        assert_eq!(store.counts().settled, 32);
        let fresh = ClaimsStore::open(&path).await.expect("reopen");
        assert_eq!(fresh.len(), 32);
        for i in 0..32 {
            let (c, _) = fresh.get(&format!("ns/p{i:02}")).expect("row");
            assert_eq!(c, claim(&format!("sb_{i}")));
        }
    });
}
