//! Read-only views of the scheduler's state, for metrics, admin views and
//! readiness.

use std::borrow::Cow;
use std::time::Duration;

use crate::core::admission::RateLimits;
use crate::core::ids::{BackendId, PoolId, TenantId};
use crate::core::prefix::IndexStats;
use crate::core::reading::Reading;
use crate::core::routing::Placement;
use crate::core::spec::{Priority, pool_key};
use crate::core::time::Instant;

use super::Scheduler;
use super::state::{TenantState, is_queued};

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
    /// Batch items it may run now by the batch lane's loop (`None`: no
    /// limit).
    pub batch_limit: Option<f64>,
    pub busy_gpu_seconds: f64,
    pub gpus: u32,
    /// Prompt tokens the prefix index predicted it held, over the requests
    /// sent to it (a counter).
    pub predicted_cached_tokens: u64,
    /// Prompt tokens it reported it found cached (a counter), and the
    /// prompt tokens of the requests that reported a count.
    pub reported_cached_tokens: u64,
    pub reported_prompt_tokens: u64,
}

/// A pool's prefix index, for metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefixView {
    pub index: IndexStats,
    /// Requests the prefix strategy placed, by how their backend relates
    /// to their prefix's homes (counters, `Placement::index`).
    pub placements: [u64; Placement::ALL.len()],
    /// Requests served out of discipline order for their cached prefix
    /// (a counter; `QueueSpec::locality`).
    pub local: u64,
}

/// What a cluster divides limits and windows by, read at one instant:
/// [`Scheduler::arrivals`], [`Scheduler::backlogs`] and
/// [`Scheduler::preemption_wants`], owned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Demand {
    /// Requests of each live tenant that arrived so far, by name.
    pub arrivals: Vec<(String, u64)>,
    /// (pool key, tenant, live, lower) for each tenant with a backlog.
    pub backlogs: Vec<(String, String, u32, u32)>,
    /// (pool key, interactive requests that could preempt batch work).
    pub wants: Vec<(String, u32)>,
}

impl Scheduler {
    /// Whether a pool has at least one healthy backend.
    pub fn pool_is_ready(&self, pool: PoolId) -> bool {
        self.pools[pool.0 as usize]
            .backends
            .iter()
            .any(|b| self.backends[b.0 as usize].healthy)
    }

    /// Requests the pool's healthy backends take at once (the sum of their
    /// dispatch windows, at most its apportioned slots in a cluster), and
    /// the requests it holds now (queued in either lane, and in flight):
    /// what a batch runner sizes its items by.
    pub fn pool_load(&self, pool: PoolId) -> (u32, u32) {
        let ps = &self.pools[pool.0 as usize];
        let mut capacity = 0;
        let mut in_flight = 0;
        for b in &ps.backends {
            let b = &self.backends[b.0 as usize];
            if b.healthy && !b.retired {
                capacity += b.window;
            }
            in_flight += b.in_flight;
        }
        let capacity = ps.slots.map_or(capacity, |s| capacity.min(s));
        let queued = u32::try_from(ps.queue.len() + ps.late.len()).unwrap_or(u32::MAX);
        (capacity, queued.saturating_add(in_flight))
    }

    /// A healthy backend of the pool, for calls that need any one of them
    /// and no scheduling (a model's metadata).
    pub fn healthy_backend(&self, pool: PoolId) -> Option<BackendId> {
        self.pools[pool.0 as usize]
            .backends
            .iter()
            .copied()
            .find(|b| self.backends[b.0 as usize].healthy)
    }

    /// Whether a backend is in service (not ejected).
    pub fn is_healthy(&self, backend: BackendId) -> bool {
        self.backends
            .get(backend.0 as usize)
            .is_some_and(|b| b.healthy)
    }

    /// Live pools.
    pub fn pools(&self) -> impl Iterator<Item = PoolId> + '_ {
        (0..self.pools.len())
            .filter(|i| !self.pools[*i].retired)
            .map(|i| PoolId(i as u32))
    }

    /// The cluster's [`Demand`] at `now`.
    pub fn demand(&self, now: Instant) -> Demand {
        Demand {
            arrivals: self.arrivals().map(|(t, n)| (t.to_owned(), n)).collect(),
            backlogs: self
                .backlogs()
                .map(|(m, t, live, lower)| (m.into_owned(), t.to_owned(), live, lower))
                .collect(),
            wants: self
                .preemption_wants(now)
                .map(|(m, n)| (m.into_owned(), n))
                .collect(),
        }
    }

    /// Requests of each live tenant that arrived so far (admitted or
    /// not), by name: the demand a cluster divides limits by.
    pub fn arrivals(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.tenants
            .iter()
            .filter(|t| !t.retired)
            .map(|t| (t.name.as_str(), t.arrivals_total))
    }

    /// Each live pool's backlog by tenant, as (pool key, tenant, live,
    /// lower), tenants with some only; the key is [`pool_key`]. `live`:
    /// requests in its fair queue plus those in flight outside the batch
    /// lane; `lower`: what waits behind live work (its late lane) plus
    /// the batch lane's in flight. What a cluster divides backend windows
    /// by, live work first.
    pub fn backlogs(&self) -> impl Iterator<Item = (Cow<'_, str>, &str, u32, u32)> + '_ {
        self.pools.iter().filter(|p| !p.retired).flat_map(move |p| {
            self.tenants.iter().enumerate().filter_map(move |(i, t)| {
                let id = TenantId(i as u32);
                let lower_in_flight = p.lower_in_flight(id);
                let live = p.queue.tenant_len(id) + p.in_flight(id) - lower_in_flight;
                let lower = p.late.tenant_len(id) + lower_in_flight;
                (live + lower > 0 && !t.retired)
                    .then(|| (pool_key(&p.model, p.api), t.name.as_str(), live, lower))
            })
        })
    }

    /// Each live pool's interactive requests that could preempt batch
    /// work now (preemption on, their tenant's oldest queued request has
    /// waited `min_wait`), as (pool key, count), pools with some only:
    /// what a replica asks the others to yield slots for.
    pub fn preemption_wants(&self, now: Instant) -> impl Iterator<Item = (Cow<'_, str>, u32)> + '_ {
        let enabled = self.preemption.enabled;
        let ripe = move |id| {
            self.requests
                .get(id)
                .is_some_and(|r| r.arrived + self.preemption.min_wait <= now)
        };
        self.pools
            .iter()
            .filter(move |p| enabled && !p.retired)
            .filter_map(move |p| {
                let n: u32 = self
                    .tenants
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| t.priority == Priority::Interactive && !t.retired)
                    .map(|(i, _)| TenantId(i as u32))
                    .filter(|&t| {
                        p.queue
                            .tenant_head(t, |id| is_queued(&self.requests, id))
                            .is_some_and(ripe)
                    })
                    .map(|t| p.queue.tenant_len(t))
                    .sum();
                (n > 0).then(|| (pool_key(&p.model, p.api), n))
            })
    }

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

    /// Requests waiting in a pool: its fair queue and its late lane.
    pub fn queued_in_pool(&self, pool: PoolId) -> u32 {
        let p = &self.pools[pool.0 as usize];
        u32::try_from(p.queue.len() + p.late.len()).unwrap_or(u32::MAX)
    }

    /// Queued requests in a pool.
    pub fn queue_len(&self, pool: PoolId) -> usize {
        self.pools[pool.0 as usize].queue.len()
    }

    /// The fairness bound's terms in `pool` now
    /// ([`crate::core::queue::FairQueue::spread`]).
    pub fn fairness_spread(&self, pool: PoolId) -> Option<(f64, f64)> {
        self.pools.get(pool.0 as usize)?.queue.spread()
    }

    /// A tenant's buckets after its latest arrival (admitted or refused),
    /// for the `x-ratelimit-*` headers of the answer to it.
    pub fn rate_limits(&self, t: TenantId) -> RateLimits {
        self.tenants
            .get(t.0 as usize)
            .map(TenantState::rate_limits)
            .unwrap_or_default()
    }

    /// A tenant's requests in the pools' fair queues (not the late lanes).
    pub fn queued(&self, t: TenantId) -> u32 {
        self.pools.iter().map(|p| p.queue.tenant_len(t)).sum()
    }

    /// Requests the scheduler currently holds (queued or in flight).
    pub fn live_requests(&self) -> usize {
        self.requests.live
    }

    /// A tenant's state now.
    pub fn tenant_view(&mut self, now: Instant, t: TenantId) -> TenantView {
        let queued = self.queued(t);
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
            // Ejected by outlier detection counts as not healthy.
            healthy: s.is_available(now),
            reading: s.reading.clone().map(|r| {
                let fresh = now.saturating_since(r.at) <= stale_after;
                (r, fresh)
            }),
            observed_ttft: s.observed_ttft,
            batch_limit: s.lane.limit(),
            busy_gpu_seconds: s.clock.busy_gpu_seconds(now),
            gpus: s.gpus,
            predicted_cached_tokens: s.predicted_cached_tokens,
            reported_cached_tokens: s.reported_cached_tokens,
            reported_prompt_tokens: s.reported_prompt_tokens,
        }
    }

    /// The pool's prefix index, if it routes on prefixes.
    pub fn prefix_view(&self, pool: PoolId) -> Option<PrefixView> {
        let p = &self.pools[pool.0 as usize];
        p.prefix.as_ref().map(|ix| PrefixView {
            index: ix.stats(),
            placements: p.placements,
            local: p.local_dispatches,
        })
    }

    /// The pool's canonical prefix block, if it routes on prefixes: what
    /// an [`Arrival`](super::Arrival)'s `prefix` keys are cut by.
    pub fn prefix_block_tokens(&self, pool: PoolId) -> Option<u32> {
        let p = &self.pools[pool.0 as usize];
        p.prefix.as_ref().map(|_| p.prefix_spec.block_tokens)
    }
}
