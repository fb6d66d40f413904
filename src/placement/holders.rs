//! Which node holds which key's VM, as the NodeInventories say
//! (docs/placement.md, "Where a VM is"). Pure: the watch in
//! [`super::watch`] feeds it one inventory at a time.
//!
//! Only entries this node's vk-sandbox holds count: the publisher fills
//! `addr` from a claim of its own, so an entry with an address is a VM
//! vk-sandbox claimed for the Pod key in `claimRef`. A row of another
//! sandboxd client (no address) under the same `<namespace>/<name>` is
//! not a VM a Pod of that name adopts.

use std::collections::{BTreeMap, BTreeSet};

use crate::inventory::types::InventoryEntry;

/// key (`<namespace>/<name>`) → the nodes holding a VM for it, and each
/// node's keys (to replace a node's entries when its inventory changes).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Holders {
    by_key: BTreeMap<String, BTreeSet<String>>,
    by_node: BTreeMap<String, BTreeSet<String>>,
}

/// The keys an inventory's entries hold VMs for.
pub fn held_keys(entries: &[InventoryEntry]) -> BTreeSet<String> {
    entries
        .iter()
        .filter(|e| !e.addr.is_empty())
        .map(|e| {
            if e.claim_ref.is_empty() {
                e.name.clone()
            } else {
                e.claim_ref.clone()
            }
        })
        .filter(|k| k.contains('/'))
        .collect()
}

impl Holders {
    /// `node`'s inventory is now `entries` (its earlier entries are
    /// forgotten).
    pub fn set_node(&mut self, node: &str, entries: &[InventoryEntry]) {
        self.remove_node(node);
        let keys = held_keys(entries);
        for key in &keys {
            self.by_key
                .entry(key.clone())
                .or_default()
                .insert(node.to_string());
        }
        if !keys.is_empty() {
            self.by_node.insert(node.to_string(), keys);
        }
    }

    /// `node`'s inventory is gone.
    pub fn remove_node(&mut self, node: &str) {
        let Some(keys) = self.by_node.remove(node) else {
            return;
        };
        for key in keys {
            if let Some(nodes) = self.by_key.get_mut(&key) {
                nodes.remove(node);
                if nodes.is_empty() {
                    self.by_key.remove(&key);
                }
            }
        }
    }

    /// The nodes holding a VM for `key`, sorted; empty when none does.
    pub fn of(&self, key: &str) -> Vec<String> {
        self.by_key
            .get(key)
            .map(|nodes| nodes.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// How many keys have a VM somewhere.
    pub fn keys(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, claim_ref: &str, addr: &str) -> InventoryEntry {
        InventoryEntry {
            name: name.into(),
            phase: "Running".into(),
            id: format!("id-{name}"),
            claim_ref: claim_ref.into(),
            addr: addr.into(),
            deadline: None,
        }
    }

    #[test]
    fn only_entries_with_an_address_count_and_the_claim_ref_names_the_key() {
        let entries = [
            entry("ns/a", "ns/a", "10.0.0.2"),
            // A neighbour's row (no address): not a VM vk-sandbox holds.
            entry("ns/b", "ns/b", ""),
            // Renamed by its id after a name collision; claimRef keeps the key.
            entry("sbx-123", "ns/c", "10.0.0.3"),
            // No claim reference: named by its id, no key.
            entry("sbx-9", "", "10.0.0.9"),
        ];
        let keys: Vec<String> = held_keys(&entries).into_iter().collect();
        assert_eq!(keys, vec!["ns/a".to_string(), "ns/c".to_string()]);
    }

    #[test]
    fn a_node_replaced_or_removed_leaves_the_other_nodes_alone() {
        let mut h = Holders::default();
        h.set_node(
            "n1",
            &[entry("ns/a", "ns/a", "x"), entry("ns/b", "ns/b", "x")],
        );
        h.set_node("n2", &[entry("ns/a", "ns/a", "x")]);
        assert_eq!(h.of("ns/a"), vec!["n1".to_string(), "n2".to_string()]);
        assert_eq!(h.of("ns/b"), vec!["n1".to_string()]);
        assert_eq!(h.keys(), 2);

        // n1 released ns/a: its new inventory replaces the old one.
        h.set_node("n1", &[entry("ns/b", "ns/b", "x")]);
        assert_eq!(h.of("ns/a"), vec!["n2".to_string()]);

        h.remove_node("n2");
        assert!(h.of("ns/a").is_empty());
        assert_eq!(h.of("ns/b"), vec!["n1".to_string()]);
        assert_eq!(h.keys(), 1);

        h.set_node("n1", &[]);
        assert_eq!(h, Holders::default());
        // Removing an unknown node changes nothing.
        h.remove_node("n9");
        assert_eq!(h, Holders::default());
    }
}
