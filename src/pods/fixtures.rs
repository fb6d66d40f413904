//! The fast tier: reconcile and delete authorization driven against a
//! scripted apiserver (a `tower-test` mock behind a real kube `Client`) and
//! the in-process sandboxd simulator. Each test checks the apiserver
//! conversation that matters (which requests, with which preconditions and
//! field manager) in well under a second, without a control plane; the
//! end-to-end suite checks the same paths against the real one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use kube::runtime::controller::Action;
use serde_json::{Value, json};

use super::context::Context;
use super::controller::reconcile;
use super::pod::Pod;

/// One request the fake apiserver saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// Path and query.
    pub uri: String,
    pub body: Value,
}

impl Seen {
    pub fn path(&self) -> &str {
        self.uri.split('?').next().unwrap_or_default()
    }
}

/// What the fake answers: status and JSON body (`Value::Null` for a plain
/// text body "404 page not found").
pub type Answer = (u16, Value);

/// A scripted apiserver: `answer` decides each reply; every request is
/// recorded.
pub struct ApiServer {
    pub client: Client,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl ApiServer {
    pub fn new(answer: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> ApiServer {
        ApiServer::slow(answer, |_| Duration::ZERO)
    }

    /// [`ApiServer::new`] answering each request after `delay(request)`.
    /// Requests are recorded in the order they come and answered
    /// concurrently, as an apiserver does: a slow answer holds up only its
    /// own request.
    pub fn slow(
        answer: impl Fn(&Seen) -> Answer + Send + Sync + 'static,
        delay: impl Fn(&Seen) -> Duration + Send + Sync + 'static,
    ) -> ApiServer {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let (parts, body) = req.into_parts();
                let bytes = http_body_util::BodyExt::collect(body)
                    .await
                    .map(|c| c.to_bytes())
                    .unwrap_or_default();
                let seen = Seen {
                    method: parts.method.to_string(),
                    uri: parts
                        .uri
                        .path_and_query()
                        .map(|p| p.to_string())
                        .unwrap_or_default(),
                    body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                };
                let (status, reply) = answer(&seen);
                let wait = delay(&seen);
                log.lock().expect("log").push(seen);
                let (body, content_type) = if reply.is_null() {
                    (b"404 page not found\n".to_vec(), "text/plain")
                } else {
                    (
                        serde_json::to_vec(&reply).expect("json"),
                        "application/json",
                    )
                };
                let resp = Response::builder()
                    .status(StatusCode::from_u16(status).expect("status"))
                    .header("content-type", content_type)
                    .body(Body::from(body))
                    .expect("response");
                if wait.is_zero() {
                    send.send_response(resp);
                } else {
                    tokio::spawn(async move {
                        tokio::time::sleep(wait).await;
                        send.send_response(resp);
                    });
                }
            }
        });
        ApiServer {
            client: Client::new(mock, "default"),
            seen,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("log").clone()
    }

    /// Requests other than Events (which are written best effort).
    pub fn writes(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method != "GET" && !s.path().contains("/events"))
            .collect()
    }
}

/// A Kubernetes `Status` failure body.
pub fn status(code: u16, reason: &str, details: Value) -> Answer {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "message": format!("{reason} (fake)"), "reason": reason,
               "details": details, "code": code}),
    )
}

/// The discovery answer for `agents.x-k8s.io/v1beta1`.
pub fn sandbox_discovery() -> Answer {
    (
        200,
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "agents.x-k8s.io/v1beta1",
               "resources": [{"name": "sandboxes", "singularName": "sandbox", "namespaced": true,
                              "kind": "Sandbox", "verbs": ["get", "list", "watch"]}]}),
    )
}

/// A Sandbox object as the apiserver returns it.
pub fn sandbox(uid: &str, deleting: bool) -> Answer {
    let mut obj = json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
        "metadata": {"name": "sb", "namespace": "ns", "uid": uid}});
    if deleting {
        obj["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    (200, obj)
}

/// A sandbox Pod `ns/sb` owned by Sandbox `sb` (UID `owner`), with extra
/// non-controller owners first so the controller has to be found.
pub fn owned_pod(uid: &str, owner: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sb", "namespace": "ns", "uid": uid, "resourceVersion": "7",
            "annotations": {"sandbox.cocoonstack.io/template": "base:24.04"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "c1"},
                {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "name": "sb",
                 "uid": owner, "controller": true}]},
        "spec": {"containers": [{"name": "a", "image": "base:24.04"}]},
    }))
    .expect("pod")
}

/// A time at which every preserved claim is due for its recheck.
pub fn any_time() -> std::time::Instant {
    std::time::Instant::now() + Duration::from_secs(24 * 3600)
}

/// A bound at every await on the fake, so a conversation that waits for
/// an answer never comes fails instead of hanging.
pub async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), f)
        .await
        .expect("the conversation finished")
}

/// An in-process sandboxd simulator with a warm `base:24.04` pool of
/// `warm`, and `token` as its root token (`None`: open mode).
pub async fn sim_with_pool(token: Option<&str>, warm: usize) -> sandboxd_sim::SimHandle {
    crate::crypto::install_provider();
    sandboxd_sim::start_local(sandboxd_sim::SimConfig {
        api_token: token.unwrap_or_default().into(),
        pools: vec![
            sandboxd_sim::config::PoolConfig::parse_spec(&format!("base:24.04={warm}"))
                .expect("pool"),
        ],
        ..Default::default()
    })
    .await
    .expect("sim")
}

/// A provider over `sim` (with `token`, if any) and `client` for the
/// apiserver, on a fresh claims store in a temporary directory (kept alive
/// by the returned guard).
pub async fn provider_over(
    sim: &sandboxd_sim::SimHandle,
    token: Option<&str>,
    client: Client,
) -> (super::provider::Provider, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let claims = Arc::new(
        crate::claims::ClaimsStore::open(&dir.path().join("claims.json"))
            .await
            .expect("store"),
    );
    let sandboxd = crate::sandboxd::SandboxdClient::builder(sim.base_url())
        .token(token.map(str::to_string))
        .build()
        .expect("client");
    (
        super::provider::Provider::new(client, sandboxd, claims),
        dir,
    )
}

/// The root token of the fixture world's sandboxd.
pub const TOKEN: &str = "fixture-root-token";

/// A scripted apiserver, the in-process sandboxd (root token [`TOKEN`],
/// a warm pool of two) and a reconcile context over a fresh claims store.
pub struct World {
    pub api: ApiServer,
    pub sim: sandboxd_sim::SimHandle,
    pub ctx: Arc<Context>,
    pub dir: tempfile::TempDir,
}

/// The scripted apiserver answers `owner` for the Sandbox, 200 to every
/// Pod status patch and delete, 201 to Events.
pub async fn world(owner: Answer) -> World {
    world_with(move |s| match (s.method.as_str(), s.path()) {
        ("GET", "/apis/agents.x-k8s.io/v1beta1") => sandbox_discovery(),
        ("GET", "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/sb") => owner.clone(),
        ("PATCH", "/api/v1/namespaces/ns/pods/sb/status") => (200, pod_json()),
        ("DELETE", "/api/v1/namespaces/ns/pods/sb") => (200, pod_json()),
        ("POST", p) if p.ends_with("/events") => (201, s.body.clone()),
        _ => (404, Value::Null),
    })
    .await
}

pub async fn world_with(answer: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> World {
    world_slow(answer, |_| Duration::ZERO).await
}

/// [`world_with`] over [`ApiServer::slow`].
pub async fn world_slow(
    answer: impl Fn(&Seen) -> Answer + Send + Sync + 'static,
    delay: impl Fn(&Seen) -> Duration + Send + Sync + 'static,
) -> World {
    crate::crypto::install_provider();
    let api = ApiServer::slow(answer, delay);
    let sim = sim_with_pool(Some(TOKEN), 2).await;
    let (provider, dir) = provider_over(&sim, Some(TOKEN), api.client.clone()).await;
    let provider = Arc::new(provider);
    let ctx = Arc::new(Context::new(
        api.client.clone(),
        provider,
        "node-a",
        crate::metrics::Metrics::new().expect("metrics"),
    ));
    World { api, sim, ctx, dir }
}

pub fn pod_json() -> Value {
    serde_json::to_value(owned_pod("p1", "o1")).expect("json")
}

/// `owned_pod("p1", "o1")` as our Running write left it on `claim_id`.
pub fn running_pod(claim_id: &str) -> Pod {
    let mut p = owned_pod("p1", "o1");
    p.metadata
        .annotations
        .get_or_insert_default()
        .insert("sandbox.cocoonstack.io/claim-id".into(), claim_id.into());
    p.status = serde_json::from_value(json!({"phase": "Running", "containerStatuses": [
        {"name": "a", "ready": true, "restartCount": 0, "image": "base:24.04",
         "imageID": format!("sandboxd://{claim_id}"), "state": {"running": {}}}]}))
    .expect("status");
    p
}

/// `p` being deleted with `grace`, the deletion set just now.
pub fn deleting(p: Pod, grace: i64) -> Pod {
    deleting_since(p, grace, std::time::Duration::ZERO)
}

/// `p` whose deletion with `grace` was set `ago`.
pub fn deleting_since(mut p: Pod, grace: i64, ago: std::time::Duration) -> Pod {
    let ago = jiff::SignedDuration::try_from(ago).expect("duration");
    p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::now() - ago,
    ));
    p.metadata.deletion_grace_period_seconds = Some(grace);
    p
}

/// The release requests sandboxd saw.
pub fn release_requests(sim: &sandboxd_sim::SimHandle) -> Vec<String> {
    sim.sim()
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/release"))
        .map(|r| r.path.clone())
        .collect()
}

/// Claim, then the one Running write: only onto this Pod (its UID, no
/// resourceVersion), with the field manager, carrying the claim id.
pub async fn claimed(w: &World) -> String {
    let action = within(reconcile(
        Arc::new(owned_pod("p1", "o1")),
        Arc::clone(&w.ctx),
    ))
    .await
    .expect("reconcile");
    assert_eq!(action, Action::requeue(std::time::Duration::from_secs(300)));
    let writes = w.api.writes();
    assert_eq!(writes.len(), 1, "{writes:#?}");
    let patch = &writes[0];
    assert_eq!(
        (patch.method.as_str(), patch.path()),
        ("PATCH", "/api/v1/namespaces/ns/pods/sb/status")
    );
    assert!(
        patch.uri.contains("fieldManager=vk-sandbox"),
        "{}",
        patch.uri
    );
    assert_eq!(patch.body["metadata"]["uid"], "p1");
    assert!(patch.body["metadata"].get("resourceVersion").is_none());
    assert_eq!(patch.body["status"]["phase"], "Running");
    let id = patch.body["metadata"]["annotations"]["sandbox.cocoonstack.io/claim-id"]
        .as_str()
        .expect("claim id")
        .to_string();
    assert!(
        w.sim.sim().claims().iter().any(|c| c.id == id),
        "the written id is the claimed sandbox"
    );
    id
}

/// One turn of a fresh lifecycle upkeep (so every claim is due at once),
/// with `pods` as the watch cache of this node.
pub async fn upkeep_turn(ctx: &Arc<Context>, pods: &[Pod]) {
    use crate::periodic::Turn;
    use kube::runtime::{reflector, watcher};
    let (store, mut writer) = reflector::store::<Pod>();
    for p in pods {
        writer.apply_watcher_event(&watcher::Event::Apply(p.clone()));
    }
    let mut upkeep = super::upkeep::LifecycleUpkeep::new(Arc::clone(ctx), store);
    upkeep.turn(&crate::periodic::Beat::none()).await;
}
