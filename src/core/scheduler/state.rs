//! The scheduler's state: per tenant, per pool, per backend, and the slab
//! of live requests with their phase (queued or in flight).

use std::collections::BTreeSet;
use std::time::Duration;

use crate::core::accounting::GpuClock;
use crate::core::admission::{Bucket, BucketState, RateLimits};
use crate::core::ids::{AdapterId, BackendId, PoolId, RequestId, TenantId};
use crate::core::prefix::{Homes, PrefixIndex};
use crate::core::queue::FairQueue;
use crate::core::queue::cost::PoolCapacity;
use crate::core::reading::Reading;
use crate::core::routing::Placement;
use crate::core::spec::{
    Api, BackendSpec, Discipline, OnLate, OutlierSpec, PoolSpec, PrefixSpec, Priority, Strategy,
};
use crate::core::time::Instant;

#[derive(Debug)]
pub(super) struct TenantState {
    pub(super) name: String,
    pub(super) weight: f64,
    pub(super) priority: Priority,
    pub(super) max_concurrency: Option<u32>,
    /// In flight plus queued.
    pub(super) active: u32,
    pub(super) in_flight: u32,
    pub(super) rate: Option<Bucket>,
    pub(super) gpu: Option<Bucket>,
    pub(super) gpu_seconds_total: f64,
    pub(super) preempted_total: u64,
    /// Requests that arrived, admitted or not: the tenant's demand here.
    pub(super) arrivals_total: u64,
    /// Estimated GPU-seconds of the requests that arrived, admitted or not.
    pub(super) gpu_asked_total: f64,
    /// GPU-seconds reserved by admitted requests that have not ended.
    pub(super) gpu_open: f64,
    /// `Some` while the tenant's limits are leased from a cluster store.
    pub(super) lease: Option<TenantLease>,
    pub(super) ttft_slo: Option<Duration>,
    pub(super) on_late: OnLate,
    /// Requests moved to a late lane (`OnLate::BestEffort`).
    pub(super) demoted_total: u64,
    /// What its requests produce, for their output estimates.
    pub(super) output: super::cost_model::OutputModel,
    pub(super) retired: bool,
}

/// Initial estimate of GPU-seconds per token, until completions measure it.
const INITIAL_GPU_SECONDS_PER_TOKEN: f64 = 5e-4;

/// A replica's side of a tenant's leases (see `Scheduler::lease_asks`).
#[derive(Debug, Default)]
pub(super) struct TenantLease {
    /// Slots of `max_concurrency` held.
    pub(super) slots: u32,
    /// Arrivals refused for want of a slot since the last ask.
    pub(super) slots_refused: u32,
    /// The last ask: when, and the demand counters then.
    pub(super) asked_at: Option<Instant>,
    pub(super) asked_arrivals: u64,
    pub(super) asked_gpu: f64,
    /// Demand per second (smoothed): requests, and estimated GPU-seconds.
    pub(super) requests_per_s: f64,
    pub(super) gpu_per_s: f64,
    /// The last arrival's GPU-seconds estimate (the least worth asking for).
    pub(super) last_estimate: f64,
    /// By limit (`LeaseKind::index`): other replicas were short at the
    /// last sync, so this one keeps no spare request's worth.
    pub(super) others_short: [bool; 3],
    /// By limit: the last ask sent, which an ask that would say the same
    /// is not sent again before its keepalive (see `Scheduler::lease_asks`).
    pub(super) sent: [Option<SentAsk>; 3],
    /// By limit: this replica held less than it wanted after the last
    /// grant.
    pub(super) short_here: [bool; 3],
    /// By limit: the store lists a replica short of it; ask at the next
    /// sync, to learn how short and give back what is spare.
    pub(super) short_elsewhere: [bool; 3],
}

/// What an ask told the store, and when.
#[derive(Clone, Copy, Debug)]
pub(super) struct SentAsk {
    pub(super) at: Instant,
    pub(super) replicas: u32,
    pub(super) level: f64,
    pub(super) open: f64,
    pub(super) want: f64,
}

impl TenantState {
    /// Its buckets as the `x-ratelimit-*` headers show them, as of their
    /// last check (an arrival's, which refilled them to its time).
    pub(super) fn rate_limits(&self) -> RateLimits {
        RateLimits {
            requests: self.rate.as_ref().map(BucketState::of),
            gpu_seconds: self.gpu.as_ref().map(BucketState::of),
        }
    }

    /// The concurrency cap in force here: the slots leased, or the policy's.
    pub(super) fn concurrency_cap(&self) -> Option<u32> {
        match &self.lease {
            Some(l) => self.max_concurrency.map(|_| l.slots),
            None => self.max_concurrency,
        }
    }
}

#[derive(Debug)]
pub(super) struct PoolState {
    pub(super) model: String,
    pub(super) api: Api,
    pub(super) strategy: Strategy,
    pub(super) kv_high_watermark: f64,
    pub(super) ttft_p99_threshold: Duration,
    pub(super) outlier: OutlierSpec,
    pub(super) adapter_affinity: bool,
    pub(super) queue: FairQueue,
    /// Requests that can no longer make their SLO, kept as best effort:
    /// dispatched only when `queue` is empty (`slo`).
    pub(super) late: FairQueue,
    /// Queue cost of each tenant's requests in `queue`, by tenant index.
    pub(super) queued_work: Vec<f64>,
    /// How fast the queue drains (`slo`).
    pub(super) drain: super::drain::DrainRate,
    /// By tenant index: the time up to which SLO refusals have been told
    /// to come back (`slo`), so that a burst's are spread out.
    pub(super) promised: Vec<Instant>,
    /// Moving average of dispatch to first token, as the gateway saw it.
    pub(super) service_ttft: Option<Duration>,
    pub(super) backends: Vec<BackendId>,
    /// In a cluster, the whole slots this replica may hold over the
    /// pool's backends at once ([`PoolSpec::slots`]).
    pub(super) slots: Option<u32>,
    /// In a cluster, while interactive work waits for a slot at another
    /// replica: the slots kept here ([`PoolSpec::yield_above`]).
    pub(super) yield_above: Option<u32>,
    pub(super) rr_cursor: usize,
    /// Running average of measured GPU-seconds per token (prompt + output),
    /// over all loads: admission's reservations, and the prior of
    /// `gpu_cost`.
    pub(super) gpu_seconds_per_token: f64,
    /// GPU-seconds per token by concurrency at dispatch: the fair queue's
    /// charge.
    pub(super) gpu_cost: super::cost_model::GpuCostModel,
    /// In-flight requests here, by tenant index.
    pub(super) in_flight: Vec<u32>,
    /// Of those, the batch lane's ([`Lane::Batch`], [`Lane::Resumable`]).
    pub(super) lower_in_flight: Vec<u32>,
    /// In-flight requests that may be preempted, by dispatch time.
    pub(super) preemptible: BTreeSet<(Instant, RequestId)>,
    /// When the current success-rate interval started.
    pub(super) rate_window_start: Option<Instant>,
    /// Which backend holds which prefix (strategies routing on prefixes
    /// only).
    pub(super) prefix: Option<PrefixIndex>,
    /// Where each prefix belongs (`Strategy::PrefixAware` only).
    pub(super) homes: Option<Homes>,
    pub(super) prefix_spec: PrefixSpec,
    /// Requests the prefix strategy placed, by how their backend relates
    /// to their prefix's homes (`Placement::index`).
    pub(super) placements: [u64; Placement::ALL.len()],
    /// Requests served out of discipline order for their cached prefix
    /// (`QueueSpec::locality`).
    pub(super) local_dispatches: u64,
    pub(super) retired: bool,
}

impl PoolState {
    /// A new pool of spec `pp`, its queues ordered by `discipline`.
    pub(super) fn new(pp: &PoolSpec, discipline: Discipline) -> Self {
        PoolState {
            model: pp.model.clone(),
            api: pp.api,
            strategy: pp.strategy,
            kv_high_watermark: pp.kv_high_watermark,
            ttft_p99_threshold: pp.ttft_p99_threshold,
            outlier: pp.outlier.clone(),
            adapter_affinity: pp.adapter_affinity,
            queue: FairQueue::new(discipline),
            late: FairQueue::new(discipline),
            queued_work: Vec::new(),
            promised: Vec::new(),
            drain: Default::default(),
            service_ttft: None,
            backends: Vec::new(),
            slots: pp.slots,
            yield_above: pp.yield_above,
            rr_cursor: 0,
            gpu_seconds_per_token: INITIAL_GPU_SECONDS_PER_TOKEN,
            gpu_cost: Default::default(),
            in_flight: Vec::new(),
            lower_in_flight: Vec::new(),
            preemptible: BTreeSet::new(),
            rate_window_start: None,
            prefix: None,
            homes: None,
            prefix_spec: pp.prefix,
            placements: [0; Placement::ALL.len()],
            local_dispatches: 0,
            retired: false,
        }
        .with_prefix(pp.strategy, pp.prefix)
    }

    /// Keeps a prefix index under a strategy that routes on prefixes (a new one if
    /// the block size changed: its keys would mean other blocks), none
    /// otherwise.
    pub(super) fn with_prefix(mut self, strategy: Strategy, spec: PrefixSpec) -> Self {
        self.set_prefix(strategy, spec);
        self
    }

    pub(super) fn set_prefix(&mut self, strategy: Strategy, spec: PrefixSpec) {
        let keep = strategy.routes_on_prefixes()
            && self.prefix.is_some()
            && self.prefix_spec.block_tokens == spec.block_tokens;
        self.prefix = match self.prefix.take() {
            Some(mut ix) if keep => {
                ix.reconfigure(spec.index_blocks, Some(spec.ttl));
                Some(ix)
            }
            _ if strategy.routes_on_prefixes() => {
                Some(PrefixIndex::new(spec.index_blocks, Some(spec.ttl)))
            }
            _ => None,
        };
        self.homes = match self.homes.take() {
            Some(mut h) if keep && strategy == Strategy::PrefixAware => {
                h.reconfigure(spec.index_blocks);
                Some(h)
            }
            _ if strategy == Strategy::PrefixAware => Some(Homes::new(spec.index_blocks)),
            _ => None,
        };
        self.prefix_spec = spec;
    }

    pub(super) fn in_flight(&self, t: TenantId) -> u32 {
        self.in_flight.get(t.0 as usize).copied().unwrap_or(0)
    }

    /// Slots the pool may still take here under its apportioned whole
    /// slots in a cluster ([`PoolSpec::slots`]); `u32::MAX` without.
    pub(super) fn slots_left(&self) -> u32 {
        self.slots
            .map_or(u32::MAX, |s| s.saturating_sub(self.in_flight_total()))
    }

    /// Requests in flight here, all tenants'.
    pub(super) fn in_flight_total(&self) -> u32 {
        self.in_flight.iter().sum()
    }

    /// `t`'s batch-lane requests in flight here.
    pub(super) fn lower_in_flight(&self, t: TenantId) -> u32 {
        self.lower_in_flight.get(t.0 as usize).copied().unwrap_or(0)
    }

    /// Counts a dispatch of `t`'s, in the batch lane if `lower`.
    pub(super) fn add_in_flight(&mut self, t: TenantId, lower: bool) {
        let i = t.0 as usize;
        for (count, yes) in [
            (&mut self.in_flight, true),
            (&mut self.lower_in_flight, lower),
        ] {
            if yes {
                if count.len() <= i {
                    count.resize(i + 1, 0);
                }
                count[i] += 1;
            }
        }
    }

    /// Uncounts one of `t`'s in-flight requests, in the batch lane if
    /// `lower`.
    pub(super) fn remove_in_flight(&mut self, t: TenantId, lower: bool) {
        let i = t.0 as usize;
        for (count, yes) in [
            (&mut self.in_flight, true),
            (&mut self.lower_in_flight, lower),
        ] {
            if let (Some(n), true) = (count.get_mut(i), yes) {
                *n = n.saturating_sub(1);
            }
        }
    }
}

#[derive(Debug)]
pub(super) struct BackendState {
    pub(super) name: String,
    pub(super) pool: PoolId,
    pub(super) gpus: u32,
    pub(super) kv_tokens: u64,
    pub(super) max_inflight: u32,
    /// This gateway's part of the engine's whole window (1 alone).
    pub(super) window_share: f64,
    pub(super) window: u32,
    pub(super) in_flight: u32,
    pub(super) healthy: bool,
    pub(super) reading: Option<Reading>,
    /// Moving average of the time to first token the gateway itself saw on
    /// streamed responses: the latency signal when no fresh reading has one.
    pub(super) observed_ttft: Option<Duration>,
    pub(super) clock: GpuClock,
    pub(super) retired: bool,
    /// Failed requests in a row (outlier detection).
    pub(super) failures: u32,
    /// Ejected by outlier detection until then.
    pub(super) ejected_until: Option<Instant>,
    /// Times ejected so far; the next ejection lasts this many times longer.
    pub(super) ejections: u32,
    /// Requests that succeeded and failed in the pool's current
    /// success-rate interval.
    pub(super) window_ok: u32,
    pub(super) window_failed: u32,
    /// GPU-seconds per token by concurrency on this backend (a slower GPU
    /// costs more per token than the pool's average).
    pub(super) gpu_cost: super::cost_model::GpuCostModel,
    /// The LoRA adapters it is known or believed to have loaded.
    pub(super) lora: super::adapters::LoraState,
    /// Uncached prompt tokens of the resumable batch items Fairway sent it
    /// (`QueueSpec::batch_prefill_ahead` paces them), counted until their
    /// first token.
    pub(super) batch_prefill: u64,
    /// Prompt tokens the prefix index predicted it held, over the
    /// requests sent to it.
    pub(super) predicted_cached_tokens: u64,
    /// Prompt tokens it reported it found cached (`cached_tokens` in
    /// usage), over the requests that reported them.
    pub(super) reported_cached_tokens: u64,
    /// Prompt tokens of those same requests: the hit rate's denominator.
    pub(super) reported_prompt_tokens: u64,
    /// Its engine's KV events are followed (a live subscription): what it
    /// holds is what it reported, and what Fairway sends it is a guess for
    /// [`PREFIX_GUESS`](super::prefix_events::PREFIX_GUESS) only.
    pub(super) prefix_events: bool,
    /// The batch lane's loop here (`lane_limit`).
    pub(super) lane: LaneLimit,
}

impl BackendState {
    /// A new backend of spec `bp` in pool `pool`, its GPU clock started
    /// at `now`.
    pub(super) fn new(bp: &BackendSpec, pool: PoolId, now: Instant) -> Self {
        BackendState {
            name: bp.name.clone(),
            pool,
            gpus: bp.gpus,
            kv_tokens: bp.kv_tokens,
            max_inflight: bp.max_inflight,
            window_share: bp.window_share,
            window: bp.max_inflight,
            in_flight: 0,
            healthy: true,
            reading: None,
            observed_ttft: None,
            clock: GpuClock::new(bp.gpus, now),
            retired: false,
            failures: 0,
            ejected_until: None,
            ejections: 0,
            window_ok: 0,
            window_failed: 0,
            gpu_cost: Default::default(),
            lora: Default::default(),
            batch_prefill: 0,
            predicted_cached_tokens: 0,
            reported_cached_tokens: 0,
            reported_prompt_tokens: 0,
            prefix_events: false,
            lane: LaneLimit::default(),
        }
    }

    /// A request's `prefill` tokens (`paced`: a resumable batch item's)
    /// are no longer waiting for the engine.
    pub(super) fn prefill_started(&mut self, prefill: u32, paced: bool) {
        if paced {
            self.batch_prefill = self.batch_prefill.saturating_sub(u64::from(prefill));
        }
    }

    /// Healthy by its probe and not ejected by outlier detection at `now`.
    pub(super) fn is_available(&self, now: Instant) -> bool {
        self.healthy && self.ejected_until.is_none_or(|t| t <= now)
    }
}

/// One backend's batch-lane loop (`lane_limit`).
#[derive(Debug, Clone, Default)]
pub(super) struct LaneLimit {
    /// Batch items in flight there.
    pub(super) batch_in_flight: u32,
    /// Batch items it may run; `None`: no limit (no baseline yet, or live
    /// traffic quiet).
    pub(super) limit: Option<f64>,
    /// Live TTFT without batch work beside, and over every live request
    /// lately (moving averages).
    pub(super) alone: Option<Duration>,
    pub(super) recent: Option<Duration>,
    pub(super) last_cut: Option<Instant>,
    pub(super) last_live: Option<Instant>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Phase {
    Queued,
    InFlight {
        backend: BackendId,
        mark: f64,
        dispatched: Instant,
        charged: f64,
        /// Its backend's concurrency class at dispatch (`cost_model`).
        class: u8,
        /// Its uncached prompt tokens until its response starts (a
        /// resumable batch item's until its first token, counted in its
        /// backend's `batch_prefill` until then), then 0.
        prefill: u32,
        /// A resumable batch item: `prefill` counts in `batch_prefill` too.
        paced: bool,
        /// Its prompt tokens the prefix index predicted its backend held.
        cached: u32,
        /// Batch items were in flight at its backend when it went there.
        beside: bool,
    },
}

#[derive(Debug, Clone)]
pub(super) struct Req {
    pub(super) tenant: TenantId,
    pub(super) pool: PoolId,
    pub(super) prompt_tokens: u32,
    /// What the client asked for at most (`None`: no limit given).
    pub(super) max_tokens: Option<u32>,
    /// Completions asked for, at least 1.
    pub(super) choices: u32,
    pub(super) output_estimate: u32,
    pub(super) arrived: Instant,
    pub(super) deadline: Instant,
    pub(super) gpu_reserved: f64,
    pub(super) phase: Phase,
    /// In its pool's late lane rather than its fair queue.
    pub(super) late: bool,
    /// Its cost in the queue when it arrived (`slo`'s unit of work).
    pub(super) qcost: f64,
    /// When it can no longer make its SLO, if its tenant has one.
    pub(super) give_up: Option<Instant>,
    pub(super) adapter: Option<AdapterId>,
    /// Its prompt's block keys at the pool's `prefix_block_tokens`.
    pub(super) prefix: Box<[u64]>,
    /// An item of a batch in the batch lane (`Lane::Batch`,
    /// `Lane::Resumable`): in the late lane, preemptible.
    pub(super) batch: bool,
    /// A batch item that can resume (`Lane::Resumable`): preemptible after
    /// its response started too.
    pub(super) resumable: bool,
    /// Its response has started to reach the client.
    pub(super) started: bool,
    /// What of its GPU-seconds its tenant's budget is charged (less than
    /// 1 for a batch item under a discount).
    pub(super) gpu_factor: f64,
}

#[derive(Debug, Default)]
pub(super) struct Slab {
    pub(super) slots: Vec<(u32, Option<Req>)>,
    pub(super) free: Vec<u32>,
    pub(super) live: usize,
}

impl Slab {
    pub(super) fn insert(&mut self, req: Req) -> RequestId {
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
    pub(super) fn get(&self, id: RequestId) -> Option<&Req> {
        match self.slots.get(id.index()) {
            Some((g, Some(r))) if *g == id.generation() => Some(r),
            _ => None,
        }
    }
    pub(super) fn get_mut(&mut self, id: RequestId) -> Option<&mut Req> {
        match self.slots.get_mut(id.index()) {
            Some((g, Some(r))) if *g == id.generation() => Some(r),
            _ => None,
        }
    }
    pub(super) fn remove(&mut self, id: RequestId) -> Option<Req> {
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

/// Queued in its pool's fair queue.
pub(super) fn is_queued(requests: &Slab, id: RequestId) -> bool {
    requests
        .get(id)
        .is_some_and(|r| r.phase == Phase::Queued && !r.late)
}

/// Queued in its pool's late lane.
pub(super) fn is_late(requests: &Slab, id: RequestId) -> bool {
    requests
        .get(id)
        .is_some_and(|r| r.phase == Phase::Queued && r.late)
}

pub(super) fn pool_capacity(backends: &[BackendState], pool: &PoolState) -> PoolCapacity {
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
