//! The injectable clock: real time plus an offset, or frozen.

use std::sync::Mutex;

use jiff::{SignedDuration, Timestamp};

#[derive(Debug)]
pub struct Clock {
    state: Mutex<ClockState>,
}

#[derive(Debug, Clone, Copy)]
struct ClockState {
    offset: SignedDuration,
    frozen: Option<Timestamp>,
}

impl Clock {
    pub fn new(start: Option<Timestamp>, frozen: bool) -> Clock {
        let real = Timestamp::now();
        let offset = start.map_or(SignedDuration::ZERO, |s| s.duration_since(real));
        let frozen = frozen.then(|| start.unwrap_or(real));
        Clock {
            state: Mutex::new(ClockState { offset, frozen }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClockState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn now(&self) -> Timestamp {
        let st = *self.lock();
        match st.frozen {
            Some(t) => t,
            None => Timestamp::now()
                .checked_add(st.offset)
                .unwrap_or_else(|_| Timestamp::now()),
        }
    }

    /// Move the clock forward (or back, with a negative duration).
    pub fn advance(&self, by: SignedDuration) -> Timestamp {
        let mut st = self.lock();
        match &mut st.frozen {
            Some(t) => *t = t.checked_add(by).unwrap_or(*t),
            None => st.offset = st.offset.saturating_add(by),
        }
        drop(st);
        self.now()
    }

    /// Jump to an instant (the clock keeps running unless frozen).
    pub fn set(&self, to: Timestamp) -> Timestamp {
        let mut st = self.lock();
        match &mut st.frozen {
            Some(t) => *t = to,
            None => st.offset = to.duration_since(Timestamp::now()),
        }
        drop(st);
        self.now()
    }

    pub fn freeze(&self, frozen: bool) -> Timestamp {
        let now = self.now();
        let mut st = self.lock();
        match (frozen, st.frozen) {
            (true, None) => st.frozen = Some(now),
            (false, Some(t)) => {
                st.frozen = None;
                st.offset = t.duration_since(Timestamp::now());
            }
            _ => {}
        }
        drop(st);
        self.now()
    }

    pub fn is_frozen(&self) -> bool {
        self.lock().frozen.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_clock_moves_only_when_told() {
        let start: Timestamp = "2026-07-06T00:00:00Z".parse().expect("ts");
        let clock = Clock::new(Some(start), true);
        assert_eq!(clock.now(), start);
        clock.advance(SignedDuration::from_secs(90));
        assert_eq!(clock.now(), start + SignedDuration::from_secs(90));
        let later: Timestamp = "2027-01-01T00:00:00Z".parse().expect("ts");
        assert_eq!(clock.set(later), later);
    }

    #[test]
    fn running_clock_follows_offset() {
        let clock = Clock::new(None, false);
        let before = Timestamp::now();
        let t = clock.advance(SignedDuration::from_hours(1));
        assert!(t >= before + SignedDuration::from_hours(1));
        let frozen_at = clock.freeze(true);
        assert_eq!(clock.now(), frozen_at);
        assert!(clock.is_frozen());
    }
}
