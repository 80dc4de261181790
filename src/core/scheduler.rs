//! The scheduler: composes admission, the per-pool fair queues, dispatch
//! windows, routing and GPU-seconds accounting. Events in, decisions out.
//!
//! Lifecycle of a request: `on_arrival` admits or refuses it; an admitted
//! request is queued in its pool's fair queue and dispatched (a
//! [`Decision::Dispatch`]) as soon as a backend of the pool has room in its
//! window; it ends with exactly one of `on_completion` (served or failed
//! upstream), `on_cancel` (client gone) or a [`Decision::Shed`] (deadline
//! passed, or its pool was removed by a reload). Every end settles the
//! GPU-seconds reservation and frees the tenant's concurrency slot.
//!
//! Preemption (`[preemption]`): when the head of a pool's queue is an
//! interactive tenant and no backend has room, the youngest in-flight
//! request of a batch tenant that holds more slots per weight than the head
//! would after dispatch is aborted ([`Decision::Preempt`]) and queued again
//! at the front of its tenant's queue, and its slot goes to the head. Only
//! work that has run less than the migration threshold, and whose response
//! has not started (see [`Scheduler::on_response_started`]), is preempted;
//! a resumable batch item ([`Lane::Resumable`]) may be preempted after its
//! response started too, and then leaves instead of being queued again.
//!
//! Entities are matched by name across reloads and never renumbered, so
//! state of unchanged tenants and backends (buckets, counters, health,
//! in-flight counts) survives `apply_policy`.
//!
//! This file holds the type and its event handlers; the rest is split by
//! concern: `registry` (tenants, pools and backends by name;
//! `apply_policy`), `admission` (the checks on arrival), `dispatch` (queue
//! to backend and back), `candidates` (which backends may take a request
//! now), `window` (the adaptive dispatch window), `preemption`, `views`
//! (read-only state for metrics and admin) and `state` (the state types).

mod adapters;
mod admission;
mod candidates;
mod cost_model;
mod dispatch;
mod drain;
mod lane_limit;
mod lease;
mod outlier;
mod preemption;
mod prefix_events;
mod registry;
mod shared_homes;
mod slo;
mod state;
mod views;
mod window;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::core::admission::Refusal;
use crate::core::ids::{AdapterId, BackendId, PoolId, RequestId, TenantId, Usage};
use crate::core::queue::cost::{Work, cost};
use crate::core::reading::Reading;
use crate::core::routing::Candidate;
use crate::core::spec::{Api, Discipline, OnLate, PreemptionSpec, PrefillCharge, SchedulerSpec};
use crate::core::time::Instant;

pub use lease::{LEASE_KEEPALIVE, STAGGER_SECS};
pub use outlier::{EjectReason, Ejection};
pub use prefix_events::PrefixEvent;
pub use shared_homes::PlacedHome;
use state::{BackendState, Phase, PoolState, Req, Slab, TenantState, pool_capacity};
pub use views::{BackendView, Demand, PrefixView, TenantView};

/// Output tokens assumed for a request that gives no `max_tokens`.
pub const DEFAULT_OUTPUT_ESTIMATE: u32 = 256;
/// Retry-after for shed requests and for the concurrency cap.
const SHED_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Weight of the newest sample in the observed-TTFT moving average.
const OBSERVED_TTFT_ALPHA: f64 = 0.2;

/// What the caller must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Forward request `id` to `backend` now.
    Dispatch { id: RequestId, backend: BackendId },
    /// Answer request `id` with 503: it cannot be dispatched in time. It has
    /// already left the scheduler.
    Shed {
        id: RequestId,
        retry_after: Duration,
    },
    /// Abort request `id` on `backend`. Nothing of its response had
    /// reached the client: it is queued again and gets a new `Dispatch`.
    /// A resumable item whose response had started: it has left the
    /// scheduler, and its stream is to be cut (see [`Lane::Resumable`]).
    Preempt { id: RequestId, backend: BackendId },
}

impl Decision {
    /// The request the decision is about.
    pub fn id(&self) -> RequestId {
        match self {
            Decision::Dispatch { id, .. }
            | Decision::Shed { id, .. }
            | Decision::Preempt { id, .. } => *id,
        }
    }
}

/// A request arriving at the gateway, identified and sized.
#[derive(Clone, Debug, PartialEq)]
pub struct Arrival {
    pub tenant: TenantId,
    pub pool: PoolId,
    pub prompt_tokens: u32,
    /// The request's `max_tokens`, if it gave one (per choice).
    pub max_tokens: Option<u32>,
    /// Completions asked for (`n`, or `best_of` when larger): each may
    /// produce up to `max_tokens`. 0 counts as 1.
    pub choices: u32,
    /// The client's own deadline for dispatch, if shorter than `max_wait`.
    pub deadline: Option<Duration>,
    /// The LoRA adapter it names ([`Scheduler::adapter`]), served by the
    /// pool of its base model.
    pub adapter: Option<AdapterId>,
    /// Its prompt's block keys at the pool's `prefix_block_tokens`
    /// (`crate::tokens::request_keys`), for prefix-aware routing; empty
    /// when the pool does not route on prefixes.
    pub prefix: Vec<u64>,
    /// Live traffic, or an item of a batch the gateway runs.
    pub lane: Lane,
}

/// Where a request waits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Lane {
    /// A client waiting for its answer: the fair queue.
    #[default]
    Live,
    /// An item of a batch the gateway runs for its owner (`batch`): it
    /// waits in the pool's lower lane, dispatched only while no live
    /// request waits, by the same fair order among tenants; it is never
    /// refused for a predicted SLO miss (its deadline is the batch's
    /// window, not `max_wait`); live work may preempt it while it is
    /// younger than the migration threshold, whatever its tenant's class.
    Batch,
    /// A batch item whose generation the gateway can resume from the
    /// tokens it already streamed: as [`Lane::Batch`], and it stays
    /// preemptible after its response has started. Preempted then, it
    /// leaves the scheduler (its slot and GPU-seconds settled as a cancel)
    /// and its continuation arrives as a new request.
    Resumable,
    /// An item of a batch that cannot meet its window at the rate it runs:
    /// in its owner's fair queue as live work is (by the owner's weight),
    /// but waiting out the window and never refused for a predicted SLO
    /// miss; preemptible only as its tenant's live work is.
    Promoted,
}

impl Lane {
    /// In the pool's batch lane (below live work).
    fn is_batch(self) -> bool {
        matches!(self, Lane::Batch | Lane::Resumable)
    }
}

/// What the scheduler measured for a request that ended after dispatch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ended {
    pub tenant: TenantId,
    pub backend: BackendId,
    /// GPU-seconds attributed to it on its backend.
    pub gpu_seconds: f64,
    /// Time from arrival to dispatch.
    pub queue_wait: Duration,
    /// The fair-queue cost charged at dispatch, from the estimate.
    pub charged: f64,
    /// What that cost settled to from the reported usage (`None`: no
    /// usage, so the estimate stands).
    pub settled: Option<f64>,
}

/// The scheduling core. See the module docs for the request lifecycle.
#[derive(Debug)]
pub struct Scheduler {
    tenants: Vec<TenantState>,
    tenant_by_name: HashMap<String, TenantId>,
    pools: Vec<PoolState>,
    pool_by_model: HashMap<(String, Api), PoolId>,
    backends: Vec<BackendState>,
    backend_by_name: HashMap<String, BackendId>,
    requests: Slab,
    deadlines: BTreeSet<(Instant, RequestId)>,
    /// Give-up times of queued requests kept as best effort (`slo`).
    demotions: BTreeSet<(Instant, RequestId)>,
    discipline: Discipline,
    max_wait: Duration,
    max_queued_per_tenant: u32,
    output_token_weight: f64,
    prefill_charge: PrefillCharge,
    /// `QueueSpec::locality`.
    locality: f64,
    /// `QueueSpec::batch_reserve`.
    batch_reserve: f64,
    /// `QueueSpec::batch_prefill_ahead`.
    batch_prefill_ahead: u64,
    /// `QueueSpec::batch_latency_target` (`lane_limit`).
    batch_latency_target: f64,
    /// `QueueSpec::batch_gpu_discount`.
    batch_gpu_discount: f64,
    stale_after: Duration,
    preemption: PreemptionSpec,
    /// When a queued interactive request that found no slot reaches
    /// `min_wait` and may preempt: `on_tick` looks again then.
    preempt_check: Option<Instant>,
    /// When the earliest outlier ejection ends.
    outlier_check: Option<Instant>,
    /// Backends back from an outlier ejection, not yet taken.
    ejections_ended: Vec<BackendId>,
    rng: SmallRng,
    scratch: Vec<Candidate>,
    /// Backends of the pool in `scratch` past their KV watermark alone,
    /// which a prefix-aware pool may still send to as homes.
    kv_gated: Vec<Candidate>,
    adapters: adapters::Adapters,
    /// New homes for the other replicas of a cluster, by the next sync
    /// (`shared_homes`); `None` when not shared.
    placed: Option<Vec<(BackendId, Vec<u64>)>>,
}

impl Scheduler {
    /// A scheduler for `spec`, with all state fresh at `now`. `seed` makes
    /// random tie-breaks reproducible.
    pub fn new(spec: &SchedulerSpec, now: Instant, seed: u64) -> Self {
        let mut s = Scheduler {
            tenants: Vec::new(),
            tenant_by_name: HashMap::new(),
            pools: Vec::new(),
            pool_by_model: HashMap::new(),
            backends: Vec::new(),
            backend_by_name: HashMap::new(),
            requests: Slab::default(),
            deadlines: BTreeSet::new(),
            demotions: BTreeSet::new(),
            discipline: spec.queue.discipline,
            max_wait: spec.queue.max_wait,
            max_queued_per_tenant: spec.queue.max_queued_per_tenant,
            output_token_weight: spec.queue.output_token_weight,
            prefill_charge: spec.queue.prefill_charge,
            locality: spec.queue.locality,
            batch_reserve: spec.queue.batch_reserve,
            batch_prefill_ahead: spec.queue.batch_prefill_ahead,
            batch_latency_target: spec.queue.batch_latency_target,
            batch_gpu_discount: spec.queue.batch_gpu_discount,
            stale_after: spec.stale_after,
            preemption: spec.preemption.clone(),
            preempt_check: None,
            outlier_check: None,
            ejections_ended: Vec::new(),
            rng: SmallRng::seed_from_u64(seed),
            scratch: Vec::new(),
            kv_gated: Vec::new(),
            adapters: adapters::Adapters::default(),
            placed: None,
        };
        s.apply_policy(spec, now);
        s
    }

    /// Admits or refuses an arrival. On admission the request is queued and
    /// the returned decisions may already dispatch it.
    pub fn on_arrival(
        &mut self,
        now: Instant,
        a: Arrival,
    ) -> Result<(RequestId, Vec<Decision>), Refusal> {
        let t = &mut self.tenants[a.tenant.0 as usize];
        t.arrivals_total += 1;
        let output_estimate = t
            .output
            .estimate(a.max_tokens)
            .saturating_mul(a.choices.max(1));
        let verdict = self.slo_verdict(now, a.pool, a.tenant);
        let qcost = self.queue_cost(a.pool, a.prompt_tokens, output_estimate);
        let gpu_reserved = self.admit(now, &a, output_estimate, verdict, qcost)?;

        let item = a.lane != Lane::Live;
        let batch = a.lane.is_batch();
        let wait = match a.deadline {
            // A batch item waits as long as its batch's window allows.
            Some(d) if item => d,
            Some(d) => d.min(self.max_wait),
            None => self.max_wait,
        };
        let mut deadline = now + wait;
        let on_late = self.tenants[a.tenant.0 as usize].on_late;
        let give_up = if item { None } else { verdict.give_up() };
        if let (Some(g), OnLate::Refuse | OnLate::Shed) = (give_up, on_late) {
            // It cannot make its SLO once still queued then: shed it.
            deadline = deadline.min(g);
        }
        let late = batch
            || (on_late == OnLate::BestEffort && matches!(verdict, slo::Verdict::Late { .. }));
        let id = self.requests.insert(Req {
            tenant: a.tenant,
            pool: a.pool,
            prompt_tokens: a.prompt_tokens,
            max_tokens: a.max_tokens,
            choices: a.choices.max(1),
            output_estimate,
            arrived: now,
            deadline,
            gpu_reserved,
            phase: Phase::Queued,
            late,
            qcost,
            give_up,
            adapter: a.adapter,
            prefix: a.prefix.into_boxed_slice(),
            batch,
            resumable: a.lane == Lane::Resumable,
            started: false,
            gpu_factor: self.gpu_factor(a.lane),
        });
        self.deadlines.insert((deadline, id));
        let ps = &mut self.pools[a.pool.0 as usize];
        if late {
            ps.late.push(a.tenant, id);
            if !batch {
                self.tenants[a.tenant.0 as usize].demoted_total += 1;
            }
        } else {
            ps.queue.push(a.tenant, id);
            ps.add_queued_work(a.tenant, qcost);
            if let (Some(g), OnLate::BestEffort) = (give_up, on_late) {
                self.demotions.insert((g, id));
            }
        }
        let mut out = Vec::new();
        self.try_dispatch(now, a.pool, &mut out);
        Ok((id, out))
    }

    /// A response ended (served, or failed upstream). `usage` corrects the
    /// fair-queue charge when the backend reported it. `None` if `id` is not
    /// in flight (already ended).
    pub fn on_completion(
        &mut self,
        now: Instant,
        id: RequestId,
        usage: Option<Usage>,
    ) -> Option<(Ended, Vec<Decision>)> {
        let (ended, pool) = self.end_in_flight(now, id, usage)?;
        let mut out = Vec::new();
        self.try_dispatch(now, pool, &mut out);
        Some((ended, out))
    }

    /// [`on_completion`](Self::on_completion) but for the dispatch from
    /// the queue that the freed slot allows; returns the request's pool.
    fn end_in_flight(
        &mut self,
        now: Instant,
        id: RequestId,
        usage: Option<Usage>,
    ) -> Option<(Ended, PoolId)> {
        if !matches!(self.requests.get(id)?.phase, Phase::InFlight { .. }) {
            return None;
        }
        let req = self.requests.remove(id)?;
        let Phase::InFlight {
            backend,
            dispatched,
            charged,
            class,
            cached,
            ..
        } = req.phase
        else {
            return None;
        };
        let gpu_seconds = self.leave_backend(now, id, req.tenant, req.pool, req.phase, req.batch);
        // The prompt the charge settles on: the engine's own cached count
        // where it reports one, else the index's prediction.
        let prompt = usage.map_or(0, |u| {
            self.charged_prompt(u.prompt_tokens, u.cached_tokens.unwrap_or(cached))
        });
        let window = self.pool_window(req.pool);
        let pool = &mut self.pools[req.pool.0 as usize];
        pool.drain.completed(now, window);
        let mut actual = None;
        if let Some(u) = usage {
            // Per token as the charge counts them (the estimate multiplies
            // the same tokens).
            let tokens = f64::from(prompt) + f64::from(u.completion_tokens);
            if tokens >= 1.0 {
                let sample = gpu_seconds / tokens;
                pool.gpu_seconds_per_token = 0.9 * pool.gpu_seconds_per_token + 0.1 * sample;
                pool.gpu_cost.learn(class, sample);
                if let Some(b) = self.backends.get_mut(backend.0 as usize) {
                    b.gpu_cost.learn(class, sample);
                }
            }
            if let (Some(n), Some(b)) = (u.cached_tokens, self.backends.get_mut(backend.0 as usize))
            {
                b.reported_cached_tokens += u64::from(n);
                b.reported_prompt_tokens += u64::from(u.prompt_tokens);
            }
            let capacity = pool_capacity(&self.backends, pool);
            actual = Some(cost(
                self.discipline,
                Work {
                    prompt_tokens: f64::from(prompt),
                    output_tokens: f64::from(u.completion_tokens),
                    gpu_seconds,
                },
                capacity,
                self.output_token_weight,
            ));
        }
        pool.queue.settle(req.tenant, charged, actual);
        let t = &mut self.tenants[req.tenant.0 as usize];
        if let Some(u) = usage {
            // The model learns one choice's output.
            t.output
                .learn(req.max_tokens, u.completion_tokens / req.choices);
        }
        t.active = t.active.saturating_sub(1);
        t.gpu_open = (t.gpu_open - req.gpu_reserved).max(0.0);
        t.gpu_seconds_total += gpu_seconds;
        if let Some(g) = &mut t.gpu {
            g.settle(now, req.gpu_reserved, gpu_seconds * req.gpu_factor);
        }
        let ended = Ended {
            tenant: req.tenant,
            backend,
            gpu_seconds,
            queue_wait: dispatched - req.arrived,
            charged,
            settled: actual,
        };
        Some((ended, req.pool))
    }

    /// The client went away. A queued request leaves the queue at once and
    /// gives back its reservation; an in-flight one ends like a completion
    /// without usage. Returns what was measured if it was in flight.
    pub fn on_cancel(&mut self, now: Instant, id: RequestId) -> (Option<Ended>, Vec<Decision>) {
        match self.requests.get(id).map(|r| r.phase) {
            Some(Phase::Queued) => {
                self.remove_queued(now, id);
                (None, Vec::new())
            }
            Some(Phase::InFlight { .. }) => match self.on_completion(now, id, None) {
                Some((ended, out)) => (Some(ended), out),
                None => (None, Vec::new()),
            },
            None => (None, Vec::new()),
        }
    }

    /// Sheds queued requests whose deadline has passed, and moves those
    /// kept as best effort whose SLO has passed to their late lane.
    pub fn on_tick(&mut self, now: Instant) -> Vec<Decision> {
        let mut out = Vec::new();
        while let Some(&(deadline, id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.shed(now, id, &mut out);
        }
        self.demote_due(now);
        if self.preempt_check.is_some_and(|t| t <= now) {
            self.preempt_check = None;
            for p in 0..self.pools.len() {
                self.try_dispatch(now, PoolId(p as u32), &mut out);
            }
        }
        if self.outlier_check.is_some_and(|t| t <= now) {
            self.end_ejections(now, &mut out);
        }
        out
    }

    /// The earliest deadline, demotion, preemption check or end of an
    /// outlier ejection, which needs `on_tick`.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let deadline = self.deadlines.first().map(|(t, _)| *t);
        let demotion = self.demotions.first().map(|(t, _)| *t);
        [deadline, demotion, self.preempt_check, self.outlier_check]
            .into_iter()
            .flatten()
            .min()
    }

    /// A new reading for a backend: updates headroom and adapts its window
    /// (AIMD: halve when the engine has a backlog or KV is at the watermark,
    /// grow by one when the window is the limit and it has headroom), so the engine's own queue stays near empty
    /// and queueing — and fairness — stays here.
    pub fn on_reading(
        &mut self,
        now: Instant,
        backend: BackendId,
        reading: Reading,
    ) -> Vec<Decision> {
        let Some(b) = self.backends.get_mut(backend.0 as usize) else {
            return Vec::new();
        };
        let watermark = self.pools[b.pool.0 as usize].kv_high_watermark;
        b.adapt_window(&reading, watermark);
        if let Some(kv) = reading.kv_tokens {
            b.kv_tokens = kv;
        }
        b.lora.report(&self.adapters, reading.lora.as_ref());
        b.reading = Some(reading);
        let pool = b.pool;
        let mut out = Vec::new();
        self.try_dispatch(now, pool, &mut out);
        out
    }

    /// Marks a backend healthy or ejected. Ejected backends get no new requests.
    pub fn set_health(&mut self, now: Instant, backend: BackendId, healthy: bool) -> Vec<Decision> {
        let Some(b) = self.backends.get_mut(backend.0 as usize) else {
            return Vec::new();
        };
        b.healthy = healthy;
        let pool = b.pool;
        let mut out = Vec::new();
        if healthy {
            self.try_dispatch(now, pool, &mut out);
        }
        out
    }

    /// The gateway saw a streamed response from `backend` start `ttft` after
    /// dispatch. Routing uses the moving average when the backend has no
    /// fresh reading.
    pub fn observe_ttft(&mut self, backend: BackendId, ttft: Duration) {
        if let Some(b) = self.backends.get_mut(backend.0 as usize) {
            self.pools[b.pool.0 as usize].observe_service_ttft(ttft);
            b.observed_ttft = Some(match b.observed_ttft {
                Some(avg) => {
                    avg.mul_f64(1.0 - OBSERVED_TTFT_ALPHA) + ttft.mul_f64(OBSERVED_TTFT_ALPHA)
                }
                None => ttft,
            });
        }
    }

    /// The connection to request `id`'s backend failed before anything was
    /// sent: the backend is ejected, and the request goes back to the head of
    /// its tenant's queue with its charge refunded, to be dispatched to
    /// another backend (or to wait for one, until its original deadline).
    /// `None` if `id` is not in flight, or if no other backend of its pool is
    /// healthy: then the backend is still ejected, but the request stays in
    /// flight for the caller to end as failed.
    pub fn redispatch(&mut self, now: Instant, id: RequestId) -> Option<Vec<Decision>> {
        let req = self.requests.get(id)?;
        let pool = req.pool;
        let Phase::InFlight { backend, .. } = req.phase else {
            return None;
        };
        self.backends[backend.0 as usize].healthy = false;
        if !self.pool_is_ready(pool) {
            return None;
        }
        let deadline = self.requests.get(id)?.deadline.max(now);
        self.requeue(now, id, deadline);
        let mut out = Vec::new();
        self.try_dispatch(now, pool, &mut out);
        Some(out)
    }

    /// Notes that the response of in-flight request `id` has started to
    /// reach the client: from now on it is never preempted, but for a
    /// resumable batch item ([`Lane::Resumable`]). Returns `false` when
    /// `id` is not in flight (it was preempted or has ended): the caller
    /// must then drop that response.
    pub fn on_response_started(&mut self, id: RequestId) -> bool {
        let Some(req) = self.requests.get_mut(id) else {
            return false;
        };
        let Phase::InFlight { dispatched, .. } = req.phase else {
            return false;
        };
        req.started = true;
        if req.resumable {
            // Its headers come at once: its prefill is done at its first
            // token (`on_first_token`).
            return true;
        }
        self.pools[req.pool.0 as usize]
            .preemptible
            .remove(&(dispatched, id));
        self.prefill_done(id);
        true
    }

    /// The first token of in-flight request `id` came (the gateway calls
    /// it for resumable batch items, which stream): its prefill is done,
    /// and the batch items its backend's prefill limit held back
    /// (`QueueSpec::batch_prefill_ahead`) may go.
    pub fn on_first_token(&mut self, now: Instant, id: RequestId) -> Vec<Decision> {
        let mut out = Vec::new();
        let Some(req) = self.requests.get(id) else {
            return out;
        };
        let pool = req.pool;
        if !matches!(req.phase, Phase::InFlight { prefill: 1.., .. }) {
            return out;
        }
        self.prefill_done(id);
        self.try_dispatch(now, pool, &mut out);
        out
    }
}

#[cfg(test)]
mod tests;
