//! A watch whose initial state comes as a streaming list where the
//! apiserver serves one, else as a paged list.
//!
//! A streaming list (`sendInitialEvents=true`, the WatchList feature,
//! on by default since Kubernetes 1.34) sends the current objects as watch
//! events over one response, so decoding starts with the first object
//! instead of after a page of 500, and there is no page round trip. After a
//! restart over 2000 Pods it is most of what stands between the process
//! start and the first reconcile (docs/benchmarks.md).
//!
//! Two things kube's watcher does not do are done here:
//!
//! - **Fallback.** An apiserver with WatchList off refuses the request
//!   (422: "sendInitialEvents is forbidden for watch unless the WatchList
//!   feature gate is enabled"); kube's watcher would retry it for ever. On
//!   that refusal the watch lists in pages instead, for the rest of the
//!   process.
//! - **Consistency.** kube's watcher asks for the initial events at
//!   `resourceVersion=0`, which the apiserver answers from its cache at
//!   whatever version it holds: a relist from a lagging apiserver of a
//!   highly available plane could go back in time (a Pod seen before
//!   missing again). [`consistent`] drops that `resourceVersion`, so the
//!   apiserver serves a state at least as new as the request, as the paged
//!   list's quorum read does (and as client-go's streaming list asks).
//!
//! Errors back off as client-go's reflector does (kube's default backoff),
//! so an unreachable apiserver is asked again after a pause, not in a loop.

use futures::{Stream, StreamExt, stream};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tracing::info;

/// How a watch gets its initial state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Initial {
    /// Watch events up to the `k8s.io/initial-events-end` bookmark.
    Streaming,
    /// A list in pages, then a watch from its resource version.
    Paged,
}

/// `api`'s objects as `config` selects them, the initial state streamed
/// where the apiserver allows it (module docs), errors backed off.
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    with_fallback(move |initial| {
        let config = match initial {
            Initial::Streaming => config.clone().streaming_lists(),
            Initial::Paged => config.clone(),
        };
        watcher(api.clone(), config)
    })
    .default_backoff()
}

/// The events of `make(Streaming)` until the apiserver refuses a streaming
/// list ([`refuses_streaming`]), then those of `make(Paged)`. The refusal
/// itself is not passed on: nothing was delivered before it (kube's
/// watcher refuses at the start of a list, before its `Init`), and the
/// paged watch starts its own list.
pub fn with_fallback<K, S, F>(make: F) -> impl Stream<Item = S::Item> + Send + 'static
where
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    F: Fn(Initial) -> S + Send + 'static,
    K: Send + 'static,
{
    let first = make(Initial::Streaming).boxed();
    stream::unfold(
        (first, make, false),
        |(mut events, make, mut paged)| async move {
            loop {
                match events.next().await? {
                    Err(e) if !paged && refuses_streaming(&e) => {
                        info!(
                            error = %e,
                            "the apiserver does not serve streaming lists (WatchList off); \
                             listing in pages instead"
                        );
                        events = make(Initial::Paged).boxed();
                        paged = true;
                    }
                    item => return Some((item, (events, make, paged))),
                }
            }
        },
    )
}

/// Whether `e` is an apiserver's refusal of a streaming list: the watch
/// did not start, with a 400 or 422 naming `sendInitialEvents` (WatchList
/// off) or `resourceVersionMatch` (an apiserver older than streaming
/// lists, which forbids it on a watch). Anything else (a network error, a
/// 403, a 5xx) is retried as it is.
pub fn refuses_streaming(e: &watcher::Error) -> bool {
    let watcher::Error::WatchStartFailed(kube::Error::Api(status)) = e else {
        return false;
    };
    matches!(status.code, 400 | 422)
        && (status.message.contains("sendInitialEvents")
            || status.message.contains("resourceVersionMatch"))
}

/// `req` with the `resourceVersion=0` of a streaming list's first watch
/// removed (module docs: a consistent initial state). Every other request
/// is left as it is.
pub fn consistent<B>(mut req: http::Request<B>) -> http::Request<B> {
    if let Some(uri) = consistent_uri(req.uri()) {
        *req.uri_mut() = uri;
    }
    req
}

fn consistent_uri(uri: &http::Uri) -> Option<http::Uri> {
    let query = uri.query()?;
    let pairs: Vec<&str> = query.split('&').collect();
    if !pairs.contains(&"sendInitialEvents=true") || !pairs.contains(&"resourceVersion=0") {
        return None;
    }
    let kept: Vec<&str> = pairs
        .into_iter()
        .filter(|kv| *kv != "resourceVersion=0")
        .collect();
    let path_and_query = format!("{}?{}", uri.path(), kept.join("&"));
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().ok()?);
    http::Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    /// What kube-apiserver v1.37 with `--feature-gates WatchList=false`
    /// answered a streaming list (captured with curl).
    const REFUSAL: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled","reason":"Invalid","details":{"group":"meta.k8s.io","kind":"ListOptions","causes":[{"reason":"FieldValueForbidden","message":"Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled","field":"sendInitialEvents"}]},"code":422}"#;

    fn status(code: u16, message: &str) -> kube::core::Status {
        let mut s: kube::core::Status = serde_json::from_str(REFUSAL).expect("status");
        s.code = code;
        s.message = message.into();
        s
    }

    fn refusal() -> watcher::Error {
        let s: kube::core::Status = serde_json::from_str(REFUSAL).expect("status");
        watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(s)))
    }

    #[test]
    fn only_a_refused_streaming_list_is_a_refusal() {
        assert!(refuses_streaming(&refusal()));
        let start = |s| watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(s)));
        // An apiserver older than streaming lists.
        let old = status(
            422,
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch",
        );
        assert!(refuses_streaming(&start(old)));
        assert!(refuses_streaming(&start(status(
            400,
            "sendInitialEvents: bad"
        ))));
        // Not about streaming lists, or not a refusal: retried as they are.
        assert!(!refuses_streaming(&start(status(
            422,
            "something else is invalid"
        ))));
        assert!(!refuses_streaming(&start(status(
            403,
            "sendInitialEvents forbidden by RBAC"
        ))));
        assert!(!refuses_streaming(&start(status(
            500,
            "sendInitialEvents broke"
        ))));
        let s: kube::core::Status = serde_json::from_str(REFUSAL).expect("status");
        assert!(!refuses_streaming(&watcher::Error::InitialListFailed(
            kube::Error::Api(Box::new(s.clone()))
        )));
        assert!(!refuses_streaming(&watcher::Error::WatchError(Box::new(s))));
        assert!(!refuses_streaming(&watcher::Error::NoResourceVersion));
    }

    fn uri(s: &str) -> http::Uri {
        s.parse().expect("uri")
    }

    #[test]
    fn a_streaming_lists_first_watch_asks_for_a_consistent_state() {
        // What kube's watcher sends for the initial streaming watch.
        let first = uri(
            "https://h:6443/api/v1/pods?&watch=true&timeoutSeconds=290&fieldSelector=spec.nodeName%3Dn\
             &allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=0",
        );
        let got = consistent(http::Request::get(first).body(()).expect("req"));
        assert_eq!(
            got.uri(),
            &uri(
                "https://h:6443/api/v1/pods?&watch=true&timeoutSeconds=290&fieldSelector=spec.nodeName%3Dn\
                 &allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
            )
        );
        // Left as they are: a resumed watch, a list at version 0, a
        // streaming list from a version of its own.
        for kept in [
            "/api/v1/pods?watch=true&allowWatchBookmarks=true&resourceVersion=0",
            "/api/v1/pods?watch=true&resourceVersion=42",
            "/api/v1/pods?resourceVersion=0&resourceVersionMatch=NotOlderThan",
            "/api/v1/pods?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=7",
            "/api/v1/pods",
        ] {
            let got = consistent(http::Request::get(uri(kept)).body(()).expect("req"));
            assert_eq!(got.uri(), &uri(kept), "{kept}");
        }
    }

    type Ev = watcher::Result<watcher::Event<u32>>;
    type Script = stream::Iter<std::vec::IntoIter<Ev>>;
    type Calls = Arc<Mutex<Vec<Initial>>>;

    /// Streams per `Initial` for [`with_fallback`], recording the calls.
    fn scripted(
        streaming: Vec<fn() -> Ev>,
        paged: Vec<fn() -> Ev>,
    ) -> (Calls, impl Fn(Initial) -> Script + Send + 'static) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&calls);
        let make = move |initial| {
            seen.lock().expect("calls").push(initial);
            let script = match initial {
                Initial::Streaming => &streaming,
                Initial::Paged => &paged,
            };
            stream::iter(script.iter().map(|f| f()).collect::<Vec<_>>())
        };
        (calls, make)
    }

    fn shape(e: &Ev) -> String {
        match e {
            Ok(watcher::Event::Init) => "init".into(),
            Ok(watcher::Event::InitApply(n)) => format!("list {n}"),
            Ok(watcher::Event::InitDone) => "done".into(),
            Ok(watcher::Event::Apply(n)) => format!("apply {n}"),
            Ok(watcher::Event::Delete(n)) => format!("delete {n}"),
            Err(e) if refuses_streaming(e) => "refused".into(),
            Err(_) => "error".into(),
        }
    }

    async fn run(make: impl Fn(Initial) -> Script + Send + 'static) -> Vec<String> {
        with_fallback(make).map(|e| shape(&e)).collect().await
    }

    #[tokio::test]
    async fn a_refused_streaming_list_is_listed_in_pages() {
        let (calls, make) = scripted(
            vec![|| Err(refusal()), || Ok(watcher::Event::Apply(9))],
            vec![
                || Ok(watcher::Event::Init),
                || Ok(watcher::Event::InitApply(1)),
                || Ok(watcher::Event::InitDone),
                || Ok(watcher::Event::Apply(2)),
            ],
        );
        assert_eq!(run(make).await, ["init", "list 1", "done", "apply 2"]);
        assert_eq!(
            *calls.lock().expect("calls"),
            [Initial::Streaming, Initial::Paged]
        );
    }

    #[tokio::test]
    async fn a_served_streaming_list_and_other_errors_stay_as_they_are() {
        let (calls, make) = scripted(
            vec![
                || Err(watcher::Error::NoResourceVersion),
                || Ok(watcher::Event::Init),
                || Ok(watcher::Event::InitApply(1)),
                || Ok(watcher::Event::InitDone),
            ],
            vec![|| Ok(watcher::Event::Apply(99))],
        );
        assert_eq!(run(make).await, ["error", "init", "list 1", "done"]);
        assert_eq!(*calls.lock().expect("calls"), [Initial::Streaming]);
    }

    #[tokio::test]
    async fn the_switch_happens_once() {
        // A paged watch's error that looks like a refusal is passed on.
        let (calls, make) = scripted(
            vec![|| Err(refusal())],
            vec![|| Err(refusal()), || Ok(watcher::Event::Init)],
        );
        assert_eq!(run(make).await, ["refused", "init"]);
        assert_eq!(
            *calls.lock().expect("calls"),
            [Initial::Streaming, Initial::Paged]
        );
    }

    /// How the test apiserver answers a streaming list.
    #[derive(Clone, Copy, PartialEq)]
    enum Mode {
        Serves,
        Refuses,
        /// Every request a 500.
        Fails,
    }

    /// A plain-HTTP apiserver on loopback serving one ConfigMap, recording
    /// each request's query; returns its `Config`.
    async fn apiserver(mode: Mode, queries: Arc<Mutex<Vec<String>>>) -> kube::Config {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let queries = Arc::clone(&queries);
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let query = req.uri().query().unwrap_or("").to_string();
                        queries.lock().expect("queries").push(query.clone());
                        async move { Ok::<_, std::convert::Infallible>(answer(mode, &query)) }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        let mut cfg = kube::Config::new(format!("http://{addr}").parse().expect("url"));
        cfg.default_namespace = "default".into();
        cfg
    }

    type Body = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, std::convert::Infallible>;

    fn answer(mode: Mode, query: &str) -> http::Response<Body> {
        use http_body_util::BodyExt;
        let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cm", "namespace": "default", "resourceVersion": "5"}});
        let full = |code: u16, body: String| {
            let mut r = http::Response::new(
                http_body_util::Full::new(bytes::Bytes::from(body)).boxed_unsync(),
            );
            *r.status_mut() = http::StatusCode::from_u16(code).expect("code");
            r
        };
        let watch = query.split('&').any(|kv| kv == "watch=true");
        let streaming = query.split('&').any(|kv| kv == "sendInitialEvents=true");
        match mode {
            Mode::Fails => full(
                500,
                r#"{"kind":"Status","code":500,"message":"down"}"#.into(),
            ),
            Mode::Refuses if streaming => full(422, REFUSAL.into()),
            _ if !watch => full(
                200,
                serde_json::json!({"apiVersion": "v1", "kind": "ConfigMapList",
                    "metadata": {"resourceVersion": "5"}, "items": [cm]})
                .to_string(),
            ),
            _ => {
                // The initial events then the end bookmark for a streaming
                // list; nothing for a plain watch. Then silence.
                let mut lines = String::new();
                if streaming {
                    lines += &serde_json::json!({"type": "ADDED", "object": cm}).to_string();
                    lines += "\n";
                    lines += &serde_json::json!({"type": "BOOKMARK", "object": {
                        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                            "resourceVersion": "5",
                            "annotations": {"k8s.io/initial-events-end": "true"}}}})
                    .to_string();
                    lines += "\n";
                }
                let first = futures::stream::once(async move {
                    Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(bytes::Bytes::from(
                        lines,
                    )))
                });
                let silent = first.chain(futures::stream::pending());
                http::Response::new(http_body_util::StreamBody::new(silent).boxed_unsync())
            }
        }
    }

    async fn first_events(mode: Mode) -> (Vec<String>, Vec<String>) {
        let queries = Arc::new(Mutex::new(Vec::new()));
        let cfg = apiserver(mode, Arc::clone(&queries)).await;
        let limits = crate::kube_client::Limits::generous(Duration::from_secs(10));
        let client = crate::kube_client::build(cfg, limits).expect("client");
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        let events = watch(api, watcher::Config::default());
        let shapes: Vec<String> = tokio::time::timeout(
            Duration::from_secs(10),
            events
                .map(|e| match e {
                    Ok(watcher::Event::Init) => "init".to_string(),
                    Ok(watcher::Event::InitApply(cm)) => {
                        format!("list {}", cm.metadata.name.unwrap_or_default())
                    }
                    Ok(watcher::Event::InitDone) => "done".into(),
                    other => format!("{other:?}"),
                })
                .take(3)
                .collect(),
        )
        .await
        .expect("the initial state within 10 s");
        let seen = queries.lock().expect("queries").clone();
        (shapes, seen)
    }

    #[tokio::test]
    async fn the_initial_state_streams_where_the_apiserver_serves_it() {
        let (events, queries) = first_events(Mode::Serves).await;
        assert_eq!(events, ["init", "list cm", "done"]);
        let first = queries.first().expect("a request");
        assert!(first.contains("sendInitialEvents=true"), "{first}");
        // Consistent: no resourceVersion=0 reaches the apiserver.
        assert!(!first.contains("resourceVersion="), "{first}");
        assert!(
            queries.iter().all(|q| q.contains("watch=true")),
            "no list: {queries:?}"
        );
    }

    #[tokio::test]
    async fn a_refusing_apiserver_is_listed_in_pages() {
        let (events, queries) = first_events(Mode::Refuses).await;
        assert_eq!(events, ["init", "list cm", "done"]);
        assert!(queries[0].contains("sendInitialEvents=true"), "{queries:?}");
        assert!(
            !queries[1].contains("watch=true") && queries[1].contains("limit=500"),
            "a paged list next: {queries:?}"
        );
        assert_eq!(
            queries
                .iter()
                .filter(|q| q.contains("sendInitialEvents"))
                .count(),
            1,
            "asked once: {queries:?}"
        );
    }

    #[tokio::test]
    async fn a_failing_apiserver_is_asked_again_after_a_pause() {
        let queries = Arc::new(Mutex::new(Vec::new()));
        let cfg = apiserver(Mode::Fails, Arc::clone(&queries)).await;
        let limits = crate::kube_client::Limits::generous(Duration::from_secs(10));
        let client = crate::kube_client::build(cfg, limits).expect("client");
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        let errors = Arc::new(Mutex::new(0usize));
        let counted = Arc::clone(&errors);
        let events = watch(api, watcher::Config::default()).for_each(move |e| {
            if e.is_err() {
                *counted.lock().expect("errors") += 1;
            }
            futures::future::ready(())
        });
        // Ends by the timeout: the watch never does.
        let _ = tokio::time::timeout(Duration::from_secs(2), events).await;
        let asked = queries.lock().expect("queries").len();
        let errors = *errors.lock().expect("errors");
        assert!(errors >= 1, "the failure is reported");
        // Without a backoff the watch asks again at once: hundreds in 2 s.
        assert!(
            (1..=5).contains(&asked),
            "asked {asked} times in 2 s; want a pause between tries"
        );
    }
}
