//! The running gateway as the request path sees it: the live policy
//! (swapped whole on reload), the scheduler behind its lock, the metrics,
//! the client of the calls that need no queueing, the cluster membership
//! and the traces.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Notify;

use crate::clock::Clock;
use crate::cluster::Member;
use crate::config::Policy;
use crate::core::admission::{LeaseAnswer, LeaseAsk, LeaseKind};
use crate::core::ids::{BackendId, PoolId, TenantId};
use crate::core::reading::Reading;
use crate::core::scheduler::{Demand, EjectReason, PrefixEvent};
use crate::core::spec::{Api, SchedulerSpec};
use crate::core::time::Instant;
use crate::gateway::adapters::Discovered;
use crate::gateway::live_policy::Live;
use crate::gateway::origins::{ResponseOrigins, SharedOrigins};
use crate::gateway::scheduling::{Ejected, Scheduling};
use crate::gateway::usage_share::{
    EveryoneCache, LiveNumbers, SharedUsage, UsageSource, tenant_name,
};
use crate::net::client::Client;
use crate::protocol::error::ApiError;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::otel::Traces;

/// The running gateway: a handle the request path, the layers, the
/// pollers and the cluster sync share (`Arc<Gateway>`).
pub struct Gateway {
    clock: Clock,
    live: ArcSwap<Live>,
    sched: Scheduling,
    metrics: Metrics,
    /// The client of the calls that need no queueing (Triton's metadata).
    client: Client,
    /// Wakes the deadline task when a request is queued.
    wake: Notify,
    draining: AtomicBool,
    /// Traces, when `[telemetry] otlp_endpoint` names a collector.
    traces: Option<Traces>,
    /// This replica's membership of a `[cluster]`; `None`: alone.
    cluster: Option<Arc<Member>>,
    /// Which backend created each recent Responses API response.
    responses: ResponseOrigins,
    /// The cluster's copy of it, with a `[cluster]` store.
    shared_responses: Option<SharedOrigins>,
    /// The cluster's usage windows, with a `[cluster]` store.
    shared_usage: Option<Arc<SharedUsage>>,
    /// Every tenant's live numbers as the usage views last read them.
    everyone: EveryoneCache,
    /// The LoRA adapters the backends list.
    adapters: Discovered,
}

/// What a gateway is made of (see [`Gateway::new`]).
pub struct Parts {
    pub clock: Clock,
    pub live: Live,
    pub sched: Scheduling,
    pub metrics: Metrics,
    pub client: Client,
    pub traces: Option<Traces>,
    pub cluster: Option<Arc<Member>>,
}

impl Gateway {
    /// A gateway of `parts`, not draining, with no responses or adapters
    /// seen yet.
    pub fn new(parts: Parts) -> Self {
        let shared_responses = parts.live.policy.cluster.as_ref().and_then(|c| {
            SharedOrigins::connect(c)
                .inspect_err(
                    |e| tracing::warn!(error = %crate::fault::Chain(e), "responses are not shared"),
                )
                .ok()
        });
        let shared_usage = match (&parts.live.policy.cluster, &parts.cluster) {
            (Some(c), Some(m)) => SharedUsage::connect(c, &m.replica)
                .inspect_err(|e| tracing::warn!(error = %crate::fault::Chain(e), "usage windows are not shared"))
                .ok()
                .map(Arc::new),
            _ => None,
        };
        Gateway {
            clock: parts.clock,
            live: ArcSwap::from_pointee(parts.live),
            sched: parts.sched,
            metrics: parts.metrics,
            client: parts.client,
            wake: Notify::new(),
            draining: AtomicBool::new(false),
            traces: parts.traces,
            cluster: parts.cluster,
            responses: ResponseOrigins::default(),
            shared_responses,
            shared_usage,
            everyone: EveryoneCache::default(),
            adapters: Discovered::default(),
        }
    }

    /// Now, on the gateway's clock.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// The gateway's clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The policy in force and what is derived from it; a request loads it
    /// once and keeps it to its end.
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Puts a new live view in force (a reload).
    pub fn set_live(&self, live: Arc<Live>) {
        self.live.store(live);
    }

    /// The scheduler, behind its lock.
    pub fn sched(&self) -> &Scheduling {
        &self.sched
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The client of the calls that need no queueing.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Traces, when on.
    pub fn traces(&self) -> Option<&Traces> {
        self.traces.as_ref()
    }

    /// This replica's cluster membership, when in a `[cluster]`.
    pub fn cluster(&self) -> Option<&Arc<Member>> {
        self.cluster.as_ref()
    }

    /// The cluster's usage windows, when in a `[cluster]`.
    pub fn shared_usage(&self) -> Option<&Arc<SharedUsage>> {
        self.shared_usage.as_ref()
    }

    /// Every tenant's live numbers as the usage views last read them.
    pub fn everyone(&self) -> &EveryoneCache {
        &self.everyone
    }

    /// Notes that `backend` created Responses API response `id` for
    /// `tenant`: here, and in the cluster's store when there is one.
    pub fn response_created(&self, id: &str, backend: BackendId, tenant: TenantId) {
        self.responses.remember(self.now(), id, backend, tenant);
        if let Some(shared) = &self.shared_responses {
            let (b, t) = self.sched.names(backend, tenant);
            shared.remember(id, &b, &t);
        }
    }

    /// The backend that created response `id` for `tenant`: as this
    /// replica remembers it, else as the cluster's store does.
    pub async fn response_origin(&self, id: &str, tenant: TenantId) -> Option<BackendId> {
        if let Some(b) = self.responses.find(self.now(), id, tenant) {
            return Some(b);
        }
        let (backend, owner) = self.shared_responses.as_ref()?.find(id).await?;
        self.sched.origin(&backend, &owner, tenant)
    }

    /// The LoRA adapters the backends list.
    pub fn adapters(&self) -> &Discovered {
        &self.adapters
    }

    /// Wakes the deadline task (a request was queued, or a deadline moved).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Resolves at the next [`wake`](Self::wake).
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Begins shutdown: new requests are refused from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// The pool of `model` over `api` as [`Live::pool`] finds it, where
    /// `model` may also be a LoRA adapter (one the policy lists, or one a
    /// backend lists) on the OpenAI API: then its base model's pool, and
    /// `true`. An adapter `tenant` may not call is as unknown to it as a
    /// model the policy does not have.
    pub fn model_pool(
        &self,
        live: &Live,
        model: &str,
        api: Api,
        tenant: Option<TenantId>,
    ) -> Result<(PoolId, usize, bool), ApiError> {
        if live.pools.contains_key(model) {
            return live.pool(model, api).map(|(p, i)| (p, i, false));
        }
        let unknown = || ApiError::UnknownModel(model.to_owned());
        if api != Api::OpenAi {
            // Triton names a model in the path, which is rewritten for
            // the backend: adapters go by the OpenAI routes.
            return Err(unknown());
        }
        let base = live
            .adapters
            .get(model)
            .cloned()
            .or_else(|| self.adapters.base_of(model))
            .ok_or_else(unknown)?;
        let allowed = tenant
            .and_then(|t| live.tenant_policy.get(&t))
            .is_none_or(|&i| live.policy.tenants[i].may_use_adapter(model));
        if !allowed {
            return Err(unknown());
        }
        live.pool(&base, api)
            .map(|(p, i)| (p, i, true))
            .map_err(|_| unknown())
    }

    /// A healthy backend of `model`'s `api` pool, for calls that need no
    /// queueing (metadata, tokenizer routes): 404 for a model not served
    /// over `api`, 503 when none is healthy.
    pub fn healthy_backend(
        &self,
        live: &Live,
        model: &str,
        api: Api,
        tenant: Option<TenantId>,
    ) -> Result<BackendId, ApiError> {
        let (pool, _, _) = self.model_pool(live, model, api, tenant)?;
        self.sched
            .healthy_backend(pool)
            .ok_or_else(|| ApiError::NoBackend(model.to_owned()))
    }

    /// Reports a failed request (5xx, connection error, header timeout, a
    /// stream cut) to outlier detection, and logs and counts the ejection
    /// it causes.
    pub fn backend_failed(&self, backend: BackendId) {
        let now = self.clock.now();
        if let Some(e) = self.sched.backend_failed(now, backend) {
            self.report_ejection(now, e);
        }
    }

    /// Logs and counts an outlier ejection, and wakes the deadline task for
    /// its end.
    pub fn report_ejection(&self, now: Instant, ejected: Ejected) {
        let Ejected {
            ejection: e,
            backend: name,
        } = ejected;
        let secs = (e.until - now).as_secs_f64();
        match e.reason {
            EjectReason::ConsecutiveFailures(n) => tracing::warn!(
                backend = %name, ejected_for_s = secs, ejections = e.count, failures_in_a_row = n,
                "backend ejected: its requests failed in a row"
            ),
            EjectReason::SuccessRate { rate, rest } => tracing::warn!(
                backend = %name, ejected_for_s = secs, ejections = e.count,
                success_rate = rate, pool_success_rate = rest,
                "backend ejected: its success rate is far below the rest of its pool's"
            ),
        }
        self.metrics.record_ejection(&name);
        self.wake.notify_one();
    }

    /// The scheduler's spec for `policy` on this replica: the whole of it
    /// when alone, this replica's shares in a `[cluster]`.
    pub fn replica_spec(&self, policy: &Policy) -> SchedulerSpec {
        cluster_spec(policy, self.cluster.as_deref())
    }

    /// Hands the scheduler this replica's shares of the live policy (after
    /// the cluster's membership or demand changed).
    pub fn apply_cluster_share(&self) {
        let live = self.live.load();
        let spec = self.replica_spec(&live.policy);
        self.sched.apply_spec(self.clock.now(), &spec);
    }

    /// Triton's readiness: `model`'s Triton pool (or every Triton pool)
    /// has a backend that may take requests, and the gateway is not
    /// draining.
    pub fn triton_ready(&self, model: Option<&str>) -> bool {
        let live = self.live.load();
        let pools: Vec<PoolId> = live
            .pools
            .iter()
            .filter(|(m, _)| model.is_none_or(|want| want == m.as_str()))
            .filter_map(|(_, p)| p.triton)
            .collect();
        if self.is_draining() || (model.is_some() && pools.is_empty()) {
            return false;
        }
        self.sched.pools_ready(&pools)
    }
}

/// [`Gateway::replica_spec`], for a gateway being built.
pub fn cluster_spec(policy: &Policy, cluster: Option<&Member>) -> SchedulerSpec {
    let spec = policy.scheduler_spec();
    match cluster {
        None => spec,
        // Limits leased from the store while it answers; shared out by
        // demand from the last reading while it does not.
        Some(m) if m.store_up() => spec.leased(m.replicas(), |p| m.pool_share(p)),
        Some(m) => spec.shared_by(m.replicas(), |t| m.share(t), |p| m.pool_share(p)),
    }
}

impl UsageSource for Gateway {
    fn live(&self) -> Arc<Live> {
        Gateway::live(self)
    }

    fn numbers(&self, live: &Live, index: usize, now: f64) -> LiveNumbers {
        let name = tenant_name(live, index);
        let id = match live.tenant_names.get(name) {
            Some(id) => Some(*id),
            None if live.policy.tenants.is_empty() => live
                .default_tenant
                .or_else(|| self.sched.tenant_id("default")),
            None => None,
        };
        let clock_now = self.now();
        let view = id.map(|id| self.sched.tenant_view(clock_now, id));
        let hour = live.usage[index].lock().totals(now, 3600);
        LiveNumbers {
            at: now,
            in_flight: view.as_ref().map_or(0, |v| v.in_flight),
            queued: view.as_ref().map_or(0, |v| v.queued),
            preempted_total: view.as_ref().map_or(0, |v| v.preempted_total),
            rate_level: view.as_ref().and_then(|v| v.rate_level),
            gpu_seconds_level: view.as_ref().and_then(|v| v.gpu_seconds_level),
            requests_1h: hour.requests,
            gpu_seconds_1h: hour.gpu_seconds,
            served_1h: hour.served,
            goodput_1h: hour.goodput,
            refused_1h: hour.refused,
        }
    }
}

impl crate::poller::Sink for Gateway {
    fn on_poll(&self, name: &str, up: bool, reading: Option<Reading>) -> Option<bool> {
        self.sched.on_poll(self.clock.now(), name, up, reading)
    }

    fn on_adapters(&self, name: &str, model: &str, adapters: Vec<String>) {
        self.adapters.report(name, model, adapters);
    }

    fn forget(&self, name: &str) {
        self.adapters.forget(name);
    }

    fn on_kv_events(&self, name: &str, followed: bool, events: &[PrefixEvent]) {
        self.sched
            .on_prefix_events(self.clock.now(), name, followed, events);
    }
}

impl crate::cluster::Replica for Gateway {
    fn demand(&self, ahead: Duration, replicas: Option<u32>) -> (Instant, Demand, Vec<LeaseAsk>) {
        let now = self.clock.now();
        let (demand, asks) = self.sched.demand(now, ahead, replicas);
        (now, demand, asks)
    }

    fn leases_answered(
        &self,
        asks: &[LeaseAsk],
        answers: &[LeaseAnswer],
        short: &[(String, LeaseKind)],
        ask_all: bool,
    ) {
        self.sched.leases_answered(asks, answers, short, ask_all);
    }

    fn policy(&self) -> Arc<Policy> {
        self.live().policy.clone()
    }

    fn leases_changed(&self) {
        self.wake();
    }

    fn apply_share(&self) {
        self.apply_cluster_share();
    }

    fn placed_homes(&self) -> Vec<crate::core::scheduler::PlacedHome> {
        self.sched.placed_homes()
    }

    fn homes_changed(&self, changes: &[crate::core::prefix::homes::HomeChange]) {
        self.sched.homes_changed(self.clock.now(), changes);
    }
}
