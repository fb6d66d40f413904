//! The state directory: where it is, and whether this process can write
//! there. Shared by the daemon (which creates a missing directory, 0700)
//! and `vk-sandbox preflight` (which only looks).

use std::fs::{self, OpenOptions};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The directory that holds the state file.
pub fn state_dir(state_path: &Path) -> PathBuf {
    match state_path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Creates and removes a probe file in `dir`: the only honest test of
/// writability (a mode check would lie for root and for ACLs).
pub fn probe_writable(dir: &Path) -> Result<(), String> {
    let probe = dir.join(format!(
        ".vk-sandbox-write-probe-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| format!("cannot create a file in {}: {e}", dir.display()))?;
    fs::remove_file(&probe)
        .map_err(|e| format!("cannot remove the probe file {}: {e}", probe.display()))
}

/// Create the state file's directory (mode 0700, with missing parents) if
/// it does not exist, then prove it writable with a probe file. An existing
/// state file must be openable for writing.
///
/// Note: root bypasses directory permission bits, so a mode-0500 directory
/// passes this check when running as root; the check still refuses when
/// the write really fails (read-only mounts, a parent that is a file, an
/// unprivileged user).
pub fn ensure_state_writable(state_path: &Path) -> Result<(), String> {
    if state_path.is_dir() {
        return Err(format!(
            "{} is a directory; the flag names the claims file inside it",
            state_path.display()
        ));
    }
    let dir = state_dir(state_path);
    if !dir.is_dir() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("mkdir state dir {}: {e}", dir.display()))?;
    }
    probe_writable(&dir)?;
    if state_path.exists() {
        OpenOptions::new()
            .append(true)
            .open(state_path)
            .map_err(|e| format!("cannot open {} for writing: {e}", state_path.display()))?;
    }
    Ok(())
}
