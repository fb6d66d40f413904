//! The one exponential back-off every retry loop uses: `start`, doubling
//! per failure, capped at `cap`; reset by a success.

use std::time::Duration;

/// The delay after the `n`th consecutive failure (`n` ≥ 1; 0 counts as 1).
pub fn nth(start: Duration, cap: Duration, n: u32) -> Duration {
    let doublings = n.saturating_sub(1).min(30);
    start.saturating_mul(1u32 << doublings).min(cap)
}

/// A back-off for a loop: [`Backoff::failed`] gives the next delay,
/// [`Backoff::reset`] starts over after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    start: Duration,
    cap: Duration,
    failures: u32,
}

impl Backoff {
    pub fn new(start: Duration, cap: Duration) -> Backoff {
        Backoff {
            start,
            cap,
            failures: 0,
        }
    }

    /// Records a failure; returns how long to wait before the next try.
    pub fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        nth(self.start, self.cap, self.failures)
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let ms = Duration::from_millis;
        assert_eq!(nth(ms(500), ms(180_000), 0), ms(500));
        assert_eq!(nth(ms(500), ms(180_000), 1), ms(500));
        assert_eq!(nth(ms(500), ms(180_000), 2), ms(1000));
        assert_eq!(nth(ms(500), ms(180_000), 4), ms(4000));
        assert_eq!(nth(ms(500), ms(180_000), 9), ms(128_000));
        assert_eq!(nth(ms(500), ms(180_000), 10), ms(180_000));
        assert_eq!(nth(ms(500), ms(180_000), u32::MAX), ms(180_000));
        let mut b = Backoff::new(ms(200), ms(7000));
        assert_eq!(
            [b.failed(), b.failed(), b.failed()],
            [ms(200), ms(400), ms(800)]
        );
        assert_eq!(b.failures(), 3);
        b.reset();
        assert_eq!(b.failed(), ms(200));
    }
}
