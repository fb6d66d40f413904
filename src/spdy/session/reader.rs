//! The session's reader task: frames from the peer, each stream's data
//! queued within its budgets, new streams handed to the caller, resets and
//! pings answered.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::error::SessionError;
use super::limits::{
    COPY_BELOW, MAX_INBOUND_FRAME, MIN_READ, READ_BLOCK, SPARE_READ_BLOCKS, charge,
};
use super::stream::{Budget, Inbound, Outbound, Shared, Stream, StreamReader, StreamWriter, Tally};
use crate::activity::Activity;
use crate::spdy::frame::{self, Frame, goaway, rst};
use crate::spdy::headers::{Headers, Inflater, decode_block};
use crate::spdy::recycle::Recycler;
use crate::stream_stats::Refusal;

/// A stream whose input is still open.
#[derive(Debug)]
pub(super) struct OpenStream {
    pub(super) tx: mpsc::UnboundedSender<Inbound>,
    pub(super) budget: Arc<Budget>,
}

impl OpenStream {
    /// Wait until `n` more bytes may be queued on the stream and in the
    /// session, and charge them; false (nothing charged) when the stream's
    /// handler let go of its reader meanwhile.
    pub(super) async fn charge(&self, n: usize) -> bool {
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

pub(super) struct Reader {
    pub(super) out: mpsc::Sender<Outbound>,
    pub(super) streams: mpsc::Sender<Stream>,
    /// Streams whose input is still open, by id (pruned with `live`).
    pub(super) open: HashMap<u32, OpenStream>,
    /// Every stream a handler may still hold (pruned as they drop).
    pub(super) live: HashMap<u32, Weak<Shared>>,
    /// Size of `live` at which dropped streams are pruned next (from
    /// `open` too).
    pub(super) prune_at: usize,
    pub(super) inflater: Inflater,
    pub(super) last_id: u32,
    pub(super) going_away: bool,
    pub(super) stream_bytes: usize,
    pub(super) session_budget: Arc<Semaphore>,
    pub(super) max_streams: usize,
    pub(super) tally: Arc<Tally>,
    pub(super) activity: Activity,
    /// The session's end (see the module doc).
    pub(super) ended: CancellationToken,
}

impl Reader {
    pub(super) async fn run<R: AsyncRead + Unpin>(mut self, read: R) -> Result<(), SessionError> {
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

    pub(super) async fn read_frames<R: AsyncRead + Unpin>(
        &mut self,
        mut read: R,
    ) -> Result<(), SessionError> {
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

    pub(super) async fn handle(&mut self, f: Frame) -> Result<(), SessionError> {
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
    pub(super) async fn data(&mut self, stream_id: u32, fin: bool, data: Bytes) {
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

    pub(super) async fn refuse(&self, id: u32, status: u32) {
        let _ = self
            .out
            .send(Outbound::Frame(Frame::RstStream {
                stream_id: id,
                status,
            }))
            .await;
    }

    pub(super) async fn open_stream(&mut self, id: u32, fin: bool, headers: Headers) {
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
