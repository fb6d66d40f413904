//! A SPDY client speaking frames by hand, for the tests of the session and
//! of what runs on it (port-forward).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::frame::{self, Frame, MAX_PAYLOAD};
use super::headers::{Deflater, Headers, Inflater, decode_block, encode_block};

/// The client side, speaking frames by hand.
pub struct Peer {
    pub io: DuplexStream,
    buf: BytesMut,
    deflater: Deflater,
    inflater: Inflater,
}

impl Peer {
    pub fn new(io: DuplexStream) -> Peer {
        Peer {
            io,
            buf: BytesMut::new(),
            deflater: Deflater::new().expect("a zlib deflater"),
            inflater: Inflater::new(),
        }
    }

    pub async fn send(&mut self, f: Frame) {
        let mut out = BytesMut::new();
        frame::encode(&f, &mut out).expect("a test frame encodes");
        self.io.write_all(&out).await.expect("write to the session");
    }

    pub async fn open(&mut self, id: u32, headers: &[(&str, &str)], fin: bool) {
        let block = self
            .deflater
            .compress(&encode_block(headers))
            .expect("headers compress");
        self.send(Frame::SynStream {
            stream_id: id,
            associated_to: 0,
            priority: 0,
            slot: 0,
            fin,
            unidirectional: false,
            header_block: block.into(),
        })
        .await;
    }

    pub async fn data(&mut self, id: u32, data: &[u8], fin: bool) {
        self.send(Frame::Data {
            stream_id: id,
            fin,
            data: Bytes::copy_from_slice(data),
        })
        .await;
    }

    /// The next frame, or None at EOF.
    pub async fn recv(&mut self) -> Option<Frame> {
        loop {
            if let Some(f) =
                frame::decode(&mut self.buf, MAX_PAYLOAD).expect("the session sends valid frames")
            {
                if let Frame::SynReply { header_block, .. } = &f {
                    let raw = self
                        .inflater
                        .decompress(header_block)
                        .expect("a reply's headers inflate");
                    assert_eq!(
                        decode_block(&raw).expect("a reply's header block decodes"),
                        Headers::default()
                    );
                }
                return Some(f);
            }
            let n = tokio::time::timeout(Duration::from_secs(10), self.io.read_buf(&mut self.buf))
                .await
                .expect("a frame within 10 s")
                .expect("read from the session");
            if n == 0 {
                return None;
            }
        }
    }
}
