//! `<name> [k/M, 1m05s] what` progress lines on stderr, for the long runs
//! (`make bench`, `make reliability`), and the time they took.

use std::time::{Duration, Instant};

/// `1m05s`, or `42s` under a minute.
pub fn elapsed(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// Step `step` of `total`, timed from `t0`.
pub struct Progress {
    name: &'static str,
    t0: Instant,
    pub step: usize,
    pub total: usize,
}

impl Progress {
    pub fn new(name: &'static str, total: usize, t0: Instant) -> Progress {
        Progress {
            name,
            t0,
            step: 0,
            total,
        }
    }

    /// Announce the next step.
    pub fn step(&mut self, what: &str) {
        self.step += 1;
        eprintln!(
            "{} [{}/{}, {}] {what}",
            self.name,
            self.step,
            self.total,
            self.elapsed()
        );
    }

    /// The time since `t0`.
    pub fn elapsed(&self) -> String {
        elapsed(self.t0.elapsed())
    }
}
