//! The state path, checked on the local disk without creating or modifying
//! the state file (or its directory): the directory must accept a new file
//! (a probe file is created and removed), and an existing state file must
//! load exactly as the claims store would load it.

use std::fs::{self, OpenOptions};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use jiff::Timestamp;

use super::CheckResult;
use crate::claims::dir::{probe_writable as probe, state_dir};
use crate::claims::format;

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
    let summary = match read(path) {
        Ok(s) => s,
        Err(problem) => {
            return CheckResult::fail(
                name,
                problem,
                "it holds release credentials and was left as it is: repair or restore it \
                 (never discard it while the sandboxes it names are live); vk-sandbox refuses \
                 to start until then",
            );
        }
    };
    if !summary.snapshot_found && summary.journal_frames == 0 {
        return CheckResult::ok(
            name,
            format!(
                "no state file yet at {}: vk-sandbox starts with no claims and creates it (0600)",
                path.display()
            ),
        );
    }
    if summary.snapshot_found
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
            summary.rows,
            if summary.journal_frames > 0 {
                format!(" (journal: {} records)", summary.journal_frames)
            } else {
                String::new()
            }
        ),
    )
}

/// What [`read`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub snapshot_found: bool,
    pub journal_frames: usize,
    pub rows: usize,
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, String> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(None),
        Err(e) => Err(format!("{} cannot be read: {e}", path.display())),
    }
}

/// Load the state read-only, with the store's own decoders and the same
/// rules as its start-up load (`claims::writer::load`): the snapshot, then
/// `<path>.journal.old` if it continues the snapshot, then `<path>.journal`,
/// which must continue it. Nothing is written.
pub fn read(path: &Path) -> Result<Summary, String> {
    let now = format::to_second(Timestamp::now());
    let journal_path = with_suffix(path, ".journal");
    let journal_old_path = with_suffix(path, ".journal.old");
    let snapshot = read_optional(path)?;
    let journal = read_optional(&journal_path)?;
    let journal_old = read_optional(&journal_old_path)?;
    let files = format::StateBytes {
        snapshot: snapshot.as_deref(),
        journal_old: journal_old.as_deref(),
        journal: journal.as_deref(),
    };
    let loaded = format::load_state(files, now).map_err(|e| match e {
        format::LoadError::Malformed(file, problem) => {
            let at = match file {
                format::StateFile::Snapshot => path,
                format::StateFile::JournalOld => &journal_old_path,
                format::StateFile::Journal => &journal_path,
            };
            format!("{}: {problem}", at.display())
        }
        format::LoadError::JournalDoesNotContinue => format!(
            "{} does not continue {} (the snapshot was replaced since the journal started: \
             restored, edited, or written by the Go vk-sandbox after a rollback)",
            journal_path.display(),
            path.display()
        ),
    })?;
    Ok(Summary {
        snapshot_found: snapshot.is_some(),
        journal_frames: loaded.frames,
        rows: loaded.rows.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::Status;

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
        fs::write(with_suffix(&path, ".journal"), frame).expect("write journal");
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
