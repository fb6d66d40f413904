//! What a session holds at most, and what it costs (docs/streaming.md,
//! "Limits").

use std::sync::Arc;
use std::time::Duration;

use crate::stream_stats::StreamStats;

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
pub(super) const READ_BLOCK: usize = 128 * 1024;
/// ...and keeps this many of them for reuse while frames cut from them are
/// still queued or being written: at most 1 MiB per session.
pub(super) const SPARE_READ_BLOCKS: usize = 8;
/// The least room a read is given.
pub(super) const MIN_READ: usize = 8 * 1024;
/// A data frame smaller than this is copied out of the read block when it
/// is queued (a slice would keep the whole block alive for a few bytes);
/// a larger one stays a slice of it, so memory held by queued data is at
/// most `READ_BLOCK / COPY_BELOW` = 4 times the bytes charged for it.
pub const COPY_BELOW: usize = READ_BLOCK / 4;
/// What a queued data frame costs beyond its bytes (its queue entry and
/// allocation): a flood of tiny frames is charged for what it holds.
pub const FRAME_COST: usize = 64;
/// Frames queued for the writer task.
pub(super) const WRITE_QUEUE: usize = 64;
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
