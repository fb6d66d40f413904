//! Cost of persisting one claim, fsync included (a claim is on disk before
//! its Pod is reported Running).
//!
//! - `claims_commit/one/N`: one `ClaimsStore::commit` into a store already
//!   holding N claims (journal append + fdatasync);
//! - `claims_commit/concurrent32/1000`: 32 commits issued at once (group
//!   commit: they share writes and syncs), time for all 32;
//! - `claims_commit/go_rewrite/N`: the Go original's way, rewriting the
//!   whole table per claim (tmp file, fsync, rename, fsync directory).
//!
//! Files go under `CLAIMS_BENCH_DIR` (default: the system temp dir; use a
//! real disk, not tmpfs, for meaningful fsync figures). `BENCH_SCALE=k`
//! multiplies sample counts and measurement time by k. The Go baseline
//! samples one iteration each (flat sampling): at 100 000 claims one
//! rewrite takes a good fraction of a second.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use jiff::Timestamp;
use vk_sandbox::claims::{Claim, ClaimsStore, format};

static NEXT: AtomicU64 = AtomicU64::new(0);

fn scale() -> u32 {
    std::env::var("BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|k| *k >= 1)
        .unwrap_or(1)
}

fn bench_dir() -> tempfile::TempDir {
    match std::env::var_os("CLAIMS_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .expect("bench temp dir")
}

fn claim(n: u64) -> Claim {
    Claim {
        id: format!("sb_{n:016x}"),
        token: vk_sandbox::sandboxd::Token::new(format!("{n:064x}")),
        address: "10.244.17.203:7777".into(),
        pod_uid: format!("6c1f5a2e-0b7d-4d0e-9a51-{n:012x}"),
        claimed_at: Timestamp::from_second(1_780_000_000).expect("ts"),
        deadline: Some(Timestamp::from_second(1_780_086_400).expect("ts")),
        lifecycle: Default::default(),
    }
}

fn fresh_key() -> (String, Claim) {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    (format!("bench/new-{n:012}"), claim(n | (1 << 40)))
}

fn table(n: u64) -> BTreeMap<String, Claim> {
    (0..n)
        .map(|i| (format!("team-{:03}/sandbox-{i:07}", i % 100), claim(i)))
        .collect()
}

/// A store at `dir` preloaded (through a Go claims.json) with `n` claims.
fn store_with(rt: &tokio::runtime::Runtime, dir: &Path, n: u64) -> ClaimsStore {
    let path = dir.join("claims.json");
    fs::write(&path, format::encode_snapshot(&table(n))).expect("seed");
    let store = rt.block_on(ClaimsStore::open(&path)).expect("open");
    assert_eq!(store.len() as u64, n);
    store
}

/// The Go original's write: the whole table, tmp + rename (plus fsyncs).
fn go_rewrite(path: &Path, tmp: &Path, dir: &Path, rows: &BTreeMap<String, Claim>) {
    let bytes = format::encode_snapshot(rows);
    let _ = fs::remove_file(tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)
        .expect("tmp");
    f.write_all(&bytes).expect("write");
    f.sync_all().expect("fsync");
    drop(f);
    fs::rename(tmp, path).expect("rename");
    File::open(dir)
        .and_then(|d| d.sync_all())
        .expect("fsync dir");
}

fn configure(c: &mut Criterion) -> criterion::BenchmarkGroup<'_, criterion::measurement::WallTime> {
    let k = scale();
    let mut group = c.benchmark_group("claims_commit");
    group
        .sample_size(10 * k as usize)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3 * u64::from(k)));
    group
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = configure(c);

    for n in [0u64, 1_000, 10_000, 100_000] {
        let dir = bench_dir();
        let store = store_with(&rt, dir.path(), n);
        group.bench_with_input(BenchmarkId::new("one", n), &n, |b, _| {
            // Only the commit is timed; the row is removed again after, so
            // the table stays at N claims.
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (key, claim) = fresh_key();
                    let id = claim.id.clone();
                    let start = Instant::now();
                    rt.block_on(store.commit(&key, claim)).expect("commit");
                    total += start.elapsed();
                    rt.block_on(store.remove(&key, &id)).expect("remove");
                }
                total
            })
        });
        eprintln!("one/{n}: {:?}", store.stats());
    }

    {
        let dir = bench_dir();
        let store = store_with(&rt, dir.path(), 1_000);
        group.bench_function(BenchmarkId::new("concurrent32", 1_000), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let rows: Vec<_> = (0..32).map(|_| fresh_key()).collect();
                    let start = Instant::now();
                    rt.block_on(async {
                        let tasks: Vec<_> = rows
                            .iter()
                            .cloned()
                            .map(|(key, claim)| {
                                let store = store.clone();
                                tokio::spawn(async move { store.commit(&key, claim).await })
                            })
                            .collect();
                        for t in tasks {
                            t.await.expect("join").expect("commit");
                        }
                    });
                    total += start.elapsed();
                    rt.block_on(futures::future::join_all(
                        rows.iter().map(|(key, claim)| store.remove(key, &claim.id)),
                    ))
                    .into_iter()
                    .for_each(|r| {
                        r.expect("remove");
                    });
                }
                total
            })
        });
        let s = store.stats();
        eprintln!(
            "concurrent32: {s:?} ({:.1} commits per batch)",
            s.requests as f64 / s.batches.max(1) as f64
        );
    }

    group.sampling_mode(criterion::SamplingMode::Flat);
    for n in [0u64, 1_000, 10_000, 100_000] {
        let dir = bench_dir();
        let path: PathBuf = dir.path().join("claims.json");
        let tmp = dir.path().join("claims.json.tmp");
        let mut rows = table(n);
        group.bench_with_input(BenchmarkId::new("go_rewrite", n), &n, |b, _| {
            b.iter(|| {
                let (key, claim) = fresh_key();
                rows.insert(key.clone(), claim);
                go_rewrite(&path, &tmp, dir.path(), &rows);
                rows.remove(&key);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
