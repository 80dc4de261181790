//! Outlier ejection from what the proxy sees: a backend that answers 5xx,
//! refuses connections or times out several requests in a row gets no new
//! requests for a while, even while its health probe still answers 200.
//! Envoy's outlier detection is the model: consecutive failures, an
//! ejection that grows each time, and a cap on the share of a pool that
//! may be ejected at once.

use crate::core::ids::BackendId;
use crate::core::time::Instant;

use super::{Decision, Scheduler};

/// A backend ejected by [`Scheduler::on_backend_result`], for the caller
/// to log and count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ejection {
    pub backend: BackendId,
    pub until: Instant,
    /// How many times it has been ejected, this one included.
    pub count: u32,
}

impl Scheduler {
    /// The outcome of one request on `backend`: `ok` is false for a 5xx
    /// answer, a failed connection or a header timeout. Returns the
    /// ejection this failure caused, if any.
    pub fn on_backend_result(
        &mut self,
        now: Instant,
        backend: BackendId,
        ok: bool,
    ) -> Option<Ejection> {
        let b = self.backends.get_mut(backend.0 as usize)?;
        if ok {
            b.failures = 0;
            return None;
        }
        b.failures = b.failures.saturating_add(1);
        let pool = &self.pools[b.pool.0 as usize];
        let spec = &pool.outlier;
        if spec.consecutive_failures == 0
            || b.failures < spec.consecutive_failures
            || !b.is_available(now)
        {
            return None;
        }
        // The cap: at most this share of the pool ejected, and never the
        // last backend still available.
        let members = &pool.backends;
        let ejected = members
            .iter()
            .filter(|m| {
                self.backends[m.0 as usize]
                    .ejected_until
                    .is_some_and(|t| t > now)
            })
            .count();
        let available = members
            .iter()
            .filter(|m| self.backends[m.0 as usize].is_available(now))
            .count();
        let cap = ((members.len() as f64) * spec.max_ejected_share).floor() as usize;
        if ejected + 1 > cap.max(1) || available <= 1 {
            return None;
        }
        let b = &mut self.backends[backend.0 as usize];
        b.ejections = b.ejections.saturating_add(1);
        let time = spec
            .ejection_time
            .saturating_mul(b.ejections)
            .min(spec.max_ejection_time);
        let until = now + time;
        b.ejected_until = Some(until);
        b.failures = 0;
        self.outlier_check = Some(self.outlier_check.map_or(until, |t| t.min(until)));
        Some(Ejection {
            backend,
            until,
            count: b.ejections,
        })
    }

    /// Ends the ejections due by `now` and dispatches onto the backends
    /// that return; sets the next check.
    pub(super) fn end_ejections(&mut self, now: Instant, out: &mut Vec<Decision>) {
        let mut next: Option<Instant> = None;
        let mut returned = Vec::new();
        for b in &mut self.backends {
            match b.ejected_until {
                Some(t) if t <= now => {
                    b.ejected_until = None;
                    returned.push(b.pool);
                }
                Some(t) => next = Some(next.map_or(t, |n| n.min(t))),
                None => {}
            }
        }
        self.outlier_check = next;
        returned.sort_unstable_by_key(|p| p.0);
        returned.dedup();
        for pool in returned {
            self.try_dispatch(now, pool, out);
        }
    }

    /// Whether outlier detection has `backend` ejected at `now`.
    pub fn is_ejected(&self, now: Instant, backend: BackendId) -> bool {
        self.backends
            .get(backend.0 as usize)
            .and_then(|b| b.ejected_until)
            .is_some_and(|t| t > now)
    }
}
