//! The state path, checked on the local disk without creating or modifying
//! the state file (or its directory): the directory must accept a new file
//! (a probe file is created and removed), and an existing state file must
//! load exactly as the claims store would load it.

use std::fs::OpenOptions;
use std::path::Path;

use jiff::Timestamp;

use super::check::CheckResult;
use crate::claims::dir::{probe_writable as probe, state_dir};
use crate::claims::{StatePaths, read};

const FLAG: &str = "--state-path (env VK_STATE_PATH)";

/// The state directory line and the state file line.
pub fn check(path: &Path) -> Vec<CheckResult> {
    vec![directory(path), file(path)]
}

fn directory(path: &Path) -> CheckResult {
    let name = "state directory";
    let fix = format!(
        "make the directory writable by the user vk-sandbox runs as (UID 65532 in the image: \
         chown, fsGroup, or a writable volume), or point {FLAG} elsewhere"
    );
    if path.is_dir() {
        return CheckResult::fail(
            name,
            format!("{} is a directory", path.display()),
            format!(
                "{FLAG} names the claims file inside it, e.g. {}/claims.json",
                path.display()
            ),
        );
    }
    let dir = state_dir(path);
    if dir.is_dir() {
        return match probe(&dir) {
            Ok(()) => CheckResult::ok(name, format!("{} is writable", dir.display())),
            Err(e) => CheckResult::fail(name, e, fix),
        };
    }
    // vk-sandbox creates a missing directory (0700): its nearest existing
    // ancestor must accept it. Nothing is created here.
    let mut ancestor = dir.as_path();
    while !ancestor.exists() {
        match ancestor.parent() {
            Some(p) if !p.as_os_str().is_empty() => ancestor = p,
            _ => {
                ancestor = Path::new(".");
                break;
            }
        }
    }
    if !ancestor.is_dir() {
        return CheckResult::fail(
            name,
            format!(
                "{} cannot be created: {} is not a directory",
                dir.display(),
                ancestor.display()
            ),
            format!("point {FLAG} at a path under a directory"),
        );
    }
    match probe(ancestor) {
        Ok(()) => CheckResult::ok(
            name,
            format!(
                "{} does not exist yet; vk-sandbox will create it (mode 0700) under {}, which \
                 is writable",
                dir.display(),
                ancestor.display()
            ),
        ),
        Err(e) => CheckResult::fail(
            name,
            format!(
                "{} does not exist and cannot be created: {e}",
                dir.display()
            ),
            fix,
        ),
    }
}

fn file(path: &Path) -> CheckResult {
    let name = "state file";
    if path.is_dir() {
        return CheckResult::not_checked(name, "the state path is a directory");
    }
    let view = match read::read(&StatePaths::new(path), Timestamp::now()) {
        Ok(v) => v,
        Err(problem) => {
            return CheckResult::fail(
                name,
                problem.to_string(),
                "it holds release credentials and was left as it is: repair or restore it \
                 (never discard it while the sandboxes it names are live); vk-sandbox refuses \
                 to start until then",
            );
        }
    };
    if !view.snapshot_found && view.loaded.frames == 0 {
        return CheckResult::ok(
            name,
            format!(
                "no state file yet at {}: vk-sandbox starts with no claims and creates it (0600)",
                path.display()
            ),
        );
    }
    if view.snapshot_found
        && let Err(e) = OpenOptions::new().append(true).open(path)
    {
        return CheckResult::fail(
            name,
            format!(
                "{} is readable but cannot be opened for writing: {e}",
                path.display()
            ),
            "make it writable by the user vk-sandbox runs as (it is rewritten at start-up)",
        );
    }
    CheckResult::ok(
        name,
        format!(
            "{} loads: {} claims{}",
            path.display(),
            view.loaded.rows.len(),
            if view.loaded.frames > 0 {
                format!(" (journal: {} records)", view.loaded.frames)
            } else {
                String::new()
            }
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::format;
    use crate::preflight::Status;
    use std::fs;

    fn listing(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .expect("read dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn missing_directory_is_not_created() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("a/b/claims.json");
        let r = check(&path);
        assert_eq!(r[0].status, Status::Ok, "{r:?}");
        assert!(r[0].detail.contains("will create it"), "{r:?}");
        assert_eq!(r[1].status, Status::Ok, "{r:?}");
        assert!(r[1].detail.contains("no state file yet"));
        assert!(
            listing(tmp.path()).is_empty(),
            "nothing created or left behind"
        );
    }

    #[test]
    fn go_claims_file_loads_and_is_untouched() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("claims.json");
        let go = br#"{"claims":{"ns/p":{"id":"sb_1","token":"t","address":"10.0.0.5:7777","claimedAt":"2025-01-02T03:04:05Z"}}}"#;
        fs::write(&path, go).expect("write");
        let before = fs::metadata(&path)
            .expect("meta")
            .modified()
            .expect("mtime");
        let r = check(&path);
        assert_eq!(r[0].status, Status::Ok, "{r:?}");
        assert_eq!(r[1].status, Status::Ok, "{r:?}");
        assert!(r[1].detail.contains("1 claims"), "{r:?}");
        assert_eq!(fs::read(&path).expect("read"), go);
        assert_eq!(
            fs::metadata(&path)
                .expect("meta")
                .modified()
                .expect("mtime"),
            before
        );
        assert_eq!(listing(tmp.path()), vec!["claims.json"]);
    }

    #[test]
    fn malformed_state_fails_and_is_kept() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("claims.json");
        fs::write(&path, b"{not json").expect("write");
        let r = check(&path);
        assert_eq!(r[1].status, Status::Fail, "{r:?}");
        assert!(r[1].detail.contains("claims.json"), "{r:?}");
        assert!(
            r[1].fix
                .as_deref()
                .is_some_and(|f| f.contains("release credentials"))
        );
        assert_eq!(fs::read(&path).expect("read"), b"{not json");
    }

    #[test]
    fn journal_of_another_snapshot_fails() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("claims.json");
        fs::write(&path, br#"{"claims":{}}"#).expect("write");
        let frame = format::encode_frame(&[], Some("0123456789abcdef"));
        fs::write(StatePaths::new(&path).journal, frame).expect("write journal");
        let r = check(&path);
        assert_eq!(r[1].status, Status::Fail, "{r:?}");
        assert!(r[1].detail.contains("does not continue"), "{r:?}");
    }

    #[test]
    fn state_path_that_is_a_directory_fails() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let r = check(tmp.path());
        assert_eq!(r[0].status, Status::Fail);
        assert_eq!(r[1].status, Status::Warn);
    }

    #[test]
    fn directory_under_a_file_fails() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("f");
        fs::write(&file, b"x").expect("write");
        let r = check(&file.join("sub/claims.json"));
        assert_eq!(r[0].status, Status::Fail, "{r:?}");
    }
}
