//! A SPDY/3.1 server session over any byte stream (an upgraded HTTP/1.1
//! connection, or a WebSocket tunnel): the peer opens streams, this side
//! replies and exchanges data on them. What Kubernetes' clients need and no
//! more: they never push, never ask the server to open streams, and neither
//! send nor honour WINDOW_UPDATE (so flow control is TCP's: a stream whose
//! reader is slow holds the session's reader, as with the Go
//! implementation those clients use).
//!
//! [`start`] spawns a reader and a writer task and hands each new stream to
//! the caller as a [`Stream`]: its headers, a [`StreamReader`] of the peer's
//! data (ends at the peer's FIN or reset) and a [`StreamWriter`]. The
//! writer task owns the header compressor, so a stream's SYN_REPLY always
//! precedes its data.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::frame::{self, Frame, FrameError, goaway, rst};
use super::headers::{Deflater, Headers, Inflater, decode_block, encode_block};
use super::recycle::Recycler;

/// Largest data frame this side sends.
pub const MAX_DATA_FRAME: usize = 64 * 1024;
/// Largest frame accepted from the peer (data frames from the Go clients
/// are at most 32 KiB; header blocks are tiny).
pub const MAX_INBOUND_FRAME: usize = 1024 * 1024;
/// The session reads into blocks of this size (a larger frame gets a block
/// of its own)...
const READ_BLOCK: usize = 128 * 1024;
/// ...and keeps this many of them for reuse while frames cut from them are
/// still queued or being written (16 frames per stream of at most 32 KiB
/// from the Go clients, plus a batch): at most 1 MiB per session.
const SPARE_READ_BLOCKS: usize = 8;
/// The least room a read is given.
const MIN_READ: usize = 8 * 1024;
/// Frames queued per stream before the session's reader waits.
const STREAM_QUEUE: usize = 16;
/// Frames queued for the writer task.
const WRITE_QUEUE: usize = 64;

/// What the peer sent on a stream.
#[derive(Debug)]
enum Inbound {
    Data(Bytes),
    /// The peer's FIN. (A closed channel without it: reset, or the session
    /// ended.)
    Fin,
}

/// What a stream's reader and writers share with the session: cancelled
/// when the peer resets the stream or the session ends.
#[derive(Debug, Default)]
struct Shared {
    gone: CancellationToken,
}

/// A stream the peer opened.
#[derive(Debug)]
pub struct Stream {
    pub id: u32,
    pub headers: Headers,
    pub reader: StreamReader,
    pub writer: StreamWriter,
}

/// The peer's data on one stream.
#[derive(Debug)]
pub struct StreamReader {
    rx: mpsc::Receiver<Inbound>,
    shared: Arc<Shared>,
    /// A FIN taken while gathering data: returned by the next call.
    fin_seen: bool,
}

/// How a stream's input ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The peer sent FIN: no more data, a clean half-close.
    Fin,
    /// The peer reset the stream, or the session ended.
    Reset,
}

impl StreamReader {
    /// The next data from the peer, or how the input ended.
    pub async fn next(&mut self) -> Result<Bytes, End> {
        if self.fin_seen {
            return Err(End::Fin);
        }
        match self.rx.recv().await {
            Some(Inbound::Data(d)) => Ok(d),
            Some(Inbound::Fin) => {
                self.rx.close();
                Err(End::Fin)
            }
            None => Err(if self.shared.gone.is_cancelled() {
                End::Reset
            } else {
                End::Fin
            }),
        }
    }

    /// The next data, and with it whatever more has already arrived, up to
    /// about `max` bytes, appended to `batch` as the frames came (no copy):
    /// a bulk transfer becomes one vectored write per batch rather than one
    /// write per frame. A FIN behind the data is kept for the next call.
    pub async fn next_batch(&mut self, batch: &mut Vec<Bytes>, max: usize) -> Result<(), End> {
        let first = self.next().await?;
        let mut len = first.len();
        batch.push(first);
        while len < max {
            match self.rx.try_recv() {
                Ok(Inbound::Data(d)) => {
                    len += d.len();
                    batch.push(d);
                }
                Ok(Inbound::Fin) => {
                    self.rx.close();
                    self.fin_seen = true;
                    break;
                }
                // Nothing more yet, or closed: the next call says which.
                Err(_) => break,
            }
        }
        Ok(())
    }
}

/// What the writer task is asked to do.
#[derive(Debug)]
enum Outbound {
    Frame(Frame),
    /// A SYN_REPLY, compressed in the writer task (the compressor's state is
    /// shared by every block the session sends, so order matters).
    Reply {
        stream_id: u32,
    },
    /// Write nothing more for this stream (the peer reset it).
    Forget(u32),
    /// Flush, send GOAWAY and shut the connection's write side.
    Close,
}

/// Sends on one stream. Cheap to clone; writes after the session ended or
/// the peer reset the stream are errors.
#[derive(Debug, Clone)]
pub struct StreamWriter {
    id: u32,
    out: mpsc::Sender<Outbound>,
    shared: Arc<Shared>,
}

/// The session is gone (transport closed or failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the SPDY session is closed")]
pub struct Closed;

impl StreamWriter {
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Resolves when the peer has reset this stream or the session ended:
    /// nothing written from then on reaches the peer.
    pub async fn gone(&self) {
        self.shared.gone.cancelled().await
    }

    pub fn is_gone(&self) -> bool {
        self.shared.gone.is_cancelled()
    }

    /// Send `data` (cut into frames of at most [`MAX_DATA_FRAME`] bytes).
    pub async fn write(&self, mut data: Bytes) -> Result<(), Closed> {
        if self.is_gone() {
            return Err(Closed);
        }
        while !data.is_empty() {
            let chunk = data.split_to(data.len().min(MAX_DATA_FRAME));
            self.out
                .send(Outbound::Frame(Frame::Data {
                    stream_id: self.id,
                    fin: false,
                    data: chunk,
                }))
                .await
                .map_err(|_| Closed)?;
        }
        Ok(())
    }

    /// Half-close: FIN, no more data from this side.
    pub async fn finish(&self) -> Result<(), Closed> {
        self.out
            .send(Outbound::Frame(Frame::Data {
                stream_id: self.id,
                fin: true,
                data: Bytes::new(),
            }))
            .await
            .map_err(|_| Closed)
    }

    /// Abort the stream (RST_STREAM CANCEL).
    pub async fn reset(&self) -> Result<(), Closed> {
        self.out
            .send(Outbound::Frame(Frame::RstStream {
                stream_id: self.id,
                status: rst::CANCEL,
            }))
            .await
            .map_err(|_| Closed)
    }
}

/// Controls a running session.
#[derive(Debug, Clone)]
pub struct Session {
    out: mpsc::Sender<Outbound>,
    ended: watch::Receiver<bool>,
}

impl Session {
    /// Send what is queued, then GOAWAY, and shut the write side; the
    /// session ends when the peer closes (or at once if it already has).
    pub async fn close(&self) {
        let _ = self.out.send(Outbound::Close).await;
    }

    /// Resolves when the session has ended (the transport closed or
    /// failed, or [`Session::close`] completed and the peer closed).
    pub async fn ended(&self) {
        let mut rx = self.ended.clone();
        let _ = rx.wait_for(|e| *e).await;
    }

    pub fn has_ended(&self) -> bool {
        *self.ended.borrow()
    }
}

/// Run a server session on `io`: returns the handle and the streams the
/// peer opens (the channel closes when the session ends).
pub fn start<IO>(io: IO) -> (Session, mpsc::Receiver<Stream>)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read, write) = tokio::io::split(io);
    let (out_tx, out_rx) = mpsc::channel(WRITE_QUEUE);
    let (streams_tx, streams_rx) = mpsc::channel(8);
    let (ended_tx, ended_rx) = watch::channel(false);
    let ended_tx = Arc::new(ended_tx);
    let writer_done = Arc::clone(&ended_tx);
    tokio::spawn(async move {
        if let Err(e) = write_loop(write, out_rx).await {
            tracing::debug!(error = %e, "SPDY session writer ended");
        }
        // A writer that cannot write ends the session; after a clean close
        // the reader ends it when the peer hangs up.
        drop(writer_done);
    });
    let reader = Reader {
        out: out_tx.clone(),
        streams: streams_tx,
        open: HashMap::new(),
        live: HashMap::new(),
        prune_at: 64,
        inflater: Inflater::new(),
        last_id: 0,
        going_away: false,
    };
    tokio::spawn(async move {
        if let Err(e) = reader.run(read).await {
            tracing::debug!(error = %e, "SPDY session reader ended");
        }
        let _ = ended_tx.send(true);
    });
    (
        Session {
            out: out_tx,
            ended: ended_rx,
        },
        streams_rx,
    )
}

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("transport: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Frame(#[from] FrameError),
}

struct Reader {
    out: mpsc::Sender<Outbound>,
    streams: mpsc::Sender<Stream>,
    /// Streams whose input is still open, by id.
    open: HashMap<u32, mpsc::Sender<Inbound>>,
    /// Every stream a handler may still hold (pruned as they drop).
    live: HashMap<u32, Weak<Shared>>,
    /// Size of `live` at which dropped streams are pruned next.
    prune_at: usize,
    inflater: Inflater,
    last_id: u32,
    going_away: bool,
}

impl Reader {
    async fn run<R: AsyncRead + Unpin>(mut self, mut read: R) -> Result<(), SessionError> {
        let mut room = Recycler::new(READ_BLOCK, SPARE_READ_BLOCKS);
        let mut buf = BytesMut::new();
        let result = loop {
            match frame::decode(&mut buf, MAX_INBOUND_FRAME) {
                Ok(Some(f)) => {
                    if let Err(e) = self.handle(f).await {
                        break Err(e);
                    }
                    continue;
                }
                Ok(None) => {}
                Err(e) => break Err(e.into()),
            }
            let want = frame::missing(&buf).max(MIN_READ);
            room.make_room(&mut buf, want);
            match read.read_buf(&mut buf).await {
                Ok(0) => break Ok(()),
                Ok(_) => {}
                Err(e) => break Err(e.into()),
            }
        };
        if let Err(SessionError::Frame(_)) = &result {
            let _ = self
                .out
                .send(Outbound::Frame(Frame::GoAway {
                    last_good_stream_id: self.last_id,
                    status: goaway::PROTOCOL_ERROR,
                }))
                .await;
            let _ = self.out.send(Outbound::Close).await;
        }
        // Whatever is still open ends here.
        self.open.clear();
        for (_, shared) in self.live.drain() {
            if let Some(s) = shared.upgrade() {
                s.gone.cancel();
            }
        }
        result
    }

    async fn handle(&mut self, f: Frame) -> Result<(), SessionError> {
        match f {
            Frame::SynStream {
                stream_id,
                fin,
                header_block,
                ..
            } => {
                // Always inflate: the decompressor's state spans blocks.
                let raw = self.inflater.decompress(&header_block)?;
                let headers = decode_block(&raw)?;
                self.open_stream(stream_id, fin, headers).await;
            }
            Frame::SynReply { header_block, .. } | Frame::Headers { header_block, .. } => {
                self.inflater.decompress(&header_block)?;
            }
            Frame::Data {
                stream_id,
                fin,
                data,
            } => {
                if let Some(tx) = self.open.get(&stream_id) {
                    // A reader dropped by its handler discards the data.
                    if !data.is_empty() {
                        let _ = tx.send(Inbound::Data(data)).await;
                    }
                    if fin {
                        let _ = tx.send(Inbound::Fin).await;
                        self.open.remove(&stream_id);
                    }
                }
            }
            Frame::RstStream { stream_id, .. } => {
                // Dropping the sender without a FIN reads as a reset.
                self.open.remove(&stream_id);
                if let Some(s) = self.live.remove(&stream_id).and_then(|w| w.upgrade()) {
                    s.gone.cancel();
                }
                let _ = self.out.send(Outbound::Forget(stream_id)).await;
            }
            Frame::Ping { id } => {
                // Odd ids are the client's: echo them. Even ones would answer
                // our own pings, and this side sends none.
                if id % 2 == 1 {
                    let _ = self.out.send(Outbound::Frame(Frame::Ping { id })).await;
                }
            }
            Frame::GoAway { .. } => self.going_away = true,
            Frame::Settings { .. } | Frame::WindowUpdate { .. } | Frame::Unknown { .. } => {}
        }
        Ok(())
    }

    async fn open_stream(&mut self, id: u32, fin: bool, headers: Headers) {
        // Client streams are odd and increasing; anything else is refused
        // without ending the session.
        if id.is_multiple_of(2) || id <= self.last_id || self.going_away {
            let _ = self
                .out
                .send(Outbound::Frame(Frame::RstStream {
                    stream_id: id,
                    status: if id.is_multiple_of(2) || id <= self.last_id {
                        rst::PROTOCOL_ERROR
                    } else {
                        rst::REFUSED_STREAM
                    },
                }))
                .await;
            return;
        }
        self.last_id = id;
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        if fin {
            let _ = tx.try_send(Inbound::Fin);
        } else {
            self.open.insert(id, tx);
        }
        let shared = Arc::new(Shared::default());
        if self.live.len() >= self.prune_at {
            self.live.retain(|_, w| w.strong_count() > 0);
            self.prune_at = (self.live.len() * 2).max(64);
        }
        self.live.insert(id, Arc::downgrade(&shared));
        let _ = self.out.send(Outbound::Reply { stream_id: id }).await;
        let stream = Stream {
            id,
            headers,
            reader: StreamReader {
                fin_seen: false,
                rx,
                shared: Arc::clone(&shared),
            },
            writer: StreamWriter {
                id,
                out: self.out.clone(),
                shared,
            },
        };
        if self.streams.send(stream).await.is_err() {
            self.open.remove(&id);
            let _ = self
                .out
                .send(Outbound::Frame(Frame::RstStream {
                    stream_id: id,
                    status: rst::REFUSED_STREAM,
                }))
                .await;
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut write: W,
    mut rx: mpsc::Receiver<Outbound>,
) -> Result<(), SessionError> {
    let mut deflater = Deflater::new()?;
    let empty_block = encode_block(&[]);
    let mut forgotten: HashSet<u32> = HashSet::new();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut closing = false;
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        // Batch whatever is queued into one write.
        while let Some(item) = next.take() {
            match item {
                Outbound::Frame(f) => {
                    let skip = match &f {
                        Frame::Data { stream_id, .. } | Frame::RstStream { stream_id, .. } => {
                            forgotten.contains(stream_id)
                        }
                        _ => false,
                    };
                    if !skip {
                        frame::encode(&f, &mut buf)?;
                    }
                }
                Outbound::Reply { stream_id } => {
                    let block = deflater.compress(&empty_block)?;
                    frame::encode(
                        &Frame::SynReply {
                            stream_id,
                            fin: false,
                            header_block: block.into(),
                        },
                        &mut buf,
                    )?;
                }
                Outbound::Forget(id) => {
                    forgotten.insert(id);
                }
                Outbound::Close => closing = true,
            }
            if closing || buf.len() >= 256 * 1024 {
                break;
            }
            next = rx.try_recv().ok();
        }
        if closing {
            frame::encode(
                &Frame::GoAway {
                    last_good_stream_id: 0,
                    status: goaway::OK,
                },
                &mut buf,
            )?;
        }
        if !buf.is_empty() {
            write.write_all(&buf).await?;
            buf.clear();
            write.flush().await?;
        }
        if closing {
            write.shutdown().await?;
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
