//! Authentication and authorization of kubelet API requests (decisions.md
//! D5), the way a real kubelet does it:
//!
//! - **Authentication**: a client certificate that rustls verified against
//!   the client CA (user = subject CN, groups = subject O values), else a
//!   bearer token checked with a TokenReview (authentication.k8s.io/v1,
//!   results cached [`TOKEN_CACHE_TTL`] keyed by the token's SHA-256), else
//!   — only with `--anonymous-auth` — `system:anonymous`. Otherwise 401.
//! - **Authorization**: a SubjectAccessReview (authorization.k8s.io/v1) for
//!   `nodes/<subresource>` named after this node, with the verb from the
//!   HTTP method; subresource `stats` for `/stats/…`, `metrics` for
//!   `/metrics…`, `log` for `/logs/…`, `proxy` for everything else.
//!   Allowed decisions are cached [`ALLOW_CACHE_TTL`], denials
//!   [`DENY_CACHE_TTL`]. Denied → 403 with the reason.
//!
//! The API calls sit behind [`Authenticator`] and [`Authorizer`] so tests
//! use fakes; [`KubeAuthenticator`]/[`KubeAuthorizer`] are the real ones.
//!
//! The client CA comes from `--client-ca-file`, else from the key
//! `client-ca-file` of the ConfigMap
//! `kube-system/extension-apiserver-authentication` (read once at start by
//! [`load_client_ca`]; a rotated CA needs a restart).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::{Api, Client};
use rustls::RootCertStore;

use crate::config::KubeletAuthConfig;
use crate::error::{Error, Result};

/// How long a TokenReview answer is reused.
pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(120);
/// How long a rejected token stays rejected without asking again.
pub const TOKEN_REJECT_CACHE_TTL: Duration = Duration::from_secs(30);
/// How long an allowed SubjectAccessReview is reused.
pub const ALLOW_CACHE_TTL: Duration = Duration::from_secs(120);
/// How long a denied SubjectAccessReview is reused.
pub const DENY_CACHE_TTL: Duration = Duration::from_secs(30);
/// Attempts at reading the client CA ConfigMap before giving up.
const CLIENT_CA_ATTEMPTS: u32 = 3;
/// Entries kept per cache before it is pruned.
const CACHE_MAX_ENTRIES: usize = 4096;

/// Namespace and name of the ConfigMap holding the cluster's client CA.
pub const CLIENT_CA_CONFIGMAP_NAMESPACE: &str = "kube-system";
pub const CLIENT_CA_CONFIGMAP_NAME: &str = "extension-apiserver-authentication";
pub const CLIENT_CA_CONFIGMAP_KEY: &str = "client-ca-file";

/// An authenticated caller.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    pub fn anonymous() -> UserInfo {
        UserInfo {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            ..UserInfo::default()
        }
    }

    /// User = subject CN, groups = subject O values, of a DER certificate
    /// already verified by rustls. `None` when it has no CN.
    pub fn from_certificate(der: &[u8]) -> Option<UserInfo> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let name = subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())?
            .to_string();
        if name.is_empty() {
            return None;
        }
        let groups = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_string))
            .collect();
        Some(UserInfo {
            name,
            groups,
            ..UserInfo::default()
        })
    }
}

/// The identity a TLS connection proved with its client certificate
/// (inserted into each request's extensions by the server; `None` when the
/// client sent no certificate).
#[derive(Debug, Clone, Default)]
pub struct PeerIdentity(pub Option<UserInfo>);

/// What a request asks for, in SubjectAccessReview terms.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestAttributes {
    pub verb: &'static str,
    pub resource: &'static str,
    pub subresource: &'static str,
    pub name: String,
    pub path: String,
}

/// Go's `isSubpath`: `path == prefix` or `path` starts with `prefix/`.
fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path == prefix || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// The kubelet's mapping of a request to `nodes/<subresource>` attributes.
pub fn request_attributes(method: &Method, path: &str, node_name: &str) -> RequestAttributes {
    let verb = match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "get",
    };
    let subresource = if is_subpath(path, "/stats") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs") {
        "log"
    } else {
        "proxy"
    };
    RequestAttributes {
        verb,
        resource: "nodes",
        subresource,
        name: node_name.to_string(),
        path: path.to_string(),
    }
}

/// Checks bearer tokens.
pub trait Authenticator: Send + Sync {
    /// `Ok(Some(user))` for a valid token, `Ok(None)` for an invalid one,
    /// `Err` when no answer could be had.
    fn authenticate_token<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, std::result::Result<Option<UserInfo>, String>>;
}

/// An authorization answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Denied, with the authorizer's reason (may be empty).
    Deny(String),
}

/// Decides whether a user may do what a request asks.
pub trait Authorizer: Send + Sync {
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        attrs: &'a RequestAttributes,
    ) -> BoxFuture<'a, std::result::Result<Decision, String>>;
}

/// TokenReview through the apiserver.
#[derive(Clone)]
pub struct KubeAuthenticator {
    client: Client,
}

impl KubeAuthenticator {
    pub fn new(client: Client) -> Self {
        KubeAuthenticator { client }
    }
}

impl Authenticator for KubeAuthenticator {
    fn authenticate_token<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, std::result::Result<Option<UserInfo>, String>> {
        Box::pin(async move {
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token.to_string()),
                    audiences: None,
                },
                ..TokenReview::default()
            };
            let api: Api<TokenReview> = Api::all(self.client.clone());
            let answer = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| format!("TokenReview failed: {e}"))?;
            let status = answer.status.unwrap_or_default();
            if status.authenticated != Some(true) {
                if let Some(err) = status.error.filter(|e| !e.is_empty()) {
                    tracing::debug!(error = %err, "token rejected by TokenReview");
                }
                return Ok(None);
            }
            let user = status.user.unwrap_or_default();
            Ok(Some(UserInfo {
                name: user.username.unwrap_or_default(),
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }))
        })
    }
}

/// SubjectAccessReview through the apiserver.
#[derive(Clone)]
pub struct KubeAuthorizer {
    client: Client,
}

impl KubeAuthorizer {
    pub fn new(client: Client) -> Self {
        KubeAuthorizer { client }
    }
}

/// The SubjectAccessReview a request needs.
pub fn subject_access_review(user: &UserInfo, attrs: &RequestAttributes) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(String::new()),
                version: Some("v1".into()),
                resource: Some(attrs.resource.into()),
                subresource: Some(attrs.subresource.into()),
                name: Some(attrs.name.clone()),
                verb: Some(attrs.verb.into()),
                ..ResourceAttributes::default()
            }),
            non_resource_attributes: None,
        },
        ..SubjectAccessReview::default()
    }
}

impl Authorizer for KubeAuthorizer {
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        attrs: &'a RequestAttributes,
    ) -> BoxFuture<'a, std::result::Result<Decision, String>> {
        Box::pin(async move {
            let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
            let answer = api
                .create(&PostParams::default(), &subject_access_review(user, attrs))
                .await
                .map_err(|e| format!("SubjectAccessReview failed: {e}"))?;
            let status = answer.status.unwrap_or_default();
            if status.allowed {
                Ok(Decision::Allow)
            } else {
                let reason = status
                    .reason
                    .or(status.evaluation_error)
                    .unwrap_or_default();
                Ok(Decision::Deny(reason))
            }
        })
    }
}

/// A small TTL map; pruned of expired entries (or cleared) when full.
struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    fn new() -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock().ok()?;
        let (expires, value) = entries.get(key)?;
        (Instant::now() < *expires).then(|| value.clone())
    }

    fn put(&self, key: K, value: V, ttl: Duration) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        let now = Instant::now();
        if entries.len() >= CACHE_MAX_ENTRIES {
            entries.retain(|_, (expires, _)| *expires > now);
            if entries.len() >= CACHE_MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(key, (now + ttl, value));
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No usable credentials (401).
    Unauthenticated,
    /// The TokenReview could not be made (401, logged).
    AuthenticationError(String),
    /// Denied by the authorizer (403).
    Forbidden {
        user: String,
        attrs: RequestAttributes,
        reason: String,
    },
    /// The SubjectAccessReview could not be made (500).
    AuthorizationError {
        user: String,
        attrs: RequestAttributes,
        error: String,
    },
}

impl Refusal {
    /// Label for `vk_sandbox_kubelet_auth_failures_total{reason}`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Refusal::Unauthenticated => "unauthenticated",
            Refusal::AuthenticationError(_) => "authentication_error",
            Refusal::Forbidden { .. } => "forbidden",
            Refusal::AuthorizationError { .. } => "authorization_error",
        }
    }
}

fn describe(user: &str, a: &RequestAttributes) -> String {
    format!(
        "user={user}, verb={}, resource={}, subresource={}",
        a.verb, a.resource, a.subresource
    )
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Unauthenticated | Refusal::AuthenticationError(_) => (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "Unauthorized\n",
            )
                .into_response(),
            Refusal::Forbidden {
                user,
                attrs,
                reason,
            } => {
                let mut msg = format!("Forbidden ({})", describe(&user, &attrs));
                if !reason.is_empty() {
                    msg.push_str(": ");
                    msg.push_str(&reason);
                }
                msg.push('\n');
                (StatusCode::FORBIDDEN, msg).into_response()
            }
            Refusal::AuthorizationError { user, attrs, .. } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Authorization error ({})\n", describe(&user, &attrs)),
            )
                .into_response(),
        }
    }
}

/// Authentication + authorization with caches, shared by every request.
pub struct KubeletAuth {
    authenticator: Arc<dyn Authenticator>,
    authorizer: Arc<dyn Authorizer>,
    node_name: String,
    anonymous: bool,
    tokens: TtlCache<[u8; 32], Option<UserInfo>>,
    decisions: TtlCache<(UserInfo, RequestAttributesKey), Decision>,
}

/// The parts of [`RequestAttributes`] a decision depends on (not the path).
type RequestAttributesKey = (&'static str, &'static str);

impl std::fmt::Debug for KubeletAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletAuth")
            .field("node_name", &self.node_name)
            .field("anonymous", &self.anonymous)
            .finish_non_exhaustive()
    }
}

impl KubeletAuth {
    pub fn new(
        authenticator: Arc<dyn Authenticator>,
        authorizer: Arc<dyn Authorizer>,
        node_name: impl Into<String>,
        anonymous: bool,
    ) -> Self {
        KubeletAuth {
            authenticator,
            authorizer,
            node_name: node_name.into(),
            anonymous,
            tokens: TtlCache::new(),
            decisions: TtlCache::new(),
        }
    }

    /// TokenReview and SubjectAccessReview through `client`.
    pub fn with_client(client: Client, node_name: impl Into<String>, anonymous: bool) -> Self {
        Self::new(
            Arc::new(KubeAuthenticator::new(client.clone())),
            Arc::new(KubeAuthorizer::new(client)),
            node_name,
            anonymous,
        )
    }

    /// Who is asking: the verified client certificate, else the bearer
    /// token, else anonymous (when allowed).
    pub async fn authenticate(
        &self,
        peer: Option<&UserInfo>,
        headers: &HeaderMap,
    ) -> std::result::Result<UserInfo, Refusal> {
        if let Some(user) = peer {
            return Ok(user.clone());
        }
        if let Some(token) = bearer_token(headers) {
            let key: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
                .as_ref()
                .try_into()
                .map_err(|_| Refusal::AuthenticationError("token hash".into()))?;
            let answer = match self.tokens.get(&key) {
                Some(cached) => cached,
                None => {
                    let answer = self
                        .authenticator
                        .authenticate_token(token)
                        .await
                        .map_err(Refusal::AuthenticationError)?;
                    let ttl = if answer.is_some() {
                        TOKEN_CACHE_TTL
                    } else {
                        TOKEN_REJECT_CACHE_TTL
                    };
                    self.tokens.put(key, answer.clone(), ttl);
                    answer
                }
            };
            return answer.ok_or(Refusal::Unauthenticated);
        }
        if self.anonymous {
            return Ok(UserInfo::anonymous());
        }
        Err(Refusal::Unauthenticated)
    }

    /// May `user` do what the request asks?
    pub async fn authorize(
        &self,
        user: &UserInfo,
        method: &Method,
        path: &str,
    ) -> std::result::Result<(), Refusal> {
        let attrs = request_attributes(method, path, &self.node_name);
        let key = (user.clone(), (attrs.verb, attrs.subresource));
        let decision = match self.decisions.get(&key) {
            Some(d) => d,
            None => {
                let d = self
                    .authorizer
                    .authorize(user, &attrs)
                    .await
                    .map_err(|error| Refusal::AuthorizationError {
                        user: user.name.clone(),
                        attrs: attrs.clone(),
                        error,
                    })?;
                let ttl = match d {
                    Decision::Allow => ALLOW_CACHE_TTL,
                    Decision::Deny(_) => DENY_CACHE_TTL,
                };
                self.decisions.put(key, d.clone(), ttl);
                d
            }
        };
        match decision {
            Decision::Allow => Ok(()),
            Decision::Deny(reason) => Err(Refusal::Forbidden {
                user: user.name.clone(),
                attrs,
                reason,
            }),
        }
    }

    /// Authenticate, then authorize; the user on success.
    pub async fn check(
        &self,
        peer: Option<&UserInfo>,
        headers: &HeaderMap,
        method: &Method,
        path: &str,
    ) -> std::result::Result<UserInfo, Refusal> {
        let user = self.authenticate(peer, headers).await?;
        self.authorize(&user, method, path).await?;
        Ok(user)
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The client CA for kubelet API client certificates: `None` when auth is
/// off; else `--client-ca-file`, or the cluster's
/// kube-system/extension-apiserver-authentication `client-ca-file` key.
/// Call once at start (after the Kubernetes client exists, before the
/// kubelet API binds).
#[tracing::instrument(skip_all)]
pub async fn load_client_ca(
    cfg: &KubeletAuthConfig,
    client: &Client,
) -> Result<Option<Arc<RootCertStore>>> {
    if !cfg.enabled {
        tracing::warn!(
            "kubelet API authentication and authorization are off (--kubelet-auth=false)"
        );
        return Ok(None);
    }
    if let Some(path) = &cfg.client_ca_file {
        let pem = std::fs::read(path).map_err(|e| {
            Error::Config(format!(
                "--client-ca-file (env VK_CLIENT_CA_FILE)={}: cannot read it: {e}; give a \
                 readable PEM CA bundle",
                path.display()
            ))
        })?;
        let source = format!("--client-ca-file {}", path.display());
        return crate::kubelet::tls::roots_from_pem(&pem, &source).map(Some);
    }
    let source = format!(
        "ConfigMap {CLIENT_CA_CONFIGMAP_NAMESPACE}/{CLIENT_CA_CONFIGMAP_NAME} key {CLIENT_CA_CONFIGMAP_KEY}"
    );
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), CLIENT_CA_CONFIGMAP_NAMESPACE);
    let fix = "allow `get` on that ConfigMap (e.g. bind the Role \
               extension-apiserver-authentication-reader), or give --client-ca-file (env \
               VK_CLIENT_CA_FILE), or turn auth off with --kubelet-auth=false";
    // A few quick retries ride out an apiserver that is still starting;
    // a refusal (403) or absence (404) is final.
    let mut delay = Duration::from_millis(500);
    let mut attempt = 1;
    let cm = loop {
        match api.get(CLIENT_CA_CONFIGMAP_NAME).await {
            Ok(cm) => break cm,
            Err(kube::Error::Api(ae)) if ae.code == 403 || ae.code == 404 => {
                return Err(Error::Config(format!(
                    "reading the kubelet client CA from {source}: {} ({}); {fix}",
                    ae.message, ae.code
                )));
            }
            Err(e) if attempt >= CLIENT_CA_ATTEMPTS => {
                return Err(Error::kube(
                    format!("reading the kubelet client CA from {source} ({fix})"),
                    e,
                ));
            }
            Err(e) => {
                tracing::warn!(error = %e, attempt, "reading the kubelet client CA failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
                attempt += 1;
            }
        }
    };
    let pem = cm
        .data
        .as_ref()
        .and_then(|d| d.get(CLIENT_CA_CONFIGMAP_KEY))
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| {
            Error::Config(format!(
                "{source} is missing: the apiserver has no --client-ca-file; give \
                 --client-ca-file (env VK_CLIENT_CA_FILE) or turn auth off with \
                 --kubelet-auth=false"
            ))
        })?;
    let roots = crate::kubelet::tls::roots_from_pem(pem.as_bytes(), &source)?;
    tracing::info!(%source, certificates = roots.len(), "kubelet client CA loaded");
    Ok(Some(roots))
}

#[cfg(test)]
pub(crate) mod fakes {
    //! Fakes for the auth traits, shared by the kubelet tests.
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Tokens map to users; counts calls.
    #[derive(Default)]
    pub struct FakeAuthenticator {
        pub tokens: HashMap<String, UserInfo>,
        pub fail: bool,
        pub calls: AtomicUsize,
    }

    impl Authenticator for FakeAuthenticator {
        fn authenticate_token<'a>(
            &'a self,
            token: &'a str,
        ) -> BoxFuture<'a, std::result::Result<Option<UserInfo>, String>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let answer = if self.fail {
                Err("apiserver down".to_string())
            } else {
                Ok(self.tokens.get(token).cloned())
            };
            Box::pin(async move { answer })
        }
    }

    /// Allows users by name (any subresource) or by (name, subresource).
    #[derive(Default)]
    pub struct FakeAuthorizer {
        pub allow_users: Vec<String>,
        pub allow: Vec<(String, &'static str)>,
        pub fail: bool,
        pub calls: AtomicUsize,
        pub seen: Mutex<Vec<(String, RequestAttributes)>>,
    }

    impl Authorizer for FakeAuthorizer {
        fn authorize<'a>(
            &'a self,
            user: &'a UserInfo,
            attrs: &'a RequestAttributes,
        ) -> BoxFuture<'a, std::result::Result<Decision, String>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if let Ok(mut seen) = self.seen.lock() {
                seen.push((user.name.clone(), attrs.clone()));
            }
            let answer = if self.fail {
                Err("apiserver down".to_string())
            } else if self.allow_users.contains(&user.name)
                || self
                    .allow
                    .iter()
                    .any(|(u, s)| *u == user.name && *s == attrs.subresource)
            {
                Ok(Decision::Allow)
            } else {
                Ok(Decision::Deny("no RBAC rule".into()))
            };
            Box::pin(async move { answer })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fakes::*;
    use super::*;
    use std::sync::atomic::Ordering;

    fn user(name: &str) -> UserInfo {
        UserInfo {
            name: name.into(),
            ..UserInfo::default()
        }
    }

    #[test]
    fn subresource_and_verb_mapping() {
        let cases = [
            (Method::GET, "/pods", "get", "proxy"),
            (Method::GET, "/runningpods/", "get", "proxy"),
            (Method::GET, "/stats/summary", "get", "stats"),
            (Method::GET, "/stats", "get", "stats"),
            (Method::GET, "/statsx", "get", "proxy"),
            (Method::GET, "/metrics/resource", "get", "metrics"),
            (Method::GET, "/metrics", "get", "metrics"),
            (Method::GET, "/logs/syslog", "get", "log"),
            (Method::GET, "/containerLogs/ns/p/c", "get", "proxy"),
            (Method::POST, "/exec/ns/p/c", "create", "proxy"),
            (Method::PUT, "/x", "update", "proxy"),
            (Method::PATCH, "/x", "patch", "proxy"),
            (Method::DELETE, "/x", "delete", "proxy"),
            (Method::HEAD, "/pods", "get", "proxy"),
        ];
        for (method, path, verb, sub) in cases {
            let a = request_attributes(&method, path, "node-a");
            assert_eq!((a.verb, a.subresource), (verb, sub), "{method} {path}");
            assert_eq!(a.resource, "nodes");
            assert_eq!(a.name, "node-a");
        }
    }

    #[test]
    fn sar_body() {
        let mut u = user("system:kube-apiserver");
        u.groups = vec!["system:masters".into()];
        let sar = subject_access_review(&u, &request_attributes(&Method::GET, "/pods", "n1"));
        let v = serde_json::to_value(&sar).unwrap();
        assert_eq!(v["apiVersion"], "authorization.k8s.io/v1");
        assert_eq!(v["kind"], "SubjectAccessReview");
        assert_eq!(v["spec"]["user"], "system:kube-apiserver");
        assert_eq!(v["spec"]["groups"][0], "system:masters");
        let ra = &v["spec"]["resourceAttributes"];
        assert_eq!(ra["resource"], "nodes");
        assert_eq!(ra["subresource"], "proxy");
        assert_eq!(ra["name"], "n1");
        assert_eq!(ra["verb"], "get");
    }

    #[test]
    fn bearer_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer_token(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer_token(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "bearer  abc ".parse().unwrap());
        assert_eq!(bearer_token(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer_token(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer_token(&h), None);
    }

    fn auth_with(
        authn: FakeAuthenticator,
        authz: FakeAuthorizer,
        anonymous: bool,
    ) -> (KubeletAuth, Arc<FakeAuthenticator>, Arc<FakeAuthorizer>) {
        let authn = Arc::new(authn);
        let authz = Arc::new(authz);
        (
            KubeletAuth::new(authn.clone(), authz.clone(), "node-a", anonymous),
            authn,
            authz,
        )
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        h
    }

    #[tokio::test]
    async fn token_results_are_cached() {
        let (auth, authn, _) = auth_with(
            FakeAuthenticator {
                tokens: HashMap::from([("good".to_string(), user("alice"))]),
                ..Default::default()
            },
            FakeAuthorizer::default(),
            false,
        );
        for _ in 0..3 {
            assert_eq!(
                auth.authenticate(None, &bearer("good")).await.unwrap().name,
                "alice"
            );
        }
        assert_eq!(authn.calls.load(Ordering::SeqCst), 1);
        for _ in 0..2 {
            assert_eq!(
                auth.authenticate(None, &bearer("bad")).await,
                Err(Refusal::Unauthenticated)
            );
        }
        assert_eq!(authn.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn anonymous_only_when_enabled_and_cert_wins() {
        let (off, _, _) = auth_with(Default::default(), Default::default(), false);
        assert_eq!(
            off.authenticate(None, &HeaderMap::new()).await,
            Err(Refusal::Unauthenticated)
        );
        let (on, _, _) = auth_with(Default::default(), Default::default(), true);
        assert_eq!(
            on.authenticate(None, &HeaderMap::new()).await.unwrap(),
            UserInfo::anonymous()
        );
        let peer = user("system:kube-apiserver-kubelet-client");
        assert_eq!(
            off.authenticate(Some(&peer), &bearer("whatever"))
                .await
                .unwrap(),
            peer
        );
    }

    #[tokio::test]
    async fn authentication_error_is_a_refusal_not_cached() {
        let (auth, authn, _) = auth_with(
            FakeAuthenticator {
                fail: true,
                ..Default::default()
            },
            Default::default(),
            false,
        );
        for _ in 0..2 {
            let r = auth.authenticate(None, &bearer("t")).await.unwrap_err();
            assert_eq!(r.metric_label(), "authentication_error");
        }
        assert_eq!(authn.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn decisions_are_cached_per_user_verb_subresource() {
        let (auth, _, authz) = auth_with(
            Default::default(),
            FakeAuthorizer {
                allow: vec![("bob".into(), "stats")],
                ..Default::default()
            },
            false,
        );
        let bob = user("bob");
        assert!(
            auth.authorize(&bob, &Method::GET, "/stats/summary")
                .await
                .is_ok()
        );
        assert!(
            auth.authorize(&bob, &Method::GET, "/stats/summary/")
                .await
                .is_ok()
        );
        assert_eq!(authz.calls.load(Ordering::SeqCst), 1);
        let err = auth
            .authorize(&bob, &Method::GET, "/pods")
            .await
            .unwrap_err();
        let resp = err.clone().into_response();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert!(matches!(err, Refusal::Forbidden { ref reason, .. } if reason == "no RBAC rule"));
        assert!(auth.authorize(&bob, &Method::GET, "/pods").await.is_err());
        assert_eq!(authz.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn authorization_error_is_500() {
        let (auth, _, _) = auth_with(
            Default::default(),
            FakeAuthorizer {
                fail: true,
                ..Default::default()
            },
            false,
        );
        let err = auth
            .authorize(&user("x"), &Method::GET, "/pods")
            .await
            .unwrap_err();
        assert_eq!(err.metric_label(), "authorization_error");
        assert_eq!(
            err.into_response().status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn identity_from_certificate() {
        let kp = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, "system:kube-apiserver");
        dn.push(rcgen::DnType::OrganizationName, "system:masters");
        params.distinguished_name = dn;
        let cert = params.self_signed(&kp).unwrap();
        let u = UserInfo::from_certificate(cert.der()).unwrap();
        assert_eq!(u.name, "system:kube-apiserver");
        assert_eq!(u.groups, vec!["system:masters".to_string()]);
        assert!(UserInfo::from_certificate(b"junk").is_none());
    }

    #[test]
    fn ttl_cache_expires_and_prunes() {
        let c: TtlCache<u32, u32> = TtlCache::new();
        c.put(1, 10, Duration::from_secs(60));
        c.put(2, 20, Duration::ZERO);
        assert_eq!(c.get(&1), Some(10));
        assert_eq!(c.get(&2), None);
        for i in 0..(CACHE_MAX_ENTRIES as u32 + 10) {
            c.put(i, i, Duration::from_secs(60));
        }
        assert!(c.entries.lock().unwrap().len() <= CACHE_MAX_ENTRIES);
    }
}
