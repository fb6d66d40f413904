//! One connection to a Pod address: `PODIP:PORT` relayed to the guest's
//! port `PORT` through sandboxd's `/ports` relay with the claim's token, as
//! port-forward does (docs/pod-network.md). Before anything reaches
//! sandboxd the connection is checked: the NetworkPolicies selecting the
//! Pod must allow its source and port, and the Pod's lookup (bound here,
//! tracked, not being deleted, holding the claim the listener was made for)
//! must still name the sandbox: a relay wakes a hibernated VM, so nothing
//! is relayed for a Pod that is going away.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpStream;
use tracing::{debug, info};

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};

/// Whether a connection may reach a Pod (NetworkPolicy, docs/networkpolicy.md).
pub trait Admission: Send + Sync {
    /// `Err(why)`: refused, `why` for the log.
    fn admit(&self, ns: &str, pod: &str, source: std::net::IpAddr, port: u16)
    -> Result<(), String>;
}

/// Every connection is admitted (no NetworkPolicy enforcement configured).
pub struct AdmitAll;

impl Admission for AdmitAll {
    fn admit(&self, _: &str, _: &str, _: std::net::IpAddr, _: u16) -> Result<(), String> {
        Ok(())
    }
}

/// A byte stream to a guest port.
pub trait GuestIo: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> GuestIo for T {}

/// The way to a guest port of the sandbox a Pod holds (the kubelet API's
/// lookup and sandboxd's `/ports` relay, `kubelet/pod_address.rs`).
pub trait GuestPorts: Send + Sync {
    /// A relay to `port` in sandbox `id`, provided Pod `key` still holds
    /// it (bound here, tracked, not being deleted).
    fn open<'a>(
        &'a self,
        key: &'a str,
        id: &'a str,
        port: u16,
    ) -> BoxFuture<'a, Result<Box<dyn GuestIo>, Refused>>;
}

/// What a relay needs, shared by every listener.
pub struct Relaying {
    pub guest: Arc<dyn GuestPorts>,
    pub admission: Arc<dyn Admission>,
    pub counts: Arc<Counts>,
}

/// Connections by outcome, read by the metrics at scrape time.
#[derive(Debug, Default)]
pub struct Counts {
    pub relayed: std::sync::atomic::AtomicU64,
    pub refused_policy: std::sync::atomic::AtomicU64,
    pub refused_gone: std::sync::atomic::AtomicU64,
    pub refused_guest: std::sync::atomic::AtomicU64,
    pub failed: std::sync::atomic::AtomicU64,
}

/// How a connection ended before any byte was relayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No NetworkPolicy selecting the Pod allows the source and port.
    Policy(String),
    /// The Pod no longer holds this sandbox (deleted, being deleted,
    /// another claim).
    Gone(String),
    /// Nothing listens on the port inside the sandbox.
    Guest(String),
    /// sandboxd could not be asked, or answered otherwise.
    Failed(String),
}

/// Bytes buffered each way of a relayed connection: tokio's default (8 KiB)
/// costs a system call per 8 KiB on both hops; 64 KiB keeps a bulk transfer
/// near the direct `/ports` relay's rate (`make bench`, docs/benchmarks.md)
/// for 128 KiB per open connection.
const COPY_BUF: usize = 64 * 1024;

/// Serves one accepted connection to `key`'s sandbox `id` on `port`.
pub async fn serve(
    relaying: &Relaying,
    mut conn: TcpStream,
    peer: SocketAddr,
    key: &str,
    id: &str,
    port: u16,
) {
    use std::sync::atomic::Ordering::Relaxed;
    match open(relaying, peer, key, id, port).await {
        Ok(mut guest) => {
            relaying.counts.relayed.fetch_add(1, Relaxed);
            let _ = conn.set_nodelay(true);
            let copied =
                tokio::io::copy_bidirectional_with_sizes(&mut conn, &mut guest, COPY_BUF, COPY_BUF)
                    .await;
            match copied {
                Ok((up, down)) => debug!(%peer, port, up, down, "Pod-address connection ended"),
                Err(e) => debug!(%peer, port, error = %e, "Pod-address connection broke"),
            }
        }
        Err(refused) => {
            let counter = match &refused {
                Refused::Policy(_) => &relaying.counts.refused_policy,
                Refused::Gone(_) => &relaying.counts.refused_gone,
                Refused::Guest(_) => &relaying.counts.refused_guest,
                Refused::Failed(_) => &relaying.counts.failed,
            };
            counter.fetch_add(1, Relaxed);
            info!(%peer, port, ?refused, "Pod-address connection refused");
            reset(conn);
        }
    }
}

/// The guest side of a connection, or why there is none.
async fn open(
    relaying: &Relaying,
    peer: SocketAddr,
    key: &str,
    id: &str,
    port: u16,
) -> Result<Box<dyn GuestIo>, Refused> {
    let (ns, name) = key.split_once('/').unwrap_or(("default", key));
    relaying
        .admission
        .admit(ns, name, peer.ip(), port)
        .map_err(Refused::Policy)?;
    relaying.guest.open(key, id, port).await
}

/// Ends a connection with a reset: the client sees "connection refused"
/// at once (as from a port where nothing listens), not a hang or an empty
/// reply.
fn reset(conn: TcpStream) {
    // Deprecated for blocking the thread on drop while data waits to be
    // sent; a zero linger sends nothing and resets at once.
    #[allow(deprecated)]
    let _ = conn.set_linger(Some(std::time::Duration::ZERO));
    drop(conn);
}
