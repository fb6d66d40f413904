//! `--kube-api-qps` / `--kube-api-burst`: a client-side token bucket in
//! front of every Kubernetes request but watches, as client-go has. The
//! defaults (200/400) are far above what one node needs; they exist so an
//! operator can cap a misbehaving node without touching the apiserver's
//! priority and fairness.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Request;
use kube::client::Body;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::deadline::is_watch;

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
            qps: f64::from(qps).max(f64::MIN_POSITIVE),
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
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    bucket: Arc<Mutex<Bucket>>,
}

impl RateLimitLayer {
    pub fn new(qps: f32, burst: u32) -> RateLimitLayer {
        RateLimitLayer {
            bucket: Arc::new(Mutex::new(Bucket::new(qps, burst, Instant::now()))),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: Arc::clone(&self.bucket),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RateLimited<S> {
    inner: S,
    bucket: Arc<Mutex<Bucket>>,
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
        let wait = if is_watch(req.uri()) {
            Duration::ZERO
        } else {
            self.bucket
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(now)
        };
        let until = now + wait;
        // The request goes out when the returned future is first polled
        // past the wait: the client's futures are lazy.
        let reply = self.inner.call(req);
        Box::pin(async move {
            if !wait.is_zero() {
                tokio::time::sleep_until(until).await;
            }
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
        let mut svc = RateLimitLayer::new(5.0, 2).layer(inner);
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
}
