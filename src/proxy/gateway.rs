//! The shared state of a running gateway: the live policy (swapped whole on
//! reload), the scheduler with its waiting requests behind one lock, the
//! upstream client and the metrics handle.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::clock::Clock;
use crate::config::{BackendTarget, Policy};
use crate::core::ids::{BackendId, PoolId, RequestId, TenantId};
use crate::core::scheduler::{Decision, EjectReason, Ejection, Scheduler};
use crate::core::spec::Api;
use crate::proxy::error::ApiError;
use crate::sim::backend::{SimBackend, SimHandle};
use crate::telemetry::metrics::{Metrics, Series};

/// The policy in force plus what is derived from it, swapped as one value.
#[derive(Debug)]
pub struct Live {
    pub policy: Arc<Policy>,
    /// SHA-256 of each API key → its tenant.
    pub keys: HashMap<[u8; 32], TenantId>,
    /// Tenant names → ids (for the trusted tenant header).
    pub tenant_names: HashMap<String, TenantId>,
    /// Per tenant id: index into `policy.tenants` (None for "default").
    pub tenant_policy: HashMap<TenantId, usize>,
    /// Model → its scheduler pools and index into `policy.pools`.
    pub pools: HashMap<String, ModelPools>,
    /// LoRA adapter → its base model, as the policy lists them.
    pub adapters: HashMap<String, String>,
    /// Backend id → `host:port` to connect to.
    pub addresses: HashMap<BackendId, crate::proxy::upstream::Address>,
    /// Backend id → its name (the access log's and spans' `backend`).
    pub backend_names: HashMap<BackendId, Arc<str>>,
    /// Backend id → the model's name on it, where it is not the pool's.
    pub served_models: HashMap<BackendId, String>,
    /// The tenant of every request when no tenants are declared.
    pub default_tenant: Option<TenantId>,
    /// Metric series by `[tenant][pool]`: `policy.tenants` by index, then
    /// "default" (undeclared tenants); `policy.pools` by index.
    pub series: Vec<Vec<Arc<Series>>>,
    /// Usage windows by tenant, indexed as `series`.
    pub usage: Vec<Arc<parking_lot::Mutex<crate::telemetry::usage::TenantWindows>>>,
    /// Hex SHA-256 of the policy file text, and when it was loaded (unix seconds).
    pub source_hash: String,
    pub loaded_at_unix: u64,
}

/// A model's scheduler pools, one per protocol its backends speak.
#[derive(Clone, Copy, Debug)]
pub struct ModelPools {
    /// Index into `policy.pools`.
    pub index: usize,
    pub openai: Option<PoolId>,
    pub triton: Option<PoolId>,
}

impl Live {
    /// The scheduler pool of `model`'s backends that speak `api`, and the
    /// model's index in `policy.pools`: 404 for a model the policy does
    /// not have, or does not serve over `api`.
    pub fn pool(&self, model: &str, api: Api) -> Result<(PoolId, usize), ApiError> {
        let models = self
            .pools
            .get(model)
            .ok_or_else(|| ApiError::UnknownModel(model.to_owned()))?;
        let pool = models
            .get(api)
            .ok_or_else(|| ApiError::NotServedOver(model.to_owned(), api))?;
        Ok((pool, models.index))
    }
}

impl ModelPools {
    /// The pool of the backends that speak `api`.
    pub fn get(&self, api: Api) -> Option<PoolId> {
        match api {
            Api::OpenAi => self.openai,
            Api::Triton => self.triton,
        }
    }
}

/// Scheduler plus the decision channel of every waiting request, under one
/// lock.
pub struct CoreState {
    pub sched: Scheduler,
    /// Where each request's next decisions go, removed when it ends.
    pub waiters: HashMap<RequestId, Waiter>,
    /// Tokens (prompt + completion) of served requests, by tenant id: the
    /// service that the fairness gauge compares.
    pub service: Vec<f64>,
    pub fairness: crate::core::fairness::FairnessMeter,
}

/// A request's decision channel.
#[derive(Debug)]
pub enum Waiter {
    /// A queued request that cannot be preempted waits for one decision.
    Once(oneshot::Sender<Decision>),
    /// A preemptible (batch) request's channel lives as long as it does:
    /// dispatch, preemption, dispatch again, or shed.
    Many(mpsc::UnboundedSender<Decision>),
}

impl CoreState {
    /// Hands decisions to their requests; returns the one for `me`.
    pub fn deliver(&mut self, decisions: Vec<Decision>, me: Option<RequestId>) -> Option<Decision> {
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
    pub fn deliver_and_register(
        &mut self,
        decisions: Vec<Decision>,
        me: RequestId,
        preemptible: bool,
    ) -> Pending {
        let ready = self.deliver(decisions, Some(me));
        let rx = if preemptible {
            let (tx, rx) = mpsc::unbounded_channel();
            self.waiters.insert(me, Waiter::Many(tx));
            Rx::Many(rx)
        } else if ready.is_none() {
            let (tx, rx) = oneshot::channel();
            self.waiters.insert(me, Waiter::Once(tx));
            Rx::Once(rx)
        } else {
            Rx::Done
        };
        Pending { ready, rx }
    }
}

/// A request's decisions: one already made, then those still to come.
#[derive(Debug)]
pub struct Pending {
    pub ready: Option<Decision>,
    rx: Rx,
}

#[derive(Debug)]
enum Rx {
    Done,
    Once(oneshot::Receiver<Decision>),
    Many(mpsc::UnboundedReceiver<Decision>),
}

impl Pending {
    /// Whether a `Preempt` has been sent and not yet read. Decisions are
    /// sent under the core lock, so under it this sees every one so far. A
    /// dispatch that came after the preemption is kept for `next`.
    pub fn preempted_already(&mut self) -> bool {
        let mut preempted = false;
        if let Rx::Many(rx) = &mut self.rx {
            while let Ok(d) = rx.try_recv() {
                match d {
                    Decision::Preempt { .. } => preempted = true,
                    other => self.ready = Some(other),
                }
            }
        }
        preempted
    }

    /// The next decision for the request; `None` when none can come (the
    /// scheduler dropped it, which would be a bug, or it had its one).
    pub async fn next(&mut self) -> Option<Decision> {
        if let Some(d) = self.ready.take() {
            return Some(d);
        }
        match &mut self.rx {
            Rx::Done => None,
            Rx::Once(rx) => {
                let d = rx.await.ok();
                self.rx = Rx::Done;
                d
            }
            Rx::Many(rx) => rx.recv().await,
        }
    }

    /// Whether `next` may still wait for a decision.
    pub fn is_waiting(&self) -> bool {
        self.ready.is_none() && !matches!(self.rx, Rx::Done)
    }
}

/// The client of the pollers, the trace exporter and the placement
/// service. (Requests go through [`crate::proxy::pool`].)
pub type UpstreamClient = Client<HttpConnector, crate::proxy::upstream::UpBody>;

/// A new client: keep-alive connections pooled per host, `TCP_NODELAY`,
/// 5 s to connect, as [`crate::proxy::pool`] does.
pub fn upstream_client() -> UpstreamClient {
    use crate::proxy::pool;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(pool::CONNECT_TIMEOUT));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(pool::IDLE_TIMEOUT)
        .pool_max_idle_per_host(pool::MAX_IDLE)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(connector)
}

/// The running gateway.
pub struct Gateway {
    pub clock: Clock,
    pub live: ArcSwap<Live>,
    pub core: Mutex<CoreState>,
    pub metrics: Metrics,
    /// The pollers' and the trace exporter's client.
    pub client: UpstreamClient,
    /// Wakes the deadline task when a request is queued.
    pub wake: Notify,
    pub draining: AtomicBool,
    /// `host:port` of sim backends started in-process, by backend name.
    pub sim_authorities: Mutex<HashMap<String, String>>,
    /// Handles of those sim backends (dropping one stops it).
    pub sims: Mutex<Vec<(String, crate::sim::backend::SimHandle)>>,
    /// The policy file, for reloads.
    pub source: Mutex<PolicySource>,
    /// Serialises reloads.
    pub reload_lock: tokio::sync::Mutex<()>,
    /// TLS configuration of the client listener, re-read on reload.
    pub tls: arc_swap::ArcSwapOption<rustls::ServerConfig>,
    /// One poller task per backend.
    pub pollers: Mutex<crate::poller::Pollers>,
    /// The OTLP exporter, when traces are on.
    /// Traces, when `[telemetry] otlp_endpoint` names a collector.
    pub traces: Option<crate::telemetry::otel::Traces>,
    /// This replica's membership of a `[cluster]`; `None`: alone.
    pub cluster: Option<Arc<crate::cluster::Member>>,
    /// Which backend created each recent Responses API response.
    pub responses: crate::proxy::passthrough::ResponseOrigins,
    /// The LoRA adapters the backends list.
    pub adapters: crate::proxy::adapters::Discovered,
}

/// Builds the derived view of a policy against the scheduler's ids.
pub fn derive_live(
    policy: Arc<Policy>,
    sched: &Scheduler,
    metrics: &Metrics,
    sim: &HashMap<String, String>,
    source: &str,
    loaded_at_unix: u64,
) -> Live {
    let mut keys = HashMap::new();
    let mut tenant_names = HashMap::new();
    let mut tenant_policy = HashMap::new();
    for (i, t) in policy.tenants.iter().enumerate() {
        if let Some(id) = sched.tenant(&t.name) {
            tenant_names.insert(t.name.clone(), id);
            tenant_policy.insert(id, i);
            for d in &t.key_digests {
                keys.insert(*d, id);
            }
        }
    }
    let mut pools = HashMap::new();
    let mut adapters = HashMap::new();
    let mut addresses = HashMap::new();
    let mut served_models = HashMap::new();
    let mut backend_names = HashMap::new();
    for (i, p) in policy.pools.iter().enumerate() {
        pools.insert(
            p.model.clone(),
            ModelPools {
                index: i,
                openai: sched.pool_for(&p.model, Api::OpenAi),
                triton: sched.pool_for(&p.model, Api::Triton),
            },
        );
        for a in &p.adapters {
            adapters.insert(a.clone(), p.model.clone());
        }
        for b in &p.backends {
            let Some(bid) = sched.backend(&b.name) else {
                continue;
            };
            backend_names.insert(bid, Arc::from(sched.backend_name(bid)));
            let authority = match &b.target {
                BackendTarget::Url { authority } => Some(authority.clone()),
                BackendTarget::Sim { .. } => sim.get(&b.name).cloned(),
            };
            // (A URL's authority was checked when the policy was read.)
            if let Some(a) = authority.and_then(|a| crate::proxy::upstream::Address::parse(&a)) {
                addresses.insert(bid, a);
            }
            if let Some(m) = &b.served_model {
                served_models.insert(bid, m.clone());
            }
        }
    }
    let default_tenant = if policy.tenants.is_empty() {
        sched.tenant("default")
    } else {
        None
    };
    let series = policy
        .tenants
        .iter()
        .map(|t| t.name.as_str())
        .chain(["default"])
        .map(|t| {
            let pools = policy.pools.iter();
            pools.map(|p| metrics.series(t, &p.model)).collect()
        })
        .collect();
    let usage = policy
        .tenants
        .iter()
        .map(|t| t.name.as_str())
        .chain(["default"])
        .map(|t| metrics.usage(t))
        .collect();
    Live {
        policy,
        keys,
        series,
        usage,
        tenant_names,
        tenant_policy,
        pools,
        adapters,
        addresses,
        backend_names,
        served_models,
        default_tenant,
        source_hash: hex(&Sha256::digest(source.as_bytes())),
        loaded_at_unix,
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

impl Gateway {
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
        self.core
            .lock()
            .sched
            .healthy_backend(pool)
            .ok_or_else(|| ApiError::NoBackend(model.to_owned()))
    }

    /// Reports a failed request (5xx, connection error, header timeout, a
    /// stream cut) to outlier detection, and logs and counts the ejection
    /// it causes.
    pub fn backend_failed(&self, backend: BackendId) {
        let now = self.clock.now();
        let ejected = self
            .core
            .lock()
            .sched
            .on_backend_result(now, backend, false);
        if let Some(e) = ejected {
            self.report_ejection(now, e);
        }
    }

    /// Logs and counts an outlier ejection, and wakes the deadline task for
    /// its end.
    pub fn report_ejection(&self, now: crate::core::time::Instant, e: Ejection) {
        let name = self.core.lock().sched.backend_name(e.backend).to_owned();
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
    pub fn replica_spec(&self, policy: &Policy) -> crate::core::spec::SchedulerSpec {
        cluster_spec(policy, self.cluster.as_deref())
    }

    /// Hands the scheduler this replica's shares of the live policy (after
    /// the cluster's membership or demand changed).
    pub fn apply_cluster_share(&self) {
        let live = self.live.load();
        let spec = self.replica_spec(&live.policy);
        let now = self.clock.now();
        let mut core = self.core.lock();
        let decisions = core.sched.apply_policy(&spec, now);
        core.deliver(decisions, None);
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
        let core = self.core.lock();
        pools.iter().all(|p| core.sched.pool_is_ready(*p))
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}

/// Where the policy came from, for reloads.
#[derive(Clone, Debug, Default)]
pub struct PolicySource {
    /// The file to re-read on reload (`None`: the policy was given in memory).
    pub path: Option<PathBuf>,
    /// Its text (for the hash shown by `/admin/policy`).
    pub text: String,
}

/// Starts the in-process simulated backends a policy declares that are not
/// already running (`running` maps backend names to addresses).
pub async fn start_sims(
    policy: &Policy,
    running: &HashMap<String, String>,
) -> std::io::Result<Vec<(String, SimHandle)>> {
    let mut out = Vec::new();
    for pool in &policy.pools {
        for b in &pool.backends {
            if let BackendTarget::Sim { params } = &b.target {
                if running.contains_key(&b.name) {
                    continue;
                }
                // A Triton backend is simulated as Triton (TensorRT-LLM),
                // serving the model under its name there.
                let flavour = match b.protocol {
                    Api::Triton => crate::sim::backend::Flavour::TritonTrtllm,
                    Api::OpenAi => crate::sim::backend::Flavour::Vllm,
                };
                let name = b.served_model.clone().unwrap_or_else(|| pool.model.clone());
                let h = SimBackend::builder(name)
                    .engine(params.clone())
                    .flavour(flavour)
                    .start()
                    .await?;
                tracing::info!(backend = %b.name, addr = %h.addr(), "started simulated backend");
                out.push((b.name.clone(), h));
            }
        }
    }
    Ok(out)
}

/// [`Gateway::replica_spec`], for a gateway being built.
pub fn cluster_spec(
    policy: &Policy,
    cluster: Option<&crate::cluster::Member>,
) -> crate::core::spec::SchedulerSpec {
    let spec = policy.scheduler_spec();
    match cluster {
        None => spec,
        // Limits leased from the store while it answers; shared out by
        // demand from the last reading while it does not.
        Some(m) if m.store_up() => spec.leased(m.replicas(), |p| m.pool_share(p)),
        Some(m) => spec.shared_by(m.replicas(), |t| m.share(t), |p| m.pool_share(p)),
    }
}
