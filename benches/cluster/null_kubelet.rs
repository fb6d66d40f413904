//! A kubelet API that does nothing, in a process of its own: TLS 1.3 with a
//! self-signed ECDSA P-256 certificate and the ring provider (as
//! vk-sandbox's), a WebSocket upgrade to `v5.channel.k8s.io`, a `Success`
//! status on the error channel, a close. The bench's exec client times it
//! exactly as it times vk-sandbox's kubelet API, interleaved with it: what
//! any kubelet API built on these crates pays on this machine for the new
//! connection an exec opens, before it does any work (docs/benchmarks.md,
//! "Exec: the connection set-up's floor").
//!
//! The bench binary runs itself with [`MODE_VAR`] set to start it; the
//! server prints its port on stdout and exits when its stdin closes (when
//! the bench ends, however it ends).

use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};

use super::die;

/// Set (to anything) in the environment of the bench binary's child that
/// serves the null kubelet API.
pub const MODE_VAR: &str = "BENCH_NULL_KUBELET";

/// The status frame a successful exec ends with (channel 3).
const SUCCESS: &[u8] = b"\x03{\"metadata\":{},\"status\":\"Success\"}";

/// A running null kubelet API; the process ends when this is dropped.
pub struct NullKubelet {
    pub port: u16,
    _child: tokio::process::Child,
}

/// Start the null kubelet API (the bench binary again, in its mode).
pub async fn start() -> NullKubelet {
    let exe = std::env::current_exe().unwrap_or_else(|e| die(&format!("the bench binary: {e}")));
    let mut child = tokio::process::Command::new(exe)
        .env(MODE_VAR, "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| die(&format!("start the null kubelet API: {e}")));
    let mut out = child
        .stdout
        .take()
        .unwrap_or_else(|| die("the null kubelet API's stdout"));
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while out.read(&mut byte).await.unwrap_or(0) == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    let port = String::from_utf8_lossy(&line)
        .trim()
        .parse()
        .unwrap_or_else(|_| {
            die(&format!(
                "the null kubelet API printed {line:?}, not a port"
            ))
        });
    NullKubelet {
        port,
        _child: child,
    }
}

/// The child's whole life: serve until stdin closes.
pub fn serve() {
    // One thread, as vk-sandbox's kubelet API has.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| die(&format!("tokio runtime: {e}")));
    rt.block_on(async {
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])
            .unwrap_or_else(|e| die(&format!("certificate: {e}")));
        let key = rustls_pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
        let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .unwrap_or_else(|e| die(&format!("TLS versions: {e}")))
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap_or_else(|e| die(&format!("TLS config: {e}")));
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| die(&format!("bind: {e}")));
        let port = l
            .local_addr()
            .unwrap_or_else(|e| die(&format!("address: {e}")))
            .port();
        println!("{port}");
        // The bench holds our stdin; its end (exit, crash, kill) closes it.
        std::thread::spawn(|| {
            let mut buf = [0u8; 64];
            while std::io::Read::read(&mut std::io::stdin(), &mut buf).unwrap_or(0) > 0 {}
            std::process::exit(0);
        });
        while let Ok((tcp, _)) = l.accept().await {
            tcp.set_nodelay(true).ok();
            tokio::spawn(one(acceptor.clone(), tcp));
        }
    });
}

async fn one(acceptor: tokio_rustls::TlsAcceptor, tcp: tokio::net::TcpStream) {
    let Ok(tls) = acceptor.accept(tcp).await else {
        return;
    };
    // tungstenite's callback type fixes the error's size.
    #[allow(clippy::result_large_err)]
    let v5 = |_: &Request, mut resp: Response| {
        resp.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            http::HeaderValue::from_static("v5.channel.k8s.io"),
        );
        Ok::<_, ErrorResponse>(resp)
    };
    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tls, v5).await else {
        return;
    };
    if ws.send(Message::Binary(SUCCESS.into())).await.is_err() {
        return;
    }
    let _ = ws.close(None).await;
    while let Some(Ok(_)) = ws.next().await {}
}
