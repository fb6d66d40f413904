//! Authentication and authorization of kubelet API requests, the way a real
//! kubelet does it (the Go program had none: anyone reaching the port could
//! read every Pod spec on the node):
//!
//! - **Authentication**: a client certificate that rustls verified against
//!   the client CA (user = subject CN, groups = subject O values), else a
//!   bearer token checked with a TokenReview (authentication.k8s.io/v1,
//!   results cached [`TOKEN_CACHE_TTL`] keyed by the token's SHA-256), else
//!   — only with `--anonymous-auth` — `system:anonymous`. Otherwise 401.
//! - **Authorization**: a SubjectAccessReview (authorization.k8s.io/v1) for
//!   `nodes/<subresource>` named after this node, with the verb from the
//!   HTTP method (`create` for exec, attach and port-forward whatever the
//!   method); subresource `stats` for `/stats/…`, `metrics` for
//!   `/metrics…`, `log` for `/logs/…`, `proxy` for everything else, tried
//!   after `pods` for `/pods` and `/runningpods/` (the kubelet's
//!   fine-grained authorization). Allowed decisions are cached
//!   [`ALLOW_CACHE_TTL`], denials [`DENY_CACHE_TTL`]. Denied → 403 with the
//!   reason.
//!
//! The API calls sit behind [`Authenticator`] and [`Authorizer`] so tests
//! use fakes; [`KubeAuthenticator`]/[`KubeAuthorizer`] are the real ones.
//!
//! The client CA comes from `--client-ca-file`, else from the key
//! `client-ca-file` of the ConfigMap
//! `kube-system/extension-apiserver-authentication` (read once at start by
//! [`load_client_ca`](crate::kubelet::client_ca::load_client_ca); a rotated
//! CA needs a restart).
//!
//! - [`attributes`]: who the caller is and what a request asks for (pure);
//! - [`review`]: the TokenReview/SubjectAccessReview traits and their
//!   apiserver implementations;
//! - `cache`: the TTL cache of their answers.

mod attributes;
mod cache;
#[cfg(test)]
pub(crate) mod fakes;
mod review;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kube::Client;

pub use attributes::{
    PeerIdentity, RequestAttributes, UserInfo, authorization_attributes, request_attributes,
};
use cache::TtlCache;
pub use review::{
    Authenticator, Authorizer, Decision, KubeAuthenticator, KubeAuthorizer, subject_access_review,
};

/// How long a TokenReview answer is reused.
pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(120);
/// How long a rejected token stays rejected without asking again.
pub const TOKEN_REJECT_CACHE_TTL: Duration = Duration::from_secs(30);
/// How long an allowed SubjectAccessReview is reused.
pub const ALLOW_CACHE_TTL: Duration = Duration::from_secs(120);
/// How long a denied SubjectAccessReview is reused.
pub const DENY_CACHE_TTL: Duration = Duration::from_secs(30);

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No usable credentials (401).
    Unauthenticated,
    /// The TokenReview could not be made (401, logged).
    AuthenticationError(String),
    /// Denied by the authorizer (403) for every subresource tried.
    Forbidden {
        user: String,
        attrs: RequestAttributes,
        /// The subresources tried, in order.
        subresources: Vec<&'static str>,
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
                subresources,
                reason,
            } => {
                // The kubelet's wording, Go's rendering of the list.
                let mut msg = format!(
                    "Forbidden (user={user}, verb={}, resource={}, subresource(s)=[{}])",
                    attrs.verb,
                    attrs.resource,
                    subresources.join(" ")
                );
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

    /// May `user` do what the request asks? Allowed when any of its
    /// [`authorization_attributes`] is.
    pub async fn authorize(
        &self,
        user: &UserInfo,
        method: &Method,
        path: &str,
    ) -> std::result::Result<(), Refusal> {
        let tried = authorization_attributes(method, path, &self.node_name);
        let mut reason = String::new();
        for attrs in &tried {
            match self.decide(user, attrs).await? {
                Decision::Allow => return Ok(()),
                Decision::Deny(why) => reason = why,
            }
        }
        let subresources = tried.iter().map(|a| a.subresource).collect();
        let attrs = tried
            .into_iter()
            .next()
            .ok_or_else(|| Refusal::AuthorizationError {
                user: user.name.clone(),
                attrs: request_attributes(method, path, &self.node_name),
                error: "no attributes for the request".into(),
            })?;
        Err(Refusal::Forbidden {
            user: user.name.clone(),
            attrs,
            subresources,
            reason,
        })
    }

    /// One SubjectAccessReview, cached.
    async fn decide(
        &self,
        user: &UserInfo,
        attrs: &RequestAttributes,
    ) -> std::result::Result<Decision, Refusal> {
        let key = (user.clone(), (attrs.verb, attrs.subresource));
        if let Some(d) = self.decisions.get(&key) {
            return Ok(d);
        }
        let d = self
            .authorizer
            .authorize(user, attrs)
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
        Ok(d)
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
