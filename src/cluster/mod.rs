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
use crate::proxy::gateway::Gateway;
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
    /// Per tenant: this replica's share of its limits, its demand here and
    /// in the whole cluster (requests per second), as last read.
    tenants: Mutex<HashMap<String, TenantShare>>,
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
    pub tenants: std::collections::BTreeMap<String, TenantShare>,
}

impl Member {
    pub fn new(replica: String) -> Self {
        Member {
            replica,
            replicas: AtomicU32::new(1),
            store_up: AtomicBool::new(false),
            rtt_micros: AtomicU64::new(0),
            store_errors: AtomicU64::new(0),
            tenants: Mutex::new(HashMap::new()),
        }
    }

    /// This replica's share of `tenant`'s limits: its part of the
    /// cluster's demand for it, or an even share while it has none.
    pub fn share(&self, tenant: &str) -> f64 {
        self.tenants
            .lock()
            .get(tenant)
            .map_or(1.0 / f64::from(self.replicas()), |t| t.share)
    }

    /// Replicas alive as last read (at least 1).
    pub fn replicas(&self) -> u32 {
        self.replicas.load(Ordering::Relaxed).max(1)
    }

    pub fn view(&self) -> View {
        View {
            replica: self.replica.clone(),
            replicas: self.replicas(),
            store_up: self.store_up.load(Ordering::Relaxed),
            store_rtt_seconds: self.rtt_micros.load(Ordering::Relaxed) as f64 / 1e6,
            store_errors: self.store_errors.load(Ordering::Relaxed),
            tenants: self
                .tenants
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
/// starts with its share rather than the whole of every limit. A store that
/// does not answer within one sync interval leaves the count at 1 (the
/// sync task keeps trying).
pub async fn join(policy: &ClusterPolicy) -> Result<(Store, Member), String> {
    let replica = policy.replica.clone().unwrap_or_else(default_replica_name);
    let mut store = Store::connect(policy, &replica)?;
    let member = Member::new(replica);
    sync_once(&mut store, &member, policy.sync_interval, &[]).await;
    Ok((store, member))
}

/// One heartbeat, publishing this replica's `demand`; updates `member`.
/// Returns true when the shares it holds changed enough to apply.
async fn sync_once(
    store: &mut Store,
    member: &Member,
    timeout: Duration,
    demand: &[(String, f64)],
) -> bool {
    let start = tokio::time::Instant::now();
    let result = tokio::time::timeout(timeout, store.heartbeat(demand)).await;
    let was_up = member.store_up.load(Ordering::Relaxed);
    match result {
        Ok(Ok(demands)) => {
            let rtt = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
            member.rtt_micros.store(rtt, Ordering::Relaxed);
            member.store_up.store(true, Ordering::Relaxed);
            let n = u32::try_from(demands.len()).unwrap_or(u32::MAX).max(1);
            if !was_up {
                tracing::info!(replica = %member.replica, replicas = n, "cluster store reachable");
            }
            let old_n = member.replicas.swap(n, Ordering::Relaxed);
            let shares = shares(&member.replica, &demands);
            let mut held = member.tenants.lock();
            let moved = shares.iter().any(|(t, new)| {
                held.get(t).is_none_or(|old| {
                    (old.share - new.share).abs() > 0.01 * old.share.max(new.share)
                })
            }) || shares.len() != held.len();
            *held = shares;
            old_n != n || moved
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
            false
        }
    }
}

/// Part of the cluster's demand that a replica with no demand of its own
/// keeps (of an even share), so that a tenant's first requests there are
/// not all refused.
const IDLE_FLOOR: f64 = 0.05;

/// Each tenant's share on replica `me`: (demand here + ε) / (demand in the
/// cluster + n·ε), ε = 5 % of the cluster's demand over n. The shares of a
/// tenant over all replicas add up to 1 when they read the same demands.
pub fn shares(me: &str, demands: &Demands) -> HashMap<String, TenantShare> {
    let n = demands.len().max(1) as f64;
    let mut total: HashMap<&str, f64> = HashMap::new();
    for (_, ds) in demands {
        for (t, d) in ds {
            *total.entry(t.as_str()).or_default() += d.max(0.0);
        }
    }
    let mine: HashMap<&str, f64> = demands
        .iter()
        .filter(|(r, _)| r == me)
        .flat_map(|(_, ds)| ds.iter().map(|(t, d)| (t.as_str(), d.max(0.0))))
        .collect();
    total
        .into_iter()
        .map(|(t, all)| {
            let here = mine.get(t).copied().unwrap_or(0.0);
            let share = if all <= 0.0 {
                1.0 / n
            } else {
                let eps = IDLE_FLOOR * all / n;
                (here + eps) / (all + n * eps)
            };
            let s = TenantShare {
                share,
                demand_here: here,
                demand_cluster: all,
            };
            (t.to_owned(), s)
        })
        .collect()
}

/// Requests per second of each tenant at this replica, smoothed over sync
/// intervals (half the weight on the last one).
#[derive(Default)]
struct DemandMeter {
    last: HashMap<String, u64>,
    rate: HashMap<String, f64>,
    at: Option<tokio::time::Instant>,
}

impl DemandMeter {
    fn sample(&mut self, arrivals: Vec<(String, u64)>) -> Vec<(String, f64)> {
        let now = tokio::time::Instant::now();
        let secs = self.at.map_or(0.0, |t| (now - t).as_secs_f64());
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
}

/// Renews this replica's membership every `sync_interval` and hands the
/// scheduler its new share when the count changes; leaves the cluster on
/// shutdown.
pub async fn sync_task(
    gw: Arc<Gateway>,
    mut store: Store,
    interval: Duration,
    stop: CancellationToken,
) {
    let Some(member) = gw.cluster.clone() else {
        return;
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.reset(); // `join` just synced
    let mut meter = DemandMeter::default();
    let mut replicas = member.replicas();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let arrivals: Vec<(String, u64)> = {
            let core = gw.core.lock();
            core.sched
                .arrivals()
                .map(|(t, n)| (t.to_owned(), n))
                .collect()
        };
        let demand = meter.sample(arrivals);
        if sync_once(&mut store, &member, interval, &demand).await {
            let n = member.replicas();
            if n != replicas {
                tracing::info!(replica = %member.replica, replicas = n, "cluster membership changed");
                replicas = n;
            }
            gw.apply_cluster_share();
        }
    }
    // A clean leave frees this replica's share at once for the others
    // (otherwise it expires after `replica_ttl`).
    let _ = tokio::time::timeout(interval, store.leave()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demands(rows: &[(&str, &[(&str, f64)])]) -> Demands {
        rows.iter()
            .map(|(r, ds)| {
                let ds = ds.iter().map(|(t, d)| ((*t).to_owned(), *d)).collect();
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
        let all: Vec<_> = ["r1", "r2", "r3"].iter().map(|r| shares(r, &d)).collect();
        let a: Vec<f64> = all.iter().map(|s| s["a"].share).collect();
        assert!((a.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{a:?}");
        assert!(
            a[0] > 0.7 && a[1] > 0.2 && a[2] > 0.0 && a[2] < 0.02,
            "{a:?}"
        );
        assert_eq!(all[0]["a"].demand_cluster, 40.0);
        // No demand anywhere: even shares.
        assert!(all.iter().all(|s| (s["b"].share - 1.0 / 3.0).abs() < 1e-9));
    }
}
