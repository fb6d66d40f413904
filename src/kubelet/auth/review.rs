//! The two questions the kubelet API asks the apiserver (TokenReview,
//! SubjectAccessReview), as traits so tests use fakes, and their
//! implementations through a Kubernetes client.

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

use super::attributes::{RequestAttributes, UserInfo};

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
