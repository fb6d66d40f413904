use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::StreamExt;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;

use super::*;

/// What the test apiserver saw.
#[derive(Default)]
pub(crate) struct Seen {
    connections: AtomicUsize,
    pub(crate) http2: AtomicUsize,
    http1: AtomicUsize,
    authorized: AtomicUsize,
    /// Watches are never answered (no headers) while set.
    pub(crate) hold_watches: std::sync::atomic::AtomicBool,
}

/// A TLS server on loopback with a self-signed certificate for
/// 127.0.0.1, offering `alpn`, answering every request with a
/// ConfigMap after `delay`, and a watch with one ConfigMap event after
/// which it stays silent with the connection open (a half-open connection
/// as the client sees it), or, with `Seen::hold_watches`, a watch not at
/// all; returns its kubeconfig-like `Config`.
pub(crate) async fn apiserver(alpn: &[&[u8]], delay: Duration, seen: Arc<Seen>) -> Config {
    crate::crypto::install_provider();
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).expect("cert");
    let der = cert.cert.der().clone();
    let key =
        rustls_pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).expect("key");
    let mut tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![der.clone()], key)
        .expect("server config");
    tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            seen.connections.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let seen = Arc::clone(&seen);
                    async move {
                        match req.version() {
                            http::Version::HTTP_2 => seen.http2.fetch_add(1, Ordering::SeqCst),
                            _ => seen.http1.fetch_add(1, Ordering::SeqCst),
                        };
                        if req.headers().get(http::header::AUTHORIZATION)
                            == Some(&http::HeaderValue::from_static("Bearer tok"))
                        {
                            seen.authorized.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::time::sleep(delay).await;
                        let watch = crate::kube_client::deadline::is_watch(req.uri());
                        if watch && seen.hold_watches.load(Ordering::SeqCst) {
                            futures::future::pending::<()>().await;
                        }
                        let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": "cm", "namespace": "default",
                                "resourceVersion": "1"}});
                        let body = if watch {
                            let event = serde_json::json!({"type": "ADDED", "object": cm});
                            let first = futures::stream::once(async move {
                                Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(
                                    bytes::Bytes::from(event.to_string() + "\n"),
                                ))
                            });
                            // The body never ends and never sends again.
                            let silent = first.chain(futures::stream::pending());
                            http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(silent))
                        } else {
                            http_body_util::BodyExt::boxed(http_body_util::Full::new(
                                bytes::Bytes::from(cm.to_string()),
                            ))
                        };
                        Ok::<_, std::convert::Infallible>(http::Response::new(body))
                    }
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    let mut cfg = Config::new(format!("https://{addr}").parse().expect("url"));
    cfg.default_namespace = "default".into();
    cfg.root_cert = Some(vec![der.to_vec()]);
    cfg.auth_info.token = Some("tok".to_string().into());
    cfg
}

/// One GET, then `n` at once.
async fn concurrent_gets(cfg: Config, n: usize) {
    let limits = crate::kube_client::Limits::generous(Duration::from_secs(10));
    let client = crate::kube_client::build(cfg, limits).expect("client");
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client, "default");
    api.get("cm").await.expect("first get");
    let gets = (0..n).map(|_| api.get("cm"));
    for got in futures::future::join_all(gets).await {
        assert_eq!(got.expect("get").metadata.name.as_deref(), Some("cm"));
    }
}

/// Once a connection is up, requests in flight at once share it (HTTP/2),
/// with the kubeconfig's credentials. (Requests that start together before
/// any connection exists each open one: hyper cannot know the protocol
/// before ALPN has answered.)
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_requests_share_one_http2_connection() {
    let seen = Arc::new(Seen::default());
    let cfg = apiserver(
        &[b"h2", b"http/1.1"],
        Duration::from_millis(200),
        Arc::clone(&seen),
    )
    .await;
    concurrent_gets(cfg, 16).await;
    assert_eq!(seen.http2.load(Ordering::SeqCst), 17);
    assert_eq!(seen.http1.load(Ordering::SeqCst), 0);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
    assert_eq!(seen.authorized.load(Ordering::SeqCst), 17);
}

/// A server without HTTP/2 is spoken to in HTTP/1.1 (a connection per
/// request in flight, as before; the first one is reused).
#[tokio::test(flavor = "multi_thread")]
async fn a_server_without_http2_gets_http1() {
    let seen = Arc::new(Seen::default());
    let cfg = apiserver(
        &[b"http/1.1"],
        Duration::from_millis(200),
        Arc::clone(&seen),
    )
    .await;
    concurrent_gets(cfg, 4).await;
    assert_eq!(seen.http1.load(Ordering::SeqCst), 5);
    assert_eq!(seen.http2.load(Ordering::SeqCst), 0);
    assert_eq!(seen.authorized.load(Ordering::SeqCst), 5);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 4);
}

/// A watch over HTTP/1.1 whose connection goes silent after one event
/// ends with an error once the read timeout passes; before, the stream
/// waited for ever (no HTTP/2 pings on HTTP/1.1, no read timeout).
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_http1_watch_ends_with_an_error() {
    let seen = Arc::new(Seen::default());
    let mut cfg = apiserver(&[b"http/1.1"], Duration::ZERO, Arc::clone(&seen)).await;
    cfg.read_timeout = Some(Duration::from_millis(500));
    let limits = crate::kube_client::Limits::generous(Duration::from_secs(10));
    let client = crate::kube_client::build(cfg, limits).expect("client");
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client, "default");
    let stream = api
        .watch(&kube::api::WatchParams::default(), "0")
        .await
        .expect("watch started");
    let mut stream = std::pin::pin!(stream);
    let first = stream.next().await.expect("one event").expect("decoded");
    assert!(
        matches!(first, kube::api::WatchEvent::Added(_)),
        "{first:?}"
    );
    // Bounded only so a regression fails instead of hanging the suite.
    let next = tokio::time::timeout(Duration::from_secs(20), stream.next())
        .await
        .expect("the silent watch must end, not wait for ever");
    assert!(
        matches!(next, Some(Err(_))),
        "the silent watch must end with an error, got {next:?}"
    );
    assert_eq!(seen.http1.load(Ordering::SeqCst), 1);
    assert_eq!(seen.http2.load(Ordering::SeqCst), 0);
}

/// Connections to the apiserver probe an idle peer (TCP keep-alive), so
/// one whose host vanished is closed by the kernel.
#[tokio::test]
async fn apiserver_connections_use_tcp_keepalive() {
    use std::os::fd::AsRawFd;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cfg = Config::new(format!("http://{addr}").parse().expect("url"));
    let mut tcp = tcp(&cfg);
    let uri: http::Uri = format!("http://{addr}").parse().expect("uri");
    let conn = tower::Service::call(&mut tcp, uri).await.expect("connect");
    let fd = conn.inner().as_raw_fd();
    let opt = |level: libc::c_int, name: libc::c_int| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: a valid socket descriptor and an int-sized out buffer.
        let r = unsafe { libc::getsockopt(fd, level, name, (&raw mut v).cast(), &mut len) };
        assert_eq!(r, 0, "getsockopt");
        v
    };
    assert_eq!(opt(libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
    let secs = |d: Duration| libc::c_int::try_from(d.as_secs()).expect("secs");
    assert_eq!(
        opt(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
        secs(TCP_KEEPALIVE_IDLE)
    );
    assert_eq!(
        opt(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
        secs(TCP_KEEPALIVE_INTERVAL)
    );
    assert_eq!(opt(libc::IPPROTO_TCP, libc::TCP_KEEPCNT), 3);
}
