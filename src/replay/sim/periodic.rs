//! What the simulation runs beside the events: the replicas' sync with the
//! simulated cluster store, the fairness samples after every step, and
//! the backends' readings every poller interval.

use std::time::Duration;

use super::{PrefixTrace, QueueSample, Sim};
use crate::cluster::Shape;
use crate::core::ids::{BackendId, TenantId};
use crate::core::reading::{LoraReading, Reading};
use crate::core::spec::PoolPart;
use crate::core::time::Instant;
use crate::poller::{HistogramBucket, quantile};
use crate::sim::backend::metrics::{LATENCY_BUCKETS, TTFT_BUCKETS};

impl Sim<'_> {
    /// Every replica publishes its demand, reads the others' and settles
    /// its leases, as the live sync does through the store (here the
    /// store is [`SharedLimit`](crate::core::admission::SharedLimit)s in memory), and gets its new window shares.
    pub(super) fn sync(&mut self, now: Instant) {
        let secs = now.as_secs_f64();
        let names: Vec<String> = (0..self.scheds.len()).map(|r| format!("r{r}")).collect();
        let demands: crate::cluster::Demands = names
            .iter()
            .zip(self.meters.iter_mut().zip(&self.scheds))
            .map(|(name, (meter, sched))| (name.clone(), meter.fields(now, sched.demand(now))))
            .collect();
        let shape = Shape::of(self.policy);
        let n = u32::try_from(self.scheds.len()).unwrap_or(u32::MAX);
        // The store's clock over the interval, as the live sync's round.
        let round = (secs / self.sync_every.as_secs_f64().max(1e-3)) as u64;
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
            // The limits some replica is short of, as the store lists them.
            let short = self.limits.iter().filter(|(_, l)| l.is_short());
            self.scheds[r].lease_short_elsewhere(short.map(|((t, k), _)| (t.as_str(), *k)));
            let shares = crate::cluster::shares(name, &demands, &shape, round);
            let even = PoolPart::share(1.0 / f64::from(n));
            let spec = self.policy.scheduler_spec().leased(n, |p| {
                shares
                    .pools
                    .get(p)
                    .map_or(even, crate::cluster::PoolShare::part)
            });
            let d = self.scheds[r].apply_policy(&spec, now);
            self.pending.extend(d.into_iter().map(|d| (r, d)));
        }
        self.share_homes(now, &names);
    }

    /// The replicas' new prefix homes, appended to the store's stream in
    /// replica order and read by every replica, as the live sync does
    /// (`crate::cluster::homes`).
    fn share_homes(&mut self, now: Instant, names: &[String]) {
        let ms = now.as_nanos() / 1_000_000;
        let mut entries = Vec::new();
        for (sched, name) in self.scheds.iter_mut().zip(names) {
            entries.extend(
                sched
                    .placed_homes()
                    .into_iter()
                    .map(|placed| crate::cluster::Entry {
                        ms,
                        replica: name.clone(),
                        placed,
                    }),
            );
        }
        if entries.is_empty() {
            return;
        }
        for ((sched, ledger), name) in self.scheds.iter_mut().zip(&mut self.ledgers).zip(names) {
            let changes = ledger.read(name, entries.clone());
            sched.homes_changed(now, &changes);
        }
    }

    /// After every step: the fairness measure's sample when the set of
    /// backlogged tenants changed, and the fairness bound's terms of every
    /// pool folded into the run's worst ratio.
    pub(super) fn observe(&mut self, now: Instant) {
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
    pub(super) fn poll(&mut self, now: Instant) {
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

impl Sim<'_> {
    /// The engines' and indexes' prefix counters, when prefixes mattered.
    pub(super) fn prefix_trace(&mut self, end: Instant) -> Option<PrefixTrace> {
        let routed = self
            .scheds
            .iter()
            .any(|s| s.pools().any(|p| s.prefix_view(p).is_some()));
        if !(routed || self.shares_prefixes) {
            return None;
        }
        let mut t = PrefixTrace::default();
        for b in &self.backends {
            let s = b.engine.stats();
            t.prompt_tokens += s.prefix_cache_queries_total;
            t.cached_tokens += s.prefix_cache_hits_total;
            t.prefill_tokens += s.prefill_tokens_total;
        }
        for s in &mut self.scheds {
            let ids: Vec<_> = s.backends().collect();
            for b in ids {
                t.predicted_tokens += s.backend_view(end, b).predicted_cached_tokens;
            }
            let pools: Vec<_> = s.pools().collect();
            for p in pools {
                t.local_dispatches += s.prefix_view(p).map_or(0, |v| v.local);
            }
        }
        Some(t)
    }
}
