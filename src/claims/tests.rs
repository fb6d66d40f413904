//! Store tests: real files in temporary directories.

use std::collections::BTreeMap;
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
        token: format!("tok-{id}"),
        address: "10.0.0.5:7777".into(),
        pod_uid: format!("uid-{id}"),
        claimed_at: ts("2026-01-01T00:00:00Z"),
        deadline: Some(ts("2026-01-02T00:00:00Z")),
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
            assert_eq!((a.id.as_str(), a.token.as_str()), ("sb_a", "ta"));
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

#[tokio::test]
async fn torn_last_journal_line_is_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let store = ClaimsStore::open(&path).await.expect("open");
    store.commit("ns/a", claim("sb_1")).await.expect("commit");
    store.commit("ns/b", claim("sb_2")).await.expect("commit");
    drop(store);
    // A third frame cut short by a crash.
    let frame = format::encode_frame(
        &[format::JournalOp::Put {
            key: "ns/c".into(),
            claim: claim("sb_3"),
        }],
        None,
    );
    let mut bytes = fs::read(journal_of(&path)).expect("journal");
    bytes.extend_from_slice(&frame[..frame.len() / 2]);
    fs::write(journal_of(&path), &bytes).expect("write");
    let fresh = ClaimsStore::open(&path)
        .await
        .expect("torn tail is tolerated");
    assert_eq!(
        rows(&fresh).keys().cloned().collect::<Vec<_>>(),
        vec!["ns/a", "ns/b"]
    );
    // The start-up write folded the journal into the snapshot.
    assert!(!journal_of(&path).exists());
}

#[tokio::test]
async fn corrupt_middle_journal_line_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let store = ClaimsStore::open(&path).await.expect("open");
    for i in 0..3 {
        store
            .commit(&format!("ns/p{i}"), claim(&format!("sb_{i}")))
            .await
            .expect("commit");
    }
    drop(store);
    let mut bytes = fs::read(journal_of(&path)).expect("journal");
    let first_nl = bytes.iter().position(|b| *b == b'\n').expect("newline");
    bytes[first_nl - 5] ^= 0x20;
    fs::write(journal_of(&path), &bytes).expect("write");
    let snapshot = fs::read(&path).expect("snapshot");
    let err = ClaimsStore::open(&path).await.expect_err("corrupt");
    let msg = err.to_string();
    assert!(
        msg.contains(&journal_of(&path).display().to_string()) && msg.contains("line 1"),
        "{msg}"
    );
    assert_eq!(fs::read(journal_of(&path)).expect("journal"), bytes);
    assert_eq!(fs::read(&path).expect("snapshot"), snapshot);
}

fn journal_old_of(path: &Path) -> PathBuf {
    PathBuf::from(format!("{}.journal.old", path.display()))
}

#[tokio::test]
async fn a_journal_is_only_replayed_over_the_snapshot_it_continues() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let store = ClaimsStore::open(&path).await.expect("open");
    store.commit("ns/a", claim("sb_1")).await.expect("commit");
    drop(store);
    // A crash, then the Go original ran (rollback) and rewrote the file.
    fs::write(&path, GO_FULL).expect("go writes");
    let journal = fs::read(journal_of(&path)).expect("journal");
    let err = ClaimsStore::open(&path)
        .await
        .expect_err("foreign snapshot");
    let msg = err.to_string();
    assert!(matches!(err, Error::State { .. }), "{msg}");
    assert!(
        msg.contains(&journal_of(&path).display().to_string()) && msg.contains("does not continue"),
        "{msg}"
    );
    assert_eq!(fs::read(&path).expect("read"), GO_FULL.as_bytes());
    assert_eq!(fs::read(journal_of(&path)).expect("read"), journal);
}

#[tokio::test]
async fn interrupted_rewrites_recover() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let store = ClaimsStore::open(&path).await.expect("open");
    store.commit("ns/a", claim("sb_1")).await.expect("commit");
    store.commit("ns/b", claim("sb_2")).await.expect("commit");
    drop(store);

    // Crash after step 2 (journal moved aside, old snapshot still in place):
    // the old journal continues the snapshot and is replayed.
    fs::rename(journal_of(&path), journal_old_of(&path)).expect("mv");
    let store = ClaimsStore::open(&path).await.expect("reopen");
    assert_eq!(rows(&store).len(), 2);
    assert!(!journal_old_of(&path).exists(), "start-up write retired it");

    // Crash after step 3 (new snapshot in place, old journal not yet
    // unlinked): the old journal is skipped, so a removal folded into the
    // new snapshot stays removed.
    // (A prefix of the journal stands in for it, so that replaying it by
    // mistake would visibly resurrect ns/c.)
    store.commit("ns/c", claim("sb_3")).await.expect("commit");
    let stale = fs::read(journal_of(&path)).expect("journal");
    assert!(store.remove("ns/c", "sb_3").await.expect("remove"));
    store.commit("ns/d", claim("sb_4")).await.expect("commit");
    store.compact().await.expect("compact");
    drop(store);
    fs::write(journal_old_of(&path), &stale).expect("stale journal");
    let store = ClaimsStore::open(&path).await.expect("reopen");
    assert_eq!(
        rows(&store).keys().cloned().collect::<Vec<_>>(),
        vec!["ns/a", "ns/b", "ns/d"]
    );
}

#[tokio::test]
async fn compaction_keeps_everything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let options = StoreOptions {
        compact_min_bytes: 2048,
        compact_ratio: 2,
    };
    let store = ClaimsStore::open_with(&path, options).await.expect("open");
    let mut model = BTreeMap::new();
    for i in 0..120 {
        let key = format!("ns/p{:03}", i % 40);
        if let Some(held) = model.get(&key).map(|c: &Claim| c.id.clone()) {
            assert!(store.remove(&key, &held).await.expect("remove"));
            model.remove(&key);
        } else {
            let c = claim(&format!("sb_{i}"));
            store.commit(&key, c.clone()).await.expect("commit");
            model.insert(key, c);
        }
    }
    let stats = store.stats();
    assert!(stats.rewrites >= 3, "compactions happened: {stats:?}");
    assert_eq!(rows(&store), model);
    let fresh = ClaimsStore::open_with(&path, options)
        .await
        .expect("reopen");
    assert_eq!(rows(&fresh), model);
}

#[tokio::test]
async fn compact_writes_a_go_claims_json_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    fs::write(&path, GO_FULL).expect("write");
    let store = ClaimsStore::open(&path).await.expect("open");
    // The start-up write already produced the Go file byte for byte.
    assert_eq!(fs::read_to_string(&path).expect("read"), GO_FULL);
    let mut c = claim("sb_c");
    c.address = String::new();
    c.deadline = None;
    store.commit("ns/c", c).await.expect("commit");
    assert!(store.remove("ns/b", "sb_b").await.expect("remove"));
    store.compact().await.expect("compact");
    assert!(!journal_of(&path).exists(), "journal removed");
    assert_eq!(mode(&path), 0o600);
    let text = fs::read_to_string(&path).expect("read");
    assert_eq!(
        text,
        r#"{"claims":{"ns/a":{"id":"sb_a","token":"ta","address":"10.0.0.5:7777","podUID":"ua","claimedAt":"2026-01-01T00:00:00Z","deadline":"2026-01-02T03:04:05Z"},"ns/c":{"id":"sb_c","token":"tok-sb_c","podUID":"uid-sb_c","claimedAt":"2026-01-01T00:00:00Z"}}}"#
    );
    // Still usable after compaction, and the next change starts a journal.
    store.commit("ns/d", claim("sb_d")).await.expect("commit");
    assert!(journal_of(&path).exists());
    let fresh = ClaimsStore::open(&path).await.expect("reopen");
    assert_eq!(fresh.len(), 3);
}

#[tokio::test]
async fn tentative_rows_are_never_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state_dir = dir.path().join("state");
    let parked = dir.path().join("parked");
    let path = state_dir.join("claims.json");
    let store = ClaimsStore::open(&path).await.expect("open");
    store.commit("ns/a", claim("sb_1")).await.expect("commit");

    // Make the state unwritable: the directory's place is taken by a file.
    fs::rename(&state_dir, &parked).expect("park");
    fs::write(&state_dir, "").expect("block");
    let err = store
        .commit("ns/b", claim("sb_2"))
        .await
        .expect_err("fails");
    assert!(matches!(err, Error::StateWrite { .. }), "{err}");
    // The credential stays in memory, tentative.
    let (b, state) = store.get("ns/b").expect("row");
    assert_eq!(
        (state, b.token.as_str()),
        (ClaimState::Tentative, "tok-sb_2")
    );
    assert_eq!(
        store.counts(),
        ClaimCounts {
            settled: 1,
            tentative: 1,
            quarantined: 0
        }
    );

    // Writable again: a later write heals, without the tentative row.
    fs::remove_file(&state_dir).expect("unblock");
    fs::rename(&parked, &state_dir).expect("restore");
    store.commit("ns/c", claim("sb_3")).await.expect("commit");
    assert_eq!(store.get("ns/b").expect("row").1, ClaimState::Tentative);
    let fresh = ClaimsStore::open(&path).await.expect("reopen");
    assert_eq!(
        rows(&fresh).keys().cloned().collect::<Vec<_>>(),
        vec!["ns/a", "ns/c"]
    );
    drop(fresh);
    // The undo: remove the tentative row.
    assert!(store.remove("ns/b", "sb_2").await.expect("undo"));
    store.compact().await.expect("compact");
    let text = fs::read_to_string(&path).expect("read");
    assert!(!text.contains("sb_2"), "{text}");
}

#[tokio::test]
async fn directory_deleted_while_running_self_heals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state_dir = dir.path().join("state");
    let path = state_dir.join("claims.json");
    let store = ClaimsStore::open(&path).await.expect("open");
    store.commit("ns/a", claim("sb_1")).await.expect("commit");
    fs::remove_dir_all(&state_dir).expect("rm -rf");
    store
        .commit("ns/b", claim("sb_2"))
        .await
        .expect("commit heals");
    assert_eq!(mode(&state_dir), 0o700);
    assert_eq!(mode(&path), 0o600);
    // Again, with only the snapshot deleted this time.
    fs::remove_file(&path).expect("rm snapshot");
    store
        .commit("ns/c", claim("sb_3"))
        .await
        .expect("commit heals");
    let fresh = ClaimsStore::open(&path).await.expect("reopen");
    assert_eq!(
        rows(&fresh).keys().cloned().collect::<Vec<_>>(),
        vec!["ns/a", "ns/b", "ns/c"]
    );
}

#[tokio::test]
async fn verification_follows_4_5() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let go = r#"{"claims":{
        "ns/a":{"id":"sb_a","token":"ta","podUID":"ua","claimedAt":"2026-01-01T00:00:00Z"},
        "ns/b":{"id":"sb_b","token":"tb","podUID":"ub","claimedAt":"2026-01-01T00:00:00Z","deadline":"2026-03-01T00:00:00Z"},
        "ns/c":{"id":"sb_c","token":"tc","podUID":"uc","claimedAt":"2026-01-01T00:00:00Z"},
        "ns/d":{"id":"sb_d","token":"td","podUID":"ud","claimedAt":"2026-01-01T00:00:00Z"},
        "ns/e":{"id":"sb_e","token":"te","podUID":"ue","claimedAt":"2026-01-01T00:00:00Z"},
        "ns/f":{"id":"sb_f","token":"tf","podUID":"uf","claimedAt":"2026-01-01T00:00:00Z"}}}"#;
    fs::write(&path, go).expect("write");
    let store = ClaimsStore::open(&path).await.expect("open");
    let snapshot = store.quarantined();
    assert_eq!(snapshot.len(), 6);
    assert_eq!(snapshot[0], ("ns/a".to_string(), "sb_a".to_string()));
    assert_eq!(store.held_ids().len(), 6);

    // After the snapshot: d released, e replaced by a new claim.
    assert!(store.remove("ns/d", "sb_d").await.expect("remove"));
    assert!(store.remove("ns/e", "sb_e").await.expect("remove"));
    store.commit("ns/e", claim("sb_e2")).await.expect("commit");
    // f becomes tentative with the same id (a re-commit that fails).
    let parked = dir.path().with_extension("parked");
    fs::rename(dir.path(), &parked).expect("park");
    fs::write(dir.path(), "").expect("block");
    let mut f = claim("sb_f");
    f.token = "tf".into();
    store.commit("ns/f", f).await.expect_err("unwritable");
    fs::remove_file(dir.path()).expect("unblock");
    fs::rename(&parked, dir.path()).expect("restore");
    assert_eq!(store.get("ns/f").expect("row").1, ClaimState::Tentative);

    let listing = [
        listed("sb_a", Deadline::At(ts("2026-02-01T00:00:00.9Z"))),
        listed("sb_b", Deadline::At(ts("2026-09-09T00:00:00Z"))),
        listed("sb_e", Deadline::Never),
        listed("sb_unrelated", Deadline::Never),
    ];
    let report = store
        .apply_verification(&snapshot, &listing)
        .await
        .expect("verify");
    assert_eq!(report.lifted, vec!["ns/a", "ns/b"]);
    assert_eq!(report.deadlines_taken, vec!["ns/a"]);
    assert_eq!(
        report.dropped,
        vec![("ns/c".to_string(), "sb_c".to_string())]
    );
    assert_eq!(report.unjudged, 2, "d removed, e replaced");
    assert_eq!(report.kept_tentative, 1, "f");
    assert_eq!(report.remaining_quarantined, 0);

    assert_eq!(
        store.get("ns/a").expect("a"),
        (
            Claim {
                id: "sb_a".into(),
                token: "ta".into(),
                address: String::new(),
                pod_uid: "ua".into(),
                claimed_at: ts("2026-01-01T00:00:00Z"),
                deadline: Some(ts("2026-02-01T00:00:00Z")),
            },
            ClaimState::Settled
        )
    );
    let (b, b_state) = store.get("ns/b").expect("b");
    assert_eq!(b_state, ClaimState::Settled);
    assert_eq!(
        b.deadline,
        Some(ts("2026-03-01T00:00:00Z")),
        "own deadline kept"
    );
    assert!(store.get("ns/c").is_none());
    assert!(store.get("ns/d").is_none(), "not resurrected");
    assert_eq!(
        store.get("ns/e").expect("e"),
        (claim("sb_e2"), ClaimState::Settled),
        "replacement untouched"
    );
    assert_eq!(store.get("ns/f").expect("f").1, ClaimState::Tentative);

    // Nothing quarantined: an empty snapshot judges nothing.
    assert!(store.quarantined().is_empty());
    let report = store.apply_verification(&[], &[]).await.expect("verify");
    assert_eq!(report, VerifyReport::default());

    // Durable: a fresh open sees a (with the listed deadline), b and e.
    let fresh = ClaimsStore::open(&path).await.expect("reopen");
    assert_eq!(
        rows(&fresh).keys().cloned().collect::<Vec<_>>(),
        vec!["ns/a", "ns/b", "ns/e"]
    );
    assert_eq!(
        fresh.get("ns/a").expect("a").0.deadline,
        Some(ts("2026-02-01T00:00:00Z"))
    );
}

#[test]
fn debug_redacts_the_token() {
    let c = claim("sb_1");
    let shown = format!("{c:?}");
    assert!(!shown.contains("tok-sb_1"), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
    assert!(shown.contains("sb_1"));
}

#[tokio::test]
async fn all_is_sorted_and_held_ids_cover_every_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    fs::write(
        &path,
        r#"{"claims":{"z/q":{"id":"sb_q","token":"t","podUID":""}}}"#,
    )
    .expect("write");
    let store = ClaimsStore::open(&path).await.expect("open");
    store.commit("m/b", claim("sb_b")).await.expect("commit");
    store.commit("a/a", claim("sb_a")).await.expect("commit");
    let keys: Vec<_> = store.all().into_iter().map(|(k, _, _)| k).collect();
    assert_eq!(keys, vec!["a/a", "m/b", "z/q"]);
    let ids = store.held_ids();
    assert!(ids.contains("sb_q") && ids.contains("sb_a") && ids.contains("sb_b"));
    assert_eq!(
        store.counts(),
        ClaimCounts {
            settled: 2,
            tentative: 0,
            quarantined: 1
        }
    );
}

/// One step of the model test.
#[derive(Debug, Clone)]
enum Op {
    /// Commit a new id (or, with `reuse`, the key's current id again).
    Commit {
        key: u8,
        reuse: bool,
    },
    Remove {
        key: u8,
        right_id: bool,
    },
    Rebind {
        key: u8,
        uid: u8,
    },
    SetDeadline {
        key: u8,
        secs: Option<u16>,
    },
    Compact,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, any::<bool>()).prop_map(|(key, r)| Op::Commit { key, reuse: r && key % 2 == 0 }),
        3 => (0u8..6, any::<bool>()).prop_map(|(key, right_id)| Op::Remove { key, right_id }),
        2 => (0u8..6, 0u8..4).prop_map(|(key, uid)| Op::Rebind { key, uid }),
        2 => (0u8..6, proptest::option::of(any::<u16>()))
            .prop_map(|(key, secs)| Op::SetDeadline { key, secs }),
        1 => Just(Op::Compact),
        1 => Just(Op::Reopen),
    ]
}

async fn run_model(path: &Path, ops: &[Op]) {
    let options = StoreOptions {
        compact_min_bytes: 600,
        compact_ratio: 1,
    };
    let mut store = ClaimsStore::open_with(path, options).await.expect("open");
    let mut model: BTreeMap<String, Claim> = BTreeMap::new();
    for (n, op) in ops.iter().enumerate() {
        match op {
            Op::Commit { key, reuse } => {
                let key = format!("ns/p{key}");
                let id = match (reuse, model.get(&key)) {
                    (true, Some(held)) => held.id.clone(),
                    _ => format!("sb_{n}"),
                };
                let mut c = claim(&id);
                c.claimed_at = Timestamp::from_second(1_700_000_000 + n as i64).expect("ts");
                let result = store.commit(&key, c.clone()).await;
                match model.get(&key) {
                    Some(held) if held.id != id => {
                        assert!(matches!(result, Err(Error::ClaimConflict { .. })));
                    }
                    _ => {
                        result.expect("commit");
                        model.insert(key, c);
                    }
                }
            }
            Op::Remove { key, right_id } => {
                let key = format!("ns/p{key}");
                let id = match (right_id, model.get(&key)) {
                    (true, Some(held)) => held.id.clone(),
                    _ => "sb_none".to_string(),
                };
                let removed = store.remove(&key, &id).await.expect("remove");
                assert_eq!(removed, model.get(&key).is_some_and(|c| c.id == id));
                if removed {
                    model.remove(&key);
                }
            }
            Op::Rebind { key, uid } => {
                let key = format!("ns/p{key}");
                let id = model.get(&key).map(|c| c.id.clone()).unwrap_or_default();
                let uid = format!("uid-{uid}");
                store.rebind(&key, &id, &uid).await.expect("rebind");
                if let Some(c) = model.get_mut(&key) {
                    c.pod_uid = uid;
                }
            }
            Op::SetDeadline { key, secs } => {
                let key = format!("ns/p{key}");
                let id = model.get(&key).map(|c| c.id.clone()).unwrap_or_default();
                let deadline =
                    secs.map(|s| Timestamp::from_second(1_800_000_000 + i64::from(s)).expect("ts"));
                store
                    .set_deadline(&key, &id, deadline)
                    .await
                    .expect("deadline");
                if let Some(c) = model.get_mut(&key) {
                    c.deadline = deadline;
                }
            }
            Op::Compact => store.compact().await.expect("compact"),
            Op::Reopen => {
                drop(store);
                store = ClaimsStore::open_with(path, options).await.expect("reopen");
                // Reopened rows are quarantined; lift them as a listing would.
                let snapshot = store.quarantined();
                let listing: Vec<_> = model
                    .values()
                    .map(|c| listed(&c.id, Deadline::Never))
                    .collect();
                let report = store
                    .apply_verification(&snapshot, &listing)
                    .await
                    .expect("verify");
                assert!(report.dropped.is_empty());
            }
        }
        assert_eq!(rows(&store), model, "in memory after {op:?}");
    }
    drop(store);
    let fresh = ClaimsStore::open_with(path, options).await.expect("final");
    assert_eq!(rows(&fresh), model, "after reopen");
    assert_eq!(fresh.counts().quarantined, model.len());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn reopen_matches_the_model(ops in proptest::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("claims.json");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(run_model(&path, &ops));
    }
}
