//! A token bucket over the core's clock that may run into debt.
//!
//! Used twice per tenant: requests (capacity `burst`, refill `rate`/s) and
//! GPU-seconds (capacity and hourly refill `gpu_seconds_per_hour`). The
//! GPU-seconds bucket takes an estimate at admission and is settled to the
//! measured value when the response ends; a costly response can leave it
//! negative, and it refuses until refilled. `governor` cannot carry debt nor
//! take an injected clock without a custom trait object, so this is ours.

use std::time::Duration;

use crate::core::time::Instant;

/// A refilling bucket. Invariant: `level <= capacity` at all times.
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    capacity: f64,
    /// Refill per second.
    rate: f64,
    /// The refill a refusal's wait is estimated from: `rate`, or for a
    /// leased bucket (no refill of its own) the cluster's.
    expected_rate: f64,
    level: f64,
    updated: Instant,
}

impl Bucket {
    /// A full bucket holding `capacity`, refilling at `rate` per second.
    pub fn new(capacity: f64, rate: f64, now: Instant) -> Self {
        let capacity = capacity.max(f64::MIN_POSITIVE);
        Bucket {
            capacity,
            rate: rate.max(0.0),
            expected_rate: rate.max(0.0),
            level: capacity,
            updated: now,
        }
    }

    /// An empty bucket with no refill of its own, filled by the leases a
    /// cluster store grants ([`Bucket::deposit`]); a refusal's wait is
    /// estimated from the cluster's refill, `expected_rate`.
    pub fn leased(capacity: f64, expected_rate: f64, now: Instant) -> Self {
        let mut b = Bucket::new(capacity, 0.0, now);
        b.level = 0.0;
        b.expected_rate = expected_rate.max(0.0);
        b
    }

    /// Changes capacity and rate, keeping the level (clamped) — a reload.
    pub fn reconfigure(&mut self, now: Instant, capacity: f64, rate: f64) {
        self.refill(now);
        self.capacity = capacity.max(f64::MIN_POSITIVE);
        self.rate = rate.max(0.0);
        self.expected_rate = self.rate;
        self.level = self.level.min(self.capacity);
    }

    /// Makes this a leased bucket (see [`Bucket::leased`]), keeping its
    /// level, which the replica then holds as its lease.
    pub fn reconfigure_leased(&mut self, now: Instant, capacity: f64, expected_rate: f64) {
        self.reconfigure(now, capacity, 0.0);
        self.expected_rate = expected_rate.max(0.0);
    }

    /// Adds a grant (negative: takes back); never overfills.
    pub fn deposit(&mut self, amount: f64) {
        self.level = (self.level + amount).min(self.capacity);
    }

    fn refill(&mut self, now: Instant) {
        if now > self.updated {
            let dt = (now - self.updated).as_secs_f64();
            self.level = (self.level + dt * self.rate).min(self.capacity);
            self.updated = now;
        }
    }

    /// Refills for the time since the last call, then checks whether `cost`
    /// could be taken now; on refusal, how long until it could.
    pub fn check(&mut self, now: Instant, cost: f64) -> Result<(), Duration> {
        self.refill(now);
        // A cost above capacity could never be taken; ask for a full bucket.
        let need = cost.min(self.capacity);
        if self.level >= need {
            Ok(())
        } else {
            Err(self.time_to(need))
        }
    }

    /// Takes `cost` unconditionally (after a successful `check`).
    pub fn take(&mut self, cost: f64) {
        self.level -= cost;
    }

    /// Refills, then takes `cost` if available.
    pub fn try_take(&mut self, now: Instant, cost: f64) -> Result<(), Duration> {
        self.check(now, cost)?;
        self.take(cost);
        Ok(())
    }

    /// Returns `reserved − actual` to the bucket: positive gives back, negative
    /// charges more (possibly into debt). Never overfills.
    pub fn settle(&mut self, now: Instant, reserved: f64, actual: f64) {
        self.refill(now);
        self.level = (self.level + reserved - actual).min(self.capacity);
    }

    /// Current level after refilling (negative while in debt).
    pub fn level(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.level
    }

    /// The level at the last update, without refilling.
    pub fn last_level(&self) -> f64 {
        self.level
    }

    /// The refill a wait is estimated from (the cluster's, when leased).
    pub fn expected_rate(&self) -> f64 {
        self.expected_rate
    }

    /// Capacity of the bucket.
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// Time until the bucket is full again.
    pub fn time_to_full(&self) -> Duration {
        self.time_to(self.capacity)
    }

    fn time_to(&self, level: f64) -> Duration {
        let missing = level - self.level;
        if missing <= 0.0 {
            Duration::ZERO
        } else if self.expected_rate <= 0.0 {
            Duration::from_secs(3600)
        } else {
            // Round up to the next nanosecond, so that waiting exactly this
            // long is always enough despite rounding.
            let nanos = ((missing / self.expected_rate) * 1e9).min(1e18).ceil() as u64;
            Duration::from_nanos(nanos)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(ms: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(ms)
    }

    #[test]
    fn refills_at_the_stated_rate() {
        let mut b = Bucket::new(10.0, 5.0, t(0));
        for _ in 0..10 {
            assert!(b.try_take(t(0), 1.0).is_ok());
        }
        let wait = b.try_take(t(0), 1.0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(200));
        assert!(b.try_take(t(199), 1.0).is_err());
        assert!(b.try_take(t(200), 1.0).is_ok());
        assert!((b.level(t(2200)) - 10.0).abs() < 1e-9, "capped at capacity");
    }

    #[test]
    fn debt_refuses_until_repaid() {
        let mut b = Bucket::new(3600.0, 1.0, t(0));
        b.try_take(t(0), 10.0).unwrap();
        b.settle(t(0), 10.0, 3700.0); // measured far above the estimate
        assert!(b.level(t(0)) < 0.0);
        let wait = b.check(t(0), 1.0).unwrap_err();
        assert_eq!(wait, Duration::from_secs(101));
        assert!(b.check(t(100_000), 1.0).is_err());
        assert!(b.check(t(101_000), 1.0).is_ok());
    }

    proptest! {
        #[test]
        fn never_exceeds_capacity(cap in 1.0f64..1e4, rate in 0.0f64..1e4,
                                  ops in proptest::collection::vec((0u64..5_000, 0.0f64..100.0, 0.0f64..200.0, any::<bool>()), 1..100)) {
            let mut b = Bucket::new(cap, rate, t(0));
            let mut now = 0;
            for (dt, cost, actual, settle) in ops {
                now += dt;
                if settle {
                    b.settle(t(now), cost, actual);
                } else {
                    let before = b.level(t(now));
                    match b.try_take(t(now), cost) {
                        Ok(()) => prop_assert!(before >= cost.min(cap) - 1e-9),
                        Err(wait) => {
                            prop_assert!(before < cost.min(cap));
                            // Honouring retry-after makes the take succeed.
                            let later = now + (wait.as_nanos() as u64).div_ceil(1_000_000);
                            prop_assert!(b.check(t(later), cost).is_ok() || rate == 0.0);
                            // The check refilled up to `later`; time moves on.
                            now = later;
                        }
                    }
                }
                prop_assert!(b.level(t(now)) <= cap + 1e-9);
            }
        }
    }
}
