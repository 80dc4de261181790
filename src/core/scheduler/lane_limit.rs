//! The batch lane's share of each backend, following live latency
//! (`QueueSpec::batch_latency_target`): a feedback loop in place of a
//! fixed reserve.
//!
//! Live requests share an engine's steps with the batch items beside
//! them, so their time to first token rises with the batch's share of the
//! engine. Per backend, the loop compares the live requests' recent TTFT
//! (a moving average over them all) with their TTFT without batch work
//! beside them (a slower average over those dispatched while no batch
//! item ran there): past `target` times that, it halves the number of
//! batch items the backend may run (at most once per [`CUT_EVERY`]);
//! within it, it adds a quarter of an item per live request. With no live
//! request for [`QUIET`], live traffic is quiet and the batch may take
//! every slot again. As adaptive concurrency limiters do (AIMD on a
//! latency gradient), with no fixed reserve to tune: the loop finds how
//! many items each engine runs beside its live traffic at the target.
//!
//! Until a live request has been seen alone on a backend there is no
//! baseline, and nothing is limited there.

use std::time::Duration;

use crate::core::ids::{BackendId, RequestId};
use crate::core::time::Instant;

use super::Scheduler;
use super::state::{LaneLimit, Phase};
use crate::core::routing::Candidate;

/// The least time between two cuts of one backend's limit: the cut's
/// effect shows in the TTFTs of requests dispatched after it.
pub(super) const CUT_EVERY: Duration = Duration::from_millis(500);
/// No live request for this long: the batch may take every slot.
pub(super) const QUIET: Duration = Duration::from_secs(2);
/// Weight of a new sample in the recent average, and in the baseline.
const RECENT_ALPHA: f64 = 0.2;
const ALONE_ALPHA: f64 = 0.05;
/// What a live request within the target adds to the limit.
const GROWTH: f64 = 0.25;

fn ewma(avg: Option<Duration>, sample: Duration, alpha: f64) -> Duration {
    avg.map_or(sample, |a| a.mul_f64(1.0 - alpha) + sample.mul_f64(alpha))
}

impl LaneLimit {
    /// A live request's TTFT, dispatched `beside` batch work or not.
    fn live_ttft(&mut self, now: Instant, ttft: Duration, beside: bool, target: f64, window: u32) {
        self.last_live = Some(now);
        if !beside {
            self.alone = Some(ewma(self.alone, ttft, ALONE_ALPHA));
        }
        self.recent = Some(ewma(self.recent, ttft, RECENT_ALPHA));
        let (Some(alone), Some(recent)) = (self.alone, self.recent) else {
            return;
        };
        let window = f64::from(window.max(1));
        let limit = self.limit.unwrap_or(window);
        if recent.as_secs_f64() > target * alone.as_secs_f64() {
            if self.batch_in_flight > 0
                && self
                    .last_cut
                    .is_none_or(|t| now.saturating_since(t) >= CUT_EVERY)
            {
                self.limit = Some((f64::from(self.batch_in_flight).min(limit) / 2.0).max(1.0));
                self.last_cut = Some(now);
            }
        } else {
            self.limit = Some((limit + GROWTH).min(window));
        }
    }

    /// Whether one more batch item may go there at `now`.
    pub(super) fn has_room(&mut self, now: Instant) -> bool {
        if self
            .last_live
            .is_none_or(|t| now.saturating_since(t) >= QUIET)
        {
            // Live traffic quiet: every slot, until it speaks again.
            self.limit = None;
        }
        self.limit
            .is_none_or(|l| f64::from(self.batch_in_flight) < l.floor().max(1.0))
    }

    /// The limit now, for the views (`None`: none).
    pub(super) fn limit(&self) -> Option<f64> {
        self.limit
    }
}

impl Scheduler {
    /// The gateway saw request `id`'s response from `backend` start `ttft`
    /// after its dispatch: the backend's moving average (routing without a
    /// fresh reading) and, for a live request still in flight there, the
    /// batch lane's loop.
    pub fn on_ttft(&mut self, now: Instant, id: RequestId, backend: BackendId, ttft: Duration) {
        self.observe_ttft(backend, ttft);
        let Some(req) = self.requests.get(id) else {
            return;
        };
        let Phase::InFlight { beside, .. } = req.phase else {
            return;
        };
        if !req.batch && self.batch_latency_target > 0.0 {
            let b = &mut self.backends[backend.0 as usize];
            let window = b.window;
            b.lane
                .live_ttft(now, ttft, beside, self.batch_latency_target, window);
        }
    }

    /// Keeps of `cands` the backends the batch lane's loop leaves room
    /// for now, when request `id` is a batch item (all of them else, or
    /// with `batch_latency_target` 0).
    pub(super) fn retain_lane_room(
        &mut self,
        now: Instant,
        id: RequestId,
        cands: &mut Vec<Candidate>,
    ) {
        if self.batch_latency_target <= 0.0 || !self.requests.get(id).is_some_and(|r| r.batch) {
            return;
        }
        cands.retain(|c| {
            self.backends
                .get_mut(c.id.0 as usize)
                .is_none_or(|b| b.lane.has_room(now))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    #[test]
    fn the_limit_halves_past_the_target_and_grows_back_within_it() {
        let mut l = LaneLimit::default();
        let ms = Duration::from_millis;
        // The baseline, alone: 100 ms.
        l.live_ttft(t(0), ms(100), false, 1.2, 16);
        assert!(l.has_room(t(1)));
        // Eight items run; live requests beside them take 200 ms.
        l.batch_in_flight = 8;
        let mut at = 10;
        while l.limit().is_none_or(|x| x >= 8.0) {
            l.live_ttft(t(at), ms(200), true, 1.2, 16);
            at += 10;
        }
        assert_eq!(l.limit(), Some(4.0), "halved from the items in flight");
        assert!(!l.has_room(t(at)), "8 in flight, 4 allowed");
        // Not cut again before CUT_EVERY.
        l.live_ttft(t(at + 10), ms(200), true, 1.2, 16);
        assert_eq!(l.limit(), Some(4.0));
        l.live_ttft(t(at + 600), ms(200), true, 1.2, 16);
        assert_eq!(l.limit(), Some(2.0));
        // Live latency back within the target: it grows a quarter a request.
        for i in 0..40 {
            l.live_ttft(t(at + 700 + i), ms(100), true, 1.2, 16);
        }
        assert!(l.limit().unwrap() > 2.0, "{:?}", l.limit());
        // Live traffic quiet: every slot.
        assert!(l.has_room(t(at + 700 + 40 + QUIET.as_millis() as u64)));
        assert_eq!(l.limit(), None);
    }

    #[test]
    fn without_a_baseline_alone_nothing_is_limited() {
        let mut l = LaneLimit {
            batch_in_flight: 8,
            ..LaneLimit::default()
        };
        for i in 0..50 {
            l.live_ttft(t(i * 600), Duration::from_secs(1), true, 1.2, 16);
        }
        assert_eq!(l.limit(), None);
        assert!(l.has_room(t(30_001)));
    }
}
