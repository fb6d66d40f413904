//! Fakes for the auth traits, shared by the kubelet tests.
use super::*;
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::sync::Mutex;
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
