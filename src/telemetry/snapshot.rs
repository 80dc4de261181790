//! The scrape-time half of the exposition: the scheduler's state as the
//! admin handler reads it under the lock ([`Snapshot`]), and its families
//! (tenants' queues and buckets, the fairness index, the cluster, pools
//! and backends).

use std::collections::BTreeMap;

use crate::core::routing::Placement;
use crate::prom::{self, Kind};

mod prefix;
use prefix::encode_prefix;

/// Scheduler state read at scrape time.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub tenants: Vec<TenantGauges>,
    pub backends: Vec<BackendGauges>,
    /// Queued requests per model (its pools' fair queues and late lanes).
    pub queued_by_model: Vec<(String, u32)>,
    /// Jain's fairness index over backlogged tenants' weighted service in
    /// the recent window, if at least one tenant was backlogged.
    pub jain_index: Option<f64>,
    /// This replica's view of its `[cluster]`, when it has one.
    pub cluster: Option<crate::cluster::View>,
    /// The prefix index of each pool that routes on prefixes.
    pub prefix: Vec<PrefixGauges>,
    /// Per model with a tokenizer: chats whose template failed, and those
    /// past its budget, since the policy loaded it.
    pub template_fallbacks: Vec<(String, u64, u64)>,
}

/// A pool's prefix index.
#[derive(Clone, Debug, Default)]
pub struct PrefixGauges {
    pub model: String,
    pub entries: usize,
    pub capacity: usize,
    /// Counters.
    pub evictions: u64,
    /// By `Placement::index`.
    pub placements: [u64; Placement::ALL.len()],
    pub local: u64,
}

/// Per-tenant gauges.
#[derive(Clone, Debug, Default)]
pub struct TenantGauges {
    pub tenant: String,
    pub queued: u32,
    pub in_flight: u32,
    /// Requests preempted so far (counter).
    pub preempted: u64,
    pub rate_bucket: Option<f64>,
    pub gpu_seconds_bucket: Option<f64>,
    /// The tenant's SLO targets, seconds (declared tenants only).
    pub slo_ttft: Option<f64>,
    pub slo_e2e: Option<f64>,
}

/// Per-backend gauges.
#[derive(Clone, Debug, Default)]
pub struct BackendGauges {
    pub backend: String,
    pub model: String,
    pub in_flight: u32,
    pub window: u32,
    pub healthy: bool,
    pub kv_usage: Option<f64>,
    pub running: Option<u32>,
    pub waiting: Option<u32>,
    pub ttft_p99: Option<f64>,
    pub reading_age: Option<f64>,
    /// Batch items it may run by the batch lane's loop (`None`: no limit).
    pub batch_limit: Option<f64>,
    pub scrape_errors: u64,
    /// Where the last reading's load signals came from: (signal, source).
    pub sources: Vec<(&'static str, &'static str)>,
    /// Prompt tokens the prefix index predicted it held, over the requests
    /// sent to it (a counter; pools that route on prefixes only).
    pub predicted_cached_tokens: Option<u64>,
    /// Prompt tokens it reported it found in its prefix cache (usage
    /// `cached_tokens`; a counter), and the prompt tokens of the
    /// requests that reported a count.
    pub reported_cached_tokens: u64,
    pub reported_prompt_tokens: u64,
    /// Its KV-event subscriber's counters, when it has `kv_events`.
    pub kv_events: Option<crate::poller::KvEventCounts>,
}

/// Writes the families read from `snap`.
pub(super) fn encode_snapshot(w: &mut String, snap: &Snapshot) {
    encode_tenants(w, &snap.tenants);
    let mut f = prom::family(
        w,
        "fairway_jain_fairness_index",
        Kind::Gauge,
        "Jain's index over backlogged tenants' weighted service in the recent window.",
    );
    if let Some(j) = snap.jain_index {
        f.sample(&[], j);
    }
    if let Some(c) = &snap.cluster {
        encode_cluster(w, c);
    }
    encode_pools(w, snap);
    encode_prefix(w, snap);
    encode_backends(w, &snap.backends);
}
/// The per-tenant families.
fn encode_tenants(w: &mut String, tenants: &[TenantGauges]) {
    type Get = fn(&TenantGauges) -> Option<f64>;
    let per_tenant: [(&str, Kind, &str, Get); 7] = [
        (
            "fairway_queue_depth",
            Kind::Gauge,
            "Requests queued in Fairway per tenant.",
            |t| Some(f64::from(t.queued)),
        ),
        (
            "fairway_tenant_in_flight",
            Kind::Gauge,
            "Requests of a tenant in flight on backends.",
            |t| Some(f64::from(t.in_flight)),
        ),
        (
            "fairway_preemptions_total",
            Kind::Counter,
            "In-flight batch requests of a tenant preempted for queued interactive work.",
            |t| Some(t.preempted as f64),
        ),
        (
            "fairway_rate_bucket_requests",
            Kind::Gauge,
            "Request-rate bucket level per tenant.",
            |t| t.rate_bucket,
        ),
        (
            "fairway_gpu_seconds_bucket_level",
            Kind::Gauge,
            "GPU-seconds bucket level per tenant (negative while in debt).",
            |t| t.gpu_seconds_bucket,
        ),
        (
            "fairway_tenant_slo_ttft_seconds",
            Kind::Gauge,
            "The tenant's time-to-first-token objective.",
            |t| t.slo_ttft,
        ),
        (
            "fairway_tenant_slo_e2e_seconds",
            Kind::Gauge,
            "The tenant's end-to-end latency objective.",
            |t| t.slo_e2e,
        ),
    ];
    for (name, kind, help, get) in per_tenant {
        let mut f = prom::family(w, name, kind, help);
        for t in tenants {
            if let Some(v) = get(t) {
                f.sample(&[("tenant", &t.tenant)], v);
            }
        }
    }
}

/// The per-backend families: Fairway's own counts, and its latest
/// reading's.
fn encode_backends(w: &mut String, backends: &[BackendGauges]) {
    type Get = fn(&BackendGauges) -> Option<f64>;
    let gauges: [(&str, &str, Get); 9] = [
        (
            "fairway_backend_in_flight",
            "Requests Fairway has in flight on a backend.",
            |x| Some(f64::from(x.in_flight)),
        ),
        (
            "fairway_backend_window",
            "Current dispatch window of a backend.",
            |x| Some(f64::from(x.window)),
        ),
        (
            "fairway_backend_batch_limit",
            "Batch items a backend may run now, by the batch lane's loop on live latency ([batch] live_latency_target); absent while it sets no limit.",
            |x| x.batch_limit,
        ),
        (
            "fairway_backend_healthy",
            "1 if the backend is healthy, 0 if ejected.",
            |x| Some(f64::from(u8::from(x.healthy))),
        ),
        (
            "fairway_backend_kv_usage_ratio",
            "Polled KV-cache usage (0..1).",
            |x| x.kv_usage,
        ),
        (
            "fairway_backend_running",
            "Polled requests running in the engine.",
            |x| x.running.map(f64::from),
        ),
        (
            "fairway_backend_waiting",
            "Polled requests waiting in the engine.",
            |x| x.waiting.map(f64::from),
        ),
        (
            "fairway_backend_ttft_p99_seconds",
            "Polled TTFT p99 over the last scrape window.",
            |x| x.ttft_p99,
        ),
        (
            "fairway_backend_reading_age_seconds",
            "Age of the backend's latest reading.",
            |x| x.reading_age,
        ),
    ];
    for (name, help, get) in gauges {
        let mut f = prom::family(w, name, Kind::Gauge, help);
        for b in backends {
            if let Some(v) = get(b) {
                f.sample(&[("backend", &b.backend), ("model", &b.model)], v);
            }
        }
    }
    encode_scrapes(w, backends);
}

/// How each backend's scrapes went: failures, and where its latest
/// reading's load signals came from.
fn encode_scrapes(w: &mut String, backends: &[BackendGauges]) {
    let mut f = prom::family(
        w,
        "fairway_backend_scrape_errors_total",
        Kind::Counter,
        "Failed metric scrapes per backend.",
    );
    for b in backends {
        f.sample(
            &[("backend", &b.backend), ("model", &b.model)],
            b.scrape_errors,
        );
    }
    let mut f = prom::family(
        w,
        "fairway_backend_reading_source",
        Kind::Gauge,
        "Which of the backend's series each load signal of its latest reading came from (1 per signal).",
    );
    for b in backends {
        for (signal, source) in &b.sources {
            let labels: [(&str, &str); 4] = [
                ("backend", &b.backend),
                ("model", &b.model),
                ("signal", signal),
                ("source", source),
            ];
            f.sample(&labels, 1);
        }
    }
}

/// Per model, what an autoscaler scales on: demand against capacity and
/// the KV headroom left (README, Observability).
fn encode_pools(w: &mut String, snap: &Snapshot) {
    #[derive(Default)]
    struct Pool {
        queued: u32,
        in_flight: u32,
        capacity: u32,
        /// Sum of free KV fractions, and how many backends gave one.
        kv_free: f64,
        kv_read: u32,
    }
    let mut pools: BTreeMap<&str, Pool> = BTreeMap::new();
    for (model, queued) in &snap.queued_by_model {
        pools.entry(model).or_default().queued += queued;
    }
    for b in &snap.backends {
        let p = pools.entry(&b.model).or_default();
        p.in_flight += b.in_flight;
        if b.healthy {
            p.capacity += b.window;
            if let Some(kv) = b.kv_usage {
                p.kv_free += (1.0 - kv).clamp(0.0, 1.0);
                p.kv_read += 1;
            }
        }
    }
    type Get = fn(&Pool) -> Option<f64>;
    let gauges: [(&str, &str, Get); 5] = [
        (
            "fairway_pool_queued_requests",
            "Requests queued in Fairway for the model, all tenants.",
            |p| Some(f64::from(p.queued)),
        ),
        (
            "fairway_pool_in_flight",
            "Requests Fairway has in flight on the model's backends.",
            |p| Some(f64::from(p.in_flight)),
        ),
        (
            "fairway_pool_capacity",
            "Requests the model's healthy backends take at once: the sum of their dispatch windows.",
            |p| Some(f64::from(p.capacity)),
        ),
        (
            "fairway_pool_demand_ratio",
            "Queued plus in-flight requests over capacity: above 1, requests wait at the gateway (absent with no healthy backend).",
            |p| (p.capacity > 0).then(|| f64::from(p.queued + p.in_flight) / f64::from(p.capacity)),
        ),
        (
            "fairway_pool_kv_headroom_ratio",
            "Mean free KV-cache fraction over the model's healthy backends with a fresh reading (absent without one).",
            |p| (p.kv_read > 0).then(|| p.kv_free / f64::from(p.kv_read)),
        ),
    ];
    for (name, help, get) in gauges {
        let mut f = prom::family(w, name, Kind::Gauge, help);
        for (model, p) in &pools {
            if let Some(v) = get(p) {
                f.sample(&[("model", model)], v);
            }
        }
    }
}

/// This replica's view of its cluster: the store, the replicas and the
/// prefix homes they share.
fn encode_cluster(w: &mut String, c: &crate::cluster::View) {
    let replica = [("replica", c.replica.as_str())];
    prom::family(
        w,
        "fairway_cluster_replicas",
        Kind::Gauge,
        "Gateway replicas sharing the policy's limits, as this replica last read them from the store.",
    )
    .sample(&replica, c.replicas);
    prom::family(
        w,
        "fairway_cluster_store_up",
        Kind::Gauge,
        "1 if the last sync with the cluster store succeeded.",
    )
    .sample(&replica, u8::from(c.store_up));
    prom::family(
        w,
        "fairway_cluster_store_rtt_seconds",
        Kind::Gauge,
        "Round trip of the last successful sync with the cluster store.",
    )
    .sample(&replica, c.store_rtt_seconds);
    prom::family(
        w,
        "fairway_cluster_store_errors_total",
        Kind::Counter,
        "Syncs with the cluster store that failed (unreachable, timed out, refused).",
    )
    .sample(&replica, c.store_errors);
    prom::family(
        w,
        "fairway_cluster_store_syncs_total",
        Kind::Counter,
        "Syncs with the cluster store that succeeded: the store round trips this replica made.",
    )
    .sample(&replica, c.syncs);
    let mut f = prom::family(
        w,
        "fairway_cluster_prefix_homes_total",
        Kind::Counter,
        "Prefix homes shared with the other replicas: published (given to new prefixes here), learned (given first by another replica), moved (given here after another replica's, moved to it).",
    );
    for (way, n) in [
        ("published", c.homes.published),
        ("learned", c.homes.learned),
        ("moved", c.homes.moved),
    ] {
        f.sample(&[replica[0], ("way", way)], n);
    }
    prom::family(
        w,
        "fairway_cluster_leasing",
        Kind::Gauge,
        "1 while tenants' limits are leased from the store (exact for the cluster); 0 while this replica enforces its share locally (store unreachable).",
    )
    .sample(&replica, u8::from(c.leasing));
    encode_cluster_shares(w, c);
}

/// What this replica holds of the cluster's limits and windows, and the
/// demand it sees.
fn encode_cluster_shares(w: &mut String, c: &crate::cluster::View) {
    let replica = ("replica", c.replica.as_str());
    let mut f = prom::family(
        w,
        "fairway_cluster_lease",
        Kind::Gauge,
        "What this replica holds of a tenant's leased limit: requests (rate), GPU-seconds (gpu_seconds, negative in debt) or slots (concurrency).",
    );
    for l in &c.leases {
        f.sample(
            &[replica, ("tenant", &l.tenant), ("limit", l.limit)],
            l.held,
        );
    }
    let mut f = prom::family(
        w,
        "fairway_cluster_tenant_share",
        Kind::Gauge,
        "This replica's share of a tenant's limits while the store is unreachable (its part of the cluster's demand for the tenant).",
    );
    for (t, s) in &c.tenants {
        f.sample(&[replica, ("tenant", t)], s.share);
    }
    let mut f = prom::family(
        w,
        "fairway_cluster_pool_share",
        Kind::Gauge,
        "This replica's share of a pool's backend windows (its part of the weighted fair split of the cluster's backlog).",
    );
    for (model, s) in &c.pools {
        f.sample(&[replica, ("model", model)], s.share);
    }
    let mut f = prom::family(
        w,
        "fairway_cluster_pool_slots",
        Kind::Gauge,
        "The whole slots over a pool's backends apportioned to this replica in the last sync (its share of the pool's slots, floor or ceiling in turn).",
    );
    for (model, s) in &c.pools {
        if let Some(slots) = s.slots {
            f.sample(&[replica, ("model", model)], slots);
        }
    }
    let mut f = prom::family(
        w,
        "fairway_cluster_tenant_demand",
        Kind::Gauge,
        "A tenant's requests per second arriving at this replica and at the whole cluster (smoothed).",
    );
    for (t, s) in &c.tenants {
        for (scope, v) in [("replica", s.demand_here), ("cluster", s.demand_cluster)] {
            f.sample(&[replica, ("tenant", t), ("scope", scope)], v);
        }
    }
}
