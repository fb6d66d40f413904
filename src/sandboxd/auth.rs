//! The one maker of the `Authorization` header sandboxd calls carry: the
//! node (root) token when one is configured, or a sandbox's credential
//! (its claim token, or the node token where the operator path acts on any
//! id).

use reqwest::header::HeaderValue;

use super::error::{Op, SandboxdError};
use super::verbs_types::SandboxAuth;

/// Which credential a call carries.
#[derive(Debug, Clone, Copy)]
pub(super) enum Credential<'a> {
    /// The node token if configured, else none (claim, list, info, get,
    /// stats: without one sandboxd's open mode answers, or a `401` says
    /// what is missing).
    NodeIfAny,
    /// A sandbox-scoped call: the claim's own token (none when empty:
    /// sandboxd then answers `401`), or the node token, which must be
    /// configured.
    Sandbox(SandboxAuth<'a>),
}

pub(super) fn bearer(token: &str) -> Option<HeaderValue> {
    let mut value = HeaderValue::from_str(&format!("Bearer {token}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// The header `op` on sandbox `id` (empty for calls on none) carries,
/// `node` being the configured node token.
pub(super) fn authorization(
    node: Option<&HeaderValue>,
    op: Op,
    id: &str,
    credential: Credential<'_>,
) -> Result<Option<HeaderValue>, SandboxdError> {
    match credential {
        Credential::NodeIfAny => Ok(node.cloned()),
        Credential::Sandbox(SandboxAuth::Token(token)) if token.is_empty() => Ok(None),
        Credential::Sandbox(SandboxAuth::Token(token)) => bearer(token.expose())
            .map(Some)
            .ok_or_else(|| SandboxdError::InvalidRequest {
                op,
                message: "the sandbox token contains characters not allowed in an HTTP header"
                    .into(),
            }),
        Credential::Sandbox(SandboxAuth::Node) => match node {
            Some(t) => Ok(Some(t.clone())),
            None => Err(SandboxdError::InvalidRequest {
                op,
                message: format!(
                    "cannot {op} {id:?} with the node token: no node token is configured"
                ),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandboxd::Secret;

    fn text(h: Option<HeaderValue>) -> Option<String> {
        h.map(|v| v.to_str().expect("ascii").to_string())
    }

    #[test]
    fn each_credential_makes_its_header() {
        let root = bearer("root");
        let (with, without) = (root.as_ref(), None);
        let own = Secret::new("tok".to_string());
        let empty = Secret::new(String::new());
        let at = |node, cred| authorization(node, Op::Hibernate, "sb_1", cred);
        assert_eq!(
            text(at(with, Credential::NodeIfAny).unwrap()).as_deref(),
            Some("Bearer root")
        );
        assert_eq!(text(at(without, Credential::NodeIfAny).unwrap()), None);
        let token = Credential::Sandbox(SandboxAuth::Token(&own));
        assert_eq!(
            text(at(without, token).unwrap()).as_deref(),
            Some("Bearer tok")
        );
        let none = Credential::Sandbox(SandboxAuth::Token(&empty));
        assert_eq!(text(at(with, none).unwrap()), None);
        let node = Credential::Sandbox(SandboxAuth::Node);
        assert_eq!(
            text(at(with, node).unwrap()).as_deref(),
            Some("Bearer root")
        );
        let e = at(without, node).unwrap_err().to_string();
        assert!(
            e.contains("cannot hibernate \"sb_1\" with the node token"),
            "{e}"
        );
    }

    #[test]
    fn a_token_that_is_no_header_value_is_refused_not_sent() {
        let bad = Secret::new("line\nbreak".to_string());
        let credential = Credential::Sandbox(SandboxAuth::Token(&bad));
        let e = authorization(None, Op::Exec, "sb_1", credential)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not allowed in an HTTP header"), "{e}");
    }

    #[test]
    fn headers_are_marked_sensitive() {
        assert!(bearer("x").is_some_and(|v| v.is_sensitive()));
    }
}
