//! Who is asking: the node's root token, a tenant's token, a sandbox's own
//! token, or anyone in open mode (no tokens configured).

use super::state::State;
use super::{Reply, Sim};
use crate::model::{bearer, ct_eq};

/// Who made a node-wide request.
pub(super) enum Principal {
    Root,
    Open,
    Tenant(String),
}

/// Who acts on a sandbox-scoped verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Actor {
    /// The node's root token: the operator path, any id.
    Root,
    /// The claim's own token.
    Own,
}

/// An unknown id, and a token that is not the sandbox's: sandboxd does not
/// tell them apart.
pub(super) fn unknown() -> Reply {
    Reply::error(404, "unknown sandbox")
}

impl Sim {
    pub(super) fn auth_node(st: &State, header: Option<&str>) -> Result<Principal, Reply> {
        let cfg = &st.cfg;
        if cfg.api_token.is_empty() && cfg.tenants.is_empty() {
            return Ok(Principal::Open);
        }
        let Some(token) = bearer(header) else {
            return Err(Reply::error(401, "invalid api token"));
        };
        if !cfg.api_token.is_empty() && ct_eq(token, &cfg.api_token) {
            return Ok(Principal::Root);
        }
        for t in &cfg.tenants {
            if !t.token.is_empty() && ct_eq(token, &t.token) {
                return Ok(Principal::Tenant(t.name.clone()));
            }
        }
        Err(Reply::error(401, "invalid api token"))
    }

    pub(super) fn auth_root(st: &State, header: Option<&str>) -> Result<(), Reply> {
        match Self::auth_node(st, header)? {
            Principal::Tenant(_) => Err(Reply::error(403, "operator token required")),
            Principal::Root | Principal::Open => Ok(()),
        }
    }

    /// Sandbox-scoped verbs (hibernate, wake, renew): the root token acts
    /// by id, otherwise the bearer must be the claim's own token. No bearer
    /// is 401; anything else 404, like an unknown id.
    pub(super) fn auth_verb(st: &State, header: Option<&str>, id: &str) -> Result<Actor, Reply> {
        let Some(token) = bearer(header) else {
            return Err(Reply::error(401, "missing bearer token"));
        };
        let Some(claim) = st.claims.get(id) else {
            return Err(unknown());
        };
        if !st.cfg.api_token.is_empty() && ct_eq(token, &st.cfg.api_token) {
            return Ok(Actor::Root);
        }
        if ct_eq(token, &claim.token) {
            Ok(Actor::Own)
        } else {
            Err(unknown())
        }
    }

    /// The sandbox's own token (root is a wrong token here).
    pub(super) fn own_claim(&self, token: &str, id: &str) -> bool {
        self.lock()
            .claims
            .get(id)
            .is_some_and(|c| ct_eq(token, &c.token))
    }
}
