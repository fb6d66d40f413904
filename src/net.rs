//! Binding the listening sockets (kubelet API, admin port) named by a
//! validated [`ListenAddr`].

use std::io::ErrorKind;
use std::net::SocketAddr;

use crate::config::ListenAddr;

impl ListenAddr {
    /// Socket addresses to bind: for an empty host `[::]` (dual stack where
    /// the kernel allows) then `0.0.0.0`; else the host resolved.
    pub async fn socket_addrs(&self) -> std::io::Result<Vec<SocketAddr>> {
        if self.host.is_empty() {
            return Ok(vec![
                SocketAddr::from(([0u16; 8], self.port)),
                SocketAddr::from(([0u8; 4], self.port)),
            ]);
        }
        if let Ok(ip) = self.host.parse::<std::net::IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, self.port)]);
        }
        Ok(tokio::net::lookup_host((self.host.as_str(), self.port))
            .await?
            .collect())
    }

    /// Bind a TCP listener on the first address that works.
    pub async fn bind(&self) -> std::io::Result<tokio::net::TcpListener> {
        let mut last = None;
        for addr in self.socket_addrs().await? {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(listener) => return Ok(listener),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            std::io::Error::new(
                ErrorKind::AddrNotAvailable,
                format!("{self} resolves to no address"),
            )
        }))
    }
}
