//! One stream as its handler holds it: the peer's data ([`StreamReader`],
//! charged to the stream's and the session's byte budgets), this side's
//! frames ([`StreamWriter`], through the writer task's queue), and what
//! they share with the session (gone with it, or with a reset).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bytes::Bytes;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::limits::MAX_DATA_FRAME;
use crate::spdy::frame::{Frame, rst};
use crate::spdy::headers::Headers;
use crate::stream_stats::StreamStats;

/// What the peer sent on a stream.
#[derive(Debug)]
pub(super) enum Inbound {
    /// Data, and the bytes charged for it.
    Data(Bytes, usize),
    /// The peer's FIN. (A closed channel without it: reset, or the session
    /// ended.)
    Fin,
}

/// The byte budgets one stream's queued data is charged to.
#[derive(Debug)]
pub(super) struct Budget {
    pub(super) stream: Semaphore,
    pub(super) session: Arc<Semaphore>,
    pub(super) stats: Arc<StreamStats>,
}

impl Budget {
    pub(super) fn give_back(&self, n: usize) {
        if n > 0 {
            self.stream.add_permits(n);
            self.session.add_permits(n);
            self.stats.queued(-(n as i64));
        }
    }
}

/// Open streams of one session, counted as their handlers hold them.
#[derive(Debug)]
pub(super) struct Tally {
    pub(super) streams: AtomicUsize,
    pub(super) stats: Arc<StreamStats>,
}

/// What a stream's reader and writers share with the session.
#[derive(Debug)]
pub(super) struct Shared {
    /// Cancelled when the peer resets the stream, or (a child of the
    /// session's `ended`) when the session ends.
    pub(super) gone: CancellationToken,
    /// The peer reset the stream: the writer task drops whatever is still
    /// queued for it (no per-id record is kept).
    pub(super) reset: AtomicBool,
    pub(super) tally: Arc<Tally>,
}

impl Shared {
    pub(super) fn new(tally: &Arc<Tally>, ended: &CancellationToken) -> Shared {
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
    pub(super) rx: mpsc::UnboundedReceiver<Inbound>,
    pub(super) shared: Arc<Shared>,
    pub(super) budget: Arc<Budget>,
    /// Charged bytes of what the last call handed out: given back at the
    /// next call (the caller is done with it by then) or when dropped.
    pub(super) handed: usize,
    /// The peer's FIN was taken: every later call says so.
    pub(super) fin_seen: bool,
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
    pub(super) fn give_back(&mut self) {
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
pub(super) enum Outbound {
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
    pub(super) id: u32,
    pub(super) out: mpsc::Sender<Outbound>,
    pub(super) shared: Arc<Shared>,
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
