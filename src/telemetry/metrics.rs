//! Every metric Fairway exports, defined here, with its Prometheus text
//! encoding (format 0.0.4, which `promtool check metrics` validates).
//!
//! Request-path updates take one lock per finished request
//! ([`Metrics::record`]); gauges of scheduler state (queues, windows,
//! buckets, readings) are read at scrape time by the admin handler and
//! passed to [`Metrics::encode`]. Label values come from the policy (tenant,
//! model, backend names) or from enums, never from request data.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
const OVERHEAD_BUCKETS: &[f64] = &[
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.05,
];
const TPOT_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0];

/// A cumulative histogram.
#[derive(Clone, Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }
    fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }
}

/// One finished request, as the proxy saw it.
#[derive(Clone, Debug)]
pub struct RequestRecord<'a> {
    pub tenant: &'a str,
    pub model: &'a str,
    pub outcome: &'static str,
    pub reason: &'static str,
    /// Served within the tenant's SLO.
    pub goodput: bool,
    pub queue_wait: Option<Duration>,
    pub ttft: Option<Duration>,
    pub e2e: Duration,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub gpu_seconds: f64,
    /// Time Fairway itself added (excluding queue wait and backend time).
    pub overhead: Option<Duration>,
}

type TM = (String, String);

#[derive(Debug, Default)]
struct Registry {
    requests: BTreeMap<(String, String, &'static str, &'static str), u64>,
    goodput: BTreeMap<TM, u64>,
    served: BTreeMap<TM, u64>,
    ttft: BTreeMap<TM, Histogram>,
    e2e: BTreeMap<TM, Histogram>,
    queue_wait: BTreeMap<TM, Histogram>,
    tpot: BTreeMap<TM, Histogram>,
    prompt_tokens: BTreeMap<TM, u64>,
    completion_tokens: BTreeMap<TM, u64>,
    gpu_seconds: BTreeMap<String, f64>,
    overhead: Option<Histogram>,
    reloads: BTreeMap<&'static str, u64>,
    ejections: BTreeMap<String, u64>,
}

impl EdgeCounters {
    fn encode(&self, w: &mut String) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        header(
            w,
            "fairway_listener_refusals_total",
            "counter",
            "Connections and requests the client listener refused at its caps ([server] max_connections, max_connections_per_client, max_requests).",
        );
        let _ = writeln!(
            w,
            "fairway_listener_refusals_total{{limit=\"connections\"}} {}",
            get(&self.refused_connections)
        );
        let _ = writeln!(
            w,
            "fairway_listener_refusals_total{{limit=\"connections_per_client\"}} {}",
            get(&self.refused_per_client)
        );
        let _ = writeln!(
            w,
            "fairway_listener_refusals_total{{limit=\"requests\"}} {}",
            get(&self.refused_requests)
        );
        header(
            w,
            "fairway_connections_closed_total",
            "counter",
            "Client connections Fairway closed: idle for [server] idle_timeout, or ended by the client's protocol error (malformed requests, HTTP/2 floods).",
        );
        let _ = writeln!(
            w,
            "fairway_connections_closed_total{{reason=\"idle\"}} {}",
            get(&self.closed_idle)
        );
        let _ = writeln!(
            w,
            "fairway_connections_closed_total{{reason=\"protocol_error\"}} {}",
            get(&self.closed_protocol_error)
        );
        header(
            w,
            "fairway_open_connections",
            "gauge",
            "Client connections open now.",
        );
        let _ = writeln!(
            w,
            "fairway_open_connections {}",
            get(&self.open_connections)
        );
        header(
            w,
            "fairway_panics_total",
            "counter",
            "Handler panics answered with a 500.",
        );
        let _ = writeln!(w, "fairway_panics_total {}", get(&self.panics));
        header(
            w,
            "fairway_accept_errors_total",
            "counter",
            "Failed accepts on the client and admin listeners (out of file descriptors and the like).",
        );
        let _ = writeln!(
            w,
            "fairway_accept_errors_total {}",
            get(&self.accept_errors)
        );
        header(
            w,
            "fairway_log_lines_dropped_total",
            "counter",
            "Log lines (access log included) dropped because the log's output could not keep up and its buffer (--log-buffer) was full.",
        );
        let _ = writeln!(
            w,
            "fairway_log_lines_dropped_total {}",
            super::log_writer::dropped_lines()
        );
    }
}

/// Scheduler state read at scrape time.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub tenants: Vec<TenantGauges>,
    pub backends: Vec<BackendGauges>,
    /// Jain's fairness index over backlogged tenants' weighted service in
    /// the recent window, if at least one tenant was backlogged.
    pub jain_index: Option<f64>,
    /// This replica's view of its `[cluster]`, when it has one.
    pub cluster: Option<crate::cluster::View>,
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
    pub scrape_errors: u64,
    /// Where the last reading's load signals came from: (signal, source).
    pub sources: Vec<(&'static str, &'static str)>,
}

/// The metrics handle, built once at startup and shared.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Registry>,
    /// The client listener's edge counters: plain atomics, off the
    /// registry's lock, since they move on every connection.
    pub edge: EdgeCounters,
}

/// What the client listener's edge did by itself, before a request reached
/// the scheduling path.
#[derive(Debug, Default)]
pub struct EdgeCounters {
    /// Connections closed at accept: `[server] max_connections` reached.
    pub refused_connections: AtomicU64,
    /// Connections closed at accept: `[server] max_connections_per_client`
    /// reached for their address.
    pub refused_per_client: AtomicU64,
    /// Connections closed after `[server] idle_timeout` with no request.
    pub closed_idle: AtomicU64,
    /// Connections ended by the client's protocol error.
    pub closed_protocol_error: AtomicU64,
    /// Requests answered 503: `[server] max_requests` reached.
    pub refused_requests: AtomicU64,
    /// Client connections open now.
    pub open_connections: AtomicU64,
    /// Handler panics turned into a 500.
    pub panics: AtomicU64,
    /// Failed `accept` calls (out of file descriptors and the like).
    pub accept_errors: AtomicU64,
}

/// This replica's view of its cluster.
fn encode_cluster(w: &mut String, c: &crate::cluster::View) {
    let replica = esc(&c.replica);
    header(
        w,
        "fairway_cluster_replicas",
        "gauge",
        "Gateway replicas sharing the policy's limits, as this replica last read them from the store.",
    );
    let _ = writeln!(
        w,
        "fairway_cluster_replicas{{replica=\"{replica}\"}} {}",
        c.replicas
    );
    header(
        w,
        "fairway_cluster_store_up",
        "gauge",
        "1 if the last sync with the cluster store succeeded.",
    );
    let _ = writeln!(
        w,
        "fairway_cluster_store_up{{replica=\"{replica}\"}} {}",
        u8::from(c.store_up)
    );
    header(
        w,
        "fairway_cluster_store_rtt_seconds",
        "gauge",
        "Round trip of the last successful sync with the cluster store.",
    );
    let _ = writeln!(
        w,
        "fairway_cluster_store_rtt_seconds{{replica=\"{replica}\"}} {}",
        c.store_rtt_seconds
    );
    header(
        w,
        "fairway_cluster_store_errors_total",
        "counter",
        "Syncs with the cluster store that failed (unreachable, timed out, refused).",
    );
    let _ = writeln!(
        w,
        "fairway_cluster_store_errors_total{{replica=\"{replica}\"}} {}",
        c.store_errors
    );
    header(
        w,
        "fairway_cluster_store_syncs_total",
        "counter",
        "Syncs with the cluster store that succeeded: the store round trips this replica made.",
    );
    let _ = writeln!(
        w,
        "fairway_cluster_store_syncs_total{{replica=\"{replica}\"}} {}",
        c.syncs
    );
    header(
        w,
        "fairway_cluster_leasing",
        "gauge",
        "1 while tenants' limits are leased from the store (exact for the cluster); 0 while this replica enforces its share locally (store unreachable).",
    );
    let _ = writeln!(
        w,
        "fairway_cluster_leasing{{replica=\"{replica}\"}} {}",
        u8::from(c.leasing)
    );
    header(
        w,
        "fairway_cluster_lease",
        "gauge",
        "What this replica holds of a tenant's leased limit: requests (rate), GPU-seconds (gpu_seconds, negative in debt) or slots (concurrency).",
    );
    for l in &c.leases {
        let _ = writeln!(
            w,
            "fairway_cluster_lease{{replica=\"{replica}\",tenant=\"{}\",limit=\"{}\"}} {}",
            esc(&l.tenant),
            l.limit,
            l.held
        );
    }
    header(
        w,
        "fairway_cluster_tenant_share",
        "gauge",
        "This replica's share of a tenant's limits while the store is unreachable (its part of the cluster's demand for the tenant).",
    );
    for (t, s) in &c.tenants {
        let _ = writeln!(
            w,
            "fairway_cluster_tenant_share{{replica=\"{replica}\",tenant=\"{}\"}} {}",
            esc(t),
            s.share
        );
    }
    header(
        w,
        "fairway_cluster_pool_share",
        "gauge",
        "This replica's share of a pool's backend windows (its part of the weighted fair split of the cluster's backlog).",
    );
    for (model, s) in &c.pools {
        let _ = writeln!(
            w,
            "fairway_cluster_pool_share{{replica=\"{replica}\",model=\"{}\"}} {}",
            esc(model),
            s.share
        );
    }
    header(
        w,
        "fairway_cluster_tenant_demand",
        "gauge",
        "A tenant's requests per second arriving at this replica and at the whole cluster (smoothed).",
    );
    for (t, s) in &c.tenants {
        for (scope, v) in [("replica", s.demand_here), ("cluster", s.demand_cluster)] {
            let _ = writeln!(
                w,
                "fairway_cluster_tenant_demand{{replica=\"{replica}\",tenant=\"{}\",scope=\"{scope}\"}} {v}",
                esc(t)
            );
        }
    }
}

fn key(tenant: &str, model: &str) -> TM {
    (tenant.to_owned(), model.to_owned())
}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Self {
        Metrics::default()
    }

    /// Counts one finished request: exactly one call per request.
    pub fn record(&self, r: &RequestRecord<'_>) {
        let mut g = self.inner.lock();
        *g.requests
            .entry((r.tenant.to_owned(), r.model.to_owned(), r.outcome, r.reason))
            .or_default() += 1;
        let k = key(r.tenant, r.model);
        if r.outcome == "served" {
            *g.served.entry(k.clone()).or_default() += 1;
            *g.goodput.entry(k.clone()).or_default() += u64::from(r.goodput);
            g.e2e
                .entry(k.clone())
                .or_insert_with(|| Histogram::new(LATENCY_BUCKETS))
                .observe(r.e2e.as_secs_f64());
            if let Some(t) = r.ttft {
                g.ttft
                    .entry(k.clone())
                    .or_insert_with(|| Histogram::new(LATENCY_BUCKETS))
                    .observe(t.as_secs_f64());
                if r.completion_tokens > 1 {
                    let tpot =
                        r.e2e.saturating_sub(t).as_secs_f64() / f64::from(r.completion_tokens - 1);
                    g.tpot
                        .entry(k.clone())
                        .or_insert_with(|| Histogram::new(TPOT_BUCKETS))
                        .observe(tpot);
                }
            }
        }
        if let Some(w) = r.queue_wait {
            g.queue_wait
                .entry(k.clone())
                .or_insert_with(|| Histogram::new(LATENCY_BUCKETS))
                .observe(w.as_secs_f64());
        }
        if r.prompt_tokens > 0 {
            *g.prompt_tokens.entry(k.clone()).or_default() += u64::from(r.prompt_tokens);
        }
        if r.completion_tokens > 0 {
            *g.completion_tokens.entry(k).or_default() += u64::from(r.completion_tokens);
        }
        if r.gpu_seconds > 0.0 {
            *g.gpu_seconds.entry(r.tenant.to_owned()).or_default() += r.gpu_seconds;
        }
        if let Some(o) = r.overhead {
            g.overhead
                .get_or_insert_with(|| Histogram::new(OVERHEAD_BUCKETS))
                .observe(o.as_secs_f64());
        }
    }

    /// Counts a policy reload attempt (`ok` or `failed`).
    pub fn record_reload(&self, ok: bool) {
        *self
            .inner
            .lock()
            .reloads
            .entry(if ok { "ok" } else { "failed" })
            .or_default() += 1;
    }

    /// Counts an outlier ejection of `backend`.
    pub fn record_ejection(&self, backend: &str) {
        *self
            .inner
            .lock()
            .ejections
            .entry(backend.to_owned())
            .or_default() += 1;
    }

    /// Total requests counted with `outcome` (all tenants), for tests and `top`.
    pub fn requests_with_outcome(&self, outcome: &str) -> u64 {
        self.inner
            .lock()
            .requests
            .iter()
            .filter(|(k, _)| k.2 == outcome)
            .map(|(_, v)| *v)
            .sum()
    }

    /// The whole exposition in Prometheus text format.
    pub fn encode(&self, snap: &Snapshot) -> String {
        let g = self.inner.lock();
        let mut out = String::with_capacity(8192);
        let w = &mut out;

        header(w, "fairway_build_info", "gauge", "Build information.");
        let _ = writeln!(
            w,
            "fairway_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );

        header(
            w,
            "fairway_requests_total",
            "counter",
            "Requests by final outcome; every request is counted exactly once.",
        );
        for ((t, m, o, r), v) in &g.requests {
            let _ = writeln!(
                w,
                "fairway_requests_total{{tenant=\"{}\",model=\"{}\",outcome=\"{o}\",reason=\"{r}\"}} {v}",
                esc(t),
                esc(m)
            );
        }
        counter_tm(
            w,
            "fairway_goodput_total",
            "Served responses that met the tenant's SLO (TTFT and e2e).",
            &g.goodput,
        );
        header(
            w,
            "fairway_slo_attainment_ratio",
            "gauge",
            "Share of served responses that met the tenant's SLO, since start.",
        );
        for (k, served) in &g.served {
            let good = g.goodput.get(k).copied().unwrap_or(0);
            let _ = writeln!(
                w,
                "fairway_slo_attainment_ratio{{{}}} {}",
                tm(k),
                good as f64 / (*served).max(1) as f64
            );
        }
        hist_tm(
            w,
            "fairway_ttft_seconds",
            "Time to first byte of the response body, served requests.",
            &g.ttft,
        );
        hist_tm(
            w,
            "fairway_e2e_seconds",
            "Arrival to end of response, served requests.",
            &g.e2e,
        );
        hist_tm(
            w,
            "fairway_queue_wait_seconds",
            "Time queued in Fairway before dispatch.",
            &g.queue_wait,
        );
        hist_tm(
            w,
            "fairway_time_per_output_token_seconds",
            "Decode time per output token after the first.",
            &g.tpot,
        );
        counter_tm(
            w,
            "fairway_prompt_tokens_total",
            "Prompt tokens reported by backends.",
            &g.prompt_tokens,
        );
        counter_tm(
            w,
            "fairway_completion_tokens_total",
            "Completion tokens reported by backends.",
            &g.completion_tokens,
        );
        header(
            w,
            "fairway_gpu_seconds_total",
            "counter",
            "GPU-seconds attributed to each tenant.",
        );
        for (t, v) in &g.gpu_seconds {
            let _ = writeln!(w, "fairway_gpu_seconds_total{{tenant=\"{}\"}} {v}", esc(t));
        }
        header(
            w,
            "fairway_overhead_seconds",
            "histogram",
            "Time Fairway adds to a request, excluding queue wait and backend time.",
        );
        if let Some(h) = &g.overhead {
            hist_lines(w, "fairway_overhead_seconds", "", h);
        }
        header(
            w,
            "fairway_config_reloads_total",
            "counter",
            "Policy reloads by result.",
        );
        for r in ["ok", "failed"] {
            let _ = writeln!(
                w,
                "fairway_config_reloads_total{{result=\"{r}\"}} {}",
                g.reloads.get(r).copied().unwrap_or(0)
            );
        }
        header(
            w,
            "fairway_backend_ejections_total",
            "counter",
            "Outlier ejections by backend: its requests failed in a row (5xx, connection errors, header timeouts).",
        );
        for (b, v) in &g.ejections {
            let _ = writeln!(
                w,
                "fairway_backend_ejections_total{{backend=\"{}\"}} {v}",
                esc(b)
            );
        }
        drop(g);
        self.edge.encode(w);

        type Get = fn(&TenantGauges) -> Option<f64>;
        let per_tenant: [(&str, &str, &str, Get); 7] = [
            (
                "fairway_queue_depth",
                "gauge",
                "Requests queued in Fairway per tenant.",
                |t| Some(f64::from(t.queued)),
            ),
            (
                "fairway_tenant_in_flight",
                "gauge",
                "Requests of a tenant in flight on backends.",
                |t| Some(f64::from(t.in_flight)),
            ),
            (
                "fairway_preemptions_total",
                "counter",
                "In-flight batch requests of a tenant preempted for queued interactive work.",
                |t| Some(t.preempted as f64),
            ),
            (
                "fairway_rate_bucket_requests",
                "gauge",
                "Request-rate bucket level per tenant.",
                |t| t.rate_bucket,
            ),
            (
                "fairway_gpu_seconds_bucket_level",
                "gauge",
                "GPU-seconds bucket level per tenant (negative while in debt).",
                |t| t.gpu_seconds_bucket,
            ),
            (
                "fairway_tenant_slo_ttft_seconds",
                "gauge",
                "The tenant's time-to-first-token objective.",
                |t| t.slo_ttft,
            ),
            (
                "fairway_tenant_slo_e2e_seconds",
                "gauge",
                "The tenant's end-to-end latency objective.",
                |t| t.slo_e2e,
            ),
        ];
        for (name, kind, help, get) in per_tenant {
            header(w, name, kind, help);
            for t in &snap.tenants {
                if let Some(v) = get(t) {
                    let _ = writeln!(w, "{name}{{tenant=\"{}\"}} {v}", esc(&t.tenant));
                }
            }
        }
        header(
            w,
            "fairway_jain_fairness_index",
            "gauge",
            "Jain's index over backlogged tenants' weighted service in the recent window.",
        );
        if let Some(j) = snap.jain_index {
            let _ = writeln!(w, "fairway_jain_fairness_index {j}");
        }
        if let Some(c) = &snap.cluster {
            encode_cluster(w, c);
        }
        let b = &snap.backends;
        backend_gauge(
            w,
            "fairway_backend_in_flight",
            "Requests Fairway has in flight on a backend.",
            b,
            |x| Some(f64::from(x.in_flight)),
        );
        backend_gauge(
            w,
            "fairway_backend_window",
            "Current dispatch window of a backend.",
            b,
            |x| Some(f64::from(x.window)),
        );
        backend_gauge(
            w,
            "fairway_backend_healthy",
            "1 if the backend is healthy, 0 if ejected.",
            b,
            |x| Some(f64::from(u8::from(x.healthy))),
        );
        backend_gauge(
            w,
            "fairway_backend_kv_usage_ratio",
            "Polled KV-cache usage (0..1).",
            b,
            |x| x.kv_usage,
        );
        backend_gauge(
            w,
            "fairway_backend_running",
            "Polled requests running in the engine.",
            b,
            |x| x.running.map(f64::from),
        );
        backend_gauge(
            w,
            "fairway_backend_waiting",
            "Polled requests waiting in the engine.",
            b,
            |x| x.waiting.map(f64::from),
        );
        backend_gauge(
            w,
            "fairway_backend_ttft_p99_seconds",
            "Polled TTFT p99 over the last scrape window.",
            b,
            |x| x.ttft_p99,
        );
        backend_gauge(
            w,
            "fairway_backend_reading_age_seconds",
            "Age of the backend's latest reading.",
            b,
            |x| x.reading_age,
        );
        header(
            w,
            "fairway_backend_scrape_errors_total",
            "counter",
            "Failed metric scrapes per backend.",
        );
        for x in b {
            let _ = writeln!(
                w,
                "fairway_backend_scrape_errors_total{{backend=\"{}\",model=\"{}\"}} {}",
                esc(&x.backend),
                esc(&x.model),
                x.scrape_errors
            );
        }
        header(
            w,
            "fairway_backend_reading_source",
            "gauge",
            "Which of the backend's series each load signal of its latest reading came from (1 per signal).",
        );
        for x in b {
            for (signal, source) in &x.sources {
                let _ = writeln!(
                    w,
                    "fairway_backend_reading_source{{backend=\"{}\",model=\"{}\",signal=\"{signal}\",source=\"{}\"}} 1",
                    esc(&x.backend),
                    esc(&x.model),
                    esc(source)
                );
            }
        }
        out
    }
}

fn header(w: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(w, "# HELP {name} {help}");
    let _ = writeln!(w, "# TYPE {name} {kind}");
}

fn esc(s: &str) -> String {
    if !s.contains(['\\', '"', '\n']) {
        return s.to_owned();
    }
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn tm(k: &TM) -> String {
    format!("tenant=\"{}\",model=\"{}\"", esc(&k.0), esc(&k.1))
}

fn counter_tm(w: &mut String, name: &str, help: &str, m: &BTreeMap<TM, u64>) {
    header(w, name, "counter", help);
    for (k, v) in m {
        let _ = writeln!(w, "{name}{{{}}} {v}", tm(k));
    }
}

fn hist_tm(w: &mut String, name: &str, help: &str, m: &BTreeMap<TM, Histogram>) {
    header(w, name, "histogram", help);
    for (k, h) in m {
        hist_lines(w, name, &tm(k), h);
    }
}

fn hist_lines(w: &mut String, name: &str, labels: &str, h: &Histogram) {
    let sep = if labels.is_empty() { "" } else { "," };
    let mut cum = 0;
    for (b, c) in h.bounds.iter().zip(&h.counts) {
        cum += c;
        let _ = writeln!(w, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cum}");
    }
    let _ = writeln!(w, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", h.count);
    let braces = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    let _ = writeln!(w, "{name}_sum{braces} {}", h.sum);
    let _ = writeln!(w, "{name}_count{braces} {}", h.count);
}

fn backend_gauge(
    w: &mut String,
    name: &str,
    help: &str,
    bs: &[BackendGauges],
    f: impl Fn(&BackendGauges) -> Option<f64>,
) {
    header(w, name, "gauge", help);
    for b in bs {
        if let Some(v) = f(b) {
            let _ = writeln!(
                w,
                "{name}{{backend=\"{}\",model=\"{}\"}} {v}",
                esc(&b.backend),
                esc(&b.model)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_and_counts_once() {
        let m = Metrics::new();
        let rec = RequestRecord {
            tenant: "a",
            model: "m",
            outcome: "served",
            reason: "",
            goodput: true,
            queue_wait: Some(Duration::from_millis(3)),
            ttft: Some(Duration::from_millis(40)),
            e2e: Duration::from_millis(400),
            prompt_tokens: 10,
            completion_tokens: 5,
            gpu_seconds: 0.5,
            overhead: Some(Duration::from_micros(30)),
        };
        m.record(&rec);
        m.record(&RequestRecord {
            outcome: "refused",
            reason: "rate",
            goodput: false,
            ..rec.clone()
        });
        let text = m.encode(&Snapshot::default());
        assert!(text.contains(
            "fairway_requests_total{tenant=\"a\",model=\"m\",outcome=\"served\",reason=\"\"} 1"
        ));
        assert!(text.contains(
            "fairway_requests_total{tenant=\"a\",model=\"m\",outcome=\"refused\",reason=\"rate\"} 1"
        ));
        assert!(
            text.contains("fairway_ttft_seconds_bucket{tenant=\"a\",model=\"m\",le=\"0.05\"} 1")
        );
        assert!(
            text.contains("fairway_ttft_seconds_bucket{tenant=\"a\",model=\"m\",le=\"0.025\"} 0")
        );
        assert!(text.contains("fairway_goodput_total{tenant=\"a\",model=\"m\"} 1"));
        assert_eq!(m.requests_with_outcome("served"), 1);
    }
}
