//! A deadline on every Kubernetes API call that is not a watch.
//!
//! kube's client bounds connecting (30 s) and writing the request, but not
//! waiting for the reply: an apiserver connection that hangs would hold a
//! reconcile, a Lease renewal or an owner lookup for ever. This layer bounds
//! each call from the moment it is made (a wait for a rate-limit token
//! included) to the last byte of its reply body. Watches are left alone:
//! they are meant to stay open; a silent one is ended by the transport's
//! read timeout (`transport::READ_TIMEOUT`) and by kube's watcher, which
//! gives up on a watch silent past its server-side timeout.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use kube::client::Body;
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service};

/// The deadline of a call: generous for the largest list a node's Pods
/// make, short enough that a hung connection is noticed.
pub const DEFAULT: Duration = Duration::from_secs(30);

/// The error a call past its deadline fails with.
#[derive(Debug, thiserror::Error)]
#[error("the Kubernetes API did not answer within {0:?} (client-side deadline)")]
pub struct DeadlineExceeded(pub Duration);

/// Whether `uri` asks for a watch (`watch=true` or `watch=1`).
pub fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch=True"))
    })
}

#[derive(Debug, Clone, Copy)]
pub struct DeadlineLayer {
    limit: Duration,
}

impl DeadlineLayer {
    pub fn new(limit: Duration) -> DeadlineLayer {
        DeadlineLayer { limit }
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = WithDeadline<S>;

    fn layer(&self, inner: S) -> WithDeadline<S> {
        WithDeadline {
            inner,
            limit: self.limit,
        }
    }
}

#[derive(Debug, Clone)]
pub struct WithDeadline<S> {
    inner: S,
    limit: Duration,
}

type BoxedBody = Box<dyn http_body::Body<Data = Bytes, Error = BoxError> + Send + Unpin>;

impl<S, B> Service<Request<Body>> for WithDeadline<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<DeadlineBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let limit = (!is_watch(req.uri())).then_some(self.limit);
        let reply = self.inner.call(req);
        Box::pin(async move {
            let Some(limit) = limit else {
                let resp = reply.await.map_err(Into::into)?;
                return Ok(resp.map(|b| DeadlineBody::new(b, None)));
            };
            let until = Instant::now() + limit;
            match tokio::time::timeout_at(until, reply).await {
                Ok(resp) => {
                    let resp = resp.map_err(Into::into)?;
                    Ok(resp.map(|b| DeadlineBody::new(b, Some((until, limit)))))
                }
                Err(_) => Err(Box::new(DeadlineExceeded(limit)) as BoxError),
            }
        })
    }
}

/// A reply body that fails once the call's deadline has passed.
pub struct DeadlineBody {
    inner: BoxedBody,
    deadline: Option<(Pin<Box<Sleep>>, Duration)>,
}

impl DeadlineBody {
    fn new<B>(inner: B, until: Option<(Instant, Duration)>) -> DeadlineBody
    where
        B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        DeadlineBody {
            inner: Box::new(http_body_util::BodyExt::map_err(inner, Into::into)),
            deadline: until.map(|(at, limit)| (Box::pin(tokio::time::sleep_until(at)), limit)),
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        if let Some((sleep, limit)) = self.deadline.as_mut()
            && sleep.as_mut().poll(cx).is_ready()
        {
            let limit = *limit;
            return Poll::Ready(Some(Err(Box::new(DeadlineExceeded(limit)))));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_are_recognised() {
        let uri = |s: &str| s.parse::<http::Uri>().expect("uri");
        assert!(is_watch(&uri(
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dn&watch=true&resourceVersion=1"
        )));
        assert!(is_watch(&uri("/api/v1/pods?watch=1")));
        assert!(!is_watch(&uri("/api/v1/pods?fieldSelector=x")));
        assert!(!is_watch(&uri("/api/v1/namespaces/ns/pods/watch")));
        assert!(!is_watch(&uri("/api/v1/pods?watch=false")));
        assert!(!is_watch(&uri("/api/v1/pods?allowWatchBookmarks=true")));
    }

    /// A Kubernetes API that accepts connections and never answers: a
    /// GET fails at the deadline instead of waiting for ever; a watch is
    /// not cut by it.
    #[tokio::test]
    async fn a_hung_apiserver_fails_the_call_at_its_deadline() {
        crate::crypto::install_provider();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        // Accept and hold every connection, answering nothing.
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = listener.accept().await {
                held.push(sock);
            }
        });
        let mut cfg = kube::Config::new(format!("http://{addr}").parse().expect("url"));
        cfg.default_namespace = "default".into();
        let limits = crate::kube_client::Limits::generous(Duration::from_millis(300));
        let client = crate::kube_client::build(cfg, limits).expect("client");
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(client.clone(), "default");
        let started = std::time::Instant::now();
        let got = tokio::time::timeout(Duration::from_secs(10), pods.get("p"))
            .await
            .expect("the call must end at its own deadline, not hang");
        let err = got.expect_err("nothing answered");
        assert!(
            format!("{err:?}").contains("DeadlineExceeded"),
            "want the deadline error, got {err:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));

        // A watch on the same silent server is still waiting after the
        // deadline has passed several times over.
        let wp = kube::api::WatchParams::default();
        let watch = pods.watch(&wp, "0");
        let still_open = tokio::time::timeout(Duration::from_millis(1200), watch).await;
        assert!(
            still_open.is_err(),
            "a watch must not be cut by the call deadline"
        );
    }
}
