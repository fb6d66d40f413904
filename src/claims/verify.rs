//! The start-up verification: the rows loaded from disk judged against
//! the first sandboxd listing (quarantine lifted, or the row dropped).

use std::collections::HashMap;

use tracing::info;

use super::{ClaimState, ClaimsStore, VerifyReport, format};
use crate::error::Result;
use crate::sandboxd::SandboxRow;

impl ClaimsStore {
    /// Verification against one *successful* sandboxd
    /// listing. `snapshot` is what [`ClaimsStore::quarantined`] returned
    /// before the list call. For each snapshotted key whose row still holds
    /// the same id: listed ⇒ quarantine lifted (→ settled) and, if the row
    /// has no deadline, the listed one taken; not listed and not tentative ⇒
    /// row dropped. Rows removed or replaced since the snapshot are never
    /// judged, and nothing is resurrected.
    ///
    /// The in-memory effects are applied before the changes are persisted;
    /// `Err` means only that persisting them failed (log it; memory still holds them).
    pub async fn apply_verification(
        &self,
        snapshot: &[(String, String)],
        listing: &[SandboxRow],
    ) -> Result<VerifyReport> {
        let listed: HashMap<&str, &SandboxRow> =
            listing.iter().map(|r| (r.id.as_str(), r)).collect();
        let report = self
            .persist(|table| {
                let mut report = VerifyReport::default();
                let mut dirty = Vec::new();
                for (key, id) in snapshot {
                    let Some(e) = table.rows.get_mut(key).filter(|e| e.claim.id == *id) else {
                        report.unjudged += 1;
                        continue;
                    };
                    if let Some(row) = listed.get(id.as_str()) {
                        if e.state == ClaimState::Quarantined {
                            e.state = ClaimState::Settled;
                            report.lifted.push(key.clone());
                        }
                        if e.claim.deadline.is_none()
                            && let Some(d) = row.deadline.expires_at()
                        {
                            e.claim.deadline = format::to_file_deadline(d);
                            report.deadlines_taken.push(key.clone());
                            dirty.push(key.clone());
                        }
                    } else if e.state == ClaimState::Tentative {
                        report.kept_tentative += 1;
                    } else {
                        table.rows.remove(key);
                        report.dropped.push((key.clone(), id.clone()));
                        dirty.push(key.clone());
                    }
                }
                report.remaining_quarantined = table
                    .rows
                    .values()
                    .filter(|e| e.state == ClaimState::Quarantined)
                    .count();
                let write = (!dirty.is_empty()).then_some((dirty, None));
                (report, write)
            })
            .await?;
        if !report.lifted.is_empty() || !report.dropped.is_empty() {
            info!(
                lifted = report.lifted.len(),
                dropped = ?report.dropped,
                remaining_quarantined = report.remaining_quarantined,
                "claims verified against sandboxd"
            );
        }
        Ok(report)
    }
}
