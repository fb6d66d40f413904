//! `--kube-api-qps` / `--kube-api-burst` and `--event-qps` /
//! `--event-burst`: client-side token buckets in front of the Kubernetes
//! requests, as client-go has. The defaults are far above what one node
//! needs; they exist so an operator can cap a misbehaving node without
//! touching the apiserver's priority and fairness.
//!
//! Requests go in lanes ([`lane`]), as the kubelet uses separate clients:
//! - the node's heartbeat (its Lease and its Node object) is never
//!   throttled: queued behind a burst of Pod work, a Lease renewal came
//!   late enough for the node to go NotReady and its Pods to be evicted;
//! - Events have their own bucket, so a burst's Events do not halve the
//!   budget of the status writes;
//! - watches are long-lived and opened rarely: not throttled;
//! - everything else shares the `--kube-api-qps` bucket.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Uri};
use kube::client::Body;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::deadline::is_watch;

pub use crate::config::defaults::MIN_QPS;

/// Which budget a request is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// The node's Lease and Node object: never throttled.
    Heartbeat,
    /// Events (`events.k8s.io` and core): the event bucket.
    Events,
    /// Watches: never throttled.
    Watch,
    /// Everything else: the request bucket.
    Requests,
}

/// The lane of a request, from its path (pure).
pub fn lane(uri: &Uri) -> Lane {
    if is_watch(uri) {
        return Lane::Watch;
    }
    let path = uri.path();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        [
            "apis",
            "coordination.k8s.io",
            _,
            "namespaces",
            "kube-node-lease",
            "leases",
            ..,
        ] => Lane::Heartbeat,
        ["api", "v1", "nodes", ..] => Lane::Heartbeat,
        ["apis", "events.k8s.io", _, "namespaces", _, "events", ..]
        | ["api", "v1", "namespaces", _, "events", ..] => Lane::Events,
        _ => Lane::Requests,
    }
}

/// A token bucket: `burst` tokens, refilled at `qps` per second.
#[derive(Debug)]
pub struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    pub fn new(qps: f32, burst: u32, now: Instant) -> Bucket {
        let burst = f64::from(burst.max(1));
        Bucket {
            // Validation refuses lower values; this keeps the arithmetic
            // finite whatever the caller passes.
            qps: f64::from(qps).max(f64::from(MIN_QPS)),
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Takes a token at `now`; returns how long the caller must wait
    /// before its request may go (zero when a token was there). A waiting
    /// caller's token is spent in advance, so callers queue in order.
    pub fn take(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.at = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::try_from_secs_f64(-self.tokens / self.qps).unwrap_or(Duration::MAX)
        }
    }

    /// Gives back the token of a caller that stopped waiting (its deadline
    /// passed, or it was cancelled) before its request went: without it a
    /// queue of abandoned requests would keep every later one waiting past
    /// its own deadline.
    pub fn refund(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.burst);
    }
}

/// The buckets of a client (shared by its clones).
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    requests: Arc<Mutex<Bucket>>,
    events: Arc<Mutex<Bucket>>,
}

impl RateLimitLayer {
    /// `requests`: `--kube-api-qps`/`--kube-api-burst`; `events`:
    /// `--event-qps`/`--event-burst`.
    pub fn new(requests: (f32, u32), events: (f32, u32)) -> RateLimitLayer {
        let now = Instant::now();
        RateLimitLayer {
            requests: Arc::new(Mutex::new(Bucket::new(requests.0, requests.1, now))),
            events: Arc::new(Mutex::new(Bucket::new(events.0, events.1, now))),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            buckets: self.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RateLimited<S> {
    inner: S,
    buckets: RateLimitLayer,
}

/// A reserved token not yet used: given back if dropped armed.
struct Reservation(Option<Arc<Mutex<Bucket>>>);

impl Reservation {
    fn used(mut self) {
        self.0 = None;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(bucket) = self.0.take() {
            bucket.lock().unwrap_or_else(|p| p.into_inner()).refund();
        }
    }
}

impl<S> Service<Request<Body>> for RateLimited<S>
where
    S: Service<Request<Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let now = Instant::now();
        let bucket = match lane(req.uri()) {
            Lane::Heartbeat | Lane::Watch => None,
            Lane::Events => Some(&self.buckets.events),
            Lane::Requests => Some(&self.buckets.requests),
        };
        let (wait, reservation) = match bucket {
            None => (Duration::ZERO, Reservation(None)),
            Some(b) => {
                let wait = b.lock().unwrap_or_else(|p| p.into_inner()).take(now);
                (wait, Reservation(Some(Arc::clone(b))))
            }
        };
        let until = now.checked_add(wait);
        // The request goes out when the returned future is first polled
        // past the wait: the client's futures are lazy.
        let reply = self.inner.call(req);
        Box::pin(async move {
            if !wait.is_zero() {
                match until {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            }
            reservation.used();
            reply.await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_qps() {
        let t0 = Instant::now();
        let mut b = Bucket::new(10.0, 3, t0);
        let ms = Duration::from_millis;
        // The burst goes at once, then one every 100 ms, queued in order.
        assert_eq!([b.take(t0), b.take(t0), b.take(t0)], [Duration::ZERO; 3]);
        assert_eq!(b.take(t0), ms(100));
        assert_eq!(b.take(t0), ms(200));
        // After a quiet second the bucket is full again, never fuller.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(
            [b.take(later), b.take(later), b.take(later)],
            [Duration::ZERO; 3]
        );
        assert_eq!(b.take(later), ms(100));
    }

    #[tokio::test(start_paused = true)]
    async fn requests_beyond_the_burst_wait_watches_do_not() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&calls);
        let inner = tower::service_fn(move |req: Request<Body>| {
            let log = Arc::clone(&log);
            async move {
                log.lock()
                    .expect("log")
                    .push((req.uri().to_string(), Instant::now()));
                Ok::<_, std::convert::Infallible>(())
            }
        });
        let mut svc = RateLimitLayer::new((5.0, 2), (5.0, 2)).layer(inner);
        let t0 = Instant::now();
        let get = || {
            Request::get("/api/v1/pods")
                .body(Body::empty())
                .expect("req")
        };
        let watch = || {
            Request::get("/api/v1/pods?watch=true")
                .body(Body::empty())
                .expect("req")
        };
        let futures = vec![
            svc.call(get()),
            svc.call(get()),
            svc.call(get()),
            svc.call(watch()),
            svc.call(get()),
        ];
        for f in futures {
            f.await.expect("call");
        }
        let at: Vec<(String, u128)> = calls
            .lock()
            .expect("log")
            .iter()
            .map(|(u, t)| (u.clone(), t.duration_since(t0).as_millis()))
            .collect();
        assert_eq!(
            at,
            vec![
                ("/api/v1/pods".into(), 0),
                ("/api/v1/pods".into(), 0),
                ("/api/v1/pods".into(), 200),
                ("/api/v1/pods?watch=true".into(), 200),
                ("/api/v1/pods".into(), 400),
            ]
        );
    }

    /// Records when each request went out, by path and method.
    type Log = Arc<Mutex<Vec<(String, String, Instant)>>>;

    fn recording() -> (
        Log,
        tower::util::BoxCloneService<Request<Body>, (), std::convert::Infallible>,
    ) {
        let calls: Log = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&calls);
        let inner = tower::service_fn(move |req: Request<Body>| {
            let log = Arc::clone(&log);
            async move {
                log.lock().expect("log").push((
                    req.method().to_string(),
                    req.uri().to_string(),
                    Instant::now(),
                ));
                Ok::<_, std::convert::Infallible>(())
            }
        });
        (calls, tower::util::BoxCloneService::new(inner))
    }

    fn req(method: &str, uri: &str) -> Request<Body> {
        Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .expect("req")
    }

    const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n";

    /// When the request to `uri` went out, after `t0`.
    fn sent_after(log: &Log, uri: &str, t0: Instant) -> Vec<Duration> {
        log.lock()
            .expect("log")
            .iter()
            .filter(|(_, u, _)| u == uri)
            .map(|(_, _, t)| t.duration_since(t0))
            .collect()
    }

    /// A Lease renewal issued behind 64 queued Pod requests at 1 QPS goes
    /// out at once (it waited 64 s in the one FIFO before); so does a Node
    /// status write.
    #[tokio::test(start_paused = true)]
    async fn a_lease_renewal_never_queues_behind_pod_traffic() {
        let (log, inner) = recording();
        let mut svc = RateLimitLayer::new((1.0, 1), (1.0, 1)).layer(inner);
        let t0 = Instant::now();
        let mut calls: Vec<_> = (0..64)
            .map(|i| svc.call(req("GET", &format!("/api/v1/namespaces/ns/pods/p{i}"))))
            .collect();
        calls.push(svc.call(req("PUT", LEASE)));
        calls.push(svc.call(req("PATCH", "/api/v1/nodes/n/status")));
        futures::future::join_all(calls).await;
        assert_eq!(sent_after(&log, LEASE, t0), vec![Duration::ZERO]);
        assert_eq!(
            sent_after(&log, "/api/v1/nodes/n/status", t0),
            vec![Duration::ZERO]
        );
        // The Pod requests still keep to their 1 QPS.
        assert_eq!(
            sent_after(&log, "/api/v1/namespaces/ns/pods/p63", t0),
            vec![Duration::from_secs(63)]
        );
    }

    /// A burst's Events are charged to their own bucket: the status writes
    /// behind them go at once, the Events beyond their burst wait.
    #[tokio::test(start_paused = true)]
    async fn events_have_their_own_budget() {
        let (log, inner) = recording();
        let mut svc = RateLimitLayer::new((10.0, 2), (10.0, 2)).layer(inner);
        let t0 = Instant::now();
        let mut calls = Vec::new();
        for i in 0..4 {
            calls.push(svc.call(req(
                "POST",
                &format!("/apis/events.k8s.io/v1/namespaces/ns/events?e={i}"),
            )));
        }
        calls.push(svc.call(req("PATCH", "/api/v1/namespaces/ns/pods/a/status")));
        calls.push(svc.call(req("PATCH", "/api/v1/namespaces/ns/pods/b/status")));
        futures::future::join_all(calls).await;
        let ms = Duration::from_millis;
        for pod in ["a", "b"] {
            let uri = format!("/api/v1/namespaces/ns/pods/{pod}/status");
            assert_eq!(sent_after(&log, &uri, t0), vec![Duration::ZERO], "{pod}");
        }
        let events: Vec<Duration> = (0..4)
            .flat_map(|i| {
                sent_after(
                    &log,
                    &format!("/apis/events.k8s.io/v1/namespaces/ns/events?e={i}"),
                    t0,
                )
            })
            .collect();
        assert_eq!(events, vec![ms(0), ms(0), ms(100), ms(200)]);
    }

    #[test]
    fn lanes() {
        let l = |s: &str| lane(&s.parse::<Uri>().expect("uri"));
        assert_eq!(l(LEASE), Lane::Heartbeat);
        assert_eq!(
            l("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"),
            Lane::Heartbeat
        );
        assert_eq!(l("/api/v1/nodes"), Lane::Heartbeat);
        assert_eq!(l("/api/v1/nodes/n"), Lane::Heartbeat);
        assert_eq!(l("/api/v1/nodes/n/status?fieldManager=x"), Lane::Heartbeat);
        assert_eq!(
            l("/apis/events.k8s.io/v1/namespaces/ns/events"),
            Lane::Events
        );
        assert_eq!(
            l("/apis/events.k8s.io/v1/namespaces/ns/events/e.1"),
            Lane::Events
        );
        assert_eq!(l("/api/v1/namespaces/ns/events"), Lane::Events);
        assert_eq!(l("/api/v1/pods?watch=true"), Lane::Watch);
        assert_eq!(l("/api/v1/nodes?watch=1"), Lane::Watch);
        for other in [
            "/api/v1/namespaces/ns/pods/p/status",
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dn",
            // Another namespace's Leases are not the node's heartbeat.
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            "/apis/sandbox.cocoonstack.io/v1beta1/nodeinventories/n",
            "/api/v1/namespaces/events/pods/p",
            "/",
        ] {
            assert_eq!(l(other), Lane::Requests, "{other}");
        }
    }

    /// Requests that stop waiting (their deadline passed) give their token
    /// back, so the next one is not kept waiting behind abandoned ones.
    #[tokio::test(start_paused = true)]
    async fn an_abandoned_wait_gives_its_token_back() {
        let (log, inner) = recording();
        let mut svc = RateLimitLayer::new((1.0, 1), (1.0, 1)).layer(inner);
        let t0 = Instant::now();
        svc.call(req("GET", "/api/v1/a")).await.expect("first");
        let abandoned: Vec<_> = (0..10).map(|_| svc.call(req("GET", "/x"))).collect();
        drop(abandoned);
        svc.call(req("GET", "/api/v1/b")).await.expect("next");
        assert_eq!(
            sent_after(&log, "/api/v1/b", t0),
            vec![Duration::from_secs(1)]
        );
        assert!(sent_after(&log, "/x", t0).is_empty());
    }

    /// A tiny rate never overflows the wait's arithmetic (1e-30 QPS
    /// panicked with an overflowing `Duration`).
    #[test]
    fn a_tiny_rate_never_panics() {
        let t0 = Instant::now();
        let mut b = Bucket::new(1e-30, 1, t0);
        assert_eq!(b.take(t0), Duration::ZERO);
        // 1 / MIN_QPS (0.01 as an f32): 100 s, give or take its rounding.
        let wait = b.take(t0).as_secs_f64();
        assert!((99.99..100.01).contains(&wait), "{wait}");
        let mut b = Bucket::new(f32::MIN_POSITIVE, u32::MAX, t0);
        for _ in 0..3 {
            b.take(t0);
        }
    }
}
