//! Outlier ejection from what the proxy sees: a backend that answers 5xx,
//! refuses connections or times out several requests in a row, or whose
//! success rate falls far below the rest of its pool's, gets no new
//! requests for a while, even while its health probe still answers 200.
//! Envoy's outlier detection is the model: consecutive failures, success
//! rate, an ejection that grows each time, and a cap on the share of a
//! pool that may be ejected at once.

use crate::core::ids::{BackendId, PoolId};
use crate::core::time::Instant;

use super::{Decision, Scheduler};

/// A backend ejected by [`Scheduler::on_backend_result`], for the caller
/// to log and count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ejection {
    pub backend: BackendId,
    pub until: Instant,
    /// How many times it has been ejected, this one included.
    pub count: u32,
    pub reason: EjectReason,
}

/// Why a backend was ejected.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EjectReason {
    /// Its last requests failed in a row.
    ConsecutiveFailures(u32),
    /// Its success rate over the interval, against the rest of its pool's.
    SuccessRate { rate: f64, rest: f64 },
}

impl Scheduler {
    /// The outcome of one request on `backend`: `ok` is false for a 5xx
    /// answer, a failed connection, a header timeout or a stream the
    /// backend cut. Returns the ejection it caused, if any: of `backend`
    /// after failures in a row, or of the pool's worst backend when a
    /// success-rate interval ends.
    pub fn on_backend_result(
        &mut self,
        now: Instant,
        backend: BackendId,
        ok: bool,
    ) -> Option<Ejection> {
        let b = self.backends.get_mut(backend.0 as usize)?;
        let pool = b.pool;
        if ok {
            b.failures = 0;
            b.window_ok = b.window_ok.saturating_add(1);
        } else {
            b.failures = b.failures.saturating_add(1);
            b.window_failed = b.window_failed.saturating_add(1);
        }
        let failures = b.failures;
        let spec = &self.pools[pool.0 as usize].outlier;
        if !ok && spec.consecutive_failures > 0 && failures >= spec.consecutive_failures {
            let reason = EjectReason::ConsecutiveFailures(failures);
            if let Some(e) = self.eject(now, backend, reason) {
                return Some(e);
            }
        }
        self.success_rate_check(now, pool)
    }

    /// At the end of a pool's success-rate interval: the backend whose rate
    /// is lowest, if it is more than the gap below the rest of the pool's.
    /// Starts the next interval.
    fn success_rate_check(&mut self, now: Instant, pool: PoolId) -> Option<Ejection> {
        let p = &mut self.pools[pool.0 as usize];
        let spec = &p.outlier;
        let start = *p.rate_window_start.get_or_insert(now);
        if spec.success_rate_gap <= 0.0 || now.saturating_since(start) < spec.success_rate_interval
        {
            return None;
        }
        p.rate_window_start = Some(now);
        let (gap, min) = (spec.success_rate_gap, spec.success_rate_min_requests);
        let counts: Vec<(BackendId, u32, u32)> = p
            .backends
            .iter()
            .map(|&id| {
                let b = &mut self.backends[id.0 as usize];
                let c = (id, b.window_ok, b.window_failed);
                (b.window_ok, b.window_failed) = (0, 0);
                c
            })
            .collect();
        let (all_ok, all) = counts
            .iter()
            .fold((0u64, 0u64), |(o, n), &(_, ok, failed)| {
                (o + u64::from(ok), n + u64::from(ok) + u64::from(failed))
            });
        let worst = counts
            .iter()
            .filter_map(|&(id, ok, failed)| {
                let n = u64::from(ok) + u64::from(failed);
                let (rest_ok, rest_n) = (all_ok - u64::from(ok), all - n);
                if n < u64::from(min) || rest_n < u64::from(min) {
                    return None;
                }
                let rate = ok as f64 / n as f64;
                let rest = rest_ok as f64 / rest_n as f64;
                (rate < rest - gap).then_some((id, rate, rest))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        let (id, rate, rest) = worst;
        self.eject(now, id, EjectReason::SuccessRate { rate, rest })
    }

    /// Ejects `backend` unless the cap forbids it: at most the pool's
    /// `max_ejected_share` ejected at once, never its last available one.
    fn eject(&mut self, now: Instant, backend: BackendId, reason: EjectReason) -> Option<Ejection> {
        let b = &self.backends[backend.0 as usize];
        if !b.is_available(now) {
            return None;
        }
        let pool = &self.pools[b.pool.0 as usize];
        let spec = &pool.outlier;
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
        let time = spec.ejection_time;
        let max = spec.max_ejection_time;
        let b = &mut self.backends[backend.0 as usize];
        b.ejections = b.ejections.saturating_add(1);
        let until = now + time.saturating_mul(b.ejections).min(max);
        b.ejected_until = Some(until);
        b.failures = 0;
        self.outlier_check = Some(self.outlier_check.map_or(until, |t| t.min(until)));
        Some(Ejection {
            backend,
            until,
            count: b.ejections,
            reason,
        })
    }

    /// Ends the ejections due by `now` and dispatches onto the backends
    /// that return; sets the next check.
    pub(super) fn end_ejections(&mut self, now: Instant, out: &mut Vec<Decision>) {
        let mut next: Option<Instant> = None;
        let mut returned = Vec::new();
        for (i, b) in self.backends.iter_mut().enumerate() {
            match b.ejected_until {
                Some(t) if t <= now => {
                    b.ejected_until = None;
                    returned.push(b.pool);
                    self.ejections_ended.push(BackendId(i as u32));
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

    /// The backends whose outlier ejection ended since the last call, for
    /// the caller to log.
    pub fn take_ejections_ended(&mut self) -> Vec<BackendId> {
        std::mem::take(&mut self.ejections_ended)
    }

    /// Whether outlier detection has `backend` ejected at `now`.
    pub fn is_ejected(&self, now: Instant, backend: BackendId) -> bool {
        self.backends
            .get(backend.0 as usize)
            .and_then(|b| b.ejected_until)
            .is_some_and(|t| t > now)
    }
}
