//! The orphan audit scan: compare sandboxd's listing with the claims table
//! and report what does not match. Report only: the scan never releases,
//! destroys or drops anything (stray returns are decided by the claim path,
//! not here).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::health::Health;
use crate::periodic::{Beat, First, Next, Periodic, Turn};

use crate::claims::{Claim, ClaimsStore};
use crate::metrics::Metrics;
use crate::sandboxd::{SandboxRow, SandboxdClient};

/// What the scan thinks of one sandbox id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Listed, not held, no `claim_ref`: possibly leaked.
    Orphan,
    /// Listed, not held, with a `claim_ref`: claimed outside this provider
    /// (e.g. by the aggregated apiserver). Not an orphan.
    External { claim_ref: String },
    /// Listed, not held, with a `claim_ref` tagged as this node's: a claim
    /// whose reply was lost. The claim path returns it before it claims for
    /// the same Pod again, or when that Pod goes away without having run;
    /// otherwise it ends at its deadline.
    Stray { key: String },
    /// Held by the claim of `key` but not listed: reaped at its TTL or
    /// released by someone else.
    Stale { key: String },
}

impl Verdict {
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Orphan => "orphan",
            Verdict::External { .. } => "external",
            Verdict::Stray { .. } => "stray",
            Verdict::Stale { .. } => "stale",
        }
    }
}

/// Verdicts by sandbox id, for one listing and the whole claims table (all
/// states). Ids that match a claim have no verdict.
pub fn audit(listing: &[SandboxRow], claims: &[(String, Claim)]) -> BTreeMap<String, Verdict> {
    let held: HashMap<&str, &str> = claims
        .iter()
        .map(|(key, c)| (c.id.as_str(), key.as_str()))
        .collect();
    let mut verdicts = BTreeMap::new();
    for row in listing {
        if held.contains_key(row.id.as_str()) {
            continue;
        }
        let tag = crate::pods::claim_ref::parse(&row.claim_ref);
        let v = if row.claim_ref.is_empty() {
            Verdict::Orphan
        } else if tag.ours.is_some() {
            Verdict::Stray {
                key: tag.key.to_string(),
            }
        } else {
            Verdict::External {
                claim_ref: row.claim_ref.clone(),
            }
        };
        verdicts.insert(row.id.clone(), v);
    }
    let listed: std::collections::HashSet<&str> = listing.iter().map(|r| r.id.as_str()).collect();
    for (key, c) in claims {
        if !listed.contains(c.id.as_str()) {
            verdicts.insert(c.id.clone(), Verdict::Stale { key: key.clone() });
        }
    }
    verdicts
}

/// Verdicts to log: those that differ from the previous successful cycle
/// (first sight counts).
pub fn changed<'a>(
    previous: &BTreeMap<String, Verdict>,
    now: &'a BTreeMap<String, Verdict>,
) -> Vec<(&'a str, &'a Verdict)> {
    now.iter()
        .filter(|(id, v)| previous.get(*id) != Some(*v))
        .map(|(id, v)| (id.as_str(), v))
        .collect()
}

/// Counts per verdict label (every label present, zero included).
pub fn counts(verdicts: &BTreeMap<String, Verdict>) -> BTreeMap<&'static str, i64> {
    let mut out = BTreeMap::from([("orphan", 0), ("external", 0), ("stray", 0), ("stale", 0)]);
    for v in verdicts.values() {
        *out.entry(v.label()).or_default() += 1;
    }
    out
}

/// The scanner: remembers the previous successful cycle's verdicts.
pub struct Scanner {
    sandboxd: SandboxdClient,
    claims: Arc<ClaimsStore>,
    metrics: Arc<Metrics>,
    previous: BTreeMap<String, Verdict>,
}

/// What one cycle did.
#[derive(Debug, PartialEq, Eq)]
pub enum ScanOutcome {
    /// The listing failed: nothing changed.
    Skipped,
    /// Verdicts computed; the ones newly logged.
    Scanned { verdicts: usize, logged: usize },
}

impl Scanner {
    pub fn new(
        sandboxd: SandboxdClient,
        claims: Arc<ClaimsStore>,
        metrics: Arc<Metrics>,
    ) -> Scanner {
        Scanner {
            sandboxd,
            claims,
            metrics,
            previous: BTreeMap::new(),
        }
    }

    /// One cycle.
    pub async fn scan(&mut self) -> ScanOutcome {
        // The table is read before listing: a claim made meanwhile shows as
        // `external` for one cycle rather than as a false `stale`.
        let claims: Vec<(String, Claim)> = self
            .claims
            .all()
            .into_iter()
            .map(|(key, claim, _)| (key, claim))
            .collect();
        let listing = match self.sandboxd.list().await {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e, "skipping orphan scan this cycle (failed query is not an empty list)");
                self.metrics.orphan_scan_skipped();
                return ScanOutcome::Skipped;
            }
        };
        let verdicts = audit(&listing, &claims);
        let fresh = changed(&self.previous, &verdicts);
        for (id, v) in &fresh {
            match v {
                Verdict::Orphan => warn!(
                    sandbox = %id,
                    "possible orphan sandbox: listed by sandboxd with no claim_ref and held by no claim; audit-only, retaining"
                ),
                Verdict::External { claim_ref } => info!(
                    sandbox = %id,
                    claim_ref = %claim_ref,
                    "sandbox claimed outside this provider (not an orphan); audit-only"
                ),
                Verdict::Stray { key } => warn!(
                    sandbox = %id,
                    pod = %key,
                    "stray sandbox: claimed by this node for a Pod, but its claim reply was lost; \
                     returned before that Pod claims again or when it goes away, else it ends at \
                     its deadline; audit-only"
                ),
                Verdict::Stale { key } => warn!(
                    sandbox = %id,
                    pod = %key,
                    "stale claim: sandboxd no longer lists this sandbox (reaped at its TTL or released elsewhere); audit-only"
                ),
            }
        }
        for id in self
            .previous
            .keys()
            .filter(|id| !verdicts.contains_key(*id))
        {
            info!(sandbox = %id, "orphan audit: sandbox back in agreement with the claims table");
        }
        self.metrics.orphan_scanned(counts(&verdicts));
        let outcome = ScanOutcome::Scanned {
            verdicts: verdicts.len(),
            logged: fresh.len(),
        };
        self.previous = verdicts;
        outcome
    }

    /// Scan every `interval`, the first time after one interval, until
    /// `stop` is cancelled.
    pub async fn run(self, interval: Duration, health: Arc<Health>, stop: CancellationToken) {
        Periodic::new("orphan audit", interval)
            .first(First::AfterPeriod)
            .run(Some(&health), &stop, self)
            .await
    }
}

impl Turn for Scanner {
    async fn turn(&mut self, _: &Beat) -> Next {
        self.scan().await;
        Next::Period
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, claim_ref: &str) -> SandboxRow {
        SandboxRow::for_test(id, claim_ref)
    }

    fn held(key: &str, id: &str) -> (String, Claim) {
        (
            key.into(),
            Claim {
                id: id.into(),
                token: crate::sandboxd::Token::new("t"),
                address: String::new(),
                pod_uid: String::new(),
                claimed_at: jiff::Timestamp::UNIX_EPOCH,
                deadline: None,
                lifecycle: Default::default(),
            },
        )
    }

    #[test]
    fn verdicts_follow_the_table() {
        let listing = vec![
            row("sb_held", "ns/a"),
            row("sb_ext", "other/x"),
            row("sb_orph", ""),
            row("sb_lost", "ns/b#vk-sandbox:u-1"),
        ];
        let claims = vec![held("ns/a", "sb_held"), held("ns/gone", "sb_reaped")];
        let v = audit(&listing, &claims);
        assert_eq!(v.len(), 4);
        assert!(!v.contains_key("sb_held"));
        assert_eq!(v["sb_lost"], Verdict::Stray { key: "ns/b".into() });
        assert_eq!(v["sb_orph"], Verdict::Orphan);
        assert_eq!(
            v["sb_ext"],
            Verdict::External {
                claim_ref: "other/x".into()
            }
        );
        assert_eq!(
            v["sb_reaped"],
            Verdict::Stale {
                key: "ns/gone".into()
            }
        );
        assert_eq!(
            counts(&v),
            BTreeMap::from([("orphan", 1), ("external", 1), ("stray", 1), ("stale", 1)])
        );
    }

    #[test]
    fn only_changed_verdicts_are_logged() {
        let first = audit(&[row("sb_o", "")], &[]);
        assert_eq!(changed(&BTreeMap::new(), &first).len(), 1);
        assert!(changed(&first, &first).is_empty());
        // The same id now carries a claim_ref: a different verdict.
        let second = audit(&[row("sb_o", "ns/p")], &[]);
        assert_eq!(changed(&first, &second).len(), 1);
        assert!(changed(&second, &BTreeMap::new()).is_empty());
    }
}
