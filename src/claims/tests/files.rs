//! The files: torn and corrupt journals, rewrites, compaction, a deleted directory.

use super::*;
use crate::claims::state_lock::StateLock;

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
        (state, b.token.as_deref().map_or("", |t| t.expose())),
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

/// A store opened as the daemon opens it, holding the state lock of
/// `<dir>/state/claims.json`.
async fn locked_store() -> (tempfile::TempDir, ClaimsStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state/claims.json");
    fs::create_dir_all(dir.path().join("state")).expect("mkdir");
    let lock = StateLock::acquire(&path).expect("lock");
    let store = ClaimsStore::open_locked(&path, lock).await.expect("open");
    (dir, store)
}

/// The state lock survives the state directory being deleted: the writer
/// recreates the directory and locks the new lock file before writing, so
/// a second process cannot take the state over (it could before: the lock
/// was on the deleted file, and a new `.lock` was free).
#[tokio::test]
async fn the_state_lock_survives_the_directory_being_deleted() {
    let (dir, store) = locked_store().await;
    let state_dir = dir.path().join("state");
    let path = state_dir.join("claims.json");
    store.commit("ns/a", claim("sb_1")).await.expect("commit");
    assert!(StateLock::acquire(&path).is_err(), "held");
    fs::remove_dir_all(&state_dir).expect("rm -rf");
    store
        .commit("ns/b", claim("sb_2"))
        .await
        .expect("commit heals");
    let second = StateLock::acquire(&path);
    assert!(
        second.is_err(),
        "a second process locked the recreated state: {second:?}"
    );
    // Only the lock file removed: locked again at the next write.
    fs::remove_file(state_dir.join("claims.json.lock")).expect("rm lock");
    store.commit("ns/c", claim("sb_3")).await.expect("commit");
    assert!(StateLock::acquire(&path).is_err(), "lock re-asserted");
}

/// When another process holds the recreated lock first, the writer refuses
/// to write rather than share the state.
#[tokio::test]
async fn a_state_taken_over_meanwhile_is_not_written() {
    let (dir, store) = locked_store().await;
    let state_dir = dir.path().join("state");
    let path = state_dir.join("claims.json");
    fs::remove_dir_all(&state_dir).expect("rm -rf");
    fs::create_dir_all(&state_dir).expect("mkdir");
    let _other = StateLock::acquire(&path).expect("another process locks the new file");
    let err = store
        .commit("ns/a", claim("sb_1"))
        .await
        .expect_err("must not write a state another process holds");
    assert!(err.to_string().contains("state lock"), "{err}");
    assert!(!path.exists(), "nothing written");
}
