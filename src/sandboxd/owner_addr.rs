//! `owner_addr` in a claim reply.
//!
//! sandboxd reports its advertise address in one of these shapes:
//! - `host:port`, normally `10.0.0.5:7777` (also `[fd00::1]:7777`);
//! - host-less `:7777` (older builds, when no advertise host is set);
//! - absent (newer builds, same situation);
//! - an origin such as `https://node-a.example:7777` (`client_advertise`).
//!
//! vk-sandbox publishes the host part as the Pod IP. The Go original used the
//! raw string when splitting failed, which turned `:7777` or an origin into a
//! bogus Pod IP; here those cases are a clear error instead.

use std::fmt;
use std::net::IpAddr;

use thiserror::Error;

/// The shapes `owner_addr` comes in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerAddr {
    /// Field absent or empty.
    Absent,
    /// `host:port` with a non-empty host (an IP address or a name).
    HostPort { host: String, port: Option<u16> },
    /// `:port`, no host.
    HostLess { port: Option<u16> },
    /// `scheme://host[:port][/…]`.
    Origin {
        scheme: String,
        host: String,
        port: Option<u16>,
    },
    /// Anything else; kept verbatim.
    Other(String),
}

/// Why no Pod IP can be taken from an `owner_addr`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("no usable address in sandboxd owner_addr {raw:?}: {reason}")]
pub struct NoUsableAddress {
    pub raw: String,
    pub reason: &'static str,
}

impl OwnerAddr {
    /// Classify a raw `owner_addr` value. Never fails.
    pub fn parse(raw: Option<&str>) -> OwnerAddr {
        let raw = match raw.map(str::trim) {
            None | Some("") => return OwnerAddr::Absent,
            Some(raw) => raw,
        };
        if let Some((scheme, rest)) = raw.split_once("://") {
            let valid_scheme = !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
            if !valid_scheme {
                return OwnerAddr::Other(raw.to_string());
            }
            let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
            // Drop any userinfo.
            let authority = authority.rsplit('@').next().unwrap_or_default();
            return match split_host_port(authority) {
                Some((host, port)) if !host.is_empty() => OwnerAddr::Origin {
                    scheme: scheme.to_ascii_lowercase(),
                    host,
                    port,
                },
                _ => OwnerAddr::Other(raw.to_string()),
            };
        }
        match split_host_port(raw) {
            Some((host, port)) if host.is_empty() => OwnerAddr::HostLess { port },
            Some((host, port)) => OwnerAddr::HostPort { host, port },
            None => OwnerAddr::Other(raw.to_string()),
        }
    }

    /// The host part, when there is one.
    pub fn host(&self) -> Option<&str> {
        match self {
            OwnerAddr::HostPort { host, .. } | OwnerAddr::Origin { host, .. } => Some(host),
            _ => None,
        }
    }
}

impl fmt::Display for OwnerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let port = |p: &Option<u16>| p.map(|p| format!(":{p}")).unwrap_or_default();
        let host = |h: &str| {
            if h.contains(':') {
                format!("[{h}]")
            } else {
                h.to_string()
            }
        };
        match self {
            OwnerAddr::Absent => Ok(()),
            OwnerAddr::HostPort { host: h, port: p } => write!(f, "{}{}", host(h), port(p)),
            OwnerAddr::HostLess { port: p } => write!(f, "{}", port(p)),
            OwnerAddr::Origin {
                scheme,
                host: h,
                port: p,
            } => write!(f, "{scheme}://{}{}", host(h), port(p)),
            OwnerAddr::Other(raw) => f.write_str(raw),
        }
    }
}

/// Split `host:port`, `[v6]:port`, `host` or `:port`. The port, when
/// present, must be a valid u16. Returns `None` for malformed input.
fn split_host_port(s: &str) -> Option<(String, Option<u16>)> {
    if s.chars().any(char::is_whitespace) {
        return None;
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        // `[]` or `[[x]`: no host a bracket can hold (and no `Display` that
        // reads back the same).
        if host.is_empty() || host.contains('[') {
            return None;
        }
        let port = match after {
            "" => None,
            p => Some(parse_port(p.strip_prefix(':')?)?),
        };
        return Some((host.to_string(), port));
    }
    match s.matches(':').count() {
        0 => Some((s.to_string(), None)),
        1 => {
            let (host, port) = s.split_once(':')?;
            Some((host.to_string(), Some(parse_port(port)?)))
        }
        // A bare IPv6 address without brackets and without a port.
        _ => s
            .parse::<std::net::Ipv6Addr>()
            .ok()
            .map(|_| (s.to_string(), None)),
    }
}

fn parse_port(p: &str) -> Option<u16> {
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse().ok()
}

/// The Pod IP to publish for a claim, from its `owner_addr`.
///
/// Yields the host part when it is a concrete IP address. A host-less value,
/// an absent value, a host name, an unspecified address (`0.0.0.0`, `::`) or
/// anything malformed is a [`NoUsableAddress`] error, never a bogus IP.
pub fn pod_ip_from_owner_addr(raw: &str) -> Result<IpAddr, NoUsableAddress> {
    let fail = |reason| NoUsableAddress {
        raw: raw.to_string(),
        reason,
    };
    match OwnerAddr::parse(Some(raw)) {
        OwnerAddr::Absent => Err(fail("it is empty")),
        OwnerAddr::HostLess { .. } => Err(fail("it has no host part")),
        OwnerAddr::Other(_) => Err(fail("it is not host:port or an origin")),
        OwnerAddr::HostPort { host, .. } | OwnerAddr::Origin { host, .. } => {
            let ip: IpAddr = host
                .parse()
                .map_err(|_| fail("its host is not an IP address"))?;
            if ip.is_unspecified() {
                return Err(fail("its host is an unspecified address"));
            }
            Ok(ip)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        assert_eq!(OwnerAddr::parse(None), OwnerAddr::Absent);
        assert_eq!(OwnerAddr::parse(Some("")), OwnerAddr::Absent);
        assert_eq!(
            OwnerAddr::parse(Some("10.0.0.5:7777")),
            OwnerAddr::HostPort {
                host: "10.0.0.5".into(),
                port: Some(7777)
            }
        );
        assert_eq!(
            OwnerAddr::parse(Some(":7777")),
            OwnerAddr::HostLess { port: Some(7777) }
        );
        assert_eq!(
            OwnerAddr::parse(Some("https://node-a.example:7777")),
            OwnerAddr::Origin {
                scheme: "https".into(),
                host: "node-a.example".into(),
                port: Some(7777)
            }
        );
        assert_eq!(
            OwnerAddr::parse(Some("[fd00::1]:7777")),
            OwnerAddr::HostPort {
                host: "fd00::1".into(),
                port: Some(7777)
            }
        );
        assert_eq!(
            OwnerAddr::parse(Some("http://10.0.0.9/")),
            OwnerAddr::Origin {
                scheme: "http".into(),
                host: "10.0.0.9".into(),
                port: None
            }
        );
        assert!(matches!(
            OwnerAddr::parse(Some("10.0.0.5:port")),
            OwnerAddr::Other(_)
        ));
        assert!(matches!(
            OwnerAddr::parse(Some("://x")),
            OwnerAddr::Other(_)
        ));
        assert!(matches!(
            OwnerAddr::parse(Some("https://:7777")),
            OwnerAddr::Other(_)
        ));
        // Found by the sandboxd_reply fuzz target: these were a host `[M`
        // and a host-less address, shown as text that classifies otherwise.
        for raw in ["[[M]", "[]", "[]:7777", "http://[[x]:1"] {
            assert!(
                matches!(OwnerAddr::parse(Some(raw)), OwnerAddr::Other(_)),
                "{raw}"
            );
        }
    }

    #[test]
    fn display_round_trips() {
        for raw in [
            "10.0.0.5:7777",
            ":7777",
            "https://node-a.example:7777",
            "[fd00::1]:7777",
        ] {
            assert_eq!(OwnerAddr::parse(Some(raw)).to_string(), raw);
        }
    }

    #[test]
    fn pod_ip_from_host_port_and_ip_origin() {
        assert_eq!(
            pod_ip_from_owner_addr("10.0.0.5:7777"),
            Ok("10.0.0.5".parse().expect("ip"))
        );
        assert_eq!(
            pod_ip_from_owner_addr("10.0.0.5"),
            Ok("10.0.0.5".parse().expect("ip"))
        );
        assert_eq!(
            pod_ip_from_owner_addr("[fd00::1]:7777"),
            Ok("fd00::1".parse().expect("ip"))
        );
        assert_eq!(
            pod_ip_from_owner_addr("https://10.0.0.7:7777"),
            Ok("10.0.0.7".parse().expect("ip"))
        );
    }

    #[test]
    fn no_usable_address_is_an_error_not_a_bogus_ip() {
        for raw in [
            "",
            ":7777",
            "https://node-a.example:7777",
            "node-a.example:7777",
            "0.0.0.0:7777",
            "[::]:7777",
            "10.0.0.5:99999",
            "garbage with spaces",
        ] {
            let err = pod_ip_from_owner_addr(raw).expect_err(raw);
            assert_eq!(err.raw, raw);
            assert!(
                err.to_string().contains("no usable address"),
                "{raw}: {err}"
            );
        }
    }
}
