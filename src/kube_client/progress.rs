//! Whether the client's watches make progress: each watch in flight, from
//! the moment it is sent, and when its reply last brought anything (its
//! headers, an event, a bookmark). The server ends a watch after its
//! timeout (290 s, as kube's watcher asks), and kube's watcher gives up on
//! a reply silent for 295 s, so no watch in flight is silent for longer
//! unless it has hung where nothing else looks: a request whose reply never
//! comes over an HTTP/2 connection that still answers pings (the deadline
//! layer leaves watches alone, kube's idle timeout starts with the reply,
//! the transport's read timeout restarts with every ping). `/livez` reads
//! [`WatchProgress::most_silent`] (`crate::health`).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use kube::client::Body;
use tokio::time::Instant;
use tower::{BoxError, Layer, Service};

use super::deadline::is_watch;
use crate::health::Health;

/// How long a watch may go without progress before `/livez` fails: the
/// server-side watch timeout (290 s) and a margin for its reconnection.
pub const STALL_LIMIT: Duration = Duration::from_secs(320);

/// The watches in flight and when each last made progress.
#[derive(Debug, Default)]
pub struct WatchProgress {
    open: Mutex<BTreeMap<u64, Instant>>,
    next: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl WatchProgress {
    pub fn new() -> Arc<WatchProgress> {
        Arc::new(WatchProgress::default())
    }

    /// How long the watch in flight that has gone longest without
    /// progress has been silent; `None` when no watch is in flight.
    pub fn most_silent(&self) -> Option<Duration> {
        let now = Instant::now();
        lock(&self.open)
            .values()
            .map(|last| now.saturating_duration_since(*last))
            .max()
    }

    /// Has `/livez` fail while a watch has gone longer than `limit` without
    /// progress (the daemon passes [`STALL_LIMIT`]).
    pub fn report_to(self: &Arc<Self>, health: &Health, limit: Duration) {
        let watches = Arc::clone(self);
        health.register_progress("Pod watch", limit, move || watches.most_silent());
    }

    fn open(self: &Arc<Self>) -> Tracked {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.open).insert(id, Instant::now());
        Tracked {
            progress: Arc::clone(self),
            id,
        }
    }
}

/// One watch in flight; dropping it ends it.
#[derive(Debug)]
struct Tracked {
    progress: Arc<WatchProgress>,
    id: u64,
}

impl Tracked {
    fn moved(&self) {
        if let Some(last) = lock(&self.progress.open).get_mut(&self.id) {
            *last = Instant::now();
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        lock(&self.progress.open).remove(&self.id);
    }
}

#[derive(Debug, Clone)]
pub struct ProgressLayer {
    progress: Arc<WatchProgress>,
}

impl ProgressLayer {
    pub fn new(progress: Arc<WatchProgress>) -> ProgressLayer {
        ProgressLayer { progress }
    }
}

impl<S> Layer<S> for ProgressLayer {
    type Service = WithProgress<S>;

    fn layer(&self, inner: S) -> WithProgress<S> {
        WithProgress {
            inner,
            progress: Arc::clone(&self.progress),
        }
    }
}

#[derive(Debug, Clone)]
pub struct WithProgress<S> {
    inner: S,
    progress: Arc<WatchProgress>,
}

type BoxedBody = Box<dyn http_body::Body<Data = Bytes, Error = BoxError> + Send + Unpin>;

impl<S, B> Service<Request<Body>> for WithProgress<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ProgressBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // Counted from the call: a watch whose headers never come is silent.
        let tracked = is_watch(req.uri()).then(|| self.progress.open());
        let reply = self.inner.call(req);
        Box::pin(async move {
            let resp = reply.await.map_err(Into::into)?;
            if let Some(t) = &tracked {
                t.moved();
            }
            Ok(resp.map(|b| ProgressBody {
                inner: Box::new(http_body_util::BodyExt::map_err(b, Into::into)),
                tracked,
            }))
        })
    }
}

/// A reply body that reports every frame of a watch as progress; the watch
/// ends with the body.
pub struct ProgressBody {
    inner: BoxedBody,
    tracked: Option<Tracked>,
}

impl http_body::Body for ProgressBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(_))) => {
                if let Some(t) = &self.tracked {
                    t.moved();
                }
            }
            Poll::Ready(_) => self.tracked = None,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A server whose watches answer with one event and then nothing,
    /// and whose other requests answer at once.
    pub(crate) fn silent_after_one_event()
    -> impl Service<Request<Body>, Response = Response<BoxedBody>, Error = BoxError, Future: Send>
    + Clone {
        tower::service_fn(|req: Request<Body>| async move {
            let first = futures::stream::iter([Ok::<_, BoxError>(http_body::Frame::data(
                Bytes::from_static(b"{}\n"),
            ))]);
            let body: BoxedBody = if is_watch(req.uri()) {
                let rest = futures::stream::pending();
                Box::new(http_body_util::StreamBody::new(futures::StreamExt::chain(
                    first, rest,
                )))
            } else {
                Box::new(http_body_util::StreamBody::new(first))
            };
            Ok::<_, BoxError>(Response::new(body))
        })
    }

    pub(crate) fn get(uri: &str) -> Request<Body> {
        Request::get(uri).body(Body::empty()).expect("req")
    }

    /// A watch in flight counts its silence from its last frame; other
    /// requests are not tracked; a watch whose body is dropped or ended is
    /// forgotten.
    #[tokio::test(start_paused = true)]
    async fn a_watchs_silence_is_counted_from_its_last_frame() {
        let progress = WatchProgress::new();
        let mut svc = ProgressLayer::new(Arc::clone(&progress)).layer(silent_after_one_event());
        let list = svc.call(get("/api/v1/pods")).await.expect("list");
        assert_eq!(progress.most_silent(), None, "not a watch");
        drop(list);

        let watch = svc
            .call(get("/api/v1/pods?watch=true"))
            .await
            .expect("watch");
        let mut body = watch.into_body();
        tokio::time::advance(Duration::from_secs(5)).await;
        body.frame().await.expect("one frame").expect("ok");
        assert_eq!(progress.most_silent(), Some(Duration::ZERO));
        tokio::time::advance(Duration::from_secs(400)).await;
        assert_eq!(progress.most_silent(), Some(Duration::from_secs(400)));
        assert!(progress.most_silent() > Some(STALL_LIMIT));
        drop(body);
        assert_eq!(progress.most_silent(), None, "ended with its body");
    }

    /// A watch whose reply never comes is silent from its request on.
    #[tokio::test(start_paused = true)]
    async fn a_watch_never_answered_is_silent_from_its_request() {
        let progress = WatchProgress::new();
        let never = tower::service_fn(|_: Request<Body>| {
            futures::future::pending::<Result<Response<BoxedBody>, BoxError>>()
        });
        let mut svc = ProgressLayer::new(Arc::clone(&progress)).layer(never);
        let waiting = svc.call(get("/api/v1/pods?watch=true"));
        tokio::time::advance(Duration::from_secs(400)).await;
        assert_eq!(progress.most_silent(), Some(Duration::from_secs(400)));
        drop(waiting);
        assert_eq!(progress.most_silent(), None, "given up");
    }

    /// The daemon's wiring over the real transport: a watch request that
    /// the apiserver never answers, on an HTTP/2 connection that still
    /// answers pings (so no transport timeout fires, and kube's idle
    /// timeout has no reply to time), fails `/livez` once it is older than
    /// the limit, naming the watch; `/livez` stayed 200 for ever before.
    /// Given up (the watcher drops it), `/livez` passes again.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_watch_never_answered_over_live_http2_fails_livez() {
        use crate::kube_client::transport::tests::{Seen, apiserver};
        use k8s_openapi::api::core::v1::ConfigMap;

        let seen = Arc::new(Seen::default());
        seen.hold_watches.store(true, Ordering::SeqCst);
        let cfg = apiserver(&[b"h2"], Duration::ZERO, Arc::clone(&seen)).await;
        let health = Health::new();
        let watches = WatchProgress::new();
        let limit = Duration::from_secs(2);
        watches.report_to(&health, limit);
        let limits = crate::kube_client::Limits::generous(Duration::from_secs(10));
        let client = crate::kube_client::build_watched(cfg, limits, watches).expect("client");
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, "default");
        // The connection is up and speaks HTTP/2.
        api.get("cm").await.expect("get");
        assert_eq!(health.liveness(), Ok(()));
        let watch = tokio::spawn(async move {
            let params = kube::api::WatchParams::default();
            api.watch(&params, "0").await.map(|_| ())
        });
        // Bounded only so a regression fails instead of hanging the suite.
        let mut failed = None;
        for _ in 0..300 {
            if let Err(why) = health.liveness() {
                failed = Some(why);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let why = failed.expect("/livez must fail on a watch never answered");
        assert!(
            why.iter().any(|w| w.contains("Pod watch made no progress")),
            "{why:?}"
        );
        assert!(!watch.is_finished(), "the watch still waits");
        assert_eq!(seen.http2.load(Ordering::SeqCst), 2);
        watch.abort();
        let _ = watch.await;
        assert_eq!(health.liveness(), Ok(()), "the watch given up");
    }
}
