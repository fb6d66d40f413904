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

/// Paths that run something in a sandbox or open a connection into it.
fn is_streaming(path: &str) -> bool {
    ["/exec", "/attach", "/portForward", "/run"]
        .iter()
        .any(|p| is_subpath(path, p))
}

/// The kubelet's mapping of a request to `nodes/<subresource>` attributes
/// (the coarse one every request has: `stats`, `metrics`, `log` or
/// `proxy`). The verb follows the method, except that exec, attach and
/// port-forward always need `create`: their WebSocket upgrades are GETs
/// (docs/streaming.md#authorization).
pub fn request_attributes(method: &Method, path: &str, node_name: &str) -> RequestAttributes {
    let verb = match *method {
        _ if is_streaming(path) => "create",
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

/// Every attribute set a request may be allowed by, tried in order: the
/// fine-grained subresource first where the kubelet has one (`pods` for
/// `/pods` and `/runningpods/`, `healthz` for `/healthz`; GA in 1.36), then
/// the coarse one of [`request_attributes`].
pub fn authorization_attributes(
    method: &Method,
    path: &str,
    node_name: &str,
) -> Vec<RequestAttributes> {
    let base = request_attributes(method, path, node_name);
    let fine = if is_subpath(path, "/pods") || is_subpath(path, "/runningpods") {
        Some("pods")
    } else if is_subpath(path, "/healthz") {
        Some("healthz")
    } else {
        None
    };
    match fine {
        Some(subresource) => vec![
            RequestAttributes {
                subresource,
                ..base.clone()
            },
            base,
        ],
        None => vec![base],
    }
}
