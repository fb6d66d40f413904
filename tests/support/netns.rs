//! A network namespace of a test's own, with a Pod address range routed
//! locally (what the operator does on a node, docs/pod-network.md), and
//! removed when dropped, also when the test fails: private-range addresses
//! are targets only in there, never in the host's namespace.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use vk_sandbox::podnet::netns::PodNetns;

pub struct TestNetns {
    name: String,
}

fn ip(args: &[&str]) -> bool {
    std::process::Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

impl TestNetns {
    /// `None` when no namespace can be made (not root).
    pub fn make(prefix: &str, range: &str) -> Option<TestNetns> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        if !ip(&["netns", "add", &name]) {
            return None;
        }
        let ns = TestNetns { name };
        assert!(ip(&["-n", &ns.name, "link", "set", "lo", "up"]));
        assert!(ip(&[
            "-n", &ns.name, "route", "add", "local", range, "dev", "lo"
        ]));
        Some(ns)
    }

    /// [`TestNetns::make`] for an end-to-end test: `None` (the test is
    /// skipped, and says so) only where the cluster tiers are not required.
    pub fn make_or_skip(prefix: &str, range: &str) -> Option<TestNetns> {
        let net = TestNetns::make(prefix, range);
        if net.is_none() {
            assert!(
                std::env::var_os("VK_REQUIRE_CLUSTER").is_none(),
                "cannot make a network namespace (ip netns add needs root)"
            );
            println!("SKIPPED: cannot make a network namespace");
        }
        net
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <this namespace> ARGS`; panics when it fails.
    pub fn ip(&self, args: &[&str]) {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        assert!(ip(&all), "ip {all:?} failed");
    }

    /// An address of the namespace's own (on its loopback), and the one
    /// its connections into `range` come from: as a Pod's address is the
    /// source of what the Pod sends.
    pub fn source_for(&self, range: &str, addr: &str) {
        self.ip(&["addr", "add", &format!("{addr}/32"), "dev", "lo"]);
        self.ip(&["route", "replace", "local", range, "dev", "lo", "src", addr]);
    }

    /// Connects to `addr` from inside the namespace, says "who", and
    /// returns the first answer, or the error.
    pub fn ask(&self, addr: SocketAddr) -> Result<String, String> {
        let ns = PodNetns::new(Some(self.path()));
        let mut s = ns
            .within(move || TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let mut talk = || -> std::io::Result<String> {
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(b"who\n")?;
            let mut buf = [0u8; 256];
            match s.read(&mut buf)? {
                0 => Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "closed without a byte",
                )),
                n => Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string()),
            }
        };
        talk().map_err(|e| format!("read from {addr}: {e}"))
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "delete", &self.name]);
    }
}

/// A loopback server answering every connection with `name`.
pub async fn naming_server(name: &'static str) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 64];
                let _ = c.read(&mut buf).await;
                let _ = c.write_all(format!("{name}\n").as_bytes()).await;
            });
        }
    });
    addr
}

/// Relays every connection to a loopback port of the host's namespace to
/// `to`, dialled from inside `net` (`None`: the host's), or the other way:
/// with `listen_in`, the listener is made inside that namespace. Returns
/// the port it listens on (on 127.0.0.1 of wherever it listens).
pub async fn forward(listen_in: Option<PathBuf>, dial_in: Option<PathBuf>, to: SocketAddr) -> u16 {
    let listener = PodNetns::new(listen_in)
        .within(|| {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .expect("bind the forwarder");
    let listener = tokio::net::TcpListener::from_std(listener).expect("forwarder to tokio");
    let port = listener.local_addr().expect("forwarder address").port();
    let dial = PodNetns::new(dial_in);
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let Ok(socket) = dial.within(tokio::net::TcpSocket::new_v4) else {
                continue;
            };
            tokio::spawn(async move {
                if let Ok(mut out) = socket.connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    });
    port
}
