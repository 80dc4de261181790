//! Routing candidates: the backends of a pool that may take a request now.

use std::time::Duration;

use crate::core::ids::PoolId;
use crate::core::routing::Candidate;
use crate::core::spec::Strategy;
use crate::core::time::Instant;

use super::Scheduler;
use super::state::{BackendState, PoolState};

impl Scheduler {
    /// Fills `scratch` with the pool's backends that may take a request now:
    /// healthy and not ejected, window not full, and with headroom (none
    /// while the pool holds its apportioned slots in a cluster). Headroom comes from a
    /// fresh reading (KV usage below the watermark, TTFT p99 within the
    /// threshold); without one, from the gateway's own observed TTFT, and a
    /// backend with nothing of ours in flight then always has headroom, so
    /// a slow observation is re-measured rather than kept forever.
    ///
    /// The latency gate never starves the pool: when every backend with
    /// room fails it alone (a slow prefill, a long prompt, all of them
    /// loaded alike), they all stay candidates and the strategy picks
    /// among them by load, as if the gate were off.
    ///
    /// In a pool routing on prefixes a backend that fails the KV gate
    /// alone goes to `kv_gated` (`Candidate::kv_full`): it may still take
    /// a request as its prefix's home.
    pub(super) fn collect_candidates(&mut self, now: Instant, pool: PoolId) {
        self.scratch.clear();
        self.kv_gated.clear();
        let ps = &self.pools[pool.0 as usize];
        if ps.slots_left() == 0 {
            return;
        }
        let mut slow = 0;
        for &bid in &ps.backends {
            let b = &self.backends[bid.0 as usize];
            if b.retired || !b.is_available(now) || b.in_flight >= b.window {
                continue;
            }
            let headroom = headroom(b, ps, now, self.stale_after);
            let homes_only = !headroom.kv;
            if homes_only && !(headroom.latency && ps.strategy == Strategy::PrefixAware) {
                continue;
            }
            let fresh = b
                .reading
                .as_ref()
                .filter(|r| now.saturating_since(r.at) <= self.stale_after);
            let c = Candidate {
                id: bid,
                in_flight: b.in_flight,
                waiting: fresh.and_then(|r| r.waiting).unwrap_or(0),
                window: b.window,
                window_share: b.window_share,
                kv_usage: fresh.and_then(|r| r.kv_usage),
                cached_tokens: 0,
                events: b.prefix_events,
                home_tokens: 0,
                homed: 0.0,
                need: 0.0,
                kv_full: homes_only,
            };
            if homes_only {
                self.kv_gated.push(c);
            } else if headroom.latency {
                // Ahead of the slow ones, which are dropped below if any
                // backend passes.
                self.scratch.insert(self.scratch.len() - slow, c);
            } else {
                self.scratch.push(c);
                slow += 1;
            }
        }
        if slow < self.scratch.len() {
            self.scratch.truncate(self.scratch.len() - slow);
        }
    }
}

/// What a backend's readings say of its room for more work.
pub(super) struct Headroom {
    /// KV usage under the pool's watermark (or unknown).
    pub(super) kv: bool,
    /// TTFT p99 within the pool's threshold (or unknown).
    pub(super) latency: bool,
}

impl Headroom {
    pub(super) fn both(&self) -> bool {
        self.kv && self.latency
    }
}

/// Whether `b` may take more work by its readings: KV under the pool's
/// watermark and TTFT p99 under its threshold (a fresh reading), or, with
/// none, the gateway's own observed TTFT under the threshold.
pub(super) fn headroom(
    b: &BackendState,
    ps: &PoolState,
    now: Instant,
    stale_after: Duration,
) -> Headroom {
    match b
        .reading
        .as_ref()
        .filter(|r| now.saturating_since(r.at) <= stale_after)
    {
        Some(r) => Headroom {
            kv: r.kv_usage.is_none_or(|k| k < ps.kv_high_watermark),
            latency: r.ttft_p99.is_none_or(|t| t <= ps.ttft_p99_threshold),
        },
        None => Headroom {
            kv: true,
            latency: !(b.in_flight > 0
                && b.observed_ttft.is_some_and(|t| t > ps.ttft_p99_threshold)),
        },
    }
}
