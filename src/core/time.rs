//! Time inside the sans-IO core: nanoseconds on a clock the caller owns.
//!
//! The live proxy maps `std::time::Instant` onto this clock (see
//! `crate::clock`); the replay simulator advances it by hand. Nothing in
//! `core` or `sim::engine` ever reads a real clock.

use std::ops::{Add, Sub};
use std::time::Duration;

/// A point in time: nanoseconds since an origin the caller chose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// The origin of the clock.
    pub const ZERO: Instant = Instant(0);

    /// An instant `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// An instant `secs` seconds after the origin (saturating at zero).
    pub fn from_secs_f64(secs: f64) -> Self {
        Instant((secs.max(0.0) * 1e9) as u64)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Seconds since the origin.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_since(earlier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_nanos(5);
        assert_eq!(Instant::ZERO - t, Duration::ZERO);
        assert_eq!((t + Duration::from_nanos(3)).as_nanos(), 8);
        assert_eq!((t + Duration::MAX).as_nanos(), u64::MAX);
    }
}
