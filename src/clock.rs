//! The one place that reads the wall clock: maps `std::time::Instant` onto
//! the core's [`Instant`].

use crate::core::time::Instant;

/// A monotonic clock whose origin is the moment it was created.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: std::time::Instant,
}

impl Clock {
    /// A clock starting now.
    #[allow(clippy::disallowed_methods)]
    pub fn new() -> Self {
        Clock {
            origin: std::time::Instant::now(),
        }
    }

    /// The current time on this clock.
    #[allow(clippy::disallowed_methods)]
    pub fn now(&self) -> Instant {
        let nanos = std::time::Instant::now()
            .duration_since(self.origin)
            .as_nanos();
        Instant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// The wall-clock instant corresponding to `t` on this clock.
    pub fn to_std(&self, t: Instant) -> std::time::Instant {
        self.origin + std::time::Duration::from_nanos(t.as_nanos())
    }
}

/// Seconds since the Unix epoch, for the admin views.
pub fn unix_seconds() -> u64 {
    unix_time().as_secs()
}

/// Seconds since the Unix epoch, with a fraction (usage windows).
pub fn unix_seconds_f64() -> f64 {
    unix_time().as_secs_f64()
}

/// The time since the Unix epoch (zero before it).
#[allow(clippy::disallowed_methods)]
pub fn unix_time() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
