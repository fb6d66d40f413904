//! The desired NodeInventory, built from sandboxd's listing and info plus
//! this node's claims (docs/architecture.md, "NodeInventory publisher"). Pure.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::claims::Claim;
use crate::sandboxd::{NodeInfo, SandboxRow, SandboxState};

use super::types::{InventoryEntry, InventoryPool, NodeInventory};

/// The object to apply for `node`. Entries come from the listing (not the
/// claims table); `addr` is filled from a claim of this node with the same
/// sandboxd id, in any state. Entries are sorted by name, pools by key.
pub fn desired(
    node: &str,
    address: &str,
    listing: &[SandboxRow],
    info: &NodeInfo,
    claims: &[Claim],
) -> NodeInventory {
    let addr_by_id: HashMap<&str, &str> = claims
        .iter()
        .map(|c| (c.id.as_str(), c.address.as_str()))
        .collect();
    let mut entries: Vec<InventoryEntry> = listing
        .iter()
        .map(|row| {
            // vk-sandbox's tag on its own claim_refs is dropped: readers of
            // the inventory match entries to `<namespace>/<name>`.
            let name = if row.claim_ref.is_empty() {
                row.id.clone()
            } else {
                crate::pods::claim_ref::display(&row.claim_ref).to_string()
            };
            let phase = match row.state() {
                SandboxState::Running => "Running",
                SandboxState::Hibernated => "Hibernated",
                SandboxState::Archived => "Archived",
            };
            InventoryEntry {
                claim_ref: name.clone(),
                name,
                phase: phase.to_string(),
                id: row.id.clone(),
                addr: addr_by_id
                    .get(row.id.as_str())
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
                deadline: row.deadline.expires_at().map(|t| t.to_string()),
            }
        })
        .collect();
    let tagged: HashSet<&str> = listing
        .iter()
        .filter(|r| crate::pods::claim_ref::parse(&r.claim_ref).ours.is_some())
        .map(|r| r.id.as_str())
        .collect();
    name_collisions(&mut entries, &tagged);
    // Names are unique now; should an id equal another row's name, the
    // map-list apply would fail on the duplicate: the id breaks the tie so
    // the order is stable, and the first is kept.
    entries.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.id.cmp(&b.id)));
    entries.dedup_by(|later, first| later.name == first.name);

    let mut pools: Vec<InventoryPool> = info
        .pools
        .iter()
        .map(|p| InventoryPool {
            template: p.key.template.clone(),
            warm: i64::try_from(p.warm).unwrap_or(i64::MAX),
            target: i64::try_from(p.target).unwrap_or(i64::MAX),
            net: p.key.net.clone(),
            size: p.key.size.clone(),
            engine: p.key.engine.clone(),
        })
        .collect();
    pools.sort_by(|a, b| {
        (&a.template, &a.net, &a.size, &a.engine).cmp(&(&b.template, &b.net, &b.size, &b.engine))
    });
    pools.dedup_by(|later, first| {
        (&later.template, &later.net, &later.size, &later.engine)
            == (&first.template, &first.net, &first.size, &first.engine)
    });

    NodeInventory {
        metadata: Default::default(),
        node: node.to_string(),
        address: address.to_string(),
        entries,
        pools,
    }
}

/// Rows that show the same name (a neighbour's `ns/x` and this node's Pod
/// `ns/x`, whose tag the name drops; two rows of one key) are all shown:
/// one keeps the name — a row without vk-sandbox's tag first (the
/// neighbour's, which its readers look up by that name), then the lowest
/// id — and the others are named by their sandboxd id, keeping the name in
/// `claimRef`. Merging them hid a VM from the aggregated API, and could
/// leave the Pod's VM under the name a neighbour deletes by. `tagged`: ids
/// of rows carrying vk-sandbox's tag.
fn name_collisions(entries: &mut [InventoryEntry], tagged: &HashSet<&str>) {
    let mut by_name: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        by_name.entry(e.name.clone()).or_default().push(i);
    }
    for mut group in by_name.into_values().filter(|g| g.len() > 1) {
        group.sort_by(|&a, &b| {
            let key = |i: usize| {
                (
                    tagged.contains(entries[i].id.as_str()),
                    entries[i].id.clone(),
                )
            };
            key(a).cmp(&key(b))
        });
        for &i in &group[1..] {
            entries[i].name = entries[i].id.clone();
        }
    }
}

/// Why a tick applies or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyDecision {
    /// Nothing applied yet in this process.
    First,
    /// The desired object differs from the last one applied.
    Changed,
    /// Unchanged, but the last apply is older than the resync period.
    Resync,
    /// Unchanged and recent: nothing to do.
    Unchanged,
}

impl ApplyDecision {
    pub fn applies(self) -> bool {
        self != ApplyDecision::Unchanged
    }
}

/// The last successful apply.
#[derive(Debug, Clone)]
pub struct Applied {
    pub object: NodeInventory,
    pub at: Instant,
}

/// Decide whether `want` must be applied, given the last successful apply.
pub fn decide(
    last: Option<&Applied>,
    want: &NodeInventory,
    now: Instant,
    resync: Duration,
) -> ApplyDecision {
    match last {
        None => ApplyDecision::First,
        Some(l) if l.object != *want => ApplyDecision::Changed,
        Some(l) if now.saturating_duration_since(l.at) >= resync => ApplyDecision::Resync,
        Some(_) => ApplyDecision::Unchanged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandboxd::{Deadline, PoolInfo, PoolKey};

    fn row(id: &str, claim_ref: &str) -> SandboxRow {
        SandboxRow::for_test(id, claim_ref)
    }

    fn claim(id: &str, address: &str) -> Claim {
        Claim {
            id: id.into(),
            token: crate::sandboxd::Token::new("tok"),
            address: address.into(),
            pod_uid: "uid".into(),
            claimed_at: jiff::Timestamp::UNIX_EPOCH,
            deadline: None,
            lifecycle: Default::default(),
        }
    }

    fn info(pools: Vec<PoolInfo>) -> NodeInfo {
        serde_json::from_value(serde_json::json!({"pools": []}))
            .map(|mut i: NodeInfo| {
                i.pools = pools;
                i
            })
            .unwrap()
    }

    fn pool(template: &str, net: &str, engine: &str, warm: u64) -> PoolInfo {
        PoolInfo {
            key: PoolKey {
                template: template.into(),
                net: net.into(),
                size: "small".into(),
                engine: engine.into(),
            },
            warm,
            refilling: 0,
            target: 4,
            golden: true,
        }
    }

    /// vk-sandbox's own claim_refs carry a tag (the Pod UID); entries show
    /// the Pod key, as for rows written without it.
    #[test]
    fn tagged_claim_refs_show_the_pod_key() {
        let listing = vec![row("sb_a", "ns1/a#vk-sandbox:u-1"), row("sb_c", "ns1/c")];
        let inv = desired("vk-1", "", &listing, &info(vec![]), &[]);
        let names: Vec<(&str, &str)> = inv
            .entries
            .iter()
            .map(|e| (e.name.as_str(), e.claim_ref.as_str()))
            .collect();
        assert_eq!(names, vec![("ns1/a", "ns1/a"), ("ns1/c", "ns1/c")]);
    }

    #[test]
    fn entries_and_pools_from_listing_info_and_claims() {
        let mut hib = row("sb_b", "");
        hib.hibernated = true;
        let listing = vec![hib, row("sb_a", "ns1/a")];
        let inv = desired(
            "vk-1",
            "127.0.0.1:7777",
            &listing,
            &info(vec![pool("base:24.04", "none", "", 3)]),
            &[claim("sb_a", "10.0.0.5")],
        );
        let v = serde_json::to_value(&inv).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "metadata": {},
                "node": "vk-1",
                "address": "127.0.0.1:7777",
                "entries": [
                    {"name": "ns1/a", "phase": "Running", "id": "sb_a", "claimRef": "ns1/a", "addr": "10.0.0.5"},
                    {"name": "sb_b", "phase": "Hibernated", "id": "sb_b", "claimRef": "sb_b"},
                ],
                "pools": [{"template": "base:24.04", "warm": 3, "target": 4, "net": "none", "size": "small"}],
            })
        );
    }

    #[test]
    fn archived_deadline_and_engine_are_carried() {
        let mut a = row("sb_c", "ns/c");
        a.archived = true;
        a.hibernated = true;
        a.deadline = Deadline::parse(Some("2026-12-01T10:00:00.5+02:00"));
        let inv = desired(
            "n",
            "h:7777",
            &[a],
            &info(vec![
                pool("rt", "egress", "ch", 1),
                pool("base", "none", "", 0),
            ]),
            &[],
        );
        assert_eq!(inv.entries[0].phase, "Archived");
        assert_eq!(inv.entries[0].addr, "");
        assert_eq!(
            inv.entries[0].deadline.as_deref(),
            Some("2026-12-01T08:00:00.5Z")
        );
        assert_eq!(inv.pools[0].template, "base");
        assert_eq!(inv.pools[1].engine, "ch");
    }

    #[test]
    fn empty_listing_and_pools_are_omitted() {
        let inv = desired("n", "h:1", &[], &info(vec![]), &[claim("x", "1.2.3.4")]);
        let v = serde_json::to_value(&inv).unwrap();
        assert!(v.get("entries").is_none() && v.get("pools").is_none());
    }

    /// Two untagged rows of one key (a lost reply and its retry in the Go
    /// build): both shown, the lowest id under the key.
    #[test]
    fn duplicate_names_are_all_shown() {
        let inv = desired(
            "n",
            "h:1",
            &[row("sb_2", "ns/a"), row("sb_1", "ns/a")],
            &info(vec![]),
            &[],
        );
        let got: Vec<(&str, &str, &str)> = inv
            .entries
            .iter()
            .map(|e| (e.name.as_str(), e.id.as_str(), e.claim_ref.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![("ns/a", "sb_1", "ns/a"), ("sb_2", "sb_2", "ns/a")]
        );
    }

    /// A neighbour's `ns/x` and this node's Pod `ns/x` (tagged) are both
    /// shown: the neighbour's under the name its readers look it up by,
    /// the Pod's under its sandboxd id — whatever the ids' order.
    #[test]
    fn a_neighbours_row_and_ours_under_one_name_are_both_shown() {
        for (ours, theirs) in [("sb_1", "sb_2"), ("sb_2", "sb_1")] {
            let inv = desired(
                "n",
                "h:1",
                &[row(ours, "ns/x#vk-sandbox:u-1"), row(theirs, "ns/x")],
                &info(vec![]),
                &[claim(ours, "10.0.0.5")],
            );
            let got: Vec<(&str, &str, &str, &str)> = inv
                .entries
                .iter()
                .map(|e| {
                    (
                        e.name.as_str(),
                        e.id.as_str(),
                        e.claim_ref.as_str(),
                        e.addr.as_str(),
                    )
                })
                .collect();
            let mut want = vec![
                ("ns/x", theirs, "ns/x", ""),
                (ours, ours, "ns/x", "10.0.0.5"),
            ];
            want.sort();
            assert_eq!(got, want, "ours {ours}, theirs {theirs}");
        }
    }

    #[test]
    fn apply_only_when_changed_or_resync_is_due() {
        let t0 = Instant::now();
        let resync = Duration::from_secs(600);
        let a = desired("n", "h:1", &[row("sb_a", "")], &info(vec![]), &[]);
        assert_eq!(decide(None, &a, t0, resync), ApplyDecision::First);
        let last = Applied {
            object: a.clone(),
            at: t0,
        };
        assert_eq!(
            decide(Some(&last), &a, t0 + Duration::from_secs(599), resync),
            ApplyDecision::Unchanged
        );
        assert!(!ApplyDecision::Unchanged.applies());
        assert_eq!(
            decide(Some(&last), &a, t0 + resync, resync),
            ApplyDecision::Resync
        );
        let b = desired("n", "h:1", &[row("sb_b", "")], &info(vec![]), &[]);
        assert_eq!(decide(Some(&last), &b, t0, resync), ApplyDecision::Changed);
    }
}
