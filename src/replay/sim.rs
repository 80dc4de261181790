//! The discrete-event simulation: the live scheduler against simulated
//! engines, on a simulated clock.
//!
//! The same [`Scheduler`] the proxy drives takes every arrival, reading,
//! completion and deadline tick here; each backend is the same
//! [`Engine`] that `fairway sim-backend` serves. What the proxy and the
//! poller do in I/O is done here in a few lines: a dispatch submits the
//! sequence to its backend's engine, a finished sequence is a completion
//! with its real usage, and every `[poller] interval` each backend's engine
//! state becomes a [`Reading`](crate::core::reading::Reading), with TTFT
//! and e2e p99 taken from the same histogram bounds and quantile code the
//! live poller uses.
//!
//! Events at one instant run in a fixed order (engines by backend id,
//! arrivals in file order, deadlines, readings), and every random choice
//! comes from the scheduler's seeded RNG, so a seed gives one result.
//!
//! A backend whose `time_scale` is not 1 runs its engine that much faster
//! than the gateway's clock, as the live simulated backend does.
//!
//! The loop and its state are here; the events of a step in `events`, the
//! cluster sync, readings, samples and the prefix counters in `periodic`,
//! closed-loop clients in `clients`.

mod clients;
mod events;
mod periodic;

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use crate::cluster::DemandMeter;
use crate::config::EngineParams;
use crate::config::{BackendTarget, MetricsDialect, Policy};
use crate::core::admission::{LeaseKind, SharedLimit};
use crate::core::fairness::BackloggedService;
use crate::core::ids::{BackendId, RequestId, TenantId};
use crate::core::scheduler::{Decision, Scheduler};
use crate::core::spec::PoolPart;
use crate::core::time::Instant;
use crate::replay::workload::WorkRequest;
use crate::sim::engine::{Engine, EngineEvent};

/// How a request of the workload ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Served,
    /// Refused at the edge or by admission; the string is the limit.
    Refused(&'static str),
    Shed,
    FailedUpstream,
}

/// What happened to one request.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestResult {
    pub outcome: Outcome,
    /// Seconds since the workload's start.
    pub arrived: f64,
    pub queue_wait: Option<f64>,
    /// As the client saw it: first token when streamed, else the whole response.
    pub ttft: Option<f64>,
    pub e2e: Option<f64>,
    /// Served within the tenant's SLO.
    pub good: bool,
}

/// A sample of the queue, per tenant, at one reading tick.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueSample {
    pub at: f64,
    /// Queued requests per tenant, in [`Trace::tenants`] order.
    pub queued: Vec<u32>,
}

/// Everything one run produced, for the report.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// Tenant names, by scheduler tenant id.
    pub tenants: Vec<String>,
    /// Each tenant's TTFT SLO in seconds (`None`: none declared), in
    /// [`Trace::tenants`] order.
    pub slo_ttft: Vec<Option<f64>>,
    /// Per workload request (same order), with its tenant's index.
    pub requests: Vec<(usize, RequestResult)>,
    pub queue: Vec<QueueSample>,
    /// Jain's index of backlogged tenants' weighted service, over the
    /// periods they were backlogged together ([`BackloggedService`]).
    pub jain: Option<f64>,
    /// By tenant index: service while backlogged with others over its
    /// weighted fair share of it ([`BackloggedService::shares`]).
    pub shares: Vec<Option<f64>>,
    /// Busy GPU-seconds over GPU-seconds available until the last response.
    pub utilisation: f64,
    /// From the first arrival to the last response, seconds.
    pub makespan: f64,
    /// Per served request with reported usage: (cost charged at dispatch,
    /// cost it settled to), in the discipline's cost unit.
    pub estimates: Vec<(f64, f64)>,
    /// The fairness bound's ratio: the largest gap between two backlogged
    /// tenants' counters over [`crate::core::queue::FairQueue::bound`]
    /// then (`None`: never two backlogged under `drf` or `wfq`).
    pub bound_ratio: Option<f64>,
    pub output_tokens: u64,
    /// Requests preempted (each time counted); `None` when not known (a
    /// live run seen from the client).
    pub preempted: Option<u64>,
    /// Generated tokens that preemptions threw away (generated again when
    /// the request ran again); `None` when not known.
    pub lost_tokens: Option<u64>,
    /// Continuations of batch items preempted mid-answer, sent from the
    /// tokens they had (`[batch] resume`); `None` when not known.
    pub resumed: Option<u64>,
    /// LoRA adapter loads on all engines; `None` when no request named an
    /// adapter (or not known).
    pub adapter_loads: Option<u64>,
    /// What the engines' prefix caches did; `None` when no request shared
    /// a prefix and no pool routed on them (or not known).
    pub prefix: Option<PrefixTrace>,
}

/// Prompt tokens over the run: looked up in the engines' prefix caches,
/// found there, predicted there by the gateways' prefix indexes, and
/// prefilled.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PrefixTrace {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub predicted_tokens: u64,
    pub prefill_tokens: u64,
    /// Requests served out of the fair queue's order for their cached
    /// prefix.
    pub local_dispatches: u64,
}

/// Options of one run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub seed: u64,
    /// Draw a progress line on a terminal's stderr.
    pub progress: Option<String>,
    /// Gateway replicas sharing the policy (1: one gateway, as before),
    /// and how requests are spread over them.
    pub replicas: u32,
    pub ingress: Ingress,
}

/// How a load balancer spreads requests over the replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Ingress {
    /// Request by request, in turn.
    #[default]
    Even,
    /// Three quarters to the first replica, the rest in turn to the others.
    Skewed,
    /// Each tenant's requests all to one replica (tenants in turn).
    PerTenant,
}

impl Ingress {
    /// The replica of the `i`th request, of tenant number `tenant`.
    fn replica(self, i: usize, tenant: usize, n: usize) -> usize {
        if n <= 1 {
            return 0;
        }
        match self {
            Ingress::Even => i % n,
            Ingress::Skewed if i % 4 != 3 => 0,
            Ingress::Skewed => 1 + (i / 4) % (n - 1),
            Ingress::PerTenant => tenant % n,
        }
    }
}

struct Backend {
    engine: Engine,
    /// Its KV events' feed into the prefix index (precise mode: a backend
    /// with `kv_events`), the pool's model, and the events' next sequence
    /// number.
    feed: Option<(crate::poller::kv_events::Feed, String, u64)>,
    scale: f64,
    polled: bool,
    ttft_window: Vec<f64>,
    e2e_window: Vec<f64>,
}

struct InFlight {
    replica: usize,
    req: RequestId,
    prompt: u32,
    /// Its prompt tokens the engine found cached (at admission).
    cached: u32,
    backend: BackendId,
    dispatched: Instant,
    first: Option<Instant>,
    /// Weighted service counted for it so far: taken back if it is
    /// preempted, as recomputed work is not service.
    service: f64,
    /// Tokens it generated in this attempt.
    tokens: u32,
}

/// Runs `workload` under `policy`. Requests for a model no pool serves, or
/// (with tenants declared) from an unknown tenant, are refused as live.
pub fn run(policy: &Policy, workload: &[WorkRequest], opts: &RunOptions) -> Trace {
    Sim::new(policy, workload, opts).run(workload)
}

struct Sim<'p> {
    policy: &'p Policy,
    /// One scheduler per gateway replica (one without a cluster).
    scheds: Vec<Scheduler>,
    /// The replica each request of the workload arrives at.
    replica_of: Vec<usize>,
    /// What each replica publishes to the (simulated) store, and how often.
    meters: Vec<DemandMeter>,
    sync_every: Duration,
    lease_ahead: Duration,
    /// The store's side of every leased limit, by tenant and limit.
    limits: HashMap<(String, LeaseKind), SharedLimit>,
    /// Each replica's ledger of the prefixes' first homes, as the live
    /// sync keeps it (`crate::cluster::Ledger`).
    ledgers: Vec<crate::cluster::Ledger>,
    backends: Vec<Backend>,
    /// (Replica, scheduler request) → workload index.
    by_req: HashMap<(usize, RequestId), usize>,
    /// Workload index → in-flight state.
    flying: HashMap<usize, InFlight>,
    results: Vec<Option<RequestResult>>,
    arrived: Vec<Instant>,
    stream: Vec<bool>,
    /// Requests with a result.
    finished: usize,
    tenant_of: Vec<Option<TenantId>>,
    /// Cumulative tokens processed per tenant id, over its weight.
    service: Vec<f64>,
    weights: Vec<f64>,
    fairness: BackloggedService,
    /// By tenant index: whether it has requests queued, as last sampled.
    backlogged: Vec<bool>,
    queue: Vec<QueueSample>,
    pending: Vec<(usize, Decision)>,
    events: Vec<EngineEvent>,
    output_tokens: u64,
    preempted: u64,
    lost_tokens: u64,
    resumed: u64,
    /// Batch items resume when preempted mid-answer (`[batch] resume`,
    /// on without a `[batch]` section).
    resume: bool,
    /// Whether live TTFTs go to the scheduler at the first token (the
    /// batch lane's loop on), as the proxy feeds them.
    ttft_at_first: bool,
    /// Per workload request: tokens kept from attempts before its current
    /// one (a resumed batch item's).
    kept: Vec<u32>,
    /// Per workload request: its pool, once it arrived.
    pool_of: Vec<Option<crate::core::ids::PoolId>>,
    estimates: Vec<(f64, f64)>,
    /// The largest gap between backlogged tenants' counters seen, over the
    /// fair queue's bound then (the fairness bound's ratio).
    bound_ratio: Option<f64>,
    last_end: Instant,
    progress: Option<String>,
    /// Per workload request: the LoRA adapter it names (engine id), and
    /// the adapters' names by id.
    adapter_of: Vec<Option<u32>>,
    adapter_names: Vec<String>,
    /// Some request of the workload shares a prefix segment.
    shares_prefixes: bool,
    /// Closed-loop clients' requests, each sent when the one before ends.
    clients: clients::Clients,
}

impl<'p> Sim<'p> {
    fn new(policy: &'p Policy, workload: &[WorkRequest], opts: &RunOptions) -> Self {
        let n = opts.replicas.max(1);
        let spec = if n > 1 {
            let even = PoolPart::share(1.0 / f64::from(n));
            policy.scheduler_spec().leased(n, |_| even)
        } else {
            policy.scheduler_spec()
        };
        let mut scheds: Vec<Scheduler> = (0..u64::from(n))
            .map(|r| Scheduler::new(&spec, Instant::ZERO, opts.seed.wrapping_add(r)))
            .collect();
        if n > 1 {
            scheds.iter_mut().for_each(Scheduler::share_homes);
        }
        let mut backends = Vec::new();
        let ids: Vec<BackendId> = scheds[0].backends().collect();
        for b in ids {
            let name = scheds[0].backend_name(b);
            let (pool, bp) = policy
                .pools
                .iter()
                .flat_map(|p| p.backends.iter().map(move |x| (Some(p), x)))
                .find(|(_, x)| x.name == name)
                .map_or((None, None), |(p, x)| (p, Some(x)));
            let params = match bp.map(|x| &x.target) {
                Some(BackendTarget::Sim { params }) => params.clone(),
                _ => EngineParams::default(),
            };
            let scale = if params.time_scale.is_finite() && params.time_scale > 0.0 {
                params.time_scale
            } else {
                1.0
            };
            let mut engine = Engine::new(params);
            // Precise mode: the engine's cache changes reach the index as
            // its events would, with no delay.
            let feed = match (pool, bp) {
                (Some(p), Some(x)) if x.kv_events.is_some() && p.routing.routes_on_prefixes() => {
                    engine.record_cache_changes();
                    for s in &mut scheds {
                        s.set_prefix_events(b, true);
                    }
                    let f = crate::poller::kv_events::Feed::new(
                        &p.model,
                        p.prefix.block_tokens,
                        p.prefix.index_blocks,
                    );
                    Some((f, p.model.clone(), 0))
                }
                _ => None,
            };
            backends.push(Backend {
                engine,
                feed,
                scale,
                polled: bp.is_some_and(|x| x.metrics != MetricsDialect::None),
                ttft_window: Vec::new(),
                e2e_window: Vec::new(),
            });
        }
        let sched = &scheds[0];
        let n_tenants = sched.tenants().count();
        let mut weights = vec![1.0; n_tenants];
        for t in &policy.tenants {
            if let Some(id) = sched.tenant(&t.name) {
                weights[id.0 as usize] = t.weight;
            }
        }
        let tenant_of = workload
            .iter()
            .map(|w| {
                if policy.tenants.is_empty() {
                    sched.tenant("default")
                } else {
                    sched.tenant(&w.tenant)
                }
            })
            .collect();
        let tenant_index = |w: &WorkRequest| {
            policy
                .tenants
                .iter()
                .position(|t| t.name == w.tenant)
                .unwrap_or(0)
        };
        let replica_of = workload
            .iter()
            .enumerate()
            .map(|(i, w)| opts.ingress.replica(i, tenant_index(w), n as usize))
            .collect();
        // A model that is a pool's adapter: its name, as the engines know it.
        let mut adapter_names: Vec<String> = Vec::new();
        let adapter_of = workload
            .iter()
            .map(|w| {
                policy
                    .pools
                    .iter()
                    .find(|p| p.adapters.contains(&w.model))?;
                let id = match adapter_names.iter().position(|a| *a == w.model) {
                    Some(i) => i,
                    None => {
                        adapter_names.push(w.model.clone());
                        adapter_names.len() - 1
                    }
                };
                Some(id as u32)
            })
            .collect();
        let sync_every = policy.cluster.as_ref().map(|c| c.sync_interval);
        let sync_every = sync_every.unwrap_or(Duration::from_secs(1));
        Sim {
            policy,
            meters: (0..n).map(|_| DemandMeter::new(sync_every)).collect(),
            sync_every,
            lease_ahead: policy
                .cluster
                .as_ref()
                .map_or(Duration::from_secs(2), |c| c.lease_ahead),
            limits: HashMap::new(),
            ledgers: (0..n).map(|_| crate::cluster::Ledger::default()).collect(),
            replica_of,
            scheds,
            backends,
            by_req: HashMap::new(),
            flying: HashMap::new(),
            results: vec![None; workload.len()],
            arrived: vec![Instant::ZERO; workload.len()],
            stream: workload.iter().map(|w| w.stream).collect(),
            finished: 0,
            tenant_of,
            service: vec![0.0; n_tenants],
            weights,
            fairness: BackloggedService::default(),
            backlogged: vec![false; n_tenants],
            queue: Vec::new(),
            pending: Vec::new(),
            events: Vec::new(),
            output_tokens: 0,
            estimates: Vec::new(),
            bound_ratio: None,
            preempted: 0,
            lost_tokens: 0,
            resumed: 0,
            resume: policy.batch.as_ref().is_none_or(|b| b.resume),
            ttft_at_first: policy
                .batch
                .as_ref()
                .is_some_and(|b| b.live_latency_target > 0.0),
            kept: vec![0; workload.len()],
            pool_of: vec![None; workload.len()],
            last_end: Instant::ZERO,
            progress: opts
                .progress
                .clone()
                .filter(|_| std::io::stderr().is_terminal()),
            adapter_of,
            adapter_names,
            shares_prefixes: workload.iter().any(|w| !w.prefix.is_empty()),
            clients: clients::Clients::new(workload),
        }
    }

    fn run(mut self, workload: &[WorkRequest]) -> Trace {
        let interval = self.policy.poller.interval;
        let mut next_arrival = 0;
        let mut next_poll = Instant::ZERO + interval;
        let replicated = self.scheds.len() > 1;
        if replicated {
            // The replicas' first leases, before the first request.
            self.sync(Instant::ZERO);
        }
        let mut next_sync = replicated.then(|| Instant::ZERO + self.sync_every);
        let mut shown = usize::MAX;
        loop {
            let arrival_at = workload
                .get(next_arrival)
                .map(|w| Instant::from_secs_f64(w.t));
            let released_at = self.clients.next_at();
            let busy = arrival_at.is_some()
                || released_at.is_some()
                || self.scheds.iter().any(|s| s.live_requests() > 0);
            if !busy {
                break;
            }
            let engine_at = self
                .backends
                .iter()
                .filter_map(|b| b.engine.next_event_at().map(|e| to_gateway(e, b.scale)))
                .min();
            let wakeup = self.scheds.iter().filter_map(Scheduler::next_wakeup).min();
            let now = [
                arrival_at,
                released_at,
                engine_at,
                wakeup,
                Some(next_poll),
                next_sync,
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(next_poll);

            // 1. Engines, in backend order.
            for i in 0..self.backends.len() {
                let due = self.backends[i]
                    .engine
                    .next_event_at()
                    .is_some_and(|e| to_gateway(e, self.backends[i].scale) <= now);
                if due {
                    self.advance_engine(i, now, workload);
                }
            }
            // 2. Arrivals at or before now, in workload order.
            while let Some(w) = workload.get(next_arrival) {
                if Instant::from_secs_f64(w.t) > now {
                    break;
                }
                // A closed-loop client's later requests come when its
                // previous one ends (`clients`).
                if !self.clients.waits(next_arrival) {
                    self.arrive(now, next_arrival, w);
                }
                next_arrival += 1;
            }
            while let Some(i) = self.clients.due(now) {
                self.arrive(now, i, &workload[i]);
            }
            // 3. Deadlines.
            for r in 0..self.scheds.len() {
                if self.scheds[r].next_wakeup().is_some_and(|t| t <= now) {
                    let d = self.scheds[r].on_tick(now);
                    self.pending.extend(d.into_iter().map(|d| (r, d)));
                }
            }
            // 3b. The replicas' sync with the cluster store.
            if next_sync.is_some_and(|t| t <= now) {
                self.sync(now);
                next_sync = Some(now + self.sync_every);
            }
            // 4. Readings.
            if next_poll <= now {
                self.poll(now);
                next_poll = now + interval;
            }
            self.apply(now, workload);
            self.observe(now);

            if let Some(label) = &self.progress {
                let pct = self.finished * 100 / workload.len().max(1);
                if pct != shown {
                    shown = pct;
                    eprint!("\r{label}: {pct:>3}% of {} requests", workload.len());
                    let _ = std::io::stderr().flush();
                }
            }
        }
        if self.progress.is_some() {
            eprintln!();
        }
        self.finish(workload)
    }

    fn finish(mut self, workload: &[WorkRequest]) -> Trace {
        let end = self.last_end;
        let prefix = self.prefix_trace(end);
        let first = workload.first().map_or(0.0, |w| w.t);
        let makespan = (end.as_secs_f64() - first).max(1e-9);
        let (mut busy, mut gpus) = (0.0, 0.0);
        let mut scheds = self.scheds;
        let ids: Vec<BackendId> = scheds[0].backends().collect();
        for b in ids {
            // Each replica counts a backend busy while it has a request
            // there; their union is not known, so the sum is capped at
            // the whole run (an upper bound with several replicas).
            let mut backend_busy = 0.0;
            let mut backend_gpus = 0.0;
            for s in &mut scheds {
                let v = s.backend_view(end, b);
                backend_busy += v.busy_gpu_seconds;
                backend_gpus = f64::from(v.gpus);
            }
            busy += f64::min(backend_busy, backend_gpus * end.as_secs_f64());
            gpus += backend_gpus;
        }
        let sched = &scheds[0];
        let tenants: Vec<String> = sched
            .tenants()
            .map(|t| sched.tenant_name(t).to_owned())
            .collect();
        let slo_ttft = slo_ttft(self.policy, &tenants);
        let requests = self
            .results
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let tenant = self.tenant_of[i].map_or(usize::MAX, |t| t.0 as usize);
                let r = r.unwrap_or(RequestResult {
                    outcome: Outcome::FailedUpstream,
                    arrived: workload[i].t,
                    queue_wait: None,
                    ttft: None,
                    e2e: None,
                    good: false,
                });
                (tenant, r)
            })
            .collect();
        Trace {
            tenants,
            slo_ttft,
            requests,
            queue: self.queue,
            jain: self.fairness.index(),
            shares: self.fairness.shares(&self.weights),
            utilisation: busy / (gpus * end.as_secs_f64()).max(1e-9),
            makespan,
            output_tokens: self.output_tokens,
            preempted: Some(self.preempted),
            lost_tokens: Some(self.lost_tokens),
            resumed: Some(self.resumed),
            adapter_loads: (!self.adapter_names.is_empty()).then(|| {
                self.backends
                    .iter()
                    .map(|b| b.engine.stats().lora_loads_total)
                    .sum()
            }),
            prefix,
            estimates: self.estimates,
            bound_ratio: self.bound_ratio,
        }
    }
}

/// Gateway time → a backend engine's time.
fn to_engine(t: Instant, scale: f64) -> Instant {
    if scale == 1.0 {
        t
    } else {
        Instant::from_nanos((t.as_nanos() as f64 * scale) as u64)
    }
}

/// A backend engine's time → gateway time (rounded up, so the engine is
/// never asked to run backwards).
fn to_gateway(t: Instant, scale: f64) -> Instant {
    if scale == 1.0 {
        t
    } else {
        Instant::from_nanos((t.as_nanos() as f64 / scale).ceil() as u64)
    }
}

/// The TTFT SLO of each of `tenants`, from the policy, in seconds.
pub fn slo_ttft(policy: &Policy, tenants: &[String]) -> Vec<Option<f64>> {
    tenants
        .iter()
        .map(|name| {
            policy
                .tenants
                .iter()
                .find(|t| t.name == *name)
                .map(|t| t.slo.ttft.as_secs_f64())
        })
        .collect()
}
