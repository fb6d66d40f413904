//! Ending an upgraded session from this side (docs/streaming.md,
//! "Limits"): after `--streaming-idle-timeout` without a byte either way,
//! and when the client's connection is gone even though the session's data
//! path is stuck. A session whose stdin waits on a process that does not
//! read never reads its connection again, so it would never see the
//! client leave; the socket itself says so (the peer's FIN, a reset, a
//! keep-alive failure), and [`Watch`] looks there once a second. And when
//! the kubelet API shuts down: its sessions end within its grace
//! ([`Sessions`]).

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::activity::Activity;
use crate::spdy;
use crate::stream_stats::{Close, StreamStats};

/// How often the socket is looked at for a hang-up.
pub const HANGUP_POLL: Duration = Duration::from_secs(1);

/// The accepted socket of a kubelet API connection, as a request
/// extension: valid while the request is being handled (its connection
/// owns the socket until then).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionFd(pub RawFd);

/// A handle on a connection's socket that outlives its request: a
/// duplicate of the descriptor, so it must not outlive the session (the
/// socket stays open while it is held).
#[derive(Debug)]
pub struct HangupFd(OwnedFd);

impl HangupFd {
    /// Duplicate the socket of `conn`; `None` if that fails.
    pub fn of(conn: ConnectionFd) -> Option<HangupFd> {
        // SAFETY: the connection that put `conn` in the request owns the
        // socket for as long as the request is handled, which is when this
        // is called; the duplicate has its own lifetime from here.
        let fd = unsafe { BorrowedFd::borrow_raw(conn.0) };
        fd.try_clone_to_owned().ok().map(HangupFd)
    }

    /// Whether the peer closed its side or the connection failed.
    pub fn hung_up(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }
}

/// The upgraded sessions of one kubelet API server, as a request extension
/// its connections carry: each runs on `tracker`, and ends (counted as
/// [`Close::Shutdown`]) when `shutdown` is cancelled; the server waits for
/// `tracker` within its shutdown grace.
#[derive(Debug, Clone, Default)]
pub struct Sessions {
    pub tracker: TaskTracker,
    pub shutdown: CancellationToken,
}

/// What one session is held to: its SPDY limits (when it speaks SPDY)
/// and its watch.
#[derive(Debug)]
pub struct Upkeep {
    pub spdy: spdy::Limits,
    pub watch: Watch,
}

impl Default for Upkeep {
    /// The default SPDY limits, no idle timeout, no socket.
    fn default() -> Self {
        let spdy = spdy::Limits::default();
        Upkeep {
            watch: Watch {
                idle_timeout: None,
                socket: None,
                shutdown: CancellationToken::new(),
                stats: Arc::clone(&spdy.stats),
            },
            spdy,
        }
    }
}

/// What ends a session from this side: its idle timeout, and its client's
/// socket.
#[derive(Debug)]
pub struct Watch {
    pub idle_timeout: Option<Duration>,
    pub socket: Option<HangupFd>,
    /// The server's shutdown ([`Sessions::shutdown`]).
    pub shutdown: CancellationToken,
    pub stats: Arc<StreamStats>,
}

/// When to look again, given how long the session has been idle: `None`
/// when it is to be closed now. Pure.
pub fn next_look(idle: Duration, timeout: Option<Duration>, socket: bool) -> Option<Duration> {
    let until_idle = match timeout {
        Some(t) if idle >= t => return None,
        Some(t) => t - idle,
        None => Duration::MAX,
    };
    Some(if socket {
        until_idle.min(HANGUP_POLL)
    } else {
        until_idle
    })
}

impl Watch {
    /// Resolves when the session is to be ended, and why (counted); only
    /// at shutdown when it has neither an idle timeout nor a socket to
    /// watch.
    pub async fn closed(&self, activity: &Activity) -> Close {
        let why = tokio::select! {
            why = self.looked(activity) => why,
            _ = self.shutdown.cancelled() => Close::Shutdown,
        };
        self.stats.closed(why);
        why
    }

    /// The socket's hang-up or the idle timeout, looked for.
    async fn looked(&self, activity: &Activity) -> Close {
        loop {
            if self.socket.as_ref().is_some_and(HangupFd::hung_up) {
                break Close::HangUp;
            }
            match next_look(
                activity.idle_for(),
                self.idle_timeout,
                self.socket.is_some(),
            ) {
                None => break Close::IdleTimeout,
                Some(Duration::MAX) => std::future::pending::<()>().await,
                Some(wait) => tokio::time::sleep(wait).await,
            }
        }
    }

    /// Abort `session` when [`Watch::closed`] says so; the task ends with
    /// the returned guard.
    pub fn spdy(self, session: &spdy::Session) -> Watching {
        let session = session.clone();
        Watching(tokio::spawn(async move {
            let why = self.closed(session.activity()).await;
            tracing::info!(reason = why.label(), "closing the streaming session");
            session.abort();
        }))
    }
}

/// A watch running beside its session: stopped (and its socket handle
/// let go) when dropped, as the session returns.
#[derive(Debug)]
pub struct Watching(JoinHandle<()>);

impl Watching {
    pub fn new(task: JoinHandle<()>) -> Watching {
        Watching(task)
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_look_is_the_idle_deadline_or_the_socket_poll() {
        let h = Duration::from_secs(3600);
        assert_eq!(next_look(Duration::ZERO, None, false), Some(Duration::MAX));
        assert_eq!(next_look(Duration::ZERO, None, true), Some(HANGUP_POLL));
        assert_eq!(
            next_look(Duration::from_secs(600), Some(h), false),
            Some(Duration::from_secs(3000))
        );
        assert_eq!(
            next_look(Duration::from_secs(600), Some(h), true),
            Some(HANGUP_POLL)
        );
        assert_eq!(
            next_look(h - Duration::from_millis(300), Some(h), true),
            Some(Duration::from_millis(300))
        );
        assert_eq!(next_look(h, Some(h), true), None);
        assert_eq!(next_look(h + h, Some(h), false), None);
    }

    #[tokio::test]
    async fn a_socket_whose_peer_closed_is_a_hang_up() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let mut client = tokio::net::TcpStream::connect(l.local_addr().expect("address"))
            .await
            .expect("connect");
        let (server, _) = l.accept().await.expect("accept");
        let fd = HangupFd::of(ConnectionFd(server.as_raw_fd())).expect("dup");
        assert!(!fd.hung_up());
        // Unread data in the server's buffer does not hide the FIN.
        tokio::io::AsyncWriteExt::write_all(&mut client, b"unread")
            .await
            .expect("write");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!fd.hung_up(), "data alone is no hang-up");
        drop(client);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(fd.hung_up());
        let stats = Arc::new(StreamStats::default());
        let w = Watch {
            idle_timeout: None,
            socket: Some(fd),
            shutdown: CancellationToken::new(),
            stats: Arc::clone(&stats),
        };
        assert_eq!(w.closed(&Activity::new()).await, Close::HangUp);
        assert_eq!(stats.closes(Close::HangUp), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_session_is_closed_at_its_timeout_and_activity_defers_it() {
        let stats = Arc::new(StreamStats::default());
        let w = Watch {
            idle_timeout: Some(Duration::from_secs(3600)),
            socket: None,
            shutdown: CancellationToken::new(),
            stats: Arc::clone(&stats),
        };
        let activity = Activity::new();
        let start = tokio::time::Instant::now();
        let later = activity.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1800)).await;
            later.note();
        });
        assert_eq!(w.closed(&activity).await, Close::IdleTimeout);
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(5400) && took < Duration::from_secs(5401),
            "{took:?}: an hour after the last activity"
        );
        assert_eq!(stats.closes(Close::IdleTimeout), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_a_session_that_nothing_else_would() {
        let stats = Arc::new(StreamStats::default());
        let w = Watch {
            idle_timeout: None,
            socket: None,
            shutdown: CancellationToken::new(),
            stats: Arc::clone(&stats),
        };
        let activity = Activity::new();
        let closed = w.closed(&activity);
        tokio::pin!(closed);
        assert!(
            tokio::time::timeout(Duration::from_secs(86_400), &mut closed)
                .await
                .is_err(),
            "nothing ends it"
        );
        w.shutdown.cancel();
        assert_eq!(closed.await, Close::Shutdown);
        assert_eq!(stats.closes(Close::Shutdown), 1);
        assert_eq!(stats.closes(Close::HangUp), 0);
    }
}
