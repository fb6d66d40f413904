//! The Pod controller's side loops, on the one periodic loop
//! (`crate::periodic`). Each runs as its own task, so a slow owner lookup
//! or a sandboxd outage in one never holds up another, and each beats its
//! heartbeat per unit of work, so `/livez` fails only when one stalls. Each
//! unit of work runs under its key's lock (`Provider::lock_key`), as every
//! reconcile does:
//!
//! - **vanished** (every 2 s): provider Delete for tracked Pods that left
//!   the API, and the strays of Pods whose claim had an unknown outcome
//!   that left (each looked at again in the watch cache under its lock: the
//!   pass's snapshot may be older than a replacement); back-off entries of
//!   Pods that are gone; once many Pods are gone, freed memory is handed
//!   back (`crate::memory`). Failures back off per Pod (2 s doubling to
//!   5 min).
//! - **lease expiry** (every 30 s): settled claims past their deadline are
//!   confirmed against sandboxd before their Pod is marked Failed; then the
//!   owners of preserved claims with no Pod here are asked again, each on
//!   its own back-off (`Provider::recheck_preserved`).
//! - **refresh** (every 15 s): lists sandboxd while claims of the previous
//!   run are unverified or the last listing failed, so quarantined rows are
//!   vouched for and stray keys recomputed as soon as sandboxd answers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::runtime::reflector::{ObjectRef, Store};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::context::{Context, reason};
use super::pod::{Pod, key_of};
use super::provider::view;
use super::status;
use super::synced::Synced;
use super::upkeep::LifecycleUpkeep;
use super::writes::{self, Guard, Written};
use crate::backoff::Backoff;
use crate::health::STALL_MARGIN;
use crate::periodic::{Beat, First, Next, Periodic, Turn};

/// Periods of the side loops (tests shorten them).
#[derive(Debug, Clone)]
pub struct Periods {
    pub vanished: Duration,
    pub lease_expiry: Duration,
    pub refresh: Duration,
    /// The lifecycle upkeep (`pods/upkeep.rs`).
    pub upkeep: Duration,
    /// How long past its period a loop may be silent before `/livez` fails.
    pub stall_margin: Duration,
}

impl Default for Periods {
    fn default() -> Periods {
        Periods {
            vanished: Duration::from_secs(2),
            lease_expiry: Duration::from_secs(30),
            refresh: Duration::from_secs(15),
            upkeep: super::upkeep::PERIOD,
            stall_margin: STALL_MARGIN,
        }
    }
}

/// Per-item retry schedule of the vanished sweep.
#[derive(Default)]
pub(super) struct Retries(HashMap<String, (Instant, Backoff)>);

impl Retries {
    fn due(&self, item: &str, now: Instant) -> bool {
        self.0.get(item).is_none_or(|(at, _)| *at <= now)
    }

    fn failed(&mut self, item: &str, now: Instant) -> Duration {
        let (at, backoff) = self.0.entry(item.to_string()).or_insert_with(|| {
            (
                now,
                Backoff::new(Duration::from_secs(2), Duration::from_secs(300)),
            )
        });
        let wait = backoff.failed();
        *at = now + wait;
        wait
    }

    fn succeeded(&mut self, item: &str) {
        self.0.remove(item);
    }

    fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.0.retain(|k, _| keep(k));
    }
}

/// The vanished sweep: tracked Pods that left the API are released or
/// preserved, strays of Pods with an unknown claim outcome that left are
/// returned; back-off of gone Pods is forgotten and, once many Pods are
/// gone, freed memory handed back.
struct Vanished {
    ctx: Arc<Context>,
    store: Store<Pod>,
    retries: Retries,
    trim: crate::memory::Trim,
}

impl Turn for Vanished {
    async fn turn(&mut self, beat: &Beat) -> Next {
        let present: HashMap<String, Option<String>> = self
            .store
            .state()
            .iter()
            .map(|p| (p.key(), p.metadata.uid.clone()))
            .collect();
        sweep_vanished(&self.ctx, &self.store, &present, &mut self.retries, beat).await;
        // Many Pods gone: their memory goes back to the system.
        if self.trim.observe(present.len()) {
            crate::memory::release();
        }
        Next::Period
    }
}

/// The UID of the Pod the watch cache has under `key`, if any.
fn cached_uid(store: &Store<Pod>, key: &str) -> Option<String> {
    let (ns, name) = key.split_once('/')?;
    let pod = store.get(&ObjectRef::new(name).within(ns))?;
    pod.metadata.uid.clone()
}

/// One pass of the vanished sweep. `present` maps the key of every Pod in
/// the watch cache to its UID, as it was when the pass began; each key it
/// says is gone is looked at again under the key's lock, in the cache as
/// it is then (a replacement may have come and been adopted meanwhile).
pub(super) async fn sweep_vanished(
    ctx: &Context,
    store: &Store<Pod>,
    present: &HashMap<String, Option<String>>,
    retries: &mut Retries,
    beat: &Beat,
) {
    let now = Instant::now();
    for k in ctx.provider.tracked_keys() {
        let item = format!("tracked {k}");
        let gone = |uid: Option<&str>| present.get(&k).is_none_or(|u| u.as_deref() != uid);
        if !ctx
            .provider
            .tracked(&k)
            .is_some_and(|old| gone(old.metadata.uid.as_deref()))
            || !retries.due(&item, now)
        {
            continue;
        }
        let _key = ctx.provider.lock_key(&k).await;
        let Some(old) = ctx.provider.tracked(&k) else {
            continue;
        };
        if cached_uid(store, &k) == old.metadata.uid {
            continue;
        }
        match ctx.provider.delete(&old).await {
            Ok(outcome) => {
                retries.succeeded(&item);
                info!(pod = %k, ?outcome, "tracked Pod vanished from the API");
            }
            Err(e) => {
                let wait = retries.failed(&item, now);
                warn!(pod = %k, error = %e, retry_in = ?wait, "release for a vanished Pod failed");
            }
        }
        beat.beat();
    }
    for (k, uid) in ctx.provider.unknown_outcomes() {
        let still = present
            .get(&k)
            .is_some_and(|u| u.as_deref() == Some(uid.as_str()));
        let item = format!("unknown {k} {uid}");
        // A Pod still here is looked at once it runs: a claim sandboxd
        // persisted after its reply timed out may show up beside the one
        // it runs on.
        if (still && ctx.provider.running_on(&k, &uid).is_none()) || !retries.due(&item, now) {
            continue;
        }
        let _key = ctx.provider.lock_key(&k).await;
        let returned = if cached_uid(store, &k).as_deref() == Some(uid.as_str()) {
            let Some(held) = ctx.provider.running_on(&k, &uid) else {
                continue;
            };
            ctx.provider.return_strays_of_running(&k, &uid, &held).await
        } else {
            ctx.provider.return_strays_of_gone(&k, &uid).await
        };
        match returned {
            Ok(true) => retries.succeeded(&item),
            // Too soon after the outcome to be sure: look again later.
            Ok(false) => {
                retries.failed(&item, now);
            }
            Err(e) => {
                let wait = retries.failed(&item, now);
                warn!(pod = %k, error = %e, retry_in = ?wait,
                      "strays of a Pod whose claim outcome was unknown not returned yet");
            }
        }
        beat.beat();
    }
    // Forget what belongs to Pods that are gone.
    ctx.prune_backoff(|obj| present.contains_key(&key_of(obj.namespace.as_deref(), &obj.name)));
    let tracked = ctx.provider.tracked_keys();
    let unknown = ctx.provider.unknown_outcomes();
    retries.retain(|item| {
        tracked.iter().any(|k| item == format!("tracked {k}"))
            || unknown
                .iter()
                .any(|(k, u)| item == format!("unknown {k} {u}"))
    });
}

/// Lease expiry, then the owners of preserved claims asked again.
struct LeaseExpiry {
    ctx: Arc<Context>,
    store: Store<Pod>,
}

impl Turn for LeaseExpiry {
    async fn turn(&mut self, beat: &Beat) -> Next {
        lease_expiry_tick(&self.ctx, &self.store, beat).await;
        self.ctx
            .provider
            .recheck_preserved(beat, Instant::now())
            .await;
        Next::Period
    }
}

/// Lease expiry: settled claims past their deadline are confirmed against
/// sandboxd (a failed list publishes nothing); one sandboxd no longer lists
/// marks its Pod Failed, unless the key changed hands meanwhile.
async fn lease_expiry_tick(ctx: &Context, store: &Store<Pod>, beat: &Beat) {
    let (candidates, listing) = match ctx.provider.expiry_check(jiff::Timestamp::now()).await {
        Ok(Some(found)) => found,
        Ok(None) => return,
        Err(e) => {
            warn!(error = %e, "lease check skipped: sandboxd cannot be listed (a failed list is not an empty one)");
            return;
        }
    };
    for (k, claim) in candidates {
        beat.beat();
        let _key = ctx.provider.lock_key(&k).await;
        if let Some(row) = listing.iter().find(|r| r.id == claim.id) {
            ctx.provider.take_listed_deadline(&k, &claim, row).await;
            continue;
        }
        let (Some(tracked), Some(deadline)) = (ctx.provider.tracked(&k), claim.deadline) else {
            continue;
        };
        if !ctx.provider.holds_id(&k, &claim.id) {
            continue;
        }
        let Some(pod) = store
            .state()
            .into_iter()
            .find(|p| p.key() == k && p.metadata.uid == tracked.metadata.uid)
        else {
            continue;
        };
        if pod.terminal() {
            continue;
        }
        let patch = status::expired(&pod, &view(&claim), deadline);
        // From the cached version only: on a conflict the next tick decides
        // again from the newer one.
        match writes::write_status(&ctx.client, &ctx.metrics, &pod, &patch, Guard::Fresh).await {
            Ok(Written::Stored(_)) => {
                ctx.warning(
                    &pod,
                    reason::LEASE_EXPIRED,
                    reason::LEASE_EXPIRED,
                    format!("sandbox {} lease ended at {deadline}", claim.id),
                )
                .await
            }
            Ok(_) => {}
            Err(e) => warn!(pod = %k, error = %e, "could not publish the expired status"),
        }
    }
}

/// Lists sandboxd while claims of the previous run are unverified or the
/// last listing failed.
struct Refresh {
    ctx: Arc<Context>,
}

impl Turn for Refresh {
    async fn turn(&mut self, _: &Beat) -> Next {
        let provider = &self.ctx.provider;
        if (provider.has_quarantined() || provider.refresh_needed())
            && let Err(e) = provider.refresh().await
        {
            warn!(error = %e, "sandboxd listing failed; claims stay quarantined and strays unknown until it answers");
        }
        Next::Period
    }
}

/// Starts the side loops as tasks of their own; they end when `stop` fires.
/// The vanished sweep and lease expiry start only once the watch has
/// synced, so an incomplete list never makes a tracked Pod look vanished.
/// The refresh's first look is one period in: start-up lists once itself.
pub fn spawn(
    ctx: Arc<Context>,
    store: Store<Pod>,
    synced: Synced,
    periods: Periods,
    stop: CancellationToken,
) -> tokio::task::JoinSet<()> {
    let mut set = tokio::task::JoinSet::new();
    let margin = periods.stall_margin;
    let vanished = Vanished {
        ctx: Arc::clone(&ctx),
        store: store.clone(),
        retries: Retries::default(),
        trim: crate::memory::Trim::default(),
    };
    let upkeep = LifecycleUpkeep::new(Arc::clone(&ctx), store.clone());
    let lease_expiry = LeaseExpiry {
        ctx: Arc::clone(&ctx),
        store,
    };
    {
        let (ctx, stop, synced) = (Arc::clone(&ctx), stop.clone(), synced.clone());
        set.spawn(async move {
            if stop.run_until_cancelled(synced.wait()).await.is_some() {
                Periodic::new("lifecycle upkeep", periods.upkeep)
                    .stall_margin(margin)
                    .run(ctx.health.as_ref(), &stop, upkeep)
                    .await
            }
        });
    }
    {
        let (ctx, stop, synced) = (Arc::clone(&ctx), stop.clone(), synced.clone());
        set.spawn(async move {
            if stop.run_until_cancelled(synced.wait()).await.is_some() {
                Periodic::new("Pod vanished sweep", periods.vanished)
                    .stall_margin(margin)
                    .run(ctx.health.as_ref(), &stop, vanished)
                    .await
            }
        });
    }
    {
        let (ctx, stop) = (Arc::clone(&ctx), stop.clone());
        set.spawn(async move {
            if stop.run_until_cancelled(synced.wait()).await.is_some() {
                Periodic::new("lease expiry", periods.lease_expiry)
                    .first(First::AfterPeriod)
                    .stall_margin(margin)
                    .run(ctx.health.as_ref(), &stop, lease_expiry)
                    .await
            }
        });
    }
    set.spawn(async move {
        let health = ctx.health.clone();
        Periodic::new("sandboxd refresh", periods.refresh)
            .first(First::AfterPeriod)
            .stall_margin(margin)
            .run(health.as_ref(), &stop, Refresh { ctx })
            .await
    });
    set
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::Health;

    /// `/livez` is wired to the real loops: a sandboxd listing that hangs
    /// stalls the refresh loop, liveness names it, and it recovers once the
    /// listing answers. The other loops keep turning meanwhile.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_stalled_loop_fails_liveness_until_it_turns_again() {
        crate::crypto::install_provider();
        let sim = sandboxd_sim::start_local(sandboxd_sim::SimConfig::default())
            .await
            .expect("sim");
        let slow: sandboxd_sim::Fault = serde_json::from_value(
            serde_json::json!({"endpoint": "list", "kind": "slow", "ms": 2500, "times": 1}),
        )
        .expect("fault");
        sim.sim().arm_fault(slow).expect("arm");
        let (mock, handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        std::mem::forget(handle);
        let client = kube::Client::new(mock, "default");
        let (provider, _dir) =
            crate::pods::fixtures::provider_over(&sim, None, client.clone()).await;
        let provider = Arc::new(provider);
        let health = Health::new();
        let metrics = crate::metrics::Metrics::new().expect("metrics");
        let ctx = Arc::new(
            Context::new(client, provider, "node-a", metrics).with_health(Arc::clone(&health)),
        );
        let (store, _writer) = kube::runtime::reflector::store::<Pod>();
        let stop = tokio_util::sync::CancellationToken::new();
        let periods = Periods {
            vanished: Duration::from_millis(50),
            lease_expiry: Duration::from_millis(50),
            refresh: Duration::from_millis(100),
            upkeep: Duration::from_millis(100),
            stall_margin: Duration::from_millis(400),
        };
        let mut loops = spawn(ctx, store, Synced::ready(), periods, stop.clone());
        assert!(health.liveness().is_ok());
        // The first refresh lists (nothing has been listed yet) and hangs.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let stalled = health
            .liveness()
            .expect_err("the hung listing stalls the loop");
        assert!(
            stalled
                .iter()
                .any(|s| s.contains("sandboxd refresh loop silent")),
            "{stalled:?}"
        );
        // The listing answers; the loop turns again and liveness recovers.
        let mut ok = false;
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if health.liveness().is_ok() {
                ok = true;
                break;
            }
        }
        assert!(ok, "liveness never recovered: {:?}", health.liveness());
        stop.cancel();
        while loops.join_next().await.is_some() {}
    }

    #[test]
    fn retries_back_off_per_item_and_forget_what_is_gone() {
        let mut r = Retries::default();
        let t0 = Instant::now();
        assert!(r.due("a", t0));
        assert_eq!(r.failed("a", t0), Duration::from_secs(2));
        assert!(!r.due("a", t0 + Duration::from_secs(1)));
        assert!(r.due("a", t0 + Duration::from_secs(2)));
        assert!(r.due("b", t0), "one item's failure holds no other back");
        assert_eq!(r.failed("a", t0), Duration::from_secs(4));
        r.retain(|i| i != "a");
        assert!(r.due("a", t0));
        r.failed("b", t0);
        r.succeeded("b");
        assert!(r.due("b", t0));
    }
}
