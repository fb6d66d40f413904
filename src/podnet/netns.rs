//! Sockets in the network namespace where Pod addresses live
//! (`--pod-netns`; the process's own when unset). A socket belongs to the
//! namespace it was made in, whatever thread uses it later: a short-lived
//! thread enters the namespace, binds, and ends, so the rest of the
//! process (the apiserver, sandboxd) stays where it is.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};

/// Where Pod-address sockets are made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodNetns(Option<PathBuf>);

impl PodNetns {
    /// `None`: the process's own namespace.
    pub fn new(path: Option<PathBuf>) -> PodNetns {
        PodNetns(path)
    }

    pub fn path(&self) -> Option<&Path> {
        self.0.as_deref()
    }

    /// Binds a listening TCP socket at `addr` in the namespace (non-
    /// blocking, for tokio).
    pub fn listen(&self, addr: SocketAddr) -> std::io::Result<TcpListener> {
        self.within(move || {
            // std sets SO_REUSEADDR on Unix: a relay restarted while its
            // old connections linger in TIME_WAIT binds again at once.
            let listener = TcpListener::bind(addr)?;
            listener.set_nonblocking(true)?;
            Ok(listener)
        })
    }

    /// Runs `make` in the namespace, on a thread of its own.
    pub fn within<T: Send + 'static>(
        &self,
        make: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        let Some(path) = self.0.clone() else {
            return make();
        };
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("open the Pod network namespace {}: {e}", path.display()),
                )
            })?;
            use std::os::fd::AsRawFd;
            // SAFETY: setns(2) on a descriptor this thread owns and keeps
            // open for the call; it changes only this thread's namespace,
            // and the thread ends when `make` returns.
            let entered = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            if entered != 0 {
                let e = std::io::Error::last_os_error();
                return Err(std::io::Error::new(
                    e.kind(),
                    format!(
                        "enter the Pod network namespace {}: {e} (needs CAP_SYS_ADMIN)",
                        path.display()
                    ),
                ));
            }
            make()
        })
        .join()
        .map_err(|_| std::io::Error::other("the namespace thread panicked"))?
    }
}
