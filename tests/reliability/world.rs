//! One scenario's world: the shared control plane, a namespace, the
//! sandboxd simulator, vk-sandbox as a process, the Sandbox controller
//! (upstream agent-sandbox; the stand-in only where it cannot be fetched),
//! and the record of every owner (Sandbox) the scenario made.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sandbox_controller::types::Sandbox;
use sandboxd_sim::SimHandle;
use serde_json::Value;

use crate::support::TestCluster;
use crate::support::sim as support_sim;
use crate::support::vk::{VkUnderTest, tail};

pub const TOKEN: &str = "reliability-root-token";
const CLAIM_ID: &str = "sandbox.cocoonstack.io/claim-id";

/// A Sandbox the scenario created.
#[derive(Debug, Clone)]
pub struct Owner {
    pub name: String,
    pub uid: String,
    /// The claim its Pod first ran on.
    pub claim: Option<String>,
    /// Simulator request-log watermark taken just before the harness
    /// deleted it: releases of its claim before that are wrong. For a
    /// Sandbox the controllers made (`managed`), the watermark when it was
    /// first seen gone.
    pub deleted_at: Option<u64>,
    /// Made and deleted by the agent-sandbox controllers (a warm pool's
    /// Sandbox, possibly adopted by a claim), found by watching; its
    /// `deleted_at` is when the watch saw it go.
    pub managed: bool,
    /// Set to `operatingMode: Suspended` (and not resumed since): no Pod,
    /// its VM hibernated (unless sandboxd refused to hibernate it).
    pub suspended: bool,
}

/// What the Sandbox watch saw: uid → (name, watermark when it went).
type SeenSandboxes = std::sync::Arc<std::sync::Mutex<BTreeMap<String, (String, Option<u64>)>>>;

/// The invariant figures of one run.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub pods: usize,
    pub faults: u32,
    pub wrongly_released: usize,
    pub leaked: usize,
    pub creds_lost: usize,
    pub not_converged: usize,
    pub bad_state_file: usize,
    /// sandboxd's reaper ended an owner's VM at its deadline while the
    /// owner lived (its lease was not renewed).
    pub leases_expired: usize,
    /// A suspended Sandbox's VM still running after settling, sandboxd
    /// never having refused (409) to hibernate it.
    pub running_suspended: usize,
    /// A VM that served one owner (a Sandbox's UID) served another: a
    /// Sandbox re-created under the same name got the old one's memory.
    pub given_to_another: usize,
    /// Pod addresses (scenario 12): a connection that reached another
    /// sandbox's VM, an address two Pods showed at once, a released
    /// claim's address still answering or a Running Pod's not.
    pub address_faults: usize,
    /// A Pod bound to a node and `Pending` longer than the hand-back grace
    /// + 30 s (scenario 13, a fleet).
    pub stuck_pending: usize,
    pub converge: Duration,
    pub notes: Vec<String>,
}

pub struct World {
    pub cluster: TestCluster,
    pub ns: String,
    pub sim: SimHandle,
    pub vk: VkUnderTest,
    pub token_file: PathBuf,
    pub rng: StdRng,
    pub owners: Vec<Owner>,
    pub faults: u32,
    next: u32,
    prefix: String,
    /// The longest wait for convergence after a fault in this run.
    slowest: Duration,
    /// Processes started that should come up (each logs "virtual node
    /// ready" once up).
    pub starts: usize,
    /// Sandboxes another client of sandboxd (a neighbour) claimed: never
    /// vk-sandbox's to release.
    pub foreign: Vec<String>,
    /// Sandboxes are also made by the controllers (warm pools): the
    /// watch's record of them (uid → name, deletion watermark).
    pub discover: bool,
    /// The `ttl-seconds` the Pods of the Sandboxes created from now on
    /// ask (`None`: the contract's default, 24 h).
    pub lease_ttl: Option<u64>,
    /// Flags added to every start (scenario 12: the Pod range).
    pub extra_args: Vec<String>,
    /// The container ports the Pods of Sandboxes created from now on
    /// declare.
    pub pod_ports: Vec<u16>,
    /// Scenario 12's Pod-address faults and what it noted.
    pub address_faults: usize,
    pub address_notes: Vec<String>,
    /// What a scenario that runs its own nodes (13, a fleet) found: added
    /// to this run's figures.
    pub elsewhere: Tally,
    seen: SeenSandboxes,
    watch: Option<tokio::task::JoinHandle<()>>,
    _controller: crate::support::controller::SandboxController,
}

impl World {
    pub async fn new(cluster: TestCluster, prefix: &str, seed: u64, pool: u32) -> World {
        let pool = format!("base:24.04={pool}");
        let sim = support_sim::start(support_sim::config(TOKEN, &[&pool])).await;
        let dir = crate::support::vk::test_dir(&format!("{prefix}-token"));
        let token_file = support_sim::token_file(&dir, TOKEN);
        let args = base_args(&sim, &token_file);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // vk-sandbox first: its ServiceAccount kubeconfig is made with API
        // discovery, which can answer 404 for a moment after a new CRD.
        let vk = VkUnderTest::start(&cluster, prefix, &args).await;
        crate::support::controller::install_crds(&cluster.client, &cluster.kubeconfig).await;
        vk.wait_ready(&cluster.client, Duration::from_secs(60))
            .await;
        let ns = cluster.namespace(prefix).await;
        let controller =
            crate::support::controller::start(&cluster.client, &cluster.kubeconfig, &ns).await;
        World {
            cluster,
            ns,
            sim,
            vk,
            token_file,
            rng: StdRng::seed_from_u64(seed),
            owners: Vec::new(),
            faults: 0,
            next: 0,
            prefix: prefix.to_string(),
            slowest: Duration::ZERO,
            starts: 1,
            foreign: Vec::new(),
            discover: false,
            lease_ttl: None,
            extra_args: Vec::new(),
            pod_ports: Vec::new(),
            address_faults: 0,
            address_notes: Vec::new(),
            elsewhere: Tally::default(),
            seen: Default::default(),
            watch: None,
            _controller: controller,
        }
    }

    pub fn sandboxes(&self) -> Api<Sandbox> {
        Api::namespaced(self.cluster.client.clone(), &self.ns)
    }

    /// The namespace's objects of an agent-sandbox kind (SandboxTemplate,
    /// SandboxWarmPool, SandboxClaim, Sandbox).
    pub fn dynamic(&self, kind: &str) -> Api<kube::api::DynamicObject> {
        Api::namespaced_with(
            self.cluster.client.clone(),
            &self.ns,
            &crate::support::controller::resource(kind),
        )
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.cluster.client.clone(), &self.ns)
    }

    /// Highest sequence number in the simulator's request log so far.
    pub fn watermark(&self) -> u64 {
        self.sim
            .sim()
            .requests()
            .iter()
            .map(|r| r.seq)
            .max()
            .unwrap_or(0)
    }

    /// A random pause in `0..max_ms`.
    pub async fn jitter(&mut self, max_ms: u64) {
        let ms = self.rng.random_range(0..max_ms.max(1));
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    /// Creates `n` Sandboxes pinned to this node. Retries while the
    /// apiserver is unavailable (outage scenarios).
    pub async fn create(&mut self, n: usize) {
        for _ in 0..n {
            let name = self.next_name();
            self.create_named(&name).await;
        }
    }

    /// The name the next created Sandbox gets.
    pub fn next_name(&mut self) -> String {
        self.next += 1;
        format!("{}-{}", self.prefix, self.next)
    }

    /// Another client of the same sandboxd (as sandbox-operator's
    /// aggregated apiserver does) claims with `claim_ref = <ns>/<name>`:
    /// the key of the Pod of Sandbox `name`.
    pub async fn neighbour_claim(&mut self, name: &str) {
        let neighbour = vk_sandbox::sandboxd::SandboxdClient::builder(self.sim.base_url())
            .token(Some(TOKEN.into()))
            .build()
            .expect("neighbour client");
        // A capacity miss, or a fault armed for vk-sandbox's claim taken by
        // the neighbour's instead: it got nothing, nothing to track.
        if let Ok(c) = neighbour
            .claim(&vk_sandbox::sandboxd::ClaimRequest {
                template: "base:24.04".into(),
                claim_ref: format!("{}/{name}", self.ns),
                ..Default::default()
            })
            .await
        {
            self.foreign.push(c.id);
        }
    }

    pub async fn create_named(&mut self, name: &str) {
        let mut v =
            crate::support::controller::contract_sandbox(name, "base:24.04", Some(&self.vk.node));
        if let Some(ttl) = self.lease_ttl {
            v["spec"]["podTemplate"]["metadata"]["annotations"]["sandbox.cocoonstack.io/ttl-seconds"] =
                Value::from(ttl.to_string());
        }
        if !self.pod_ports.is_empty() {
            let ports: Vec<Value> = self
                .pod_ports
                .iter()
                .map(|p| serde_json::json!({"containerPort": p}))
                .collect();
            v["spec"]["podTemplate"]["spec"]["containers"][0]["ports"] = Value::from(ports);
        }
        let sb: Sandbox = serde_json::from_value(v).expect("sandbox json");
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match self.sandboxes().create(&PostParams::default(), &sb).await {
                Ok(created) => {
                    self.owners.push(Owner {
                        name: name.to_string(),
                        uid: created.metadata.uid.unwrap_or_default(),
                        claim: None,
                        deleted_at: None,
                        managed: false,
                        suspended: false,
                    });
                    return;
                }
                // The old owner of a reused name is still being deleted, or
                // the apiserver is away: retry.
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(e) => panic!("create Sandbox {name}: {e}"),
            }
        }
    }

    /// Deletes a random live owner (foreground or background propagation
    /// at random); returns its name.
    pub async fn delete_random(&mut self) -> Option<String> {
        let alive: Vec<usize> = (0..self.owners.len())
            .filter(|i| self.owners[*i].deleted_at.is_none())
            .collect();
        if alive.is_empty() {
            return None;
        }
        let i = alive[self.rng.random_range(0..alive.len())];
        let foreground = self.rng.random_bool(0.5);
        self.delete_index(i, foreground).await;
        Some(self.owners[i].name.clone())
    }

    pub async fn delete_index(&mut self, i: usize, foreground: bool) {
        self.owners[i].deleted_at = Some(self.watermark());
        let dp = if foreground {
            DeleteParams::foreground()
        } else {
            DeleteParams::background()
        };
        let name = self.owners[i].name.clone();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match self.sandboxes().delete(&name, &dp).await {
                Ok(_) => return,
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(300)).await
                }
                Err(e) => panic!("delete Sandbox {name}: {e}"),
            }
        }
    }

    /// Suspends (`operatingMode: Suspended`) or resumes (`Running`) owner
    /// `i`, retrying (bounded) through the apiserver's hiccups.
    pub async fn set_suspended(&mut self, i: usize, suspended: bool) {
        let mode = if suspended { "Suspended" } else { "Running" };
        let name = self.owners[i].name.clone();
        let patch = serde_json::json!({"spec": {"operatingMode": mode}});
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = self
                .sandboxes()
                .patch(
                    &name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await;
            match r {
                Ok(_) => break,
                Err(e) if Instant::now() >= deadline => panic!("set Sandbox {name} {mode}: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
            }
        }
        self.owners[i].suspended = suspended;
    }

    /// sandboxd's live rows: id → hibernated.
    fn hibernated_rows(&self) -> BTreeMap<String, bool> {
        self.sim
            .sim()
            .claims()
            .into_iter()
            // Archived is asleep too (sandboxd's row: hibernated false).
            .map(|c| (c.id, c.hibernated || c.archived))
            .collect()
    }

    /// Sandboxes whose hibernate sandboxd refused (409: it cannot hibernate
    /// that VM); vk-sandbox then leaves the VM running, as documented.
    pub fn hibernate_refused(&self) -> BTreeSet<String> {
        self.sim
            .sim()
            .requests()
            .iter()
            .filter(|r| r.status == Some(409))
            .filter_map(|r| {
                r.path
                    .strip_prefix("/v1/sandboxes/")?
                    .strip_suffix("/hibernate")
                    .map(str::to_string)
            })
            .collect()
    }

    pub fn vk_args(&self) -> Vec<String> {
        let mut args = base_args(&self.sim, &self.token_file);
        args.extend(self.extra_args.iter().cloned());
        args
    }

    /// `kill -9`, then start again with the same state and ports.
    pub fn kill_and_restart(&mut self) {
        self.vk.process.signal(nix::sys::signal::Signal::SIGKILL);
        self.vk.process.wait_exit(Duration::from_secs(10));
        self.restart();
    }

    /// Starts again and waits until the new process has registered (its
    /// log says "virtual node ready" once more): the Node's Ready condition
    /// alone may still be the previous process's.
    pub async fn restart_and_wait(&mut self) {
        let before = self.vk.logs().matches("virtual node ready").count();
        self.restart();
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.vk.logs().matches("virtual node ready").count() <= before {
            assert!(
                Instant::now() < deadline,
                "vk-sandbox did not come back within 60 s:\n{}",
                tail(&self.vk.logs(), 30)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn restart(&mut self) {
        self.starts += 1;
        let args = self.vk_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.vk.restart(&args);
    }

    /// Starts watching the namespace's Sandboxes: from now on the
    /// controllers' Sandboxes are owners too, each marked deleted with the
    /// simulator's watermark the moment the watch reports it going (before
    /// garbage collection can even delete its Pod, so before any rightful
    /// release).
    pub fn watch_sandboxes(&mut self) {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let seen = self.seen.clone();
        let sim = self.sim.sim().clone();
        let api = self.sandboxes();
        self.watch = Some(tokio::spawn(async move {
            let mark = || sim.requests().iter().map(|r| r.seq).max().unwrap_or(0);
            let mut stream = watcher(api, watcher::Config::default()).boxed();
            while let Some(ev) = stream.next().await {
                let (sb, gone) = match ev {
                    Ok(watcher::Event::Apply(sb)) | Ok(watcher::Event::InitApply(sb)) => {
                        let gone = sb.metadata.deletion_timestamp.is_some();
                        (sb, gone)
                    }
                    Ok(watcher::Event::Delete(sb)) => (sb, true),
                    _ => continue,
                };
                let uid = sb.metadata.uid.clone().unwrap_or_default();
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                let entry = seen
                    .entry(uid)
                    .or_insert_with(|| (sb.metadata.name.clone().unwrap_or_default(), None));
                if gone && entry.1.is_none() {
                    entry.1 = Some(mark());
                }
            }
        }));
    }

    /// Registers the Sandboxes the watch has seen (not created by the
    /// harness) as managed owners, with their deletion marks.
    pub async fn discover_sandboxes(&mut self) -> Result<(), String> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (uid, (name, gone)) in seen {
            match self.owners.iter_mut().find(|o| o.uid == uid) {
                Some(o) if o.managed => o.deleted_at = o.deleted_at.or(gone),
                Some(_) => {}
                None => self.owners.push(Owner {
                    name,
                    uid,
                    claim: None,
                    deleted_at: gone,
                    managed: true,
                    suspended: false,
                }),
            }
        }
        Ok(())
    }

    /// Records the claim each live owner's Pod first runs on.
    async fn observe(&mut self, pods: &[Pod]) {
        for o in self.owners.iter_mut().filter(|o| o.claim.is_none()) {
            if let Some((_, id)) = running_on(pods, o) {
                o.claim = Some(id);
            }
        }
    }

    /// Lists this namespace's Pods (retrying through outages).
    async fn list_pods(&self) -> Result<Vec<Pod>, String> {
        self.pods()
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .map_err(|e| e.to_string())
    }

    /// Waits until every live owner's Pod runs on its original claim and
    /// every deleted owner's Pods are gone; the figures of what did not.
    pub async fn converge(&mut self, timeout: Duration) -> (Duration, Vec<String>) {
        let started = Instant::now();
        let mut problems;
        loop {
            problems = Vec::new();
            if self.discover
                && let Err(e) = self.discover_sandboxes().await
            {
                problems.push(format!("list Sandboxes: {e}"));
            }
            let live: BTreeSet<String> =
                self.sim.sim().claims().into_iter().map(|c| c.id).collect();
            for o in self.owners.iter().filter(|o| o.deleted_at.is_some()) {
                if let Some(c) = o.claim.as_ref().filter(|c| live.contains(*c)) {
                    problems.push(format!(
                        "{}: deleted, its sandbox {c} is not released",
                        o.name
                    ));
                }
            }
            // A sandbox claimed by this node for one of this world's Pods
            // and run by none of its owners is a stray still to be returned.
            let ours = format!("{}/", self.ns);
            for c in self.sim.sim().claims() {
                if c.claim_ref.starts_with(&ours)
                    && c.claim_ref.contains("#vk-sandbox:")
                    && !self.owners.iter().any(|o| o.claim.as_ref() == Some(&c.id))
                {
                    problems.push(format!("stray {} ({}) not returned", c.id, c.claim_ref));
                }
            }
            let rows = self.hibernated_rows();
            let refused = self.hibernate_refused();
            match self.list_pods().await {
                Err(e) => problems.push(format!("list Pods: {e}")),
                Ok(pods) => {
                    self.observe(&pods).await;
                    for o in &self.owners {
                        let mine: Vec<&Pod> = pods.iter().filter(|p| owned_by(p, &o.uid)).collect();
                        if o.deleted_at.is_none() && o.suspended {
                            // Suspended: no Pod; its VM kept and hibernated.
                            if !mine.is_empty() {
                                problems.push(format!("{}: suspended, still has a Pod", o.name));
                            }
                            if let Some(c) = &o.claim {
                                match rows.get(c) {
                                    None => problems.push(format!(
                                        "{}: suspended, its sandbox {c} is gone",
                                        o.name
                                    )),
                                    Some(false) if !refused.contains(c) => problems.push(format!(
                                        "{}: suspended, its sandbox {c} still runs",
                                        o.name
                                    )),
                                    Some(_) => {}
                                }
                            }
                            continue;
                        }
                        match (&o.deleted_at, running_on(&pods, o)) {
                            (Some(_), _) if !mine.is_empty() => {
                                problems.push(format!("{}: deleted owner still has a Pod", o.name))
                            }
                            (Some(_), _) => {}
                            (None, Some((_, id))) if Some(&id) == o.claim.as_ref() => {}
                            (None, Some((_, id))) => problems.push(format!(
                                "{}: Running on {id}, first ran on {:?}",
                                o.name, o.claim
                            )),
                            (None, None) => problems.push(format!(
                                "{}: not Running ({})",
                                o.name,
                                mine.first()
                                    .and_then(|p| p.status.as_ref())
                                    .map(|s| format!("{:?} {:?}", s.phase, s.reason))
                                    .unwrap_or_else(|| "no Pod".into())
                            )),
                        }
                    }
                }
            }
            if problems.is_empty() || started.elapsed() >= timeout {
                self.slowest = self.slowest.max(started.elapsed());
                return (started.elapsed(), problems);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Stops vk-sandbox cleanly and checks the invariants against the
    /// simulator's log and listing, the API and the claims file.
    pub async fn finish(mut self, converge_timeout: Duration) -> Tally {
        let (took, problems) = self.converge(converge_timeout).await;
        if let Some(h) = self.watch.take() {
            h.abort();
        }
        let mut t = Tally {
            pods: self.owners.len(),
            faults: self.faults,
            converge: took.max(self.slowest),
            not_converged: problems.len(),
            address_faults: self.address_faults,
            ..Tally::default()
        };
        t.notes.append(&mut self.address_notes);
        let mut other = std::mem::take(&mut self.elsewhere);
        t.converge = t.converge.max(other.converge);
        t.notes.append(&mut other.notes);
        crate::add(&mut t, other);
        t.notes.extend(problems.iter().take(5).cloned());
        if !problems.is_empty() {
            t.notes.push(format!(
                "vk-sandbox log tail:\n{}",
                tail(&self.vk.logs(), 30)
            ));
        }

        // (a') No release of a neighbour's sandbox, ever.
        let foreign: BTreeSet<&str> = self.foreign.iter().map(String::as_str).collect();
        for r in self.sim.sim().requests() {
            if let Some(id) = released_id(&r.path)
                && r.method == "POST"
                && foreign.contains(id)
            {
                t.wrongly_released += 1;
                t.notes.push(format!(
                    "release of the neighbour's sandbox {id} at seq {}",
                    r.seq
                ));
            }
        }
        if !self.foreign.is_empty() {
            let live: BTreeSet<String> =
                self.sim.sim().claims().into_iter().map(|c| c.id).collect();
            t.notes.push(format!(
                "{} neighbour sandboxes, {} still live",
                self.foreign.len(),
                self.foreign.iter().filter(|f| live.contains(*f)).count()
            ));
        }

        // (a) No release of a claim while its owner was alive.
        let originals: BTreeMap<&str, &Owner> = self
            .owners
            .iter()
            .filter_map(|o| o.claim.as_deref().map(|c| (c, o)))
            .collect();
        for r in self.sim.sim().requests() {
            let Some(id) = released_id(&r.path) else {
                continue;
            };
            if r.method != "POST" {
                continue;
            }
            if let Some(o) = originals.get(id) {
                let wrong = match o.deleted_at {
                    None => true,
                    Some(mark) => r.seq <= mark,
                };
                if wrong {
                    t.wrongly_released += 1;
                    t.notes.push(format!(
                        "release of {id} (owner {}) at seq {} while it lived",
                        o.name, r.seq
                    ));
                }
            }
        }

        // (e) No lease ended by sandboxd's reaper under a living owner.
        for r in self.sim.sim().reaped() {
            let Some(o) = originals.get(r.id.as_str()) else {
                continue;
            };
            if o.deleted_at.is_none_or(|mark| r.after_seq <= mark) {
                t.leases_expired += 1;
                t.notes.push(format!(
                    "the lease of {} (owner {}) ended at its deadline while the owner lived{}",
                    r.id,
                    o.name,
                    if r.archived { " (archived)" } else { "" }
                ));
            }
        }

        // (g) No VM of one owner generation given to another: each claim
        // a Pod ran on belongs to one Sandbox UID.
        let mut served: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for o in &self.owners {
            if let Some(c) = &o.claim {
                served.entry(c.as_str()).or_default().insert(o.uid.as_str());
            }
        }
        for (c, uids) in served.iter().filter(|(_, u)| u.len() > 1) {
            t.given_to_another += 1;
            t.notes.push(format!(
                "{c} served {} owner generations: {uids:?}",
                uids.len()
            ));
        }

        // (f) No VM left running for a suspended Sandbox, unless sandboxd
        // refused to hibernate it.
        let refused = self.hibernate_refused();
        let rows = self.hibernated_rows();
        let mut kept_running = 0;
        for o in self
            .owners
            .iter()
            .filter(|o| o.deleted_at.is_none() && o.suspended)
        {
            let Some(c) = &o.claim else { continue };
            if rows.get(c) == Some(&false) {
                if refused.contains(c) {
                    kept_running += 1;
                } else {
                    t.running_suspended += 1;
                    t.notes.push(format!(
                        "{c} of suspended {} still runs (no hibernate refused)",
                        o.name
                    ));
                }
            }
        }
        let suspended = self
            .owners
            .iter()
            .filter(|o| o.deleted_at.is_none() && o.suspended)
            .count();
        // What sandboxd answered each verb: "204×3 500×1 none×1" ("none":
        // no reply, the connection gone).
        let answers = |verb: &str| -> (usize, String) {
            let mut by: BTreeMap<String, usize> = BTreeMap::new();
            for r in self.sim.sim().requests() {
                if r.method == "POST" && r.path.ends_with(verb) {
                    let k = r
                        .status
                        .map_or_else(|| "none".to_string(), |s| s.to_string());
                    *by.entry(k).or_default() += 1;
                }
            }
            let total = by.values().sum();
            let text = by
                .iter()
                .map(|(k, n)| format!("{k}×{n}"))
                .collect::<Vec<_>>()
                .join(" ");
            (total, text)
        };
        let (hibernates, hibernated) = answers("/hibernate");
        if hibernates > 0 {
            let (wakes, woken) = answers("/wake");
            let (renews, renewed) = answers("/renew");
            t.notes.push(format!(
                "{suspended} Sandboxes suspended at the end ({kept_running} running: sandboxd \
                 refused to hibernate them, 409); sandboxd answered {hibernates} hibernates \
                 ({hibernated}), {wakes} wakes ({woken}), {renews} renewals ({renewed})"
            ));
        }

        // (d) The claims file after a clean stop: valid and 0600. A
        // process killed and restarted just before must be up first (a
        // SIGTERM before its handler is installed ends it uncompacted).
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.vk.logs().matches("virtual node ready").count() < self.starts
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.vk.process.signal(nix::sys::signal::Signal::SIGTERM);
        let exited = self.vk.process.wait_exit(Duration::from_secs(15));
        if !exited.is_some_and(|s| s.success()) {
            t.notes
                .push(format!("vk-sandbox did not exit 0 on SIGTERM: {exited:?}"));
        }
        let stored = match read_state(&self.vk.state_path) {
            Ok(s) => s,
            Err(e) => {
                t.bad_state_file += 1;
                t.notes.push(e);
                BTreeMap::new()
            }
        };
        let mut held: BTreeMap<String, usize> = BTreeMap::new();
        for id in stored.values() {
            *held.entry(id.clone()).or_default() += 1;
        }
        for (id, n) in &held {
            if *n > 1 {
                t.bad_state_file += 1;
                t.notes.push(format!("{id} held by {n} stored claims"));
            }
        }

        // (b) Every live sandbox is held by a stored claim, or was
        // reported by the orphan audit.
        let logs = self.vk.logs();
        let reported_as = |what: &[&str]| -> BTreeSet<String> {
            logs.lines()
                .filter(|l| what.iter().any(|w| l.contains(w)))
                .filter_map(|l| l.split("sandbox=").nth(1))
                .map(|s| {
                    s.split(|c: char| c.is_whitespace() || c == '"' || c == ',')
                        .next()
                        .unwrap_or("")
                        .to_string()
                })
                .collect()
        };
        // Rows of other clients the audit reports are not ours to judge;
        // a row it reports as this node's `stray` still live at the end
        // is a leak.
        let reported = reported_as(&["possible orphan sandbox", "claimed outside this provider"]);
        let strays = reported_as(&["stray sandbox"]);
        let alive_claims: BTreeSet<&str> = self
            .owners
            .iter()
            .filter(|o| o.deleted_at.is_none())
            .filter_map(|o| o.claim.as_deref())
            .collect();
        let deleted_claims: BTreeSet<&str> = self
            .owners
            .iter()
            .filter(|o| o.deleted_at.is_some())
            .filter_map(|o| o.claim.as_deref())
            .collect();
        let observed = self.owners.iter().filter(|o| o.claim.is_some()).count();
        t.notes.push(format!(
            "{observed} of {} owners ran; {} deleted; {} releases sent",
            self.owners.len(),
            self.owners
                .iter()
                .filter(|o| o.deleted_at.is_some())
                .count(),
            self.sim
                .sim()
                .requests()
                .iter()
                .filter(|r| released_id(&r.path).is_some())
                .count()
        ));
        // A stored claim whose Pod key no live owner has keeps a VM for
        // nobody.
        let live_ids: BTreeSet<String> =
            self.sim.sim().claims().into_iter().map(|c| c.id).collect();
        let prefix = format!("{}/", self.ns);
        for (key, id) in &stored {
            // Pods of other tests' namespaces can be scheduled onto this
            // node (a template that selects any sandboxd node): their owners
            // are not this world's to judge.
            let Some(name) = key.strip_prefix(&prefix) else {
                t.notes.push(format!(
                    "stored claim {key} -> {id} belongs to another namespace"
                ));
                continue;
            };
            let owned = self
                .owners
                .iter()
                .any(|o| o.deleted_at.is_none() && o.name == name);
            if !owned && live_ids.contains(id) && !deleted_claims.contains(id.as_str()) {
                t.leaked += 1;
                t.notes.push(format!(
                    "stored claim {key} -> {id} has no owner and is still live"
                ));
            }
        }
        for c in self.sim.sim().claims() {
            if foreign.contains(c.id.as_str()) {
                continue;
            }
            if deleted_claims.contains(c.id.as_str()) {
                t.leaked += 1;
                t.notes
                    .push(format!("{} of a deleted owner is still live", c.id));
                continue;
            }
            if held.contains_key(&c.id) {
                continue;
            }
            if alive_claims.contains(c.id.as_str()) {
                t.creds_lost += 1;
                t.notes.push(format!(
                    "credential of live {} ({}) not stored",
                    c.id, c.claim_ref
                ));
            } else if strays.contains(&c.id) {
                t.leaked += 1;
                t.notes.push(format!(
                    "stray {} (claim_ref {:?}) reported by the orphan audit and never returned",
                    c.id, c.claim_ref
                ));
            } else if !reported.contains(&c.id) {
                t.leaked += 1;
                t.notes.push(format!(
                    "leaked {} (claim_ref {:?}), not reported",
                    c.id, c.claim_ref
                ));
            } else {
                t.notes.push(format!(
                    "{} (claim_ref {:?}) another client's, reported by the orphan audit",
                    c.id, c.claim_ref
                ));
            }
        }
        self.cluster.drop_namespace(&self.ns).await;
        t
    }
}

fn base_args(sim: &SimHandle, token_file: &std::path::Path) -> Vec<String> {
    let mut args = support_sim::vk_args(sim, Some(token_file));
    args.push("--orphan-scan-interval=2s".into());
    args
}

fn owned_by(p: &Pod, uid: &str) -> bool {
    p.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.uid == uid)
}

/// (Pod uid, claim id) of `o`'s live Running Pod.
fn running_on(pods: &[Pod], o: &Owner) -> Option<(String, String)> {
    pods.iter()
        .filter(|p| owned_by(p, &o.uid) && p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .find_map(|p| {
            let id = p.metadata.annotations.as_ref()?.get(CLAIM_ID)?.clone();
            Some((p.metadata.uid.clone().unwrap_or_default(), id))
        })
}

/// `/v1/sandboxes/{id}/release` → id.
pub fn released_id(path: &str) -> Option<&str> {
    path.strip_prefix("/v1/sandboxes/")?
        .strip_suffix("/release")
}

/// The claims file after a clean stop: key → sandbox id. Checks JSON and
/// mode 0600.
fn read_state(path: &std::path::Path) -> Result<BTreeMap<String, String>, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode != 0o600 {
        return Err(format!("{} has mode {mode:o}, not 600", path.display()));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let claims = v["claims"].as_object().cloned().unwrap_or_default();
    claims
        .into_iter()
        .map(|(k, c)| match c["id"].as_str() {
            // An empty token is a claim recovered after its credential was
            // lost (released with the node token).
            Some(id) if !id.is_empty() && c["token"].is_string() => Ok((k, id.to_string())),
            _ => Err(format!(
                "{}: claim {k} lacks an id or token",
                path.display()
            )),
        })
        .collect()
}
