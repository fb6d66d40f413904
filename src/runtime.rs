//! The async runtime every entry point (daemon, preflight, claims CLI)
//! builds the same way.

use crate::error::{Error, Result};

/// How many worker threads the runtime has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// One per core: the daemon and preflight, whose checks run at once.
    Multi,
    /// The calling thread only: one-shot commands.
    Current,
}

/// A tokio runtime with I/O and timers enabled; the TLS crypto provider is
/// installed first, so every client built on it uses the same one.
pub fn build(threads: Threads) -> Result<tokio::runtime::Runtime> {
    crate::crypto::install_provider();
    let mut builder = match threads {
        Threads::Multi => tokio::runtime::Builder::new_multi_thread(),
        Threads::Current => tokio::runtime::Builder::new_current_thread(),
    };
    builder
        .enable_all()
        .build()
        .map_err(|e| Error::Internal(format!("cannot start the async runtime: {e}")))
}
