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

mod error;
mod limits;
mod reader;
mod stream;
mod writer;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

pub use limits::{
    COPY_BELOW, FRAME_COST, LINGER, Limits, MAX_DATA_FRAME, MAX_INBOUND_FRAME, charge,
};
pub use stream::{Closed, End, Stream, StreamReader, StreamWriter};

use crate::activity::Activity;
use crate::spdy::headers::Inflater;
use limits::WRITE_QUEUE;
use reader::Reader;
use stream::{Outbound, Tally};
use writer::write_loop;

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

#[cfg(test)]
mod tests;
