//! The one periodic loop every side loop runs on: the Pod sweeps, the node
//! Lease, the Node status, the NodeInventory publisher, the orphan audit
//! (and any loop added later, e.g. a renewal of sandbox leases).
//!
//! A loop is a value implementing [`Turn`] (its state lives in its fields)
//! and a [`Periodic`] saying how it turns: its name (for `/livez`), its
//! period, when the first turn runs, and how long it may stay silent. The
//! helper registers the heartbeat, beats it before every turn, hands it to
//! the turn so work made of many units beats per unit, waits what the turn
//! asks (the period, or less after a failure), wakes early when the turn's
//! [`Turn::woken`] resolves, and ends as soon as the stop token is
//! cancelled, in the middle of a turn or of a wait.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::health::{Health, LoopHeartbeat, STALL_MARGIN};

/// When the first turn runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum First {
    /// At once.
    Now,
    /// One period after the loop starts (start-up already did the work).
    AfterPeriod,
}

/// How long to wait after a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The loop's period, counted from the start of the turn just done
    /// (a turn longer than the period is followed by the next at once).
    Period,
    /// This long from the end of the turn (a back-off, or a deadline the
    /// turn computed).
    After(Duration),
}

/// A loop's heartbeat as its turn sees it: [`Beat::beat`] once per unit of
/// work, so a long turn over many units is not mistaken for a stall.
#[derive(Debug, Clone, Default)]
pub struct Beat(Option<LoopHeartbeat>);

impl Beat {
    /// A heartbeat nobody watches (tests, loops run without `/livez`).
    pub fn none() -> Beat {
        Beat(None)
    }

    pub fn beat(&self) {
        if let Some(hb) = &self.0 {
            hb.beat();
        }
    }
}

/// One loop's work, turned by [`Periodic::run`].
pub trait Turn: Send {
    /// One turn: do the work, say when the next one is due.
    fn turn(&mut self, beat: &Beat) -> impl Future<Output = Next> + Send;

    /// Resolves when the next turn should start before its wait is over
    /// (e.g. the Node's readiness changed). Never, by default.
    fn woken(&mut self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }
}

/// How a loop turns.
#[derive(Debug, Clone, Copy)]
pub struct Periodic {
    name: &'static str,
    period: Duration,
    first: First,
    stall_margin: Duration,
}

impl Periodic {
    /// A loop named `name` (as `/livez` reports it) turning every
    /// `period`, the first time at once, allowed [`STALL_MARGIN`] of
    /// silence past its period.
    pub fn new(name: &'static str, period: Duration) -> Periodic {
        Periodic {
            name,
            period,
            first: First::Now,
            stall_margin: STALL_MARGIN,
        }
    }

    pub fn first(mut self, first: First) -> Periodic {
        self.first = first;
        self
    }

    /// How long past its period the loop may be silent before `/livez`
    /// fails (tests shorten it).
    pub fn stall_margin(mut self, margin: Duration) -> Periodic {
        self.stall_margin = margin;
        self
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// Turns `work` until `stop` is cancelled; registers the loop's
    /// heartbeat with `health` first (none without it).
    pub async fn run<T: Turn>(
        self,
        health: Option<&Arc<Health>>,
        stop: &CancellationToken,
        work: T,
    ) {
        let beat =
            Beat(health.map(|h| h.register_loop(self.name, self.period + self.stall_margin)));
        self.run_with(beat, stop, work).await
    }

    async fn run_with<T: Turn>(self, beat: Beat, stop: &CancellationToken, mut work: T) {
        let mut due = match self.first {
            First::Now => Instant::now(),
            First::AfterPeriod => Instant::now() + self.period,
        };
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                _ = work.woken() => {}
                _ = stop.cancelled() => return,
            }
            beat.beat();
            let started = Instant::now();
            let next = tokio::select! {
                next = work.turn(&beat) => next,
                _ = stop.cancelled() => return,
            };
            beat.beat();
            due = match next {
                Next::Period => started + self.period,
                Next::After(wait) => Instant::now() + wait,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records when each turn ran (paused clock: exact) and answers what
    /// it is told.
    struct Recorder {
        started: Instant,
        turns: Arc<Mutex<Vec<Duration>>>,
        answers: Vec<Next>,
        work: Duration,
        wake: Option<tokio::sync::watch::Receiver<u32>>,
    }

    impl Turn for Recorder {
        async fn turn(&mut self, beat: &Beat) -> Next {
            self.turns.lock().unwrap().push(self.started.elapsed());
            beat.beat();
            tokio::time::sleep(self.work).await;
            if self.answers.is_empty() {
                Next::Period
            } else {
                self.answers.remove(0)
            }
        }

        async fn woken(&mut self) {
            match &mut self.wake {
                Some(rx) => {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await
                    }
                }
                None => std::future::pending().await,
            }
        }
    }

    fn recorder(answers: Vec<Next>, work: Duration) -> (Recorder, Arc<Mutex<Vec<Duration>>>) {
        let turns = Arc::new(Mutex::new(Vec::new()));
        let r = Recorder {
            started: Instant::now(),
            turns: Arc::clone(&turns),
            answers,
            work,
            wake: None,
        };
        (r, turns)
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[tokio::test(start_paused = true)]
    async fn turns_each_period_from_the_start_of_a_turn_or_after_what_it_asks() {
        let (work, turns) = recorder(
            vec![Next::Period, Next::After(secs(3)), Next::Period],
            secs(1),
        );
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move { Periodic::new("t", secs(10)).run(None, &stop, work).await }
        });
        tokio::time::sleep(secs(35)).await;
        stop.cancel();
        task.await.expect("loop");
        // 0 (now), 10 (a period from 0), 14 (3 s after the 1 s turn at 10),
        // 24 and 34 (a period from each start).
        assert_eq!(
            *turns.lock().unwrap(),
            vec![secs(0), secs(10), secs(14), secs(24), secs(34)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_turn_may_wait_a_period_and_a_wake_comes_early() {
        let (mut work, turns) = recorder(Vec::new(), Duration::ZERO);
        let (tx, rx) = tokio::sync::watch::channel(0u32);
        work.wake = Some(rx);
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                Periodic::new("t", secs(10))
                    .first(First::AfterPeriod)
                    .run(None, &stop, work)
                    .await
            }
        });
        tokio::time::sleep(secs(12)).await;
        tx.send_replace(1);
        tokio::time::sleep(secs(1)).await;
        stop.cancel();
        task.await.expect("loop");
        assert_eq!(*turns.lock().unwrap(), vec![secs(10), secs(12)]);
    }

    #[tokio::test(start_paused = true)]
    async fn stop_ends_a_turn_in_the_middle_and_the_heartbeat_is_registered() {
        let health = Health::new();
        let (work, turns) = recorder(Vec::new(), secs(3600));
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let (stop, health) = (stop.clone(), Arc::clone(&health));
            async move {
                Periodic::new("hung", secs(10))
                    .stall_margin(secs(5))
                    .run(Some(&health), &stop, work)
                    .await
            }
        });
        tokio::time::sleep(secs(1)).await;
        assert!(health.liveness().is_ok());
        tokio::time::sleep(secs(20)).await;
        let stalled = health
            .liveness()
            .expect_err("a turn hung past period + margin");
        assert!(
            stalled.iter().any(|s| s.contains("hung loop silent")),
            "{stalled:?}"
        );
        stop.cancel();
        task.await.expect("the hung turn ends with the stop");
        assert_eq!(turns.lock().unwrap().len(), 1);
    }

    #[test]
    fn beat_without_health_does_nothing() {
        Beat::none().beat();
        let p = Periodic::new("x", secs(2));
        assert_eq!((p.name(), p.period(), p.first), ("x", secs(2), First::Now));
    }
}
