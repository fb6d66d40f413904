//! How many exec, attach and port-forward sessions may be open at once,
//! on the node and per Pod (docs/streaming.md, "Limits"): a session takes
//! a [`SessionPass`] before its upgrade and gives it back when it ends; a
//! request over a limit is answered 429 with a message naming the limit
//! and the flag that raises it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::config::StreamingConfig;
use crate::stream_stats::{Refusal, StreamStats};

/// Whether one more session may open, given those open on the node and
/// to its Pod. Pure.
pub fn admit(on_node: usize, on_pod: usize, limits: &StreamingConfig) -> Result<(), Refusal> {
    if on_node >= limits.max_sessions {
        return Err(Refusal::NodeSessions);
    }
    if on_pod >= limits.max_sessions_per_pod {
        return Err(Refusal::PodSessions);
    }
    Ok(())
}

/// What the client is told when `why` refuses a session to `pod` on
/// `node`.
pub fn refusal_message(why: Refusal, node: &str, pod: &str, limits: &StreamingConfig) -> String {
    match why {
        Refusal::NodeSessions => format!(
            "too many exec, attach and port-forward sessions open on node {node}: {} is the \
             limit (--max-streaming-sessions, env VK_MAX_STREAMING_SESSIONS); end some \
             sessions or raise the limit",
            limits.max_sessions
        ),
        Refusal::PodSessions => format!(
            "too many exec, attach and port-forward sessions open to pod {pod}: {} is the \
             limit (--max-streaming-sessions-per-pod, env VK_MAX_STREAMING_SESSIONS_PER_POD); \
             end some of them or raise the limit",
            limits.max_sessions_per_pod
        ),
        Refusal::SessionStreams => format!(
            "too many streams in one session to pod {pod}: {} is the limit \
             (--max-streams-per-session, env VK_MAX_STREAMS_PER_SESSION; a forwarded \
             connection takes two); close some connections or raise the limit",
            limits.max_streams_per_session
        ),
    }
}

/// Sessions open, on the node and per Pod (`namespace/name`).
#[derive(Debug)]
pub struct SessionGate {
    limits: StreamingConfig,
    stats: Arc<StreamStats>,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_pod: HashMap<String, usize>,
}

/// One open session; dropping it gives the place back.
#[derive(Debug)]
pub struct SessionPass {
    gate: Arc<SessionGate>,
    pod: String,
}

impl SessionGate {
    pub fn new(limits: StreamingConfig, stats: Arc<StreamStats>) -> Arc<SessionGate> {
        Arc::new(SessionGate {
            limits,
            stats,
            open: Mutex::default(),
        })
    }

    pub fn limits(&self) -> &StreamingConfig {
        &self.limits
    }

    pub fn stats(&self) -> &Arc<StreamStats> {
        &self.stats
    }

    fn open(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for one more session to `pod`, or why not (counted).
    pub fn enter(self: &Arc<Self>, pod: &str) -> Result<SessionPass, Refusal> {
        let mut open = self.open();
        let on_pod = open.by_pod.get(pod).copied().unwrap_or(0);
        if let Err(why) = admit(open.total, on_pod, &self.limits) {
            drop(open);
            self.stats.refused(why);
            return Err(why);
        }
        open.total += 1;
        *open.by_pod.entry(pod.to_string()).or_default() += 1;
        drop(open);
        self.stats.session_opened();
        Ok(SessionPass {
            gate: Arc::clone(self),
            pod: pod.to_string(),
        })
    }

    /// Sessions open on the node, and to `pod`.
    pub fn open_sessions(&self, pod: &str) -> (usize, usize) {
        let open = self.open();
        (open.total, open.by_pod.get(pod).copied().unwrap_or(0))
    }
}

impl Drop for SessionPass {
    fn drop(&mut self) {
        let mut open = self.gate.open();
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_pod.get_mut(&self.pod) {
            *n -= 1;
            if *n == 0 {
                open.by_pod.remove(&self.pod);
            }
        }
        drop(open);
        self.gate.stats.session_closed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(node: usize, pod: usize) -> StreamingConfig {
        StreamingConfig {
            max_sessions: node,
            max_sessions_per_pod: pod,
            ..StreamingConfig::default()
        }
    }

    #[test]
    fn admit_checks_the_node_then_the_pod() {
        let l = limits(3, 2);
        assert_eq!(admit(0, 0, &l), Ok(()));
        assert_eq!(admit(2, 1, &l), Ok(()));
        assert_eq!(admit(3, 0, &l), Err(Refusal::NodeSessions));
        assert_eq!(admit(1, 2, &l), Err(Refusal::PodSessions));
        assert_eq!(admit(3, 2, &l), Err(Refusal::NodeSessions));
    }

    #[test]
    fn passes_are_counted_per_pod_and_given_back() {
        let stats = Arc::new(StreamStats::default());
        let gate = SessionGate::new(limits(3, 2), Arc::clone(&stats));
        let a1 = gate.enter("ns/a").expect("first");
        let a2 = gate.enter("ns/a").expect("second");
        assert_eq!(gate.enter("ns/a").unwrap_err(), Refusal::PodSessions);
        let b1 = gate.enter("ns/b").expect("another pod");
        assert_eq!(gate.enter("ns/c").unwrap_err(), Refusal::NodeSessions);
        assert_eq!(gate.open_sessions("ns/a"), (3, 2));
        assert_eq!(stats.sessions(), 3);
        assert_eq!(stats.refusals(Refusal::PodSessions), 1);
        assert_eq!(stats.refusals(Refusal::NodeSessions), 1);
        drop(a1);
        assert_eq!(gate.open_sessions("ns/a"), (2, 1));
        let _a3 = gate.enter("ns/a").expect("room again");
        drop((a2, b1));
        assert_eq!(gate.open_sessions("ns/b"), (1, 0));
        assert!(!gate.open().by_pod.contains_key("ns/b"), "no entry left");
        assert_eq!(stats.sessions(), 1);
    }

    #[test]
    fn messages_name_the_limit_and_the_flag() {
        let l = limits(7, 3);
        let m = refusal_message(Refusal::NodeSessions, "node-a", "ns/p", &l);
        assert!(
            m.contains("node node-a") && m.contains("7 is the limit"),
            "{m}"
        );
        assert!(m.contains("--max-streaming-sessions,") && m.contains("VK_MAX_STREAMING_SESSIONS"));
        let m = refusal_message(Refusal::PodSessions, "node-a", "ns/p", &l);
        assert!(
            m.contains("pod ns/p") && m.contains("3 is the limit"),
            "{m}"
        );
        assert!(m.contains("--max-streaming-sessions-per-pod"), "{m}");
        let m = refusal_message(Refusal::SessionStreams, "node-a", "ns/p", &l);
        assert!(m.contains("512 is the limit") && m.contains("--max-streams-per-session"));
    }
}
