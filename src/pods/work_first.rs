//! Pods that need work are reconciled before the ones that only need a
//! look, after every (re)list of the Pod watch.
//!
//! A restart over thousands of Running Pods puts each of them in the
//! controller's queue at once, and kube-runtime's scheduler has no
//! priorities: a Pod waiting for its claim took its turn at a random place
//! among the checks of Pods already served (30–330 ms behind them over
//! 2000, docs/benchmarks.md). Here the listed Pods that run already with
//! the claim this node holds for them are held back from the controller
//! until the reconciles are open (the Node registered), so the others are
//! queued alone and go first. Nothing is dropped: each held Pod is handed
//! on exactly once, only later.

use futures::channel::mpsc;
use futures::{Stream, StreamExt, stream};
use kube::runtime::watcher;
use tokio::sync::watch;
use tracing::debug;

use super::pod::Pod;

/// Whether a listed Pod can wait behind the others: not being deleted,
/// Running, and the claim this node holds under its key was made or
/// adopted for this very Pod (`held_for`: that claim's Pod UID). Its
/// reconcile is then a check that changes nothing in the usual case.
pub fn served(pod: &Pod, held_for: Option<&str>) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && !pod.uid().is_empty()
        && held_for == Some(pod.uid())
}

/// The Pods of `events` to reconcile (what kube-runtime's
/// `applied_objects` gives: every applied and listed Pod, in order), except
/// that the listed Pods `can_wait` accepts come after the list, once `open`
/// is true. A list abandoned midway (a new `Init`) forgets what it held:
/// the next list delivers every Pod again. Like the watch itself, the
/// stream does not end; the controller stops by its shutdown signal.
pub fn work_first<S, E>(
    events: S,
    can_wait: impl Fn(&Pod) -> bool + Send + 'static,
    open: watch::Receiver<bool>,
) -> impl Stream<Item = Result<Pod, E>> + Send + 'static
where
    S: Stream<Item = Result<watcher::Event<Pod>, E>> + Send + 'static,
    E: Send + 'static,
{
    let (later_tx, later_rx) = mpsc::unbounded::<Vec<Pod>>();
    let mut held: Vec<Pod> = Vec::new();
    let now = events.filter_map(move |event| {
        let pod = match event {
            Err(e) => Some(Err(e)),
            Ok(watcher::Event::Apply(pod)) => Some(Ok(pod)),
            Ok(watcher::Event::InitApply(pod)) if can_wait(&pod) => {
                held.push(pod);
                None
            }
            Ok(watcher::Event::InitApply(pod)) => {
                debug!(pod = %pod.key(), "listed Pod needs work: queued first");
                Some(Ok(pod))
            }
            Ok(watcher::Event::Init) => {
                held.clear();
                None
            }
            Ok(watcher::Event::InitDone) => {
                debug!(
                    held = held.len(),
                    "listed Pods already served: queued once reconciles open"
                );
                if !held.is_empty() {
                    // The receiver lives as long as this stream's other half.
                    let _ = later_tx.unbounded_send(std::mem::take(&mut held));
                }
                None
            }
            Ok(watcher::Event::Delete(_)) => None,
        };
        futures::future::ready(pod)
    });
    let later = later_rx
        .then(move |batch| {
            let mut open = open.clone();
            async move {
                // Shutting down (the gate dropped): hand them on anyway.
                let _ = open.wait_for(|open| *open).await;
                batch
            }
        })
        .flat_map(|batch| stream::iter(batch.into_iter().map(Ok)));
    stream::select(now, later)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn pod(name: &str, uid: &str, phase: Option<&str>, deleting: bool) -> Pod {
        let mut meta = json!({"name": name, "namespace": "ns", "uid": uid});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-12-07T00:00:00Z");
        }
        let mut p = json!({"metadata": meta, "spec": {"nodeName": "n", "containers": []}});
        if let Some(phase) = phase {
            p["status"] = json!({"phase": phase});
        }
        serde_json::from_value(p).expect("pod")
    }

    #[test]
    fn only_a_running_pod_with_its_own_claim_can_wait() {
        let running = pod("a", "u1", Some("Running"), false);
        assert!(served(&running, Some("u1")));
        // The claim is another Pod's (a replacement to adopt it): work.
        assert!(!served(&running, Some("u0")));
        // No claim here: work (claim or fail).
        assert!(!served(&running, None));
        // Not Running yet, or no status: work.
        assert!(!served(&pod("a", "u1", Some("Pending"), false), Some("u1")));
        assert!(!served(&pod("a", "u1", None, false), Some("u1")));
        // Being deleted: release or keep, work.
        assert!(!served(&pod("a", "u1", Some("Running"), true), Some("u1")));
        // No UID cannot match an empty recorded one.
        assert!(!served(&pod("a", "", Some("Running"), false), Some("")));
    }

    type Ev = Result<watcher::Event<Pod>, std::convert::Infallible>;

    fn names(pods: &[Pod]) -> Vec<String> {
        pods.iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    /// The stream's next Pod, failing (not hanging) when none comes.
    async fn next<S: Stream<Item = Result<Pod, std::convert::Infallible>> + Unpin>(
        out: &mut S,
    ) -> Pod {
        match tokio::time::timeout(Duration::from_secs(2), out.next()).await {
            Ok(Some(Ok(pod))) => pod,
            Ok(Some(Err(e))) => match e {},
            Ok(None) => panic!("the stream ended"),
            Err(_) => panic!("no Pod within 2 s"),
        }
    }

    /// Pods whose name starts with "ok" can wait.
    fn can_wait(p: &Pod) -> bool {
        p.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("ok"))
    }

    #[tokio::test]
    async fn the_listed_pods_that_can_wait_come_once_open_and_nothing_is_lost() {
        let (events_tx, events_rx) = mpsc::unbounded::<Ev>();
        let (open_tx, open_rx) = watch::channel(false);
        let mut out = Box::pin(work_first(events_rx, can_wait, open_rx));
        let p = |n: &str| pod(n, n, Some("Running"), false);
        for ev in [
            watcher::Event::Init,
            watcher::Event::InitApply(p("ok-1")),
            watcher::Event::InitApply(p("new-1")),
            watcher::Event::InitApply(p("ok-2")),
            watcher::Event::InitApply(p("new-2")),
            watcher::Event::InitDone,
            watcher::Event::Apply(p("ok-3")),
            watcher::Event::Delete(p("gone")),
        ] {
            events_tx.unbounded_send(Ok(ev)).expect("send");
        }
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(next(&mut out).await);
        }
        // The list's work first, then a watch event as it comes; the
        // served Pods wait for the gate (deleted Pods are not triggers).
        assert_eq!(names(&got), ["new-1", "new-2", "ok-3"]);
        let waiting = tokio::time::timeout(Duration::from_millis(50), out.next()).await;
        assert!(waiting.is_err(), "handed on before the gate opened");
        open_tx.send_replace(true);
        let mut rest = Vec::new();
        for _ in 0..2 {
            rest.push(next(&mut out).await);
        }
        assert_eq!(names(&rest), ["ok-1", "ok-2"]);

        // A relist once open: held until its end, then at once.
        for ev in [
            watcher::Event::Init,
            watcher::Event::InitApply(p("ok-4")),
            watcher::Event::InitApply(p("new-3")),
            watcher::Event::InitDone,
        ] {
            events_tx.unbounded_send(Ok(ev)).expect("send");
        }
        let mut again = Vec::new();
        for _ in 0..2 {
            again.push(next(&mut out).await);
        }
        assert_eq!(names(&again), ["new-3", "ok-4"]);
    }

    #[tokio::test]
    async fn a_list_abandoned_midway_forgets_what_it_held() {
        let (events_tx, events_rx) = mpsc::unbounded::<Ev>();
        let (_open_tx, open_rx) = watch::channel(true);
        let mut out = Box::pin(work_first(events_rx, can_wait, open_rx));
        let p = |n: &str| pod(n, n, Some("Running"), false);
        for ev in [
            watcher::Event::Init,
            watcher::Event::InitApply(p("ok-old")),
            // The list failed midway and starts over.
            watcher::Event::Init,
            watcher::Event::InitApply(p("ok-new")),
            watcher::Event::InitDone,
        ] {
            events_tx.unbounded_send(Ok(ev)).expect("send");
        }
        let got = next(&mut out).await;
        assert_eq!(names(&[got]), ["ok-new"]);
        let more = tokio::time::timeout(Duration::from_millis(50), out.next()).await;
        assert!(more.is_err(), "the abandoned list's Pod came too: {more:?}");
    }

    #[tokio::test]
    async fn errors_pass_through_in_place() {
        let events = stream::iter(vec![
            Ok(watcher::Event::Apply(pod("new-1", "u", None, false))),
            Err("watch failed"),
            Ok(watcher::Event::Apply(pod("new-2", "u", None, false))),
        ]);
        let (_open_tx, open_rx) = watch::channel(true);
        let got: Vec<_> = work_first(events, can_wait, open_rx)
            .take(3)
            .collect()
            .await;
        assert_eq!(got.len(), 3);
        assert!(matches!(&got[1], Err(e) if *e == "watch failed"));
    }
}
