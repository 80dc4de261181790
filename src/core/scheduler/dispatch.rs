//! Moving requests between the queue and the backends: dispatch from the
//! queue, requeue, shedding, and undoing what a dispatch counted.

use crate::core::ids::{BackendId, PoolId, RequestId, TenantId};
use crate::core::queue::cost::{Work, cost};
use crate::core::routing::pick;
use crate::core::time::Instant;

use super::state::{Phase, Req, is_queued, pool_capacity};
use super::{Decision, SHED_RETRY_AFTER, Scheduler};

impl Scheduler {
    /// Dispatches from the pool's queue while some backend has room.
    pub(super) fn try_dispatch(&mut self, now: Instant, pool: PoolId, out: &mut Vec<Decision>) {
        let p = pool.0 as usize;
        if self.pools[p].retired {
            return;
        }
        while !self.pools[p].queue.is_empty() {
            self.collect_candidates(now, pool);
            let ps = &mut self.pools[p];
            let Some(i) = pick(ps.strategy, &self.scratch, &mut self.rng, &mut ps.rr_cursor) else {
                if self.preempt_for_head(now, pool, out) {
                    continue;
                }
                return;
            };
            let backend = self.scratch[i].id;
            let requests = &self.requests;
            let Some((tenant, id)) = ps.queue.pop(|r| is_queued(requests, r)) else {
                return;
            };
            self.dispatch(now, pool, tenant, id, backend, out);
        }
    }

    /// Sends queued request `id` of `tenant`, just popped from `pool`'s
    /// queue, to `backend`.
    pub(super) fn dispatch(
        &mut self,
        now: Instant,
        pool: PoolId,
        tenant: TenantId,
        id: RequestId,
        backend: BackendId,
        out: &mut Vec<Decision>,
    ) {
        let p = pool.0 as usize;
        let capacity = pool_capacity(&self.backends, &self.pools[p]);
        let Some(req) = self.requests.get_mut(id) else {
            return;
        };
        let class = super::cost_model::class(self.backends[backend.0 as usize].in_flight + 1);
        let pool_state = &self.pools[p];
        let per_token = pool_state
            .gpu_cost
            .per_token(class, pool_state.gpu_seconds_per_token);
        let estimate = Work {
            prompt_tokens: f64::from(req.prompt_tokens),
            output_tokens: f64::from(req.output_estimate),
            gpu_seconds: per_token
                * f64::from(req.prompt_tokens.saturating_add(req.output_estimate)),
        };
        let charged = cost(
            self.discipline,
            estimate,
            capacity,
            self.output_token_weight,
        );
        self.pools[p].queue.charge_estimate(tenant, charged);
        let b = &mut self.backends[backend.0 as usize];
        b.in_flight += 1;
        let mark = b.clock.start(now);
        self.deadlines.remove(&(req.deadline, id));
        req.phase = Phase::InFlight {
            backend,
            mark,
            dispatched: now,
            charged,
            class,
        };
        self.tenants[tenant.0 as usize].in_flight += 1;
        let preemptible = self.may_preempt(tenant);
        let ps = &mut self.pools[p];
        ps.add_in_flight(tenant);
        if preemptible {
            ps.preemptible.insert((now, id));
        }
        out.push(Decision::Dispatch { id, backend });
    }

    /// Takes in-flight request `id` off its backend and puts it back at the
    /// front of its tenant's queue, with its dispatch charge refunded.
    pub(super) fn requeue(
        &mut self,
        now: Instant,
        id: RequestId,
        deadline: Instant,
    ) -> Option<BackendId> {
        let req = self.requests.get_mut(id)?;
        let phase = req.phase;
        let Phase::InFlight {
            backend, charged, ..
        } = phase
        else {
            return None;
        };
        let (tenant, pool) = (req.tenant, req.pool);
        req.phase = Phase::Queued;
        req.deadline = deadline;
        self.leave_backend(now, id, tenant, pool, phase);
        self.deadlines.insert((deadline, id));
        let p = &mut self.pools[pool.0 as usize];
        p.queue.settle(tenant, charged, Some(0.0));
        p.queue.push_front(tenant, id);
        Some(backend)
    }

    /// Undoes what `dispatch` counted for request `id` in `phase` (in
    /// flight): its backend's slot and GPU clock, its tenant's and pool's
    /// in-flight counts, its place among the preemptible. Returns the
    /// GPU-seconds it had on its backend.
    pub(super) fn leave_backend(
        &mut self,
        now: Instant,
        id: RequestId,
        tenant: TenantId,
        pool: PoolId,
        phase: Phase,
    ) -> f64 {
        let Phase::InFlight {
            backend,
            mark,
            dispatched,
            ..
        } = phase
        else {
            return 0.0;
        };
        let b = &mut self.backends[backend.0 as usize];
        let gpu_seconds = b.clock.finish(now, mark);
        b.in_flight = b.in_flight.saturating_sub(1);
        let t = &mut self.tenants[tenant.0 as usize];
        t.in_flight = t.in_flight.saturating_sub(1);
        let p = &mut self.pools[pool.0 as usize];
        if let Some(n) = p.in_flight.get_mut(tenant.0 as usize) {
            *n = n.saturating_sub(1);
        }
        p.preemptible.remove(&(dispatched, id));
        gpu_seconds
    }

    pub(super) fn remove_queued(&mut self, now: Instant, id: RequestId) -> Option<Req> {
        let req = self.requests.remove(id)?;
        self.deadlines.remove(&(req.deadline, id));
        let requests = &self.requests;
        self.pools[req.pool.0 as usize]
            .queue
            .forget(req.tenant, |r| is_queued(requests, r));
        let t = &mut self.tenants[req.tenant.0 as usize];
        t.active = t.active.saturating_sub(1);
        t.gpu_open = (t.gpu_open - req.gpu_reserved).max(0.0);
        if let Some(g) = &mut t.gpu {
            g.settle(now, req.gpu_reserved, 0.0);
        }
        Some(req)
    }

    pub(super) fn shed(&mut self, now: Instant, id: RequestId, out: &mut Vec<Decision>) {
        if self
            .requests
            .get(id)
            .is_some_and(|r| r.phase == Phase::Queued)
        {
            self.remove_queued(now, id);
            out.push(Decision::Shed {
                id,
                retry_after: SHED_RETRY_AFTER,
            });
        } else {
            // Not queued any more: drop a leftover deadline entry.
            self.deadlines.retain(|(_, r)| *r != id);
        }
    }
}
