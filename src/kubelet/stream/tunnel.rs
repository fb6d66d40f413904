//! A WebSocket as a byte stream: the port-forward tunnel
//! (`SPDY/3.1+portforward.k8s.io`) carries a SPDY session in binary
//! messages, cut anywhere. Reads yield the messages' bytes (a close or an
//! error ends them); each write is one binary message; shutting down sends
//! a normal close.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use futures::{SinkExt, Stream, StreamExt, future};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::io::{CopyToBytes, SinkWriter};

use super::websocket::accept_with;

/// How much tungstenite reads from the TLS stream at a time: one TLS
/// record's plaintext. It zeroes that room before each read, and its
/// default (128 KiB) zeroed several times the bytes a 32 KiB message of a
/// port-forward carries.
const READ_BUFFER: usize = 16 * 1024;

fn io_error(e: tokio_tungstenite::tungstenite::Error) -> std::io::Error {
    std::io::Error::other(e)
}

/// Accept the WebSocket on an upgraded connection and return its byte
/// stream.
pub async fn byte_stream<IO>(io: IO) -> impl AsyncRead + AsyncWrite + Send + Unpin + 'static
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let config = WebSocketConfig::default().read_buffer_size(READ_BUFFER);
    let (sink, stream) = accept_with(io, config).await.split();
    let bytes = stream
        .take_while(|m| future::ready(!matches!(m, Ok(Message::Close(_)))))
        .filter_map(|m| {
            future::ready(match m {
                Ok(Message::Binary(b)) => Some(Ok(b)),
                Ok(_) => None,
                Err(e) => Some(Err(io_error(e))),
            })
        });
    let sink = sink
        .sink_map_err(io_error)
        .with(|b: Bytes| future::ready(Ok::<_, std::io::Error>(Message::Binary(b))));
    let reader = MessageReader::new(Box::pin(bytes));
    let writer = SinkWriter::new(CopyToBytes::new(Box::pin(sink)));
    tokio::io::join(reader, writer)
}

/// The messages' bytes as one stream, each message let go of as soon as it
/// is read out. tokio-util's `StreamReader` keeps the spent message while
/// it asks for the next one; tungstenite cuts each message out of its read
/// buffer, so a message still held then makes it take a new buffer: a
/// 68 KiB block that musl's allocator maps, then unmaps, for every 32 KiB
/// message of a `kubectl port-forward` (about a quarter of this thread's
/// time went to the page faults and TLB shootdowns).
struct MessageReader<S> {
    messages: S,
    current: Bytes,
    /// An error met after bytes that were returned first: the next read's.
    failed: Option<io::Error>,
}

impl<S> MessageReader<S> {
    fn new(messages: S) -> Self {
        Self {
            messages,
            current: Bytes::new(),
            failed: None,
        }
    }
}

impl<S> AsyncRead for MessageReader<S>
where
    S: Stream<Item = io::Result<Bytes>> + Unpin,
{
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.failed.take() {
            return Poll::Ready(Err(e));
        }
        let start = buf.filled().len();
        while buf.remaining() > 0 {
            if this.current.is_empty() {
                // An empty `Bytes` cut from the buffer still holds it.
                this.current = Bytes::new();
                let next = match this.messages.poll_next_unpin(cx) {
                    Poll::Ready(next) => next,
                    // What is read so far is returned; the waker stays
                    // registered, at worst one spurious wake-up.
                    Poll::Pending if buf.filled().len() > start => break,
                    Poll::Pending => return Poll::Pending,
                };
                match next {
                    Some(Ok(message)) => this.current = message,
                    Some(Err(e)) if buf.filled().len() == start => return Poll::Ready(Err(e)),
                    // The bytes read before it go first.
                    Some(Err(e)) => {
                        this.failed = Some(e);
                        break;
                    }
                    None => break,
                }
                continue;
            }
            let n = this.current.len().min(buf.remaining());
            buf.put_slice(&this.current[..n]);
            this.current.advance(n);
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use futures::stream;
    use tokio::io::AsyncReadExt;

    use super::*;

    fn ok(parts: &[&'static [u8]]) -> Vec<io::Result<Bytes>> {
        parts.iter().map(|p| Ok(Bytes::from_static(p))).collect()
    }

    #[tokio::test]
    async fn messages_read_as_one_stream_in_order() {
        let messages = stream::iter(ok(&[b"hello ", b"", b"tunnelled ", b"world"]));
        let mut reader = MessageReader::new(messages);
        let mut out = String::new();
        reader.read_to_string(&mut out).await.expect("read");
        assert_eq!(out, "hello tunnelled world");
    }

    #[tokio::test]
    async fn a_message_larger_than_the_read_is_cut_across_reads() {
        let mut reader = MessageReader::new(stream::iter(ok(&[b"abcdefgh", b"ij"])));
        let mut small = [0u8; 3];
        let mut got = Vec::new();
        loop {
            let n = reader.read(&mut small).await.expect("read");
            if n == 0 {
                break;
            }
            assert!(n <= 3);
            got.extend_from_slice(&small[..n]);
        }
        assert_eq!(got, b"abcdefghij");
    }

    #[tokio::test]
    async fn an_error_is_returned_after_the_bytes_before_it() {
        let messages = stream::iter(vec![
            Ok(Bytes::from_static(b"kept")),
            Err(io::Error::other("tunnel broke")),
            Ok(Bytes::from_static(b"never")),
        ]);
        let mut reader = MessageReader::new(messages);
        let mut buf = [0u8; 64];
        let n = reader.read(&mut buf).await.expect("the bytes first");
        assert_eq!(&buf[..n], b"kept");
        let e = reader.read(&mut buf).await.expect_err("then the error");
        assert_eq!(e.to_string(), "tunnel broke");
    }

    #[tokio::test]
    async fn an_error_with_nothing_read_is_returned_at_once_not_as_the_end() {
        let messages = stream::iter(vec![
            Err(io::Error::other("tunnel broke")),
            Ok(Bytes::from_static(b"never")),
        ]);
        let mut reader = MessageReader::new(messages);
        let mut buf = [0u8; 64];
        let e = reader
            .read(&mut buf)
            .await
            .expect_err("the error, not an end of stream");
        assert_eq!(e.to_string(), "tunnel broke");
    }

    /// With no message yet the read waits: returning nothing would read
    /// as the end of the stream.
    #[tokio::test]
    async fn no_message_yet_is_a_wait_not_the_end() {
        let (tx, rx) = futures::channel::mpsc::unbounded::<io::Result<Bytes>>();
        let mut reader = MessageReader::new(rx);
        let mut buf = [0u8; 64];
        let first = futures::poll!(Box::pin(reader.read(&mut buf)));
        assert!(
            first.is_pending(),
            "read returned {first:?} with no message"
        );
        tx.unbounded_send(Ok(Bytes::from_static(b"late")))
            .expect("send");
        // Once it has come, one poll returns it (the channel stays open).
        let second = futures::poll!(Box::pin(reader.read(&mut buf)));
        let Poll::Ready(Ok(n)) = second else {
            panic!("the message that came should be returned at once: {second:?}");
        };
        assert_eq!(&buf[..n], b"late");
    }

    /// The whole tunnel over an in-memory connection: the client's binary
    /// messages read as one stream, ended by its close; each write goes
    /// back as one binary message.
    #[tokio::test]
    async fn the_tunnel_carries_binary_messages_both_ways_until_the_close() {
        // A reader that loses a wake-up hangs: fail instead.
        tokio::time::timeout(std::time::Duration::from_secs(5), tunnel_both_ways())
            .await
            .expect("the tunnel's exchange within 5 s");
    }

    async fn tunnel_both_ways() {
        use tokio::io::AsyncWriteExt;
        use tokio_tungstenite::WebSocketStream;
        use tokio_tungstenite::tungstenite::protocol::Role;

        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let mut tunnel = byte_stream(server_io).await;
            tunnel.write_all(b"answer").await.expect("write");
            tunnel.flush().await.expect("flush");
            let mut got = Vec::new();
            tunnel.read_to_end(&mut got).await.expect("read the tunnel");
            got
        });
        let mut client = WebSocketStream::from_raw_socket(client_io, Role::Client, None).await;
        let answer = client.next().await.expect("a message").expect("read");
        assert_eq!(answer, Message::binary(b"answer".to_vec()));
        for part in [&b"spdy "[..], b"", b"frames"] {
            client
                .send(Message::binary(part.to_vec()))
                .await
                .expect("send");
        }
        client.send(Message::text("ignored")).await.expect("send");
        client.close(None).await.expect("close");
        let got = server.await.expect("server task");
        assert_eq!(got, b"spdy frames");
    }

    /// tungstenite's side of [`MessageReader`]: messages cut from one
    /// buffer; asked for the next, it notes whether that buffer is its
    /// own again (then it is reused, not replaced) and has none yet.
    struct CutFromOneBuffer {
        buffer: BytesMut,
        sent: bool,
        reusable_when_asked_again: Option<bool>,
    }

    impl Stream for CutFromOneBuffer {
        type Item = io::Result<Bytes>;
        fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            if !self.sent {
                self.sent = true;
                self.buffer.extend_from_slice(&[7u8; 600]);
                return Poll::Ready(Some(Ok(self.buffer.split_to(600).freeze())));
            }
            let reusable = self.buffer.try_reclaim(1024);
            self.reusable_when_asked_again = Some(reusable);
            Poll::Pending
        }
    }

    /// The property the reader exists for: when the next message is asked
    /// for, the one read out before no longer holds the buffer it was cut
    /// from.
    #[tokio::test]
    async fn a_read_message_is_let_go_before_the_next_is_asked_for() {
        let mut reader = MessageReader::new(CutFromOneBuffer {
            buffer: BytesMut::with_capacity(1024),
            sent: false,
            reusable_when_asked_again: None,
        });
        let mut out = [0u8; 4096];
        // One poll: the message is read and the next found missing, so the
        // read returns what it has rather than waiting.
        let read = futures::poll!(Box::pin(reader.read(&mut out)));
        let Poll::Ready(Ok(n)) = read else {
            panic!("the message read out should be returned at once: {read:?}");
        };
        assert_eq!(n, 600);
        assert_eq!(
            reader.messages.reusable_when_asked_again,
            Some(true),
            "the spent message still held the buffer when the next was asked for"
        );
    }
}
