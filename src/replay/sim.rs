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

use crate::config::{BackendTarget, MetricsDialect, Policy};
use crate::core::fairness::BackloggedService;
use crate::core::ids::{BackendId, RequestId, TenantId, Usage};
use crate::core::reading::Reading;
use crate::core::scheduler::{Arrival, Decision, Scheduler};
use crate::core::time::Instant;
use crate::poller::{Bucket, quantile};
use crate::replay::workload::WorkRequest;
use crate::sim::backend::metrics::{LATENCY_BUCKETS, TTFT_BUCKETS};
use crate::sim::engine::{Engine, EngineEvent, EngineParams, SeqRequest};

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
    /// Per workload request (same order), with its tenant's index.
    pub requests: Vec<(usize, RequestResult)>,
    pub queue: Vec<QueueSample>,
    /// Jain's index of backlogged tenants' weighted service, over the
    /// periods they were backlogged together ([`BackloggedService`]).
    pub jain: Option<f64>,
    /// Busy GPU-seconds over GPU-seconds available until the last response.
    pub utilisation: f64,
    /// From the first arrival to the last response, seconds.
    pub makespan: f64,
    pub output_tokens: u64,
    /// Requests preempted (each time counted); `None` when not known (a
    /// live run seen from the client).
    pub preempted: Option<u64>,
}

/// Options of one run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub seed: u64,
    /// Draw a progress line on a terminal's stderr.
    pub progress: Option<String>,
}

struct Backend {
    engine: Engine,
    scale: f64,
    polled: bool,
    ttft_window: Vec<f64>,
    e2e_window: Vec<f64>,
}

struct InFlight {
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
    sched: Scheduler,
    backends: Vec<Backend>,
    /// Scheduler request → workload index.
    by_req: HashMap<RequestId, usize>,
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
    queue: Vec<QueueSample>,
    pending: Vec<Decision>,
    events: Vec<EngineEvent>,
    output_tokens: u64,
    preempted: u64,
    last_end: Instant,
    progress: Option<String>,
}

impl<'p> Sim<'p> {
    fn new(policy: &'p Policy, workload: &[WorkRequest], opts: &RunOptions) -> Self {
        let sched = Scheduler::new(&policy.scheduler_spec(), Instant::ZERO, opts.seed);
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
        Sim {
            policy,
            sched,
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
            queue: Vec::new(),
            pending: Vec::new(),
            events: Vec::new(),
            output_tokens: 0,
            preempted: 0,
            last_end: Instant::ZERO,
            progress: opts
                .progress
                .clone()
                .filter(|_| std::io::stderr().is_terminal()),
        }
    }

    fn run(mut self, workload: &[WorkRequest]) -> Trace {
        let interval = self.policy.poller.interval;
        let mut next_arrival = 0;
        let mut next_poll = Instant::ZERO + interval;
        let mut shown = usize::MAX;
        loop {
            let arrival_at = workload
                .get(next_arrival)
                .map(|w| Instant::from_secs_f64(w.t));
            let busy = arrival_at.is_some() || self.sched.live_requests() > 0;
            if !busy {
                break;
            }
            let engine_at = self
                .backends
                .iter()
                .filter_map(|b| b.engine.next_event_at().map(|e| to_gateway(e, b.scale)))
                .min();
            let now = [
                arrival_at,
                engine_at,
                self.sched.next_wakeup(),
                Some(next_poll),
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
            if self.sched.next_wakeup().is_some_and(|t| t <= now) {
                let d = self.sched.on_tick(now);
                self.pending.extend(d);
            }
            // 4. Readings.
            if next_poll <= now {
                self.poll(now);
                next_poll = now + interval;
            }
            self.apply(now, workload);

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
        let Some(pool) = self.sched.pool(&w.model) else {
            self.end(i, Outcome::Refused("model_not_found"), now, None, None);
            return;
        };
        let arrival = Arrival {
            tenant,
            pool,
            prompt_tokens: w.prompt_tokens,
            max_tokens: w.max_tokens,
            deadline: None,
        };
        match self.sched.on_arrival(now, arrival) {
            Ok((id, decisions)) => {
                self.by_req.insert(id, i);
                self.pending.extend(decisions);
            }
            Err(refusal) => self.end(i, Outcome::Refused(refusal.limit.as_str()), now, None, None),
        }
    }

    /// Carries out the scheduler's decisions (and those they lead to).
    fn apply(&mut self, now: Instant, workload: &[WorkRequest]) {
        // In order: a preemption and the dispatch that takes its slot (or
        // the victim's own later dispatch) come in that order.
        let mut k = 0;
        while let Some(d) = self.pending.get(k).cloned() {
            k += 1;
            match d {
                Decision::Dispatch { id, backend } => {
                    let Some(&i) = self.by_req.get(&id) else {
                        continue;
                    };
                    let w = &workload[i];
                    let b = &mut self.backends[backend.0 as usize];
                    let seq = SeqRequest {
                        id: i as u64,
                        prompt_tokens: w.prompt_tokens,
                        output_tokens: w.output_tokens,
                    };
                    if b.engine.submit(to_engine(now, b.scale), seq).is_err() {
                        // The engine refuses it (context too long): the
                        // backend's 400, a failed request as live.
                        let (_, d) = self.sched.on_cancel(now, id);
                        self.pending.extend(d);
                        self.by_req.remove(&id);
                        self.end(i, Outcome::FailedUpstream, now, Some(now), None);
                        continue;
                    }
                    self.flying.insert(
                        i,
                        InFlight {
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
                        self.sched.on_response_started(id);
                    }
                }
                Decision::Preempt { id, backend } => {
                    let Some(&i) = self.by_req.get(&id) else {
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
                    if let Some(i) = self.by_req.remove(&id) {
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
                        self.sched.observe_ttft(f.backend, first - f.dispatched);
                    }
                    let usage = Usage {
                        prompt_tokens,
                        completion_tokens,
                    };
                    if let Some((_, d)) = self.sched.on_completion(end, f.req, Some(usage)) {
                        self.pending.extend(d);
                    }
                    self.by_req.remove(&f.req);
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
                let name = self.sched.tenant_name(t);
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
            };
            let d = self.sched.on_reading(now, BackendId(bi as u32), reading);
            self.pending.extend(d);
        }
        let tenants: Vec<TenantId> = self.sched.tenants().collect();
        let queued: Vec<u32> = tenants
            .iter()
            .map(|&t| self.sched.tenant_view(now, t).queued)
            .collect();
        let backlogged: Vec<bool> = queued.iter().map(|&q| q > 0).collect();
        self.fairness.sample(now, &self.service, &backlogged);
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
        let mut sched = self.sched;
        let ids: Vec<BackendId> = sched.backends().collect();
        for b in ids {
            let v = sched.backend_view(end, b);
            busy += v.busy_gpu_seconds;
            gpus += f64::from(v.gpus);
        }
        let tenants: Vec<String> = sched
            .tenants()
            .map(|t| sched.tenant_name(t).to_owned())
            .collect();
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
            requests,
            queue: self.queue,
            jain: self.fairness.index(),
            utilisation: busy / (gpus * end.as_secs_f64()).max(1e-9),
            makespan,
            output_tokens: self.output_tokens,
            preempted: Some(self.preempted),
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
    let mut buckets: Vec<Bucket> = bounds
        .iter()
        .chain(std::iter::once(&f64::INFINITY))
        .map(|&le| Bucket {
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
