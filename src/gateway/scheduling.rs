//! The scheduler behind its one lock, with the decision channel of every
//! waiting request. Every acquisition of the lock is in this file: the
//! request path, the ticket's settle, the poller, the cluster sync, reload
//! and the views call its methods, each one critical section, never held
//! across an `.await` (STYLE.md §4). Decisions made under the lock are
//! sent under it, so a request that registers its channel in the same
//! section as its arrival cannot miss one.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;

use crate::core::admission::{LeaseAnswer, LeaseAsk, LeaseKind, RateLimits, Refusal};
use crate::core::fairness::FairnessMeter;
use crate::core::ids::{BackendId, PoolId, RequestId, TenantId, Usage};
use crate::core::prefix::homes::HomeChange;
use crate::core::reading::Reading;
use crate::core::scheduler::{
    Arrival, BackendView, Decision, Demand, Ejection, PlacedHome, PrefixEvent, PrefixView,
    Scheduler, TenantView,
};
use crate::core::spec::SchedulerSpec;
use crate::core::time::Instant;

mod pending;

pub use pending::Pending;
use pending::Waiter;

/// The scheduler and its waiting requests, behind one lock.
pub struct Scheduling {
    inner: Mutex<CoreState>,
}

/// What became of an arriving request.
#[derive(Debug)]
pub enum Arrived {
    /// Admitted: dispatched at once or queued.
    Admitted(Admitted),
    /// Every backend of its pool is ejected.
    PoolDown,
    /// Refused by admission.
    Refused { tenant: String, refusal: Refusal },
}

/// An admitted request's place in the scheduler.
#[derive(Debug)]
pub struct Admitted {
    pub id: RequestId,
    /// Its tenant's limits, for the `x-ratelimit-*` headers.
    pub limits: RateLimits,
    /// Whether the scheduler may preempt it (a batch tenant's).
    pub preemptible: bool,
    /// Its decisions: made already, or to come.
    pub pending: Pending,
}

/// How a request ends in the scheduler.
#[derive(Clone, Copy, Debug)]
pub struct Settle {
    pub id: RequestId,
    pub tenant: Option<TenantId>,
    /// The backend it was sent to last.
    pub backend: Option<BackendId>,
    /// Whether it was served (else it ends like a cancel).
    pub served: bool,
    pub usage: Option<Usage>,
    /// Dispatch to first byte of a streamed response, as the gateway saw
    /// it.
    pub ttft: Option<Duration>,
}

/// What settling a request gave.
#[derive(Clone, Debug, Default)]
pub struct Settled {
    /// GPU-seconds attributed to it, when it ended in the scheduler.
    pub gpu_seconds: Option<f64>,
    /// The ejection its success ended, if any.
    pub ejected: Option<Ejected>,
}

/// An outlier ejection, with its backend's name for the log and the
/// metric, read in the same critical section.
#[derive(Clone, Debug)]
pub struct Ejected {
    pub ejection: Ejection,
    pub backend: String,
}

/// The scheduler's state for the metrics scrape, read in one critical
/// section.
#[derive(Debug)]
pub struct SchedulerView {
    /// The tenants asked for, with their views.
    pub tenants: Vec<(TenantId, TenantView)>,
    /// Every backend, with its pool's model and whether the pool keeps a
    /// prefix index.
    pub backends: Vec<(BackendView, String, bool)>,
    /// Requests queued, by model.
    pub queued_by_model: Vec<(String, u32)>,
    /// Each prefix-routed pool's index and placements, by model.
    pub prefix: Vec<(String, PrefixView)>,
    /// The limits this replica holds leases of, with each one's level.
    pub leases: Vec<(String, LeaseKind, f64)>,
    /// The fairness gauge's last value.
    pub jain_index: Option<f64>,
}

impl Scheduling {
    /// `sched`, with no waiting requests yet.
    pub fn new(sched: Scheduler, fairness: FairnessMeter) -> Self {
        Scheduling {
            inner: Mutex::new(CoreState {
                sched,
                waiters: HashMap::new(),
                service: Vec::new(),
                fairness,
            }),
        }
    }

    /// Admission, then the fair queue and dispatch: the request either got
    /// its `Dispatch` at once or registers its channel for the decision
    /// that a later event makes. `adapter` is the LoRA adapter it names.
    pub fn arrive(&self, now: Instant, arrival: Arrival, adapter: Option<&str>) -> Arrived {
        let mut core = self.inner.lock();
        let arrival = Arrival {
            adapter: adapter.and_then(|a| core.sched.adapter(a)),
            ..arrival
        };
        if !core.sched.pool_is_ready(arrival.pool) {
            return Arrived::PoolDown;
        }
        let tenant = arrival.tenant;
        let lane = arrival.lane;
        match core.sched.on_arrival(now, arrival) {
            Err(refusal) => Arrived::Refused {
                tenant: core.sched.tenant_name(tenant).to_owned(),
                refusal,
            },
            Ok((id, decisions)) => {
                let limits = core.sched.rate_limits(tenant);
                let preemptible = core.sched.may_preempt_in(tenant, lane);
                let pending = core.deliver_and_register(decisions, id, preemptible);
                Arrived::Admitted(Admitted {
                    id,
                    limits,
                    preemptible,
                    pending,
                })
            }
        }
    }

    /// Whether a preemptible request whose response just started may keep
    /// it: not when a `Preempt` came first (it is then re-queued and waits
    /// for its next dispatch).
    pub fn response_started(&self, id: RequestId, pending: &mut Pending) -> bool {
        // Under the lock, which every decision is sent under.
        let mut core = self.inner.lock();
        !pending.preempted_already() && core.sched.on_response_started(id)
    }

    /// A connection to `backend` failed before the request was written:
    /// the first time, the request goes back to the head of its queue for
    /// another backend; the second time (`retried`), the backend is marked
    /// down and the request fails. `None` when it cannot go again.
    pub fn requeue(
        &self,
        now: Instant,
        id: RequestId,
        backend: BackendId,
        retried: bool,
        preemptible: bool,
    ) -> Option<Pending> {
        let mut core = self.inner.lock();
        if retried {
            core.sched.set_health(now, backend, false);
            return None;
        }
        let decisions = core.sched.redispatch(now, id)?;
        Some(core.deliver_and_register(decisions, id, preemptible))
    }

    /// Ends a request in the scheduler: a served one corrects its
    /// fair-queue charge with real usage and counts as a success for
    /// outlier detection; anything else ends like a cancel.
    pub fn settle(&self, now: Instant, s: Settle) -> Settled {
        let mut core = self.inner.lock();
        core.waiters.remove(&s.id);
        if let (Some(backend), Some(ttft)) = (s.backend, s.ttft) {
            core.sched.on_ttft(now, s.id, backend, ttft);
        }
        let mut ejected = None;
        if let (true, Some(backend)) = (s.served, s.backend) {
            // A success for outlier detection (failures are reported as
            // they happen, in the request path).
            let ejection = core.sched.on_backend_result(now, backend, true);
            ejected = core.ejected(ejection);
        }
        let (ended, decisions) = match (s.served, s.usage) {
            (true, usage @ Some(_)) => match core.sched.on_completion(now, s.id, usage) {
                Some((e, d)) => (Some(e), d),
                // Not in flight: preempted at the instant its response
                // ended, and queued again. It is done: out of the queue,
                // or a later dispatch would hold a slot no task ends.
                None => core.sched.on_cancel(now, s.id),
            },
            _ => core.sched.on_cancel(now, s.id),
        };
        if let (true, Some(u), Some(t)) = (s.served, s.usage, s.tenant) {
            let i = t.0 as usize;
            if core.service.len() <= i {
                core.service.resize(i + 1, 0.0);
            }
            core.service[i] += f64::from(u.prompt_tokens) + f64::from(u.completion_tokens);
        }
        core.deliver(decisions, None);
        Settled {
            gpu_seconds: ended.map(|e| e.gpu_seconds),
            ejected,
        }
    }

    /// A failed request of `backend` (5xx, connection error, header
    /// timeout, a stream cut), for outlier detection; the ejection it
    /// causes, if any.
    pub fn backend_failed(&self, now: Instant, backend: BackendId) -> Option<Ejected> {
        let mut core = self.inner.lock();
        let ejection = core.sched.on_backend_result(now, backend, false);
        core.ejected(ejection)
    }

    /// A poller's tick of backend `name`: its health, and its reading if
    /// one was decoded. Returns whether it was healthy before; `None` for a
    /// backend the scheduler does not know.
    pub fn on_poll(
        &self,
        now: Instant,
        name: &str,
        up: bool,
        reading: Option<Reading>,
    ) -> Option<bool> {
        let mut core = self.inner.lock();
        let id = core.sched.backend(name)?;
        let was_up = core.sched.is_healthy(id);
        let mut decisions = Vec::new();
        if was_up != up {
            decisions.extend(core.sched.set_health(now, id, up));
        }
        if let Some(reading) = reading {
            decisions.extend(core.sched.on_reading(now, id, reading));
        }
        core.deliver(decisions, None);
        Some(was_up)
    }

    /// Applies a new spec (new cluster shares).
    pub fn apply_spec(&self, now: Instant, spec: &SchedulerSpec) {
        self.reload(now, spec, |_| ());
    }

    /// Applies a reloaded spec, and hands `install` the scheduler, read
    /// only, in the same critical section: a reload derives its live view
    /// (the ids of tenants, pools and backends) from the new spec there
    /// and puts it in force, so that no request sees one without the
    /// other.
    pub fn reload<R>(
        &self,
        now: Instant,
        spec: &SchedulerSpec,
        install: impl FnOnce(&Scheduler) -> R,
    ) -> R {
        let mut core = self.inner.lock();
        let decisions = core.sched.apply_policy(spec, now);
        let out = install(&core.sched);
        core.deliver(decisions, None);
        out
    }

    /// A resumable batch item's first token came: its prefill is done, and
    /// batch items held back by their backends' prefill limit may go.
    pub fn first_token(&self, now: Instant, id: RequestId) {
        let mut core = self.inner.lock();
        let decisions = core.sched.on_first_token(now, id);
        core.deliver(decisions, None);
    }

    /// A streamed request's first token came `ttft` after its dispatch to
    /// `backend`: with the batch lane's loop on, its signal is fed then,
    /// not when the request ends (one critical section more per streamed
    /// request, only with the loop on).
    pub fn ttft(&self, now: Instant, id: RequestId, backend: BackendId, ttft: Duration) {
        self.inner.lock().sched.on_ttft(now, id, backend, ttft);
    }

    /// When the deadline task must next run [`on_tick`](Self::on_tick).
    pub fn next_wakeup(&self) -> Option<Instant> {
        self.inner.lock().sched.next_wakeup()
    }

    /// Sheds requests past their deadlines and preempts where the policy
    /// says; returns the backends whose outlier ejection ended.
    pub fn on_tick(&self, now: Instant) -> Vec<String> {
        let mut core = self.inner.lock();
        let decisions = core.sched.on_tick(now);
        core.deliver(decisions, None);
        let ended: Vec<BackendId> = core.sched.take_ejections_ended();
        ended
            .into_iter()
            .map(|b| core.sched.backend_name(b).to_owned())
            .collect()
    }

    /// One sample of the fairness gauge: each tenant's served tokens over
    /// its `weight`, and whether it is backlogged.
    pub fn sample_fairness(&self, now: Instant, weight: impl Fn(TenantId) -> f64) {
        let mut core = self.inner.lock();
        let ids: Vec<_> = core.sched.tenants().collect();
        let mut service = Vec::with_capacity(ids.len());
        let mut backlogged = Vec::with_capacity(ids.len());
        for t in ids {
            let tokens = core.service.get(t.0 as usize).copied().unwrap_or(0.0);
            service.push(tokens / weight(t));
            backlogged.push(core.sched.tenant_view(now, t).queued > 0);
        }
        core.fairness.sample(now, &service, &backlogged);
    }

    /// The state the metrics scrape shows: every tenant's view when
    /// `every_tenant`, else only those with work queued or in flight.
    pub fn view(&self, now: Instant, every_tenant: bool) -> SchedulerView {
        let mut core = self.inner.lock();
        let core = &mut *core;
        let s = &mut core.sched;
        let tenant_ids: Vec<_> = s.tenants().collect();
        let tenants = tenant_ids
            .into_iter()
            .map(|t| (t, s.tenant_view(now, t)))
            .filter(|(_, v)| every_tenant || v.queued > 0 || v.in_flight > 0)
            .collect();
        let backend_ids: Vec<_> = s.backends().collect();
        let backends = backend_ids
            .into_iter()
            .map(|b| {
                let v = s.backend_view(now, b);
                let (model, indexed) = (
                    s.pool_model(v.pool).to_owned(),
                    s.prefix_view(v.pool).is_some(),
                );
                (v, model, indexed)
            })
            .collect();
        let queued_by_model = s
            .pools()
            .map(|p| (s.pool_model(p).to_owned(), s.queued_in_pool(p)))
            .collect();
        let prefix = s
            .pools()
            .filter_map(|p| Some((s.pool_model(p).to_owned(), s.prefix_view(p)?)))
            .collect();
        SchedulerView {
            tenants,
            backends,
            queued_by_model,
            prefix,
            leases: leases(s),
            jain_index: core.fairness.last(),
        }
    }

    /// The limits this replica holds leases of, with each one's level.
    pub fn leases(&self) -> Vec<(String, LeaseKind, f64)> {
        leases(&self.inner.lock().sched)
    }

    /// The name of backend `b`.
    pub fn backend_name(&self, b: BackendId) -> String {
        self.inner.lock().sched.backend_name(b).to_owned()
    }

    /// The name of tenant `t`.
    pub fn tenant_name(&self, t: TenantId) -> String {
        self.inner.lock().sched.tenant_name(t).to_owned()
    }

    /// The names of backend `b` and tenant `t`.
    pub fn names(&self, b: BackendId, t: TenantId) -> (String, String) {
        let core = self.inner.lock();
        (
            core.sched.backend_name(b).to_owned(),
            core.sched.tenant_name(t).to_owned(),
        )
    }

    /// The tenant named `name`.
    pub fn tenant_id(&self, name: &str) -> Option<TenantId> {
        self.inner.lock().sched.tenant(name)
    }

    /// The backend named `backend`, when the tenant named `owner` is
    /// `tenant` (an origin read from the cluster's store).
    pub fn origin(&self, backend: &str, owner: &str, tenant: TenantId) -> Option<BackendId> {
        let core = self.inner.lock();
        (core.sched.tenant(owner) == Some(tenant))
            .then(|| core.sched.backend(backend))
            .flatten()
    }

    /// A backend of `pool` that may take a request now.
    pub fn healthy_backend(&self, pool: PoolId) -> Option<BackendId> {
        self.inner.lock().sched.healthy_backend(pool)
    }

    /// Whether every pool of `pools` has a backend that may take requests.
    pub fn pools_ready(&self, pools: &[PoolId]) -> bool {
        let core = self.inner.lock();
        pools.iter().all(|p| core.sched.pool_is_ready(*p))
    }

    /// The models of the pools with no backend that may take requests.
    pub fn unready_models(&self) -> Vec<String> {
        let core = self.inner.lock();
        core.sched
            .pools()
            .filter(|p| !core.sched.pool_is_ready(*p))
            .map(|p| core.sched.pool_model(p).to_owned())
            .collect()
    }

    /// Tenant `t`'s numbers now.
    pub fn tenant_view(&self, now: Instant, t: TenantId) -> TenantView {
        self.inner.lock().sched.tenant_view(now, t)
    }

    /// `pool`'s slots and the requests holding them.
    pub fn pool_load(&self, pool: PoolId) -> (u32, u32) {
        self.inner.lock().sched.pool_load(pool)
    }

    /// Prefix-cache events of backend `name` (and whether its events are
    /// followed at all), for the pool's index.
    pub fn on_prefix_events(
        &self,
        now: Instant,
        name: &str,
        followed: bool,
        events: &[PrefixEvent],
    ) {
        let mut core = self.inner.lock();
        let Some(b) = core.sched.backend(name) else {
            return;
        };
        core.sched.set_prefix_events(b, followed);
        for e in events {
            core.sched.on_prefix_event(now, b, e);
        }
    }

    /// The homes given new prefixes since the last call, for the cluster.
    pub fn placed_homes(&self) -> Vec<PlacedHome> {
        self.inner.lock().sched.placed_homes()
    }

    /// What the cluster decided of the prefixes' homes.
    pub fn homes_changed(&self, now: Instant, changes: &[HomeChange]) {
        self.inner.lock().sched.homes_changed(now, changes);
    }

    /// The demand to publish to the cluster, and (when `replicas` is
    /// `Some`, the store being up) the leases to ask it for, `ahead` of
    /// their need.
    pub fn demand(
        &self,
        now: Instant,
        ahead: Duration,
        replicas: Option<u32>,
    ) -> (Demand, Vec<LeaseAsk>) {
        let mut core = self.inner.lock();
        let demand = core.sched.demand(now);
        let asks = replicas.map_or_else(Vec::new, |n| core.sched.lease_asks(now, ahead, n));
        (demand, asks)
    }

    /// The store's answers to `asks`; the limits some replica is short of;
    /// and whether every lease must be asked for again.
    pub fn leases_answered(
        &self,
        asks: &[LeaseAsk],
        answers: &[LeaseAnswer],
        short: &[(String, LeaseKind)],
        ask_all: bool,
    ) {
        let mut core = self.inner.lock();
        core.sched.lease_granted(asks, answers);
        core.sched
            .lease_short_elsewhere(short.iter().map(|(t, k)| (t.as_str(), *k)));
        if ask_all {
            core.sched.lease_ask_all();
        }
    }
}

/// The limits `sched` holds leases of, owned.
fn leases(sched: &Scheduler) -> Vec<(String, LeaseKind, f64)> {
    sched
        .leases()
        .into_iter()
        .map(|(t, k, level)| (t.to_owned(), k, level))
        .collect()
}

/// What the lock guards: the scheduler and the decision channel of every
/// waiting request, which must change together.
struct CoreState {
    sched: Scheduler,
    /// Where each request's next decisions go, removed when it ends.
    waiters: HashMap<RequestId, Waiter>,
    /// Tokens (prompt + completion) of served requests, by tenant id: the
    /// service that the fairness gauge compares.
    service: Vec<f64>,
    fairness: FairnessMeter,
}

impl CoreState {
    /// `ejection` with its backend's name.
    fn ejected(&self, ejection: Option<Ejection>) -> Option<Ejected> {
        ejection.map(|ejection| Ejected {
            backend: self.sched.backend_name(ejection.backend).to_owned(),
            ejection,
        })
    }

    /// Hands decisions to their requests; returns the one for `me`.
    fn deliver(&mut self, decisions: Vec<Decision>, me: Option<RequestId>) -> Option<Decision> {
        let mut mine = None;
        for d in decisions {
            let id = d.id();
            if Some(id) == me {
                mine = Some(d);
                continue;
            }
            // A closed channel means the client left; its ticket's drop
            // ends the request in the scheduler.
            match self.waiters.get(&id) {
                Some(Waiter::Many(tx)) => {
                    let last = matches!(d, Decision::Shed { .. });
                    let _ = tx.send(d);
                    if last {
                        self.waiters.remove(&id);
                    }
                }
                Some(Waiter::Once(_)) => {
                    if let Some(Waiter::Once(tx)) = self.waiters.remove(&id) {
                        let _ = tx.send(d);
                    }
                }
                None => {}
            }
        }
        mine
    }

    /// [`deliver`](Self::deliver), and registers `me`'s channel in the same
    /// critical section, so a decision made by another task in between
    /// cannot be lost. A request that cannot be preempted and was
    /// dispatched at once registers nothing.
    fn deliver_and_register(
        &mut self,
        decisions: Vec<Decision>,
        me: RequestId,
        preemptible: bool,
    ) -> Pending {
        let ready = self.deliver(decisions, Some(me));
        let (waiter, pending) = pending::channel(ready, preemptible);
        if let Some(w) = waiter {
            self.waiters.insert(me, w);
        }
        pending
    }
}
