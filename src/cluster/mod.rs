//! Several gateway replicas, one policy. Each replica registers in a shared
//! Redis store with a heartbeat, publishes each tenant's demand at it (the
//! requests per second arriving there) and reads every replica's, and
//! enforces its share of each tenant's limits: its part of the cluster's
//! demand for the tenant (see
//! [`SchedulerSpec::shared_by`](crate::core::spec::SchedulerSpec::shared_by)).
//! The core stays sans-IO: it is handed a new spec when the count or a
//! share changes, and no request waits on the store.
//!
//! Shares follow skewed ingress within a few sync intervals; exact
//! admission while ingress moves needs the leases of a later step. While
//! the store is unreachable (`on_store_failure = "local"`) a replica keeps
//! the last shares it computed, logs the change once and counts it in
//! `fairway_cluster_store_up`; when the store returns it registers again
//! and resyncs. `docs/cluster.md` has the design and the bounds.

mod store;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use tokio_util::sync::CancellationToken;

use crate::config::ClusterPolicy;
use crate::core::admission::{LeaseAnswer, LeaseAsk};
use crate::core::spec::{Api, pool_key};
pub use store::{Demands, Store};

/// This replica's view of the cluster, read by the metrics and admin views.
#[derive(Debug)]
pub struct Member {
    /// This replica's name in the store.
    pub replica: String,
    /// Replicas alive at the last successful sync (this one included).
    replicas: AtomicU32,
    store_up: AtomicBool,
    /// Last store round trip, microseconds.
    rtt_micros: AtomicU64,
    store_errors: AtomicU64,
    /// Syncs that succeeded: the store round trips.
    syncs: AtomicU64,
    /// Woken when a request was refused for want of a lease.
    starved: tokio::sync::Notify,
    /// Per tenant: this replica's share of its limits, its demand here and
    /// in the whole cluster (requests per second), as last read.
    tenants: Mutex<HashMap<String, TenantShare>>,
    /// Per scheduler pool (by [`pool_key`]): this replica's share of its
    /// backends' windows.
    pools: Mutex<HashMap<String, PoolShare>>,
}

/// One pool's share of its backends' windows on this replica.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct PoolShare {
    pub share: f64,
    /// Requests queued or in flight here, and at all replicas.
    pub backlog_here: f64,
    pub backlog_cluster: f64,
}

/// Both kinds of share, as computed from one reading of the store.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Shares {
    pub tenants: HashMap<String, TenantShare>,
    pub pools: HashMap<String, PoolShare>,
}

/// One tenant's share of its limits on this replica.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct TenantShare {
    pub share: f64,
    /// Requests per second arriving here (smoothed over sync intervals).
    pub demand_here: f64,
    /// Requests per second arriving at all replicas.
    pub demand_cluster: f64,
}

/// What the metrics scrape and `/admin/policy` show of the cluster.
#[derive(Clone, Debug, serde::Serialize)]
pub struct View {
    pub replica: String,
    pub replicas: u32,
    pub store_up: bool,
    pub store_rtt_seconds: f64,
    pub store_errors: u64,
    /// Successful syncs (store round trips) so far.
    pub syncs: u64,
    /// Whether the limits are leased from the store (else shared locally).
    pub leasing: bool,
    pub tenants: std::collections::BTreeMap<String, TenantShare>,
    pub pools: std::collections::BTreeMap<String, PoolShare>,
    /// What this replica holds of each leased limit.
    pub leases: Vec<LeaseHeld>,
}

/// One leased limit held here.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LeaseHeld {
    pub tenant: String,
    /// `rate` (requests), `gpu_seconds` or `concurrency` (slots).
    pub limit: &'static str,
    pub held: f64,
}

impl Member {
    pub fn new(replica: String) -> Self {
        Member {
            replica,
            replicas: AtomicU32::new(1),
            store_up: AtomicBool::new(false),
            rtt_micros: AtomicU64::new(0),
            store_errors: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            starved: tokio::sync::Notify::new(),
            tenants: Mutex::new(HashMap::new()),
            pools: Mutex::new(HashMap::new()),
        }
    }

    /// This replica's share of the windows of a scheduler pool's backends,
    /// by its [`pool_key`] (the model, or `triton:` and the model).
    pub fn pool_share(&self, key: &str) -> f64 {
        self.pools
            .lock()
            .get(key)
            .map_or(1.0 / f64::from(self.replicas()), |p| p.share)
    }

    /// This replica's share of `tenant`'s limits: its part of the
    /// cluster's demand for it, or an even share while it has none.
    pub fn share(&self, tenant: &str) -> f64 {
        self.tenants
            .lock()
            .get(tenant)
            .map_or(1.0 / f64::from(self.replicas()), |t| t.share)
    }

    /// A request was refused for want of a lease: sync sooner.
    pub fn starved(&self) {
        self.starved.notify_one();
    }

    /// Whether the last sync with the store succeeded (then the tenants'
    /// limits are leased from it).
    pub fn store_up(&self) -> bool {
        self.store_up.load(Ordering::Relaxed)
    }

    /// Replicas alive as last read (at least 1).
    pub fn replicas(&self) -> u32 {
        self.replicas.load(Ordering::Relaxed).max(1)
    }

    /// The replica's view, with the leases `sched` holds.
    pub fn view(&self, sched: &crate::core::scheduler::Scheduler) -> View {
        View {
            leases: sched
                .leases()
                .into_iter()
                .map(|(t, kind, held)| LeaseHeld {
                    tenant: t.to_owned(),
                    limit: kind.as_str(),
                    held,
                })
                .collect(),
            replica: self.replica.clone(),
            replicas: self.replicas(),
            store_up: self.store_up.load(Ordering::Relaxed),
            store_rtt_seconds: self.rtt_micros.load(Ordering::Relaxed) as f64 / 1e6,
            store_errors: self.store_errors.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            leasing: self.store_up(),
            tenants: self
                .tenants
                .lock()
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            pools: self
                .pools
                .lock()
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
        }
    }
}

/// The replica name when the policy gives none: the host's name (the pod's
/// in Kubernetes) and the process id.
pub fn default_replica_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "fairway".to_owned());
    format!("{host}-{}", std::process::id())
}

/// Connects (lazily) and makes the first contact, so that the replica
/// starts with the cluster's count and the demand it has seen. A store
/// that does not answer within one sync interval leaves the count at 1
/// (the sync task keeps trying).
pub async fn join(policy: &ClusterPolicy) -> Result<(Syncer, Member), String> {
    let replica = policy.replica.clone().unwrap_or_else(default_replica_name);
    let store = Store::connect(policy, &replica)?;
    let member = Member::new(replica);
    let mut syncer = Syncer {
        store,
        interval: policy.sync_interval,
        lease_ahead: policy.lease_ahead,
        meter: DemandMeter::default(),
    };
    syncer.exchange(&member, &[], &[], &Shape::default()).await;
    Ok((syncer, member))
}

/// What the sync drives: this replica's gateway, whose scheduler it hands
/// leases and shares.
pub trait Replica: Send + Sync {
    /// Runs `f` on the scheduler under its lock, with the replica's now.
    fn with_scheduler(
        &self,
        f: &mut dyn FnMut(crate::core::time::Instant, &mut crate::core::scheduler::Scheduler),
    );
    /// The policy in force.
    fn policy(&self) -> Arc<crate::config::Policy>;
    /// New leases came: requests queued for want of one may go now.
    fn leases_changed(&self);
    /// The membership or the demand moved: hands the scheduler this
    /// replica's new shares of the policy.
    fn apply_share(&self);
}

/// A replica's link to the store: its connection and what it measures
/// between syncs.
#[derive(Debug)]
pub struct Syncer {
    store: Store,
    interval: Duration,
    lease_ahead: Duration,
    meter: DemandMeter,
}

impl Syncer {
    /// One sync of the gateway with the store: publishes its demand,
    /// settles its leases, and hands the scheduler new shares (or, when
    /// the store came or went, the other way of enforcing the limits).
    pub async fn sync(&mut self, member: &Member, replica: &dyn Replica) {
        let (mut demand, mut asks) = (Vec::new(), Vec::new());
        replica.with_scheduler(&mut |now, sched| {
            demand = self.meter.fields(now.as_secs_f64(), sched);
            if member.store_up() {
                asks = sched.lease_asks(now, self.lease_ahead, member.replicas());
            }
        });
        let shape = Shape::of(&replica.policy());
        let replicas = member.replicas();
        let (answers, changed) = self.exchange(member, &demand, &asks, &shape).await;
        if !answers.is_empty() {
            replica.with_scheduler(&mut |_, sched| sched.lease_granted(&asks, &answers));
            replica.leases_changed();
        }
        if changed {
            let n = member.replicas();
            if n != replicas {
                tracing::info!(replica = %member.replica, replicas = n, "cluster membership changed");
            }
            replica.apply_share();
        }
    }

    /// One round trip, publishing `demand` and settling `asks`; updates
    /// `member`. Returns the store's answer to each ask (none if it did not
    /// answer) and whether the replica must apply new shares: the count or
    /// a share moved, or the store came or went.
    async fn exchange(
        &mut self,
        member: &Member,
        demand: &[(String, f64)],
        asks: &[LeaseAsk],
        shape: &Shape,
    ) -> (Vec<LeaseAnswer>, bool) {
        let timeout = self.interval;
        let start = tokio::time::Instant::now();
        let result = tokio::time::timeout(timeout, self.store.sync(demand, asks)).await;
        let was_up = member.store_up.load(Ordering::Relaxed);
        match result {
            Ok(Ok((answers, demands))) => {
                let rtt = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
                member.rtt_micros.store(rtt, Ordering::Relaxed);
                member.syncs.fetch_add(1, Ordering::Relaxed);
                member.store_up.store(true, Ordering::Relaxed);
                let n = u32::try_from(demands.len()).unwrap_or(u32::MAX).max(1);
                if !was_up {
                    tracing::info!(
                        replica = %member.replica, replicas = n,
                        "cluster store reachable: limits leased from the store"
                    );
                }
                let old_n = member.replicas.swap(n, Ordering::Relaxed);
                let new = shares(&member.replica, &demands, shape);
                let moved = |old: f64, new: f64| (old - new).abs() > 0.01 * old.max(new);
                let mut tenants = member.tenants.lock();
                let mut pools = member.pools.lock();
                let changed = new.tenants.len() != tenants.len()
                    || new.pools.len() != pools.len()
                    || new
                        .tenants
                        .iter()
                        .any(|(t, s)| tenants.get(t).is_none_or(|old| moved(old.share, s.share)))
                    || new
                        .pools
                        .iter()
                        .any(|(m, s)| pools.get(m).is_none_or(|old| moved(old.share, s.share)));
                *tenants = new.tenants;
                *pools = new.pools;
                let answers = if answers.len() == asks.len() {
                    answers
                } else {
                    Vec::new()
                };
                (answers, !was_up || old_n != n || changed)
            }
            failed => {
                member.store_errors.fetch_add(1, Ordering::Relaxed);
                member.store_up.store(false, Ordering::Relaxed);
                if was_up || member.store_errors.load(Ordering::Relaxed) == 1 {
                    let cause = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no answer within {}", humantime::format_duration(timeout)),
                    };
                    tracing::warn!(
                        replica = %member.replica,
                        replicas = member.replicas(),
                        %cause,
                        "cluster store unreachable: enforcing this replica's last shares"
                    );
                }
                (Vec::new(), was_up)
            }
        }
    }

    /// Syncs every `sync_interval`, and sooner (at most every eighth of
    /// it) when a request was refused for want of a lease; leaves the
    /// cluster on shutdown.
    pub async fn run(
        mut self,
        member: Arc<Member>,
        replica: Arc<dyn Replica>,
        stop: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.reset(); // the server synced before it started serving
        let min_gap = self.interval / 8;
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
                () = member.starved.notified() => {
                    tokio::time::sleep_until(last + min_gap).await;
                }
            }
            last = tokio::time::Instant::now();
            self.sync(&member, &*replica).await;
        }
        // A clean leave frees this replica's share at once for the others
        // (otherwise it expires after `replica_ttl`).
        let _ = tokio::time::timeout(self.interval, self.store.leave()).await;
    }
}

/// Part of the cluster's demand that a replica with no demand of its own
/// keeps (of an even share), so that a tenant's first requests there are
/// not all refused and a pool's first requests find a window.
const IDLE_FLOOR: f64 = 0.05;

/// Field-name prefixes in a replica's demand hash: a tenant's arrivals per
/// second, and a pool's backlog of one tenant (`b␟model␟tenant`).
const TENANT_FIELD: &str = "t\u{1f}";
const BACKLOG_FIELD: &str = "b\u{1f}";

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

/// The shares of replica `me`, from every live replica's demand.
///
/// A tenant's limits: its part of the cluster's arrivals of that tenant.
/// A pool's windows: the cluster's window capacity is split among the
/// tenants with a backlog (queued or in flight) by weight, capped at each
/// one's backlog (water-filling); this replica's share is its part of what
/// its tenants' backlogs were given. So with tenant A (weight 3) arriving
/// only at one replica and B (weight 1) only at another, both saturating,
/// the first gets 3/4 of every window and the second 1/4.
pub fn shares(me: &str, demands: &Demands, shape: &Shape) -> Shares {
    let n = demands.len().max(1) as f64;
    // tenant → (here, all)
    let mut tenants: HashMap<&str, (f64, f64)> = HashMap::new();
    // model → tenant → (here, all)
    let mut backlog: HashMap<&str, HashMap<&str, (f64, f64)>> = HashMap::new();
    for (replica, fields) in demands {
        let mine = replica == me;
        for (field, v) in fields {
            let v = v.max(0.0);
            if let Some(t) = field.strip_prefix(TENANT_FIELD) {
                let e = tenants.entry(t).or_default();
                e.1 += v;
                if mine {
                    e.0 += v;
                }
            } else if let Some((model, t)) = field
                .strip_prefix(BACKLOG_FIELD)
                .and_then(|rest| rest.split_once('\u{1f}'))
            {
                let e = backlog.entry(model).or_default().entry(t).or_default();
                e.1 += v;
                if mine {
                    e.0 += v;
                }
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
    let pools = backlog
        .into_iter()
        .map(|(model, by_tenant)| {
            let rows: Vec<(&str, f64, f64)> = by_tenant
                .iter()
                .map(|(t, (here, all))| (*t, *here, *all))
                .collect();
            let claims: Vec<(f64, f64)> = rows
                .iter()
                .map(|(t, _, all)| (shape.weights.get(*t).copied().unwrap_or(1.0), *all))
                .collect();
            let capacity = shape.capacity.get(model).copied().unwrap_or(f64::INFINITY);
            let alloc = water_fill(&claims, capacity);
            let given: f64 = alloc.iter().sum();
            let mine: f64 = rows
                .iter()
                .zip(&alloc)
                .map(|((_, here, all), a)| if *all > 0.0 { a * here / all } else { 0.0 })
                .sum();
            let s = PoolShare {
                share: part(mine, given, n),
                backlog_here: rows.iter().map(|r| r.1).sum(),
                backlog_cluster: rows.iter().map(|r| r.2).sum(),
            };
            (model.to_owned(), s)
        })
        .collect();
    Shares { tenants, pools }
}

/// What a replica publishes: each tenant's arrivals per second and each
/// pool's backlog by tenant, smoothed over sync intervals (half the weight
/// on the last one). Sans-IO: the caller reads the scheduler and the clock
/// (the live sync task, and the replay's simulated replicas).
#[derive(Debug, Default)]
pub struct DemandMeter {
    last: HashMap<String, u64>,
    rate: HashMap<String, f64>,
    backlog: HashMap<String, f64>,
    at: Option<f64>,
}

impl DemandMeter {
    /// The fields to publish, from the scheduler's state at `now_secs`.
    pub fn fields(
        &mut self,
        now_secs: f64,
        sched: &crate::core::scheduler::Scheduler,
    ) -> Vec<(String, f64)> {
        let arrivals = sched.arrivals().map(|(t, n)| (t.to_owned(), n)).collect();
        let backlogs = sched
            .backlogs()
            .map(|(m, t, n)| (format!("{BACKLOG_FIELD}{m}\u{1f}{t}"), f64::from(n)))
            .collect();
        let mut out: Vec<(String, f64)> = self
            .sample(now_secs, arrivals)
            .into_iter()
            .map(|(t, d)| (format!("{TENANT_FIELD}{t}"), d))
            .collect();
        out.extend(self.smooth_backlogs(backlogs));
        out
    }

    fn sample(&mut self, now: f64, arrivals: Vec<(String, u64)>) -> Vec<(String, f64)> {
        let secs = self.at.map_or(0.0, |t| now - t);
        self.at = Some(now);
        let mut out = Vec::with_capacity(arrivals.len());
        for (t, total) in arrivals {
            let before = self.last.insert(t.clone(), total);
            let rate = match before {
                Some(b) if secs > 0.0 => total.saturating_sub(b) as f64 / secs,
                _ => 0.0,
            };
            let r = self.rate.entry(t.clone()).or_insert(rate);
            *r = 0.5 * *r + 0.5 * rate;
            out.push((t, *r));
        }
        out
    }

    /// Backlogs, smoothed the same way; a backlog that ended decays.
    fn smooth_backlogs(&mut self, now: Vec<(String, f64)>) -> Vec<(String, f64)> {
        let mut seen: HashMap<String, f64> = now.into_iter().collect();
        self.backlog.retain(|k, v| {
            *v = 0.5 * *v + 0.5 * seen.remove(k).unwrap_or(0.0);
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
            .map(|r| shares(r, &d, &shape).tenants)
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
        let spec = policy
            .scheduler_spec()
            .leased(2, |key| if key == "triton:m" { 0.25 } else { 0.5 });
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
        let r1 = shares("r1", &d, &shape).pools["m"].share;
        let r2 = shares("r2", &d, &shape).pools["m"].share;
        assert!(
            (r1 - 0.75).abs() < 1e-9 && (r2 - 0.25).abs() < 1e-9,
            "{r1} {r2}"
        );
    }
}
