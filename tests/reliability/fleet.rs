//! Scenario 13: a fleet of three sandboxd nodes (each its own vk-sandbox
//! and simulator, the default scheduler, the upstream controller) under a
//! stream of Sandboxes, while sandboxd on a random node is filled to its
//! claim cap by another client, drained, stopped, or restarted (stopped
//! for a moment, its state kept), at most two nodes at once, and Sandboxes
//! are deleted at random (docs/reliability.md, scenario 13). Counted:
//!
//! - **stuck**: a Pod bound to a node and `Pending` longer than the
//!   hand-back grace + 30 s (40 s): it should have been claimed, or handed
//!   back and placed elsewhere;
//! - **wrongly released**: a Sandbox that ran on a VM and lives, whose VM
//!   was released or which now runs on another one;
//! - **leaked**: after settling, a sandbox held for a Sandbox that is gone,
//!   or a second one for the same Sandbox; after deleting them all, any
//!   sandbox of theirs left in any sandboxd;
//! - **not converged**: a living Sandbox not Running and Ready once every
//!   node has recovered.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use rand::Rng;
use sandbox_controller::Sandbox;

use crate::Size;
use crate::support::fleet::{self, Fleet};
use crate::world::{Tally, World, released_id};

const CLAIM_ID: &str = "sandbox.cocoonstack.io/claim-id";
/// `--hand-back-after`'s default + 30 s.
const STUCK_AFTER: Duration = Duration::from_secs(40);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trouble {
    Filled,
    Drained,
    Stopped,
    Restarted,
}

/// What the Pod watcher saw.
#[derive(Default)]
struct Seen {
    /// Pod UID → (Pod name, node, first seen bound and Pending).
    pending: HashMap<String, (String, String, Instant)>,
    /// Pods seen Pending past [`STUCK_AFTER`]: UID → what they showed.
    stuck: BTreeMap<String, String>,
    /// Sandbox (Pod) name → (node, claim id) of its first Running Pod.
    first_run: BTreeMap<String, (String, String)>,
    /// Sandboxes seen Running on another VM than their first.
    moved: BTreeMap<String, String>,
}

fn observe(seen: &mut Seen, pods: &[Pod], now: Instant) {
    let mut still = BTreeSet::new();
    for p in pods {
        let uid = p.uid().unwrap_or_default();
        let name = p.name_any();
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        match (node, phase) {
            (Some(node), Some("Pending") | None) => {
                still.insert(uid.clone());
                let since = seen
                    .pending
                    .entry(uid.clone())
                    .or_insert((name.clone(), node.clone(), now))
                    .2;
                if now.duration_since(since) > STUCK_AFTER && !seen.stuck.contains_key(&uid) {
                    let why = p.status.as_ref().and_then(|s| s.message.clone());
                    seen.stuck.insert(
                        uid,
                        format!(
                            "{name} Pending on {node} for over {STUCK_AFTER:?}: {}",
                            why.unwrap_or_default()
                        ),
                    );
                }
            }
            (Some(node), Some("Running")) => {
                let Some(claim) = p.annotations().get(CLAIM_ID).cloned() else {
                    continue;
                };
                let first = seen
                    .first_run
                    .entry(name.clone())
                    .or_insert((node.clone(), claim.clone()));
                if *first != (node.clone(), claim.clone()) {
                    seen.moved.insert(
                        name.clone(),
                        format!("{name} ran on {first:?}, now on ({node}, {claim})"),
                    );
                }
            }
            _ => {}
        }
    }
    seen.pending.retain(|uid, _| still.contains(uid));
}

/// The Sandbox name a claim of ours in `ns` was made for.
fn claimed_for<'a>(claim_ref: &'a str, ns: &str) -> Option<&'a str> {
    let rest = claim_ref.strip_prefix(ns)?.strip_prefix('/')?;
    Some(rest.split('#').next().unwrap_or(rest))
}

/// Sandbox name → the sandboxes (node, id) held for it, in every sandboxd.
fn held(fleet: &Fleet) -> BTreeMap<String, Vec<(usize, String)>> {
    let mut out: BTreeMap<String, Vec<(usize, String)>> = BTreeMap::new();
    for (i, m) in fleet.members.iter().enumerate() {
        for c in m.sim.sim().claims() {
            if let Some(name) = claimed_for(&c.claim_ref, &fleet.ns) {
                out.entry(name.to_string()).or_default().push((i, c.id));
            }
        }
    }
    out
}

struct Stream<'a> {
    fleet: &'a Fleet,
    api: Api<Sandbox>,
    living: BTreeSet<String>,
    troubled: BTreeMap<usize, (Trouble, Vec<String>)>,
    next: usize,
    faults: u32,
}

impl Stream<'_> {
    async fn create(&mut self) {
        let name = format!("fl-{}", self.next);
        self.next += 1;
        self.api
            .create(&PostParams::default(), &self.fleet.sandbox(&name))
            .await
            .unwrap_or_else(|e| panic!("create Sandbox {name}: {e}"));
        self.living.insert(name);
    }

    async fn delete(&mut self, name: String) {
        let _ = self.api.delete(&name, &DeleteParams::default()).await;
        self.living.remove(&name);
    }

    async fn start(&mut self, i: usize, trouble: Trouble) {
        let sim = self.fleet.members[i].sim.sim();
        let extra = match trouble {
            Trouble::Filled => self.fleet.fill(i).await,
            Trouble::Drained => {
                self.fleet.drain(i, true).await;
                Vec::new()
            }
            Trouble::Stopped | Trouble::Restarted => {
                sim.set_accepting(false);
                Vec::new()
            }
        };
        self.faults += 1;
        self.troubled.insert(i, (trouble, extra));
    }

    async fn end(&mut self, i: usize) {
        let Some((trouble, extra)) = self.troubled.remove(&i) else {
            return;
        };
        match trouble {
            Trouble::Filled => self.fleet.release(i, &extra).await,
            Trouble::Drained => self.fleet.drain(i, false).await,
            Trouble::Stopped | Trouble::Restarted => {
                self.fleet.members[i].sim.sim().set_accepting(true)
            }
        }
    }
}

pub async fn troubles(w: &mut World, size: Size) {
    let Some(fleet) = fleet::setup(|_| Vec::new()).await else {
        return;
    };
    let length = Duration::from_secs(size.pick(75, 240) as u64);
    let pods: Api<Pod> = fleet.pods();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let watcher = {
        let (pods, seen) = (pods.clone(), Arc::clone(&seen));
        tokio::spawn(async move {
            loop {
                if let Ok(list) = pods.list(&ListParams::default()).await {
                    let mut s = seen.lock().expect("seen");
                    observe(&mut s, &list.items, Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let mut stream = Stream {
        api: Api::namespaced(fleet.client(), &fleet.ns),
        fleet: &fleet,
        living: BTreeSet::new(),
        troubled: BTreeMap::new(),
        next: 0,
        faults: 0,
    };

    // Every 0.5 s: a few Sandboxes now and then (a burst right after a
    // trouble starts, racing the taint), a trouble started or ended, one
    // deleted now and then. At most two nodes are troubled at once, so the
    // stream always has somewhere to go; a trouble lasts 5-45 s (a restart
    // 1-3 s): past the hand-back grace, and often past the 40 s a Pod bound
    // to it would wait if it were not handed back.
    let started = Instant::now();
    let mut until: BTreeMap<usize, Instant> = BTreeMap::new();
    while started.elapsed() < length {
        let now = Instant::now();
        let over: Vec<usize> = until
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(i, _)| *i)
            .collect();
        for i in over {
            stream.end(i).await;
            until.remove(&i);
        }
        let mut burst = usize::from(w.rng.random_bool(0.5));
        if stream.troubled.len() < 2 && w.rng.random_bool(0.15) {
            let i = w.rng.random_range(0..3);
            if !stream.troubled.contains_key(&i) {
                let trouble = match w.rng.random_range(0..4) {
                    0 => Trouble::Filled,
                    1 => Trouble::Drained,
                    2 => Trouble::Stopped,
                    _ => Trouble::Restarted,
                };
                stream.start(i, trouble).await;
                let lasts = match trouble {
                    Trouble::Restarted => w.rng.random_range(1_000..3_000),
                    _ => w.rng.random_range(5_000..45_000),
                };
                until.insert(i, Instant::now() + Duration::from_millis(lasts));
                burst += 6;
            }
        }
        for _ in 0..burst {
            stream.create().await;
        }
        if !stream.living.is_empty() && w.rng.random_bool(0.2) {
            let names: Vec<String> = stream.living.iter().cloned().collect();
            let pick = names[w.rng.random_range(0..names.len())].clone();
            stream.delete(pick).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for i in 0..3 {
        stream.end(i).await;
    }
    let living: Vec<String> = stream.living.iter().cloned().collect();
    let (faults, created) = (stream.faults, stream.next);
    drop(stream);

    // Every living Sandbox Running and Ready.
    let mut t = Tally {
        pods: created,
        faults,
        ..Tally::default()
    };
    let converging = Instant::now();
    let placed = tokio::time::timeout(
        Duration::from_secs(180),
        fleet.wait_running(&living, Duration::from_secs(170)),
    )
    .await;
    t.converge = converging.elapsed();
    if placed.is_err() {
        t.not_converged += 1;
        t.notes.push("the living Sandboxes did not all run".into());
    }
    // The watcher sees the final state before the checks.
    tokio::time::sleep(Duration::from_secs(1)).await;
    watcher.abort();
    let seen = std::mem::take(&mut *seen.lock().expect("seen"));
    t.stuck_pending = seen.stuck.len();
    t.notes.extend(seen.stuck.values().take(5).cloned());
    t.wrongly_released += seen.moved.len();
    t.notes.extend(seen.moved.values().take(5).cloned());

    // A living Sandbox's first VM is still held where it ran, and was
    // never released.
    let holding = held(&fleet);
    let released: BTreeSet<String> = fleet
        .members
        .iter()
        .flat_map(|m| m.sim.sim().requests())
        .filter(|r| r.method == "POST")
        .filter_map(|r| released_id(&r.path).map(str::to_string))
        .collect();
    let node_index = |node: &str| (0..3).find(|i| fleet.node(*i) == node);
    for name in &living {
        let Some((node, claim)) = seen.first_run.get(name) else {
            continue;
        };
        let kept = holding.get(name).is_some_and(|h| {
            h.iter()
                .any(|(i, id)| Some(*i) == node_index(node) && id == claim)
        });
        if !kept || released.contains(claim) {
            t.wrongly_released += 1;
            t.notes.push(format!(
                "{name}'s sandbox {claim} on {node} was released while it lived"
            ));
        }
    }
    // Settled: nothing held for a Sandbox gone, one sandbox per Sandbox.
    let settle = |holding: &BTreeMap<String, Vec<(usize, String)>>| -> Vec<String> {
        holding
            .iter()
            .filter(|(name, h)| !living.contains(name) || h.len() > 1)
            .map(|(name, h)| format!("{name}: {h:?}"))
            .collect()
    };
    let mut extra = settle(&holding);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !extra.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        extra = settle(&held(&fleet));
    }
    t.leaked += extra.len();
    t.notes
        .extend(extra.into_iter().take(5).map(|e| format!("leaked: {e}")));

    // All deleted: nothing of theirs left anywhere.
    fleet.delete(&living).await;
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut left = held(&fleet);
    while !left.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        left = held(&fleet);
    }
    t.leaked += left.len();
    t.notes.extend(
        left.iter()
            .take(5)
            .map(|(name, h)| format!("left after deleting every Sandbox: {name}: {h:?}")),
    );
    t.notes.push(format!(
        "{created} Sandboxes on three nodes, {faults} node troubles, {} handed back",
        handed_back(&fleet).await
    ));
    fleet.cluster.drop_namespace(&fleet.ns).await;
    w.elsewhere = t;
}

/// Pods the fleet's nodes handed back.
async fn handed_back(fleet: &Fleet) -> f64 {
    let mut n = 0.0;
    for m in &fleet.members {
        for how in ["deleted", "failed"] {
            let series = format!("vk_sandbox_pods_handed_back_total{{how=\"{how}\"}}");
            n += crate::support::metric(&m.vk.metrics().await, &series).unwrap_or(0.0);
        }
    }
    n
}
