//! The events of a step of the simulation: a request's arrival, the
//! scheduler's decisions carried out, the engines' tokens and completions,
//! and how each request ended.

use std::borrow::Cow;
use std::time::Duration;

use super::{InFlight, Outcome, RequestResult, Sim, to_engine, to_gateway};
use crate::config::PrefillCharge;
use crate::core::ids::{BackendId, Usage};
use crate::core::ids::{PoolId, TenantId};
use crate::core::scheduler::{Arrival, Decision, Lane};
use crate::core::time::Instant;
use crate::poller::kv_events::EventBatch;
use crate::replay::workload::WorkRequest;
use crate::sim::engine::{EngineEvent, SeqRequest, StoredPrompt, kv_events};
use crate::tokens::request_keys;

impl Sim<'_> {
    pub(super) fn arrive(&mut self, now: Instant, i: usize, w: &WorkRequest) {
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
        self.pool_of[i] = Some(pool);
        self.submit(now, i, w, (r, tenant, pool));
    }

    /// Request `i` (or its continuation, with the tokens it kept) to
    /// replica `r`'s scheduler.
    fn submit(
        &mut self,
        now: Instant,
        i: usize,
        w: &WorkRequest,
        (r, tenant, pool): (usize, TenantId, PoolId),
    ) {
        // As the gateway keys a request for a pool that routes on prefixes.
        let prefix = match self.scheds[r].prefix_block_tokens(pool) {
            Some(block) => request_keys(&w.model, None, &w.token_ids(i as u64), block),
            None => Vec::new(),
        };
        let kept = self.kept[i];
        let arrival = Arrival {
            tenant,
            pool,
            prompt_tokens: w.prompt_tokens + kept,
            max_tokens: w.max_tokens.map(|m| m.saturating_sub(kept).max(1)),
            choices: 1,
            // A batch item may wait out its batch's window.
            deadline: w.batch.then(|| {
                self.policy.batch.as_ref().map_or(
                    Duration::from_secs(crate::protocol::batch::WINDOW_SECONDS),
                    |b| b.window,
                )
            }),
            adapter: self.adapter_of[i].and_then(|_| self.scheds[r].adapter(&w.model)),
            prefix,
            lane: match (w.batch, self.resume) {
                (true, true) => Lane::Resumable,
                (true, false) => Lane::Batch,
                (false, _) => Lane::Live,
            },
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
    pub(super) fn apply(&mut self, now: Instant, workload: &[WorkRequest]) {
        // In order: a preemption and the dispatch that takes its slot (or
        // the victim's own later dispatch) come in that order.
        let mut k = 0;
        while let Some((r, d)) = self.pending.get(k).cloned() {
            k += 1;
            match d {
                Decision::Dispatch { id, backend } => {
                    let Some(&i) = self.by_req.get(&(r, id)) else {
                        // It ended already (its engine finished it at the
                        // instant the scheduler preempted it): the
                        // scheduler lets it go, or it would hold a slot
                        // forever.
                        let (_, d) = self.scheds[r].on_cancel(now, id);
                        self.pending.extend(d.into_iter().map(|d| (r, d)));
                        continue;
                    };
                    let w = &workload[i];
                    let b = &mut self.backends[backend.0 as usize];
                    // A request with shared segments brings its blocks'
                    // keys; one without shares nothing with any other, and
                    // is not keyed at all (the same run, cheaper).
                    let prefix = if w.prefix.is_empty() {
                        Vec::new()
                    } else {
                        let block = b.engine.params().block_size;
                        request_keys(&w.model, None, &w.token_ids(i as u64), block)
                    };
                    let kept = self.kept[i];
                    let seq = SeqRequest {
                        id: i as u64,
                        prompt_tokens: w.prompt_tokens + kept,
                        output_tokens: w.output_tokens.saturating_sub(kept).max(1),
                        adapter: self.adapter_of[i],
                        prefix,
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
                            cached: 0,
                            tokens: 0,
                        },
                    );
                    if w.stream || (w.batch && self.resume) {
                        // A streamed response starts at once (its headers),
                        // and is never preempted after that, as live; a
                        // resumable batch item (streamed by the runner)
                        // still may be.
                        self.scheds[r].on_response_started(id);
                    }
                }
                Decision::Preempt { id, backend } => {
                    let Some(&i) = self.by_req.get(&(r, id)) else {
                        continue;
                    };
                    self.backends[backend.0 as usize].engine.cancel(i as u64);
                    self.preempted += 1;
                    let Some(f) = self.flying.remove(&i) else {
                        continue;
                    };
                    let w = &workload[i];
                    if w.batch && self.resume {
                        // It left the scheduler: its continuation arrives
                        // now with the tokens it had, as the runner sends it.
                        self.by_req.remove(&(r, id));
                        self.kept[i] += f.tokens;
                        self.resumed += 1;
                        if let (Some(t), Some(p)) = (self.tenant_of[i], self.pool_of[i]) {
                            self.submit(now, i, w, (r, t, p));
                        }
                        continue;
                    }
                    self.lost_tokens += u64::from(f.tokens);
                    let tenant = self.tenant_of[i].map_or(0, |t| t.0 as usize);
                    if let Some(s) = self.service.get_mut(tenant) {
                        *s -= f.service;
                    }
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

    pub(super) fn advance_engine(&mut self, bi: usize, now: Instant, workload: &[WorkRequest]) {
        let b = &mut self.backends[bi];
        let target = to_engine(now, b.scale).max(b.engine.next_event_at().unwrap_or(Instant::ZERO));
        self.events.clear();
        b.engine.advance(target, &mut self.events);
        if b.feed.is_some() {
            self.publish_cache(bi, now, workload);
        }
        for k in 0..self.events.len() {
            match self.events[k] {
                EngineEvent::Token { id, index, at } => {
                    let i = id as usize;
                    let Some(f) = self.flying.get_mut(&i) else {
                        continue;
                    };
                    // Service: every generated token, and the prompt with
                    // the first one (its prefill), as the charge counts it:
                    // less what the engine found cached under
                    // `prefill_charge = "uncached"`.
                    let mut tokens = 1.0;
                    if index == 1 && f.first.is_none() {
                        let b = &mut self.backends[bi];
                        let first = to_gateway(at, b.scale);
                        f.first = Some(first);
                        if workload[i].batch && self.resume {
                            // A resumable item: its prefill is done.
                            let r = f.replica;
                            let d = self.scheds[r].on_first_token(now, f.req);
                            self.pending.extend(d.into_iter().map(|d| (r, d)));
                        } else if self.ttft_at_first {
                            // The batch lane's loop: the proxy feeds it at
                            // the first byte.
                            self.scheds[f.replica].on_ttft(
                                first,
                                f.req,
                                f.backend,
                                first - f.dispatched,
                            );
                        }
                        // The engine's histogram observes it now, in wall
                        // seconds as the simulated backend exports it.
                        b.ttft_window.push((first - f.dispatched).as_secs_f64());
                        tokens += f64::from(match self.policy.queue.prefill_charge {
                            PrefillCharge::Uncached => f.prompt.saturating_sub(f.cached),
                            PrefillCharge::Full => f.prompt,
                        });
                    }
                    let tenant = self.tenant_of[i].map_or(0, |t| t.0 as usize);
                    let w = self.weights.get(tenant).copied().unwrap_or(1.0);
                    if let Some(s) = self.service.get_mut(tenant) {
                        *s += tokens / w;
                    }
                    f.service += tokens / w;
                    f.tokens += 1;
                    self.output_tokens += 1;
                }
                EngineEvent::Finished {
                    id,
                    at,
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
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
                    if let Some(first) = f.first.filter(|_| !self.ttft_at_first) {
                        // The proxy measures this on streamed responses.
                        self.scheds[f.replica].on_ttft(end, f.req, f.backend, first - f.dispatched);
                    }
                    let usage = Usage {
                        prompt_tokens,
                        completion_tokens,
                        cached_tokens: Some(cached_tokens),
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
                EngineEvent::Admitted {
                    id, cached_tokens, ..
                } => {
                    if let Some(f) = self.flying.get_mut(&(id as usize)) {
                        f.cached = cached_tokens;
                    }
                }
                EngineEvent::Preempted { .. } => {}
            }
        }
    }

    /// Records how request `i` ended: at `end`, dispatched at `dispatched`,
    /// its first token at `first`.
    /// Precise mode: backend `bi`'s cache changes as its KV events (token
    /// ids from the workload), keyed by its feed into every replica's
    /// index at once.
    fn publish_cache(&mut self, bi: usize, now: Instant, workload: &[WorkRequest]) {
        let b = &mut self.backends[bi];
        let changes = b.engine.take_cache_changes();
        let Some((feed, model, seq)) = b.feed.as_mut() else {
            return;
        };
        if changes.is_empty() {
            return;
        }
        let model = model.as_str();
        let events = kv_events(changes, b.engine.params().block_size, |id| {
            let w = workload.get(id as usize)?;
            Some(StoredPrompt {
                ids: Cow::Owned(w.token_ids(id)),
                lora: (w.model != model).then_some(w.model.as_str()),
                salt: None,
            })
        });
        let batch = EventBatch {
            events,
            ..EventBatch::default()
        };
        let mut out = Vec::new();
        feed.apply(*seq, &batch, &mut out);
        *seq += 1;
        let backend = BackendId(bi as u32);
        for s in &mut self.scheds {
            for e in &out {
                s.on_prefix_event(now, backend, e);
            }
        }
    }

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
        self.clients.ended(i, end);
    }
}
