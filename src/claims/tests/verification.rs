//! Verification against sandboxd's listing, reads, and the model-based check.

use super::*;

#[tokio::test]
async fn verification_vouches_expires_and_keeps_rows() {
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
    f.token = crate::sandboxd::Token::new("tf");
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
                token: crate::sandboxd::Token::new("ta"),
                address: String::new(),
                pod_uid: "ua".into(),
                claimed_at: ts("2026-01-01T00:00:00Z"),
                deadline: Some(ts("2026-02-01T00:00:00Z")),
                lifecycle: Default::default(),
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
