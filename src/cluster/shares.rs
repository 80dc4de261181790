//! Shares, sans-IO: what a replica publishes of its demand
//! ([`DemandMeter`]), what the policy says the shares depend on
//! ([`Shape`]), and each replica's part of every limit and window from
//! every replica's demand ([`shares`], [`water_fill`]).

use std::collections::HashMap;

use crate::core::spec::{Api, pool_key};

use super::member::{PoolShare, Shares, TenantShare};
use super::store::Demands;

/// Part of the cluster's demand that a replica with no demand of its own
/// keeps (of an even share), so that a tenant's first requests there are
/// not all refused and a pool's first requests find a window.
const IDLE_FLOOR: f64 = 0.05;

/// Field-name prefixes in a replica's demand hash: a tenant's arrivals per
/// second, a pool's live backlog of one tenant (`b␟model␟tenant`), its
/// backlog behind live work (`l␟model␟tenant`: late and batch-lane
/// requests), and a pool's interactive requests waiting to preempt
/// (`w␟model`).
const TENANT_FIELD: &str = "t\u{1f}";
const BACKLOG_FIELD: &str = "b\u{1f}";
const LOWER_FIELD: &str = "l\u{1f}";
const WANT_FIELD: &str = "w\u{1f}";

/// What the policy says that the shares depend on: tenants' weights and
/// each scheduler pool's total window (the sum of its backends'
/// `max_inflight`), by [`pool_key`].
#[derive(Clone, Debug, Default)]
pub struct Shape {
    pub weights: HashMap<String, f64>,
    pub capacity: HashMap<String, f64>,
}

impl Shape {
    pub fn of(policy: &crate::config::Policy) -> Shape {
        Shape {
            weights: policy
                .tenants
                .iter()
                .map(|t| (t.name.clone(), t.weight))
                .collect(),
            capacity: policy
                .pools
                .iter()
                .flat_map(|p| {
                    [Api::OpenAi, Api::Triton].map(|api| {
                        let c: u32 = p
                            .backends
                            .iter()
                            .filter(|b| b.protocol == api)
                            .map(|b| b.max_inflight)
                            .sum();
                        (pool_key(&p.model, api).into_owned(), f64::from(c))
                    })
                })
                .collect(),
        }
    }
}

/// Arrivals per second below which a tenant's demand is not published
/// (one request in about 17 minutes, smoothed).
const IDLE_DEMAND: f64 = 1e-3;

/// A replica's part: `here / all`; a replica with nothing here keeps
/// [`IDLE_FLOOR`] of an even share; an even share when there is nothing
/// anywhere. Over the replicas these add up to at most 1 + `IDLE_FLOOR`.
fn part(here: f64, all: f64, n: f64) -> f64 {
    if all <= 0.0 {
        1.0 / n
    } else if here <= 0.0 {
        IDLE_FLOOR / n
    } else {
        here / all
    }
}

/// Weighted max-min fair split of `capacity` among claims `(weight, cap)`:
/// each gets at most its cap, and the rest is shared in proportion to
/// weight (water-filling).
pub fn water_fill(claims: &[(f64, f64)], capacity: f64) -> Vec<f64> {
    let mut alloc = vec![0.0; claims.len()];
    let mut open: Vec<usize> = (0..claims.len()).filter(|&i| claims[i].1 > 0.0).collect();
    let mut left = capacity.max(0.0);
    while !open.is_empty() && left > 1e-12 {
        let w: f64 = open.iter().map(|&i| claims[i].0.max(1e-9)).sum();
        let per_weight = left / w;
        // Claims that this round would fill are capped and leave.
        let (full, rest): (Vec<usize>, Vec<usize>) = open
            .iter()
            .partition(|&&i| claims[i].1 - alloc[i] <= per_weight * claims[i].0.max(1e-9));
        if full.is_empty() {
            for &i in &rest {
                alloc[i] += per_weight * claims[i].0.max(1e-9);
            }
            break;
        }
        for &i in &full {
            left -= claims[i].1 - alloc[i];
            alloc[i] = claims[i].1;
        }
        open = rest;
    }
    alloc
}

/// The shares of replica `me`, from every live replica's demand, in the
/// cluster's sync `round` (the store's clock over the sync interval, so
/// the same at every replica within an interval).
///
/// A tenant's limits: its part of the cluster's arrivals of that tenant.
/// A pool's windows: the cluster's window capacity is split among the
/// tenants' backlogs ([`split`]), live work first, as each replica serves
/// its own batch lane only while no live request waits; a replica's share
/// is its part of what its tenants' backlogs were given. So with tenant A (weight 3) arriving only at one
/// replica and B (weight 1) only at another, both saturating, the first
/// gets 3/4 of every window and the second 1/4. The pool's whole slots are
/// then apportioned among the replicas ([`apportion`]), so that in small
/// windows the shares hold over time rather than each replica rounding its
/// own up. While interactive work waits to preempt at another replica, a
/// replica yields what it holds above what its backlogs would be given
/// without the split's slack, rounded up
/// ([`PoolPart::yield_above`](crate::core::spec::PoolPart)).
pub fn shares(me: &str, demands: &Demands, shape: &Shape, round: u64) -> Shares {
    let n = demands.len().max(1) as f64;
    // The replicas in one order at every replica: the apportionment's.
    let mut names: Vec<&str> = demands.iter().map(|(r, _)| r.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    // tenant → (here, all)
    let mut tenants: HashMap<&str, (f64, f64)> = HashMap::new();
    // model → tenant → [live, lower] backlog by replica (as in `names`)
    let mut backlog: HashMap<&str, HashMap<&str, [Vec<f64>; 2]>> = HashMap::new();
    // model → interactive requests waiting to preempt, by replica
    let mut wants: HashMap<&str, Vec<f64>> = HashMap::new();
    for (replica, fields) in demands {
        let mine = replica == me;
        let at = names.binary_search(&replica.as_str()).unwrap_or(0);
        for (field, v) in fields {
            let v = v.max(0.0);
            if let Some(t) = field.strip_prefix(TENANT_FIELD) {
                let e = tenants.entry(t).or_default();
                e.1 += v;
                if mine {
                    e.0 += v;
                }
            } else if let Some(model) = field.strip_prefix(WANT_FIELD) {
                wants.entry(model).or_insert_with(|| vec![0.0; names.len()])[at] += v;
            } else {
                let (lane, rest) = match (
                    field.strip_prefix(BACKLOG_FIELD),
                    field.strip_prefix(LOWER_FIELD),
                ) {
                    (Some(rest), _) => (0, rest),
                    (None, Some(rest)) => (1, rest),
                    (None, None) => continue,
                };
                let Some((model, t)) = rest.split_once('\u{1f}') else {
                    continue;
                };
                let by_replica = backlog
                    .entry(model)
                    .or_default()
                    .entry(t)
                    .or_insert_with(|| [vec![0.0; names.len()], vec![0.0; names.len()]]);
                by_replica[lane][at] += v;
            }
        }
    }
    let tenants = tenants
        .into_iter()
        .map(|(t, (here, all))| {
            let s = TenantShare {
                share: part(here, all, n),
                demand_here: here,
                demand_cluster: all,
            };
            (t.to_owned(), s)
        })
        .collect();
    let me_at = names.binary_search(&me);
    let pools = backlog
        .into_iter()
        .map(|(model, by_tenant)| {
            let capacity = shape.capacity.get(model).copied().unwrap_or(f64::INFINITY);
            let given = split(&by_tenant, names.len(), capacity, shape, true);
            let total_given: f64 = given.iter().sum();
            // Each replica's share: its part of what its backlogs were given.
            let parts: Vec<f64> = given
                .iter()
                .map(|mine| part(*mine, total_given, n))
                .collect();
            let wanted_elsewhere = |r: usize| {
                wants
                    .get(model)
                    .is_some_and(|w| w.iter().enumerate().any(|(i, v)| i != r && *v > 0.0))
            };
            let (share, slots, yield_above) = match me_at {
                Ok(r) if capacity.is_finite() => (
                    parts[r],
                    Some(apportion(&parts, capacity, round)[r]),
                    wanted_elsewhere(r).then(|| {
                        // What its backlogs are given when each tenant
                        // claims its backlog as it is (not doubled): no
                        // work is preempted for another's slack.
                        let need = split(&by_tenant, names.len(), capacity, shape, false)[r];
                        ((need - 1e-9).ceil() as u32).max(1)
                    }),
                ),
                Ok(r) => (parts[r], None, None),
                // Not among the live replicas read (its membership
                // lapsed): an idle replica's part, no apportioned slots.
                Err(_) => (part(0.0, total_given, n), None, None),
            };
            let total = |r: Option<usize>| -> f64 {
                by_tenant
                    .values()
                    .flat_map(|b| b.iter())
                    .map(|v| r.map_or_else(|| v.iter().sum(), |r| v[r]))
                    .sum()
            };
            let s = PoolShare {
                share,
                slots,
                yield_above,
                backlog_here: me_at.map_or(0.0, |r| total(Some(r))),
                backlog_cluster: total(None),
            };
            (model.to_owned(), s)
        })
        .collect();
    Shares { tenants, pools }
}

/// The slots of a pool of `capacity` that each of `replicas` replicas'
/// backlogs are given: the tenants' live backlogs first, by weight
/// (water-filling), then their lower lanes with what is left. Each
/// tenant claims its backlog over the replicas, or with `slack` twice it
/// (at least one slot more): room for the next burst before the next sync
/// moves the split, as each replica rounding up left it (a tenant that
/// saturates claims more than the pool either way).
fn split(
    by_tenant: &HashMap<&str, [Vec<f64>; 2]>,
    replicas: usize,
    capacity: f64,
    shape: &Shape,
    slack: bool,
) -> Vec<f64> {
    let mut given = vec![0.0; replicas];
    let mut left = capacity;
    for lane in 0..2 {
        let rows: Vec<(&str, &Vec<f64>, f64)> = by_tenant
            .iter()
            .map(|(t, b)| (*t, &b[lane], b[lane].iter().sum()))
            .collect();
        let claims: Vec<(f64, f64)> = rows
            .iter()
            .map(|(t, _, all)| {
                let weight = shape.weights.get(*t).copied().unwrap_or(1.0);
                let cap = match (*all > 0.0, slack) {
                    (false, _) => 0.0,
                    (true, true) => all + all.max(1.0),
                    (true, false) => *all,
                };
                (weight, cap)
            })
            .collect();
        let alloc = water_fill(&claims, left);
        left -= alloc.iter().sum::<f64>();
        for (r, g) in given.iter_mut().enumerate() {
            *g += rows
                .iter()
                .zip(&alloc)
                .map(|((_, b, all), a)| if *all > 0.0 { a * b[r] / all } else { 0.0 })
                .sum::<f64>();
        }
    }
    given
}

/// The golden ratio's fractional part: successive rounds' offsets
/// `round × φ mod 1` spread evenly over [0, 1) (a low-discrepancy
/// sequence), so that each replica's slots average its share within a
/// few rounds.
const PHI: f64 = 0.618_033_988_749_895;

/// Whole slots per replica from their `parts` of a pool's `capacity`
/// slots, in `round`: systematic rounding with the round's offset `u`,
/// each replica taking the whole numbers that fall in its stretch of
/// `[u, u + Σ parts × capacity)`. So each gets the floor or the ceiling
/// of its part of the slots, they add up to the whole (when the parts add
/// up to 1), and over rounds each replica's average is its exact part:
/// a replica entitled to 1.5 slots holds 1 and 2 in turn. Every replica
/// keeps at least one slot, so that its first request finds one (one per
/// replica beyond the capacity at most, and only at replicas whose part
/// rounds to nothing).
pub fn apportion(parts: &[f64], capacity: f64, round: u64) -> Vec<u32> {
    let u = (round as f64 * PHI).fract();
    let mut at = u;
    parts
        .iter()
        .map(|p| {
            let next = at + p.max(0.0) * capacity;
            let whole = (next + 1e-9).floor() - (at + 1e-9).floor();
            at = next;
            (whole.max(0.0) as u32).max(1)
        })
        .collect()
}

/// How long the tenants' arrival rates are averaged over (the time
/// constant of their moving average). The local shares that a replica
/// enforces while the store is unreachable are its part of these rates as
/// last read, and every replica read them at a different moment: averaged
/// over much longer than a sync interval, the parts read up to an interval
/// apart still add up to about 1. Averaged per sync instead (half the
/// weight on the last one), the syncs a refusal brings forward (every
/// eighth of an interval) measured a few arrivals each, and the parts
/// added up to 1.2: a stalled store let a rate-20 tenant through at 24/s.
const ARRIVALS_TAU_SECS: f64 = 1.0;

/// What a replica publishes: each tenant's arrivals per second (a moving
/// average over [`ARRIVALS_TAU_SECS`]) and each pool's backlog by tenant
/// (half the weight on the last sync interval), whenever it syncs: the
/// averages weigh each sample by the time it covers, so syncs brought
/// forward do not make them noisier. Sans-IO: the caller reads the
/// scheduler and the clock (the live sync task, and the replay's simulated
/// replicas).
#[derive(Debug)]
pub struct DemandMeter {
    last: HashMap<String, u64>,
    rate: HashMap<String, f64>,
    backlog: HashMap<String, f64>,
    at: Option<f64>,
    /// The backlogs' time constant: half the weight on the last interval.
    backlog_tau: f64,
}

impl DemandMeter {
    /// A meter for syncs every `interval`.
    pub fn new(interval: std::time::Duration) -> DemandMeter {
        DemandMeter {
            last: HashMap::new(),
            rate: HashMap::new(),
            backlog: HashMap::new(),
            at: None,
            backlog_tau: interval.as_secs_f64().max(1e-3) / std::f64::consts::LN_2,
        }
    }

    /// The fields to publish, from the scheduler's demand at `now`.
    pub fn fields(
        &mut self,
        now: crate::core::time::Instant,
        demand: crate::core::scheduler::Demand,
    ) -> Vec<(String, f64)> {
        let now_secs = now.as_secs_f64();
        let secs = self.at.map_or(0.0, |t| (now_secs - t).max(0.0));
        self.at = Some(now_secs);
        let backlogs = demand
            .backlogs
            .into_iter()
            .flat_map(|(m, t, live, lower)| {
                [(BACKLOG_FIELD, live), (LOWER_FIELD, lower)]
                    .into_iter()
                    .filter(|(_, n)| *n > 0)
                    .map(move |(f, n)| (format!("{f}{m}\u{1f}{t}"), f64::from(n)))
            })
            .collect();
        let mut out: Vec<(String, f64)> = self
            .sample(secs, demand.arrivals)
            .into_iter()
            .map(|(t, d)| (format!("{TENANT_FIELD}{t}"), d))
            .collect();
        out.extend(self.smooth_backlogs(secs, backlogs));
        // Not averaged: a want ends as soon as its requests dispatch.
        out.extend(
            demand
                .wants
                .into_iter()
                .map(|(m, n)| (format!("{WANT_FIELD}{m}"), f64::from(n))),
        );
        out
    }

    /// Each tenant's arrivals per second over the last `secs`, averaged;
    /// those under [`IDLE_DEMAND`] are not published.
    fn sample(&mut self, secs: f64, arrivals: Vec<(String, u64)>) -> Vec<(String, f64)> {
        let weight = 1.0 - (-secs / ARRIVALS_TAU_SECS).exp();
        let mut out = Vec::with_capacity(arrivals.len());
        for (t, total) in arrivals {
            let before = self.last.insert(t.clone(), total);
            let rate = match before {
                Some(b) if secs > 0.0 => total.saturating_sub(b) as f64 / secs,
                _ => 0.0,
            };
            let r = self.rate.entry(t.clone()).or_insert(rate);
            *r += weight * (rate - *r);
            // An idle tenant is left out: the shares read a tenant no
            // replica lists as one with no demand, so the store's traffic
            // grows with the active tenants, not the configured ones.
            if *r >= IDLE_DEMAND {
                out.push((t, *r));
            }
        }
        out
    }

    /// Backlogs, averaged over `backlog_tau`; a backlog that ended decays.
    fn smooth_backlogs(&mut self, secs: f64, now: Vec<(String, f64)>) -> Vec<(String, f64)> {
        let weight = 1.0 - (-secs / self.backlog_tau).exp();
        let mut seen: HashMap<String, f64> = now.into_iter().collect();
        self.backlog.retain(|k, v| {
            *v += weight * (seen.remove(k).unwrap_or(0.0) - *v);
            *v > 0.01
        });
        for (k, v) in seen {
            self.backlog.insert(k, v);
        }
        self.backlog.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::spec::PoolPart;

    fn demands(rows: &[(&str, &[(&str, f64)])]) -> Demands {
        rows.iter()
            .map(|(r, ds)| {
                let ds = ds
                    .iter()
                    .map(|(t, d)| (format!("{TENANT_FIELD}{t}"), *d))
                    .collect();
                ((*r).to_owned(), ds)
            })
            .collect()
    }

    #[test]
    fn shares_follow_demand_and_add_up_to_one() {
        let d = demands(&[
            ("r1", &[("a", 30.0), ("b", 0.0)]),
            ("r2", &[("a", 10.0), ("b", 0.0)]),
            ("r3", &[]),
        ]);
        let shape = Shape::default();
        let all: Vec<_> = ["r1", "r2", "r3"]
            .iter()
            .map(|r| shares(r, &d, &shape, 0).tenants)
            .collect();
        let a: Vec<f64> = all.iter().map(|s| s["a"].share).collect();
        let sum = a.iter().sum::<f64>();
        assert!((1.0..=1.0 + IDLE_FLOOR).contains(&sum), "{a:?}");
        assert!(
            a[0] > 0.7 && a[1] > 0.2 && a[2] > 0.0 && a[2] < 0.02,
            "{a:?}"
        );
        assert_eq!(all[0]["a"].demand_cluster, 40.0);
        // No demand anywhere: even shares.
        assert!(all.iter().all(|s| (s["b"].share - 1.0 / 3.0).abs() < 1e-9));
    }

    #[test]
    fn water_filling_caps_each_claim_and_splits_the_rest_by_weight() {
        let a = water_fill(&[(3.0, 100.0), (1.0, 100.0)], 8.0);
        assert!(
            (a[0] - 6.0).abs() < 1e-9 && (a[1] - 2.0).abs() < 1e-9,
            "{a:?}"
        );
        // A small claim is met; the rest goes to the other.
        let a = water_fill(&[(3.0, 1.0), (1.0, 100.0)], 8.0);
        assert!(
            (a[0] - 1.0).abs() < 1e-9 && (a[1] - 7.0).abs() < 1e-9,
            "{a:?}"
        );
        // Enough for everyone.
        let a = water_fill(&[(3.0, 1.0), (1.0, 2.0)], 8.0);
        assert_eq!(a, vec![1.0, 2.0]);
        assert_eq!(water_fill(&[], 8.0), Vec::<f64>::new());
    }

    #[test]
    fn a_model_served_over_both_protocols_is_two_pools_to_the_cluster() {
        let text = "[[pools]]\nmodel = \"m\"\n\
                    [[pools.backends]]\nurl = \"http://a:1\"\nmax_inflight = 8\n\
                    [[pools.backends]]\nurl = \"http://b:1\"\nprotocol = \"triton\"\nmax_inflight = 4\n";
        let policy = crate::config::parse_policy(text, "p.toml").unwrap();
        let shape = Shape::of(&policy);
        assert_eq!(shape.capacity["m"], 8.0);
        assert_eq!(shape.capacity["triton:m"], 4.0);
        let spec = policy.scheduler_spec().leased(2, |key| {
            PoolPart::share(if key == "triton:m" { 0.25 } else { 0.5 })
        });
        let windows: Vec<u32> = spec
            .pools
            .iter()
            .map(|p| p.backends[0].max_inflight)
            .collect();
        assert_eq!(windows, vec![4, 1]);
    }

    #[test]
    fn windows_follow_weighted_backlog_across_replicas() {
        // A (weight 3) backlogged only at r1, B (weight 1) only at r2.
        let field = |m: &str, t: &str| format!("{BACKLOG_FIELD}{m}\u{1f}{t}");
        let d: Demands = vec![
            ("r1".into(), vec![(field("m", "a"), 40.0)]),
            ("r2".into(), vec![(field("m", "b"), 40.0)]),
        ];
        let shape = Shape {
            weights: [("a".to_owned(), 3.0), ("b".to_owned(), 1.0)].into(),
            capacity: [("m".to_owned(), 8.0)].into(),
        };
        let r1 = shares("r1", &d, &shape, 0).pools["m"].share;
        let r2 = shares("r2", &d, &shape, 0).pools["m"].share;
        assert!(
            (r1 - 0.75).abs() < 1e-9 && (r2 - 0.25).abs() < 1e-9,
            "{r1} {r2}"
        );
    }

    #[test]
    fn batch_work_gets_what_live_work_leaves_and_yields_to_waiting_interactive_work() {
        // Interactive work (backlog 1) at r1; 8 batch items in flight at
        // r2. A pool of 4 slots.
        let field = |f: &str, m: &str, t: &str| format!("{f}{m}\u{1f}{t}");
        let shape = Shape {
            weights: [("app".to_owned(), 1.0), ("jobs".to_owned(), 1.0)].into(),
            capacity: [("m".to_owned(), 4.0)].into(),
        };
        let mut d: Demands = vec![
            ("r1".into(), vec![(field(BACKLOG_FIELD, "m", "app"), 1.0)]),
            ("r2".into(), vec![(field(LOWER_FIELD, "m", "jobs"), 8.0)]),
        ];
        // Live work claims twice its backlog; the batch lane the rest.
        let r2 = shares("r2", &d, &shape, 0).pools["m"];
        assert!((r2.share - 0.5).abs() < 1e-9, "{r2:?}");
        assert_eq!((r2.slots, r2.yield_above), (Some(2), None));
        // As live, the same backlog is weighed 1:1 against app's.
        let mut as_live = d.clone();
        as_live[1].1 = vec![(field(BACKLOG_FIELD, "m", "jobs"), 8.0)];
        assert!((shares("r2", &as_live, &shape, 0).pools["m"].share - 0.5).abs() < 1e-9);
        // More live work at r1, which has waited: r2 keeps what its
        // backlog gets without the slack (app 3 of the 4 slots, jobs 1) and
        // yields the rest.
        d[0].1 = vec![
            (field(BACKLOG_FIELD, "m", "app"), 3.0),
            (format!("{WANT_FIELD}m"), 2.0),
        ];
        let r2 = shares("r2", &d, &shape, 0).pools["m"];
        assert_eq!((r2.slots, r2.yield_above), (Some(1), Some(1)));
        // A replica's own want is not a reason to yield.
        assert_eq!(shares("r1", &d, &shape, 0).pools["m"].yield_above, None);
    }

    #[test]
    fn whole_slots_add_up_and_average_each_replicas_part() {
        // Parts of 3/8, 3/8, 1/4 of 4 slots: 1.5, 1.5 and 1 each.
        let parts = [0.375, 0.375, 0.25];
        let mut sum = [0u32; 3];
        for round in 0..1000 {
            let s = apportion(&parts, 4.0, round);
            assert_eq!(s.iter().sum::<u32>(), 4, "{s:?}");
            for (i, x) in s.iter().enumerate() {
                assert!((1..=2).contains(x), "{s:?}");
                sum[i] += x;
            }
        }
        let avg: Vec<f64> = sum.iter().map(|s| f64::from(*s) / 1000.0).collect();
        assert!(
            (avg[0] - 1.5).abs() < 0.01 && (avg[1] - 1.5).abs() < 0.01,
            "{avg:?}"
        );
        assert!((avg[2] - 1.0).abs() < 1e-9, "{avg:?}");
        // A replica whose part rounds to nothing keeps one slot.
        assert_eq!(apportion(&[0.75, 0.25, 0.0], 4.0, 7), vec![3, 1, 1]);
    }

    #[test]
    fn a_small_window_is_split_three_to_one_in_whole_slots() {
        // Three replicas, a pool of 4 slots (two backends of 2), A (weight
        // 3) backlogged only at r1, B (weight 1) only at r2, r3 idle: r1
        // holds 3 and r2 1 (each rounding its own up held 4 and 2: 2:1).
        let field = |m: &str, t: &str| format!("{BACKLOG_FIELD}{m}\u{1f}{t}");
        let d: Demands = vec![
            ("r2".into(), vec![(field("m", "b"), 20.0)]),
            ("r1".into(), vec![(field("m", "a"), 20.0)]),
            ("r3".into(), vec![]),
        ];
        let shape = Shape {
            weights: [("a".to_owned(), 3.0), ("b".to_owned(), 1.0)].into(),
            capacity: [("m".to_owned(), 4.0)].into(),
        };
        for round in 0..50 {
            let slots = |r| shares(r, &d, &shape, round).pools["m"].slots;
            assert_eq!(slots("r1"), Some(3), "round {round}");
            assert_eq!(slots("r2"), Some(1), "round {round}");
        }
        // r3, idle, keeps one slot for its first request.
        assert_eq!(shares("r3", &d, &shape, 0).pools["m"].slots, Some(1));
    }
}
