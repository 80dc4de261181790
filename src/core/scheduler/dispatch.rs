//! Moving requests between the queue and the backends: dispatch from the
//! queue, requeue, shedding, and undoing what a dispatch counted.

use crate::core::ids::{BackendId, PoolId, RequestId, TenantId};
use crate::core::routing::{Placement, pick, prefix_aware, prefix_greedy};
use crate::core::spec::{Discipline, PrefillCharge, Strategy};
use crate::core::time::Instant;

use super::state::{Phase, Req, is_late, is_queued};
use super::{Decision, Lane, SHED_RETRY_AFTER, Scheduler};

/// The share of a pool's dispatch windows kept for tenants below their
/// weighted share (see `Scheduler::in_reserve`).
const RESERVE: f64 = 1.0 / 16.0;

/// Tenants, and requests of each, the locality pass weighs at most: up to
/// 16 index lookups (about 0.3 µs each) per dispatch while a pool is
/// backlogged.
const LOCAL_TENANTS: usize = 4;
const LOCAL_PER_TENANT: usize = 16;

impl Scheduler {
    /// Dispatches from the pool's queue while some backend has room, then
    /// from its late lane.
    pub(super) fn try_dispatch(&mut self, now: Instant, pool: PoolId, out: &mut Vec<Decision>) {
        let p = pool.0 as usize;
        if self.pools[p].retired {
            return;
        }
        while !self.pools[p].queue.is_empty() || !self.pools[p].late.is_empty() {
            self.collect_candidates(now, pool);
            if self.scratch.is_empty() {
                if self.preempt_for_head(now, pool, out) {
                    continue;
                }
                break;
            }
            let reserve = self.in_reserve(pool).then(|| self.below_share(pool));
            let ps = &mut self.pools[p];
            let requests = &self.requests;
            let next = match &reserve {
                // The last free slots go only to tenants below their share.
                Some(below) => {
                    let allow = |t: TenantId| below.get(t.0 as usize).copied().unwrap_or(false);
                    match ps.queue.pop_allowed(allow, |r| is_queued(requests, r)) {
                        Some(next) => Some(next),
                        None => ps.late.pop_allowed(allow, |r| is_late(requests, r)),
                    }
                }
                None => {
                    let local = self.pop_local(now, pool);
                    let ps = &mut self.pools[p];
                    let requests = &self.requests;
                    match local.or_else(|| ps.queue.pop(|r| is_queued(requests, r))) {
                        Some(next) => Some(next),
                        None => ps.late.pop(|r| is_late(requests, r)),
                    }
                }
            };
            let Some((tenant, id)) = next else {
                break;
            };
            if self.batch_held_back(pool, id) {
                // Live work's reserve: the item waits at the head of its
                // lane.
                self.pools[p].late.push_front(tenant, id);
                break;
            }
            // A resumable item goes only where batch prefills leave room;
            // where none does, it waits at the head of its lane until a
            // first token frees some.
            let paced = self
                .requests
                .get(id)
                .filter(|r| r.resumable)
                .map(|r| r.prompt_tokens);
            // A batch item goes too only where the batch lane's loop
            // leaves it room (`lane_limit`).
            let mut scratch = std::mem::take(&mut self.scratch);
            if let Some(prompt) = paced {
                scratch.retain(|c| self.prefill_room(c.id, prompt));
            }
            self.retain_lane_room(now, id, &mut scratch);
            self.scratch = scratch;
            if self.scratch.is_empty() {
                self.pools[p].late.push_front(tenant, id);
                break;
            }
            // The request is chosen first, so that its adapter can choose
            // among the backends.
            let adapter = self.requests.get(id).and_then(|r| r.adapter);
            let best = self.order_for_adapter(pool, adapter);
            let prompt = self.requests.get(id).map_or(0, |r| r.prompt_tokens);
            let ps = &mut self.pools[p];
            // `best` ≥ 1 as there are candidates, so a strategy has one.
            let i = if ps.strategy == Strategy::PrefixAware {
                // Backends past their KV watermark, as homes only.
                let mut gated = std::mem::take(&mut self.kv_gated);
                gated.retain(|c| paced.is_none_or(|prompt| self.prefill_room(c.id, prompt)));
                self.retain_lane_room(now, id, &mut gated);
                let at = best;
                let best = best + gated.len();
                self.scratch.splice(at..at, gated.drain(..));
                self.kv_gated = gated;
                self.match_cached(now, pool, id, best);
                let homed = self.match_homes(now, pool, id, best);
                let family = self.requests.get(id).and_then(|r| family(&r.prefix));
                let (i, placed) =
                    prefix_aware(&self.scratch[..best], prompt, family, homed, &mut self.rng);
                let c = &self.scratch[i];
                let block = self.pools[p].prefix_spec.block_tokens.max(1);
                let home_blocks = c.home_tokens.div_ceil(block);
                self.settle_home(now, pool, id, c.id, placed, home_blocks as usize);
                i
            } else if ps.strategy == Strategy::PrefixGreedy {
                self.match_cached(now, pool, id, best);
                prefix_greedy(&self.scratch[..best], &mut self.rng)
            } else {
                pick(
                    ps.strategy,
                    &self.scratch[..best],
                    prompt,
                    &mut self.rng,
                    &mut ps.rr_cursor,
                )
                .unwrap_or(0)
            };
            let cached = self.scratch[i].cached_tokens;
            let backend = self.scratch[i].id;
            self.dispatch(now, pool, tenant, id, backend, cached, out);
        }
        self.pools[p].note_backlog(now);
    }

    /// Locality within the fairness bound: in a pool routing on prefixes,
    /// of the requests the queue may serve out of order (the first
    /// [`LOCAL_PER_TENANT`] of each of the first [`LOCAL_TENANTS`] tenants
    /// within `locality` of the bound above the next;
    /// `FairQueue::candidates_within`), the one with the most of its
    /// prompt cached on a backend with room, if that is more than the
    /// next request's; `None`: serve in discipline order.
    fn pop_local(&mut self, now: Instant, pool: PoolId) -> Option<(TenantId, RequestId)> {
        let p = pool.0 as usize;
        if self.locality <= 0.0 || !self.pools[p].strategy.routes_on_prefixes() {
            return None;
        }
        let candidates = {
            let requests = &self.requests;
            self.pools[p].queue.candidates_within(
                self.locality,
                LOCAL_TENANTS,
                LOCAL_PER_TENANT,
                |r| is_queued(requests, r),
            )
        };
        if candidates.len() < 2 {
            return None;
        }
        let n = self.scratch.len();
        let mut best: Option<(u32, usize)> = None;
        for (i, &(_, id)) in candidates.iter().enumerate() {
            if self.requests.get(id).is_none_or(|r| r.prefix.is_empty()) {
                best = best.or(Some((0, i)));
                continue;
            }
            self.match_cached(now, pool, id, n);
            let cached = self.scratch[..n]
                .iter()
                .map(|c| c.cached_tokens)
                .max()
                .unwrap_or(0);
            // Strictly more than those before it: ties keep the order.
            if best.is_none_or(|(b, _)| cached > b) {
                best = Some((cached, i));
            }
        }
        let (_, i) = best?;
        if i == 0 {
            return None;
        }
        let (tenant, id) = candidates[i];
        let requests = &self.requests;
        let ps = &mut self.pools[p];
        ps.local_dispatches += 1;
        ps.queue
            .pop_request(tenant, id, |r| is_queued(requests, r))
            .map(|id| (tenant, id))
    }

    /// Whether `pool` is down to its reserve of free slots
    /// ([`RESERVE`] of its windows, rounded down: none under 16; under
    /// `drf` and `wfq` only): then only a tenant below its
    /// weighted share of the windows may take one, so that a tenant
    /// inside its share finds a slot at once, even while another fills
    /// every other.
    fn in_reserve(&self, pool: PoolId) -> bool {
        if !matches!(self.discipline, Discipline::Drf | Discipline::Wfq) {
            // The baselines stay what they are.
            return false;
        }
        let reserve = (f64::from(self.pool_window(pool)) * RESERVE).floor();
        reserve >= 1.0 && f64::from(self.free_slots(pool)) <= reserve
    }

    /// Free slots on the candidates just collected (at most what `pool`
    /// has left of its apportioned slots).
    fn free_slots(&self, pool: PoolId) -> u32 {
        let free: u32 = self
            .scratch
            .iter()
            .map(|c| c.window.saturating_sub(c.in_flight))
            .sum();
        free.min(self.pools[pool.0 as usize].slots_left())
    }

    /// Whether request `id` is a batch item and no more than the
    /// reserve for live work (`batch_reserve` of the pool's windows) is
    /// free now.
    fn batch_held_back(&self, pool: PoolId, id: RequestId) -> bool {
        if self.batch_reserve <= 0.0 || !self.requests.get(id).is_some_and(|r| r.batch) {
            return false;
        }
        f64::from(self.free_slots(pool)) <= f64::from(self.pool_window(pool)) * self.batch_reserve
    }

    /// By tenant index: whether the tenant holds fewer of `pool`'s slots
    /// than its weighted share of them (its weight over all the policy's
    /// tenants').
    fn below_share(&self, pool: PoolId) -> Vec<bool> {
        let ps = &self.pools[pool.0 as usize];
        let total: f64 = self
            .tenants
            .iter()
            .filter(|t| !t.retired)
            .map(|t| t.weight)
            .sum();
        let per_weight = f64::from(self.pool_window(pool)) / total.max(f64::MIN_POSITIVE);
        self.tenants
            .iter()
            .enumerate()
            .map(|(i, t)| f64::from(ps.in_flight(TenantId(i as u32))) < per_weight * t.weight)
            .collect()
    }

    /// The sum of `pool`'s backends' dispatch windows (at most its
    /// apportioned slots in a cluster): its slots.
    pub(super) fn pool_window(&self, pool: PoolId) -> u32 {
        let ps = &self.pools[pool.0 as usize];
        let windows: u32 = ps
            .backends
            .iter()
            .map(|b| self.backends[b.0 as usize].window)
            .sum();
        ps.slots.map_or(windows, |s| windows.min(s))
    }

    /// Fills the first `n` candidates' `cached_tokens` for request `id`
    /// from `pool`'s prefix index.
    fn match_cached(&mut self, now: Instant, pool: PoolId, id: RequestId, n: usize) {
        let Some(req) = self.requests.get(id) else {
            return;
        };
        let ps = &mut self.pools[pool.0 as usize];
        let mut blocks = Vec::with_capacity(n);
        if let Some(ix) = ps.prefix.as_mut() {
            let ids: Vec<BackendId> = self.scratch[..n].iter().map(|c| c.id).collect();
            ix.matched(now, &req.prefix, &ids, &mut blocks);
        }
        for (i, c) in self.scratch[..n].iter_mut().enumerate() {
            c.cached_tokens = cached_tokens(req, ps.prefix_spec.block_tokens, blocks.get(i));
        }
    }

    /// Fills the first `n` candidates' `home_tokens`, `homed` and `need`
    /// for request `id` from `pool`'s homes. Returns the prompt tokens
    /// homed on any of the pool's backends, candidate or not.
    fn match_homes(&mut self, now: Instant, pool: PoolId, id: RequestId, n: usize) -> u32 {
        let Some(req) = self.requests.get(id) else {
            return 0;
        };
        let ps = &mut self.pools[pool.0 as usize];
        let block = ps.prefix_spec.block_tokens;
        // One walk over the pool's backends; the candidates are among them.
        let mut homed = Vec::with_capacity(ps.backends.len());
        if let Some(h) = ps.homes.as_mut() {
            h.matched(now, &req.prefix, &ps.backends, &mut homed);
        }
        for c in self.scratch[..n].iter_mut() {
            let at = ps.backends.iter().position(|b| *b == c.id);
            c.home_tokens = cached_tokens(req, block, at.and_then(|i| homed.get(i)));
            let b = &self.backends[c.id.0 as usize];
            let capacity = b
                .reading
                .as_ref()
                .and_then(|r| r.kv_tokens)
                .unwrap_or(b.kv_tokens)
                .max(1);
            c.homed = ps.homes.as_ref().map_or(0.0, |h| {
                (h.footprint(c.id) as f64 * f64::from(block)) / capacity as f64
            });
            c.need = f64::from(req.prompt_tokens) / capacity as f64;
        }
        cached_tokens(req, block, homed.iter().max())
    }

    /// Records where the prefix strategy sent request `id`: `backend` is
    /// a home of its prefix from now on (or still), and a spill counts.
    /// A request sent to its home refreshes the `home_blocks` homed there
    /// and homes none of its own further blocks: what follows the shared
    /// prefix (a question, a document) is most often the request's alone,
    /// and homed it would count in the backend's share of the partition
    /// for [`HOME_LIFE`](crate::core::prefix::homes::HOME_LIFE), until
    /// every cache looked full and new prefixes went by load alone. A
    /// conversation that outgrows twice its homed part is adopted by
    /// where it is cached, which homes all of it again.
    fn settle_home(
        &mut self,
        now: Instant,
        pool: PoolId,
        id: RequestId,
        backend: BackendId,
        placed: Placement,
        home_blocks: usize,
    ) {
        let ps = &mut self.pools[pool.0 as usize];
        ps.placements[placed.index()] += 1;
        let Some((h, req)) = ps.homes.as_mut().zip(self.requests.get(id)) else {
            return;
        };
        let keys = match placed {
            Placement::Unplaced | Placement::Spill | Placement::Lent => return,
            Placement::Home => &req.prefix[..home_blocks.min(req.prefix.len())],
            Placement::Adopted | Placement::New => &req.prefix[..],
        };
        h.settle(now, backend, keys);
        // A new home, for the other replicas (`shared_homes`).
        if placed == Placement::New
            && let Some(shared) = self.placed.as_mut()
            && shared.len() < super::shared_homes::PLACED_CAP
        {
            shared.push((backend, keys.to_vec()));
        }
    }

    /// Sends queued request `id` of `tenant`, just popped from `pool`'s
    /// queue, to `backend`, which the prefix index predicts holds `cached`
    /// of its prompt tokens.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch(
        &mut self,
        now: Instant,
        pool: PoolId,
        tenant: TenantId,
        id: RequestId,
        backend: BackendId,
        cached: u32,
        out: &mut Vec<Decision>,
    ) {
        let p = pool.0 as usize;
        let Some(req) = self.requests.get(id) else {
            return;
        };
        let class = super::cost_model::class(self.backends[backend.0 as usize].in_flight + 1);
        let charged = self.estimate(
            pool,
            Some(backend),
            self.charged_prompt(req.prompt_tokens, cached),
            req.output_estimate,
            class,
        );
        let (late, qcost, waited) = (req.late, req.qcost, now > req.arrived);
        if let Some(g) = req.give_up {
            self.demotions.remove(&(g, id));
        }
        let ps = &mut self.pools[p];
        if !late {
            ps.add_queued_work(tenant, -qcost);
        }
        if waited {
            ps.drain.dispatched(now, qcost);
        }
        ps.queue.charge_estimate(tenant, charged);
        if late {
            // Fair order within the late lane too (its counters are its own).
            ps.late.charge(tenant, charged);
        }
        let Some(req) = self.requests.get_mut(id) else {
            return;
        };
        let b = &mut self.backends[backend.0 as usize];
        b.in_flight += 1;
        let beside = b.lane.batch_in_flight > 0;
        if req.batch {
            b.lane.batch_in_flight += 1;
        }
        if let Some(a) = req.adapter {
            b.lora.sent(a, now);
        }
        let prefill = req.prompt_tokens.saturating_sub(cached);
        let paced = req.resumable;
        if paced {
            b.batch_prefill += u64::from(prefill);
        }
        b.predicted_cached_tokens += u64::from(cached);
        let mark = b.clock.start(now);
        self.deadlines.remove(&(req.deadline, id));
        req.phase = Phase::InFlight {
            backend,
            mark,
            dispatched: now,
            charged,
            class,
            prefill,
            paced,
            cached,
            beside,
        };
        // The backend will hold the prompt once it has prefilled it: for
        // the index's TTL (approximate mode), or until its engine's own
        // event says so (precise mode).
        let ps = &mut self.pools[p];
        if let Some(ix) = ps.prefix.as_mut() {
            if self.backends[backend.0 as usize].prefix_events {
                let guess = super::prefix_events::PREFIX_GUESS.min(ps.prefix_spec.ttl);
                ix.stored_for(now, backend, &req.prefix, Some(guess));
            } else {
                ix.stored(now, backend, &req.prefix);
            }
        }
        self.tenants[tenant.0 as usize].in_flight += 1;
        let req_batch = req.batch;
        let lane = if req_batch { Lane::Batch } else { Lane::Live };
        let preemptible = self.may_preempt_in(tenant, lane);
        let ps = &mut self.pools[p];
        ps.add_in_flight(tenant, req_batch);
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
        let (late, qcost) = (req.late, req.qcost);
        let Phase::InFlight {
            backend, charged, ..
        } = phase
        else {
            return None;
        };
        let (tenant, pool, lower) = (req.tenant, req.pool, req.batch);
        req.phase = Phase::Queued;
        req.deadline = deadline;
        self.leave_backend(now, id, tenant, pool, phase, lower);
        self.deadlines.insert((deadline, id));
        let p = &mut self.pools[pool.0 as usize];
        p.queue.settle(tenant, charged, Some(0.0));
        if late {
            p.late.push_front(tenant, id);
        } else {
            p.queue.push_front(tenant, id);
            p.add_queued_work(tenant, qcost);
        }
        p.note_backlog(now);
        Some(backend)
    }

    /// Undoes what `dispatch` counted for request `id` in `phase` (in
    /// flight): its backend's slot and GPU clock, its tenant's and pool's
    /// in-flight counts (its batch lane's if `lower`), its place among the
    /// preemptible. Returns the GPU-seconds it had on its backend.
    pub(super) fn leave_backend(
        &mut self,
        now: Instant,
        id: RequestId,
        tenant: TenantId,
        pool: PoolId,
        phase: Phase,
        lower: bool,
    ) -> f64 {
        let Phase::InFlight {
            backend,
            mark,
            dispatched,
            prefill,
            paced,
            ..
        } = phase
        else {
            return 0.0;
        };
        let b = &mut self.backends[backend.0 as usize];
        let gpu_seconds = b.clock.finish(now, mark);
        b.in_flight = b.in_flight.saturating_sub(1);
        if lower {
            b.lane.batch_in_flight = b.lane.batch_in_flight.saturating_sub(1);
        }
        b.prefill_started(prefill, paced);
        let t = &mut self.tenants[tenant.0 as usize];
        t.in_flight = t.in_flight.saturating_sub(1);
        let p = &mut self.pools[pool.0 as usize];
        p.remove_in_flight(tenant, lower);
        p.preemptible.remove(&(dispatched, id));
        gpu_seconds
    }

    /// The prompt tokens a request's charge counts, `cached` of its
    /// `prompt` having been found (or predicted) in its engine's cache.
    pub(super) fn charged_prompt(&self, prompt: u32, cached: u32) -> u32 {
        match self.prefill_charge {
            PrefillCharge::Uncached => prompt.saturating_sub(cached),
            PrefillCharge::Full => prompt,
        }
    }

    /// Request `id`'s prefill is done (its response started, or a
    /// resumable item's first token came): it is no longer queued at its
    /// backend.
    pub(super) fn prefill_done(&mut self, id: RequestId) {
        let Some(req) = self.requests.get_mut(id) else {
            return;
        };
        if let Phase::InFlight {
            backend,
            ref mut prefill,
            paced,
            ..
        } = req.phase
        {
            self.backends[backend.0 as usize].prefill_started(*prefill, paced);
            *prefill = 0;
        }
    }

    /// Whether a resumable batch item of `prompt` tokens may go to backend
    /// `b` now: its resumable items' prefills waiting there leave room
    /// under `batch_prefill_ahead` (one may always go to a backend with
    /// none).
    fn prefill_room(&self, b: BackendId, prompt: u32) -> bool {
        let waiting = self.backends[b.0 as usize].batch_prefill;
        self.batch_prefill_ahead == 0
            || waiting == 0
            || waiting + u64::from(prompt) <= self.batch_prefill_ahead
    }

    pub(super) fn remove_queued(&mut self, now: Instant, id: RequestId) -> Option<Req> {
        let req = self.requests.remove(id)?;
        self.deadlines.remove(&(req.deadline, id));
        if let Some(g) = req.give_up {
            self.demotions.remove(&(g, id));
        }
        let requests = &self.requests;
        let ps = &mut self.pools[req.pool.0 as usize];
        if req.late {
            ps.late.forget(req.tenant, |r| is_late(requests, r));
        } else {
            ps.queue.forget(req.tenant, |r| is_queued(requests, r));
            ps.add_queued_work(req.tenant, -req.qcost);
        }
        ps.note_backlog(now);
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

/// A request's prefix family, which a new prefix's home is hashed on:
/// the block halfway into its chain, shared by every request with the
/// same first half (`None`: no full block).
fn family(keys: &[u64]) -> Option<u64> {
    keys.get(keys.len().saturating_sub(1) / 2).copied()
}

/// Tokens of `req`'s prompt in its first `blocks` blocks of `block`
/// tokens; an engine recomputes at least the prompt's last token.
fn cached_tokens(req: &Req, block: u32, blocks: Option<&u32>) -> u32 {
    blocks
        .copied()
        .unwrap_or(0)
        .saturating_mul(block)
        .min(req.prompt_tokens.saturating_sub(1))
}
