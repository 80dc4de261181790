//! Tenants, pools and backends by name, and applying a new spec to them.

use crate::core::admission::Bucket;
use crate::core::ids::{BackendId, PoolId, RequestId, TenantId};
use crate::core::spec::{Api, OnLate, Priority, SchedulerSpec};
use crate::core::time::Instant;

use super::state::{BackendState, PoolState, TenantLease, TenantState, is_late, is_queued};
use super::{Decision, Scheduler};

impl Scheduler {
    /// Reconciles with a new spec by name: unchanged tenants, pools and
    /// backends keep their state; new ones start fresh; removed ones are
    /// retired (never routed to again; in-flight requests end normally).
    /// Requests queued in a removed pool are shed.
    pub fn apply_policy(&mut self, spec: &SchedulerSpec, now: Instant) -> Vec<Decision> {
        self.discipline = spec.queue.discipline;
        self.max_wait = spec.queue.max_wait;
        self.max_queued_per_tenant = spec.queue.max_queued_per_tenant;
        self.output_token_weight = spec.queue.output_token_weight;
        self.prefill_charge = spec.queue.prefill_charge;
        self.locality = spec.queue.locality;
        self.batch_reserve = spec.queue.batch_reserve;
        self.batch_prefill_ahead = spec.queue.batch_prefill_ahead;
        self.batch_latency_target = spec.queue.batch_latency_target;
        self.batch_gpu_discount = spec.queue.batch_gpu_discount;
        self.stale_after = spec.stale_after;
        self.preemption = spec.preemption.clone();
        self.apply_tenants(spec, now);
        self.apply_pools(spec, now);
        self.apply_queue_settings(spec);
        let mut out = Vec::new();
        self.shed_retired(now, &mut out);
        for p in 0..self.pools.len() {
            self.yield_slots(now, PoolId(p as u32), &mut out);
            self.try_dispatch(now, PoolId(p as u32), &mut out);
        }
        out
    }

    /// Tenants by name: kept, added, or retired; their buckets reconfigured
    /// keeping their levels, and their leases started or ended.
    fn apply_tenants(&mut self, spec: &SchedulerSpec, now: Instant) {
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
            t.ttft_slo = tp.ttft_slo;
            t.on_late = tp.on_late;
            let leased = tp.leased;
            t.rate = tp.rate.map(|rate| {
                let burst = tp.burst.unwrap_or(rate).max(1.0);
                reconfigured(t.rate.take(), now, burst, rate, leased)
            });
            t.gpu = tp.gpu_seconds_per_hour.map(|per_hour| {
                reconfigured(t.gpu.take(), now, per_hour, per_hour / 3600.0, leased)
            });
            match (&mut t.lease, leased) {
                (None, true) => {
                    // The slots in use are held: the store is told so at
                    // the next sync.
                    t.lease = Some(TenantLease {
                        slots: t.active,
                        ..TenantLease::default()
                    });
                }
                (Some(_), false) => t.lease = None,
                _ => {}
            }
        }
        if spec.tenants.is_empty() {
            // No tenants declared: auth is off and everyone is "default".
            let id = self.tenant_entry("default");
            self.tenants[id.0 as usize].retired = false;
        }
    }

    /// Pools and their backends by name: kept, added, moved or retired.
    fn apply_pools(&mut self, spec: &SchedulerSpec, now: Instant) {
        for p in &mut self.pools {
            p.retired = true;
        }
        for b in &mut self.backends {
            b.retired = true;
        }
        for pp in &spec.pools {
            let pid = *self
                .pool_by_model
                .entry((pp.model.clone(), pp.api))
                .or_insert_with(|| {
                    self.pools.push(PoolState::new(pp, spec.queue.discipline));
                    PoolId((self.pools.len() - 1) as u32)
                });
            let mut members = Vec::with_capacity(pp.backends.len());
            for bp in &pp.backends {
                let bid = *self
                    .backend_by_name
                    .entry(bp.name.clone())
                    .or_insert_with(|| {
                        self.backends.push(BackendState::new(bp, pid, now));
                        BackendId((self.backends.len() - 1) as u32)
                    });
                let b = &mut self.backends[bid.0 as usize];
                if b.pool != pid {
                    // Moved to another pool: keep accounting, reset routing state.
                    let old = &mut self.pools[b.pool.0 as usize];
                    if let Some(ix) = old.prefix.as_mut() {
                        ix.cleared(bid);
                    }
                    if let Some(h) = old.homes.as_mut() {
                        h.left(bid);
                    }
                    b.pool = pid;
                    b.reading = None;
                    b.lora = Default::default();
                }
                b.retired = false;
                b.gpus = bp.gpus;
                b.clock.set_gpus(now, bp.gpus);
                b.kv_tokens = bp.kv_tokens;
                b.max_inflight = bp.max_inflight;
                b.window_share = bp.window_share;
                b.window = b.window.clamp(1, bp.max_inflight);
                members.push(bid);
            }
            let p = &mut self.pools[pid.0 as usize];
            p.retired = false;
            p.strategy = pp.strategy;
            p.set_prefix(pp.strategy, pp.prefix);
            p.kv_high_watermark = pp.kv_high_watermark;
            p.ttft_p99_threshold = pp.ttft_p99_threshold;
            p.outlier = pp.outlier.clone();
            p.adapter_affinity = pp.adapter_affinity;
            p.backends = members;
            p.slots = pp.slots;
            p.yield_above = pp.yield_above;
            for a in &pp.adapters {
                self.adapters.intern(a);
            }
        }
    }

    /// Every pool's queues take the discipline, the in-flight credit and
    /// each tenant's weight and class.
    fn apply_queue_settings(&mut self, spec: &SchedulerSpec) {
        let requests = &self.requests;
        for p in &mut self.pools {
            p.queue
                .set_discipline(self.discipline, |id| is_queued(requests, id));
            p.late
                .set_discipline(self.discipline, |id| is_late(requests, id));
            p.queue.set_in_flight_credit(spec.queue.in_flight_credit);
            p.late.set_in_flight_credit(spec.queue.in_flight_credit);
            for (i, t) in self.tenants.iter().enumerate() {
                p.queue.set_tenant(TenantId(i as u32), t.weight, t.priority);
                p.late.set_tenant(TenantId(i as u32), t.weight, t.priority);
            }
        }
    }

    /// Sheds the queued requests of retired pools or tenants: they cannot
    /// be served.
    fn shed_retired(&mut self, now: Instant, out: &mut Vec<Decision>) {
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
            self.shed(now, id, out);
        }
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
            arrivals_total: 0,
            gpu_asked_total: 0.0,
            gpu_open: 0.0,
            lease: None,
            ttft_slo: None,
            on_late: OnLate::Serve,
            demoted_total: 0,
            output: Default::default(),
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

    /// The OpenAI-compatible pool serving `model`, if any.
    pub fn pool(&self, model: &str) -> Option<PoolId> {
        self.pool_for(model, Api::OpenAi)
    }

    /// The pool serving `model` over `api`, if any.
    pub fn pool_for(&self, model: &str, api: Api) -> Option<PoolId> {
        self.pool_by_model
            .get(&(model.to_owned(), api))
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
}

/// The bucket for a new spec, keeping the old one's level. A leased bucket
/// has no refill of its own (the store grants it leases) and starts empty.
fn reconfigured(
    old: Option<Bucket>,
    now: Instant,
    capacity: f64,
    rate: f64,
    leased: bool,
) -> Bucket {
    match (old, leased) {
        (Some(mut b), false) => {
            b.reconfigure(now, capacity, rate);
            b
        }
        (Some(mut b), true) => {
            b.reconfigure_leased(now, capacity, rate);
            b
        }
        (None, false) => Bucket::new(capacity, rate, now),
        (None, true) => Bucket::leased(capacity, rate, now),
    }
}
