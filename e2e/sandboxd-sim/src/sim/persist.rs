//! The claims journal: the state file sandboxd keeps, what it holds after
//! each change, and the simulated restart that reads it back.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::state::{State, pools_from};
use super::{Sim, SimError};
use crate::model::ClaimRecord;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StateFile {
    claims: Vec<ClaimRecord>,
}

pub(super) fn read_state_file(path: &Path) -> Result<Vec<ClaimRecord>, SimError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice::<StateFile>(&bytes)
            .map(|f| f.claims)
            .map_err(|e| SimError::Config(format!("state file {}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(SimError::Io {
            context: format!("read state file {}", path.display()),
            source,
        }),
    }
}

fn write_state_file(path: &Path, claims: &[ClaimRecord]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let bytes = serde_json::to_vec(&StateFile {
        claims: claims.to_vec(),
    })
    .map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

impl Sim {
    pub(super) fn persist(&self, st: &mut State) {
        st.persisted = st.claims.values().cloned().collect();
        if let Some(path) = &self.state_file
            && let Err(e) = write_state_file(path, &st.persisted)
        {
            warn!(path = %path.display(), error = %e, "sandboxd-sim: persisting claims failed");
        }
    }

    /// A simulated restart: rebuild the claims from what was persisted,
    /// silently dropping `drop_ids` (as reconcile drops claims whose VM is
    /// gone), and reset the pools to their configuration. Returns the ids
    /// that survived.
    pub fn restart(self: &Arc<Self>, drop_ids: &[String]) -> Result<Vec<String>, SimError> {
        let mut st = self.lock();
        let source = match &self.state_file {
            Some(path) => read_state_file(path)?,
            None => st.persisted.clone(),
        };
        st.claims = source
            .into_iter()
            .filter(|c| !drop_ids.contains(&c.id))
            .map(|c| (c.id.clone(), c))
            .collect();
        for id in drop_ids {
            self.guests.destroy(id);
        }
        st.pools = pools_from(&st.cfg).map_err(SimError::Config)?;
        self.persist(&mut st);
        self.refill_all(&mut st);
        info!(dropped = ?drop_ids, "sandboxd-sim: restarted");
        Ok(st.claims.keys().cloned().collect())
    }
}
