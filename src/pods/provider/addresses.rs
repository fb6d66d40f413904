//! Each claim's own Pod address (`--pod-cidr`, docs/pod-network.md): given
//! when the claim is made (or when a Pod adopts a claim made without one),
//! kept in the claim's row across Pods, suspends and restarts, free again
//! once no row holds it and no Pod here shows it, and not given again until
//! its cool-down is over.
//! Also what the Pod-address listeners want: one per tracked Pod's address
//! and declared TCP port.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Provider, lock};
use crate::claims::Claim;
use crate::podnet::listeners::{Endpoints, Wanted};
use crate::podnet::range::{Picker, PodRange};
use crate::pods::pod::Pod;

/// How long a released address waits before it is given again.
pub const COOLDOWN: Duration = Duration::from_secs(300);

impl Provider {
    /// Gives claims their own Pod addresses from `range`; `pods_here` is
    /// the watch cache of this node's Pods (an address one of them shows
    /// is not given to another claim).
    pub fn with_pod_range(
        mut self,
        range: PodRange,
        pods_here: kube::runtime::reflector::Store<Pod>,
    ) -> Provider {
        let held = self.pod_ips_held();
        self.addresses = Some(Mutex::new(Picker::new(range, COOLDOWN, &held)));
        self.pods_here = Some(pods_here);
        self
    }

    /// The Pod range, when claims get their own addresses.
    pub fn pod_range(&self) -> Option<PodRange> {
        self.addresses.as_ref().map(|p| lock(p).range())
    }

    fn pod_ips_held(&self) -> HashSet<Ipv4Addr> {
        self.claims
            .all()
            .into_iter()
            .filter_map(|(_, c, _)| c.lifecycle.pod_ip)
            .collect()
    }

    /// The addresses rows hold, and those Pods here still show. The cool-
    /// down is in memory: after a restart, an address released just before
    /// it would otherwise be free at once while the Pod that had it (its
    /// delete not finished) still shows it, so two Pods showed one address.
    fn pod_ips_in_use(&self) -> HashSet<Ipv4Addr> {
        let mut in_use = self.pod_ips_held();
        if let Some(store) = &self.pods_here {
            in_use.extend(store.state().iter().filter_map(|p| shown_ipv4(p)));
        }
        in_use
    }

    /// A Pod address for a new claim; `None` in the owner_addr mode, or
    /// when the range is full (the Pod then runs with the node's address,
    /// and the log says why).
    pub(super) fn next_pod_ip(&self, key: &str) -> Option<Ipv4Addr> {
        let addresses = self.addresses.as_ref()?;
        let held = self.pod_ips_in_use();
        let mut picker = lock(addresses);
        let picked = picker.pick(&held, Instant::now());
        if picked.is_none() {
            tracing::warn!(pod = %key, range = %picker.range(), held = held.len(),
                           "the Pod range has no free address (all held or cooling down): \
                            this Pod gets the node's address; widen --pod-cidr");
        }
        picked
    }

    /// The addresses cooling down after their release (for logs and
    /// tests); empty in the owner_addr mode.
    pub fn cooling_pod_ips(&self) -> Vec<Ipv4Addr> {
        self.addresses
            .as_ref()
            .map(|a| lock(a).cooling())
            .unwrap_or_default()
    }

    /// Notes which addresses rows hold now, so a released one starts its
    /// cool-down when it is released rather than at the next claim.
    pub fn observe_pod_ips(&self) {
        if let Some(a) = &self.addresses {
            let held = self.pod_ips_in_use();
            lock(a).observe(&held, Instant::now());
        }
    }
}

/// The IPv4 address a Pod's status shows, if any.
fn shown_ipv4(pod: &Pod) -> Option<Ipv4Addr> {
    pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()
}

/// The declared TCP ports of a Pod's containers.
pub fn declared_tcp_ports(pod: &Pod) -> Vec<u16> {
    let mut ports: Vec<u16> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .flat_map(|c| c.ports.iter())
        .filter(|p| p.protocol.as_deref().is_none_or(|proto| proto == "TCP"))
        .filter_map(|p| u16::try_from(p.container_port).ok())
        .filter(|p| *p > 0)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The listeners `claim`'s address wants for `pod`.
fn wanted_for(pod: &Pod, claim: &Claim) -> Vec<Wanted> {
    let Some(ip) = claim.lifecycle.pod_ip else {
        return Vec::new();
    };
    declared_tcp_ports(pod)
        .into_iter()
        .map(|port| Wanted {
            addr: SocketAddr::from((ip, port)),
            key: pod.key(),
            id: claim.id.clone(),
        })
        .collect()
}

impl Provider {
    /// Wakes the listeners (a Pod is about to be reported Running on its
    /// address); nothing without `--pod-cidr`.
    pub(super) fn endpoints_changed(&self) {
        if self.addresses.is_some() {
            self.endpoints_changed.notify_one();
        }
    }
}

impl Endpoints for Provider {
    fn changed(&self) -> Option<Arc<tokio::sync::Notify>> {
        Some(Arc::clone(&self.endpoints_changed))
    }

    fn wanted(&self) -> Vec<Wanted> {
        self.observe_pod_ips();
        self.tracked_pods()
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| Some((p, self.settled_claims_of(&p.key())?)))
            .flat_map(|(p, c)| wanted_for(p, &c))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ports: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [
                {"name": "a", "ports": ports},
                {"name": "b", "ports": [{"containerPort": 8080}, {"containerPort": 22, "protocol": "TCP"}]}
            ]}
        }))
        .expect("pod")
    }

    #[test]
    fn only_declared_tcp_ports_are_listened_on() {
        let p = pod(serde_json::json!([
            {"containerPort": 8080, "name": "http"},
            {"containerPort": 53, "protocol": "UDP"},
            {"containerPort": 9000, "protocol": "SCTP"},
            {"containerPort": 0},
            {"containerPort": 70000}
        ]));
        assert_eq!(declared_tcp_ports(&p), vec![22, 8080]);
    }

    #[test]
    fn a_claim_without_an_address_wants_no_listener() {
        let p = pod(serde_json::json!([]));
        let mut claim = Claim {
            id: "sb_1".into(),
            token: None,
            address: String::new(),
            pod_uid: "u".into(),
            claimed_at: jiff::Timestamp::UNIX_EPOCH,
            deadline: None,
            lifecycle: Default::default(),
        };
        assert!(wanted_for(&p, &claim).is_empty());
        claim.lifecycle.pod_ip = Some(Ipv4Addr::new(10, 250, 7, 9));
        let got: Vec<String> = wanted_for(&p, &claim)
            .iter()
            .map(|w| format!("{} {} {}", w.addr, w.key, w.id))
            .collect();
        assert_eq!(
            got,
            ["10.250.7.9:22 ns/p sb_1", "10.250.7.9:8080 ns/p sb_1"]
        );
    }
}
