//! This replica's membership: its name, the store's state as last seen,
//! the cluster's count and this replica's shares, read by the metrics and
//! admin views.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::core::spec::PoolPart;

/// This replica's view of the cluster, read by the metrics and admin views.
#[derive(Debug)]
pub struct Member {
    /// This replica's name in the store.
    pub replica: String,
    /// Replicas alive at the last successful sync (this one included).
    pub(super) replicas: AtomicU32,
    pub(super) store_up: AtomicBool,
    /// Last store round trip, microseconds.
    pub(super) rtt_micros: AtomicU64,
    pub(super) store_errors: AtomicU64,
    /// Syncs that succeeded: the store round trips.
    pub(super) syncs: AtomicU64,
    /// Prefix homes this replica published, took from others, and moved
    /// (its own lost to an earlier one): [`super::homes`].
    pub(super) homes_published: AtomicU64,
    pub(super) homes_learned: AtomicU64,
    pub(super) homes_moved: AtomicU64,
    /// Woken when a request was refused for want of a lease.
    pub(super) starved: tokio::sync::Notify,
    /// Per tenant: this replica's share of its limits, its demand here and
    /// in the whole cluster (requests per second), as last read.
    pub(super) tenants: Mutex<HashMap<String, TenantShare>>,
    /// Per scheduler pool (by [`pool_key`]): this replica's share of its
    /// backends' windows.
    pub(super) pools: Mutex<HashMap<String, PoolShare>>,
}

/// One pool's share of its backends' windows on this replica.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct PoolShare {
    pub share: f64,
    /// The whole slots over the pool's backends apportioned to this
    /// replica in the last sync's round ([`super::shares::apportion`]).
    pub slots: Option<u32>,
    /// While interactive work waits to preempt at another replica: the
    /// slots kept here ([`crate::core::spec::PoolPart::yield_above`]).
    pub yield_above: Option<u32>,
    /// Requests queued or in flight here, and at all replicas.
    pub backlog_here: f64,
    pub backlog_cluster: f64,
}

impl PoolShare {
    /// What the scheduler is handed of it.
    pub fn part(&self) -> PoolPart {
        PoolPart {
            share: self.share,
            slots: self.slots,
            yield_above: self.yield_above,
        }
    }
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
    /// Prefix homes shared with the other replicas.
    pub homes: HomesShared,
    /// Whether the limits are leased from the store (else shared locally).
    pub leasing: bool,
    pub tenants: std::collections::BTreeMap<String, TenantShare>,
    pub pools: std::collections::BTreeMap<String, PoolShare>,
    /// What this replica holds of each leased limit.
    pub leases: Vec<LeaseHeld>,
}

/// Prefix homes shared with the other replicas ([`super::homes`]), since
/// start.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct HomesShared {
    /// Homes this replica gave new prefixes, published.
    pub published: u64,
    /// Homes other replicas gave first, taken here.
    pub learned: u64,
    /// Homes of this replica's that another's came before, moved there.
    pub moved: u64,
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
            homes_published: AtomicU64::new(0),
            homes_learned: AtomicU64::new(0),
            homes_moved: AtomicU64::new(0),
            starved: tokio::sync::Notify::new(),
            tenants: Mutex::new(HashMap::new()),
            pools: Mutex::new(HashMap::new()),
        }
    }

    /// This replica's part of a scheduler pool's backends, by its
    /// [`pool_key`] (the model, or `triton:` and the model): its share of
    /// their windows and its apportioned whole slots; an even share of the
    /// windows while no replica has a backlog there.
    pub fn pool_share(&self, key: &str) -> PoolPart {
        self.pools.lock().get(key).map_or_else(
            || PoolPart::share(1.0 / f64::from(self.replicas())),
            PoolShare::part,
        )
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

    /// The replica's view, with the `leases` its scheduler holds.
    pub fn view(&self, leases: Vec<(String, crate::core::admission::LeaseKind, f64)>) -> View {
        View {
            leases: leases
                .into_iter()
                .map(|(tenant, kind, held)| LeaseHeld {
                    tenant,
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
            homes: HomesShared {
                published: self.homes_published.load(Ordering::Relaxed),
                learned: self.homes_learned.load(Ordering::Relaxed),
                moved: self.homes_moved.load(Ordering::Relaxed),
            },
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
