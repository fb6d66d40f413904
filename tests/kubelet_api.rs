//! The kubelet HTTPS API over real TLS on 127.0.0.1: routes, redirects,
//! 404/405, authentication and authorization refusals, client
//! certificates, HTTP/2, and serving-certificate hot reload.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use reqwest::StatusCode;
use support::kubelet::StaticPods;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use vk_sandbox::config::TlsFiles;
use vk_sandbox::kubelet::auth::{Authenticator, Authorizer, Decision, RequestAttributes};
use vk_sandbox::kubelet::server::serve_on_own_thread;
use vk_sandbox::kubelet::tls::{self, KubeletTls};
use vk_sandbox::kubelet::{KubeletAuth, KubeletState, UserInfo, router};
use vk_sandbox::metrics::Metrics;
use vk_sandbox::pods::pod::Pod;

use vk_sandbox::kubelet::routes::NO_CONTAINER_LOG;

fn pod(ns: &str, name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "base:24.04"}]}
    }))
    .expect("pod")
}

/// Tokens "good-<user>" authenticate as <user>.
#[derive(Default)]
struct Tokens {
    calls: AtomicUsize,
}

impl Authenticator for Tokens {
    fn authenticate_token<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Option<UserInfo>, String>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let user = token.strip_prefix("good-").map(|name| UserInfo {
            name: name.to_string(),
            ..UserInfo::default()
        });
        Box::pin(async move { Ok(user) })
    }
}

/// Allows the listed users; records what it was asked.
struct Allow {
    users: Vec<&'static str>,
    seen: std::sync::Mutex<Vec<(String, RequestAttributes)>>,
}

impl Allow {
    fn users(users: &[&'static str]) -> Arc<Allow> {
        Arc::new(Allow {
            users: users.to_vec(),
            seen: std::sync::Mutex::new(Vec::new()),
        })
    }
}

impl Authorizer for Allow {
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        attrs: &'a RequestAttributes,
    ) -> BoxFuture<'a, Result<Decision, String>> {
        self.seen
            .lock()
            .unwrap()
            .push((user.name.clone(), attrs.clone()));
        let d = if self.users.contains(&user.name.as_str()) {
            Decision::Allow
        } else {
            Decision::Deny("no RBAC rule allows it".into())
        };
        Box::pin(async move { Ok(d) })
    }
}

struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<vk_sandbox::Result<()>>,
    metrics: Arc<Metrics>,
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.addr.port())
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("server stops in time")
            .expect("join")
            .expect("serve ok");
    }
}

async fn start(
    tls: &KubeletTls,
    auth: Option<Arc<KubeletAuth>>,
    client_roots: Option<Arc<rustls::RootCertStore>>,
    pods: Arc<StaticPods>,
) -> Server {
    vk_sandbox::crypto::install_provider();
    let metrics = Metrics::new().expect("metrics");
    let state = KubeletState {
        node_name: "node-a".into(),
        pods,
        auth,
        metrics: metrics.clone(),
        streaming: None,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = tls.server_config(client_roots).expect("server config");
    let stop = CancellationToken::new();
    // As the daemon serves it: on a thread of its own.
    let task = tokio::spawn(serve_on_own_thread(
        listener,
        config,
        router(state),
        stop.clone(),
    ));
    Server {
        addr,
        stop,
        task,
        metrics,
    }
}

fn self_signed_tls() -> KubeletTls {
    KubeletTls::init(&TlsFiles::default(), "node-a", Some("127.0.0.1")).expect("tls")
}

fn client() -> reqwest::Client {
    client_builder().build().expect("client")
}

fn client_builder() -> reqwest::ClientBuilder {
    vk_sandbox::crypto::install_provider();
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .redirect(reqwest::redirect::Policy::none())
        .tls_info(true)
        .timeout(Duration::from_secs(10))
}

async fn text(resp: reqwest::Response) -> (StatusCode, Option<String>, String) {
    let status = resp.status();
    let ct = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_string());
    (status, ct, resp.text().await.expect("body"))
}

async fn get(
    server: &Server,
    c: &reqwest::Client,
    path: &str,
) -> (StatusCode, Option<String>, String) {
    text(c.get(server.url(path)).send().await.expect("request")).await
}

// Auth off: container logs answer that sandboxes keep none; stats summary,
// resource metrics, healthz, pods and running pods answer in a kubelet's
// shape (empty where vk-sandbox has nothing); redirects, 404 and 405.
#[tokio::test]
async fn routes_without_auth() {
    let pods = Arc::new(StaticPods::new(
        vec![pod("ns1", "a"), pod("ns2", "b")],
        vec![pod("ns1", "a")],
    ));
    let server = start(&self_signed_tls(), None, None, pods.clone()).await;
    let c = client();

    let (code, _, body) = get(&server, &c, "/containerLogs/ns/p/c").await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(body, NO_CONTAINER_LOG);
    let (code, _, body) = get(&server, &c, "/containerLogs/ns/p/c?tailLines=-1").await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("tailLines"), "{body}");
    for bad in [
        "follow=x",
        "previous=2",
        "timestamps=yes",
        "limitBytes=0",
        "sinceSeconds=0",
        "sinceTime=nope",
        "sinceTime=2026-01-01T00:00:00Z&sinceSeconds=5",
    ] {
        let (code, _, body) = get(&server, &c, &format!("/containerLogs/ns/p/c?{bad}")).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    let (code, _, _) = get(
        &server,
        &c,
        "/containerLogs/ns/p/c?tailLines=10&follow=true&sinceTime=2026-01-01T00:00:00Z",
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);

    let (code, ct, body) = get(&server, &c, "/stats/summary").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(ct.as_deref(), Some("application/json"));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["node"]["nodeName"], "node-a");
    assert!(v["node"]["startTime"].is_null());
    assert_eq!(v["pods"], serde_json::json!([]));
    assert_eq!(get(&server, &c, "/stats/summary/").await.0, StatusCode::OK);

    for path in ["/metrics/resource", "/metrics/resource/"] {
        let (code, ct, body) = get(&server, &c, path).await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(ct.as_deref(), Some("text/plain; version=0.0.4"));
        assert!(body.ends_with("scrape_error 0\n"), "{body}");
        assert!(
            body.lines()
                .all(|l| l.starts_with('#') || l.starts_with("scrape_error")),
            "no samples without sandboxes: {body}"
        );
    }

    let (code, _, body) = get(&server, &c, "/healthz").await;
    assert_eq!((code, body.as_str()), (StatusCode::OK, "ok"));

    let (code, ct, body) = get(&server, &c, "/pods").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(ct.as_deref(), Some("application/json"));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "PodList");
    assert_eq!(v["apiVersion"], "v1");
    let names: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);

    let (code, _, body) = get(&server, &c, "/runningpods/").await;
    assert_eq!(code, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    assert_eq!(v["items"][0]["metadata"]["namespace"], "ns1");

    // The lists are live.
    pods.set_node_pods(vec![]);
    let (_, _, body) = get(&server, &c, "/pods").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["items"], serde_json::json!([]));

    // Strict-slash redirects, query kept.
    let resp = c.get(server.url("/runningpods")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(resp.headers()["location"], "/runningpods/");
    let resp = c.get(server.url("/pods/?x=1")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(resp.headers()["location"], "/pods?x=1");

    // Unknown paths and wrong methods.
    for path in ["/nope", "/metrics", "/containerLogs/ns/p", "/spec/"] {
        let (code, _, body) = get(&server, &c, path).await;
        assert_eq!(code, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(body.trim_end(), "404 request not found", "{path}");
    }
    let resp = c.post(server.url("/pods")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    let resp = c.delete(server.url("/stats/summary")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    let resp = c
        .put(server.url("/containerLogs/ns/p/c"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);

    // Counted by route template and code.
    let requests = |route: &str, code: &str| {
        server.metrics.value(
            "vk_sandbox_kubelet_requests_total",
            &[("route", route), ("code", code)],
        )
    };
    assert_eq!(requests("/pods", "200"), Some(2.0));
    assert_eq!(
        requests("/containerLogs/{ns}/{pod}/{container}", "400"),
        Some(10.0)
    );
    assert_eq!(requests("unmatched", "404"), Some(4.0));

    server.stop().await;
}

// exec, attach and port-forward check their options and the upgrade before
// anything else; without streaming configured (no sandboxd data plane) they
// answer 503 after that, and nothing is executed. The streaming itself:
// tests/kubelet_streaming.rs and tests/e2e_streaming.rs.
#[tokio::test]
async fn exec_attach_port_forward_checks_before_upgrade() {
    let server = start(&self_signed_tls(), None, None, Arc::default()).await;
    let c = client();
    let h1 = client_builder().http1_only().build().unwrap();
    for route in ["exec", "attach"] {
        for uid_seg in ["", "uid-1/"] {
            let base = format!("/{route}/ns/p/{uid_seg}c");
            let (code, _, body) = get(&server, &c, &base).await;
            assert_eq!(code, StatusCode::BAD_REQUEST, "{base}: no streams");
            assert!(body.contains("at least 1 of stdin"), "{body}");
            let (code, _, _) = get(&server, &c, &format!("{base}?tty=1&error=1")).await;
            assert_eq!(code, StatusCode::BAD_REQUEST, "{base}: tty + stderr");
            let (code, _, body) = get(&server, &c, &format!("{base}?command=sh&output=1")).await;
            assert_eq!(code, StatusCode::BAD_REQUEST, "{base}: not an upgrade");
            assert!(body.contains("missing upgrade headers"), "{body}");

            let query = "?command=sh&input=1&output=1&tty=1";
            let resp = h1
                .post(server.url(&format!("{base}{query}")))
                .header("Connection", "Upgrade")
                .header("Upgrade", "SPDY/3.1")
                .header("X-Stream-Protocol-Version", "v4.channel.k8s.io")
                .send()
                .await
                .unwrap();
            let (code, _, body) = text(resp).await;
            assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{base}");
            assert!(body.contains("streaming is not configured"), "{body}");
        }
    }
    // exec needs a command; form body options count for POST.
    let resp = c
        .post(server.url("/exec/ns/p/c"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body("output=1")
        .send()
        .await
        .unwrap();
    let (code, _, body) = text(resp).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(body.contains("no command"), "{body}");

    for path in ["/portForward/ns/p", "/portForward/ns/p/uid-1"] {
        let (code, _, body) = get(&server, &c, path).await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        assert!(body.contains("missing upgrade headers"), "{body}");
        let resp = h1
            .post(server.url(path))
            .header("Connection", "Upgrade")
            .header("Upgrade", "SPDY/3.1")
            .header("X-Stream-Protocol-Version", "portforward.k8s.io")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    server.stop().await;
}

#[tokio::test]
async fn http1_and_h2_are_served() {
    let server = start(&self_signed_tls(), None, None, Arc::default()).await;
    let resp = client().get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.version(), reqwest::Version::HTTP_2, "ALPN picks h2");
    let h1 = client_builder().http1_only().build().unwrap();
    let resp = h1.get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.version(), reqwest::Version::HTTP_11);
    assert_eq!(resp.status(), StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn tls_below_1_2_is_refused() {
    let server = start(&self_signed_tls(), None, None, Arc::default()).await;
    // No TLS stack here can speak 1.1 any more, so send a TLS 1.1
    // ClientHello by hand: the server must answer with a fatal alert, never
    // a ServerHello.
    let hello = tls11_client_hello();
    let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    s.write_all(&hello).await.unwrap();
    let mut answer = [0u8; 7];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut answer))
        .await
        .expect("the server answers")
        .expect("read the answer");
    assert_eq!(
        answer[0], 0x15,
        "an alert record, not a handshake: {answer:?}"
    );
    assert_eq!(answer[5], 2, "a fatal alert: {answer:?}");
    // rustls says handshake_failure (40); protocol_version (70) would do.
    assert!(
        matches!(answer[6], 40 | 70),
        "a handshake refusal: {answer:?}"
    );
    server.stop().await;
}

/// A minimal TLS 1.1 ClientHello (legacy version 0x0302, no
/// supported_versions extension), in a TLS 1.0 record.
fn tls11_client_hello() -> Vec<u8> {
    let mut body = vec![0x03, 0x02];
    body.extend_from_slice(&[7u8; 32]); // random
    body.push(0); // session id
    let suites: [u16; 3] = [0xc013, 0xc014, 0x002f];
    body.extend_from_slice(&((suites.len() * 2) as u16).to_be_bytes());
    for suite in suites {
        body.extend_from_slice(&suite.to_be_bytes());
    }
    body.extend_from_slice(&[1, 0]); // compression: null
    let mut handshake = vec![1u8];
    handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

// The self-signed certificate verifies for 127.0.0.1 against itself.
#[tokio::test]
async fn self_signed_cert_verifies_for_loopback() {
    vk_sandbox::crypto::install_provider();
    let (key, pem) = tls::self_signed("node-a", None).unwrap();
    let server = start(&KubeletTls::from_key(key), None, None, Arc::default()).await;
    let strict = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(pem.as_bytes()).unwrap()])
        .build()
        .unwrap();
    let resp = strict.get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    server.stop().await;
}

struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn test_ca(name: &str) -> TestCa {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).unwrap();
    TestCa {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// PEM of a client certificate (CN, O) signed by `ca`, plus its key.
fn client_identity(ca: &TestCa, cn: &str, orgs: &[&str]) -> reqwest::Identity {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, cn);
    for o in orgs {
        params.distinguished_name.push(DnType::OrganizationName, *o);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    let pem = format!("{}{}", cert.pem(), key.serialize_pem());
    reqwest::Identity::from_pem(pem.as_bytes()).unwrap()
}

async fn start_with_auth(anonymous: bool, allow: Arc<Allow>, ca: &TestCa) -> (Server, Arc<Tokens>) {
    let tokens = Arc::new(Tokens::default());
    let auth = Arc::new(KubeletAuth::new(tokens.clone(), allow, "node-a", anonymous));
    let roots = tls::roots_from_pem(ca.pem.as_bytes(), "test CA").unwrap();
    let server = start(&self_signed_tls(), Some(auth), Some(roots), Arc::default()).await;
    (server, tokens)
}

#[tokio::test]
async fn auth_refuses_and_admits() {
    let ca = test_ca("test client CA");
    let allow = Allow::users(&["alice", "system:kube-apiserver"]);
    let (server, tokens) = start_with_auth(false, allow.clone(), &ca).await;
    let c = client();

    // /healthz needs nothing.
    assert_eq!(get(&server, &c, "/healthz").await.0, StatusCode::OK);

    // No certificate, no token: 401 everywhere else, even unknown paths.
    for path in [
        "/pods",
        "/runningpods/",
        "/stats/summary",
        "/nope",
        "/pods/",
    ] {
        let (code, _, body) = get(&server, &c, path).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(body.trim(), "Unauthorized");
    }
    let resp = c
        .post(server.url("/exec/ns/p/c?output=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    // A token the TokenReview rejects: 401.
    let resp = c
        .get(server.url("/pods"))
        .bearer_auth("bogus")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);

    // Valid token, authorized user: through.
    let resp = c
        .get(server.url("/pods"))
        .bearer_auth("good-alice")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    // Valid token, user without RBAC: 403 naming the attributes.
    let resp = c
        .get(server.url("/stats/summary"))
        .bearer_auth("good-mallory")
        .send()
        .await
        .unwrap();
    let (code, _, body) = text(resp).await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    assert!(body.contains("user=mallory"), "{body}");
    assert!(body.contains("verb=get"), "{body}");
    assert!(body.contains("resource=nodes"), "{body}");
    assert!(body.contains("subresource(s)=[stats]"), "{body}");
    assert!(body.contains("no RBAC rule allows it"), "{body}");

    // The token is reviewed once and then cached.
    for _ in 0..3 {
        let resp = c
            .get(server.url("/healthz"))
            .bearer_auth("good-alice")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let resp = c
            .get(server.url("/pods"))
            .bearer_auth("good-alice")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
    assert_eq!(
        tokens.calls.load(Ordering::SeqCst),
        3,
        "bogus, alice, mallory"
    );

    // A client certificate from the client CA: user = CN, no token needed.
    let apiserver = client_builder()
        .identity(client_identity(
            &ca,
            "system:kube-apiserver",
            &["system:masters"],
        ))
        .build()
        .unwrap();
    let (code, _, _) = get(&server, &apiserver, "/pods").await;
    assert_eq!(code, StatusCode::OK);
    let (code, _, body) = get(&server, &apiserver, "/containerLogs/ns/p/c").await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(body, NO_CONTAINER_LOG);
    // A certificate for a user without RBAC: 403.
    let other = client_builder()
        .identity(client_identity(&ca, "bob", &[]))
        .build()
        .unwrap();
    assert_eq!(get(&server, &other, "/pods").await.0, StatusCode::FORBIDDEN);
    // A certificate from another CA: the handshake fails.
    let foreign_ca = test_ca("someone else");
    let foreign = client_builder()
        .identity(client_identity(&foreign_ca, "alice", &[]))
        .build()
        .unwrap();
    assert!(foreign.get(server.url("/pods")).send().await.is_err());

    // What the authorizer saw: nodes/<sub> named node-a, verbs by method.
    let seen = allow.seen.lock().unwrap().clone();
    let find = |user: &str, sub: &str| {
        seen.iter()
            .find(|(u, a)| u == user && a.subresource == sub)
            .map(|(_, a)| a.clone())
    };
    let a = find("system:kube-apiserver", "proxy").expect("apiserver proxy check");
    assert_eq!(
        (a.verb, a.resource, a.name.as_str()),
        ("get", "nodes", "node-a")
    );
    assert!(find("mallory", "stats").is_some());

    let failures = |reason: &str| {
        server
            .metrics
            .value(
                "vk_sandbox_kubelet_auth_failures_total",
                &[("reason", reason)],
            )
            .unwrap_or(0.0)
    };
    assert!(failures("unauthenticated") >= 7.0);
    assert_eq!(failures("forbidden"), 2.0);
    server.stop().await;
}

#[tokio::test]
async fn anonymous_auth_is_authorized_as_system_anonymous() {
    let ca = test_ca("ca");
    let (server, _) = start_with_auth(true, Allow::users(&[]), &ca).await;
    let (code, _, body) = get(&server, &client(), "/pods").await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    assert!(body.contains("user=system:anonymous"), "{body}");
    server.stop().await;

    let (server, _) = start_with_auth(true, Allow::users(&["system:anonymous"]), &ca).await;
    assert_eq!(get(&server, &client(), "/pods").await.0, StatusCode::OK);
    server.stop().await;
}

fn write_pair(dir: &Path, cn: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    let cert = params.self_signed(&key).unwrap();
    let c = dir.join("tls.crt");
    let k = dir.join("tls.key");
    // Write beside and rename, as a rotation would.
    std::fs::write(dir.join("tls.crt.new"), cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key.new"), key.serialize_pem()).unwrap();
    std::fs::rename(dir.join("tls.key.new"), &k).unwrap();
    std::fs::rename(dir.join("tls.crt.new"), &c).unwrap();
    (c, k)
}

async fn served_cn(server: &Server) -> String {
    // A fresh client per probe: a new connection, a new handshake.
    let resp = client()
        .get(server.url("/healthz"))
        .send()
        .await
        .expect("request");
    let info = resp
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .expect("tls info");
    let der = info.peer_certificate().expect("peer cert").to_vec();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    cert.subject()
        .iter_common_name()
        .next()
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn certificate_files_are_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_pair(dir.path(), "first");
    let files = TlsFiles {
        cert: Some(cert.clone()),
        key: Some(key.clone()),
    };
    let tls = KubeletTls::init(&files, "node-a", None).unwrap();
    assert!(!tls.is_self_signed());
    let server = start(&tls, None, None, Arc::default()).await;
    let stop_watch = CancellationToken::new();
    let metrics = server.metrics.clone();
    let watcher = tokio::spawn(tls.clone().watch(
        Duration::from_millis(50),
        metrics.clone(),
        stop_watch.clone(),
    ));
    assert_eq!(served_cn(&server).await, "first");

    let wait_for_cn = |want: &'static str| {
        let server = &server;
        async move {
            for _ in 0..100 {
                if served_cn(server).await == want {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("the served certificate never became {want}");
        }
    };

    // Sleep past coarse mtime granularity, then rotate.
    tokio::time::sleep(Duration::from_millis(20)).await;
    write_pair(dir.path(), "second");
    wait_for_cn("second").await;
    assert_eq!(
        metrics.value(
            "vk_sandbox_kubelet_cert_reloads_total",
            &[("result", "success")]
        ),
        Some(1.0)
    );

    // A broken key keeps the current certificate.
    std::fs::write(&key, "garbage").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(served_cn(&server).await, "second");
    assert_eq!(
        metrics.value(
            "vk_sandbox_kubelet_cert_reloads_total",
            &[("result", "error")]
        ),
        Some(1.0),
        "one failure counted once"
    );
    // Missing files keep it too (a rotation in progress: not counted).
    std::fs::remove_file(&cert).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(served_cn(&server).await, "second");

    // A good pair again: picked up.
    write_pair(dir.path(), "third");
    wait_for_cn("third").await;
    assert_eq!(
        metrics.value(
            "vk_sandbox_kubelet_cert_reloads_total",
            &[("result", "success")]
        ),
        Some(2.0)
    );

    stop_watch.cancel();
    tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("watcher stops")
        .unwrap();
    server.stop().await;
}

/// The daemon's own wiring: `KubeletApi::run` starts the certificate
/// watcher by itself (the test above drives the watcher directly, so it
/// would pass if `run` never started it).
#[tokio::test]
async fn the_daemon_reloads_rotated_certificates() {
    vk_sandbox::crypto::install_provider();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_pair(dir.path(), "first");
    let args = [
        "vk-sandbox".to_string(),
        "--node-name=node-a".into(),
        format!("--listen-addr=127.0.0.1:{}", support::process::free_port()),
        "--kubelet-auth=false".into(),
        format!("--tls-cert={}", cert.display()),
        format!("--tls-key={}", key.display()),
        format!("--state-path={}", dir.path().join("claims.json").display()),
    ];
    let cli = vk_sandbox::config::parse_from(args, &|_| None).expect("flags");
    let cfg = vk_sandbox::config::Config::from_args_without_state_check(&cli.run).expect("config");
    // Auth is off: the Kubernetes client is never called.
    let kube_client = kube::Client::try_from(kube::Config::new(
        "http://127.0.0.1:9".parse().expect("url"),
    ))
    .expect("client");
    let api = vk_sandbox::kubelet::KubeletApi::prepare(
        &cfg.kubelet(),
        &kube_client,
        Arc::new(StaticPods::default()),
        Metrics::new().unwrap(),
        None,
    )
    .await
    .expect("prepare");
    let addr = api.local_addr().expect("bound");
    let stop = CancellationToken::new();
    let running = tokio::spawn(api.run(stop.clone()));
    let cn = || async move {
        let resp = client()
            .get(format!("https://127.0.0.1:{}/healthz", addr.port()))
            .send()
            .await
            .expect("request");
        let der = resp
            .extensions()
            .get::<reqwest::tls::TlsInfo>()
            .and_then(|i| i.peer_certificate().map(<[u8]>::to_vec))
            .expect("peer certificate");
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        parsed
            .subject()
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(cn().await, "first");
    tokio::time::sleep(Duration::from_millis(20)).await;
    write_pair(dir.path(), "second");
    // The daemon polls every few seconds.
    let mut seen = String::new();
    for _ in 0..150 {
        seen = cn().await;
        if seen == "second" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        seen, "second",
        "the running daemon never served the rotated certificate"
    );
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("stops")
        .unwrap()
        .expect("served");
}

#[tokio::test]
async fn shutdown_lets_in_flight_connections_finish_and_stops_listening() {
    let server = start(&self_signed_tls(), None, None, Arc::default()).await;
    let c = client();
    assert_eq!(get(&server, &c, "/healthz").await.0, StatusCode::OK);
    let addr = server.addr;
    server.stop().await;
    // The port is closed.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

// Every request, and what it spawns, runs on the kubelet API's own thread,
// never on the caller's runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_served_on_the_kubelet_api_thread() {
    vk_sandbox::crypto::install_provider();
    let name = || std::thread::current().name().unwrap_or("").to_string();
    let app = axum::Router::new().route(
        "/where",
        axum::routing::get(move || async move {
            let spawned = tokio::spawn(async move { name() })
                .await
                .unwrap_or_default();
            format!("{} {spawned}", name())
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = self_signed_tls()
        .server_config(None)
        .expect("server config");
    let stop = CancellationToken::new();
    let task = tokio::spawn(serve_on_own_thread(listener, config, app, stop.clone()));
    let body = client()
        .get(format!("https://127.0.0.1:{}/where", addr.port()))
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("body");
    assert_eq!(body, "kubelet-api kubelet-api");
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("stops in time")
        .expect("join")
        .expect("served");
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn handshake_garbage_does_not_hurt_the_server() {
    let server = start(&self_signed_tls(), None, None, Arc::default()).await;
    for _ in 0..5 {
        let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    }
    assert_eq!(get(&server, &client(), "/healthz").await.0, StatusCode::OK);
    server.stop().await;
}
