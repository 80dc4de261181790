//! Preemption: queued interactive work takes the slot of young in-flight
//! batch work (see the scheduler's module docs).

use crate::core::ids::{BackendId, PoolId, RequestId, TenantId};
use crate::core::spec::Priority;
use crate::core::time::Instant;

use super::candidates::headroom;
use super::state::{Phase, is_queued};
use super::{Decision, Lane, Scheduler};

impl Scheduler {
    /// Whether `tenant`'s requests may be preempted while in flight (a
    /// batch tenant, with preemption on).
    pub fn may_preempt(&self, tenant: TenantId) -> bool {
        self.may_preempt_in(tenant, Lane::Live)
    }

    /// Whether a request of `tenant` in `lane` may be preempted while in
    /// flight: a batch tenant's, or any batch item, with preemption on.
    pub fn may_preempt_in(&self, tenant: TenantId, lane: Lane) -> bool {
        self.preemption.enabled
            && (lane.is_batch()
                || self
                    .tenants
                    .get(tenant.0 as usize)
                    .is_some_and(|t| t.priority == Priority::Batch))
    }

    /// Frees a slot for the head of `pool`'s queue by preempting one young
    /// batch request (see the module docs), and dispatches the head there.
    /// Only a request whose backend can take the head once the slot is
    /// free is a victim. The head is popped by tenant: the victim's refund
    /// may put its tenant first in discipline order.
    pub(super) fn preempt_for_head(
        &mut self,
        now: Instant,
        pool: PoolId,
        out: &mut Vec<Decision>,
    ) -> bool {
        let ps = &self.pools[pool.0 as usize];
        if !self.preemption.enabled || ps.preemptible.is_empty() {
            return false;
        }
        let requests = &self.requests;
        let Some((head, head_id)) = ps.queue.peek(|r| is_queued(requests, r)) else {
            return false;
        };
        let h = &self.tenants[head.0 as usize];
        let Some(arrived) = requests.get(head_id).map(|r| r.arrived) else {
            return false;
        };
        if h.priority != Priority::Interactive {
            return false;
        }
        let ripe = arrived + self.preemption.min_wait;
        if now < ripe {
            self.preempt_check = Some(self.preempt_check.map_or(ripe, |t| t.min(ripe)));
            return false;
        }
        let head_share = f64::from(ps.in_flight(head) + 1) / h.weight;
        let victim = self.young_preemptible(now, pool).find(|&id| {
            let Some(r) = self.requests.get(id) else {
                return false;
            };
            let Phase::InFlight { backend, .. } = r.phase else {
                return false;
            };
            let v = &self.tenants[r.tenant.0 as usize];
            let b = &self.backends[backend.0 as usize];
            f64::from(ps.in_flight(r.tenant)) / v.weight > head_share
                && b.is_available(now)
                && !b.retired
                && b.in_flight <= b.window
                && headroom(b, ps, now, self.stale_after).both()
        });
        let Some(backend) = victim.and_then(|id| self.preempt(now, id, out)) else {
            return false;
        };
        let requests = &self.requests;
        if let Some(next) = self.pools[pool.0 as usize]
            .queue
            .pop_from(head, |r| is_queued(requests, r))
        {
            self.dispatch(now, pool, head, next, backend, 0, out);
        }
        true
    }

    /// Preemption across replicas: while interactive work waits for a
    /// slot at another replica, young preemptible work held here above
    /// the pool's `yield_above` slots is preempted, youngest first (see
    /// [`PoolPart`](crate::core::spec::PoolPart)); the slots' new owner is
    /// the cluster's apportionment, not a head here.
    pub(super) fn yield_slots(&mut self, now: Instant, pool: PoolId, out: &mut Vec<Decision>) {
        let ps = &self.pools[pool.0 as usize];
        let Some(keep) = ps.yield_above.filter(|_| self.preemption.enabled) else {
            return;
        };
        let over = ps.in_flight_total().saturating_sub(keep) as usize;
        let victims: Vec<RequestId> = self.young_preemptible(now, pool).take(over).collect();
        for id in victims {
            self.preempt(now, id, out);
        }
    }

    /// `pool`'s in-flight requests that may be preempted now, youngest
    /// first: those of batch tenants and batch items, dispatched less than
    /// the migration threshold ago.
    fn young_preemptible(&self, now: Instant, pool: PoolId) -> impl Iterator<Item = RequestId> {
        let threshold = self.preemption.migration_threshold;
        self.pools[pool.0 as usize]
            .preemptible
            .iter()
            .rev()
            .take_while(move |(dispatched, _)| now.saturating_since(*dispatched) < threshold)
            .map(|&(_, id)| id)
            .filter(|&id| {
                self.requests.get(id).is_some_and(|r| {
                    let v = &self.tenants[r.tenant.0 as usize];
                    (v.priority == Priority::Batch || r.batch) && !v.retired
                })
            })
    }

    /// Preempts in-flight request `id`: queued again at the front of its
    /// tenant's queue, or, a resumable item already answering, ended as a
    /// cancel (its continuation comes back as a new request). Returns the
    /// backend it left.
    fn preempt(
        &mut self,
        now: Instant,
        id: RequestId,
        out: &mut Vec<Decision>,
    ) -> Option<BackendId> {
        let r = self.requests.get(id)?;
        let (tenant, started) = (r.tenant, r.started);
        let backend = if started {
            self.end_in_flight(now, id, None).map(|(e, _)| e.backend)
        } else {
            self.requeue(now, id, now + self.max_wait)
        }?;
        self.tenants[tenant.0 as usize].preempted_total += 1;
        out.push(Decision::Preempt { id, backend });
        Some(backend)
    }
}
