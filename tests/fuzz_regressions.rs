//! The fuzz targets' inputs as regular tests on the stable toolchain: every
//! file under `fuzz/regressions/<target>/` (inputs that once crashed a
//! target, kept by `e2e/fuzz.sh`) and `fuzz/seeds/<target>/` (the seed
//! corpus) goes through the same property check the fuzz target runs
//! (`fuzz/src/lib.rs`, compiled here as a module).

#[path = "../fuzz/src/lib.rs"]
mod checks;

use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for kind in ["regressions", "seeds"] {
        let Ok(dir) = std::fs::read_dir(root.join(kind).join(target)) else {
            continue;
        };
        for entry in dir.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_file() && !name.to_string_lossy().starts_with('.') {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn replay(target: &str, check: fn(&[u8])) {
    let files = inputs(target);
    assert!(!files.is_empty(), "no kept inputs for fuzz target {target}");
    for path in files {
        let data = std::fs::read(&path).expect("read kept input");
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(
            outcome.is_ok(),
            "fuzz target {target} fails on {} (see the panic above)",
            path.display()
        );
    }
}

#[test]
fn annotations() {
    replay("annotations", checks::check_annotations);
}

#[test]
fn sandboxd_reply() {
    replay("sandboxd_reply", checks::check_sandboxd_reply);
}

#[test]
fn sandboxd_verbs() {
    replay("sandboxd_verbs", checks::check_sandboxd_verbs);
}

#[test]
fn claims_load() {
    replay("claims_load", checks::check_claims_load);
}

#[test]
fn claims_roundtrip() {
    replay("claims_roundtrip", checks::check_claims_roundtrip);
}

#[test]
fn kubelet_query() {
    replay("kubelet_query", checks::check_kubelet_query);
}

#[test]
fn spdy() {
    replay("spdy", checks::check_spdy);
}
