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
//! has not started (see [`Scheduler::on_response_started`]), is preempted.
//!
//! Entities are matched by name across reloads and never renumbered, so
//! state of unchanged tenants and backends (buckets, counters, health,
//! in-flight counts) survives `apply_policy`.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::core::accounting::GpuClock;
use crate::core::admission::{Bucket, LimitKind, Refusal};
use crate::core::ids::{BackendId, PoolId, RequestId, TenantId, Usage};
use crate::core::queue::FairQueue;
use crate::core::queue::cost::{PoolCapacity, Work, cost};
use crate::core::reading::Reading;
use crate::core::routing::{Candidate, pick};
use crate::core::spec::{Discipline, PreemptionSpec, Priority, SchedulerSpec, Strategy};
use crate::core::time::Instant;

/// Output tokens assumed for a request that gives no `max_tokens`.
pub const DEFAULT_OUTPUT_ESTIMATE: u32 = 256;
/// Initial estimate of GPU-seconds per token, until completions measure it.
const INITIAL_GPU_SECONDS_PER_TOKEN: f64 = 5e-4;
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
    /// Abort request `id` on `backend` (nothing of its response may have
    /// reached the client). It is queued again and gets a new `Dispatch`.
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
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arrival {
    pub tenant: TenantId,
    pub pool: PoolId,
    pub prompt_tokens: u32,
    /// The request's `max_tokens`, if it gave one.
    pub max_tokens: Option<u32>,
    /// The client's own deadline for dispatch, if shorter than `max_wait`.
    pub deadline: Option<Duration>,
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
}

/// A tenant's state, for metrics and admin views.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantView {
    pub name: String,
    pub queued: u32,
    pub in_flight: u32,
    pub gpu_seconds_total: f64,
    /// Request-bucket level, if the tenant has a rate.
    pub rate_level: Option<f64>,
    /// GPU-seconds bucket level (negative in debt), if budgeted.
    pub gpu_seconds_level: Option<f64>,
    /// Weighted service (virtual counter) summed over pools.
    pub service: f64,
    /// Requests of this tenant preempted so far.
    pub preempted_total: u64,
}

/// A backend's state, for metrics and admin views.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendView {
    pub name: String,
    pub pool: PoolId,
    pub in_flight: u32,
    pub window: u32,
    pub healthy: bool,
    /// The latest reading and whether it is fresh.
    pub reading: Option<(Reading, bool)>,
    /// The gateway's own moving average of time to first token.
    pub observed_ttft: Option<Duration>,
    pub busy_gpu_seconds: f64,
    pub gpus: u32,
}

#[derive(Debug)]
struct TenantState {
    name: String,
    weight: f64,
    priority: Priority,
    max_concurrency: Option<u32>,
    /// In flight plus queued.
    active: u32,
    in_flight: u32,
    rate: Option<Bucket>,
    gpu: Option<Bucket>,
    gpu_seconds_total: f64,
    preempted_total: u64,
    retired: bool,
}

#[derive(Debug)]
struct PoolState {
    model: String,
    strategy: Strategy,
    kv_high_watermark: f64,
    ttft_p99_threshold: Duration,
    queue: FairQueue,
    backends: Vec<BackendId>,
    rr_cursor: usize,
    /// Running average of measured GPU-seconds per token (prompt + output).
    gpu_seconds_per_token: f64,
    /// In-flight requests here, by tenant index.
    in_flight: Vec<u32>,
    /// In-flight requests that may be preempted, by dispatch time.
    preemptible: BTreeSet<(Instant, RequestId)>,
    retired: bool,
}

impl PoolState {
    fn in_flight(&self, t: TenantId) -> u32 {
        self.in_flight.get(t.0 as usize).copied().unwrap_or(0)
    }

    fn add_in_flight(&mut self, t: TenantId) {
        let i = t.0 as usize;
        if self.in_flight.len() <= i {
            self.in_flight.resize(i + 1, 0);
        }
        self.in_flight[i] += 1;
    }
}

#[derive(Debug)]
struct BackendState {
    name: String,
    pool: PoolId,
    gpus: u32,
    kv_tokens: u64,
    max_inflight: u32,
    window: u32,
    in_flight: u32,
    healthy: bool,
    reading: Option<Reading>,
    /// Moving average of the time to first token the gateway itself saw on
    /// streamed responses: the latency signal when no fresh reading has one.
    observed_ttft: Option<Duration>,
    clock: GpuClock,
    retired: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Queued,
    InFlight {
        backend: BackendId,
        mark: f64,
        dispatched: Instant,
        charged: f64,
    },
}

#[derive(Debug, Clone)]
struct Req {
    tenant: TenantId,
    pool: PoolId,
    prompt_tokens: u32,
    output_estimate: u32,
    arrived: Instant,
    deadline: Instant,
    gpu_reserved: f64,
    phase: Phase,
}

#[derive(Debug, Default)]
struct Slab {
    slots: Vec<(u32, Option<Req>)>,
    free: Vec<u32>,
    live: usize,
}

impl Slab {
    fn insert(&mut self, req: Req) -> RequestId {
        self.live += 1;
        if let Some(i) = self.free.pop() {
            let slot = &mut self.slots[i as usize];
            slot.0 = slot.0.wrapping_add(1);
            slot.1 = Some(req);
            RequestId::new(i, slot.0)
        } else {
            let i = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
            self.slots.push((0, Some(req)));
            RequestId::new(i, 0)
        }
    }
    fn get(&self, id: RequestId) -> Option<&Req> {
        match self.slots.get(id.index()) {
            Some((g, Some(r))) if *g == id.generation() => Some(r),
            _ => None,
        }
    }
    fn get_mut(&mut self, id: RequestId) -> Option<&mut Req> {
        match self.slots.get_mut(id.index()) {
            Some((g, Some(r))) if *g == id.generation() => Some(r),
            _ => None,
        }
    }
    fn remove(&mut self, id: RequestId) -> Option<Req> {
        match self.slots.get_mut(id.index()) {
            Some((g, slot @ Some(_))) if *g == id.generation() => {
                self.live -= 1;
                self.free.push(id.index() as u32);
                slot.take()
            }
            _ => None,
        }
    }
}

/// The scheduling core. See the module docs for the request lifecycle.
#[derive(Debug)]
pub struct Scheduler {
    tenants: Vec<TenantState>,
    tenant_by_name: HashMap<String, TenantId>,
    pools: Vec<PoolState>,
    pool_by_model: HashMap<String, PoolId>,
    backends: Vec<BackendState>,
    backend_by_name: HashMap<String, BackendId>,
    requests: Slab,
    deadlines: BTreeSet<(Instant, RequestId)>,
    discipline: Discipline,
    max_wait: Duration,
    max_queued_per_tenant: u32,
    output_token_weight: f64,
    stale_after: Duration,
    preemption: PreemptionSpec,
    /// When a queued interactive request that found no slot reaches
    /// `min_wait` and may preempt: `on_tick` looks again then.
    preempt_check: Option<Instant>,
    rng: SmallRng,
    scratch: Vec<Candidate>,
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
            discipline: spec.queue.discipline,
            max_wait: spec.queue.max_wait,
            max_queued_per_tenant: spec.queue.max_queued_per_tenant,
            output_token_weight: spec.queue.output_token_weight,
            stale_after: spec.stale_after,
            preemption: spec.preemption.clone(),
            preempt_check: None,
            rng: SmallRng::seed_from_u64(seed),
            scratch: Vec::new(),
        };
        s.apply_policy(spec, now);
        s
    }

    /// Reconciles with a new spec by name: unchanged tenants, pools and
    /// backends keep their state; new ones start fresh; removed ones are
    /// retired (never routed to again; in-flight requests end normally).
    /// Requests queued in a removed pool are shed.
    pub fn apply_policy(&mut self, spec: &SchedulerSpec, now: Instant) -> Vec<Decision> {
        self.discipline = spec.queue.discipline;
        self.max_wait = spec.queue.max_wait;
        self.max_queued_per_tenant = spec.queue.max_queued_per_tenant;
        self.output_token_weight = spec.queue.output_token_weight;
        self.stale_after = spec.stale_after;
        self.preemption = spec.preemption.clone();

        for t in &mut self.tenants {
            t.retired = true;
        }
        for tp in &spec.tenants {
            let id = self.tenant_entry(&tp.name);
            let t = &mut self.tenants[id.0 as usize];
            t.retired = false;
            t.weight = tp.weight;
            t.priority = tp.priority;
            t.max_concurrency = tp.max_concurrency;
            t.rate = tp.rate.map(|rate| {
                let burst = tp.burst.unwrap_or(rate).max(1.0);
                reconfigured(t.rate.take(), now, burst, rate)
            });
            t.gpu = tp
                .gpu_seconds_per_hour
                .map(|per_hour| reconfigured(t.gpu.take(), now, per_hour, per_hour / 3600.0));
        }
        if spec.tenants.is_empty() {
            // No tenants declared: auth is off and everyone is "default".
            let id = self.tenant_entry("default");
            self.tenants[id.0 as usize].retired = false;
        }

        for p in &mut self.pools {
            p.retired = true;
        }
        for b in &mut self.backends {
            b.retired = true;
        }
        for pp in &spec.pools {
            let pid = *self
                .pool_by_model
                .entry(pp.model.clone())
                .or_insert_with(|| {
                    self.pools.push(PoolState {
                        model: pp.model.clone(),
                        strategy: pp.strategy,
                        kv_high_watermark: pp.kv_high_watermark,
                        ttft_p99_threshold: pp.ttft_p99_threshold,
                        queue: FairQueue::new(spec.queue.discipline),
                        backends: Vec::new(),
                        rr_cursor: 0,
                        gpu_seconds_per_token: INITIAL_GPU_SECONDS_PER_TOKEN,
                        in_flight: Vec::new(),
                        preemptible: BTreeSet::new(),
                        retired: false,
                    });
                    PoolId((self.pools.len() - 1) as u32)
                });
            let mut members = Vec::with_capacity(pp.backends.len());
            for bp in &pp.backends {
                let bid = *self
                    .backend_by_name
                    .entry(bp.name.clone())
                    .or_insert_with(|| {
                        self.backends.push(BackendState {
                            name: bp.name.clone(),
                            pool: pid,
                            gpus: bp.gpus,
                            kv_tokens: bp.kv_tokens,
                            max_inflight: bp.max_inflight,
                            window: bp.max_inflight,
                            in_flight: 0,
                            healthy: true,
                            reading: None,
                            observed_ttft: None,
                            clock: GpuClock::new(bp.gpus, now),
                            retired: false,
                        });
                        BackendId((self.backends.len() - 1) as u32)
                    });
                let b = &mut self.backends[bid.0 as usize];
                if b.pool != pid {
                    // Moved to another pool: keep accounting, reset routing state.
                    b.pool = pid;
                    b.reading = None;
                }
                b.retired = false;
                b.gpus = bp.gpus;
                b.clock.set_gpus(now, bp.gpus);
                b.kv_tokens = bp.kv_tokens;
                b.max_inflight = bp.max_inflight;
                b.window = b.window.clamp(1, bp.max_inflight);
                members.push(bid);
            }
            let p = &mut self.pools[pid.0 as usize];
            p.retired = false;
            p.strategy = pp.strategy;
            p.kv_high_watermark = pp.kv_high_watermark;
            p.ttft_p99_threshold = pp.ttft_p99_threshold;
            p.backends = members;
        }

        let requests = &self.requests;
        for p in &mut self.pools {
            p.queue
                .set_discipline(self.discipline, |id| is_queued(requests, id));
            for (i, t) in self.tenants.iter().enumerate() {
                p.queue.set_tenant(TenantId(i as u32), t.weight, t.priority);
            }
        }

        let mut out = Vec::new();
        // Queued requests of retired pools or tenants cannot be served.
        let doomed: Vec<RequestId> = self
            .deadlines
            .iter()
            .map(|(_, id)| *id)
            .filter(|id| {
                self.requests.get(*id).is_some_and(|r| {
                    self.pools[r.pool.0 as usize].retired
                        || self.tenants[r.tenant.0 as usize].retired
                })
            })
            .collect();
        for id in doomed {
            self.shed(now, id, &mut out);
        }
        for p in 0..self.pools.len() {
            self.try_dispatch(now, PoolId(p as u32), &mut out);
        }
        out
    }

    /// The id of the tenant named `name`, creating fresh state for a new name.
    fn tenant_entry(&mut self, name: &str) -> TenantId {
        if let Some(id) = self.tenant_by_name.get(name) {
            return *id;
        }
        let id = TenantId(self.tenants.len() as u32);
        self.tenants.push(TenantState {
            name: name.to_owned(),
            weight: 1.0,
            priority: Priority::Interactive,
            max_concurrency: None,
            active: 0,
            in_flight: 0,
            rate: None,
            gpu: None,
            gpu_seconds_total: 0.0,
            preempted_total: 0,
            retired: false,
        });
        self.tenant_by_name.insert(name.to_owned(), id);
        id
    }

    /// The tenant with this name, if the running policy declares it.
    pub fn tenant(&self, name: &str) -> Option<TenantId> {
        self.tenant_by_name
            .get(name)
            .copied()
            .filter(|t| !self.tenants[t.0 as usize].retired)
    }

    /// The pool serving `model`, if any.
    pub fn pool(&self, model: &str) -> Option<PoolId> {
        self.pool_by_model
            .get(model)
            .copied()
            .filter(|p| !self.pools[p.0 as usize].retired)
    }

    /// The backend with this name, if declared.
    pub fn backend(&self, name: &str) -> Option<BackendId> {
        self.backend_by_name
            .get(name)
            .copied()
            .filter(|b| !self.backends[b.0 as usize].retired)
    }

    /// Name of a tenant (for labels).
    pub fn tenant_name(&self, t: TenantId) -> &str {
        &self.tenants[t.0 as usize].name
    }

    /// Model of a pool.
    pub fn pool_model(&self, p: PoolId) -> &str {
        &self.pools[p.0 as usize].model
    }

    /// Name of a backend.
    pub fn backend_name(&self, b: BackendId) -> &str {
        &self.backends[b.0 as usize].name
    }

    /// Admits or refuses an arrival. On admission the request is queued and
    /// the returned decisions may already dispatch it.
    pub fn on_arrival(
        &mut self,
        now: Instant,
        a: Arrival,
    ) -> Result<(RequestId, Vec<Decision>), Refusal> {
        let output_estimate = a.max_tokens.unwrap_or(DEFAULT_OUTPUT_ESTIMATE);
        let pool = &self.pools[a.pool.0 as usize];
        let est_gpu =
            pool.gpu_seconds_per_token * f64::from(a.prompt_tokens.saturating_add(output_estimate));
        let queued_here = pool.queue.tenant_len(a.tenant);
        let max_queued = self.max_queued_per_tenant;
        let t = &mut self.tenants[a.tenant.0 as usize];

        let rate_headers = |b: &Option<Bucket>| -> (Option<f64>, Option<f64>, Option<Duration>) {
            match b {
                Some(b) => (
                    Some(b.capacity()),
                    Some(b.last_level().max(0.0).floor()),
                    Some(b.time_to_full()),
                ),
                None => (None, None, None),
            }
        };
        let refuse = |limit, retry_after, b: &Option<Bucket>| {
            let (requests_limit, requests_remaining, requests_reset) = rate_headers(b);
            Refusal {
                limit,
                retry_after,
                requests_limit,
                requests_remaining,
                requests_reset,
            }
        };

        if t.max_concurrency.is_some_and(|m| t.active >= m) {
            return Err(refuse(LimitKind::Concurrency, SHED_RETRY_AFTER, &t.rate));
        }
        if let Some(b) = &mut t.rate
            && let Err(wait) = b.check(now, 1.0)
        {
            return Err(refuse(LimitKind::Rate, wait, &t.rate));
        }
        if let Some(g) = &mut t.gpu
            && let Err(wait) = g.check(now, est_gpu)
        {
            return Err(refuse(LimitKind::GpuSeconds, wait, &t.rate));
        }
        if queued_here >= max_queued {
            return Err(refuse(LimitKind::QueueFull, SHED_RETRY_AFTER, &t.rate));
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

        let wait = a.deadline.map_or(self.max_wait, |d| d.min(self.max_wait));
        let deadline = now + wait;
        let id = self.requests.insert(Req {
            tenant: a.tenant,
            pool: a.pool,
            prompt_tokens: a.prompt_tokens,
            output_estimate,
            arrived: now,
            deadline,
            gpu_reserved,
            phase: Phase::Queued,
        });
        self.deadlines.insert((deadline, id));
        self.pools[a.pool.0 as usize].queue.push(a.tenant, id);
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
        if !matches!(self.requests.get(id)?.phase, Phase::InFlight { .. }) {
            return None;
        }
        let req = self.requests.remove(id)?;
        let Phase::InFlight {
            backend,
            dispatched,
            charged,
            ..
        } = req.phase
        else {
            return None;
        };
        let gpu_seconds = self.leave_backend(now, id, req.tenant, req.pool, req.phase);
        let pool = &mut self.pools[req.pool.0 as usize];
        let mut actual = None;
        if let Some(u) = usage {
            let tokens = f64::from(u.prompt_tokens) + f64::from(u.completion_tokens);
            if tokens >= 1.0 {
                let sample = gpu_seconds / tokens;
                pool.gpu_seconds_per_token = 0.9 * pool.gpu_seconds_per_token + 0.1 * sample;
            }
            let capacity = pool_capacity(&self.backends, pool);
            actual = Some(cost(
                self.discipline,
                Work {
                    prompt_tokens: f64::from(u.prompt_tokens),
                    output_tokens: f64::from(u.completion_tokens),
                    gpu_seconds,
                },
                capacity,
                self.output_token_weight,
            ));
        }
        pool.queue.settle(req.tenant, charged, actual);
        let t = &mut self.tenants[req.tenant.0 as usize];
        t.active = t.active.saturating_sub(1);
        t.gpu_seconds_total += gpu_seconds;
        if let Some(g) = &mut t.gpu {
            g.settle(now, req.gpu_reserved, gpu_seconds);
        }
        let ended = Ended {
            tenant: req.tenant,
            backend,
            gpu_seconds,
            queue_wait: dispatched - req.arrived,
        };
        let mut out = Vec::new();
        self.try_dispatch(now, req.pool, &mut out);
        Some((ended, out))
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

    /// Sheds queued requests whose deadline has passed.
    pub fn on_tick(&mut self, now: Instant) -> Vec<Decision> {
        let mut out = Vec::new();
        while let Some(&(deadline, id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.shed(now, id, &mut out);
        }
        if self.preempt_check.is_some_and(|t| t <= now) {
            self.preempt_check = None;
            for p in 0..self.pools.len() {
                self.try_dispatch(now, PoolId(p as u32), &mut out);
            }
        }
        out
    }

    /// The earliest deadline, or preemption check, that needs `on_tick`.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let deadline = self.deadlines.first().map(|(t, _)| *t);
        match (deadline, self.preempt_check) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
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
        // Requests wait inside an engine for two reasons: a backlog (the
        // batch is full, or KV is), which the window must not feed, and the
        // next step boundary, a few milliseconds that any busy engine shows.
        // Only the first is pressure: waiting counts while the engine runs
        // at least the whole window (or when the dialect does not say how
        // many run).
        let backlogged =
            reading.waiting.is_some_and(|w| w > 0) && reading.running.is_none_or(|r| r >= b.window);
        let pressured = backlogged || reading.kv_usage.is_some_and(|k| k >= watermark);
        if pressured {
            b.window = (b.window / 2).max(1);
        } else if b.in_flight + 1 >= b.window {
            // Grow only when the window is actually the limit.
            b.window = (b.window + 1).min(b.max_inflight);
        }
        if let Some(kv) = reading.kv_tokens {
            b.kv_tokens = kv;
        }
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

    /// Whether a backend is in service (not ejected).
    pub fn is_healthy(&self, backend: BackendId) -> bool {
        self.backends
            .get(backend.0 as usize)
            .is_some_and(|b| b.healthy)
    }

    /// The gateway saw a streamed response from `backend` start `ttft` after
    /// dispatch. Routing uses the moving average when the backend has no
    /// fresh reading.
    pub fn observe_ttft(&mut self, backend: BackendId, ttft: Duration) {
        if let Some(b) = self.backends.get_mut(backend.0 as usize) {
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

    /// Whether `tenant`'s requests may be preempted while in flight (a
    /// batch tenant, with preemption on).
    pub fn may_preempt(&self, tenant: TenantId) -> bool {
        self.preemption.enabled
            && self
                .tenants
                .get(tenant.0 as usize)
                .is_some_and(|t| t.priority == Priority::Batch)
    }

    /// Notes that the response of in-flight request `id` has started to
    /// reach the client: from now on it is never preempted. Returns `false`
    /// when `id` is not in flight (it was preempted or has ended): the
    /// caller must then drop that response.
    pub fn on_response_started(&mut self, id: RequestId) -> bool {
        let Some(req) = self.requests.get(id) else {
            return false;
        };
        let Phase::InFlight { dispatched, .. } = req.phase else {
            return false;
        };
        self.pools[req.pool.0 as usize]
            .preemptible
            .remove(&(dispatched, id));
        true
    }

    /// Takes in-flight request `id` off its backend and puts it back at the
    /// front of its tenant's queue, with its dispatch charge refunded.
    fn requeue(&mut self, now: Instant, id: RequestId, deadline: Instant) -> Option<BackendId> {
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
    fn leave_backend(
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

    /// Whether a pool has at least one healthy backend.
    pub fn pool_is_ready(&self, pool: PoolId) -> bool {
        self.pools[pool.0 as usize]
            .backends
            .iter()
            .any(|b| self.backends[b.0 as usize].healthy)
    }

    /// Live pools.
    pub fn pools(&self) -> impl Iterator<Item = PoolId> + '_ {
        (0..self.pools.len())
            .filter(|i| !self.pools[*i].retired)
            .map(|i| PoolId(i as u32))
    }

    /// Live tenants.
    pub fn tenants(&self) -> impl Iterator<Item = TenantId> + '_ {
        (0..self.tenants.len())
            .filter(|i| !self.tenants[*i].retired)
            .map(|i| TenantId(i as u32))
    }

    /// Live backends.
    pub fn backends(&self) -> impl Iterator<Item = BackendId> + '_ {
        (0..self.backends.len())
            .filter(|i| !self.backends[*i].retired)
            .map(|i| BackendId(i as u32))
    }

    /// Queued requests in a pool.
    pub fn queue_len(&self, pool: PoolId) -> usize {
        self.pools[pool.0 as usize].queue.len()
    }

    /// Requests the scheduler currently holds (queued or in flight).
    pub fn live_requests(&self) -> usize {
        self.requests.live
    }

    /// A tenant's state now.
    pub fn tenant_view(&mut self, now: Instant, t: TenantId) -> TenantView {
        let queued = self.pools.iter().map(|p| p.queue.tenant_len(t)).sum();
        let service = self.pools.iter().map(|p| p.queue.counter(t)).sum();
        let s = &mut self.tenants[t.0 as usize];
        TenantView {
            name: s.name.clone(),
            queued,
            in_flight: s.in_flight,
            gpu_seconds_total: s.gpu_seconds_total,
            rate_level: s.rate.as_mut().map(|b| b.level(now)),
            gpu_seconds_level: s.gpu.as_mut().map(|b| b.level(now)),
            service,
            preempted_total: s.preempted_total,
        }
    }

    /// A backend's state now.
    pub fn backend_view(&mut self, now: Instant, b: BackendId) -> BackendView {
        let stale_after = self.stale_after;
        let s = &mut self.backends[b.0 as usize];
        BackendView {
            name: s.name.clone(),
            pool: s.pool,
            in_flight: s.in_flight,
            window: s.window,
            healthy: s.healthy,
            reading: s.reading.clone().map(|r| {
                let fresh = now.saturating_since(r.at) <= stale_after;
                (r, fresh)
            }),
            observed_ttft: s.observed_ttft,
            busy_gpu_seconds: s.clock.busy_gpu_seconds(now),
            gpus: s.gpus,
        }
    }

    fn remove_queued(&mut self, now: Instant, id: RequestId) -> Option<Req> {
        let req = self.requests.remove(id)?;
        self.deadlines.remove(&(req.deadline, id));
        let requests = &self.requests;
        self.pools[req.pool.0 as usize]
            .queue
            .forget(req.tenant, |r| is_queued(requests, r));
        let t = &mut self.tenants[req.tenant.0 as usize];
        t.active = t.active.saturating_sub(1);
        if let Some(g) = &mut t.gpu {
            g.settle(now, req.gpu_reserved, 0.0);
        }
        Some(req)
    }

    fn shed(&mut self, now: Instant, id: RequestId, out: &mut Vec<Decision>) {
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

    /// Dispatches from the pool's queue while some backend has room.
    fn try_dispatch(&mut self, now: Instant, pool: PoolId, out: &mut Vec<Decision>) {
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
    fn dispatch(
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
        let estimate = Work {
            prompt_tokens: f64::from(req.prompt_tokens),
            output_tokens: f64::from(req.output_estimate),
            gpu_seconds: self.pools[p].gpu_seconds_per_token
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

    /// Frees a slot for the head of `pool`'s queue by preempting one young
    /// batch request (see the module docs), and dispatches the head there.
    /// Only a request whose backend can take the head once the slot is
    /// free is a victim. The head is popped by tenant: the victim's refund
    /// may put its tenant first in discipline order.
    fn preempt_for_head(&mut self, now: Instant, pool: PoolId, out: &mut Vec<Decision>) -> bool {
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
        let threshold = self.preemption.migration_threshold;
        let victim = ps
            .preemptible
            .iter()
            .rev()
            .take_while(|(dispatched, _)| now.saturating_since(*dispatched) < threshold)
            .map(|&(_, id)| id)
            .find(|&id| {
                let Some(r) = self.requests.get(id) else {
                    return false;
                };
                let Phase::InFlight { backend, .. } = r.phase else {
                    return false;
                };
                let v = &self.tenants[r.tenant.0 as usize];
                let b = &self.backends[backend.0 as usize];
                v.priority == Priority::Batch
                    && !v.retired
                    && f64::from(ps.in_flight(r.tenant)) / v.weight > head_share
                    && b.healthy
                    && !b.retired
                    && b.in_flight <= b.window
                    && has_headroom(b, ps, now, self.stale_after)
            });
        let Some(id) = victim else {
            return false;
        };
        let deadline = now + self.max_wait;
        let Some(backend) = self.requeue(now, id, deadline) else {
            return false;
        };
        if let Some(r) = self.requests.get(id) {
            self.tenants[r.tenant.0 as usize].preempted_total += 1;
        }
        out.push(Decision::Preempt { id, backend });
        let requests = &self.requests;
        if let Some(next) = self.pools[pool.0 as usize]
            .queue
            .pop_from(head, |r| is_queued(requests, r))
        {
            self.dispatch(now, pool, head, next, backend, out);
        }
        true
    }

    /// Fills `scratch` with the pool's backends that may take a request now:
    /// healthy, window not full, and with headroom. Headroom comes from a
    /// fresh reading (KV usage below the watermark, TTFT p99 within the
    /// threshold); without one, from the gateway's own observed TTFT, and a
    /// backend with nothing of ours in flight then always has headroom, so
    /// a slow observation is re-measured rather than kept forever.
    fn collect_candidates(&mut self, now: Instant, pool: PoolId) {
        self.scratch.clear();
        let ps = &self.pools[pool.0 as usize];
        for &bid in &ps.backends {
            let b = &self.backends[bid.0 as usize];
            if b.retired
                || !b.healthy
                || b.in_flight >= b.window
                || !has_headroom(b, ps, now, self.stale_after)
            {
                continue;
            }
            let fresh = b
                .reading
                .as_ref()
                .filter(|r| now.saturating_since(r.at) <= self.stale_after);
            self.scratch.push(Candidate {
                id: bid,
                in_flight: b.in_flight,
                waiting: fresh.and_then(|r| r.waiting).unwrap_or(0),
                window: b.window,
                kv_usage: fresh.and_then(|r| r.kv_usage),
            });
        }
    }
}

/// Whether `b` may take more work by its readings: KV under the pool's
/// watermark and TTFT p99 under its threshold (a fresh reading), or, with
/// none, the gateway's own observed TTFT under the threshold.
fn has_headroom(b: &BackendState, ps: &PoolState, now: Instant, stale_after: Duration) -> bool {
    match b
        .reading
        .as_ref()
        .filter(|r| now.saturating_since(r.at) <= stale_after)
    {
        Some(r) => {
            !(r.kv_usage.is_some_and(|k| k >= ps.kv_high_watermark)
                || r.ttft_p99.is_some_and(|t| t > ps.ttft_p99_threshold))
        }
        None => !(b.in_flight > 0 && b.observed_ttft.is_some_and(|t| t > ps.ttft_p99_threshold)),
    }
}

fn reconfigured(old: Option<Bucket>, now: Instant, capacity: f64, rate: f64) -> Bucket {
    match old {
        Some(mut b) => {
            b.reconfigure(now, capacity, rate);
            b
        }
        None => Bucket::new(capacity, rate, now),
    }
}

fn is_queued(requests: &Slab, id: RequestId) -> bool {
    requests.get(id).is_some_and(|r| r.phase == Phase::Queued)
}

fn pool_capacity(backends: &[BackendState], pool: &PoolState) -> PoolCapacity {
    let mut kv = 0.0;
    let mut gpus = 0.0;
    for b in &pool.backends {
        let b = &backends[b.0 as usize];
        kv += b.kv_tokens as f64;
        gpus += f64::from(b.gpus);
    }
    PoolCapacity {
        kv_tokens: kv,
        gpus,
    }
}

#[cfg(test)]
mod tests;
