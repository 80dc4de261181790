//! Routing candidates: the backends of a pool that may take a request now.

use std::time::Duration;

use crate::core::ids::PoolId;
use crate::core::routing::Candidate;
use crate::core::time::Instant;

use super::Scheduler;
use super::state::{BackendState, PoolState};

impl Scheduler {
    /// Fills `scratch` with the pool's backends that may take a request now:
    /// healthy and not ejected, window not full, and with headroom. Headroom comes from a
    /// fresh reading (KV usage below the watermark, TTFT p99 within the
    /// threshold); without one, from the gateway's own observed TTFT, and a
    /// backend with nothing of ours in flight then always has headroom, so
    /// a slow observation is re-measured rather than kept forever.
    pub(super) fn collect_candidates(&mut self, now: Instant, pool: PoolId) {
        self.scratch.clear();
        let ps = &self.pools[pool.0 as usize];
        for &bid in &ps.backends {
            let b = &self.backends[bid.0 as usize];
            if b.retired
                || !b.is_available(now)
                || b.in_flight >= b.window
                || !has_headroom(b, ps, now, self.stale_after)
            {
                continue;
            }
            let fresh = b
                .reading
                .as_ref()
                .filter(|r| now.saturating_since(r.at) <= self.stale_after);
            self.scratch.push(Candidate {
                id: bid,
                in_flight: b.in_flight,
                waiting: fresh.and_then(|r| r.waiting).unwrap_or(0),
                window: b.window,
                kv_usage: fresh.and_then(|r| r.kv_usage),
            });
        }
    }
}

/// Whether `b` may take more work by its readings: KV under the pool's
/// watermark and TTFT p99 under its threshold (a fresh reading), or, with
/// none, the gateway's own observed TTFT under the threshold.
pub(super) fn has_headroom(
    b: &BackendState,
    ps: &PoolState,
    now: Instant,
    stale_after: Duration,
) -> bool {
    match b
        .reading
        .as_ref()
        .filter(|r| now.saturating_since(r.at) <= stale_after)
    {
        Some(r) => {
            !(r.kv_usage.is_some_and(|k| k >= ps.kv_high_watermark)
                || r.ttft_p99.is_some_and(|t| t > ps.ttft_p99_threshold))
        }
        None => !(b.in_flight > 0 && b.observed_ttft.is_some_and(|t| t > ps.ttft_p99_threshold)),
    }
}
