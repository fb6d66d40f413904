//! A claim kept when its Pod was deleted with its owner alive, and when
//! its owner is asked again (`recheck.rs`): on a back-off of its own (30 s
//! doubling to 15 min), so a thousand preserved claims do not cost the
//! apiserver a thousand GETs every 30 s for a day.

use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::pods::pod::Pod;

const RECHECK_START: Duration = Duration::from_secs(30);
const RECHECK_CAP: Duration = Duration::from_secs(900);

/// One preserved claim: its id, the Pod deleted, and when its owner is
/// asked next.
#[derive(Debug, Clone)]
pub(super) struct Preserved {
    pub(super) id: String,
    pub(super) pod: Pod,
    due: Instant,
    backoff: Backoff,
}

impl Preserved {
    /// Asked on the next recheck.
    pub(super) fn new(id: &str, pod: &Pod) -> Preserved {
        Preserved {
            id: id.to_string(),
            pod: pod.clone(),
            due: Instant::now(),
            backoff: Backoff::new(RECHECK_START, RECHECK_CAP),
        }
    }

    /// Whether its owner is to be asked at `now`.
    pub(super) fn due(&self, now: Instant) -> bool {
        self.due <= now
    }

    /// Its owner was asked and still holds it: ask again after the next
    /// back-off.
    pub(super) fn asked(&mut self, now: Instant) {
        self.due = now + self.backoff.failed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_asked_again_on_a_back_off() {
        let t0 = Instant::now();
        let mut p = Preserved::new("sb", &Pod::default());
        assert!(p.due(Instant::now()), "asked on the next recheck");
        p.asked(t0);
        assert!(!p.due(t0 + Duration::from_secs(29)));
        assert!(p.due(t0 + Duration::from_secs(30)));
        p.asked(t0);
        assert!(!p.due(t0 + Duration::from_secs(59)));
        assert!(p.due(t0 + Duration::from_secs(60)));
        for _ in 0..10 {
            p.asked(t0);
        }
        assert!(!p.due(t0 + Duration::from_secs(899)));
        assert!(p.due(t0 + Duration::from_secs(900)), "capped at 15 min");
    }
}
