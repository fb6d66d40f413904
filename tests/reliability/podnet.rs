//! Scenario 12's probe of the Pods' own addresses (docs/pod-network.md):
//! while the scenario suspends, resumes, deletes and kills, it opens
//! connections to every address a Pod has shown, from a network namespace
//! of the run's (the Pod range is routed locally in there; no
//! private-range address is a target in the host's own namespace). Each
//! VM's guest port answers with its claim id, so an answer says which VM a
//! connection reached.
//!
//! Judged at the end: an address that ever answered for, or was shown by
//! a Pod of, two claims (a connection reached another sandbox's VM); a
//! claim shown at two addresses; two Pods showing one address at once; an address of a released claim that
//! still answers, or a Running Pod's that does not (a leak or a hole).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::support::netns::{TestNetns, naming_server};
use sandboxd_sim::SimHandle;

/// The guest port every Pod declares and every VM answers on.
pub const PORT: u16 = 8080;
/// The Pod range: a /24, round-robin with a cool-down, so no address is
/// given twice within a run.
pub const RANGE: &str = "10.250.12.0/24";

#[derive(Default)]
struct Seen {
    /// Address → claims the Pods showing it carried.
    shown: BTreeMap<IpAddr, BTreeSet<String>>,
    /// Address → claims that answered on it.
    answered: BTreeMap<IpAddr, BTreeSet<String>>,
    /// Connections answered by a VM.
    answers: usize,
    /// Connections refused or failed (no VM behind, a Pod going, …).
    refused: usize,
    /// Two Pods showing one address in one listing.
    shared: Vec<String>,
    mapped: BTreeSet<String>,
}

pub struct AddressProbe {
    sim: Arc<sandboxd_sim::Sim>,
    net: Arc<TestNetns>,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

fn lock(m: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The claim id `addr` answers with from inside `net`, or why not.
async fn ask(net: &Arc<TestNetns>, addr: IpAddr) -> Result<String, String> {
    let net = Arc::clone(net);
    tokio::task::spawn_blocking(move || net.ask(SocketAddr::new(addr, PORT)))
        .await
        .map_err(|e| e.to_string())?
}

impl AddressProbe {
    /// `None` when no network namespace can be made (not root).
    pub fn start(sim: &SimHandle, pods: Api<Pod>, seed: u64) -> Option<AddressProbe> {
        let net = Arc::new(TestNetns::make("vkrel", RANGE)?);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let task = tokio::spawn(probe(
            Arc::clone(sim.sim()),
            pods,
            Arc::clone(&net),
            Arc::clone(&seen),
            seed,
        ));
        Some(AddressProbe {
            sim: Arc::clone(sim.sim()),
            net,
            seen,
            task,
        })
    }

    pub fn netns_path(&self) -> std::path::PathBuf {
        self.net.path()
    }

    /// Stops probing and judges, with `live` the claims sandboxd still
    /// holds and `running` the (address, claim) of each Running Pod now:
    /// (faults, notes).
    pub async fn judge(
        self,
        live: &BTreeSet<String>,
        running: &[(IpAddr, String)],
    ) -> (usize, Vec<String>) {
        self.task.abort();
        let _ = self.task.await;
        // Claims made since the probe's last turn answer too.
        map_new(&self.sim, &self.seen).await;
        let (shown, answered, shared, answers, refused) = {
            let s = lock(&self.seen);
            (
                s.shown.clone(),
                s.answered.clone(),
                s.shared.clone(),
                s.answers,
                s.refused,
            )
        };
        let mut faults = shared.len();
        let mut notes: Vec<String> = shared.into_iter().take(3).collect();
        // A claim keeps its address (adoption, suspend/resume, restarts).
        let mut by_claim: BTreeMap<&str, BTreeSet<IpAddr>> = BTreeMap::new();
        for (addr, claims) in &shown {
            for c in claims {
                by_claim.entry(c.as_str()).or_default().insert(*addr);
            }
        }
        for (claim, addrs) in by_claim.iter().filter(|(_, a)| a.len() > 1) {
            faults += 1;
            notes.push(format!("{claim} was shown at {addrs:?}"));
        }
        let addresses: BTreeSet<IpAddr> = shown.keys().chain(answered.keys()).copied().collect();
        let mut connections = 0;
        for addr in &addresses {
            let mut claims = shown.get(addr).cloned().unwrap_or_default();
            let got = answered.get(addr).cloned().unwrap_or_default();
            connections += got.len();
            claims.extend(got.iter().cloned());
            if claims.len() > 1 {
                faults += 1;
                notes.push(format!(
                    "{addr}: shown by Pods of {:?}, answered by {got:?}",
                    shown.get(addr)
                ));
            }
            // An address none of whose claims sandboxd holds: nothing may
            // answer on it any more.
            if claims.iter().all(|c| !live.contains(c))
                && let Ok(who) = ask(&self.net, *addr).await
            {
                faults += 1;
                notes.push(format!(
                    "{addr} of released {claims:?} still answers ({who})"
                ));
            }
        }
        for (addr, claim) in running {
            match ask(&self.net, *addr).await {
                Ok(who) if who == *claim => {}
                other => {
                    faults += 1;
                    notes.push(format!("{addr} of Running claim {claim} answers {other:?}"));
                }
            }
        }
        notes.push(format!(
            "Pod addresses: {} seen, {answers} connections answered (by {connections} \
             (address, VM) pairs), {refused} refused on the way, {} Running at the end",
            addresses.len(),
            running.len()
        ));
        (faults, notes)
    }
}

/// Gives each claim not seen yet a guest service on [`PORT`] that answers
/// with its id.
async fn map_new(sim: &sandboxd_sim::Sim, seen: &Mutex<Seen>) {
    for c in sim.claims() {
        if lock(seen).mapped.contains(&c.id) {
            continue;
        }
        let name: &'static str = Box::leak(c.id.clone().into_boxed_str());
        let mapping = sandboxd_sim::config::PortMapping {
            sandbox: Some(c.id.clone()),
            template: None,
            guest_port: PORT,
            target: naming_server(name).await,
        };
        if sim.map_port(mapping, false).is_ok() {
            lock(seen).mapped.insert(c.id);
        }
    }
}

/// Every 100 ms: maps new claims' guest port to a server naming them,
/// records the addresses the Pods show, and connects to one of the
/// addresses seen so far.
async fn probe(
    sim: Arc<sandboxd_sim::Sim>,
    pods: Api<Pod>,
    net: Arc<TestNetns>,
    seen: Arc<Mutex<Seen>>,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    loop {
        map_new(&sim, &seen).await;
        if let Ok(list) = pods.list(&Default::default()).await {
            let mut now: BTreeMap<IpAddr, BTreeSet<String>> = BTreeMap::new();
            let mut s = lock(&seen);
            for p in &list.items {
                let st = p.status.clone().unwrap_or_default();
                let claim = p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("sandbox.cocoonstack.io/claim-id").cloned());
                let (Some(ip), Some(claim)) = (st.pod_ip, claim) else {
                    continue;
                };
                let Ok(ip) = ip.parse::<IpAddr>() else {
                    continue;
                };
                s.shown.entry(ip).or_default().insert(claim);
                let name = p.metadata.name.clone().unwrap_or_default();
                now.entry(ip).or_default().insert(name);
            }
            for (ip, names) in now.into_iter().filter(|(_, n)| n.len() > 1) {
                s.shared
                    .push(format!("{ip} shown by Pods {names:?} at once"));
            }
        }
        let known: Vec<IpAddr> = lock(&seen).shown.keys().copied().collect();
        if !known.is_empty() {
            let addr = known[rng.random_range(0..known.len())];
            let answer = ask(&net, addr).await;
            let mut s = lock(&seen);
            match answer {
                Ok(who) => {
                    s.answers += 1;
                    s.answered.entry(addr).or_default().insert(who);
                }
                Err(_) => s.refused += 1,
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
