//! The replica's side of leased limits (see [`crate::core::admission::shared_limit`]):
//! what to tell the store at a sync, and taking its grants.

use std::time::Duration;

use crate::core::admission::{LeaseAnswer, LeaseAsk, LeaseKind};
use crate::core::time::Instant;

use super::Scheduler;
use super::state::TenantLease;

/// The least a replica asks of a GPU-seconds budget before it has seen an
/// estimate: this part of the budget.
const FIRST_GPU_ASK: f64 = 0.01;

impl Scheduler {
    /// What to tell the store about every leased limit at a sync at `now`,
    /// in a cluster of `replicas`.
    ///
    /// Each limit's lease is sized to the tenant's demand here (arrivals,
    /// admitted or not, smoothed with half the weight on the last
    /// interval): what it would use in `ahead`, plus one request's worth,
    /// at most the whole limit; concurrency: the requests active here plus
    /// those refused since the last sync. While no other replica is short
    /// of the limit, a replica keeps at least an even part of it (the
    /// limit over `replicas`), so a burst at a quiet replica is admitted
    /// as one gateway would admit it, with no round trip; when another is
    /// short, it keeps only what its demand needs, and the rest flows to
    /// the short one within two syncs. What is held beyond the lease is
    /// taken out of it now and reported as `returned`.
    pub fn lease_asks(&mut self, now: Instant, ahead: Duration, replicas: u32) -> Vec<LeaseAsk> {
        let ahead = ahead.as_secs_f64();
        let n = f64::from(replicas.max(1));
        let mut out = Vec::new();
        for t in self.tenants.iter_mut().filter(|t| !t.retired) {
            let Some(l) = &mut t.lease else { continue };
            if let Some(at) = l.asked_at.filter(|at| now > *at) {
                let secs = (now - at).as_secs_f64();
                let requests = t.arrivals_total.saturating_sub(l.asked_arrivals) as f64 / secs;
                let gpu = (t.gpu_asked_total - l.asked_gpu).max(0.0) / secs;
                l.requests_per_s = 0.5 * l.requests_per_s + 0.5 * requests;
                l.gpu_per_s = 0.5 * l.gpu_per_s + 0.5 * gpu;
            }
            l.asked_at = Some(now);
            l.asked_arrivals = t.arrivals_total;
            l.asked_gpu = t.gpu_asked_total;

            if let Some(b) = &mut t.rate {
                let capacity = b.capacity();
                let need = l.requests_per_s * ahead + 1.0;
                let want = floor(l, LeaseKind::Requests, need, capacity / n).min(capacity);
                let level = b.level(now);
                let returned = (level - want).max(0.0);
                b.take(returned);
                out.push(LeaseAsk {
                    tenant: t.name.clone(),
                    kind: LeaseKind::Requests,
                    capacity,
                    rate: b.expected_rate(),
                    level: level - returned,
                    open: 0.0,
                    returned,
                    want,
                });
            }
            if let Some(g) = &mut t.gpu {
                let capacity = g.capacity();
                let one = l.last_estimate.max(FIRST_GPU_ASK * capacity);
                let need = l.gpu_per_s * ahead + one;
                let want = floor(l, LeaseKind::GpuSeconds, need, capacity / n).min(capacity);
                let level = g.level(now);
                // The open reservations count as held: the lease is what is
                // left beyond them.
                let spare = (want - t.gpu_open).max(0.0);
                let returned = (level - spare).max(0.0);
                g.take(returned);
                out.push(LeaseAsk {
                    tenant: t.name.clone(),
                    kind: LeaseKind::GpuSeconds,
                    capacity,
                    rate: g.expected_rate(),
                    level: level - returned,
                    open: t.gpu_open,
                    returned,
                    want,
                });
            }
            if let Some(cap) = t.max_concurrency {
                let need = f64::from(t.active.saturating_add(l.slots_refused));
                let even = (f64::from(cap) / n).floor();
                let need = (floor(l, LeaseKind::Concurrency, need, even) as u32).min(cap);
                let returned = l.slots.saturating_sub(need.max(t.active));
                l.slots -= returned;
                l.slots_refused = 0;
                out.push(LeaseAsk {
                    tenant: t.name.clone(),
                    kind: LeaseKind::Concurrency,
                    capacity: f64::from(cap),
                    rate: 0.0,
                    level: f64::from(l.slots),
                    open: 0.0,
                    returned: f64::from(returned),
                    want: f64::from(need),
                });
            }
        }
        out
    }

    /// The store's answers to [`Scheduler::lease_asks`], in order.
    pub fn lease_granted(&mut self, asks: &[LeaseAsk], answers: &[LeaseAnswer]) {
        for (ask, answer) in asks.iter().zip(answers) {
            let Some(id) = self.tenant(&ask.tenant) else {
                continue;
            };
            let t = &mut self.tenants[id.0 as usize];
            let Some(l) = &mut t.lease else { continue };
            l.others_short[ask.kind.index()] = answer.short > 0.0;
            let give = if answer.give.is_finite() {
                answer.give
            } else {
                0.0
            };
            match ask.kind {
                LeaseKind::Requests => {
                    if let Some(b) = &mut t.rate {
                        b.deposit(give);
                    }
                }
                LeaseKind::GpuSeconds => {
                    if let Some(g) = &mut t.gpu {
                        g.deposit(give);
                    }
                }
                LeaseKind::Concurrency => {
                    // Saturating float-to-int conversion: a negative or huge
                    // answer cannot wrap.
                    l.slots = l.slots.saturating_add(give.max(0.0) as u32);
                }
            }
        }
    }

    /// What each leased limit holds here: tenant, limit, amount (requests,
    /// GPU-seconds or slots).
    pub fn leases(&self) -> Vec<(&str, LeaseKind, f64)> {
        let mut out = Vec::new();
        for t in self.tenants.iter().filter(|t| !t.retired) {
            let Some(l) = &t.lease else { continue };
            if let Some(b) = &t.rate {
                out.push((t.name.as_str(), LeaseKind::Requests, b.last_level()));
            }
            if let Some(g) = &t.gpu {
                out.push((t.name.as_str(), LeaseKind::GpuSeconds, g.last_level()));
            }
            if t.max_concurrency.is_some() {
                out.push((t.name.as_str(), LeaseKind::Concurrency, f64::from(l.slots)));
            }
        }
        out
    }
}

/// The lease to keep: what the demand `need`s, and at least `even` while
/// no other replica is short of this limit.
fn floor(l: &TenantLease, kind: LeaseKind, need: f64, even: f64) -> f64 {
    if l.others_short[kind.index()] {
        need
    } else {
        need.max(even)
    }
}
