//! Which streaming protocol an exec, attach or port-forward request asks
//! for, decided from its headers as a kubelet decides it
//! (docs/streaming.md#protocols). Pure.
//!
//! - SPDY/3.1: `Upgrade: SPDY/3.1`, versions offered in
//!   `X-Stream-Protocol-Version` (client's order of preference);
//! - WebSocket: `Upgrade: websocket`, versions offered in
//!   `Sec-WebSocket-Protocol` (this side's order of preference).

use axum::http::HeaderMap;
use axum::http::header::{CONNECTION, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_PROTOCOL, UPGRADE};

use super::version::Version;

/// The header carrying SPDY stream protocol versions.
pub const STREAM_PROTOCOL_HEADER: &str = "x-stream-protocol-version";

/// How a request is carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Spdy,
    WebSocket { key: String },
}

/// What a request will be served with: its transport, and which version
/// of the route's protocol (a [`Version`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated<V> {
    pub transport: Transport,
    pub version: V,
}

/// Why a request cannot be upgraded; the kubelet's statuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 400: not an upgrade this side speaks.
    BadRequest(String),
    /// 403: no common protocol version.
    Forbidden(String),
}

/// A 403 naming what each side speaks.
fn no_common<V: Version>(offered: &[&str], served: &[V]) -> Refusal {
    let served: Vec<&str> = served.iter().map(|v| v.name()).collect();
    Refusal::Forbidden(format!(
        "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server \
         supports {served:?}"
    ))
}

fn values(headers: &HeaderMap, name: impl axum::http::header::AsHeaderName) -> Vec<&str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect()
}

fn connection_upgrade(headers: &HeaderMap) -> bool {
    values(headers, CONNECTION)
        .iter()
        .any(|v| v.eq_ignore_ascii_case("upgrade"))
}

/// Decide the transport and the version `V` of an exec, attach or
/// port-forward request.
pub fn negotiate<V: Version>(headers: &HeaderMap) -> Result<Negotiated<V>, Refusal> {
    let upgrade = values(headers, UPGRADE);
    let wants = |p: &str| upgrade.iter().any(|u| u.eq_ignore_ascii_case(p));
    if !connection_upgrade(headers) || upgrade.is_empty() {
        return Err(Refusal::BadRequest(
            "unable to upgrade: missing upgrade headers in request (this endpoint speaks \
             SPDY/3.1 and WebSocket)"
                .into(),
        ));
    }
    if wants("websocket") {
        let key = headers
            .get(SEC_WEBSOCKET_KEY)
            .and_then(|v| v.to_str().ok())
            .filter(|k| !k.is_empty())
            .ok_or_else(|| Refusal::BadRequest("unable to upgrade: no Sec-WebSocket-Key".into()))?;
        let offered = values(headers, SEC_WEBSOCKET_PROTOCOL);
        let version = V::WEBSOCKET
            .iter()
            .find(|v| offered.contains(&v.name()))
            .ok_or_else(|| no_common(&offered, V::WEBSOCKET))?;
        return Ok(Negotiated {
            transport: Transport::WebSocket {
                key: key.to_string(),
            },
            version: *version,
        });
    }
    if wants("SPDY/3.1") {
        let offered = values(headers, STREAM_PROTOCOL_HEADER);
        let version = offered
            .iter()
            .find_map(|o| V::SPDY.iter().find(|v| v.name() == *o))
            .ok_or_else(|| no_common(&offered, V::SPDY))?;
        return Ok(Negotiated {
            transport: Transport::Spdy,
            version: *version,
        });
    }
    Err(Refusal::BadRequest(format!(
        "unable to upgrade: unsupported upgrade {upgrade:?} (this endpoint speaks SPDY/3.1 and \
         WebSocket)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::stream::version::{PortForwardVersion, RemoteCommandVersion};

    fn remote_command(h: &HeaderMap) -> Result<Negotiated<RemoteCommandVersion>, Refusal> {
        negotiate(h)
    }

    fn port_forward(h: &HeaderMap) -> Result<Negotiated<PortForwardVersion>, Refusal> {
        negotiate(h)
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).expect("a valid header name"),
                v.parse().expect("a valid header value"),
            );
        }
        h
    }

    #[test]
    fn spdy_picks_the_clients_first_served_version() {
        let h = headers(&[
            ("Connection", "Upgrade"),
            ("Upgrade", "SPDY/3.1"),
            ("X-Stream-Protocol-Version", "v6.channel.k8s.io"),
            ("X-Stream-Protocol-Version", "v3.channel.k8s.io"),
            ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
        ]);
        assert_eq!(
            remote_command(&h),
            Ok(Negotiated {
                transport: Transport::Spdy,
                version: RemoteCommandVersion::V3
            })
        );
        let h = headers(&[
            ("Connection", "keep-alive, upgrade"),
            ("Upgrade", "spdy/3.1"),
            ("X-Stream-Protocol-Version", "portforward.k8s.io"),
        ]);
        assert_eq!(
            port_forward(&h),
            Ok(Negotiated {
                transport: Transport::Spdy,
                version: PortForwardVersion::Spdy
            })
        );
        assert!(matches!(remote_command(&h), Err(Refusal::Forbidden(_))));
    }

    #[test]
    fn websocket_picks_the_servers_preferred_version() {
        let h = headers(&[
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            (
                "Sec-WebSocket-Protocol",
                "v4.channel.k8s.io, v5.channel.k8s.io",
            ),
        ]);
        assert_eq!(
            remote_command(&h),
            Ok(Negotiated {
                transport: Transport::WebSocket {
                    key: "dGhlIHNhbXBsZSBub25jZQ==".into()
                },
                version: RemoteCommandVersion::V5
            })
        );
        let h = headers(&[
            ("Connection", "Upgrade"),
            ("Upgrade", "WebSocket"),
            ("Sec-WebSocket-Key", "k"),
            ("Sec-WebSocket-Protocol", "SPDY/3.1+portforward.k8s.io"),
        ]);
        assert_eq!(
            port_forward(&h),
            Ok(Negotiated {
                transport: Transport::WebSocket { key: "k".into() },
                version: PortForwardVersion::WebSocketTunnel
            })
        );
    }

    #[test]
    fn refusals() {
        let no_upgrade = headers(&[("X-Stream-Protocol-Version", "v4.channel.k8s.io")]);
        assert!(matches!(
            remote_command(&no_upgrade),
            Err(Refusal::BadRequest(_))
        ));
        let no_connection = headers(&[("Upgrade", "SPDY/3.1")]);
        assert!(matches!(
            remote_command(&no_connection),
            Err(Refusal::BadRequest(_))
        ));
        let h2c = headers(&[("Connection", "Upgrade"), ("Upgrade", "h2c")]);
        assert!(matches!(remote_command(&h2c), Err(Refusal::BadRequest(_))));
        let no_version = headers(&[("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")]);
        assert!(matches!(
            remote_command(&no_version),
            Err(Refusal::Forbidden(_))
        ));
        let no_key = headers(&[
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Protocol", "v5.channel.k8s.io"),
        ]);
        assert!(matches!(
            remote_command(&no_key),
            Err(Refusal::BadRequest(_))
        ));
        let old = headers(&[
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Key", "k"),
            ("Sec-WebSocket-Protocol", "v9.channel.k8s.io"),
        ]);
        match remote_command(&old) {
            Err(Refusal::Forbidden(m)) => assert!(
                m.contains("v9.channel.k8s.io")
                    && m.contains(r#"["v5.channel.k8s.io", "v4.channel.k8s.io", "#),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
    }
}
