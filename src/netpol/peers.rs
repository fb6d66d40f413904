//! The Pods behind source addresses, known without watching every Pod of
//! the cluster (pure): which label-selected Pod watches the policies
//! selecting this node's Pods need ([`desired`]), and the address index
//! each watch fills ([`PeerIndex`]). The watches themselves are in
//! `watches`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use super::selector::{Labels, Selector};
use super::verdict::{Namespaces, Policy};

/// A peer whose namespace selector matches more namespaces than this is
/// watched cluster-wide (with its Pod selector) rather than one watch per
/// namespace.
pub const MAX_NAMESPACED_WATCHES: usize = 16;

/// One Pod watch, with the peer's Pod selector as its label selector.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PeerWatch {
    /// Pods of one namespace.
    Namespace { namespace: String, pods: Selector },
    /// Pods of every namespace.
    Cluster { pods: Selector },
}

impl PeerWatch {
    /// Whether every Pod `other` watches, this one watches too.
    fn covers(&self, other: &PeerWatch) -> bool {
        match (self, other) {
            (PeerWatch::Cluster { pods }, PeerWatch::Cluster { pods: o }) => {
                pods.is_empty() || pods == o
            }
            (PeerWatch::Cluster { pods }, PeerWatch::Namespace { pods: o, .. }) => {
                pods.is_empty() || pods == o
            }
            (PeerWatch::Namespace { .. }, PeerWatch::Cluster { .. }) => false,
            (
                PeerWatch::Namespace { namespace, pods },
                PeerWatch::Namespace {
                    namespace: n,
                    pods: o,
                },
            ) => namespace == n && (pods.is_empty() || pods == o),
        }
    }
}

impl fmt::Display for PeerWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (place, pods) = match self {
            PeerWatch::Namespace { namespace, pods } => (namespace.as_str(), pods),
            PeerWatch::Cluster { pods } => ("every namespace", pods),
        };
        if pods.is_empty() {
            write!(f, "Pods in {place}")
        } else {
            write!(f, "Pods in {place} with {pods}")
        }
    }
}

/// The Pod watches that tell which Pods have a source address, for the
/// ingress peers of the policies selecting a Pod in `local` (the node's
/// Pods: namespace and labels), given every namespace's labels. A peer
/// selecting Pods of named namespaces watches those namespaces; one
/// selecting every namespace (or more than [`MAX_NAMESPACED_WATCHES`])
/// watches cluster-wide with its Pod selector. A watch another covers is
/// left out.
pub fn desired<'a>(
    policies: impl IntoIterator<Item = &'a Policy>,
    local: &[(String, Labels)],
    namespaces: &BTreeMap<String, Arc<Labels>>,
) -> BTreeSet<PeerWatch> {
    let mut wanted = BTreeSet::new();
    let selecting = policies
        .into_iter()
        .filter(|p| local.iter().any(|(ns, l)| p.selects_pod(ns, l)));
    for (ns, pods) in selecting.flat_map(|p| p.pod_peers()) {
        match ns {
            Namespaces::Own(namespace) => {
                wanted.insert(PeerWatch::Namespace {
                    namespace: namespace.clone(),
                    pods: pods.clone(),
                });
            }
            Namespaces::Selected(sel) => {
                let matching: Vec<&String> = namespaces
                    .iter()
                    .filter(|(_, l)| sel.matches(l))
                    .map(|(n, _)| n)
                    .collect();
                if sel.is_empty() || matching.len() > MAX_NAMESPACED_WATCHES {
                    wanted.insert(PeerWatch::Cluster { pods: pods.clone() });
                } else {
                    wanted.extend(matching.into_iter().map(|n| PeerWatch::Namespace {
                        namespace: n.clone(),
                        pods: pods.clone(),
                    }));
                }
            }
        }
    }
    let all: Vec<PeerWatch> = wanted.iter().cloned().collect();
    wanted.retain(|w| !all.iter().any(|o| o != w && o.covers(w)));
    wanted
}

/// A Pod as the verdict needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPod {
    pub uid: String,
    pub namespace: String,
    pub labels: Labels,
    /// Its addresses (`status.podIPs`); none: not indexed.
    pub ips: Vec<IpAddr>,
}

/// The Pods one watch holds, by address.
#[derive(Debug, Default)]
pub struct PeerIndex {
    by_uid: HashMap<String, Arc<PeerPod>>,
    by_ip: HashMap<IpAddr, Vec<Arc<PeerPod>>>,
}

impl PeerIndex {
    /// Adds or replaces the Pod of `pod.uid`.
    pub fn upsert(&mut self, pod: PeerPod) {
        self.remove(&pod.uid);
        if pod.ips.is_empty() {
            return;
        }
        let pod = Arc::new(pod);
        for ip in &pod.ips {
            self.by_ip.entry(*ip).or_default().push(Arc::clone(&pod));
        }
        self.by_uid.insert(pod.uid.clone(), pod);
    }

    pub fn remove(&mut self, uid: &str) {
        let Some(old) = self.by_uid.remove(uid) else {
            return;
        };
        for ip in &old.ips {
            if let Some(pods) = self.by_ip.get_mut(ip) {
                pods.retain(|p| p.uid != uid);
                if pods.is_empty() {
                    self.by_ip.remove(ip);
                }
            }
        }
    }

    /// The Pods known to have `ip`.
    pub fn at(&self, ip: IpAddr) -> &[Arc<PeerPod>] {
        self.by_ip
            .get(&ip.to_canonical())
            .map_or(&[], |v| v.as_slice())
    }

    /// How many Pods it holds.
    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }
}

#[cfg(test)]
mod tests;
