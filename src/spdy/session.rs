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
//!
//! A session ends through one [`CancellationToken`], cancelled by whichever
//! stops first: the reader (the peer closed, or broke the protocol), the
//! writer (the connection cannot be written to) or [`Session::abort`]. Each
//! stream's `gone` is a child of it, so the session's end reaches every
//! stream at once; a reset cancels only its stream's. What is queued by
//! then is still written, whole frames, for [`LINGER`] at most.
//!
//! What a peer can make a session hold is bounded in bytes
//! (docs/streaming.md, "Limits"): frames of at most [`MAX_INBOUND_FRAME`];
//! data queued per stream and per session up to [`Limits`]' budgets, after
//! which the reader waits; at most [`Limits::max_streams`] streams held at
//! once. A RST_STREAM leaves nothing behind: the writer drops a reset
//! stream's queued frames by a flag the stream carries, so no record of
//! reset ids is kept, whichever ids the peer names.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::frame::{self, Frame, FrameError, goaway, rst};
use super::headers::{Deflater, Headers, Inflater, decode_block, encode_block};
use super::recycle::Recycler;
use crate::activity::Activity;
use crate::stream_stats::{Refusal, StreamStats};

/// Largest data frame this side sends.
pub const MAX_DATA_FRAME: usize = 64 * 1024;
/// Largest frame accepted from the peer: twice what the Go clients send.
/// Their data frames are at most 32 KiB, io.Copy's buffer (client-go's
/// port-forward copies each local connection with io.Copy; remote-command
/// stdin, in kubectl and in the apiserver's stream translator, goes
/// through a reader wrapper that keeps io.Copy from writing more at once);
/// header blocks are tiny. A larger frame ends the session (GOAWAY).
pub const MAX_INBOUND_FRAME: usize = 64 * 1024;
/// The session reads into blocks of this size...
const READ_BLOCK: usize = 128 * 1024;
/// ...and keeps this many of them for reuse while frames cut from them are
/// still queued or being written: at most 1 MiB per session.
const SPARE_READ_BLOCKS: usize = 8;
/// The least room a read is given.
const MIN_READ: usize = 8 * 1024;
/// A data frame smaller than this is copied out of the read block when it
/// is queued (a slice would keep the whole block alive for a few bytes);
/// a larger one stays a slice of it, so memory held by queued data is at
/// most `READ_BLOCK / COPY_BELOW` = 4 times the bytes charged for it.
pub const COPY_BELOW: usize = READ_BLOCK / 4;
/// What a queued data frame costs beyond its bytes (its queue entry and
/// allocation): a flood of tiny frames is charged for what it holds.
pub const FRAME_COST: usize = 64;
/// Frames queued for the writer task.
const WRITE_QUEUE: usize = 64;
/// How long what is already queued when the session ends may take to be
/// written before the writer lets go of the connection.
pub const LINGER: Duration = Duration::from_secs(1);

/// How much of the peer's data a session holds (docs/streaming.md,
/// "Limits"). Bytes are charged when a frame is queued and given back when
/// the stream's handler asks for more after taking it (so data handed out
/// and still being written on counts too).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Charged bytes per stream before the session's reader waits (at
    /// least one largest frame).
    pub stream_bytes: usize,
    /// Charged bytes of all streams of the session before the reader
    /// waits (at least `stream_bytes`).
    pub session_bytes: usize,
    /// Streams open at once (held by their handler); more are refused
    /// with RST_STREAM REFUSED_STREAM.
    pub max_streams: usize,
    /// Where the session counts its streams, queued bytes and refusals.
    pub stats: Arc<StreamStats>,
}

impl Limits {
    pub const DEFAULT_STREAM_BYTES: usize = 256 * 1024;
    pub const DEFAULT_SESSION_BYTES: usize = 1024 * 1024;
    pub const DEFAULT_MAX_STREAMS: usize = 512;
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            stream_bytes: Self::DEFAULT_STREAM_BYTES,
            session_bytes: Self::DEFAULT_SESSION_BYTES,
            max_streams: Self::DEFAULT_MAX_STREAMS,
            stats: Arc::default(),
        }
    }
}

/// The charge of a data frame of `len` bytes.
pub fn charge(len: usize) -> usize {
    len + FRAME_COST
}

/// What the peer sent on a stream.
#[derive(Debug)]
enum Inbound {
    /// Data, and the bytes charged for it.
    Data(Bytes, usize),
    /// The peer's FIN. (A closed channel without it: reset, or the session
    /// ended.)
    Fin,
}

/// The byte budgets one stream's queued data is charged to.
#[derive(Debug)]
struct Budget {
    stream: Semaphore,
    session: Arc<Semaphore>,
    stats: Arc<StreamStats>,
}

impl Budget {
    fn give_back(&self, n: usize) {
        if n > 0 {
            self.stream.add_permits(n);
            self.session.add_permits(n);
            self.stats.queued(-(n as i64));
        }
    }
}

/// Open streams of one session, counted as their handlers hold them.
#[derive(Debug)]
struct Tally {
    streams: AtomicUsize,
    stats: Arc<StreamStats>,
}

/// What a stream's reader and writers share with the session.
#[derive(Debug)]
struct Shared {
    /// Cancelled when the peer resets the stream, or (a child of the
    /// session's `ended`) when the session ends.
    gone: CancellationToken,
    /// The peer reset the stream: the writer task drops whatever is still
    /// queued for it (no per-id record is kept).
    reset: AtomicBool,
    tally: Arc<Tally>,
}

impl Shared {
    fn new(tally: &Arc<Tally>, ended: &CancellationToken) -> Shared {
        tally.streams.fetch_add(1, Ordering::Relaxed);
        tally.stats.stream_opened();
        Shared {
            gone: ended.child_token(),
            reset: AtomicBool::new(false),
            tally: Arc::clone(tally),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.tally.streams.fetch_sub(1, Ordering::Relaxed);
        self.tally.stats.stream_closed();
    }
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
    rx: mpsc::UnboundedReceiver<Inbound>,
    shared: Arc<Shared>,
    budget: Arc<Budget>,
    /// Charged bytes of what the last call handed out: given back at the
    /// next call (the caller is done with it by then) or when dropped.
    handed: usize,
    /// The peer's FIN was taken: every later call says so.
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
    fn give_back(&mut self) {
        self.budget.give_back(std::mem::take(&mut self.handed));
    }

    /// The next data from the peer, or how the input ended. The data
    /// handed out by the previous call stops counting against the stream's
    /// budget.
    pub async fn next(&mut self) -> Result<Bytes, End> {
        self.give_back();
        if self.fin_seen {
            return Err(End::Fin);
        }
        match self.rx.recv().await {
            Some(Inbound::Data(d, charged)) => {
                self.handed = charged;
                Ok(d)
            }
            Some(Inbound::Fin) => {
                self.rx.close();
                self.fin_seen = true;
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
    /// The batch counts against the stream's budget until the next call.
    pub async fn next_batch(&mut self, batch: &mut Vec<Bytes>, max: usize) -> Result<(), End> {
        let first = self.next().await?;
        let mut len = first.len();
        batch.push(first);
        while len < max {
            match self.rx.try_recv() {
                Ok(Inbound::Data(d, charged)) => {
                    len += d.len();
                    self.handed += charged;
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

impl Drop for StreamReader {
    fn drop(&mut self) {
        self.give_back();
        // Whatever is still queued is given back with it; the session's
        // reader gives back what it could no longer queue.
        self.rx.close();
        while let Ok(item) = self.rx.try_recv() {
            if let Inbound::Data(_, charged) = item {
                self.budget.give_back(charged);
            }
        }
    }
}

/// What the writer task is asked to do.
#[derive(Debug)]
enum Outbound {
    /// A frame of the session's own (pings, GOAWAY, refusals).
    Frame(Frame),
    /// A frame of a stream: dropped unseen once the peer reset the stream.
    Stream(Arc<Shared>, Frame),
    /// A SYN_REPLY, compressed in the writer task (the compressor's state is
    /// shared by every block the session sends, so order matters).
    Reply { stream_id: u32 },
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
                .send(Outbound::Stream(
                    Arc::clone(&self.shared),
                    Frame::Data {
                        stream_id: self.id,
                        fin: false,
                        data: chunk,
                    },
                ))
                .await
                .map_err(|_| Closed)?;
        }
        Ok(())
    }

    /// Half-close: FIN, no more data from this side.
    pub async fn finish(&self) -> Result<(), Closed> {
        self.out
            .send(Outbound::Stream(
                Arc::clone(&self.shared),
                Frame::Data {
                    stream_id: self.id,
                    fin: true,
                    data: Bytes::new(),
                },
            ))
            .await
            .map_err(|_| Closed)
    }

    /// Abort the stream (RST_STREAM CANCEL).
    pub async fn reset(&self) -> Result<(), Closed> {
        self.out
            .send(Outbound::Stream(
                Arc::clone(&self.shared),
                Frame::RstStream {
                    stream_id: self.id,
                    status: rst::CANCEL,
                },
            ))
            .await
            .map_err(|_| Closed)
    }
}

/// Controls a running session.
#[derive(Debug, Clone)]
pub struct Session {
    out: mpsc::Sender<Outbound>,
    /// The session's end: every stream's `gone` is a child of it.
    ended: CancellationToken,
    activity: Activity,
    tally: Arc<Tally>,
}

impl Session {
    /// Send what is queued, then GOAWAY, and shut the write side; the
    /// session ends when the peer closes (or at once if it already has).
    pub async fn close(&self) {
        let _ = self.out.send(Outbound::Close).await;
    }

    /// End the session now: every stream is gone, the reader stops, and the
    /// writer lets go of the connection once what is already queued is
    /// written, or after [`LINGER`] (a client that hung up, an idle
    /// timeout).
    pub fn abort(&self) {
        self.ended.cancel();
    }

    /// Resolves when the session has ended (the transport closed or
    /// failed, [`Session::close`] completed and the peer closed, or
    /// [`Session::abort`]).
    pub async fn ended(&self) {
        self.ended.cancelled().await
    }

    pub fn has_ended(&self) -> bool {
        self.ended.is_cancelled()
    }

    /// When the connection last carried anything (read or written).
    pub fn activity(&self) -> &Activity {
        &self.activity
    }

    /// Streams open now (held by their handlers).
    pub fn open_streams(&self) -> usize {
        self.tally.streams.load(Ordering::Relaxed)
    }
}

/// Run a server session on `io` with the default [`Limits`]: returns the
/// handle and the streams the peer opens (the channel closes when the
/// session ends).
pub fn start<IO>(io: IO) -> (Session, mpsc::Receiver<Stream>)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    start_with(io, Limits::default())
}

/// [`start`] with `limits`.
pub fn start_with<IO>(io: IO, limits: Limits) -> (Session, mpsc::Receiver<Stream>)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read, write) = tokio::io::split(io);
    let (out_tx, out_rx) = mpsc::channel(WRITE_QUEUE);
    let (streams_tx, streams_rx) = mpsc::channel(8);
    let ended = CancellationToken::new();
    let activity = Activity::new();
    let writer_ended = ended.clone();
    let writer_activity = activity.clone();
    tokio::spawn(async move {
        if let Err(e) = write_loop(write, out_rx, &writer_activity, &writer_ended).await {
            // A connection that cannot be written to is over: end the
            // session (its reader may be waiting on a stream's budget and
            // would not notice).
            tracing::debug!(error = %e, "SPDY session writer failed");
            writer_ended.cancel();
        }
    });
    // At least one largest frame per stream, and one stream per session.
    let stream_bytes = limits.stream_bytes.max(charge(MAX_INBOUND_FRAME));
    let session_bytes = limits.session_bytes.max(stream_bytes);
    let tally = Arc::new(Tally {
        streams: AtomicUsize::new(0),
        stats: Arc::clone(&limits.stats),
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
        stream_bytes,
        session_budget: Arc::new(Semaphore::new(session_bytes)),
        max_streams: limits.max_streams,
        tally: Arc::clone(&tally),
        activity: activity.clone(),
        ended: ended.clone(),
    };
    tokio::spawn(async move {
        if let Err(e) = reader.run(read).await {
            tracing::debug!(error = %e, "SPDY session reader ended");
        }
    });
    (
        Session {
            out: out_tx,
            ended,
            activity,
            tally,
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

/// A stream whose input is still open.
#[derive(Debug)]
struct OpenStream {
    tx: mpsc::UnboundedSender<Inbound>,
    budget: Arc<Budget>,
}

impl OpenStream {
    /// Wait until `n` more bytes may be queued on the stream and in the
    /// session, and charge them; false (nothing charged) when the stream's
    /// handler let go of its reader meanwhile.
    async fn charge(&self, n: usize) -> bool {
        let Ok(n32) = u32::try_from(n) else {
            return false;
        };
        let stream = tokio::select! {
            biased;
            _ = self.tx.closed() => return false,
            p = self.budget.stream.acquire_many(n32) => p,
        };
        let session = tokio::select! {
            biased;
            _ = self.tx.closed() => return false,
            p = self.budget.session.acquire_many(n32) => p,
        };
        match (stream, session) {
            (Ok(stream), Ok(session)) => {
                stream.forget();
                session.forget();
                self.budget.stats.queued(n as i64);
                true
            }
            // The semaphores are never closed.
            _ => false,
        }
    }
}

struct Reader {
    out: mpsc::Sender<Outbound>,
    streams: mpsc::Sender<Stream>,
    /// Streams whose input is still open, by id (pruned with `live`).
    open: HashMap<u32, OpenStream>,
    /// Every stream a handler may still hold (pruned as they drop).
    live: HashMap<u32, Weak<Shared>>,
    /// Size of `live` at which dropped streams are pruned next (from
    /// `open` too).
    prune_at: usize,
    inflater: Inflater,
    last_id: u32,
    going_away: bool,
    stream_bytes: usize,
    session_budget: Arc<Semaphore>,
    max_streams: usize,
    tally: Arc<Tally>,
    activity: Activity,
    /// The session's end (see the module doc).
    ended: CancellationToken,
}

impl Reader {
    async fn run<R: AsyncRead + Unpin>(mut self, read: R) -> Result<(), SessionError> {
        let ended = self.ended.clone();
        let result = {
            let frames = self.read_frames(read);
            tokio::select! {
                r = frames => r,
                _ = ended.cancelled() => Ok(()),
            }
        };
        if let Err(SessionError::Frame(_)) = &result {
            // Best effort: a writer stuck on a peer that does not read must
            // not hold the reader here.
            let _ = self.out.try_send(Outbound::Frame(Frame::GoAway {
                last_good_stream_id: self.last_id,
                status: goaway::PROTOCOL_ERROR,
            }));
            let _ = self.out.try_send(Outbound::Close);
        }
        // Every stream is gone with the session (their tokens are its
        // children); then whatever input is still open reads as reset.
        ended.cancel();
        self.open.clear();
        self.live.clear();
        result
    }

    async fn read_frames<R: AsyncRead + Unpin>(&mut self, mut read: R) -> Result<(), SessionError> {
        let mut room = Recycler::new(READ_BLOCK, SPARE_READ_BLOCKS);
        let mut buf = BytesMut::new();
        loop {
            if let Some(f) = frame::decode(&mut buf, MAX_INBOUND_FRAME)? {
                self.handle(f).await?;
                continue;
            }
            let want = frame::missing(&buf).max(MIN_READ);
            room.make_room(&mut buf, want);
            if read.read_buf(&mut buf).await? == 0 {
                return Ok(());
            }
            self.activity.note();
        }
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
            } => self.data(stream_id, fin, data).await,
            Frame::RstStream { stream_id, .. } => {
                // Dropping the sender without a FIN reads as a reset. Ids
                // never opened (or long gone) leave nothing behind.
                self.open.remove(&stream_id);
                if let Some(s) = self.live.remove(&stream_id).and_then(|w| w.upgrade()) {
                    s.reset.store(true, Ordering::Release);
                    s.gone.cancel();
                }
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

    /// Queue the peer's data on its stream, once the stream and the
    /// session have room for it: until then the session reads nothing
    /// more (TCP carries the back-pressure, as with the Go clients'
    /// spdystream). A reader its handler dropped discards the data.
    async fn data(&mut self, stream_id: u32, fin: bool, data: Bytes) {
        let Some(st) = self.open.get(&stream_id) else {
            return;
        };
        if !data.is_empty() {
            let data = if data.len() < COPY_BELOW {
                Bytes::copy_from_slice(&data)
            } else {
                data
            };
            let n = charge(data.len());
            if st.charge(n).await && st.tx.send(Inbound::Data(data, n)).is_err() {
                st.budget.give_back(n);
            }
        }
        if fin {
            let _ = st.tx.send(Inbound::Fin);
            self.open.remove(&stream_id);
        }
    }

    async fn refuse(&self, id: u32, status: u32) {
        let _ = self
            .out
            .send(Outbound::Frame(Frame::RstStream {
                stream_id: id,
                status,
            }))
            .await;
    }

    async fn open_stream(&mut self, id: u32, fin: bool, headers: Headers) {
        // Client streams are odd and increasing; anything else is refused
        // without ending the session.
        if id.is_multiple_of(2) || id <= self.last_id {
            self.refuse(id, rst::PROTOCOL_ERROR).await;
            return;
        }
        if self.going_away {
            self.refuse(id, rst::REFUSED_STREAM).await;
            return;
        }
        self.last_id = id;
        if self.tally.streams.load(Ordering::Relaxed) >= self.max_streams {
            tracing::info!(
                stream = id,
                limit = self.max_streams,
                "SPDY stream refused: the session holds --max-streams-per-session streams"
            );
            self.tally.stats.refused(Refusal::SessionStreams);
            self.refuse(id, rst::REFUSED_STREAM).await;
            return;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let budget = Arc::new(Budget {
            stream: Semaphore::new(self.stream_bytes),
            session: Arc::clone(&self.session_budget),
            stats: Arc::clone(&self.tally.stats),
        });
        if fin {
            let _ = tx.send(Inbound::Fin);
        } else {
            self.open.insert(
                id,
                OpenStream {
                    tx,
                    budget: Arc::clone(&budget),
                },
            );
        }
        let shared = Arc::new(Shared::new(&self.tally, &self.ended));
        if self.live.len() >= self.prune_at {
            // A stream whose handler let go of it: gone from both (its
            // input may still be open to a peer that never ends it).
            self.live.retain(|_, w| w.strong_count() > 0);
            self.open.retain(|_, s| !s.tx.is_closed());
            self.prune_at = (self.live.len() * 2).max(64);
        }
        self.live.insert(id, Arc::downgrade(&shared));
        let _ = self.out.send(Outbound::Reply { stream_id: id }).await;
        let stream = Stream {
            id,
            headers,
            reader: StreamReader {
                rx,
                shared: Arc::clone(&shared),
                budget,
                handed: 0,
                fin_seen: false,
            },
            writer: StreamWriter {
                id,
                out: self.out.clone(),
                shared,
            },
        };
        if self.streams.send(stream).await.is_err() {
            self.open.remove(&id);
            self.refuse(id, rst::REFUSED_STREAM).await;
        }
    }
}

/// Write what is queued, batched, until the queue closes, a write fails,
/// or [`Outbound::Close`] is done. Once the session has ended, only what
/// is already queued still goes out, whole frames, for [`LINGER`] at most
/// (a protocol error's GOAWAY; a stream's last frames to a peer that
/// closed only its side); a connection that takes nothing for that long
/// is let go mid-frame, as it is going anyway.
async fn write_loop<W: AsyncWrite + Unpin>(
    mut write: W,
    mut rx: mpsc::Receiver<Outbound>,
    activity: &Activity,
    ended: &CancellationToken,
) -> Result<(), SessionError> {
    let mut deflater = Deflater::new()?;
    let empty_block = encode_block(&[]);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut closing = false;
    let lingered = async {
        ended.cancelled().await;
        tokio::time::sleep(LINGER).await;
    };
    tokio::pin!(lingered);
    loop {
        let first = if ended.is_cancelled() {
            match rx.try_recv() {
                Ok(item) => item,
                Err(_) => return Ok(()),
            }
        } else {
            tokio::select! {
                item = rx.recv() => match item {
                    Some(item) => item,
                    None => return Ok(()),
                },
                _ = ended.cancelled() => continue,
            }
        };
        let mut next = Some(first);
        // Batch whatever is queued into one write.
        while let Some(item) = next.take() {
            match item {
                Outbound::Frame(f) => frame::encode(&f, &mut buf)?,
                Outbound::Stream(shared, f) => {
                    if !shared.reset.load(Ordering::Acquire) {
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
        let io = async {
            if !buf.is_empty() {
                write.write_all(&buf).await?;
                write.flush().await?;
                activity.note();
            }
            if closing {
                write.shutdown().await?;
            }
            Ok::<(), std::io::Error>(())
        };
        tokio::select! {
            biased;
            r = io => r?,
            _ = &mut lingered => return Ok(()),
        }
        buf.clear();
        if closing {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests;
