//! Why a session's reader or writer stopped.

use crate::spdy::frame::FrameError;

#[derive(Debug, thiserror::Error)]
pub(super) enum SessionError {
    #[error("transport: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Frame(#[from] FrameError),
}
