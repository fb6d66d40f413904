//! Remote command (exec, attach) over a WebSocket: every message is one
//! channel's data, prefixed with its channel number (0 stdin, 1 stdout,
//! 2 stderr, 3 error/status, 4 resize). The versions differ in small ways
//! (framing, status, stdin's end: the table of [`RemoteCommandVersion`]).
//!
//! The server first sends an empty message on its lowest output channel
//! (clients take it as "connected"), and after the status a normal close.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::{BufMut, Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::{SinkExt, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::session::{Opened, StatusSink, status_body};
use super::version::RemoteCommandVersion;
use super::watch::{Watch, Watching};
use super::{ResizeDecoder, StreamOptions};
use crate::activity::Activity;
use crate::kubelet::exec::{Channels, Input, Output};

pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const STATUS: u8 = 3;
pub const RESIZE: u8 = 4;
/// v5's close signal: `[255, channel]`.
pub const CLOSE_SIGNAL: u8 = 255;

/// Largest message accepted from a client.
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;
/// Client stdin messages queued for the command: one (it may be a whole
/// [`MAX_MESSAGE`]; the exec cuts it into bounded frames for the agent),
/// then the reader waits.
const STDIN_QUEUE: usize = 1;

/// How a protocol version frames channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Codec {
    pub base64: bool,
    pub close_signal: bool,
}

/// The codec of a negotiated version.
pub fn codec(version: RemoteCommandVersion) -> Codec {
    Codec {
        base64: version.base64(),
        close_signal: version.close_signal(),
    }
}

/// A message from the client, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    Data(u8, Bytes),
    /// v5: the client closed its side of a channel.
    Close(u8),
    /// Not a channel message (or malformed): ignored.
    Other,
}

impl Codec {
    /// `data` on `channel` as a message.
    pub fn encode(&self, channel: u8, data: &[u8]) -> Message {
        if self.base64 {
            let mut text = String::with_capacity(1 + data.len().div_ceil(3) * 4);
            text.push(char::from(b'0' + channel));
            STANDARD.encode_string(data, &mut text);
            Message::text(text)
        } else {
            let mut b = BytesMut::with_capacity(1 + data.len());
            b.put_u8(channel);
            b.put_slice(data);
            Message::Binary(b.freeze())
        }
    }

    /// What a client message says.
    pub fn decode(&self, msg: &Message) -> Incoming {
        match msg {
            Message::Binary(b) if !self.base64 => match b.first() {
                Some(&CLOSE_SIGNAL) if self.close_signal => match b.get(1) {
                    Some(&ch) => Incoming::Close(ch),
                    None => Incoming::Other,
                },
                Some(&ch) => Incoming::Data(ch, b.slice(1..)),
                None => Incoming::Other,
            },
            Message::Text(t) if self.base64 => {
                let t = t.as_str();
                let Some(digit) = t.bytes().next().filter(u8::is_ascii_digit) else {
                    return Incoming::Other;
                };
                match STANDARD.decode(&t[1..]) {
                    Ok(d) => Incoming::Data(digit - b'0', Bytes::from(d)),
                    Err(_) => Incoming::Other,
                }
            }
            _ => Incoming::Other,
        }
    }
}

/// The server side of an upgraded WebSocket connection.
pub async fn accept<IO>(io: IO) -> WebSocketStream<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    accept_with(io, WebSocketConfig::default()).await
}

/// [`accept`] with `config`'s buffers (the message limits are ours).
pub async fn accept_with<IO>(io: IO, config: WebSocketConfig) -> WebSocketStream<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let config = config
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await
}

struct WsInput(mpsc::Receiver<Bytes>);

impl Input for WsInput {
    fn next(&mut self) -> BoxFuture<'_, Option<Bytes>> {
        Box::pin(async move { self.0.recv().await })
    }
}

struct WsOutput {
    channel: u8,
    codec: Codec,
    out: mpsc::Sender<Message>,
}

impl Output for WsOutput {
    fn write(&self, data: Bytes) -> BoxFuture<'_, Result<(), ()>> {
        Box::pin(async move {
            let msg = self.codec.encode(self.channel, &data);
            self.out.send(msg).await.map_err(|_| ())
        })
    }

    fn finish(&self) -> BoxFuture<'_, ()> {
        // Clients end a channel when the connection closes; a close signal
        // sent to them is an unknown channel (255) they log as an error.
        Box::pin(async {})
    }
}

/// Open one remote-command session on an upgraded connection, ended from
/// this side by `watch` (the client's hang-up, the idle timeout) as by a
/// client that leaves.
pub async fn open<IO>(
    io: IO,
    version: RemoteCommandVersion,
    opts: &StreamOptions,
    watch: Watch,
) -> Opened
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let codec = codec(version);
    let activity = Activity::new();
    let (mut sink, mut stream) = accept(io).await.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Message>(32);
    let written = activity.clone();
    let writer = AbortOnDropHandle::new(tokio::spawn(async move {
        while let Some(m) = out_rx.recv().await {
            if sink.feed(m).await.is_err() {
                return;
            }
            if out_rx.is_empty() && sink.flush().await.is_err() {
                return;
            }
            written.note();
        }
        let _ = sink.close().await;
    }));
    let first = if opts.stdout {
        STDOUT
    } else if opts.stderr {
        STDERR
    } else {
        STATUS
    };
    let _ = out_tx.send(codec.encode(first, &[])).await;

    let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(STDIN_QUEUE);
    let (resize_tx, resize_rx) = mpsc::channel(8);
    let hangup = CancellationToken::new();
    let watching = {
        let hangup = hangup.clone();
        let activity = activity.clone();
        Watching::new(tokio::spawn(async move {
            let why = watch.closed(&activity).await;
            tracing::info!(reason = why.label(), "closing the streaming session");
            hangup.cancel();
        }))
    };
    let reader = {
        let hangup = hangup.clone();
        let want_stdin = opts.stdin;
        let read = activity.clone();
        AbortOnDropHandle::new(tokio::spawn(async move {
            let mut stdin = want_stdin.then_some(stdin_tx);
            let mut sizes = ResizeDecoder::default();
            while let Some(Ok(msg)) = stream.next().await {
                read.note();
                if matches!(msg, Message::Close(_)) {
                    break;
                }
                match codec.decode(&msg) {
                    Incoming::Data(STDIN, data) => {
                        if let Some(tx) = &stdin {
                            let _ = tx.send(data).await;
                        }
                    }
                    Incoming::Data(RESIZE, data) => {
                        for size in sizes.feed(&data) {
                            let _ = resize_tx.send(size).await;
                        }
                    }
                    Incoming::Close(STDIN) => stdin = None,
                    _ => {}
                }
            }
            hangup.cancel();
        }))
    };
    let output = |channel: u8, wanted: bool| {
        wanted.then(|| {
            Box::new(WsOutput {
                channel,
                codec,
                out: out_tx.clone(),
            }) as Box<dyn Output>
        })
    };
    let channels = Channels {
        stdin: opts
            .stdin
            .then(|| Box::new(WsInput(stdin_rx)) as Box<dyn Input>),
        stdout: output(STDOUT, opts.stdout),
        stderr: output(STDERR, opts.stderr && !opts.tty),
        resize: (opts.tty && version.resize()).then_some(resize_rx),
        hangup,
    };
    let status = WsStatus {
        version,
        out: out_tx,
        writer,
        _reader: reader,
        _watching: watching,
    };
    Opened {
        channels,
        status: Box::new(status),
    }
}

/// The status channel of a WebSocket session, and its tasks.
struct WsStatus {
    version: RemoteCommandVersion,
    out: mpsc::Sender<Message>,
    writer: AbortOnDropHandle<()>,
    _reader: AbortOnDropHandle<()>,
    _watching: Watching,
}

impl StatusSink for WsStatus {
    fn send(self: Box<Self>, status: Status) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let WsStatus {
                version,
                out,
                writer,
                _reader,
                _watching,
            } = *self;
            let body = status_body(version, &status);
            if !body.is_empty() {
                let _ = out.send(codec(version).encode(STATUS, &body)).await;
            }
            let _ = out
                .send(Message::Close(Some(CloseFrame {
                    code: CloseCode::Normal,
                    reason: "".into(),
                })))
                .await;
            drop(out);
            // Give the client a moment to read and answer the close; it may
            // as well just hang up.
            let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RemoteCommandVersion::*;

    #[test]
    fn codecs_of_each_version() {
        let v5 = codec(V5);
        assert_eq!(
            v5,
            Codec {
                base64: false,
                close_signal: true,
            }
        );
        assert!(!codec(V4).close_signal);
        assert!(codec(V4Base64).base64);
        assert!(!codec(V1).base64);
        assert!(codec(V1Base64).base64);
    }

    #[test]
    fn binary_framing() {
        let v5 = codec(V5);
        assert_eq!(
            v5.encode(1, b"hi"),
            Message::Binary(Bytes::from_static(b"\x01hi"))
        );
        assert_eq!(
            v5.encode(1, b""),
            Message::Binary(Bytes::from_static(b"\x01"))
        );
        assert_eq!(
            v5.decode(&Message::Binary(Bytes::from_static(b"\x00abc"))),
            Incoming::Data(0, Bytes::from_static(b"abc"))
        );
        assert_eq!(
            v5.decode(&Message::Binary(Bytes::from_static(&[255, 0]))),
            Incoming::Close(0)
        );
        assert_eq!(
            v5.decode(&Message::Binary(Bytes::from_static(&[255]))),
            Incoming::Other
        );
        assert_eq!(v5.decode(&Message::Binary(Bytes::new())), Incoming::Other);
        assert_eq!(v5.decode(&Message::text("0YWJj")), Incoming::Other);
        let v4 = codec(V4);
        assert_eq!(
            v4.decode(&Message::Binary(Bytes::from_static(&[255, 0]))),
            Incoming::Data(255, Bytes::from_static(&[0])),
            "no close signal before v5"
        );
    }

    #[test]
    fn base64_framing() {
        let b = codec(V4Base64);
        assert_eq!(b.encode(1, b"hi\n"), Message::text("1aGkK"));
        assert_eq!(
            b.decode(&Message::text("0Zm9vCg==")),
            Incoming::Data(0, Bytes::from_static(b"foo\n"))
        );
        assert_eq!(b.decode(&Message::text("0***")), Incoming::Other);
        assert_eq!(b.decode(&Message::text("x")), Incoming::Other);
        assert_eq!(b.decode(&Message::text("")), Incoming::Other);
        assert_eq!(
            b.decode(&Message::Binary(Bytes::from_static(b"\x00a"))),
            Incoming::Other
        );
    }
}
