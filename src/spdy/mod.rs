//! A small SPDY/3.1 implementation: what Kubernetes' streaming clients speak
//! to a kubelet for exec, attach and port-forward (docs/streaming.md).
//!
//! - [`frame`]: frames to and from bytes (pure);
//! - [`headers`]: header blocks and their zlib compression with the
//!   protocol's [`dictionary`];
//! - [`session`]: a server session over an upgraded connection;
//! - [`recycle`]: read buffers reused for the life of a connection.

pub mod dictionary;
pub mod frame;
pub mod headers;
pub mod recycle;
pub mod session;
#[cfg(test)]
pub(crate) mod testing;

pub use frame::{Frame, FrameError};
pub use headers::Headers;
pub use recycle::Recycler;
pub use session::{
    Closed, End, Limits, Session, Stream, StreamReader, StreamWriter, start, start_with,
};
