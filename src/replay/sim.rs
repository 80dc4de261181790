//! The discrete-event simulation: the live scheduler against simulated
//! engines, on a simulated clock.
//!
//! The same [`Scheduler`] the proxy drives takes every arrival, reading,
//! completion and deadline tick here; each backend is the same
//! [`Engine`] that `fairway sim-backend` serves. What the proxy and the
//! poller do in I/O is done here in a few lines: a dispatch submits the
//! sequence to its backend's engine, a finished sequence is a completion
//! with its real usage, and every `[poller] interval` each backend's engine
//! state becomes a [`Reading`], with TTFT and e2e p99 taken from the same
//! histogram bounds and quantile code the live poller uses.
//!
//! Events at one instant run in a fixed order (engines by backend id,
//! arrivals in file order, deadlines, readings), and every random choice
//! comes from the scheduler's seeded RNG, so a seed gives one result.
//!
//! A backend whose `time_scale` is not 1 runs its engine that much faster
//! than the gateway's clock, as the live simulated backend does.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use crate::cluster::{DemandMeter, Shape};
use crate::config::EngineParams;
use crate::config::{BackendTarget, MetricsDialect, Policy};
use crate::core::admission::{LeaseKind, SharedLimit};
use crate::core::fairness::BackloggedService;
use crate::core::ids::{BackendId, RequestId, TenantId, Usage};
use crate::core::reading::{LoraReading, Reading};
use crate::core::scheduler::{Arrival, Decision, Scheduler};
use crate::core::time::Instant;
use crate::poller::{HistogramBucket, quantile};
use crate::replay::workload::WorkRequest;
use crate::sim::backend::metrics::{LATENCY_BUCKETS, TTFT_BUCKETS};
use crate::sim::engine::{Engine, EngineEvent, SeqRequest};

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
    /// LoRA adapter loads on all engines; `None` when no request named an
    /// adapter (or not known).
    pub adapter_loads: Option<u64>,
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
    scale: f64,
    polled: bool,
    ttft_window: Vec<f64>,
    e2e_window: Vec<f64>,
}

struct InFlight {
    replica: usize,
    req: RequestId,
    prompt: u32,
    backend: BackendId,
    dispatched: Instant,
    first: Option<Instant>,
    /// Weighted service counted for it so far: taken back if it is
    /// preempted, as recomputed work is not service.
    service: f64,
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
}

impl<'p> Sim<'p> {
    fn new(policy: &'p Policy, workload: &[WorkRequest], opts: &RunOptions) -> Self {
        let n = opts.replicas.max(1);
        let spec = if n > 1 {
            policy.scheduler_spec().leased(n, |_| 1.0 / f64::from(n))
        } else {
            policy.scheduler_spec()
        };
        let scheds: Vec<Scheduler> = (0..u64::from(n))
            .map(|r| Scheduler::new(&spec, Instant::ZERO, opts.seed.wrapping_add(r)))
            .collect();
        let sched = &scheds[0];
        let mut backends = Vec::new();
        for b in sched.backends() {
            let name = sched.backend_name(b);
            let bp = policy
                .pools
                .iter()
                .flat_map(|p| &p.backends)
                .find(|x| x.name == name);
            let params = match bp.map(|x| &x.target) {
                Some(BackendTarget::Sim { params }) => params.clone(),
                _ => EngineParams::default(),
            };
            let scale = if params.time_scale.is_finite() && params.time_scale > 0.0 {
                params.time_scale
            } else {
                1.0
            };
            backends.push(Backend {
                engine: Engine::new(params),
                scale,
                polled: bp.is_some_and(|x| x.metrics != MetricsDialect::None),
                ttft_window: Vec::new(),
                e2e_window: Vec::new(),
            });
        }
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
        Sim {
            policy,
            meters: (0..n).map(|_| DemandMeter::default()).collect(),
            sync_every: policy
                .cluster
                .as_ref()
                .map_or(Duration::from_secs(1), |c| c.sync_interval),
            lease_ahead: policy
                .cluster
                .as_ref()
                .map_or(Duration::from_secs(2), |c| c.lease_ahead),
            limits: HashMap::new(),
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
            last_end: Instant::ZERO,
            progress: opts
                .progress
                .clone()
                .filter(|_| std::io::stderr().is_terminal()),
            adapter_of,
            adapter_names,
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
            let busy = arrival_at.is_some() || self.scheds.iter().any(|s| s.live_requests() > 0);
            if !busy {
                break;
            }
            let engine_at = self
                .backends
                .iter()
                .filter_map(|b| b.engine.next_event_at().map(|e| to_gateway(e, b.scale)))
                .min();
            let wakeup = self.scheds.iter().filter_map(Scheduler::next_wakeup).min();
            let now = [arrival_at, engine_at, wakeup, Some(next_poll), next_sync]
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
                    self.advance_engine(i, now);
                }
            }
            // 2. Arrivals at or before now, in workload order.
            while let Some(w) = workload.get(next_arrival) {
                if Instant::from_secs_f64(w.t) > now {
                    break;
                }
                self.arrive(now, next_arrival, w);
                next_arrival += 1;
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

    fn arrive(&mut self, now: Instant, i: usize, w: &WorkRequest) {
        self.arrived[i] = now;
        let Some(tenant) = self.tenant_of[i] else {
            self.end(i, Outcome::Refused("auth"), now, None, None);
            return;
        };
        let r = self.replica_of[i];
        // A model served only by Triton backends is replayed through its
        // Triton pool: the engines are the same, the wire format does not
        // enter.
        // An adapter is served by its base model's pool.
        let base = self
            .policy
            .pools
            .iter()
            .find(|p| p.adapters.contains(&w.model))
            .map_or(w.model.as_str(), |p| p.model.as_str());
        let sched = &self.scheds[r];
        let pool = sched
            .pool(base)
            .or_else(|| sched.pool_for(base, crate::core::spec::Api::Triton));
        let Some(pool) = pool else {
            self.end(i, Outcome::Refused("model_not_found"), now, None, None);
            return;
        };
        let arrival = Arrival {
            tenant,
            pool,
            prompt_tokens: w.prompt_tokens,
            max_tokens: w.max_tokens,
            choices: 1,
            deadline: None,
            adapter: self.adapter_of[i].and_then(|_| self.scheds[r].adapter(&w.model)),
        };
        match self.scheds[r].on_arrival(now, arrival) {
            Ok((id, decisions)) => {
                self.by_req.insert((r, id), i);
                self.pending.extend(decisions.into_iter().map(|d| (r, d)));
            }
            Err(refusal) => self.end(i, Outcome::Refused(refusal.limit.as_str()), now, None, None),
        }
    }

    /// Carries out the scheduler's decisions (and those they lead to).
    fn apply(&mut self, now: Instant, workload: &[WorkRequest]) {
        // In order: a preemption and the dispatch that takes its slot (or
        // the victim's own later dispatch) come in that order.
        let mut k = 0;
        while let Some((r, d)) = self.pending.get(k).cloned() {
            k += 1;
            match d {
                Decision::Dispatch { id, backend } => {
                    let Some(&i) = self.by_req.get(&(r, id)) else {
                        continue;
                    };
                    let w = &workload[i];
                    let b = &mut self.backends[backend.0 as usize];
                    let seq = SeqRequest {
                        id: i as u64,
                        prompt_tokens: w.prompt_tokens,
                        output_tokens: w.output_tokens,
                        adapter: self.adapter_of[i],
                    };
                    if b.engine.submit(to_engine(now, b.scale), seq).is_err() {
                        // The engine refuses it (context too long): the
                        // backend's 400, a failed request as live.
                        let (_, d) = self.scheds[r].on_cancel(now, id);
                        self.pending.extend(d.into_iter().map(|d| (r, d)));
                        self.by_req.remove(&(r, id));
                        self.end(i, Outcome::FailedUpstream, now, Some(now), None);
                        continue;
                    }
                    self.flying.insert(
                        i,
                        InFlight {
                            replica: r,
                            req: id,
                            prompt: w.prompt_tokens,
                            backend,
                            dispatched: now,
                            first: None,
                            service: 0.0,
                        },
                    );
                    if w.stream {
                        // A streamed response starts at once (its headers),
                        // and is never preempted after that, as live.
                        self.scheds[r].on_response_started(id);
                    }
                }
                Decision::Preempt { id, backend } => {
                    let Some(&i) = self.by_req.get(&(r, id)) else {
                        continue;
                    };
                    self.backends[backend.0 as usize].engine.cancel(i as u64);
                    if let Some(f) = self.flying.remove(&i) {
                        let tenant = self.tenant_of[i].map_or(0, |t| t.0 as usize);
                        if let Some(s) = self.service.get_mut(tenant) {
                            *s -= f.service;
                        }
                    }
                    self.preempted += 1;
                }
                Decision::Shed { id, .. } => {
                    if let Some(i) = self.by_req.remove(&(r, id)) {
                        self.end(i, Outcome::Shed, now, None, None);
                    }
                }
            }
        }
        self.pending.clear();
    }

    fn advance_engine(&mut self, bi: usize, now: Instant) {
        let b = &mut self.backends[bi];
        let target = to_engine(now, b.scale).max(b.engine.next_event_at().unwrap_or(Instant::ZERO));
        self.events.clear();
        b.engine.advance(target, &mut self.events);
        for k in 0..self.events.len() {
            match self.events[k] {
                EngineEvent::Token { id, index, at } => {
                    let i = id as usize;
                    let Some(f) = self.flying.get_mut(&i) else {
                        continue;
                    };
                    // Service: every generated token, and the prompt with
                    // the first one (its prefill).
                    let mut tokens = 1.0;
                    if index == 1 && f.first.is_none() {
                        let b = &mut self.backends[bi];
                        let first = to_gateway(at, b.scale);
                        f.first = Some(first);
                        // The engine's histogram observes it now, in wall
                        // seconds as the simulated backend exports it.
                        b.ttft_window.push((first - f.dispatched).as_secs_f64());
                        tokens += f64::from(f.prompt);
                    }
                    let tenant = self.tenant_of[i].map_or(0, |t| t.0 as usize);
                    let w = self.weights.get(tenant).copied().unwrap_or(1.0);
                    if let Some(s) = self.service.get_mut(tenant) {
                        *s += tokens / w;
                    }
                    f.service += tokens / w;
                    self.output_tokens += 1;
                }
                EngineEvent::Finished {
                    id,
                    at,
                    prompt_tokens,
                    completion_tokens,
                } => {
                    let i = id as usize;
                    let Some(f) = self.flying.remove(&i) else {
                        continue;
                    };
                    let end = to_gateway(at, self.backends[bi].scale).max(f.dispatched);
                    // The engine's own view, as its histogram records it.
                    self.backends[bi]
                        .e2e_window
                        .push((end - f.dispatched).as_secs_f64());
                    if let Some(first) = f.first {
                        // The proxy measures this on streamed responses.
                        self.scheds[f.replica].observe_ttft(f.backend, first - f.dispatched);
                    }
                    let usage = Usage {
                        prompt_tokens,
                        completion_tokens,
                    };
                    let r = f.replica;
                    if let Some((ended, d)) = self.scheds[r].on_completion(end, f.req, Some(usage))
                    {
                        if let Some(settled) = ended.settled {
                            self.estimates.push((ended.charged, settled));
                        }
                        self.pending.extend(d.into_iter().map(|d| (r, d)));
                    }
                    self.by_req.remove(&(r, f.req));
                    self.end(i, Outcome::Served, end, Some(f.dispatched), f.first);
                    self.last_end = self.last_end.max(end);
                }
                EngineEvent::Admitted { .. } | EngineEvent::Preempted { .. } => {}
            }
        }
    }

    /// Records how request `i` ended: at `end`, dispatched at `dispatched`,
    /// its first token at `first`.
    fn end(
        &mut self,
        i: usize,
        outcome: Outcome,
        end: Instant,
        dispatched: Option<Instant>,
        first: Option<Instant>,
    ) {
        let arrived = self.arrived[i];
        let e2e = (end - arrived).as_secs_f64();
        let served = outcome == Outcome::Served;
        let ttft = served.then(|| match first {
            Some(f) if self.stream[i] => (f - arrived).as_secs_f64(),
            _ => e2e,
        });
        let slo = self.tenant_of[i]
            .and_then(|t| {
                let name = self.scheds[0].tenant_name(t);
                self.policy.tenants.iter().find(|p| p.name == name)
            })
            .map(|p| &p.slo);
        let good = served
            && slo.is_none_or(|s| {
                e2e <= s.e2e.as_secs_f64() && ttft.is_some_and(|t| t <= s.ttft.as_secs_f64())
            });
        self.results[i] = Some(RequestResult {
            outcome,
            arrived: arrived.as_secs_f64(),
            queue_wait: dispatched.map(|d| (d - arrived).as_secs_f64()),
            ttft,
            e2e: served.then_some(e2e),
            good,
        });
        self.finished += 1;
    }

    /// Every replica publishes its demand, reads the others' and settles
    /// its leases, as the live sync does through the store (here the
    /// store is [`SharedLimit`]s in memory), and gets its new window shares.
    fn sync(&mut self, now: Instant) {
        let secs = now.as_secs_f64();
        let names: Vec<String> = (0..self.scheds.len()).map(|r| format!("r{r}")).collect();
        let demands: crate::cluster::Demands = names
            .iter()
            .zip(self.meters.iter_mut().zip(&self.scheds))
            .map(|(name, (meter, sched))| (name.clone(), meter.fields(secs, sched)))
            .collect();
        let shape = Shape::of(self.policy);
        let n = u32::try_from(self.scheds.len()).unwrap_or(u32::MAX);
        for (r, name) in names.iter().enumerate() {
            let asks = self.scheds[r].lease_asks(now, self.lease_ahead, n);
            let answers: Vec<_> = asks
                .iter()
                .map(|a| {
                    self.limits
                        .entry((a.tenant.clone(), a.kind))
                        .or_default()
                        .sync(secs, name, a)
                })
                .collect();
            self.scheds[r].lease_granted(&asks, &answers);
            let shares = crate::cluster::shares(name, &demands, &shape);
            let even = 1.0 / f64::from(n);
            let spec = self
                .policy
                .scheduler_spec()
                .leased(n, |p| shares.pools.get(p).map_or(even, |s| s.share));
            let d = self.scheds[r].apply_policy(&spec, now);
            self.pending.extend(d.into_iter().map(|d| (r, d)));
        }
    }

    /// After every step: the fairness measure's sample when the set of
    /// backlogged tenants changed, and the fairness bound's terms of every
    /// pool folded into the run's worst ratio.
    fn observe(&mut self, now: Instant) {
        let backlogged: Vec<bool> = (0..self.backlogged.len())
            .map(|t| self.scheds.iter().any(|s| s.queued(TenantId(t as u32)) > 0))
            .collect();
        if backlogged != self.backlogged {
            self.fairness.sample(now, &self.service, &backlogged);
            self.backlogged = backlogged;
        }
        for s in &self.scheds {
            for pool in s.pools() {
                if let Some((gap, largest)) = s.fairness_spread(pool)
                    && largest > 0.0
                {
                    let r = gap / largest;
                    self.bound_ratio = Some(self.bound_ratio.map_or(r, |w| w.max(r)));
                }
            }
        }
    }

    /// One reading per polled backend; a queue and fairness sample.
    fn poll(&mut self, now: Instant) {
        for bi in 0..self.backends.len() {
            let b = &mut self.backends[bi];
            if !b.polled {
                continue;
            }
            let stats = b.engine.stats();
            let reading = Reading {
                at: now,
                kv_usage: Some(b.engine.kv_usage()),
                running: Some(stats.running),
                waiting: Some(stats.waiting),
                ttft_p99: window_p99(&mut b.ttft_window, &TTFT_BUCKETS),
                e2e_p99: window_p99(&mut b.e2e_window, &LATENCY_BUCKETS),
                kv_tokens: Some(stats.kv_blocks_total * u64::from(stats.block_size)),
                gpu_memory_used: None,
                gpu_memory_total: None,
                // As vLLM's `lora_requests_info` gives it: the adapters of
                // running and waiting requests.
                lora: (!self.adapter_names.is_empty()).then(|| LoraReading {
                    adapters: b
                        .engine
                        .active_adapters()
                        .iter()
                        .filter_map(|&a| self.adapter_names.get(a as usize).cloned())
                        .collect(),
                    resident: false,
                    max_loaded: Some(b.engine.params().max_loras),
                }),
            };
            for r in 0..self.scheds.len() {
                let d = self.scheds[r].on_reading(now, BackendId(bi as u32), reading.clone());
                self.pending.extend(d.into_iter().map(|d| (r, d)));
            }
        }
        let queued: Vec<u32> = self.scheds[0]
            .tenants()
            .map(|t| self.scheds.iter().map(|s| s.queued(t)).sum())
            .collect();
        self.fairness.sample(now, &self.service, &self.backlogged);
        self.queue.push(QueueSample {
            at: now.as_secs_f64(),
            queued,
        });
    }

    fn finish(self, workload: &[WorkRequest]) -> Trace {
        let end = self.last_end;
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
            adapter_loads: (!self.adapter_names.is_empty()).then(|| {
                self.backends
                    .iter()
                    .map(|b| b.engine.stats().lora_loads_total)
                    .sum()
            }),
            estimates: self.estimates,
            bound_ratio: self.bound_ratio,
        }
    }
}

/// p99 of `samples` through the live poller's histogram arithmetic (the
/// engine's bucket bounds, then `quantile`); clears the window. `None` when
/// nothing was observed, as a live scrape with no new observations.
fn window_p99(samples: &mut Vec<f64>, bounds: &[f64]) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut buckets: Vec<HistogramBucket> = bounds
        .iter()
        .chain(std::iter::once(&f64::INFINITY))
        .map(|&le| HistogramBucket {
            le,
            count: samples.iter().filter(|&&s| s <= le).count() as f64,
        })
        .collect();
    buckets.sort_by(|a, b| a.le.total_cmp(&b.le));
    samples.clear();
    quantile(0.99, &buckets).map(Duration::from_secs_f64)
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
