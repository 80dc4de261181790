//! How fast a pool's queue drains: the measure behind SLO-aware
//! admission's prediction (`slo.rs`), kept in each pool's state.

use std::time::Duration;

use crate::core::time::Instant;

/// Half-life of the drain-rate measure.
pub(super) const DRAIN_HALF_LIFE: Duration = Duration::from_secs(10);
/// Queue time a pool must have been seen to drain in before its rate is
/// trusted for a prediction.
const MIN_DRAIN_SECS: f64 = 1.0;
/// How fast a pool's queue drains: queue cost dispatched per second of
/// non-empty queue, decaying (see the module docs).
#[derive(Clone, Debug, Default)]
pub(super) struct DrainRate {
    work: f64,
    secs: f64,
    last: Option<Instant>,
    backlogged: bool,
    /// The pool's slots have turned over once (as many requests completed
    /// as its windows hold): before that, a queue behind slots all filled
    /// at once says nothing of how fast it will drain.
    warm: Option<Instant>,
    completions: u32,
}

impl DrainRate {
    /// Brings the measure to `now`: the time since the last call counts
    /// if the queue was not empty then. Only such time ages the measure:
    /// an idle pool keeps the rate it last drained at.
    pub(super) fn advance(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let dt = now.saturating_since(last).as_secs_f64();
            if dt > 0.0 && self.backlogged && self.warm.is_some() {
                let lambda = std::f64::consts::LN_2 / DRAIN_HALF_LIFE.as_secs_f64();
                let keep = (-lambda * dt).exp();
                self.work *= keep;
                // ∫ e^{-λ(now - s)} ds over the interval.
                self.secs = self.secs * keep + (1.0 - keep) / lambda;
            }
        }
        self.last = Some(now);
    }

    /// Whether the queue is non-empty from `now` on.
    pub(super) fn set_backlogged(&mut self, now: Instant, backlogged: bool) {
        self.advance(now);
        self.backlogged = backlogged;
    }

    /// A request of queue cost `work` that had waited left the queue.
    pub(super) fn dispatched(&mut self, now: Instant, work: f64) {
        self.advance(now);
        // Not what left at the instant the measure started: its time is
        // not in the measure.
        if self.warm.is_some_and(|w| now > w) {
            self.work += work;
        }
    }

    /// A request of the pool completed; `window` is the pool's slots. The
    /// measure starts once as many have completed.
    pub(super) fn completed(&mut self, now: Instant, window: u32) {
        if self.warm.is_none() {
            self.completions += 1;
            if self.completions >= window {
                self.advance(now);
                self.warm = Some(now);
            }
        }
    }

    /// Queue cost per second, once enough has been seen.
    pub(super) fn rate(&self) -> Option<f64> {
        (self.secs >= MIN_DRAIN_SECS && self.work > 0.0).then(|| self.work / self.secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    #[test]
    fn a_steadily_drained_queue_measures_its_rate() {
        let mut d = DrainRate::default();
        d.set_backlogged(at(0), true);
        // Before any completion, a full pool's queue is not measured.
        d.dispatched(at(0), 5.0);
        d.completed(at(0), 2);
        d.dispatched(at(0), 5.0);
        d.completed(at(0), 2);
        assert_eq!(d.rate(), None, "nothing seen yet");
        // 4 units a second for 30 s.
        for k in 1..=120 {
            d.dispatched(at(k * 250), 1.0);
        }
        let r = d.rate().unwrap();
        assert!((r - 4.0).abs() < 0.1, "{r}");
        // An idle minute does not dilute the rate: only backlogged time counts.
        d.set_backlogged(at(30_000), false);
        d.advance(at(90_000));
        let r = d.rate().unwrap();
        assert!((r - 4.0).abs() < 0.1, "{r}");
    }
}
