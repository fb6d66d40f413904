//! The NodeInventory reconcile: at start-up and every `--publish-interval`,
//! read sandboxd (listing, then info), build the desired object and apply it
//! with server-side apply only when it changed or the resync is due. A
//! failed query skips the tick: a half-empty inventory is never published.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::claims::ClaimsStore;
use crate::error::{Error, Result};
use crate::health::Health;
use crate::metrics::{Controller, Metrics};
use crate::node::desired::FIELD_MANAGER;
use crate::periodic::{Beat, Next, Periodic, Turn};
use crate::sandboxd::{SandboxRow, SandboxdClient};

use super::desired::{Applied, ApplyDecision, decide, desired};
use super::types::{KIND, NodeInventory, PLURAL, VERSION, api_version, crd_name};

/// Unchanged inventories are re-applied this often (only changes are applied
/// in between), so an object edited or deleted by hand comes back.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(600);

/// What one tick did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickOutcome {
    Applied(ApplyDecision),
    Unchanged,
    /// sandboxd's listing or info failed.
    Skipped,
}

pub struct Publisher {
    api: Api<DynamicObject>,
    group: String,
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
}

impl Publisher {
    pub fn new(
        client: kube::Client,
        group: &str,
        sandboxd: SandboxdClient,
        claims: Arc<ClaimsStore>,
        node: &str,
        address: &str,
        metrics: Arc<Metrics>,
    ) -> Publisher {
        let gvk = GroupVersionKind::gvk(group, VERSION, KIND);
        let resource = ApiResource::from_gvk_with_plural(&gvk, PLURAL);
        Publisher {
            api: Api::all_with(client, &resource),
            group: group.to_string(),
            sandboxd,
            claims,
            node: node.to_string(),
            address: address.to_string(),
            resync: DEFAULT_RESYNC,
            metrics,
            last: None,
            seed: None,
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
        let info = match self.sandboxd.info().await {
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
        match self.apply(&want).await {
            Ok(()) => {
                self.metrics.inventory_applied(true);
                info!(
                    entries = want.entries.len(),
                    pools = want.pools.len(),
                    reason = ?decision,
                    "NodeInventory applied"
                );
                self.last = Some(Applied {
                    object: want,
                    at: Instant::now(),
                });
                Ok(TickOutcome::Applied(decision))
            }
            Err(e) => {
                self.metrics.inventory_applied(false);
                Err(e)
            }
        }
    }

    async fn apply(&self, want: &NodeInventory) -> Result<()> {
        let mut body = serde_json::to_value(want)
            .map_err(|e| Error::Internal(format!("encoding the NodeInventory: {e}")))?;
        if let Some(obj) = body.as_object_mut() {
            obj.insert("apiVersion".into(), api_version(&self.group).into());
            obj.insert("kind".into(), KIND.into());
            obj.insert("metadata".into(), serde_json::json!({ "name": self.node }));
        }
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        match self.api.patch(&self.node, &pp, &Patch::Apply(body)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(Error::Config(format!(
                "the NodeInventory CRD {} is not installed: apply crds/{}_{PLURAL}.yaml \
                 (or the operator's CRD), set --inventory-group to the group your operator reads, \
                 or turn off --publish-inventory",
                crd_name(&self.group),
                self.group
            ))),
            Err(e) => Err(Error::kube(
                format!("applying NodeInventory {} in {}", self.node, self.group),
                e,
            )),
        }
    }

    /// Publish now and then every `interval` until `stop`.
    pub async fn run(self, interval: Duration, health: Arc<Health>, stop: CancellationToken) {
        let span = info_span!("inventory", node = %self.node, group = %self.group);
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
