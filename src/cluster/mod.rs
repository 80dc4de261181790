//! Several gateway replicas, one policy. Each replica registers in a shared
//! Redis store with a heartbeat, reads how many replicas are alive, and
//! enforces its share of every limit (see
//! [`SchedulerSpec::shared`](crate::core::spec::SchedulerSpec::shared)): the
//! core stays sans-IO and is only handed a new spec when the count changes.
//!
//! This is the first step of cluster-wide admission: with ingress spread
//! evenly over the replicas the cluster holds the policy's limits within
//! the bound `shared` states; skewed ingress needs the leases of the next
//! step. While the store is unreachable (`on_store_failure = "local"`) a
//! replica keeps the last count it read, logs the change once and counts
//! it in `fairway_cluster_store_up`; when the store returns it registers
//! again and resyncs.

mod store;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::ClusterPolicy;
use crate::proxy::gateway::Gateway;
pub use store::Store;

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
}

/// What the metrics scrape and `/admin/policy` show of the cluster.
#[derive(Clone, Debug, serde::Serialize)]
pub struct View {
    pub replica: String,
    pub replicas: u32,
    pub store_up: bool,
    pub store_rtt_seconds: f64,
    pub store_errors: u64,
}

impl Member {
    pub fn new(replica: String) -> Self {
        Member {
            replica,
            replicas: AtomicU32::new(1),
            store_up: AtomicBool::new(false),
            rtt_micros: AtomicU64::new(0),
            store_errors: AtomicU64::new(0),
        }
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
    sync_once(&mut store, &member, policy.sync_interval).await;
    Ok((store, member))
}

/// One heartbeat; updates `member`. Returns whether the count changed.
async fn sync_once(store: &mut Store, member: &Member, timeout: Duration) -> Option<u32> {
    let start = tokio::time::Instant::now();
    let result = tokio::time::timeout(timeout, store.heartbeat()).await;
    let was_up = member.store_up.load(Ordering::Relaxed);
    match result {
        Ok(Ok(n)) => {
            let rtt = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
            member.rtt_micros.store(rtt, Ordering::Relaxed);
            member.store_up.store(true, Ordering::Relaxed);
            if !was_up {
                tracing::info!(replica = %member.replica, replicas = n, "cluster store reachable");
            }
            let old = member.replicas.swap(n.max(1), Ordering::Relaxed);
            (old != n.max(1)).then_some(n.max(1))
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
                    "cluster store unreachable: enforcing this replica's share for the last known count"
                );
            }
            None
        }
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
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        if let Some(n) = sync_once(&mut store, &member, interval).await {
            tracing::info!(replica = %member.replica, replicas = n, "cluster membership changed; applying this replica's share");
            gw.apply_cluster_share();
        }
    }
    // A clean leave frees this replica's share at once for the others
    // (otherwise it expires after `replica_ttl`).
    let _ = tokio::time::timeout(interval, store.leave()).await;
}
