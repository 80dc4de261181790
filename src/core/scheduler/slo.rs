//! SLO-aware admission: when a request will be dispatched, and so whether
//! it can still meet its tenant's TTFT SLO.
//!
//! **The prediction.** A pool's queue drains at a rate the core measures:
//! the queue cost of the requests it dispatched after they had waited,
//! over the time the queue was not empty, both decaying with a half-life
//! of [`DRAIN_HALF_LIFE`](super::drain::DRAIN_HALF_LIFE) ([`DrainRate`]), from the time the pool's slots
//! have turned over once (a cold pool whose slots all filled at once
//! drains in fits until its first requests have ended, which says little
//! of its rate). A request's wait is the queue
//! cost dispatched before it, in the discipline's order, over that rate.
//! Under `drf` and `wfq` (virtual-time fair queueing) that is its tenant's
//! own queue, and from every other backlogged tenant the work that brings
//! that tenant's counter up to the counter this tenant will have when the
//! request reaches the head (its counter plus its queued work over its
//! weight): a tenant inside its weighted share has little queued and a
//! counter no higher than the others', so little is ahead of it, whatever
//! the others send. Under `fifo` everything queued is ahead; under
//! `priority`, everything queued of its class or a higher one. An empty
//! queue predicts no wait; a pool whose queue has not yet been seen to
//! drain predicts nothing, and nothing is refused on a guess.
//!
//! **The budget.** The wait a request can afford is its tenant's TTFT SLO
//! less the pool's time from dispatch to first token (a moving average of
//! what the gateway observed), the latter counted at most half the SLO: a
//! pool whose engines alone take longer than the SLO is a capacity
//! problem, and refusing everything would not fix it. A request still
//! queued when its budget has run out (its *give-up* time) cannot make its
//! SLO.
//!
//! **What happens to a late request** is its tenant's [`OnLate`]: refused
//! on arrival when predicted late (429, `retry-after` = the predicted
//! wait beyond the budget, at least a second, and after the returns
//! promised to the tenant's earlier refusals: [`PoolState::promise_retry`])
//! and shed at its give-up time; only shed at its give-up time; or moved
//! to the pool's *late lane* (on arrival when predicted late, else at its
//! give-up time), which is dispatched only when nothing that can still
//! make its SLO is queued.

use std::time::Duration;

use crate::core::spec::{Discipline, OnLate, Priority};
use crate::core::time::Instant;

use super::state::{Phase, PoolState};
use super::{Scheduler, cost_model};
use crate::core::ids::{BackendId, PoolId, RequestId, TenantId};
use crate::core::queue::cost::{Work, cost};

/// The shortest `retry-after` of an SLO refusal.
const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest: a tenant refused faster than its pool drains (clients that
/// do not wait) is not told to come back in an hour.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// Weight of the newest sample in a pool's dispatch-to-first-token average.
const SERVICE_TTFT_ALPHA: f64 = 0.1;

/// What the prediction says of an arriving request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Verdict {
    /// Its tenant has no SLO-aware admission.
    Unchecked,
    /// It should make its SLO (or nothing is known yet); it cannot once
    /// still queued at `give_up`.
    OnTime { give_up: Instant },
    /// Predicted to wait `over` longer than its budget.
    Late { give_up: Instant, over: Duration },
}

impl Verdict {
    pub(super) fn give_up(self) -> Option<Instant> {
        match self {
            Verdict::Unchecked => None,
            Verdict::OnTime { give_up } | Verdict::Late { give_up, .. } => Some(give_up),
        }
    }
}

impl PoolState {
    /// Folds in a time from dispatch to first token seen on this pool.
    pub(super) fn observe_service_ttft(&mut self, ttft: Duration) {
        self.service_ttft = Some(match self.service_ttft {
            Some(avg) => avg.mul_f64(1.0 - SERVICE_TTFT_ALPHA) + ttft.mul_f64(SERVICE_TTFT_ALPHA),
            None => ttft,
        });
    }

    /// The `retry-after` of an SLO refusal at `now` of a request of
    /// `tenant` predicted `over` its budget, of queue cost `work`: the
    /// predicted wait beyond the budget (at least [`MIN_RETRY_AFTER`]), and
    /// no earlier than the returns already promised to the tenant's earlier
    /// refusals, each of which holds its cost's time at the pool's drain
    /// rate. The refusals of a burst are so told to come back one after
    /// another, as the pool can take them, not all at the same instant to
    /// be refused again.
    pub(super) fn promise_retry(
        &mut self,
        now: Instant,
        t: TenantId,
        over: Duration,
        work: f64,
    ) -> Duration {
        let i = t.0 as usize;
        if self.promised.len() <= i {
            self.promised.resize(i + 1, now);
        }
        let at = (now + over.max(MIN_RETRY_AFTER))
            .max(self.promised[i])
            .min(now + MAX_RETRY_AFTER);
        let hold = self.drain.rate().map_or(0.0, |r| work / r);
        self.promised[i] = at + Duration::from_secs_f64(hold.min(MAX_RETRY_AFTER.as_secs_f64()));
        at.saturating_since(now)
    }

    /// Marks whether anything is queued (either lane) from `now` on.
    pub(super) fn note_backlog(&mut self, now: Instant) {
        let backlogged = !self.queue.is_empty() || !self.late.is_empty();
        self.drain.set_backlogged(now, backlogged);
    }

    fn queued_work(&self, t: TenantId) -> f64 {
        self.queued_work.get(t.0 as usize).copied().unwrap_or(0.0)
    }

    pub(super) fn add_queued_work(&mut self, t: TenantId, work: f64) {
        let i = t.0 as usize;
        if self.queued_work.len() <= i {
            self.queued_work.resize(i + 1, 0.0);
        }
        self.queued_work[i] = (self.queued_work[i] + work).max(0.0);
        if self.queue.tenant_len(t) == 0 {
            // Nothing of it left in the lane: no rounding residue either.
            self.queued_work[i] = 0.0;
        }
    }
}

impl Scheduler {
    /// The queue cost of a request of `prompt` and `output` tokens in
    /// `pool`, priced as a dispatch at the pool's present concurrency.
    pub(super) fn queue_cost(&self, pool: PoolId, prompt: u32, output: u32) -> f64 {
        let ps = &self.pools[pool.0 as usize];
        let (mut in_flight, mut n) = (0u32, 0u32);
        for b in &ps.backends {
            in_flight += self.backends[b.0 as usize].in_flight;
            n += 1;
        }
        let class = cost_model::class(in_flight / n.max(1) + 1);
        self.estimate(pool, None, prompt, output, class)
    }

    /// The estimated fair-queue cost of a request dispatched in `class`
    /// (to `backend`, when known: its own prices first, the pool's where
    /// it has none).
    pub(super) fn estimate(
        &self,
        pool: PoolId,
        backend: Option<BackendId>,
        prompt: u32,
        output: u32,
        class: u8,
    ) -> f64 {
        let ps = &self.pools[pool.0 as usize];
        let mut per_token = ps.gpu_cost.per_token(class, ps.gpu_seconds_per_token);
        if let Some(b) = backend.and_then(|b| self.backends.get(b.0 as usize)) {
            per_token = b.gpu_cost.per_token(class, per_token);
        }
        let work = Work {
            prompt_tokens: f64::from(prompt),
            output_tokens: f64::from(output),
            gpu_seconds: per_token * f64::from(prompt.saturating_add(output)),
        };
        let capacity = super::state::pool_capacity(&self.backends, ps);
        cost(self.discipline, work, capacity, self.output_token_weight)
    }

    /// The predicted wait before a request of `tenant` arriving now in
    /// `pool` is dispatched; `None` when the pool's drain rate is not yet
    /// known.
    pub(super) fn predicted_wait(&self, pool: PoolId, tenant: TenantId) -> Option<Duration> {
        let ps = &self.pools[pool.0 as usize];
        if ps.queue.is_empty() {
            return Some(Duration::ZERO);
        }
        let rate = ps.drain.rate()?;
        let ahead = self.work_ahead(ps, tenant);
        Some(Duration::from_secs_f64((ahead / rate).min(1e9)))
    }

    /// Queue cost dispatched before a new request of `tenant` (see the
    /// module docs).
    fn work_ahead(&self, ps: &PoolState, tenant: TenantId) -> f64 {
        let tenants = self
            .tenants
            .iter()
            .enumerate()
            .map(|(i, t)| (TenantId(i as u32), t));
        match self.discipline {
            Discipline::Fifo => tenants.map(|(u, _)| ps.queued_work(u)).sum(),
            Discipline::Priority => {
                let class = self.tenants[tenant.0 as usize].priority;
                tenants
                    .filter(|(_, t)| t.priority == class || t.priority == Priority::Interactive)
                    .map(|(u, _)| ps.queued_work(u))
                    .sum()
            }
            Discipline::Drf | Discipline::Wfq => {
                let own = ps.queued_work(tenant);
                let w = self.tenants[tenant.0 as usize]
                    .weight
                    .max(f64::MIN_POSITIVE);
                let v = ps.queue.start_counter(tenant) + own / w;
                let mut ahead = own;
                for (u, t) in tenants {
                    if u == tenant || ps.queue.tenant_len(u) == 0 {
                        continue;
                    }
                    let gap = (v - ps.queue.counter(u)).max(0.0) * t.weight;
                    ahead += ps.queued_work(u).min(gap);
                }
                ahead
            }
        }
    }

    /// The SLO check of an arrival of `tenant` in `pool` at `now`.
    pub(super) fn slo_verdict(&self, now: Instant, pool: PoolId, tenant: TenantId) -> Verdict {
        let t = &self.tenants[tenant.0 as usize];
        let Some(slo) = t.ttft_slo.filter(|_| t.on_late != OnLate::Serve) else {
            return Verdict::Unchecked;
        };
        let service = self.pools[pool.0 as usize]
            .service_ttft
            .unwrap_or_default()
            .min(slo / 2);
        let budget = slo - service;
        let give_up = now + budget;
        match self.predicted_wait(pool, tenant) {
            Some(wait) if wait > budget => Verdict::Late {
                give_up,
                over: wait - budget,
            },
            _ => Verdict::OnTime { give_up },
        }
    }

    /// Moves queued requests whose give-up time has come to their pool's
    /// late lane.
    pub(super) fn demote_due(&mut self, now: Instant) {
        while let Some(&(at, id)) = self.demotions.first() {
            if at > now {
                break;
            }
            self.demotions.remove(&(at, id));
            self.demote(now, id);
        }
    }

    /// Moves queued request `id` from its pool's fair queue to the late
    /// lane, behind everything that can still make its SLO.
    pub(super) fn demote(&mut self, now: Instant, id: RequestId) {
        let Some(req) = self.requests.get_mut(id) else {
            return;
        };
        if req.phase != Phase::Queued || req.late {
            return;
        }
        req.late = true;
        let (tenant, pool, qcost) = (req.tenant, req.pool, req.qcost);
        let requests = &self.requests;
        let ps = &mut self.pools[pool.0 as usize];
        ps.queue
            .forget(tenant, |r| super::state::is_queued(requests, r));
        ps.add_queued_work(tenant, -qcost);
        ps.late.push(tenant, id);
        self.tenants[tenant.0 as usize].demoted_total += 1;
        ps.note_backlog(now);
    }
}
