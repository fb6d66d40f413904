//! What the kubelet API's streaming sessions hold and refuse, process-wide:
//! plain atomics the sessions update as they go and the metrics read at
//! scrape time (`vk_sandbox_streaming_*`, docs/streaming.md, "Limits").
//! Shared by the SPDY sessions (streams, queued bytes) and the kubelet API
//! (sessions, refusals, closes), so it sits below both.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Why a streaming request or stream was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `--max-streaming-sessions`: the node's sessions are all in use.
    NodeSessions,
    /// `--max-streaming-sessions-per-pod`: this Pod's are.
    PodSessions,
    /// `--max-streams-per-session`: a SPDY stream (or a forwarded
    /// connection) over the session's limit.
    SessionStreams,
}

impl Refusal {
    pub const ALL: [Refusal; 3] = [
        Refusal::NodeSessions,
        Refusal::PodSessions,
        Refusal::SessionStreams,
    ];

    /// The metric's `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::NodeSessions => "node_sessions",
            Refusal::PodSessions => "pod_sessions",
            Refusal::SessionStreams => "session_streams",
        }
    }
}

/// Why an upgraded session was ended by this side before its client or
/// command ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// Nothing read or written for `--streaming-idle-timeout`.
    IdleTimeout,
    /// The client's connection closed or failed while the session was
    /// still busy (seen on the socket, apart from the data path).
    HangUp,
    /// The kubelet API is shutting down (an exec's process is killed, as
    /// for a client that leaves).
    Shutdown,
}

impl Close {
    pub const ALL: [Close; 3] = [Close::IdleTimeout, Close::HangUp, Close::Shutdown];

    /// The metric's `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Close::IdleTimeout => "idle_timeout",
            Close::HangUp => "hang_up",
            Close::Shutdown => "shutdown",
        }
    }
}

/// The counters and gauges.
#[derive(Debug, Default)]
pub struct StreamStats {
    sessions: AtomicI64,
    streams: AtomicI64,
    queued_bytes: AtomicI64,
    refusals: [AtomicU64; 3],
    closes: [AtomicU64; 3],
}

impl StreamStats {
    pub fn session_opened(&self) {
        self.sessions.fetch_add(1, Ordering::Relaxed);
    }

    pub fn session_closed(&self) {
        self.sessions.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn stream_opened(&self) {
        self.streams.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stream_closed(&self) {
        self.streams.fetch_sub(1, Ordering::Relaxed);
    }

    /// Bytes of the clients' data queued (or handed out and not yet done
    /// with) in SPDY sessions: `delta` more, or fewer when negative.
    pub fn queued(&self, delta: i64) {
        self.queued_bytes.fetch_add(delta, Ordering::Relaxed);
    }

    pub fn refused(&self, why: Refusal) {
        self.refusals[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn closed(&self, why: Close) {
        self.closes[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Upgraded sessions open now.
    pub fn sessions(&self) -> i64 {
        self.sessions.load(Ordering::Relaxed)
    }

    /// SPDY streams open now.
    pub fn streams(&self) -> i64 {
        self.streams.load(Ordering::Relaxed)
    }

    pub fn queued_bytes(&self) -> i64 {
        self.queued_bytes.load(Ordering::Relaxed)
    }

    pub fn refusals(&self, why: Refusal) -> u64 {
        self.refusals[why as usize].load(Ordering::Relaxed)
    }

    pub fn closes(&self, why: Close) -> u64 {
        self.closes[why as usize].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_counts_apart() {
        let s = StreamStats::default();
        s.refused(Refusal::PodSessions);
        s.refused(Refusal::PodSessions);
        s.refused(Refusal::SessionStreams);
        s.closed(Close::HangUp);
        assert_eq!(s.refusals(Refusal::NodeSessions), 0);
        assert_eq!(s.refusals(Refusal::PodSessions), 2);
        assert_eq!(s.refusals(Refusal::SessionStreams), 1);
        assert_eq!(s.closes(Close::IdleTimeout), 0);
        assert_eq!(s.closes(Close::HangUp), 1);
        s.session_opened();
        s.session_opened();
        s.session_closed();
        s.stream_opened();
        s.queued(100);
        s.queued(-40);
        assert_eq!((s.sessions(), s.streams(), s.queued_bytes()), (1, 1, 60));
        s.stream_closed();
        assert_eq!(s.streams(), 0);
        let labels: Vec<_> = Refusal::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels, ["node_sessions", "pod_sessions", "session_streams"]);
        let labels: Vec<_> = Close::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels, ["idle_timeout", "hang_up", "shutdown"]);
    }
}
