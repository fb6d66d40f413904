//! A small SPDY/3.1 client for tests: upgrades an HTTPS connection to the
//! kubelet API (as the apiserver does, HTTP/1.1) and opens streams the way
//! client-go does, so a test can check what kubectl cannot show (one
//! connection's error while another goes on, the server's half-close).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use vk_sandbox::spdy::frame::{self, Frame, MAX_PAYLOAD};
use vk_sandbox::spdy::headers::{Deflater, Inflater, decode_block, encode_block};

/// What the server sent on a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Reply,
    Data(Bytes),
    Fin,
    Reset(u32),
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

pub struct Client {
    out: mpsc::Sender<Vec<u8>>,
    deflater: Mutex<Deflater>,
    streams: Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Event>>>>,
    next_id: Mutex<u32>,
    /// GOAWAY seen, or the connection ended.
    pub ended: Arc<tokio::sync::Notify>,
    /// The connection's reader and writer tasks.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// A stream opened by the client.
pub struct ClientStream {
    pub id: u32,
    pub events: mpsc::UnboundedReceiver<Event>,
    /// Events received so far (named when one does not come).
    seen: usize,
    /// Data bytes received so far.
    bytes: usize,
}

impl ClientStream {
    /// The next event within 20 s.
    pub async fn next(&mut self) -> Option<Event> {
        let event = tokio::time::timeout(Duration::from_secs(20), self.events.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no SPDY event within 20 s on stream {} after {} events ({} data bytes)",
                    self.id, self.seen, self.bytes
                )
            });
        self.seen += 1;
        if let Some(Event::Data(d)) = &event {
            self.bytes += d.len();
        }
        event
    }

    /// All data until FIN or reset; the end event.
    pub async fn read_to_end(&mut self) -> (Vec<u8>, Event) {
        let mut data = Vec::new();
        loop {
            match self.next().await {
                Some(Event::Data(d)) => data.extend_from_slice(&d),
                Some(Event::Reply) => {}
                Some(end) => return (data, end),
                None => return (data, Event::Reset(0)),
            }
        }
    }
}

fn tls_config() -> Arc<rustls::ClientConfig> {
    #[derive(Debug)]
    struct AnyCert;
    impl rustls::client::danger::ServerCertVerifier for AnyCert {
        fn verify_server_cert(
            &self,
            _: &rustls_pki_types::CertificateDer<'_>,
            _: &[rustls_pki_types::CertificateDer<'_>],
            _: &rustls_pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls_pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &rustls_pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &rustls_pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            rustls::crypto::ring::default_provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
    let mut cfg = rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert))
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

/// A TLS connection to the kubelet API on `127.0.0.1:{port}` (HTTP/1.1,
/// any server certificate).
pub async fn tls_to(port: u16) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    vk_sandbox::crypto::install_provider();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the kubelet API");
    tcp.set_nodelay(true).expect("nodelay");
    tokio_rustls::TlsConnector::from(tls_config())
        .connect(
            rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name"),
            tcp,
        )
        .await
        .expect("TLS handshake")
}

/// The status line and headers of an HTTP response, and what followed.
pub struct Head {
    pub status: u16,
    pub text: String,
}

/// Send an upgrade request to `https://127.0.0.1:{port}{path}`; on `101`
/// a client, otherwise the response head and body.
pub async fn connect(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Client, Head> {
    let mut io: Box<dyn Io> = Box::new(tls_to(port).await);
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nContent-Length: 0\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    io.write_all(req.as_bytes())
        .await
        .expect("send the request");
    let mut buf = BytesMut::new();
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = io.read_buf(&mut buf).await.expect("read the response");
        assert!(n > 0, "connection closed before a response");
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let rest = buf.split_off(end);
    if status != 101 {
        let mut body = rest.to_vec();
        let _ = tokio::time::timeout(Duration::from_secs(5), io.read_to_end(&mut body)).await;
        return Err(Head {
            status,
            text: format!("{head}{}", String::from_utf8_lossy(&body)),
        });
    }
    Ok(Client::start(io, rest))
}

impl Client {
    fn start(io: Box<dyn Io>, already: BytesMut) -> Client {
        let (mut read, mut write) = tokio::io::split(io);
        let (out, mut rx) = mpsc::channel::<Vec<u8>>(64);
        let writer = tokio::spawn(async move {
            // Frames already queued go out in one write (up to 256 KiB), as
            // a client on a bufio.Writer sends them.
            while let Some(mut b) = rx.recv().await {
                while b.len() < 256 * 1024 {
                    match rx.try_recv() {
                        Ok(more) => b.extend_from_slice(&more),
                        Err(_) => break,
                    }
                }
                // Flushed: a TLS stream keeps what the socket could not take
                // in its buffer until the next write or a flush, and there
                // may be no next write (the last frames and the FIN of a
                // transfer would wait for ever).
                if write.write_all(&b).await.is_err() || write.flush().await.is_err() {
                    return;
                }
            }
            let _ = write.shutdown().await;
        });
        let streams: Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Event>>>> = Arc::default();
        let ended = Arc::new(tokio::sync::Notify::new());
        let (s2, e2, out2) = (Arc::clone(&streams), Arc::clone(&ended), out.clone());
        let reader = tokio::spawn(async move {
            let mut buf = already;
            let mut inflater = Inflater::new();
            let send = |id: u32, ev: Event| {
                if let Some(tx) = s2.lock().unwrap().get(&id) {
                    let _ = tx.send(ev);
                }
            };
            loop {
                while let Some(f) = frame::decode(&mut buf, MAX_PAYLOAD).expect("valid frames") {
                    match f {
                        Frame::SynReply {
                            stream_id,
                            header_block,
                            ..
                        } => {
                            let raw = inflater.decompress(&header_block).expect("inflate");
                            decode_block(&raw).expect("a header block");
                            send(stream_id, Event::Reply);
                        }
                        Frame::Data {
                            stream_id,
                            fin,
                            data,
                        } => {
                            if !data.is_empty() {
                                send(stream_id, Event::Data(data));
                            }
                            if fin {
                                send(stream_id, Event::Fin);
                            }
                        }
                        Frame::RstStream { stream_id, status } => {
                            send(stream_id, Event::Reset(status));
                        }
                        Frame::Ping { id } if id % 2 == 0 => {
                            let mut b = BytesMut::new();
                            frame::encode(&Frame::Ping { id }, &mut b).expect("ping");
                            let _ = out2.send(b.to_vec()).await;
                        }
                        Frame::GoAway { .. } => e2.notify_waiters(),
                        _ => {}
                    }
                }
                match read.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => {
                        e2.notify_waiters();
                        return;
                    }
                    Ok(_) => {}
                }
            }
        });
        Client {
            out,
            deflater: Mutex::new(Deflater::new().expect("deflater")),
            streams,
            next_id: Mutex::new(1),
            ended,
            tasks: vec![writer, reader],
        }
    }

    /// Hang up: the connection is closed at once, whatever is unsent or
    /// unread (as a client process that exits).
    pub async fn hang_up(self) {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
    }

    async fn send(&self, f: Frame) {
        let mut b = BytesMut::new();
        frame::encode(&f, &mut b).expect("encode");
        self.out.send(Vec::from(b)).await.expect("connection open");
    }

    /// Open a stream with `headers` (awaits nothing).
    pub async fn open(&self, headers: &[(&str, &str)]) -> ClientStream {
        let id = {
            let mut n = self.next_id.lock().unwrap();
            let id = *n;
            *n += 2;
            id
        };
        let (tx, rx) = mpsc::unbounded_channel();
        self.streams.lock().unwrap().insert(id, tx);
        let block = self
            .deflater
            .lock()
            .unwrap()
            .compress(&encode_block(headers))
            .expect("compress");
        self.send(Frame::SynStream {
            stream_id: id,
            associated_to: 0,
            priority: 0,
            slot: 0,
            fin: false,
            unidirectional: false,
            header_block: block.into(),
        })
        .await;
        ClientStream {
            id,
            events: rx,
            seen: 0,
            bytes: 0,
        }
    }

    pub async fn write(&self, id: u32, data: &[u8]) {
        for chunk in data.chunks(32 * 1024) {
            self.send(Frame::Data {
                stream_id: id,
                fin: false,
                data: Bytes::copy_from_slice(chunk),
            })
            .await;
        }
    }

    /// `data` on stream `id` in DATA frames of `frame` bytes.
    pub async fn write_frames(&self, id: u32, data: &[u8], frame: usize) {
        for chunk in data.chunks(frame) {
            self.send(Frame::Data {
                stream_id: id,
                fin: false,
                data: Bytes::copy_from_slice(chunk),
            })
            .await;
        }
    }

    pub async fn finish(&self, id: u32) {
        self.send(Frame::Data {
            stream_id: id,
            fin: true,
            data: Bytes::new(),
        })
        .await;
    }

    pub async fn reset(&self, id: u32) {
        self.send(Frame::RstStream {
            stream_id: id,
            status: frame::rst::CANCEL,
        })
        .await;
    }

    pub async fn ping(&self, id: u32) {
        self.send(Frame::Ping { id }).await;
    }
}
