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

/// The remote-command versions served over SPDY (v5 over SPDY is v4: the
/// apiserver's translator offers it first).
pub const SPDY_REMOTE_COMMAND: [&str; 4] = [
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
];
/// The port-forward version served over SPDY.
pub const SPDY_PORT_FORWARD: &str = "portforward.k8s.io";
/// The remote-command versions served over WebSocket, preferred first.
pub const WS_REMOTE_COMMAND: [&str; 5] = [
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];
/// SPDY port-forward tunnelled through a WebSocket (kubectl ≥ 1.30).
pub const WS_PORT_FORWARD_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";
/// The header carrying SPDY stream protocol versions.
pub const STREAM_PROTOCOL_HEADER: &str = "x-stream-protocol-version";

/// What a request will be served with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Negotiated {
    Spdy { protocol: &'static str },
    WebSocket { protocol: &'static str, key: String },
}

/// Why a request cannot be upgraded; the kubelet's statuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 400: not an upgrade this side speaks.
    BadRequest(String),
    /// 403: no common protocol version.
    Forbidden(String),
}

/// Which kind of request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    RemoteCommand,
    PortForward,
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

/// Decide the protocol of an exec, attach or port-forward request.
pub fn negotiate(headers: &HeaderMap, purpose: Purpose) -> Result<Negotiated, Refusal> {
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
        let served: &[&'static str] = match purpose {
            Purpose::RemoteCommand => &WS_REMOTE_COMMAND,
            Purpose::PortForward => &[WS_PORT_FORWARD_TUNNEL],
        };
        let chosen = served.iter().find(|s| offered.contains(s)).ok_or_else(|| {
            Refusal::Forbidden(format!(
                "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, \
                 server supports {served:?}"
            ))
        })?;
        return Ok(Negotiated::WebSocket {
            protocol: chosen,
            key: key.to_string(),
        });
    }
    if wants("SPDY/3.1") {
        let offered = values(headers, STREAM_PROTOCOL_HEADER);
        let served: &[&'static str] = match purpose {
            Purpose::RemoteCommand => &SPDY_REMOTE_COMMAND,
            Purpose::PortForward => &[SPDY_PORT_FORWARD],
        };
        let chosen = offered
            .iter()
            .find_map(|o| served.iter().find(|s| *s == o))
            .ok_or_else(|| {
                Refusal::Forbidden(format!(
                    "unable to upgrade: unable to negotiate protocol: client supports \
                     {offered:?}, server supports {served:?}"
                ))
            })?;
        return Ok(Negotiated::Spdy { protocol: chosen });
    }
    Err(Refusal::BadRequest(format!(
        "unable to upgrade: unsupported upgrade {upgrade:?} (this endpoint speaks SPDY/3.1 and \
         WebSocket)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
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
            negotiate(&h, Purpose::RemoteCommand),
            Ok(Negotiated::Spdy {
                protocol: "v3.channel.k8s.io"
            })
        );
        let h = headers(&[
            ("Connection", "keep-alive, upgrade"),
            ("Upgrade", "spdy/3.1"),
            ("X-Stream-Protocol-Version", "portforward.k8s.io"),
        ]);
        assert_eq!(
            negotiate(&h, Purpose::PortForward),
            Ok(Negotiated::Spdy {
                protocol: "portforward.k8s.io"
            })
        );
        assert!(matches!(
            negotiate(&h, Purpose::RemoteCommand),
            Err(Refusal::Forbidden(_))
        ));
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
            negotiate(&h, Purpose::RemoteCommand),
            Ok(Negotiated::WebSocket {
                protocol: "v5.channel.k8s.io",
                key: "dGhlIHNhbXBsZSBub25jZQ==".into()
            })
        );
        let h = headers(&[
            ("Connection", "Upgrade"),
            ("Upgrade", "WebSocket"),
            ("Sec-WebSocket-Key", "k"),
            ("Sec-WebSocket-Protocol", "SPDY/3.1+portforward.k8s.io"),
        ]);
        assert_eq!(
            negotiate(&h, Purpose::PortForward),
            Ok(Negotiated::WebSocket {
                protocol: WS_PORT_FORWARD_TUNNEL,
                key: "k".into()
            })
        );
    }

    #[test]
    fn refusals() {
        let no_upgrade = headers(&[("X-Stream-Protocol-Version", "v4.channel.k8s.io")]);
        assert!(matches!(
            negotiate(&no_upgrade, Purpose::RemoteCommand),
            Err(Refusal::BadRequest(_))
        ));
        let no_connection = headers(&[("Upgrade", "SPDY/3.1")]);
        assert!(matches!(
            negotiate(&no_connection, Purpose::RemoteCommand),
            Err(Refusal::BadRequest(_))
        ));
        let h2c = headers(&[("Connection", "Upgrade"), ("Upgrade", "h2c")]);
        assert!(matches!(
            negotiate(&h2c, Purpose::RemoteCommand),
            Err(Refusal::BadRequest(_))
        ));
        let no_version = headers(&[("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")]);
        assert!(matches!(
            negotiate(&no_version, Purpose::RemoteCommand),
            Err(Refusal::Forbidden(_))
        ));
        let no_key = headers(&[
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Protocol", "v5.channel.k8s.io"),
        ]);
        assert!(matches!(
            negotiate(&no_key, Purpose::RemoteCommand),
            Err(Refusal::BadRequest(_))
        ));
        let old = headers(&[
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Key", "k"),
            ("Sec-WebSocket-Protocol", "v9.channel.k8s.io"),
        ]);
        match negotiate(&old, Purpose::RemoteCommand) {
            Err(Refusal::Forbidden(m)) => assert!(m.contains("v9.channel.k8s.io"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
