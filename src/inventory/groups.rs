//! Where the NodeInventory is published: the API group(s) whose
//! `nodeinventories` CRD the cluster serves.
//!
//! Two groups are in use. `sandbox.cocoonstack.io` is the one the
//! installation document names (and the default of the product's
//! decision), `extensions.agents.x-k8s.io` the one sandbox-operator builds
//! read (hard-coded there) and the Go vk-sandbox wrote. Publishing into one
//! the cluster does not serve failed every apply; publishing into the one
//! nobody reads left the object in the other group stale for ever. So,
//! unless `--inventory-group` names one, the object goes into every known
//! group the cluster serves, and an object named after this node in a known
//! group it no longer publishes to is reported as stale (log, metric,
//! preflight line).

use kube::Client;

use super::types::{DEFAULT_GROUP, EXTENSIONS_GROUP, PLURAL, VERSION};

/// The groups looked for, in order of preference.
pub const KNOWN: [&str; 2] = [DEFAULT_GROUP, EXTENSIONS_GROUP];

/// Why the object goes where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// `--inventory-group` (env `VK_INVENTORY_GROUP`) names the group.
    Flag,
    /// Discovered: the known groups the cluster serves `nodeinventories`
    /// in.
    Served,
}

/// The groups to publish in, and the other known groups to look for a
/// stale object in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub publish: Vec<String>,
    pub why: Why,
    /// Known groups served but not published to: an object named after
    /// this node there is left over (from the Go build, or an earlier
    /// `--inventory-group`) and nobody updates it any more.
    pub stale_candidates: Vec<String>,
}

impl Choice {
    /// Nothing to publish in: no flag, and no known group served.
    pub fn is_empty(&self) -> bool {
        self.publish.is_empty()
    }

    /// One line for logs and preflight.
    pub fn describe(&self) -> String {
        let list = |gs: &[String]| {
            gs.iter()
                .map(|g| format!("{PLURAL}.{g}"))
                .collect::<Vec<_>>()
                .join(" and ")
        };
        match self.why {
            Why::Flag => format!("{} (--inventory-group)", list(&self.publish)),
            Why::Served if self.publish.is_empty() => format!(
                "nowhere: the cluster serves {PLURAL} in neither {} nor {}",
                KNOWN[0], KNOWN[1]
            ),
            Why::Served => format!(
                "{} (the CRDs served; no --inventory-group)",
                list(&self.publish)
            ),
        }
    }
}

/// Where to publish, from `--inventory-group` (`None`: discover) and the
/// known groups the cluster serves `nodeinventories` v1beta1 in. Pure.
pub fn choose(flag: Option<&str>, served: &[String]) -> Choice {
    let served_known = || {
        KNOWN
            .iter()
            .filter(|g| served.iter().any(|s| s == *g))
            .map(|g| g.to_string())
    };
    match flag {
        Some(group) => Choice {
            publish: vec![group.to_string()],
            why: Why::Flag,
            stale_candidates: served_known().filter(|g| g != group).collect(),
        },
        None => Choice {
            publish: served_known().collect(),
            why: Why::Served,
            stale_candidates: Vec::new(),
        },
    }
}

/// The versions in which `group` serves `nodeinventories` (API discovery:
/// readable by any authenticated user, unlike the CRD object itself); empty
/// when the group is not served at all.
pub async fn served_versions(client: &Client, group: &str) -> kube::Result<Vec<String>> {
    let g = match kube::discovery::oneshot::group(client, group).await {
        Ok(g) => g,
        Err(kube::Error::Discovery(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(g.versions()
        .filter(|v| {
            g.versioned_resources(v)
                .iter()
                .any(|(ar, _)| ar.plural == PLURAL)
        })
        .map(str::to_string)
        .collect())
}

/// The known groups that serve `nodeinventories` in the version vk-sandbox
/// writes.
pub async fn served_known(client: &Client) -> kube::Result<Vec<String>> {
    let mut served = Vec::new();
    for group in KNOWN {
        if served_versions(client, group)
            .await?
            .iter()
            .any(|v| v == VERSION)
        {
            served.push(group.to_string());
        }
    }
    Ok(served)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(gs: &[&str]) -> Vec<String> {
        gs.iter().map(|g| g.to_string()).collect()
    }

    #[test]
    fn without_the_flag_every_served_known_group_is_published_to() {
        let only_ext = choose(None, &served(&[EXTENSIONS_GROUP]));
        assert_eq!(only_ext.publish, served(&[EXTENSIONS_GROUP]));
        assert_eq!(only_ext.why, Why::Served);
        assert!(only_ext.stale_candidates.is_empty());

        let only_default = choose(None, &served(&[DEFAULT_GROUP, "other.example"]));
        assert_eq!(only_default.publish, served(&[DEFAULT_GROUP]));

        // Both: both, the installation document's group first.
        let both = choose(None, &served(&[EXTENSIONS_GROUP, DEFAULT_GROUP]));
        assert_eq!(both.publish, served(&[DEFAULT_GROUP, EXTENSIONS_GROUP]));
        assert!(both.stale_candidates.is_empty());

        let none = choose(None, &served(&["other.example"]));
        assert!(none.is_empty());
        assert!(none.describe().contains("neither"), "{}", none.describe());
    }

    #[test]
    fn the_flag_wins_and_the_other_served_groups_are_checked_for_leftovers() {
        let c = choose(
            Some(DEFAULT_GROUP),
            &served(&[DEFAULT_GROUP, EXTENSIONS_GROUP]),
        );
        assert_eq!(c.publish, served(&[DEFAULT_GROUP]));
        assert_eq!(c.why, Why::Flag);
        assert_eq!(c.stale_candidates, served(&[EXTENSIONS_GROUP]));
        assert!(
            c.describe().contains("--inventory-group"),
            "{}",
            c.describe()
        );

        // A group of its own, even unserved (the apply then says so).
        let c = choose(Some("g.example"), &served(&[EXTENSIONS_GROUP]));
        assert_eq!(c.publish, served(&["g.example"]));
        assert_eq!(c.stale_candidates, served(&[EXTENSIONS_GROUP]));
        let c = choose(Some("g.example"), &[]);
        assert!(c.stale_candidates.is_empty() && !c.is_empty());
    }
}
