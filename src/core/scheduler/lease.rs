//! The replica's side of leased limits (see [`crate::core::admission::shared_limit`]):
//! what to tell the store at a sync, and taking its grants.

use std::time::Duration;

use crate::core::admission::{LeaseAnswer, LeaseAsk, LeaseKind, dust};
use crate::core::time::Instant;

use super::Scheduler;
use super::state::{SentAsk, TenantLease};

/// The least a replica asks of a GPU-seconds budget before it has seen an
/// estimate: this part of the budget.
const FIRST_GPU_ASK: f64 = 0.01;

/// How long a lease whose ask would say nothing new goes unasked: the
/// store keeps a lease's record at least three times as long.
pub const LEASE_KEEPALIVE: Duration = Duration::from_secs(1800);
/// Keepalives are spread over this many seconds, by tenant.
pub const STAGGER_SECS: u64 = 300;

impl Scheduler {
    /// What to tell the store about the leased limits at a sync at `now`,
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
    ///
    /// Only the asks that say something new are sent: a limit whose ask
    /// would repeat the last one (same holding, open reservations and
    /// want, nothing returned, the same count of replicas), while neither
    /// this replica nor, as far as it knows, another is short of it, is
    /// left out until [`LEASE_KEEPALIVE`] (staggered by tenant) has passed
    /// since its last ask. An idle tenant then costs the store nothing
    /// between keepalives. The store lists the limits some replica is
    /// short of ([`Scheduler::lease_short_elsewhere`]), so an idle holder
    /// still gives back its spare part within two syncs.
    pub fn lease_asks(&mut self, now: Instant, ahead: Duration, replicas: u32) -> Vec<LeaseAsk> {
        let ahead = ahead.as_secs_f64();
        let n = f64::from(replicas.max(1));
        let mut out = Vec::new();
        for (index, t) in self
            .tenants
            .iter_mut()
            .enumerate()
            .filter(|(_, t)| !t.retired)
        {
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
            let keepalive = LEASE_KEEPALIVE + Duration::from_secs(index as u64 % STAGGER_SECS);
            let mut send = |l: &mut TenantLease, ask: LeaseAsk| {
                let k = ask.kind.index();
                let same = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
                let quiet = l.sent[k].is_some_and(|s| {
                    now < s.at + keepalive
                        && s.replicas == replicas
                        && same(s.level, ask.level)
                        && same(s.open, ask.open)
                        && same(s.want, ask.want)
                });
                let settled = !(l.short_here[k] || l.others_short[k] || l.short_elsewhere[k]);
                if quiet && settled && ask.returned == 0.0 {
                    return;
                }
                l.sent[k] = Some(SentAsk {
                    at: now,
                    replicas,
                    level: ask.level,
                    open: ask.open,
                    want: ask.want,
                });
                l.short_elsewhere[k] = false;
                out.push(ask);
            };

            if let Some(b) = &mut t.rate {
                let capacity = b.capacity();
                let need = l.requests_per_s * ahead + 1.0;
                let want = floor(l, LeaseKind::Requests, need, capacity / n).min(capacity);
                let level = b.level(now);
                let returned = beyond(level, want, capacity);
                b.take(returned);
                let ask = LeaseAsk {
                    tenant: t.name.clone(),
                    kind: LeaseKind::Requests,
                    capacity,
                    rate: b.expected_rate(),
                    level: level - returned,
                    open: 0.0,
                    returned,
                    want,
                };
                send(l, ask);
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
                let returned = beyond(level, spare, capacity);
                g.take(returned);
                let ask = LeaseAsk {
                    tenant: t.name.clone(),
                    kind: LeaseKind::GpuSeconds,
                    capacity,
                    rate: g.expected_rate(),
                    level: level - returned,
                    open: t.gpu_open,
                    returned,
                    want,
                };
                send(l, ask);
            }
            if let Some(cap) = t.max_concurrency {
                let need = f64::from(t.active.saturating_add(l.slots_refused));
                let even = (f64::from(cap) / n).floor();
                let need = (floor(l, LeaseKind::Concurrency, need, even) as u32).min(cap);
                let returned = l.slots.saturating_sub(need.max(t.active));
                l.slots -= returned;
                l.slots_refused = 0;
                let ask = LeaseAsk {
                    tenant: t.name.clone(),
                    kind: LeaseKind::Concurrency,
                    capacity: f64::from(cap),
                    rate: 0.0,
                    level: f64::from(l.slots),
                    open: 0.0,
                    returned: f64::from(returned),
                    want: f64::from(need),
                };
                send(l, ask);
            }
        }
        out
    }

    /// The store lists `short` (tenant and limit) as limits some replica
    /// is short of: this replica asks for them at its next sync.
    pub fn lease_short_elsewhere<'a>(
        &mut self,
        short: impl IntoIterator<Item = (&'a str, LeaseKind)>,
    ) {
        for (tenant, kind) in short {
            let Some(&id) = self.tenant_by_name.get(tenant) else {
                continue;
            };
            if let Some(l) = &mut self.tenants[id.0 as usize].lease {
                l.short_elsewhere[kind.index()] = true;
            }
        }
    }

    /// The store forgot what it held (it restarted empty): every leased
    /// limit is asked for at the next sync.
    pub fn lease_ask_all(&mut self) {
        for t in &mut self.tenants {
            if let Some(l) = &mut t.lease {
                l.sent = [None; 3];
            }
        }
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
            // What it holds now against what it wanted (a debt the store
            // took over is part of the give, not of the holding).
            let debt = (-ask.level).max(0.0);
            let held = ask.level.max(0.0) + ask.open + (give - debt).max(0.0);
            l.short_here[ask.kind.index()] = ask.want - held > dust(ask.capacity);
            // The next ask of an idle tenant reports the level the grant
            // left: the same, not worth sending.
            if let Some(sent) = &mut l.sent[ask.kind.index()] {
                sent.level = match ask.kind {
                    LeaseKind::Concurrency => ask.level + give.max(0.0).floor(),
                    _ => ask.level + give,
                };
            }
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

/// What `level` holds beyond `keep`, unless it is float dust ([`dust`]):
/// three even parts of a limit, granted and returned, would otherwise
/// leave a replica returning 1e-15 at every sync.
fn beyond(level: f64, keep: f64, capacity: f64) -> f64 {
    Some(level - keep)
        .filter(|r| *r > dust(capacity))
        .unwrap_or(0.0)
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
