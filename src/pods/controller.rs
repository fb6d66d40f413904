//! The Pod controller: a kube-runtime `Controller` over the Pods bound to
//! this node. Reconcile reads the cached Pod and the provider's state, asks
//! [`plan`](super::plan::plan) for one action, carries it out, and
//! converges through requeues with per-Pod back-off. The side loops live in
//! [`sweeps`](super::sweeps).

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::context::{Context, reason};
use super::elsewhere::{self, Before};
use super::failure::{FailedStatus, failed_status};
use super::handback;
use super::lifecycle;
use super::plan::{Step, Tracked, plan};
use super::pod::Pod;
use super::provider::{Created, Deleted};
use super::status;
use super::sweeps::{self, Periods};
use super::synced::Synced;
use super::upkeep;
use super::work_first;
use super::writes::{self, Guard, Written};
use crate::metrics::Controller as MetricController;
use crate::{Error, Result};

/// Healthy Pods are looked at again this often, so drifted status is
/// re-published even without a watch event.
const RESYNC: Duration = Duration::from_secs(300);
/// Reconciles in flight at once. Each mostly waits on the apiserver; the
/// bound keeps a burst (or a restart over thousands of Pods) from putting
/// thousands of requests in the apiserver's queue ahead of the Lease
/// renewal and Node status, which share this client's priority level.
const MAX_CONCURRENT_RECONCILES: u16 = 64;
/// After a conflict, when to look again if the watch has not brought the
/// newer version by then.
const CONFLICT_RETRY: Duration = Duration::from_secs(2);
/// A reconcile running longer than this fails `/livez`: with every
/// sandboxd and apiserver call under its own deadline, only a hang gets
/// there.
const RECONCILE_BOUND: Duration = Duration::from_secs(300);
/// How long a shutdown waits for Events still being posted.
const EVENTS_GRACE: Duration = Duration::from_secs(2);

async fn delete_pod(pod: Arc<Pod>, ctx: &Context) -> Result<Action> {
    match ctx.provider.delete(&pod).await {
        Ok(outcome) => {
            match &outcome {
                Deleted::Preserved { id, reason: why } => {
                    let note = format!("sandbox {id} preserved for the next Pod: {why}");
                    ctx.announce(&pod, reason::PRESERVED, note).await
                }
                Deleted::Released { id, reason: why } => {
                    let note = format!("sandbox {id} released: {why}");
                    ctx.announce(&pod, reason::RELEASED, note).await
                }
                Deleted::LeftToExpire { id, reason: why } => {
                    let note = format!(
                        "sandbox {id} not released ({why}): it was recovered without its \
                         release credential and no node token is configured; it ends at \
                         its deadline"
                    );
                    let r = reason::LEFT_TO_EXPIRE;
                    ctx.warning(&pod, r, r, note).await
                }
                Deleted::Hibernated { id, why, outcome } => {
                    let regarding = Some(pod.object_ref(&()));
                    upkeep::report_hibernation(ctx, id, why, outcome, regarding).await
                }
                Deleted::Kept { .. } | Deleted::Stale | Deleted::NothingHeld => {}
            }
            Ok(writes::force_delete(&ctx.client, &pod).await?.then())
        }
        Err(e) => {
            let note = format!(
                "{}: release failed; the claim is kept and retried: {e}",
                reason::RELEASE_FAILED
            );
            ctx.warning(&pod, reason::DELETE_FAILED, reason::RELEASE_FAILED, note)
                .await;
            Err(Error::Sandboxd(e))
        }
    }
}

async fn create_pod(pod: Arc<Pod>, ctx: &Context) -> Result<Action> {
    let started = std::time::Instant::now();
    let metrics = &*ctx.metrics;
    match ctx.provider.create(&pod).await {
        Ok(created) => {
            // A resumed claim (this same Pod, after a restart) is not news:
            // no Event and no claim latency, and the status is written only
            // if it drifted, so a restart costs the apiserver next to nothing.
            let mut waited = None;
            let mut woke_after = None;
            let (announce, patch) = match created {
                Created::Claimed {
                    id,
                    status,
                    waited: w,
                } => {
                    waited = Some(w);
                    (
                        Some((reason::CLAIMED, format!("claimed sandbox {id}"))),
                        status,
                    )
                }
                Created::Adopted { id, status } => (
                    Some((
                        reason::ADOPTED,
                        format!("adopted sandbox {id}, kept from the previous Pod"),
                    )),
                    status,
                ),
                Created::Resumed { id, status } => {
                    debug!(sandbox = %id, "resumed the Pod's own claim after a restart");
                    (None, status)
                }
                Created::Woken { id, status, waited } => {
                    metrics.claim_transition("wake", "ok");
                    woke_after = Some(waited);
                    (
                        Some((
                            lifecycle::reason::WOKEN,
                            format!("woke sandbox {id}, hibernated while its owner was suspended"),
                        )),
                        status,
                    )
                }
            };
            let sent = started.elapsed();
            // Only for this Pod: if it was replaced meanwhile, the claim
            // stays tracked and the successor's reconcile settles it.
            let written =
                writes::write_status(&ctx.client, metrics, &pod, &patch, Guard::Uid).await?;
            match &written {
                Written::Gone => {
                    info!("the Pod went away before its Running status was written");
                    return Ok(Action::await_change());
                }
                // Until the watch brings this version, decisions about the
                // Pod are made from it (see `Provider::newest`).
                Written::Stored(stored) => ctx.provider.update_tracked(stored),
                _ => {}
            }
            // Only claims and adoptions are timed: a resumed claim's
            // reconcile did not make it.
            if announce.is_some() {
                metrics.claim_written(sent, started.elapsed());
            }
            if let Some(waited) = waited {
                metrics.claim_own(sent.saturating_sub(waited));
            }
            if let Some(waited) = woke_after {
                metrics.resume_own(sent.saturating_sub(waited));
            }
            if let Some((why, note)) = announce {
                ctx.announce(&pod, why, note).await;
            }
            Ok(Action::requeue(RESYNC))
        }
        Err(failure) => {
            if failure.reason == lifecycle::reason::WAKE_FAILED_STATUS {
                metrics.claim_transition("wake", "failed");
            }
            let verdict = handback::decide(
                &pod,
                failure.shortfall,
                ctx.provider.holds(&pod.key()),
                ctx.hand_back_after,
                jiff::Timestamp::now(),
            );
            let retry_within = match verdict {
                handback::Verdict::Now(how, waited) => {
                    let note = handback::note(&ctx.node, how, waited, &failure.message);
                    return hand_back(&pod, ctx, how, note).await;
                }
                handback::Verdict::Wait(left) => Some(left),
                handback::Verdict::Stay(_) => None,
            };
            let status = match failed_status(&pod, failure.cause) {
                // Not the Pod's failure while it may still be handed back to
                // run elsewhere (a Sandbox marked Failed would end).
                FailedStatus::Failed if retry_within.is_some() => FailedStatus::Pending,
                other => other,
            };
            let terminal = match status {
                // vk-sandbox's own trouble while the Pod runs: nothing is
                // written or announced; retried with back-off.
                FailedStatus::Untouched => {
                    return Err(Error::PodCreate {
                        pod: pod.key(),
                        reason: failure.reason,
                        message: failure.message,
                        retry_within,
                    });
                }
                FailedStatus::Pending => false,
                FailedStatus::Failed => true,
            };
            let patch = status::create_failed(terminal, failure.reason, &failure.message);
            let written =
                writes::write_status(&ctx.client, metrics, &pod, &patch, Guard::Uid).await?;
            if written == Written::Gone {
                return Ok(Action::await_change());
            }
            let note = format!("{}: {}", failure.reason, failure.message);
            ctx.warning(&pod, reason::CREATE_FAILED, failure.reason, note)
                .await;
            if terminal {
                return Ok(Action::await_change());
            }
            Err(Error::PodCreate {
                pod: pod.key(),
                reason: failure.reason,
                message: failure.message,
                retry_within,
            })
        }
    }
}

/// Gives `pod` back (see [`handback`]): deleted for its owner to re-create,
/// or marked `Failed` for its controller to replace; a Warning Event
/// (`note`) says why either way. Nothing is held for it, so nothing is
/// released.
async fn hand_back(
    pod: &Arc<Pod>,
    ctx: &Context,
    how: handback::How,
    note: String,
) -> Result<Action> {
    warn!(how = ?how, "handing the Pod back: {note}");
    ctx.warning(pod, handback::REASON, handback::REASON, note.clone())
        .await;
    ctx.metrics.pod_handed_back(match how {
        handback::How::Delete => "deleted",
        handback::How::Fail => "failed",
    });
    match how {
        handback::How::Delete => {
            // Its own grace: the deletion comes back here as a Pod that
            // never ran, whose lost claim replies (if any) are returned.
            writes::delete_this(&ctx.client, pod, None).await?;
        }
        handback::How::Fail => {
            let patch = status::create_failed(true, handback::REASON, &note);
            writes::write_status(&ctx.client, &ctx.metrics, pod, &patch, Guard::Uid).await?;
        }
    }
    Ok(Action::await_change())
}

pub async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action> {
    let k = pod.key();
    let span = info_span!("reconcile", node = %ctx.node, pod = %k);
    async move {
        if !ctx.wait_open().await {
            return Ok(Action::await_change());
        }
        let _working = ctx
            .health
            .as_ref()
            .map(|h| h.working("Pod reconcile", RECONCILE_BOUND));
        let timer = ctx.metrics.reconcile_started(MetricController::Pods);
        let result = reconcile_inner(pod.clone(), &ctx).await;
        drop(timer);
        if result.is_ok() {
            ctx.succeeded(&pod);
        }
        result
    }
    .instrument(span)
    .await
}

async fn reconcile_inner(pod: Arc<Pod>, ctx: &Context) -> Result<Action> {
    let k = pod.key();
    // The side loops work on this key only between reconciles.
    let _key = ctx.provider.lock_key(&k).await;
    let tracked = ctx.provider.tracked(&k);
    let plan = plan(
        &pod,
        Tracked::of(tracked.as_deref(), &pod),
        ctx.provider.holds(&k),
    );
    debug!(step = ?plan.step, "planned");
    if plan.retire_tracked
        && let Some(old) = tracked
    {
        info!(old_uid = ?old.metadata.uid, "Pod replaced under the same name");
        ctx.provider.delete(&old).await.map_err(Error::Sandboxd)?;
    }
    match plan.step {
        Step::DeleteNow => {
            // It never ran: a lost claim reply of its own may be left in
            // sandboxd. Best effort; the vanished sweep retries.
            if let Err(e) = ctx.provider.forget_never_ran(&pod).await {
                warn!(error = %e, "strays of a Pod that never ran not returned yet");
            }
            Ok(writes::force_delete(&ctx.client, &pod).await?.then())
        }
        Step::DeleteAfterProvider => delete_pod(pod, ctx).await,
        Step::Leave => Ok(Action::await_change()),
        Step::Republish => {
            ctx.provider.update_tracked(&pod);
            // Our own last write, when the cache does not show it yet: the
            // status it stored is not drift.
            let pod = ctx.provider.newest(&pod);
            let Some((_, patch)) = ctx.provider.running_status(&pod) else {
                return Ok(Action::requeue(RESYNC));
            };
            // Computed from that version, so written only onto it: a Pod
            // marked Failed meanwhile is never flipped back.
            match writes::write_status(&ctx.client, &ctx.metrics, &pod, &patch, Guard::Fresh)
                .await?
            {
                // The watch brings the newer version, and a reconcile with it.
                Written::Conflict => Ok(Action::requeue(CONFLICT_RETRY)),
                _ => Ok(Action::requeue(RESYNC)),
            }
        }
        Step::Create => {
            if let Some((index, gone_after)) = &ctx.holders {
                let holds = ctx.provider.holds(&k);
                match elsewhere::check(&pod, &ctx.node, holds, &**index, &ctx.client, *gone_after)
                    .await
                {
                    Before::Claim => {}
                    Before::ClaimMoved(note) => {
                        let r = elsewhere::MOVED_NODE;
                        ctx.warning(&pod, r, r, note).await;
                    }
                    Before::HandBack(how, note) => return hand_back(&pod, ctx, how, note).await,
                    Before::Wait(why) => {
                        return Err(Error::PodCreate {
                            pod: k,
                            reason: "ProviderFailed",
                            message: why,
                            retry_within: None,
                        });
                    }
                }
            }
            create_pod(pod, ctx).await
        }
    }
}

pub fn error_policy(pod: Arc<Pod>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .reconcile_failed(MetricController::Pods, error.metric_label());
    let mut wait = ctx.backoff(&pod);
    if let Error::PodCreate {
        retry_within: Some(left),
        ..
    } = error
    {
        // Not past the end of the Pod's hand-back grace.
        wait = wait.min(*left);
    }
    warn!(pod = %pod.key(), error = %error, retry_in = ?wait, "reconcile failed");
    Action::requeue(wait)
}

/// The Pod controller over `spec.nodeName=<node>`; its store also serves
/// the kubelet API's `/pods` and the node's readiness. The cache holds the
/// lean [`Pod`] (only the fields read here are decoded). Of each list, the
/// Pods `can_wait` accepts are queued once `open` is true, after the
/// others ([`work_first`]).
pub fn controller(
    client: &Client,
    node: &str,
    can_wait: impl Fn(&Pod) -> bool + Send + 'static,
    open: watch::Receiver<bool>,
) -> (Controller<Pod>, Synced) {
    let api: Api<Pod> = Api::all(client.clone());
    let wc = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let (reader, writer) = reflector::store();
    let (synced_tx, synced) = Synced::pending();
    // Signalled after the reflector has applied the initial list, so a
    // waiter always finds the store complete.
    let events = watcher(api, wc).reflect(writer).map_ok(move |event| {
        if matches!(event, watcher::Event::InitDone) {
            synced_tx.synced();
        }
        event
    });
    let pods = work_first::work_first(events, can_wait, open);
    let controller = Controller::for_stream(pods, reader).with_config(
        kube::runtime::controller::Config::default().concurrency(MAX_CONCURRENT_RECONCILES),
    );
    (controller, synced)
}

/// Runs the controller and its side loops until `stop` is cancelled.
pub async fn run(
    controller: Controller<Pod>,
    synced: Synced,
    ctx: Arc<Context>,
    stop: CancellationToken,
) {
    run_with(controller, synced, ctx, Periods::default(), stop).await
}

/// [`run`] with the side loops' periods given (tests shorten them).
pub async fn run_with(
    controller: Controller<Pod>,
    synced: Synced,
    ctx: Arc<Context>,
    periods: Periods,
    stop: CancellationToken,
) {
    let store = controller.store();
    let mut side = sweeps::spawn(Arc::clone(&ctx), store, synced, periods, stop.child_token());
    let events = Arc::clone(&ctx);
    controller
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|r| {
            if let Err(e) = r {
                match e {
                    kube::runtime::controller::Error::ReconcilerFailed(..) => {}
                    // A Pod deleted between its event and its turn: normal
                    // after every grace-0 delete, nothing to do.
                    kube::runtime::controller::Error::ObjectNotFound(obj) => {
                        debug!(pod = %obj, "reconcile skipped: the Pod is gone")
                    }
                    other => warn!(error = %other, "pod controller"),
                }
            }
            futures::future::ready(())
        })
        .await;
    stop.cancel();
    while side.join_next().await.is_some() {}
    // Events still being posted get a moment before the process ends.
    if tokio::time::timeout(EVENTS_GRACE, events.announced())
        .await
        .is_err()
    {
        warn!("shutting down with Events not yet posted");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;

    use super::*;

    /// A plain-HTTP apiserver on loopback answering every request with a
    /// 500, counting them.
    async fn failing_apiserver(asked: Arc<AtomicUsize>) -> kube::Config {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let asked = Arc::clone(&asked);
                tokio::spawn(async move {
                    let svc = service_fn(move |_req: http::Request<hyper::body::Incoming>| {
                        asked.fetch_add(1, Ordering::SeqCst);
                        let mut r = http::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from_static(br#"{"kind":"Status","code":500}"#),
                        ));
                        *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                        async move { Ok::<_, std::convert::Infallible>(r) }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        kube::Config::new(format!("http://{addr}").parse().expect("url"))
    }

    /// kube's watcher asks again as soon as it is polled after an error;
    /// the Pod watch relies on kube's `Controller` backing its input off
    /// (its trigger backoff: 800 ms doubling to 30 s). With a backoff of
    /// zero in its place this apiserver was asked 1 407 times in 2 s: a
    /// Pod watch built otherwise would spin through every outage.
    #[tokio::test]
    async fn the_pod_watch_pauses_between_tries_at_a_failing_apiserver() {
        let asked = Arc::new(AtomicUsize::new(0));
        let cfg = failing_apiserver(Arc::clone(&asked)).await;
        let limits = crate::kube_client::Limits::generous(Duration::from_secs(10));
        let client = crate::kube_client::build(cfg, limits).expect("client");
        let (_open_tx, open) = watch::channel(false);
        let (controller, _synced) = controller(&client, "n", |_| false, open);
        let run = controller
            .run(
                |_pod, _ctx: Arc<()>| async { Ok::<_, Error>(Action::await_change()) },
                |_pod, _e, _ctx| Action::await_change(),
                Arc::new(()),
            )
            .for_each(|_| futures::future::ready(()));
        // Ends by the timeout: the controller never does.
        let _ = tokio::time::timeout(Duration::from_secs(2), run).await;
        let asked = asked.load(Ordering::SeqCst);
        assert!(
            (1..=5).contains(&asked),
            "asked {asked} times in 2 s; want a pause between tries"
        );
    }
}
