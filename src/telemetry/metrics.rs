//! Every metric Fairway exports, defined here, with its Prometheus text
//! encoding (format 0.0.4, which `promtool check metrics` validates).
//!
//! A finished request is recorded with atomics on its (tenant, model)
//! [`Series`], resolved once when a policy is loaded ([`Metrics::series`]),
//! so the request path takes no lock and allocates nothing here. Gauges of
//! scheduler state (queues, windows, buckets, readings) are read at scrape
//! time by the admin handler and passed to [`Metrics::encode`]. Label values come from the policy (tenant,
//! model, backend names) or from enums, never from request data.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

pub use super::edge_counters::EdgeCounters;
use super::snapshot::encode_snapshot;
pub use super::snapshot::{BackendGauges, PrefixGauges, Snapshot, TenantGauges};
use crate::outcome::Outcome;
use crate::prom::{self, Kind};

mod histogram;

use histogram::{
    AtomicF64, AtomicHistogram, Histogram, LATENCY_BUCKETS, OVERHEAD_BUCKETS, TPOT_BUCKETS,
    hist_tm, latency_buckets,
};

/// Every per-request series of one (tenant, model).
#[derive(Debug)]
pub struct Series {
    requests: [AtomicU64; Outcome::COUNT],
    served: AtomicU64,
    goodput: AtomicU64,
    /// Its own, or its model's (shared by every tenant's series of the
    /// model: `[telemetry] per_tenant_histograms = false`).
    hists: Arc<Hists>,
    shared: bool,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    gpu_seconds: AtomicF64,
}

/// A tenant's SLO targets in seconds, for its histograms' buckets.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SloTargets {
    pub ttft: Option<f64>,
    pub e2e: Option<f64>,
}

/// The latency histograms of a series (or of a model's series).
#[derive(Debug)]
struct Hists {
    ttft: AtomicHistogram,
    e2e: AtomicHistogram,
    queue_wait: AtomicHistogram,
    tpot: AtomicHistogram,
}

impl Hists {
    fn new(slo: SloTargets) -> Self {
        Hists {
            ttft: AtomicHistogram::new(latency_buckets(slo.ttft)),
            e2e: AtomicHistogram::new(latency_buckets(slo.e2e)),
            queue_wait: AtomicHistogram::new(LATENCY_BUCKETS),
            tpot: AtomicHistogram::new(TPOT_BUCKETS),
        }
    }

    /// Each histogram with observations, into `c` under `k`.
    fn read_into(&self, k: &TM, c: &mut Counts) {
        for (h, to) in [
            (&self.ttft, &mut c.ttft),
            (&self.e2e, &mut c.e2e),
            (&self.queue_wait, &mut c.queue_wait),
            (&self.tpot, &mut c.tpot),
        ] {
            if let Some(h) = h.read() {
                to.insert(k.clone(), h);
            }
        }
    }
}

impl Series {
    fn new(hists: Option<Arc<Hists>>, slo: SloTargets) -> Self {
        Series {
            requests: std::array::from_fn(|_| AtomicU64::new(0)),
            served: AtomicU64::new(0),
            goodput: AtomicU64::new(0),
            shared: hists.is_some(),
            hists: hists.unwrap_or_else(|| Arc::new(Hists::new(slo))),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            gpu_seconds: AtomicF64::default(),
        }
    }

    fn record(&self, r: &RequestRecord) {
        let add = |c: &AtomicU64, n: u64| {
            if n > 0 {
                c.fetch_add(n, Ordering::Relaxed);
            }
        };
        add(&self.requests[r.outcome.index()], 1);
        if r.outcome == Outcome::Served {
            add(&self.served, 1);
            add(&self.goodput, u64::from(r.goodput));
            self.hists.e2e.observe(r.e2e.as_secs_f64());
            if let Some(t) = r.ttft {
                self.hists.ttft.observe(t.as_secs_f64());
                if r.completion_tokens > 1 {
                    let tpot =
                        r.e2e.saturating_sub(t).as_secs_f64() / f64::from(r.completion_tokens - 1);
                    self.hists.tpot.observe(tpot);
                }
            }
        }
        if let Some(w) = r.queue_wait {
            self.hists.queue_wait.observe(w.as_secs_f64());
        }
        add(&self.prompt_tokens, u64::from(r.prompt_tokens));
        add(&self.completion_tokens, u64::from(r.completion_tokens));
        if r.gpu_seconds > 0.0 {
            self.gpu_seconds.add(r.gpu_seconds);
        }
    }
}

/// One finished request, as the proxy saw it.
#[derive(Clone, Debug)]
pub struct RequestRecord {
    pub outcome: Outcome,
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

pub(super) type TM = (String, String);

/// What only changes off the request path: the series by tenant and
/// model, reloads and ejections; and the requests for LoRA adapters.
#[derive(Debug, Default)]
struct Registry {
    series: BTreeMap<String, BTreeMap<String, Arc<Series>>>,
    /// By model: the histograms its tenants' series share, where they do.
    model_hists: BTreeMap<String, Arc<Hists>>,
    reloads: BTreeMap<&'static str, u64>,
    ejections: BTreeMap<String, u64>,
    /// By (base model, adapter, backend).
    adapters: BTreeMap<(String, String, String), u64>,
    /// Each tenant's usage windows (the tenant usage API).
    usage: BTreeMap<String, Arc<Mutex<super::usage::TenantWindows>>>,
}

/// The series' values at one scrape, keyed for the exposition.
#[derive(Debug, Default)]
struct Counts {
    requests: BTreeMap<(TM, usize), u64>,
    goodput: BTreeMap<TM, u64>,
    served: BTreeMap<TM, u64>,
    ttft: BTreeMap<TM, Histogram>,
    e2e: BTreeMap<TM, Histogram>,
    queue_wait: BTreeMap<TM, Histogram>,
    tpot: BTreeMap<TM, Histogram>,
    prompt_tokens: BTreeMap<TM, u64>,
    completion_tokens: BTreeMap<TM, u64>,
    gpu_seconds: BTreeMap<String, f64>,
}

impl Counts {
    fn read(g: &Registry) -> Counts {
        let (series, mut c) = (&g.series, Counts::default());
        // Shared histograms are labelled with their model only.
        for (model, h) in &g.model_hists {
            h.read_into(&key("", model), &mut c);
        }
        for (tenant, models) in series {
            for (model, s) in models {
                let k = || key(tenant, model);
                let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
                for (i, n) in s.requests.iter().enumerate() {
                    if get(n) > 0 {
                        c.requests.insert((k(), i), get(n));
                    }
                }
                if get(&s.served) > 0 {
                    c.served.insert(k(), get(&s.served));
                    c.goodput.insert(k(), get(&s.goodput));
                }
                if !s.shared {
                    s.hists.read_into(&k(), &mut c);
                }
                for (n, to) in [
                    (&s.prompt_tokens, &mut c.prompt_tokens),
                    (&s.completion_tokens, &mut c.completion_tokens),
                ] {
                    if get(n) > 0 {
                        to.insert(k(), get(n));
                    }
                }
                let gpu = s.gpu_seconds.get();
                if gpu > 0.0 {
                    *c.gpu_seconds.entry(tenant.clone()).or_default() += gpu;
                }
            }
        }
        c
    }
}

/// The metrics handle, built once at startup and shared.
#[derive(Debug)]
pub struct Metrics {
    inner: Mutex<Registry>,
    /// Time Fairway itself adds to requests (all tenants).
    overhead: AtomicHistogram,
    /// The client listener's edge counters: plain atomics, off the
    /// registry's lock, since they move on every connection.
    pub edge: EdgeCounters,
}

fn key(tenant: &str, model: &str) -> TM {
    (tenant.to_owned(), model.to_owned())
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            inner: Mutex::default(),
            overhead: AtomicHistogram::new(OVERHEAD_BUCKETS),
            edge: EdgeCounters::default(),
        }
    }
}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Self {
        Metrics::default()
    }

    /// The series of (`tenant`, `model`), made on first use and kept for
    /// the process's life (a reload that drops a tenant leaves its
    /// counters as they were), its TTFT and e2e buckets bracketing `slo`
    /// as it was then (a reload that changes an SLO keeps the buckets
    /// until the next start: a histogram's buckets never move under
    /// Prometheus). Its histograms are its own with `by_tenant`, else its
    /// model's, shared with every tenant's (with the default buckets).
    /// Called when a policy is loaded, and for the few requests that end
    /// before they have a declared tenant and model.
    pub fn series(
        &self,
        tenant: &str,
        model: &str,
        slo: SloTargets,
        by_tenant: bool,
    ) -> Arc<Series> {
        let mut g = self.inner.lock();
        if let Some(s) = g.series.get(tenant).and_then(|m| m.get(model)) {
            return s.clone();
        }
        let hists = (!by_tenant).then(|| {
            g.model_hists
                .entry(model.to_owned())
                .or_insert_with(|| Arc::new(Hists::new(SloTargets::default())))
                .clone()
        });
        g.series
            .entry(tenant.to_owned())
            .or_default()
            .entry(model.to_owned())
            .or_insert_with(|| Arc::new(Series::new(hists, slo)))
            .clone()
    }

    /// The usage windows of `tenant`, made on first use and kept for the
    /// process's life, like its series. Called when a policy is loaded.
    pub fn usage(&self, tenant: &str) -> Arc<Mutex<super::usage::TenantWindows>> {
        self.inner
            .lock()
            .usage
            .entry(tenant.to_owned())
            .or_default()
            .clone()
    }

    /// Counts one finished request on its series: exactly one call per
    /// request.
    pub fn record(&self, series: &Series, r: &RequestRecord) {
        series.record(r);
        if let Some(o) = r.overhead {
            self.overhead.observe(o.as_secs_f64());
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

    /// Counts a request for LoRA `adapter` of `model` sent to `backend`
    /// (each time it is sent).
    pub fn record_adapter(&self, model: &str, adapter: &str, backend: &str) {
        let key = (model.to_owned(), adapter.to_owned(), backend.to_owned());
        *self.inner.lock().adapters.entry(key).or_default() += 1;
    }

    /// Total requests counted with `outcome` (all tenants), for tests and `top`.
    pub fn requests_with_outcome(&self, outcome: &str) -> u64 {
        let g = self.inner.lock();
        let series = g.series.values().flat_map(|m| m.values());
        series
            .flat_map(|s| {
                Outcome::ALL
                    .iter()
                    .filter(|o| o.as_str() == outcome)
                    .map(|o| s.requests[o.index()].load(Ordering::Relaxed))
            })
            .sum()
    }

    /// The whole exposition in Prometheus text format.
    pub fn encode(&self, snap: &Snapshot) -> String {
        let g = self.inner.lock();
        let mut out = String::with_capacity(8192);
        let w = &mut out;
        prom::family(w, "fairway_build_info", Kind::Gauge, "Build information.")
            .sample(&[("version", env!("CARGO_PKG_VERSION"))], 1);
        encode_requests(w, &Counts::read(&g));
        self.encode_registry(w, &g);
        recent_quantiles(w, &g.usage);
        drop(g);
        self.edge.encode(w);
        encode_snapshot(w, snap);
        out
    }

    /// Fairway's own time per request, and what only changes off the
    /// request path: reloads, ejections, adapters.
    fn encode_registry(&self, w: &mut String, g: &Registry) {
        let mut f = prom::family(
            w,
            "fairway_overhead_seconds",
            Kind::Histogram,
            "Time Fairway adds to a request, excluding queue wait and backend time.",
        );
        if let Some(h) = self.overhead.read() {
            h.write(&mut f, &[]);
        }
        let mut f = prom::family(
            w,
            "fairway_config_reloads_total",
            Kind::Counter,
            "Policy reloads by result.",
        );
        for r in ["ok", "failed"] {
            f.sample(&[("result", r)], g.reloads.get(r).copied().unwrap_or(0));
        }
        let mut f = prom::family(
            w,
            "fairway_backend_ejections_total",
            Kind::Counter,
            "Outlier ejections by backend: its requests failed in a row (5xx, connection errors, header timeouts).",
        );
        for (b, v) in &g.ejections {
            f.sample(&[("backend", b)], v);
        }
        let mut f = prom::family(
            w,
            "fairway_adapter_requests_total",
            Kind::Counter,
            "Requests for a LoRA adapter sent to a backend, by base model, adapter and backend (a request preempted and sent again counts each time).",
        );
        for ((m, a, b), v) in &g.adapters {
            f.sample(&[("model", m), ("adapter", a), ("backend", b)], v);
        }
    }
}

/// The families of finished requests, by (tenant, model): outcomes,
/// goodput and SLO attainment, latency histograms, tokens, GPU-seconds.
fn encode_requests(w: &mut String, c: &Counts) {
    let mut f = prom::family(
        w,
        "fairway_requests_total",
        Kind::Counter,
        "Requests by final outcome; every request is counted exactly once.",
    );
    for (((t, m), i), v) in &c.requests {
        let o = Outcome::ALL[*i];
        let labels: [(&str, &str); 4] = [
            ("tenant", t),
            ("model", m),
            ("outcome", o.as_str()),
            ("reason", o.reason()),
        ];
        f.sample(&labels, v);
    }
    counter_tm(
        w,
        "fairway_goodput_total",
        "Served responses that met the tenant's SLO (TTFT and e2e).",
        &c.goodput,
    );
    let mut f = prom::family(
        w,
        "fairway_slo_attainment_ratio",
        Kind::Gauge,
        "Share of served responses that met the tenant's SLO, since start.",
    );
    for (k, served) in &c.served {
        let good = c.goodput.get(k).copied().unwrap_or(0);
        f.sample(&tm(k), good as f64 / (*served).max(1) as f64);
    }
    for (name, help, m) in [
        (
            "fairway_ttft_seconds",
            "Time to first byte of the response body, served requests.",
            &c.ttft,
        ),
        (
            "fairway_e2e_seconds",
            "Arrival to end of response, served requests.",
            &c.e2e,
        ),
        (
            "fairway_queue_wait_seconds",
            "Time queued in Fairway before dispatch.",
            &c.queue_wait,
        ),
        (
            "fairway_time_per_output_token_seconds",
            "Decode time per output token after the first.",
            &c.tpot,
        ),
    ] {
        hist_tm(w, name, help, m);
    }
    counter_tm(
        w,
        "fairway_prompt_tokens_total",
        "Prompt tokens reported by backends.",
        &c.prompt_tokens,
    );
    counter_tm(
        w,
        "fairway_completion_tokens_total",
        "Completion tokens reported by backends.",
        &c.completion_tokens,
    );
    let mut f = prom::family(
        w,
        "fairway_gpu_seconds_total",
        Kind::Counter,
        "GPU-seconds attributed to each tenant.",
    );
    for (t, v) in &c.gpu_seconds {
        f.sample(&[("tenant", t)], v);
    }
}

/// Seconds the "recent" gauges look back: the usage windows' minute
/// buckets that started in the last minute (the one under way and the
/// one before).
const RECENT: u64 = 60;

/// Each tenant's TTFT and e2e p50/p99 over the last minute, from its usage
/// windows' sketches (within 2 %, never above the slowest), and the
/// responses behind them: what `fairway top` shows, where the histogram
/// buckets would round.
fn recent_quantiles(
    w: &mut String,
    usage: &BTreeMap<String, Arc<Mutex<super::usage::TenantWindows>>>,
) {
    let now = crate::clock::unix_seconds_f64();
    let windows: Vec<(&String, super::usage::WindowStats)> = usage
        .iter()
        .map(|(t, u)| (t, u.lock().window(now, RECENT)))
        .filter(|(_, s)| s.served > 0)
        .collect();
    for (name, help, pick) in [
        (
            "fairway_tenant_recent_ttft_p50_seconds",
            "Median TTFT of the tenant's responses in the last minute (DDSketch: within 2 %).",
            (|s: &super::usage::WindowStats| s.ttft_seconds.p50) as fn(&_) -> _,
        ),
        (
            "fairway_tenant_recent_ttft_p99_seconds",
            "TTFT p99 of the tenant's responses in the last minute (DDSketch: within 2 %, never above the slowest).",
            |s: &super::usage::WindowStats| s.ttft_seconds.p99,
        ),
        (
            "fairway_tenant_recent_e2e_p50_seconds",
            "Median end-to-end time of the tenant's responses in the last minute (DDSketch: within 2 %).",
            |s: &super::usage::WindowStats| s.e2e_seconds.p50,
        ),
        (
            "fairway_tenant_recent_e2e_p99_seconds",
            "End-to-end p99 of the tenant's responses in the last minute (DDSketch: within 2 %, never above the slowest).",
            |s: &super::usage::WindowStats| s.e2e_seconds.p99,
        ),
    ] {
        let mut f = prom::family(w, name, Kind::Gauge, help);
        for (t, s) in &windows {
            if let Some(v) = pick(s) {
                f.sample(&[("tenant", t)], v);
            }
        }
    }
    let mut f = prom::family(
        w,
        "fairway_tenant_recent_responses",
        Kind::Gauge,
        "Responses served to the tenant in the last minute, behind its recent quantiles (under 100: the p99 is the slowest few).",
    );
    for (t, s) in &windows {
        f.sample(&[("tenant", t)], s.served);
    }
}

/// A (tenant, model) key's labels; a model's own (shared histograms)
/// when the tenant is empty, which no tenant's name is.
pub(super) fn tm(k: &TM) -> Vec<(&'static str, &str)> {
    if k.0.is_empty() {
        return vec![("model", &k.1)];
    }
    vec![("tenant", &k.0), ("model", &k.1)]
}

/// A counter family by (tenant, model) key.
fn counter_tm(w: &mut String, name: &str, help: &str, m: &BTreeMap<TM, u64>) {
    let mut f = prom::family(w, name, Kind::Counter, help);
    for (k, v) in m {
        f.sample(&tm(k), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request served within its SLO: 40 ms to first token, 400 ms in all.
    fn served() -> RequestRecord {
        RequestRecord {
            outcome: Outcome::Served,
            goodput: true,
            queue_wait: Some(Duration::from_millis(3)),
            ttft: Some(Duration::from_millis(40)),
            e2e: Duration::from_millis(400),
            prompt_tokens: 10,
            completion_tokens: 5,
            gpu_seconds: 0.5,
            overhead: Some(Duration::from_micros(30)),
        }
    }

    #[test]
    fn histogram_is_cumulative_and_counts_once() {
        let m = Metrics::new();
        let s = m.series("a", "m", SloTargets::default(), true);
        let rec = served();
        m.record(&s, &rec);
        m.record(
            &m.series("a", "m", SloTargets::default(), true),
            &RequestRecord {
                outcome: Outcome::Refused(crate::outcome::RefusedBy::Limit(
                    crate::core::admission::LimitKind::Rate,
                )),
                goodput: false,
                ..rec.clone()
            },
        );
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

    /// `per_tenant_histograms = false`: every tenant's counters, one set
    /// of histograms per model.
    #[test]
    fn histograms_by_model_are_shared_by_its_tenants() {
        let m = Metrics::new();
        let rec = RequestRecord {
            overhead: None,
            ..served()
        };
        for t in ["a", "b", "c"] {
            m.record(&m.series(t, "m", SloTargets::default(), false), &rec);
        }
        let text = m.encode(&Snapshot::default());
        assert!(
            text.contains("fairway_ttft_seconds_count{model=\"m\"} 3"),
            "{text}"
        );
        assert!(
            !text.contains("fairway_ttft_seconds_count{tenant="),
            "{text}"
        );
        assert!(text.contains("fairway_goodput_total{tenant=\"b\",model=\"m\"} 1"));
        let lines = |name: &str| text.lines().filter(|l| l.starts_with(name)).count();
        assert_eq!(lines("fairway_e2e_seconds_count"), 1);
    }

    /// A tenant's TTFT and e2e buckets bracket its SLO targets: a 511 ms
    /// p99 against a 500 ms target interpolates within (500, 550] ms.
    #[test]
    fn latency_buckets_bracket_the_slo() {
        let m = Metrics::new();
        let slo = SloTargets {
            ttft: Some(0.5),
            e2e: Some(7.0),
        };
        let s = m.series("a", "m", slo, true);
        m.record(
            &s,
            &RequestRecord {
                outcome: Outcome::Served,
                goodput: false,
                queue_wait: None,
                ttft: Some(Duration::from_millis(511)),
                e2e: Duration::from_secs(8),
                prompt_tokens: 1,
                completion_tokens: 1,
                gpu_seconds: 0.0,
                overhead: None,
            },
        );
        let text = m.encode(&Snapshot::default());
        let le =
            |name: &str, b: &str| format!("{name}_bucket{{tenant=\"a\",model=\"m\",le=\"{b}\"}}");
        for (b, n) in [
            ("0.4", 0),
            ("0.45", 0),
            ("0.5", 0),
            ("0.55", 1),
            ("0.625", 1),
        ] {
            assert!(
                text.contains(&format!("{} {n}", le("fairway_ttft_seconds", b))),
                "{b}: {text}"
            );
        }
        for b in ["5.6", "6.3", "7", "7.7", "8.75"] {
            assert!(text.contains(&le("fairway_e2e_seconds", b)), "{b}");
        }
        // The queue wait keeps the plain ladder.
        assert_eq!(latency_buckets(None), LATENCY_BUCKETS);
        assert_eq!(
            latency_buckets(Some(1.0))
                .iter()
                .filter(|&&b| b == 1.0)
                .count(),
            1
        );
    }

    /// The usage windows' last minute is exported per tenant, for `top`.
    #[test]
    fn recent_quantiles_come_from_the_usage_sketches() {
        let m = Metrics::new();
        let now = crate::clock::unix_seconds_f64();
        let u = m.usage("a");
        for ms in [100.0, 200.0, 511.0] {
            u.lock().record(
                now,
                &super::super::usage::UsageRecord {
                    outcome: Outcome::Served,
                    goodput: true,
                    ttft: Some(ms / 1000.0),
                    e2e: 1.0,
                    queue_wait: None,
                    preempted: false,
                    gpu_seconds: 0.0,
                },
            );
        }
        let text = m.encode(&Snapshot::default());
        let p99: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("fairway_tenant_recent_ttft_p99_seconds{tenant=\"a\"} "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((0.50..=0.511).contains(&p99), "{p99}");
        // Three responses: the p99 is the slowest, within 2 %, never above.
        assert!(text.contains("fairway_tenant_recent_responses{tenant=\"a\"} 3"));
    }
}
