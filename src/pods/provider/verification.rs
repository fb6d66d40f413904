//! The verification creates share (`Provider::verify` in `create.rs`):
//! after a restart every Pod whose row is
//! quarantined waits for a listing to vouch for it. They share one: a
//! create that finds a listing started after it asked takes that one's
//! answer, and after a failed listing the next is only tried once its
//! back-off (1 s doubling to 60 s) has passed; until then a create fails
//! at once with that failure. So 64 reconciles after a restart while
//! sandboxd is still starting send one listing, not 64.

use std::time::{Duration, Instant};

use crate::backoff::Backoff;

#[derive(Debug)]
pub(super) struct Verification {
    /// When the last successful verification listing started.
    last_ok: Option<Instant>,
    /// After a failure: when the next may be tried, and why it failed.
    last_failure: Option<(Instant, String)>,
    backoff: Backoff,
}

impl Default for Verification {
    fn default() -> Verification {
        Verification {
            last_ok: None,
            last_failure: None,
            backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
        }
    }
}

/// What a create asking at `asked` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ask {
    /// A listing that started after it asked vouched for the rows.
    Verified,
    /// The last listing failed and its back-off has not passed: why.
    Failed(String),
    /// List now.
    List,
}

impl Verification {
    pub(super) fn ask(&self, asked: Instant, now: Instant) -> Ask {
        if self.last_ok.is_some_and(|started| started >= asked) {
            return Ask::Verified;
        }
        match &self.last_failure {
            Some((retry_at, why)) if now < *retry_at => Ask::Failed(why.clone()),
            _ => Ask::List,
        }
    }

    /// A listing that started at `started` succeeded.
    pub(super) fn succeeded(&mut self, started: Instant) {
        self.last_ok = Some(started);
        self.last_failure = None;
        self.backoff.reset();
    }

    /// A listing failed at `now` for `why`.
    pub(super) fn failed(&mut self, now: Instant, why: String) {
        let retry_at = now + self.backoff.failed();
        self.last_failure = Some((retry_at, why));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_listing_answers_those_that_asked_before_it_and_failures_back_off() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut v = Verification::default();
        assert_eq!(v.ask(t0, t0), Ask::List);
        v.failed(t0, "503".into());
        assert_eq!(v.ask(t0, t0), Ask::Failed("503".into()));
        assert_eq!(v.ask(t0, t0 + s(1)), Ask::List, "1 s back-off");
        v.failed(t0 + s(1), "503".into());
        assert_eq!(v.ask(t0, t0 + s(2)), Ask::Failed("503".into()));
        assert_eq!(v.ask(t0, t0 + s(3)), Ask::List, "then 2 s");
        v.succeeded(t0 + s(3));
        assert_eq!(v.ask(t0 + s(2), t0 + s(4)), Ask::Verified);
        assert_eq!(
            v.ask(t0 + s(5), t0 + s(5)),
            Ask::List,
            "asked after it started"
        );
        v.failed(t0 + s(5), "x".into());
        assert_eq!(
            v.ask(t0 + s(5), t0 + s(5)),
            Ask::Failed("x".into()),
            "back-off reset to 1 s"
        );
        assert_eq!(v.ask(t0 + s(5), t0 + s(6)), Ask::List);
    }
}
