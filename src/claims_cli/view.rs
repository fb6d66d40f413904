//! What `vk-sandbox claims` prints: aligned tables for people, JSON for
//! scripts (field names as in the Go `claims.json`: `podUID`, `claimedAt`).

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use serde_json::{Value, json};

use super::state::Daemon;
use crate::claims::Claim;
use crate::claims::StatePaths;
use crate::claims::format;
use crate::claims::read::StateView;
use crate::orphan::{self, Verdict};
use crate::sandboxd::SandboxRow;

/// Where a row's current value was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The snapshot (as of the last compaction).
    Snapshot,
    /// A journal record written since.
    Journal,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Snapshot => "snapshot",
            Source::Journal => "journal",
        }
    }
}

pub fn source(state: &StateView, key: &str) -> Source {
    if state.loaded.journal_keys.contains(key) {
        Source::Journal
    } else {
        Source::Snapshot
    }
}

fn time(ts: Option<Timestamp>) -> Option<String> {
    ts.map(|t| format::to_second(t).to_string())
}

fn claimed_at(c: &Claim) -> Option<String> {
    time((!format::is_unset(c.claimed_at)).then_some(c.claimed_at))
}

/// `active`, or `expired` once the deadline passed (sandboxd reaps a
/// sandbox at its deadline; the row stays until the daemon's verification
/// or a release drops it).
fn state_of(c: &Claim, now: Timestamp) -> &'static str {
    match c.deadline {
        Some(d) if d <= now => "expired",
        _ => "active",
    }
}

/// Columns padded to their widest cell, two spaces apart.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let last = row.len().saturating_sub(1);
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push('\n');
    }
    out
}

/// The release credential as the file holds it.
fn token(c: &Claim) -> Option<String> {
    c.token.as_ref().map(|t| t.expose().to_string())
}

fn dash(s: Option<String>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or_else(|| "-".into())
}

pub fn list_table(state: &StateView, now: Timestamp, show_tokens: bool) -> String {
    if state.loaded.rows.is_empty() {
        return "no claims\n".into();
    }
    let mut headers = vec![
        "KEY",
        "SANDBOX",
        "POD UID",
        "CLAIMED AT",
        "DEADLINE",
        "STATE",
    ];
    if show_tokens {
        headers.push("TOKEN");
    }
    let rows: Vec<Vec<String>> = state
        .loaded
        .rows
        .iter()
        .map(|(key, c)| {
            let mut row = vec![
                key.clone(),
                dash(Some(c.id.clone())),
                dash(Some(c.pod_uid.clone())),
                dash(claimed_at(c)),
                dash(time(c.deadline)),
                state_of(c, now).to_string(),
            ];
            if show_tokens {
                row.push(dash(token(c)));
            }
            row
        })
        .collect();
    table(&headers, &rows)
}

pub fn claim_json(
    key: &str,
    c: &Claim,
    source: Source,
    now: Timestamp,
    show_tokens: bool,
) -> Value {
    let mut v = json!({
        "key": key,
        "id": c.id,
        "podUID": c.pod_uid,
        "address": c.address,
        "claimedAt": claimed_at(c),
        "deadline": time(c.deadline),
        "state": state_of(c, now),
        "source": source.as_str(),
    });
    if show_tokens {
        v["token"] = json!(token(c).unwrap_or_default());
    }
    v
}

fn daemon_json(daemon: &Daemon) -> Value {
    match daemon {
        Daemon::Running { pid } => json!({"running": true, "pid": pid}),
        Daemon::NotRunning => json!({"running": false}),
        Daemon::NoLockFile => json!({"running": null, "lockFile": false}),
        Daemon::Unknown(why) => json!({"running": null, "problem": why}),
    }
}

fn torn_tail_bytes(state: &StateView) -> usize {
    state.loaded.torn_tails.iter().map(|(_, b)| b).sum()
}

pub fn list_json(
    paths: &StatePaths,
    daemon: &Daemon,
    state: &StateView,
    now: Timestamp,
    show_tokens: bool,
) -> Value {
    let claims: Vec<Value> = state
        .loaded
        .rows
        .iter()
        .map(|(k, c)| claim_json(k, c, source(state, k), now, show_tokens))
        .collect();
    json!({
        "statePath": paths.snapshot.display().to_string(),
        "daemon": daemon_json(daemon),
        "snapshotFound": state.snapshot_found,
        "journalRecords": state.loaded.frames,
        "tornTailBytes": torn_tail_bytes(state),
        "claims": claims,
    })
}

pub fn show_text(
    key: &str,
    c: &Claim,
    source: Source,
    now: Timestamp,
    show_tokens: bool,
) -> String {
    let token = if show_tokens {
        dash(token(c))
    } else if c.token.is_none() {
        "(empty)".into()
    } else {
        "(hidden; --show-tokens shows it)".into()
    };
    let fields = [
        ("key", key.to_string()),
        ("sandbox", dash(Some(c.id.clone()))),
        ("pod UID", dash(Some(c.pod_uid.clone()))),
        ("address", dash(Some(c.address.clone()))),
        ("claimed at", dash(claimed_at(c))),
        (
            "deadline",
            time(c.deadline).unwrap_or_else(|| "none (no expiry)".into()),
        ),
        ("state", state_of(c, now).to_string()),
        (
            "source",
            match source {
                Source::Snapshot => "snapshot".to_string(),
                Source::Journal => "journal (changed since the last compaction)".to_string(),
            },
        ),
        ("token", token),
    ];
    fields
        .iter()
        .map(|(name, value)| format!("{:<12}{value}\n", format!("{name}:")))
        .collect()
}

/// The claims against one sandboxd listing.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verification {
    /// (key, id): held and listed.
    pub held_listed: Vec<(String, String)>,
    /// (key, id, expired): held, not listed.
    pub held_missing: Vec<(String, String, bool)>,
    /// (claim_ref, id): listed under a held key, not held.
    pub listed_not_held: Vec<(String, String)>,
    /// (id, claim_ref): listed, not held, under a key the state does not
    /// hold (claimed by another client, or a Pod key no longer held).
    pub external: Vec<(String, String)>,
    /// Listed with no claim_ref and held by nothing (possible orphans; the
    /// daemon's orphan audit reports these too).
    pub orphans: Vec<String>,
}

impl Verification {
    pub fn new(rows: &BTreeMap<String, Claim>, listing: &[SandboxRow]) -> Verification {
        let claims: Vec<(String, Claim)> =
            rows.iter().map(|(k, c)| (k.clone(), c.clone())).collect();
        let verdicts = orphan::audit(listing, &claims);
        let keys: BTreeSet<&str> = rows.keys().map(String::as_str).collect();
        let now = Timestamp::now();
        let mut v = Verification::default();
        for (key, c) in rows {
            match verdicts.get(&c.id) {
                Some(Verdict::Stale { .. }) => {
                    v.held_missing
                        .push((key.clone(), c.id.clone(), state_of(c, now) == "expired"))
                }
                _ => v.held_listed.push((key.clone(), c.id.clone())),
            }
        }
        for (id, verdict) in &verdicts {
            match verdict {
                Verdict::External { claim_ref } if keys.contains(claim_ref.as_str()) => {
                    v.listed_not_held.push((claim_ref.clone(), id.clone()))
                }
                Verdict::External { claim_ref } => v.external.push((id.clone(), claim_ref.clone())),
                // Tagged by this node for that Pod, credential never stored:
                // a lost claim reply (the daemon returns it before that Pod
                // claims again).
                Verdict::Stray { key } => v.listed_not_held.push((key.clone(), id.clone())),
                Verdict::Orphan => v.orphans.push(id.clone()),
                Verdict::Stale { .. } => {}
            }
        }
        v.listed_not_held.sort();
        v
    }

    /// No held claim missing, nothing listed under a held key and not held.
    pub fn consistent(&self) -> bool {
        self.held_missing.is_empty() && self.listed_not_held.is_empty()
    }

    pub fn text(&self) -> String {
        let mut rows: Vec<Vec<String>> = Vec::new();
        for (key, id) in &self.held_listed {
            rows.push(vec![key.clone(), id.clone(), "ok: held and listed".into()]);
        }
        for (key, id, expired) in &self.held_missing {
            rows.push(vec![
                key.clone(),
                id.clone(),
                if *expired {
                    "MISSING: held, not listed (its deadline passed: reaped)".into()
                } else {
                    "MISSING: held, not listed (released or destroyed by someone else?)".into()
                },
            ]);
        }
        for (key, id) in &self.listed_not_held {
            rows.push(vec![
                key.clone(),
                id.clone(),
                "NOT HELD: listed under this key, no credential in the state".into(),
            ]);
        }
        rows.sort();
        let mut out = if rows.is_empty() {
            "no claims held, none listed under a held key\n".to_string()
        } else {
            table(&["KEY", "SANDBOX", "VERDICT"], &rows)
        };
        out.push_str(&format!(
            "{}: {} held and listed, {} held and missing, {} listed and not held; sandboxd also \
             lists {} under other claim refs and {} possible orphans (no claim ref)\n",
            if self.consistent() {
                "consistent"
            } else {
                "INCONSISTENT"
            },
            self.held_listed.len(),
            self.held_missing.len(),
            self.listed_not_held.len(),
            self.external.len(),
            self.orphans.len()
        ));
        out
    }

    pub fn json(&self, paths: &StatePaths, daemon: &Daemon, sandboxd_url: &str) -> Value {
        let pairs = |v: &[(String, String)]| -> Vec<Value> {
            v.iter()
                .map(|(k, id)| json!({"key": k, "id": id}))
                .collect()
        };
        json!({
            "statePath": paths.snapshot.display().to_string(),
            "sandboxdUrl": sandboxd_url,
            "daemon": daemon_json(daemon),
            "consistent": self.consistent(),
            "heldListed": pairs(&self.held_listed),
            "heldMissing": self.held_missing.iter()
                .map(|(k, id, expired)| json!({"key": k, "id": id, "expired": expired}))
                .collect::<Vec<_>>(),
            "listedNotHeld": pairs(&self.listed_not_held),
            "external": self.external.iter()
                .map(|(id, r)| json!({"id": id, "claimRef": r}))
                .collect::<Vec<_>>(),
            "orphans": self.orphans,
        })
    }
}
