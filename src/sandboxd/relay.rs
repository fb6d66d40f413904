//! The two upgrades: `GET /v1/sandboxes/{id}/agent` (`Upgrade: silkd`, the
//! in-guest agent's newline-delimited JSON frames) and
//! `GET /v1/sandboxes/{id}/ports/{port}` (`Upgrade: tcp`, a raw byte stream
//! to the guest's loopback port). Both are HTTP/1.1 upgrades, not WebSocket
//! or SPDY: after sandboxd's `101` the connection carries the relay's bytes
//! both ways (docs/architecture.md#sandboxd-api).

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use reqwest::header::{CONNECTION, UPGRADE};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::auth::{Credential, authorization};
use super::client::{SandboxdClient, read_reply, transport};
use super::decode::RawReply;
use super::error::{Op, SandboxdError};
use super::types::Secret;
use super::verbs_decode::{decode_upgrade, refused};
use super::verbs_types::SandboxAuth;

/// The `Upgrade` protocol of the agent relay.
pub const AGENT_PROTOCOL: &str = "silkd";
/// The `Upgrade` protocol of the port relay.
pub const PORT_PROTOCOL: &str = "tcp";

/// An open relay after sandboxd's `101 Switching Protocols`: a
/// bidirectional byte stream (`tokio::io::AsyncRead + AsyncWrite + Unpin +
/// Send + 'static`). Bytes sandboxd sent right behind its `101` are kept
/// and read first. The client's request timeout does not apply to it: a
/// relay lives until either side closes it.
///
/// - Agent relay: never shut down the write side while expecting replies;
///   sandboxd reads a client EOF on `/agent` as "client gone" and aborts the
///   guest connection. End input with the agent's own frames.
/// - Port relay: `shutdown()` half-closes (the guest socket sees EOF) and
///   reading goes on until the guest closes its side.
pub struct RelayStream {
    inner: reqwest::Upgraded,
}

impl fmt::Debug for RelayStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RelayStream").finish_non_exhaustive()
    }
}

impl AsyncRead for RelayStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for RelayStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl SandboxdClient {
    /// Open the agent relay with the claim's own token (sandboxd refuses
    /// the root token here with `404`). Wakes a hibernated or archived
    /// sandbox first, and holds it against idle hibernation while open.
    /// Refusals: `401` no token, `404` unknown sandbox or wrong token,
    /// `409` failed sandbox, `502` agent unreachable, `500` the wake failed.
    pub async fn agent(&self, id: &str, token: &Secret) -> Result<RelayStream, SandboxdError> {
        let op = Op::Agent;
        let url = self.sandbox_url(op, id, "/agent")?;
        let credential = Credential::Sandbox(SandboxAuth::Token(token));
        self.upgrade(op, id, url, credential, AGENT_PROTOCOL).await
    }

    /// Open a port relay to `127.0.0.1:port` inside the guest with the
    /// claim's own token: wakes a paused sandbox and counts as activity.
    /// `502` ([`super::Refusal::GuestUnreachable`]) when nothing listens
    /// there; `400` for port 0.
    pub async fn port(
        &self,
        id: &str,
        token: &Secret,
        port: u16,
    ) -> Result<RelayStream, SandboxdError> {
        let op = Op::Port;
        let url = self.sandbox_url(op, id, &format!("/ports/{port}"))?;
        let credential = Credential::Sandbox(SandboxAuth::Token(token));
        self.upgrade(op, id, url, credential, PORT_PROTOCOL).await
    }

    /// A passive port relay with the node (root) token (late builds): it
    /// never wakes the sandbox nor counts as activity, and answers `409` at
    /// once for a paused sandbox or one in a transition. Earlier builds
    /// answer `404` (root is not the sandbox's token).
    pub async fn port_as_node(&self, id: &str, port: u16) -> Result<RelayStream, SandboxdError> {
        let op = Op::Port;
        let url = self.sandbox_url(op, id, &format!("/ports/{port}"))?;
        let credential = Credential::Sandbox(SandboxAuth::Node);
        self.upgrade(op, id, url, credential, PORT_PROTOCOL).await
    }

    async fn upgrade(
        &self,
        op: Op,
        id: &str,
        url: String,
        credential: Credential<'_>,
        protocol: &'static str,
    ) -> Result<RelayStream, SandboxdError> {
        let auth = authorization(self.inner.token.as_ref(), op, id, credential)?;
        self.observed(op, async {
            let mut req = self
                .inner
                .relay_http
                .get(url)
                .header(UPGRADE, protocol)
                .header(CONNECTION, "Upgrade");
            if let Some(value) = auth {
                req = req.header(reqwest::header::AUTHORIZATION, value);
            }
            let response = req.send().await.map_err(|e| transport(op, e))?;
            let status = response.status().as_u16();
            if status != 101 {
                let reply = read_reply(op, response).await?;
                return Err(refused(op, &reply));
            }
            let upgrade = response
                .headers()
                .get(UPGRADE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            decode_upgrade(
                op,
                &RawReply::new(101, Vec::new()),
                upgrade.as_deref(),
                protocol,
            )?;
            let inner = response.upgrade().await.map_err(|e| transport(op, e))?;
            Ok(RelayStream { inner })
        })
        .await
    }
}
