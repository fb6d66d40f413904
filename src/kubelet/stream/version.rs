//! The protocol versions the streaming routes serve, and what each means,
//! in one place (docs/streaming.md#protocols). [`super::negotiate`] picks
//! one by its name; past it, a version is a `match`, never a name. Pure.

/// A family of protocol versions a route serves.
pub trait Version: Copy + Eq + std::fmt::Debug + 'static {
    /// Served over SPDY/3.1 (the client's order of preference decides).
    const SPDY: &'static [Self];
    /// Served over a WebSocket, this side's preferred first.
    const WEBSOCKET: &'static [Self];
    /// The name on the wire (`X-Stream-Protocol-Version`,
    /// `Sec-WebSocket-Protocol`).
    fn name(self) -> &'static str;
}

/// A remote-command (exec, attach) version.
///
/// | version | name | status | resize | framing (WebSocket) | stdin end (WebSocket) |
/// |---|---|---|---|---|---|
/// | `V5` | `v5.channel.k8s.io` | `v1.Status` JSON | yes | binary | close signal `[255, 0]` |
/// | `V4` | `v4.channel.k8s.io` | `v1.Status` JSON | yes | binary | connection close |
/// | `V4Base64` | `v4.base64.channel.k8s.io` | `v1.Status` JSON | yes | digit + base64 text | connection close |
/// | `V3` | `v3.channel.k8s.io` (SPDY) | text | yes | | |
/// | `V2` | `v2.channel.k8s.io` (SPDY) | text | no | | |
/// | `V1` | `channel.k8s.io` (WebSocket) | text | yes | binary | connection close |
/// | `V1Base64` | `base64.channel.k8s.io` (WebSocket) | text | yes | digit + base64 text | connection close |
///
/// v5 over SPDY is v4: the apiserver's translator offers it first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteCommandVersion {
    V5,
    V4,
    V4Base64,
    V3,
    V2,
    V1,
    V1Base64,
}

impl RemoteCommandVersion {
    /// Whether the client sends terminal sizes (on a `resize` stream or
    /// channel).
    pub const fn resize(self) -> bool {
        !matches!(self, Self::V2)
    }

    /// Whether the status is a `v1.Status` (JSON, exit codes included);
    /// before v4 it is the failure's text, and nothing on success.
    pub const fn status_json(self) -> bool {
        matches!(self, Self::V5 | Self::V4 | Self::V4Base64)
    }

    /// Whether WebSocket messages are text: a channel digit and base64.
    pub const fn base64(self) -> bool {
        matches!(self, Self::V4Base64 | Self::V1Base64)
    }

    /// Whether the client ends a channel with a close signal
    /// (`[255, channel]`).
    pub const fn close_signal(self) -> bool {
        matches!(self, Self::V5)
    }
}

impl Version for RemoteCommandVersion {
    const SPDY: &'static [Self] = &[Self::V5, Self::V4, Self::V3, Self::V2];
    const WEBSOCKET: &'static [Self] =
        &[Self::V5, Self::V4, Self::V4Base64, Self::V1, Self::V1Base64];

    fn name(self) -> &'static str {
        match self {
            Self::V5 => "v5.channel.k8s.io",
            Self::V4 => "v4.channel.k8s.io",
            Self::V4Base64 => "v4.base64.channel.k8s.io",
            Self::V3 => "v3.channel.k8s.io",
            Self::V2 => "v2.channel.k8s.io",
            Self::V1 => "channel.k8s.io",
            Self::V1Base64 => "base64.channel.k8s.io",
        }
    }
}

/// The port-forward version: SPDY streams, either on the connection or
/// tunnelled through a WebSocket (kubectl ≥ 1.30).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortForwardVersion {
    Spdy,
    WebSocketTunnel,
}

impl Version for PortForwardVersion {
    const SPDY: &'static [Self] = &[Self::Spdy];
    const WEBSOCKET: &'static [Self] = &[Self::WebSocketTunnel];

    fn name(self) -> &'static str {
        match self {
            Self::Spdy => "portforward.k8s.io",
            Self::WebSocketTunnel => "SPDY/3.1+portforward.k8s.io",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RemoteCommandVersion::*;

    #[test]
    fn what_each_remote_command_version_means() {
        // (version, resize, status JSON, base64, close signal)
        let table = [
            (V5, true, true, false, true),
            (V4, true, true, false, false),
            (V4Base64, true, true, true, false),
            (V3, true, false, false, false),
            (V2, false, false, false, false),
            (V1, true, false, false, false),
            (V1Base64, true, false, true, false),
        ];
        for (v, resize, json, base64, close) in table {
            assert_eq!(
                (v.resize(), v.status_json(), v.base64(), v.close_signal()),
                (resize, json, base64, close),
                "{v:?}"
            );
        }
    }

    #[test]
    fn names_are_distinct_and_each_served_somewhere() {
        let all = [V5, V4, V4Base64, V3, V2, V1, V1Base64];
        let mut names: Vec<_> = all.iter().map(|v| v.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        for v in all {
            assert!(
                RemoteCommandVersion::SPDY.contains(&v)
                    || RemoteCommandVersion::WEBSOCKET.contains(&v),
                "{v:?}"
            );
        }
        assert_ne!(
            PortForwardVersion::Spdy.name(),
            PortForwardVersion::WebSocketTunnel.name()
        );
    }
}
