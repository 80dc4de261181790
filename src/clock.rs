//! The one place that reads the wall clock: maps `std::time::Instant` onto
//! the core's [`Instant`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

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
        self.origin + Duration::from_nanos(t.as_nanos())
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
pub fn unix_time() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// A log line that is written at most once per interval, however often
/// its event happens; the next line says how many were left out. Every
/// line a remote party (a client, a backend, an engine's event feed) can
/// make the gateway write at will goes through one, so that it cannot
/// flood the log.
pub struct Throttled {
    every: Duration,
    next: Mutex<Option<tokio::time::Instant>>,
    left_out: AtomicU64,
}

/// How often a line that a remote party can cause is written at most,
/// unless a site says otherwise.
pub const REMOTE_LOG_EVERY: Duration = Duration::from_secs(10);

impl Throttled {
    pub const fn new(every: Duration) -> Self {
        Throttled {
            every,
            next: Mutex::new(None),
            left_out: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when a line may be written now (`n` events were left out
    /// since the last one), `None` when this one is left out.
    pub fn allow(&self) -> Option<u64> {
        let now = tokio::time::Instant::now();
        let mut next = self.next.lock();
        if next.is_some_and(|t| now < t) {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *next = Some(now + self.every);
        Some(self.left_out.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn throttled_logs_once_per_interval_and_counts_the_rest() {
        let t = Throttled::new(Duration::from_secs(60));
        assert_eq!(t.allow(), Some(0));
        assert_eq!(t.allow(), None);
        assert_eq!(t.allow(), None);
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(t.allow(), Some(2));
        assert_eq!(t.allow(), None);
    }
}
