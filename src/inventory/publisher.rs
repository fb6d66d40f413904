//! The NodeInventory reconcile: at start-up and every `--publish-interval`,
//! read sandboxd (listing, then info), build the desired object and apply it
//! with server-side apply only when it changed or the resync is due. A
//! failed query skips the tick: a half-empty inventory is never published.
//! The object goes into the group(s) [`groups::choose`] picks, looked up
//! again at the first apply, at every resync and after a 404 (a CRD
//! installed or removed meanwhile).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::claims::ClaimsStore;
use crate::error::{Error, Result};
use crate::fleet::reading::{Reading, Sample};
use crate::health::Health;
use crate::metrics::{Controller, Metrics};
use crate::node::desired::FIELD_MANAGER;
use crate::periodic::{Beat, Next, Periodic, Turn};
use crate::sandboxd::{NodeInfo, SandboxRow, SandboxdClient};

use super::desired::{Applied, ApplyDecision, decide, desired};
use super::groups::{self, Choice, KNOWN};
use super::types::{KIND, NodeInventory, PLURAL, VERSION, api_version, crd_name};

/// Unchanged inventories are re-applied this often (only changes are applied
/// in between), so an object edited or deleted by hand comes back.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(600);

/// How long a tick waits for the feed's next reading of `/v1/info` (its
/// interval, plus a read that times out after 10 s).
const FRESH_READING_WAIT: Duration = Duration::from_secs(75);

/// What one tick did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickOutcome {
    Applied(ApplyDecision),
    Unchanged,
    /// sandboxd's listing or info failed.
    Skipped,
}

pub struct Publisher {
    client: kube::Client,
    /// `--inventory-group`; `None`: publish where the cluster serves the CRD.
    flag: Option<String>,
    /// Where to publish, as last looked up; `None`: look up at the next
    /// apply.
    choice: Option<Choice>,
    sandboxd: SandboxdClient,
    claims: Arc<ClaimsStore>,
    node: String,
    address: String,
    resync: Duration,
    metrics: Arc<Metrics>,
    last: Option<Applied>,
    /// A listing taken moments ago (the start-up one), used by the first
    /// tick instead of listing sandboxd again.
    seed: Option<Vec<SandboxRow>>,
    /// The readings of `/v1/info` the Node status shares (src/fleet); the
    /// publisher reads `/v1/info` itself only without them.
    info_feed: Option<watch::Receiver<Sample>>,
}

impl Publisher {
    /// `group`: `--inventory-group`, or `None` to publish in the groups the
    /// cluster serves the CRD in.
    pub fn new(
        client: kube::Client,
        group: Option<&str>,
        sandboxd: SandboxdClient,
        claims: Arc<ClaimsStore>,
        node: &str,
        address: &str,
        metrics: Arc<Metrics>,
    ) -> Publisher {
        Publisher {
            client,
            flag: group.map(str::to_string),
            choice: None,
            sandboxd,
            claims,
            node: node.to_string(),
            address: address.to_string(),
            resync: DEFAULT_RESYNC,
            metrics,
            last: None,
            seed: None,
            info_feed: None,
        }
    }

    /// Take `/v1/info` from the feed's readings instead of reading it.
    pub fn with_info_feed(mut self, feed: watch::Receiver<Sample>) -> Publisher {
        self.info_feed = Some(feed);
        self
    }

    /// `/v1/info` read after `after` (the feed's read count when the tick
    /// started): the feed's next reading, or a read of its own when there
    /// is no feed.
    async fn info(&mut self, after: Option<u64>) -> std::result::Result<NodeInfo, String> {
        let Some(rx) = &mut self.info_feed else {
            return self.sandboxd.info().await.map_err(|e| e.to_string());
        };
        let after = after.unwrap_or_default();
        let reading =
            match tokio::time::timeout(FRESH_READING_WAIT, rx.wait_for(|s| s.seq > after)).await {
                Ok(Ok(sample)) => sample.reading.clone(),
                _ => return Err("no fresh reading of sandboxd info from the feed".into()),
            };
        match reading {
            Reading::Read(info) => Ok(info),
            Reading::Failed { message, .. } => Err(message),
            Reading::NotYet => Err("sandboxd info not read yet".into()),
        }
    }

    /// The first tick publishes from `listing` (just taken by the caller,
    /// if it could list) instead of listing sandboxd a second time at
    /// start-up.
    pub fn seeded(mut self, listing: Option<Vec<SandboxRow>>) -> Publisher {
        self.seed = listing;
        self
    }

    fn skipped(&self, reason: &str) {
        self.metrics.inventory_skipped(reason);
    }

    /// One reconcile. `Err` only when the apply itself failed (retried next
    /// tick); sandboxd failures are a skip, not an error.
    pub async fn tick(&mut self) -> Result<TickOutcome> {
        // The info read comes after the listing, as without the feed.
        let seen = self.info_feed.as_ref().map(|rx| rx.borrow().seq);
        let listed = match self.seed.take() {
            Some(l) => Ok(l),
            None => self.sandboxd.list().await,
        };
        let listing = match listed {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e, "skipping NodeInventory publish this tick: sandboxd listing failed (a failed query is not an empty list)");
                self.skipped("list_failed");
                return Ok(TickOutcome::Skipped);
            }
        };
        let info = match self.info(seen).await {
            Ok(i) => i,
            Err(e) => {
                warn!(error = %e, "skipping NodeInventory publish this tick: sandboxd info failed (no half-empty inventory is published)");
                self.skipped("info_failed");
                return Ok(TickOutcome::Skipped);
            }
        };
        let claims: Vec<_> = self.claims.all().into_iter().map(|(_, c, _)| c).collect();
        let want = desired(&self.node, &self.address, &listing, &info, &claims);
        let decision = decide(self.last.as_ref(), &want, Instant::now(), self.resync);
        if !decision.applies() {
            debug!("NodeInventory unchanged; not applied");
            self.skipped("unchanged");
            return Ok(TickOutcome::Unchanged);
        }
        let choice = match self.choice.clone() {
            Some(c) if !matches!(decision, ApplyDecision::First | ApplyDecision::Resync) => c,
            _ => match self.look_up().await {
                Ok(c) => {
                    self.choice = Some(c.clone());
                    c
                }
                Err(e) => {
                    self.metrics.inventory_applied(false);
                    return Err(e);
                }
            },
        };
        if choice.is_empty() {
            self.choice = None;
            self.metrics.inventory_applied(false);
            return Err(Error::Config(format!(
                "no NodeInventory CRD is installed: the cluster serves {PLURAL} in neither {} nor \
                 {}; install the CRD your operator reads (sandbox-operator's chart, or \
                 crds/<group>_{PLURAL}.yaml), set --inventory-group, or turn off \
                 --publish-inventory",
                KNOWN[0], KNOWN[1]
            )));
        }
        let mut failed = None;
        for group in &choice.publish {
            if let Err(e) = self.apply(group, &want).await {
                failed = Some(e);
            }
        }
        if let Some(e) = failed {
            self.metrics.inventory_applied(false);
            // Look the groups up again before the next attempt.
            self.choice = None;
            return Err(e);
        }
        self.metrics.inventory_applied(true);
        info!(
            entries = want.entries.len(),
            pools = want.pools.len(),
            reason = ?decision,
            groups = ?choice.publish,
            "NodeInventory applied"
        );
        self.last = Some(Applied {
            object: want,
            at: Instant::now(),
        });
        Ok(TickOutcome::Applied(decision))
    }

    /// Where to publish: `--inventory-group`, or the known groups the
    /// cluster serves the CRD in; then looks for a stale object of this
    /// node in the known groups not published to.
    async fn look_up(&self) -> Result<Choice> {
        let served = match groups::served_known(&self.client).await {
            Ok(s) => s,
            // With the flag the group is known anyway; only the stale
            // check needs discovery.
            Err(e) if self.flag.is_some() => {
                warn!(error = %e, "API discovery failed; NodeInventory groups not checked for a stale object");
                Vec::new()
            }
            Err(e) => {
                return Err(Error::kube(
                    format!("look up the groups serving {PLURAL} (API discovery)"),
                    e,
                ));
            }
        };
        let choice = groups::choose(self.flag.as_deref(), &served);
        info!(groups = ?choice.publish, "NodeInventory published in {}", choice.describe());
        for group in KNOWN {
            if choice.publish.iter().any(|g| g == group) {
                self.metrics.inventory_stale(group, false);
            }
        }
        for group in &choice.stale_candidates {
            self.check_stale(group, &choice).await;
        }
        Ok(choice)
    }

    /// Reports an object named after this node in `group`, which this
    /// process does not publish in: nobody updates it any more.
    async fn check_stale(&self, group: &str, choice: &Choice) {
        match api_for(&self.client, group).get_opt(&self.node).await {
            Ok(Some(obj)) => {
                let managers: Vec<String> = obj
                    .metadata
                    .managed_fields
                    .iter()
                    .flatten()
                    .filter_map(|f| f.manager.clone())
                    .collect();
                warn!(
                    group,
                    managers = ?managers,
                    "a NodeInventory named after this node exists in {group}, where vk-sandbox no \
                     longer publishes (it publishes in {}): its readers see stale sandboxes and \
                     pools; delete it (kubectl delete {PLURAL}.{group} {}) or publish there too \
                     (--inventory-group)",
                    choice.describe(),
                    self.node
                );
                self.metrics.inventory_stale(group, true);
            }
            Ok(None) => self.metrics.inventory_stale(group, false),
            Err(e) => warn!(
                group,
                error = %e,
                "cannot look for a stale NodeInventory of this node in {group} (RBAC: get on {PLURAL})"
            ),
        }
    }

    async fn apply(&self, group: &str, want: &NodeInventory) -> Result<()> {
        let mut body = serde_json::to_value(want)
            .map_err(|e| Error::Internal(format!("encoding the NodeInventory: {e}")))?;
        if let Some(obj) = body.as_object_mut() {
            obj.insert("apiVersion".into(), api_version(group).into());
            obj.insert("kind".into(), KIND.into());
            obj.insert("metadata".into(), serde_json::json!({ "name": self.node }));
        }
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        match api_for(&self.client, group)
            .patch(&self.node, &pp, &Patch::Apply(body))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(Error::Config(format!(
                "the NodeInventory CRD {} is not installed: apply crds/{}_{PLURAL}.yaml \
                 (or the operator's CRD), set --inventory-group to the group your operator reads, \
                 or turn off --publish-inventory",
                crd_name(group),
                group
            ))),
            Err(e) => Err(Error::kube(
                format!("applying NodeInventory {} in {group}", self.node),
                e,
            )),
        }
    }

    /// Publish now and then every `interval` until `stop`.
    pub async fn run(self, interval: Duration, health: Arc<Health>, stop: CancellationToken) {
        let span = info_span!("inventory", node = %self.node);
        Periodic::new("NodeInventory publisher", interval)
            .run(Some(&health), &stop, self)
            .instrument(span)
            .await
    }
}

impl Turn for Publisher {
    async fn turn(&mut self, _: &Beat) -> Next {
        let started = Instant::now();
        let result = self.tick().await;
        if let Err(e) = &result {
            warn!(error = %e, "NodeInventory apply failed; retried next tick");
        }
        self.metrics
            .reconciled(Controller::Inventory, started.elapsed(), &result);
        Next::Period
    }
}

/// The NodeInventory API in `group`.
fn api_for(client: &kube::Client, group: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, VERSION, KIND);
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, PLURAL),
    )
}
