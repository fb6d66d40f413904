//! The node's Lease renewals as the apiserver stores them: for each, the
//! `renewTime` vk-sandbox stamped when it built the request (before any
//! client-side wait) and the wall-clock time its watch event arrived here
//! (same host, same clock). Their difference is how long a renewal took to
//! get through: the client's rate limiter, the request and the watch
//! delivery.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::watcher;
use kube::{Api, Client};

/// vk-sandbox renews every 10 s after the previous renewal's reply.
const RENEW_INTERVAL: Duration = Duration::from_secs(10);

pub struct LeaseWatch {
    /// (renewTime, seen here).
    renewals: Arc<Mutex<Vec<(Timestamp, Timestamp)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseWatch {
    pub fn start(client: &Client, node: &str) -> LeaseWatch {
        let api: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
        let cfg = watcher::Config::default().fields(&format!("metadata.name={node}"));
        let renewals: Arc<Mutex<Vec<(Timestamp, Timestamp)>>> = Arc::default();
        let log = Arc::clone(&renewals);
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, cfg).boxed();
            while let Ok(Some(ev)) = stream.try_next().await {
                let seen = Timestamp::now();
                if let watcher::Event::Apply(l) | watcher::Event::InitApply(l) = ev
                    && let Some(renewed) = l.spec.and_then(|s| s.renew_time).map(|t| t.0)
                {
                    let mut v = log.lock().unwrap_or_else(|p| p.into_inner());
                    if v.last().is_none_or(|(r, _)| *r != renewed) {
                        v.push((renewed, seen));
                    }
                }
            }
        });
        LeaseWatch { renewals, task }
    }

    /// Waits until `lead` before the next renewal is due, so that it is
    /// issued `lead` after the caller's next step starts.
    pub async fn before_next_renewal(&self, lead: Duration) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let last = loop {
            let last = self
                .renewals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .last()
                .map(|(r, _)| *r);
            if let Some(last) = last {
                break last;
            }
            if tokio::time::Instant::now() > deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let due = last + RENEW_INTERVAL;
        let wait = due
            .duration_since(Timestamp::now())
            .unsigned_abs()
            .saturating_sub(lead);
        if Timestamp::now() < due {
            tokio::time::sleep(wait).await;
        }
    }

    /// Milliseconds from `renewTime` to stored, of the renewals issued
    /// between `from` and `to`.
    pub fn latencies_ms(&self, from: Timestamp, to: Timestamp) -> Vec<f64> {
        self.renewals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(r, _)| *r >= from && *r <= to)
            .map(|(r, seen)| seen.duration_since(*r).as_secs_f64() * 1e3)
            .collect()
    }
}

impl Drop for LeaseWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
