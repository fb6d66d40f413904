use super::*;
use crate::claims::Claim;
use crate::claims::format::{JournalOp, encode_frame, encode_snapshot, snapshot_base};
use crate::claims::state_lock::{Daemon, probe as probe_daemon};
use std::collections::BTreeMap;

fn claim(id: &str) -> Claim {
    Claim {
        id: id.into(),
        token: crate::sandboxd::Token::new(format!("tok-{id}")),
        address: String::new(),
        pod_uid: "u".into(),
        claimed_at: "2026-01-01T00:00:00Z".parse().expect("ts"),
        deadline: None,
        lifecycle: Default::default(),
    }
}

fn write_state(path: &Path, rows: &[(&str, &str)], journal: &[JournalOp]) -> Vec<u8> {
    let table: BTreeMap<String, Claim> = rows
        .iter()
        .map(|(k, id)| (k.to_string(), claim(id)))
        .collect();
    let snap = encode_snapshot(&table);
    fs::write(path, &snap).expect("snapshot");
    if !journal.is_empty() {
        let base = snapshot_base(&snap);
        fs::write(
            StatePaths::new(path).journal,
            encode_frame(journal, Some(&base)),
        )
        .expect("journal");
    }
    snap
}

#[test]
fn snapshot_and_journal_fold_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    write_state(
        &path,
        &[("ns/a", "sb_a"), ("ns/b", "sb_b")],
        &[
            JournalOp::Del { key: "ns/a".into() },
            JournalOp::Put {
                key: "ns/c".into(),
                claim: claim("sb_c"),
            },
        ],
    );
    let before: Vec<_> = fs::read_dir(dir.path())
        .expect("ls")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    let view = read(&StatePaths::new(&path), Timestamp::UNIX_EPOCH).expect("read");
    assert_eq!(
        view.loaded.rows.keys().collect::<Vec<_>>(),
        vec!["ns/b", "ns/c"]
    );
    assert_eq!(view.loaded.frames, 1);
    assert_eq!(view.attempts, 1);
    let after: Vec<_> = fs::read_dir(dir.path())
        .expect("ls")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(before.len(), after.len(), "no file created");
    assert_eq!(
        probe_daemon(&StatePaths::new(&path).lock),
        Daemon::NoLockFile
    );
    assert!(!StatePaths::new(&path).lock.exists());
}

#[test]
fn missing_state_is_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let view = read(
        &StatePaths::new(&dir.path().join("none.json")),
        Timestamp::UNIX_EPOCH,
    )
    .expect("read");
    assert!(view.loaded.rows.is_empty());
    assert!(!view.snapshot_found);
}

#[test]
fn a_directory_or_malformed_state_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = read(&StatePaths::new(dir.path()), Timestamp::UNIX_EPOCH)
        .expect_err("directory")
        .to_string();
    assert!(err.contains("is a directory"), "{err}");
    let path = dir.path().join("claims.json");
    fs::write(&path, b"{not json").expect("write");
    let err = read(&StatePaths::new(&path), Timestamp::UNIX_EPOCH)
        .expect_err("malformed")
        .to_string();
    assert!(err.contains("claims.json: is not valid JSON"), "{err}");
    assert_eq!(fs::read(&path).expect("read"), b"{not json");
}

#[test]
fn unchanged_tells_appends_from_replacements() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("f");
    fs::write(&path, b"abc").expect("write");
    let read = open_read(&path).expect("read");
    assert!(unchanged(&read, &path, false));
    fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"d"))
        .expect("append");
    assert!(unchanged(&read, &path, true), "an append is fine");
    assert!(!unchanged(&read, &path, false), "not for the snapshot");
    let tmp = dir.path().join("tmp");
    fs::write(&tmp, b"abc").expect("write");
    fs::rename(&tmp, &path).expect("rename");
    assert!(!unchanged(&read, &path, true), "a replaced file");
    fs::remove_file(&path).expect("rm");
    assert!(!unchanged(&read, &path, true), "a removed file");
    let absent = open_read(&dir.path().join("nothing")).expect("absent");
    assert!(unchanged(&absent, &dir.path().join("nothing"), true));
    fs::write(dir.path().join("nothing"), b"").expect("create");
    assert!(
        !unchanged(&absent, &dir.path().join("nothing"), true),
        "a file that appeared"
    );
}

/// Reads racing a daemon that commits, removes and compacts all the
/// time: every read succeeds and sees a state the daemon had. Step i
/// commits k(i) and then removes k(i-5), so every state the daemon has
/// is a window of consecutive keys, at most 6 long, that only moves up.
#[test]
fn reads_racing_commits_and_compactions_are_consistent() {
    use crate::claims::{ClaimsStore, StoreOptions};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.json");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let total = 400usize;
    let key = |i: usize| format!("ns/k{i:04}");
    let writer_path = path.clone();
    let (opened_tx, opened_rx) = std::sync::mpsc::channel();
    let writer = std::thread::spawn(move || {
        runtime.block_on(async {
            // The snapshot stays small: a compaction every few steps.
            let options = StoreOptions {
                compact_min_bytes: 0,
                compact_ratio: 2,
            };
            let store = ClaimsStore::open_with(&writer_path, options)
                .await
                .expect("open");
            let _ = opened_tx.send(());
            for i in 0..total {
                let id = format!("sb_{i}");
                store.commit(&key(i), claim(&id)).await.expect("commit");
                if i >= 5 {
                    let old = format!("sb_{}", i - 5);
                    assert!(store.remove(&key(i - 5), &old).await.expect("remove"));
                }
            }
            store.stats().rewrites
        })
    });
    opened_rx.recv().expect("store opened");
    let paths = StatePaths::new(&path);
    let (mut low, mut high) = (0, 0);
    let mut reads = 0;
    let mut retried = 0;
    while !writer.is_finished() || reads == 0 {
        let view = read(&paths, Timestamp::UNIX_EPOCH).expect("every read succeeds");
        let index: Vec<usize> = view
            .loaded
            .rows
            .keys()
            .map(|k| k["ns/k".len()..].parse().expect("index"))
            .collect();
        if let (Some(&first), Some(&last)) = (index.first(), index.last()) {
            assert_eq!(
                index,
                (first..=last).collect::<Vec<_>>(),
                "not a state the daemon had"
            );
            assert!(index.len() <= 6, "not a state the daemon had: {index:?}");
            assert!(
                first >= low && last >= high,
                "went back from {low}..={high} to {index:?}"
            );
            (low, high) = (first, last);
        }
        reads += 1;
        retried += view.attempts - 1;
    }
    let rewrites = writer.join().expect("writer");
    assert!(rewrites > 50, "only {rewrites} compactions");
    let view = read(&paths, Timestamp::UNIX_EPOCH).expect("final read");
    assert_eq!(
        view.loaded.rows.keys().cloned().collect::<Vec<_>>(),
        (total - 5..total).map(key).collect::<Vec<_>>()
    );
    eprintln!("{reads} reads, {retried} restarted by a compaction, {rewrites} compactions");
}
