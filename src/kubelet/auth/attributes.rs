//! Who a kubelet API caller is and what a request asks for, in
//! SubjectAccessReview terms. Pure.

use std::collections::BTreeMap;

use axum::http::Method;

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
