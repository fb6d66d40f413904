//! A WebSocket as a byte stream: the port-forward tunnel
//! (`SPDY/3.1+portforward.k8s.io`) carries a SPDY session in binary
//! messages, cut anywhere. Reads yield the messages' bytes (a close or an
//! error ends them); each write is one binary message; shutting down sends
//! a normal close.

use bytes::Bytes;
use futures::{SinkExt, StreamExt, future};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::io::{CopyToBytes, SinkWriter, StreamReader};

use super::websocket::accept;

fn io_error(e: tokio_tungstenite::tungstenite::Error) -> std::io::Error {
    std::io::Error::other(e)
}

/// Accept the WebSocket on an upgraded connection and return its byte
/// stream.
pub async fn byte_stream<IO>(io: IO) -> impl AsyncRead + AsyncWrite + Send + Unpin + 'static
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (sink, stream) = accept(io).await.split();
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
    let reader = StreamReader::new(Box::pin(bytes));
    let writer = SinkWriter::new(CopyToBytes::new(Box::pin(sink)));
    tokio::io::join(reader, writer)
}
