//! GPU-seconds attribution: a per-backend cumulative clock.
//!
//! While `n` requests are in flight on a backend with `g` GPUs, each accrues
//! `g / n` GPU-seconds per second. The clock `V(t)` integrates `dV/dt = g/n`
//! and is updated at every start and finish, so a request's GPU-seconds is
//! `V(end) − V(start)`: O(1) per event, exact for piecewise-constant `n`.

use crate::core::time::Instant;

/// The cumulative per-request GPU-seconds clock of one backend.
#[derive(Clone, Debug)]
pub struct GpuClock {
    gpus: f64,
    in_flight: u32,
    value: f64,
    updated: Instant,
    /// GPU-seconds during which at least one request was in flight.
    busy: f64,
}

impl GpuClock {
    /// A clock for a backend with `gpus` GPUs, starting at zero at `now`.
    pub fn new(gpus: u32, now: Instant) -> Self {
        GpuClock {
            gpus: f64::from(gpus.max(1)),
            in_flight: 0,
            value: 0.0,
            updated: now,
            busy: 0.0,
        }
    }

    /// Changes the GPU count from `now` on (a reload).
    pub fn set_gpus(&mut self, now: Instant, gpus: u32) {
        self.advance(now);
        self.gpus = f64::from(gpus.max(1));
    }

    fn advance(&mut self, now: Instant) {
        if now > self.updated {
            let dt = (now - self.updated).as_secs_f64();
            if self.in_flight > 0 {
                self.value += self.gpus * dt / f64::from(self.in_flight);
                self.busy += self.gpus * dt;
            }
            self.updated = now;
        }
    }

    /// A request starts: returns its start mark `V(now)`.
    pub fn start(&mut self, now: Instant) -> f64 {
        self.advance(now);
        self.in_flight += 1;
        self.value
    }

    /// A request that started at mark `start` ends: returns its GPU-seconds.
    pub fn finish(&mut self, now: Instant, start: f64) -> f64 {
        self.advance(now);
        self.in_flight = self.in_flight.saturating_sub(1);
        (self.value - start).max(0.0)
    }

    /// Requests in flight on this clock.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Total busy GPU-seconds up to the last event (for utilisation).
    pub fn busy_gpu_seconds(&mut self, now: Instant) -> f64 {
        self.advance(now);
        self.busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn t(ms: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(ms)
    }

    #[test]
    fn overlapping_requests_share_the_gpus() {
        let mut c = GpuClock::new(2, t(0));
        let a = c.start(t(0));
        let b = c.start(t(1000)); // a alone for 1 s: 2 GPU-s
        let ga = c.finish(t(2000), a); // both for 1 s: 1 GPU-s each
        let gb = c.finish(t(3000), b); // b alone for 1 s: 2 GPU-s
        assert!((ga - 3.0).abs() < 1e-9, "{ga}");
        assert!((gb - 3.0).abs() < 1e-9, "{gb}");
        assert!((c.busy_gpu_seconds(t(3000)) - 6.0).abs() < 1e-9);
    }

    #[test]
    fn idle_time_accrues_nothing() {
        let mut c = GpuClock::new(1, t(0));
        let a = c.start(t(5000));
        assert!((c.finish(t(6000), a) - 1.0).abs() < 1e-9);
    }
}
