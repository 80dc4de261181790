//! Admission: whether an arrival may enter the queue (see
//! [`crate::core::admission`]). A refusal is a decision (429), not an error.

use crate::core::admission::{LimitKind, Refusal};
use crate::core::spec::OnLate;
use crate::core::time::Instant;

use super::slo::Verdict;
use super::state::TenantState;
use super::{Arrival, Lane, SHED_RETRY_AFTER, Scheduler};

impl Scheduler {
    /// What of a request's GPU-seconds in `lane` its tenant's budget is
    /// charged: a batch item's less the discount.
    pub(super) fn gpu_factor(&self, lane: Lane) -> f64 {
        if lane == Lane::Live {
            1.0
        } else {
            1.0 - self.batch_gpu_discount
        }
    }

    /// The checks on arrival, in order: the tenant's concurrency cap, its
    /// request-rate bucket, its GPU-seconds bucket (for the request's
    /// estimated GPU-seconds), its queue in the pool, and `verdict` (the
    /// SLO prediction) when its tenant refuses late requests (`qcost` is
    /// the request's queue cost). A refused request takes nothing. On
    /// admission takes from the buckets, counts the request as active and
    /// returns the GPU-seconds reserved.
    pub(super) fn admit(
        &mut self,
        now: Instant,
        a: &Arrival,
        output_estimate: u32,
        verdict: Verdict,
        qcost: f64,
    ) -> Result<f64, Refusal> {
        let pool = &self.pools[a.pool.0 as usize];
        let est_gpu = pool.gpu_seconds_per_token
            * f64::from(a.prompt_tokens.saturating_add(output_estimate))
            * self.gpu_factor(a.lane);
        let queued_here = pool.queue.tenant_len(a.tenant) + pool.late.tenant_len(a.tenant);
        let max_queued = self.max_queued_per_tenant;
        let t = &mut self.tenants[a.tenant.0 as usize];

        let refuse = |limit, retry_after, t: &TenantState| Refusal {
            limit,
            retry_after,
            limits: t.rate_limits(),
        };

        t.gpu_asked_total += est_gpu;
        if let Some(l) = &mut t.lease {
            l.last_estimate = est_gpu;
        }
        if t.concurrency_cap().is_some_and(|m| t.active >= m) {
            if let Some(l) = &mut t.lease {
                l.slots_refused = l.slots_refused.saturating_add(1);
            }
            return Err(refuse(LimitKind::Concurrency, SHED_RETRY_AFTER, t));
        }
        if let Some(b) = &mut t.rate
            && let Err(wait) = b.check(now, 1.0)
        {
            return Err(refuse(LimitKind::Rate, wait, t));
        }
        if let Some(g) = &mut t.gpu
            && let Err(wait) = g.check(now, est_gpu)
        {
            return Err(refuse(LimitKind::GpuSeconds, wait, t));
        }
        if queued_here >= max_queued {
            return Err(refuse(LimitKind::QueueFull, SHED_RETRY_AFTER, t));
        }
        if let Verdict::Late { over, .. } = verdict
            && t.on_late == OnLate::Refuse
            && a.lane == Lane::Live
        {
            let retry = self.pools[a.pool.0 as usize].promise_retry(now, a.tenant, over, qcost);
            return Err(refuse(LimitKind::Slo, retry, t));
        }
        if let Some(b) = &mut t.rate {
            b.take(1.0);
        }
        let gpu_reserved = if let Some(g) = &mut t.gpu {
            g.take(est_gpu);
            est_gpu
        } else {
            0.0
        };
        t.active += 1;
        t.gpu_open += gpu_reserved;
        Ok(gpu_reserved)
    }
}
