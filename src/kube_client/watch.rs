//! Watches that pause after an error.
//!
//! kube's watcher asks the apiserver again as soon as it is polled after
//! an error, and kube's `Controller::for_stream` adds no pause: the Pod
//! watch, built that way, asked a failing apiserver 17 532 times in 2 s
//! (the test below, without the backoff). [`watch`] backs off as
//! client-go's reflector does (kube's default backoff: 800 ms doubling to
//! 30 s, reset after a quiet 120 s). The other watches add the same
//! backoff where they are made.

use futures::Stream;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

/// `api`'s objects as `config` selects them, errors backed off.
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher(api, config).default_backoff()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use futures::StreamExt;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    type Body = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, std::convert::Infallible>;

    /// A plain-HTTP apiserver on loopback recording each request's query:
    /// with `fails`, a 500 for everything; else one ConfigMap listed and a
    /// watch that stays silent. Returns its `Config`.
    async fn apiserver(fails: bool, queries: Arc<Mutex<Vec<String>>>) -> kube::Config {
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
                        async move { Ok::<_, std::convert::Infallible>(answer(fails, &query)) }
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

    fn answer(fails: bool, query: &str) -> http::Response<Body> {
        use http_body_util::BodyExt;
        let full = |code: u16, body: String| {
            let mut r = http::Response::new(
                http_body_util::Full::new(bytes::Bytes::from(body)).boxed_unsync(),
            );
            *r.status_mut() = http::StatusCode::from_u16(code).expect("code");
            r
        };
        if fails {
            return full(
                500,
                r#"{"kind":"Status","code":500,"message":"down"}"#.into(),
            );
        }
        if query.split('&').any(|kv| kv == "watch=true") {
            let silent = futures::stream::pending::<
                Result<hyper::body::Frame<bytes::Bytes>, std::convert::Infallible>,
            >();
            return http::Response::new(http_body_util::StreamBody::new(silent).boxed_unsync());
        }
        let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cm", "namespace": "default", "resourceVersion": "5"}});
        let list = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMapList",
            "metadata": {"resourceVersion": "5"}, "items": [cm]});
        full(200, list.to_string())
    }

    fn api(cfg: kube::Config) -> Api<ConfigMap> {
        let limits = crate::kube_client::Limits::generous(Duration::from_secs(10));
        let client = crate::kube_client::build(cfg, limits).expect("client");
        Api::namespaced(client, "default")
    }

    #[tokio::test]
    async fn a_healthy_apiserver_is_listed_then_watched() {
        let queries = Arc::new(Mutex::new(Vec::new()));
        let events = watch(
            api(apiserver(false, Arc::clone(&queries)).await),
            watcher::Config::default(),
        );
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
        assert_eq!(shapes, ["init", "list cm", "done"]);
        assert!(!queries.lock().expect("queries")[0].contains("watch=true"));
    }

    #[tokio::test]
    async fn a_failing_apiserver_is_asked_again_after_a_pause() {
        let queries = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(0usize));
        let counted = Arc::clone(&errors);
        let events = watch(
            api(apiserver(true, Arc::clone(&queries)).await),
            watcher::Config::default(),
        )
        .for_each(move |e| {
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
        // Without the backoff: 17 532 in 2 s. With it: 2 (at 0 and ~0.8 s).
        assert!(
            (1..=5).contains(&asked),
            "asked {asked} times in 2 s; want a pause between tries"
        );
    }
}
