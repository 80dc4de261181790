//! `fairway top`: a terminal view of a running gateway for operators
//! without Grafana. This is the rendering half, and it is sans-IO.
//!
//! The caller fetches the gateway's admin `/metrics` body, turns it into a
//! [`Snapshot`] together with the instant it was read
//! ([`Snapshot::from_text`]), and passes the previous and the current
//! snapshot to [`render`], which returns plain text to print after clearing
//! the screen. Counters become rates over the interval between the two
//! scrapes, and histograms give p99s over the observations made in that
//! interval.
//!
//! What it reads, by the names and labels that
//! [`crate::telemetry::metrics`] exports:
//! - `fairway_requests_total{tenant,model,outcome,reason}` and
//!   `fairway_goodput_total{tenant,model}`, for request, served, goodput
//!   and refusal rates;
//! - `fairway_ttft_seconds_bucket` and `fairway_e2e_seconds_bucket`
//!   `{tenant,model,le}`, summed over models, for p99s;
//! - `fairway_queue_depth`, `fairway_tenant_in_flight`, `fairway_preemptions_total` (a rate),
//!   `fairway_tenant_slo_ttft_seconds` and `fairway_tenant_slo_e2e_seconds`
//!   `{tenant}`;
//! - `fairway_backend_{healthy,in_flight,window,kv_usage_ratio,waiting,reading_age_seconds}`
//!   `{backend,model}`;
//! - `fairway_jain_fairness_index` and `fairway_overhead_seconds_bucket{le}`.
//!
//! A counter that went down between two scrapes (the gateway restarted) is
//! read as having started again from zero, so a rate is never negative; a
//! histogram whose buckets went down is read the same way.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::poller::expo::parse_float;
use crate::poller::{Bucket, Sample, parse, quantile};

/// The quantile shown for latencies.
const P99: f64 = 0.99;

/// A `fairway_requests_total` series of one tenant: (model, outcome, reason).
type Series = (String, String, String);

/// Cumulative histogram buckets by model.
type ByModel = BTreeMap<String, Vec<Bucket>>;

/// One tenant's figures in one scrape.
#[derive(Clone, Debug, Default, PartialEq)]
struct TenantFigures {
    /// `fairway_requests_total` by (model, outcome, reason).
    requests: BTreeMap<Series, f64>,
    /// `fairway_goodput_total` by model.
    goodput: BTreeMap<String, f64>,
    /// `fairway_ttft_seconds` buckets by model.
    ttft: ByModel,
    /// `fairway_e2e_seconds` buckets by model.
    e2e: ByModel,
    /// `fairway_queue_depth`.
    queued: Option<f64>,
    /// `fairway_tenant_in_flight`.
    in_flight: Option<f64>,
    /// `fairway_preemptions_total`.
    preempted: Option<f64>,
    /// `fairway_tenant_slo_ttft_seconds`.
    slo_ttft: Option<f64>,
    /// `fairway_tenant_slo_e2e_seconds`.
    slo_e2e: Option<f64>,
}

/// One backend's gauges in one scrape.
#[derive(Clone, Debug, Default, PartialEq)]
struct BackendFigures {
    healthy: Option<f64>,
    in_flight: Option<f64>,
    window: Option<f64>,
    kv_usage: Option<f64>,
    waiting: Option<f64>,
    reading_age: Option<f64>,
}

/// Counters of one scrape, kept to turn the next scrape into rates.
///
/// Also holds the scrape's gauges (queues, in-flight counts, SLO targets,
/// backend state), which [`render`] shows as they are.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// When the body was read, in seconds on any clock the caller keeps
    /// steady between scrapes.
    at_secs: f64,
    /// Per-tenant figures, by tenant name.
    tenants: BTreeMap<String, TenantFigures>,
    /// Per-backend gauges, by (backend, model).
    backends: BTreeMap<(String, String), BackendFigures>,
    /// `fairway_jain_fairness_index`, when exported.
    jain: Option<f64>,
    /// `fairway_overhead_seconds` cumulative buckets.
    overhead: Vec<Bucket>,
}

impl Snapshot {
    /// Reads a `/metrics` body read at `at_secs` (seconds on a clock the
    /// caller keeps steady between scrapes; only differences are used).
    ///
    /// `Err` (a message for the operator) when the body is not a Prometheus
    /// exposition, or holds no `fairway_` metric at all (the address is
    /// some other server).
    pub fn from_text(text: &str, at_secs: f64) -> Result<Snapshot, String> {
        let expo = parse(text).map_err(|e| format!("not a Prometheus exposition: {e}"))?;
        if !expo.samples.iter().any(|s| s.name.starts_with("fairway_")) {
            return Err(
                "no fairway_ metrics in the body; is this Fairway's admin /metrics endpoint?"
                    .to_owned(),
            );
        }
        let mut snap = Snapshot {
            at_secs,
            ..Snapshot::default()
        };
        for s in &expo.samples {
            snap.add(s);
        }
        Ok(snap)
    }

    /// When the body was read, as passed to [`Snapshot::from_text`].
    pub fn at_secs(&self) -> f64 {
        self.at_secs
    }

    /// Folds one sample in; samples of other families are ignored.
    fn add(&mut self, s: &Sample) {
        let v = s.value;
        match s.name.as_str() {
            "fairway_jain_fairness_index" => self.jain = Some(v),
            "fairway_overhead_seconds_bucket" => add_bucket(&mut self.overhead, s),
            "fairway_requests_total" => {
                if let Some(t) = self.tenant(s) {
                    let key = (label(s, "model"), label(s, "outcome"), label(s, "reason"));
                    *t.requests.entry(key).or_insert(0.0) += v;
                }
            }
            "fairway_goodput_total" => {
                if let Some(t) = self.tenant(s) {
                    *t.goodput.entry(label(s, "model")).or_insert(0.0) += v;
                }
            }
            "fairway_ttft_seconds_bucket" => {
                if let Some(t) = self.tenant(s) {
                    add_bucket(t.ttft.entry(label(s, "model")).or_default(), s);
                }
            }
            "fairway_e2e_seconds_bucket" => {
                if let Some(t) = self.tenant(s) {
                    add_bucket(t.e2e.entry(label(s, "model")).or_default(), s);
                }
            }
            "fairway_queue_depth" => {
                if let Some(t) = self.tenant(s) {
                    t.queued = Some(v);
                }
            }
            "fairway_tenant_in_flight" => {
                if let Some(t) = self.tenant(s) {
                    t.in_flight = Some(v);
                }
            }
            "fairway_preemptions_total" => {
                if let Some(t) = self.tenant(s) {
                    t.preempted = Some(v);
                }
            }
            "fairway_tenant_slo_ttft_seconds" => {
                if let Some(t) = self.tenant(s) {
                    t.slo_ttft = Some(v);
                }
            }
            "fairway_tenant_slo_e2e_seconds" => {
                if let Some(t) = self.tenant(s) {
                    t.slo_e2e = Some(v);
                }
            }
            name => {
                if let Some(field) = name.strip_prefix("fairway_backend_") {
                    self.add_backend(field, s);
                }
            }
        }
    }

    /// The figures of the sample's tenant, created on first sight; `None`
    /// when the sample has no `tenant` label.
    fn tenant(&mut self, s: &Sample) -> Option<&mut TenantFigures> {
        let name = s.label("tenant")?;
        Some(self.tenants.entry(name.to_owned()).or_default())
    }

    /// Folds in a `fairway_backend_<field>` sample. Any such family makes
    /// the backend known; only the fields the view shows are kept.
    fn add_backend(&mut self, field: &str, s: &Sample) {
        let Some(backend) = s.label("backend") else {
            return;
        };
        let b = self
            .backends
            .entry((backend.to_owned(), label(s, "model")))
            .or_default();
        let slot = match field {
            "healthy" => &mut b.healthy,
            "in_flight" => &mut b.in_flight,
            "window" => &mut b.window,
            "kv_usage_ratio" => &mut b.kv_usage,
            "waiting" => &mut b.waiting,
            "reading_age_seconds" => &mut b.reading_age,
            _ => return,
        };
        *slot = Some(s.value);
    }
}

/// A label's value, or "" when absent.
fn label(s: &Sample, name: &str) -> String {
    s.label(name).unwrap_or("").to_owned()
}

/// Adds a `_bucket` sample to `buckets`, summing samples of the same bound.
/// Samples with no or a `NaN` `le`, or a non-finite or negative count, are
/// skipped.
fn add_bucket(buckets: &mut Vec<Bucket>, s: &Sample) {
    if !s.value.is_finite() || s.value < 0.0 {
        return;
    }
    let Some(le) = s.label("le").and_then(parse_float) else {
        return;
    };
    if le.is_nan() {
        return;
    }
    match buckets.iter_mut().find(|b| b.le == le) {
        Some(b) => b.count += s.value,
        None => buckets.push(Bucket { le, count: s.value }),
    }
}

/// Adds `add` into `acc` bound by bound.
fn merge(acc: &mut Vec<Bucket>, add: &[Bucket]) {
    for b in add {
        match acc.iter_mut().find(|x| x.le == b.le) {
            Some(x) => x.count += b.count,
            None => acc.push(*b),
        }
    }
}

/// The observations between two scrapes of one histogram: `cur - prev`
/// bound by bound. When a count went down or the bounds changed (a restart
/// or a reconfiguration), `cur` itself: everything it holds is new.
fn bucket_delta(prev: &[Bucket], cur: &[Bucket]) -> Vec<Bucket> {
    if prev.len() != cur.len() {
        return cur.to_vec();
    }
    let mut out = Vec::with_capacity(cur.len());
    for c in cur {
        match prev.iter().find(|p| p.le == c.le) {
            Some(p) if c.count >= p.count => out.push(Bucket {
                le: c.le,
                count: c.count - p.count,
            }),
            _ => return cur.to_vec(),
        }
    }
    out
}

/// The p99 of the observations between `prev` and `cur`, or of all of
/// `cur` when there is no `prev` or nothing new was observed.
fn p99_between(prev: Option<&[Bucket]>, cur: &[Bucket]) -> Option<f64> {
    prev.and_then(|p| quantile(P99, &bucket_delta(p, cur)))
        .or_else(|| quantile(P99, cur))
}

/// Like [`p99_between`] for per-model histograms, summed over models: each
/// model's window is taken on its own (so one model's restart does not
/// hide another's observations), then the windows are added up.
fn p99_by_model(prev: Option<&ByModel>, cur: &ByModel) -> Option<f64> {
    let windowed = prev.and_then(|p| {
        let mut delta = Vec::new();
        for (model, c) in cur {
            match p.get(model) {
                Some(pb) => merge(&mut delta, &bucket_delta(pb, c)),
                None => merge(&mut delta, c),
            }
        }
        quantile(P99, &delta)
    });
    windowed.or_else(|| {
        let mut all = Vec::new();
        for c in cur.values() {
            merge(&mut all, c);
        }
        quantile(P99, &all)
    })
}

/// How much one counter grew from `prev` (absent: 0) to `cur`. A counter
/// that went down restarted from zero, so it grew by `cur`. Never negative.
fn series_increase(prev: Option<f64>, cur: f64) -> f64 {
    let p = prev.unwrap_or(0.0);
    let d = if cur >= p { cur - p } else { cur };
    if d.is_finite() { d.max(0.0) } else { 0.0 }
}

/// The summed increase of the series in `cur` that `keep` selects.
fn increase<K: Ord>(
    prev: Option<&BTreeMap<K, f64>>,
    cur: &BTreeMap<K, f64>,
    keep: impl Fn(&K) -> bool,
) -> f64 {
    cur.iter()
        .filter(|&(k, _)| keep(k))
        .map(|(k, v)| series_increase(prev.and_then(|p| p.get(k)).copied(), *v))
        .sum()
}

/// Refusals per second by reason (`concurrency:0.5 rate:2.0`, reasons in
/// name order), or `-` when there is no rate or no refusal.
fn refused_cell(
    prev: Option<&BTreeMap<Series, f64>>,
    cur: &BTreeMap<Series, f64>,
    dt: Option<f64>,
) -> String {
    let Some(dt) = dt else {
        return "-".to_owned();
    };
    let mut by_reason: BTreeMap<&str, f64> = BTreeMap::new();
    for (k, v) in cur {
        if k.1 != "refused" {
            continue;
        }
        let inc = series_increase(prev.and_then(|p| p.get(k)).copied(), *v);
        *by_reason.entry(k.2.as_str()).or_insert(0.0) += inc;
    }
    let parts: Vec<String> = by_reason
        .iter()
        .filter(|&(_, inc)| *inc > 0.0)
        .map(|(reason, inc)| {
            let reason: &str = if reason.is_empty() { "other" } else { reason };
            format!("{reason}:{}", fmt_rate(*inc / dt))
        })
        .collect();
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(" ")
    }
}

/// Renders the view: `prev` (the previous scrape, if any) gives rates and
/// windowed p99s (bucket deltas between the two scrapes; fall back to
/// cumulative when there is no prev or no new observations).
///
/// Rates need a `prev` read strictly before `cur`; otherwise they show as
/// `-`. Lines fit in `width` columns (0: no limit): a table that does not
/// fit drops whole columns from the right, with a note naming them, rather
/// than cutting a number.
pub fn render(prev: Option<&Snapshot>, cur: &Snapshot, width: usize) -> String {
    let width = if width == 0 { usize::MAX } else { width };
    let dt = prev
        .map(|p| cur.at_secs - p.at_secs)
        .filter(|d| d.is_finite() && *d > 0.0);
    let base = prev.filter(|_| dt.is_some());
    let mut out = String::new();

    let mut head = String::from("fairway top");
    let jain = cur
        .jain
        .filter(|j| j.is_finite())
        .map_or_else(|| "-".to_owned(), |j| format!("{j:.2}"));
    let _ = write!(head, "  jain {jain}");
    if let Some(o) = p99_between(base.map(|p| p.overhead.as_slice()), &cur.overhead) {
        let _ = write!(head, "  overhead p99 {}", fmt_duration(o));
    }
    match dt {
        Some(d) => {
            let _ = write!(head, "  window {}", fmt_duration(d));
        }
        None => head.push_str("  (rates from the next scrape)"),
    }
    push_line(&mut out, &head, width);
    out.push('\n');

    let mut rows = Vec::new();
    for (name, t) in &cur.tenants {
        let pt = base.and_then(|p| p.tenants.get(name));
        let rate = |inc: f64| dt.map_or_else(|| "-".to_owned(), |d| fmt_rate(inc / d));
        let prev_requests = pt.map(|p| &p.requests);
        let requests = increase(prev_requests, &t.requests, |_| true);
        let served = increase(prev_requests, &t.requests, |k| k.1 == "served");
        let goodput = increase(pt.map(|p| &p.goodput), &t.goodput, |_| true);
        let ttft = p99_by_model(pt.map(|p| &p.ttft), &t.ttft);
        let e2e = p99_by_model(pt.map(|p| &p.e2e), &t.e2e);
        rows.push(vec![
            name.clone(),
            rate(requests),
            rate(served),
            rate(goodput),
            against_slo(ttft, t.slo_ttft),
            fmt_opt_duration(t.slo_ttft),
            against_slo(e2e, t.slo_e2e),
            fmt_opt_duration(t.slo_e2e),
            fmt_count(t.queued),
            fmt_count(t.in_flight),
            refused_cell(prev_requests, &t.requests, dt),
            t.preempted.map_or_else(
                || "-".to_owned(),
                |c| rate(series_increase(pt.and_then(|p| p.preempted), c)),
            ),
        ]);
    }
    if rows.is_empty() {
        push_line(&mut out, "(no tenants yet)", width);
    } else {
        write_table(
            &mut out,
            &[
                "tenant",
                "req/s",
                "served/s",
                "goodput/s",
                "ttft p99",
                "slo ttft",
                "e2e p99",
                "slo e2e",
                "queued",
                "in flight",
                "refused/s",
                "preempt/s",
            ],
            &[
                true, false, false, false, false, false, false, false, false, false, true, false,
            ],
            &rows,
            width,
        );
    }
    out.push('\n');

    let mut rows = Vec::new();
    for ((backend, model), b) in &cur.backends {
        let healthy = match b.healthy {
            Some(h) if h.is_finite() => {
                if h >= 0.5 {
                    "up"
                } else {
                    "DOWN"
                }
            }
            _ => "-",
        };
        rows.push(vec![
            backend.clone(),
            model.clone(),
            healthy.to_owned(),
            format!("{}/{}", fmt_count(b.in_flight), fmt_count(b.window)),
            fmt_pct(b.kv_usage),
            fmt_count(b.waiting),
            fmt_opt_duration(b.reading_age),
        ]);
    }
    if rows.is_empty() {
        push_line(&mut out, "(no backends)", width);
    } else {
        write_table(
            &mut out,
            &[
                "backend",
                "model",
                "healthy",
                "in flight/window",
                "kv %",
                "waiting",
                "reading age",
            ],
            &[true, true, true, false, false, false, false],
            &rows,
            width,
        );
    }
    out
}

/// Writes a table: a header row, then `rows`, columns padded to their
/// widest cell (left-aligned where `left` says so, else right-aligned).
/// Columns that do not fit in `width` are dropped whole, from the right,
/// and named in a note; the first column is always shown.
fn write_table(
    out: &mut String,
    headers: &[&str],
    left: &[bool],
    rows: &[Vec<String>],
    width: usize,
) {
    let n = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let wide = widths.iter().sum::<usize>() + 2 * n.saturating_sub(1);
    let gap = if wide <= width { 2 } else { 1 };
    let mut shown = 0;
    let mut used = 0;
    for (i, w) in widths.iter().enumerate() {
        let need = if i == 0 { *w } else { used + gap + *w };
        if i > 0 && need > width {
            break;
        }
        used = need;
        shown = i + 1;
    }
    let header_cells: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for cells in std::iter::once(&header_cells).chain(rows) {
        let mut line = String::new();
        for (i, w) in widths.iter().enumerate().take(shown) {
            let w = *w;
            let cell = cells.get(i).map_or("", String::as_str);
            if i > 0 {
                line.push_str(&" ".repeat(gap));
            }
            if left.get(i).copied().unwrap_or(false) {
                let _ = write!(line, "{cell:<w$}");
            } else {
                let _ = write!(line, "{cell:>w$}");
            }
        }
        push_line(out, line.trim_end(), width);
    }
    if shown < n {
        let hidden: Vec<&str> = headers.iter().skip(shown).copied().collect();
        let s = if n - shown == 1 { "" } else { "s" };
        let note = format!("({} more column{s}: {})", n - shown, hidden.join(", "));
        push_line(out, &note, width);
    }
}

/// Appends `line`, cut to `width` characters, and a newline.
fn push_line(out: &mut String, line: &str, width: usize) {
    if line.chars().count() > width {
        out.extend(line.chars().take(width));
    } else {
        out.push_str(line);
    }
    out.push('\n');
}

/// A duration in seconds: `40us`, `12ms`, `1.20s`, `250s`; `-` when not a
/// finite non-negative number.
fn fmt_duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "-".to_owned();
    }
    let us = (secs * 1e6).round();
    if us < 1000.0 {
        return format!("{us:.0}us");
    }
    let ms = (secs * 1e3).round();
    if ms < 1000.0 {
        return format!("{ms:.0}ms");
    }
    if secs < 100.0 {
        format!("{secs:.2}s")
    } else {
        format!("{secs:.0}s")
    }
}

/// [`fmt_duration`] of a value that may be absent (`-`).
fn fmt_opt_duration(secs: Option<f64>) -> String {
    secs.map_or_else(|| "-".to_owned(), fmt_duration)
}

/// A p99 with `!` after it when it exceeds the (positive) SLO target.
fn against_slo(p99: Option<f64>, slo: Option<f64>) -> String {
    let Some(v) = p99 else {
        return "-".to_owned();
    };
    let mut s = fmt_duration(v);
    if slo.is_some_and(|l| l.is_finite() && l > 0.0 && v > l) {
        s.push('!');
    }
    s
}

/// A per-second rate: one decimal, two below 0.1, none from 100.
fn fmt_rate(r: f64) -> String {
    // -0.0 (a zero delta over a positive span) prints as 0.0.
    let r = r + 0.0;
    if !r.is_finite() || r < 0.0 {
        "-".to_owned()
    } else if r >= 100.0 {
        format!("{r:.0}")
    } else if r > 0.0 && r < 0.1 {
        format!("{r:.2}")
    } else {
        format!("{r:.1}")
    }
}

/// A gauge that counts things: whole numbers without decimals.
fn fmt_count(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => {
            if (v - v.round()).abs() < 1e-9 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        }
        _ => "-".to_owned(),
    }
}

/// A 0..1 ratio as a whole percentage.
fn fmt_pct(v: Option<f64>) -> String {
    match v {
        Some(r) if r.is_finite() => format!("{:.0}%", r * 100.0),
        _ => "-".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use super::*;

    const BOUNDS: [&str; 6] = ["0.1", "0.5", "1", "2.5", "5", "+Inf"];

    fn push(out: &mut String, name: &str, labels: &[(&str, &str)], v: f64) {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {v}");
            return;
        }
        let l: Vec<String> = labels.iter().map(|(k, x)| format!("{k}=\"{x}\"")).collect();
        let _ = writeln!(out, "{name}{{{}}} {v}", l.join(","));
    }

    fn hist(out: &mut String, family: &str, tenant: &str, model: &str, counts: [f64; 6]) {
        let bucket = format!("{family}_bucket");
        for (le, c) in BOUNDS.iter().zip(counts) {
            push(
                out,
                &bucket,
                &[("tenant", tenant), ("model", model), ("le", *le)],
                c,
            );
        }
        let tm = [("tenant", tenant), ("model", model)];
        push(out, &format!("{family}_sum"), &tm, 1.5);
        push(out, &format!("{family}_count"), &tm, counts[5]);
    }

    /// Tenant alpha's counters, which the tests vary between scrapes.
    struct Alpha {
        served: f64,
        refused_rate: f64,
        refused_concurrency: f64,
        goodput: f64,
        preempted: f64,
        ttft: [f64; 6],
        e2e: [f64; 6],
    }

    /// The first scrape's alpha.
    fn alpha_before() -> Alpha {
        Alpha {
            served: 100.0,
            refused_rate: 0.0,
            refused_concurrency: 0.0,
            goodput: 95.0,
            preempted: 7.0,
            ttft: [95.0, 100.0, 100.0, 100.0, 100.0, 100.0],
            e2e: [0.0, 0.0, 50.0, 100.0, 100.0, 100.0],
        }
    }

    /// Two seconds later: 20 served (TTFT 0.5-1s, e2e 1-5s), 4 refused by
    /// rate, 1 by concurrency, 18 good, 3 preempted.
    fn alpha_after() -> Alpha {
        Alpha {
            served: 120.0,
            refused_rate: 4.0,
            refused_concurrency: 1.0,
            goodput: 113.0,
            preempted: 10.0,
            ttft: [95.0, 100.0, 120.0, 120.0, 120.0, 120.0],
            e2e: [0.0, 0.0, 50.0, 110.0, 120.0, 120.0],
        }
    }

    /// A realistic gateway body: alpha (one model, SLOs), beta (two models,
    /// no SLO), gamma (gauges only), two backends with gpu-b ejected.
    fn body(a: &Alpha) -> String {
        let mut o = String::new();
        o.push_str("# HELP fairway_build_info Build information.\n");
        o.push_str("# TYPE fairway_build_info gauge\n");
        push(&mut o, "fairway_build_info", &[("version", "0.1.0")], 1.0);
        o.push_str("# HELP fairway_requests_total Requests by final outcome.\n");
        o.push_str("# TYPE fairway_requests_total counter\n");
        let req = |tenant, model, outcome, reason| {
            [
                ("tenant", tenant),
                ("model", model),
                ("outcome", outcome),
                ("reason", reason),
            ]
        };
        push(
            &mut o,
            "fairway_requests_total",
            &req("alpha", "llama", "served", ""),
            a.served,
        );
        if a.refused_concurrency > 0.0 {
            push(
                &mut o,
                "fairway_requests_total",
                &req("alpha", "llama", "refused", "concurrency"),
                a.refused_concurrency,
            );
        }
        if a.refused_rate > 0.0 {
            push(
                &mut o,
                "fairway_requests_total",
                &req("alpha", "llama", "refused", "rate"),
                a.refused_rate,
            );
        }
        push(
            &mut o,
            "fairway_requests_total",
            &req("beta", "llama", "served", ""),
            10.0,
        );
        push(
            &mut o,
            "fairway_requests_total",
            &req("beta", "mistral", "served", ""),
            10.0,
        );
        o.push_str("# TYPE fairway_preemptions_total counter\n");
        push(
            &mut o,
            "fairway_preemptions_total",
            &[("tenant", "alpha")],
            a.preempted,
        );
        o.push_str("# TYPE fairway_goodput_total counter\n");
        let tm = |tenant, model| [("tenant", tenant), ("model", model)];
        push(
            &mut o,
            "fairway_goodput_total",
            &tm("alpha", "llama"),
            a.goodput,
        );
        push(&mut o, "fairway_goodput_total", &tm("beta", "llama"), 10.0);
        push(
            &mut o,
            "fairway_goodput_total",
            &tm("beta", "mistral"),
            10.0,
        );
        o.push_str("# TYPE fairway_slo_attainment_ratio gauge\n");
        push(
            &mut o,
            "fairway_slo_attainment_ratio",
            &tm("alpha", "llama"),
            0.9,
        );
        o.push_str("# TYPE fairway_ttft_seconds histogram\n");
        hist(&mut o, "fairway_ttft_seconds", "alpha", "llama", a.ttft);
        hist(&mut o, "fairway_ttft_seconds", "beta", "llama", [10.0; 6]);
        hist(
            &mut o,
            "fairway_ttft_seconds",
            "beta",
            "mistral",
            [0.0, 10.0, 10.0, 10.0, 10.0, 10.0],
        );
        o.push_str("# TYPE fairway_e2e_seconds histogram\n");
        hist(&mut o, "fairway_e2e_seconds", "alpha", "llama", a.e2e);
        let b_e2e = [0.0, 10.0, 10.0, 10.0, 10.0, 10.0];
        hist(&mut o, "fairway_e2e_seconds", "beta", "llama", b_e2e);
        hist(&mut o, "fairway_e2e_seconds", "beta", "mistral", b_e2e);
        o.push_str("# TYPE fairway_overhead_seconds histogram\n");
        for (le, c) in [
            ("0.000025", 0.0),
            ("0.00005", 60.0),
            ("0.0001", 100.0),
            ("+Inf", 100.0),
        ] {
            push(&mut o, "fairway_overhead_seconds_bucket", &[("le", le)], c);
        }
        push(&mut o, "fairway_overhead_seconds_sum", &[], 0.006);
        push(&mut o, "fairway_overhead_seconds_count", &[], 100.0);
        o.push_str("# TYPE fairway_config_reloads_total counter\n");
        push(
            &mut o,
            "fairway_config_reloads_total",
            &[("result", "ok")],
            1.0,
        );
        o.push_str("# TYPE fairway_queue_depth gauge\n");
        for (t, v) in [("alpha", 3.0), ("beta", 0.0), ("gamma", 7.0)] {
            push(&mut o, "fairway_queue_depth", &[("tenant", t)], v);
        }
        o.push_str("# TYPE fairway_tenant_in_flight gauge\n");
        for (t, v) in [("alpha", 5.0), ("beta", 1.0), ("gamma", 0.0)] {
            push(&mut o, "fairway_tenant_in_flight", &[("tenant", t)], v);
        }
        push(
            &mut o,
            "fairway_rate_bucket_requests",
            &[("tenant", "alpha")],
            2.5,
        );
        push(
            &mut o,
            "fairway_tenant_slo_ttft_seconds",
            &[("tenant", "alpha")],
            0.5,
        );
        push(
            &mut o,
            "fairway_tenant_slo_e2e_seconds",
            &[("tenant", "alpha")],
            5.0,
        );
        o.push_str("# TYPE fairway_jain_fairness_index gauge\n");
        push(&mut o, "fairway_jain_fairness_index", &[], 0.93);
        let a_l = [("backend", "gpu-a"), ("model", "llama")];
        let b_m = [("backend", "gpu-b"), ("model", "mistral")];
        // gpu-b first: the view sorts by name, not by body order.
        push(&mut o, "fairway_backend_in_flight", &b_m, 0.0);
        push(&mut o, "fairway_backend_in_flight", &a_l, 3.0);
        push(&mut o, "fairway_backend_window", &b_m, 4.0);
        push(&mut o, "fairway_backend_window", &a_l, 8.0);
        push(&mut o, "fairway_backend_healthy", &b_m, 0.0);
        push(&mut o, "fairway_backend_healthy", &a_l, 1.0);
        push(&mut o, "fairway_backend_kv_usage_ratio", &a_l, 0.42);
        push(&mut o, "fairway_backend_running", &a_l, 3.0);
        push(&mut o, "fairway_backend_waiting", &a_l, 2.0);
        push(&mut o, "fairway_backend_ttft_p99_seconds", &a_l, 0.3);
        push(&mut o, "fairway_backend_reading_age_seconds", &b_m, 12.5);
        push(&mut o, "fairway_backend_reading_age_seconds", &a_l, 0.25);
        push(&mut o, "fairway_backend_scrape_errors_total", &b_m, 7.0);
        push(&mut o, "fairway_backend_scrape_errors_total", &a_l, 0.0);
        o
    }

    /// The cells of the line whose first word is `first`.
    fn row<'a>(text: &'a str, first: &str) -> Vec<&'a str> {
        text.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|cells| cells.first() == Some(&first))
            .unwrap_or_else(|| panic!("no line for {first} in\n{text}"))
    }

    fn line_index(text: &str, first: &str) -> usize {
        text.lines()
            .position(|l| l.split_whitespace().next() == Some(first))
            .unwrap()
    }

    #[test]
    fn parses_a_realistic_multi_tenant_exposition() {
        let snap = Snapshot::from_text(&body(&alpha_before()), 10.0).unwrap();
        assert_eq!(snap.at_secs(), 10.0);
        let names: Vec<&str> = snap.tenants.keys().map(String::as_str).collect();
        assert_eq!(names, ["alpha", "beta", "gamma"]);
        assert_eq!(snap.jain, Some(0.93));
        assert_eq!(snap.overhead.len(), 4);

        let alpha = &snap.tenants["alpha"];
        assert_eq!(alpha.requests.len(), 1);
        assert_eq!(alpha.goodput["llama"], 95.0);
        assert_eq!(alpha.ttft["llama"].len(), 6);
        assert_eq!(alpha.slo_ttft, Some(0.5));
        assert_eq!(alpha.slo_e2e, Some(5.0));
        assert_eq!(alpha.queued, Some(3.0));
        assert_eq!(alpha.in_flight, Some(5.0));

        let beta = &snap.tenants["beta"];
        assert_eq!(beta.ttft.len(), 2, "one histogram per model");
        assert_eq!(beta.slo_ttft, None);
        let gamma = &snap.tenants["gamma"];
        assert!(gamma.requests.is_empty());
        assert_eq!(gamma.queued, Some(7.0));

        assert_eq!(snap.backends.len(), 2);
        let a = &snap.backends[&("gpu-a".to_owned(), "llama".to_owned())];
        assert_eq!(a.healthy, Some(1.0));
        assert_eq!(a.kv_usage, Some(0.42));
        let b = &snap.backends[&("gpu-b".to_owned(), "mistral".to_owned())];
        assert_eq!(b.healthy, Some(0.0));
        assert_eq!(b.kv_usage, None);
        assert_eq!(b.reading_age, Some(12.5));
    }

    #[test]
    fn render_without_prev_shows_dashes_for_rates_and_cumulative_p99s() {
        let snap = Snapshot::from_text(&body(&alpha_before()), 10.0).unwrap();
        let text = render(None, &snap, 200);
        let first = text.lines().next().unwrap();
        assert!(first.starts_with("fairway top"), "{first}");
        assert!(first.contains("jain 0.93"), "{first}");
        // 60 of 100 at or below 50us, the rest up to 100us: p99 98.75us.
        assert!(first.contains("overhead p99 99us"), "{first}");

        assert_eq!(
            row(&text, "alpha"),
            [
                "alpha", "-", "-", "-", "420ms", "500ms", "2.47s", "5.00s", "3", "5", "-", "-"
            ]
        );
        // Beta's two models are summed; no SLO gauges.
        assert_eq!(
            row(&text, "beta"),
            [
                "beta", "-", "-", "-", "492ms", "-", "496ms", "-", "0", "1", "-", "-"
            ]
        );
        assert_eq!(
            row(&text, "gamma"),
            [
                "gamma", "-", "-", "-", "-", "-", "-", "-", "7", "0", "-", "-"
            ]
        );
        assert_eq!(
            row(&text, "gpu-a"),
            ["gpu-a", "llama", "up", "3/8", "42%", "2", "250ms"]
        );
        assert_eq!(
            row(&text, "gpu-b"),
            ["gpu-b", "mistral", "DOWN", "0/4", "-", "-", "12.50s"]
        );
        assert!(line_index(&text, "alpha") < line_index(&text, "beta"));
        assert!(line_index(&text, "beta") < line_index(&text, "gamma"));
        assert!(line_index(&text, "gpu-a") < line_index(&text, "gpu-b"));
        assert!(line_index(&text, "gamma") < line_index(&text, "backend"));

        // A prev from the same instant gives no rate either.
        let again = render(Some(&snap), &snap, 200);
        assert_eq!(row(&again, "alpha")[1], "-");
    }

    #[test]
    fn render_with_prev_gives_rates_and_windowed_p99s() {
        let prev = Snapshot::from_text(&body(&alpha_before()), 10.0).unwrap();
        let cur = Snapshot::from_text(&body(&alpha_after()), 12.0).unwrap();
        let text = render(Some(&prev), &cur, 200);
        assert!(text.lines().next().unwrap().contains("window 2.00s"));
        // (20 served + 4 + 1 refused) / 2s; 18 good / 2s. The window's TTFTs
        // all lie in 0.5-1s: p99 995ms (cumulative would be 970ms), over
        // the 500ms SLO. The window's e2e p99 is 4.95s, within 5s.
        assert_eq!(
            row(&text, "alpha"),
            [
                "alpha",
                "12.5",
                "10.0",
                "9.0",
                "995ms!",
                "500ms",
                "4.95s",
                "5.00s",
                "3",
                "5",
                "concurrency:0.5",
                "rate:2.0",
                // 3 preempted in 2 s.
                "1.5"
            ]
        );
        // Nothing new for beta: rates 0, p99s fall back to cumulative.
        assert_eq!(
            row(&text, "beta"),
            [
                "beta", "0.0", "0.0", "0.0", "492ms", "-", "496ms", "-", "0", "1", "-", "-"
            ]
        );
        assert_eq!(row(&text, "gamma")[1], "0.0");
    }

    #[test]
    fn an_slo_breach_is_marked() {
        let mut o = String::new();
        push(
            &mut o,
            "fairway_tenant_slo_ttft_seconds",
            &[("tenant", "t")],
            0.05,
        );
        push(
            &mut o,
            "fairway_tenant_slo_e2e_seconds",
            &[("tenant", "t")],
            1.0,
        );
        // TTFT all at or below 0.1s, e2e between 2.5s and 5s.
        hist(&mut o, "fairway_ttft_seconds", "t", "m", [4.0; 6]);
        hist(
            &mut o,
            "fairway_e2e_seconds",
            "t",
            "m",
            [0.0, 0.0, 0.0, 0.0, 4.0, 4.0],
        );
        hist(&mut o, "fairway_ttft_seconds", "ok", "m", [4.0; 6]);
        push(
            &mut o,
            "fairway_tenant_slo_ttft_seconds",
            &[("tenant", "ok")],
            0.2,
        );
        let snap = Snapshot::from_text(&o, 0.0).unwrap();
        let text = render(None, &snap, 120);
        let t = row(&text, "t");
        assert_eq!(t[4], "99ms!", "{text}");
        assert!(t[6].ends_with("s!"), "{text}");
        let ok = row(&text, "ok");
        assert_eq!(ok[4], "99ms", "{text}");
        assert!(!text.contains("-!"));
    }

    #[test]
    fn a_counter_reset_gives_no_negative_rate() {
        let prev = Snapshot::from_text(&body(&alpha_after()), 10.0).unwrap();
        // The gateway restarted: alpha has served 6 since, all fast.
        let restarted = Alpha {
            served: 6.0,
            refused_rate: 0.0,
            refused_concurrency: 0.0,
            goodput: 6.0,
            preempted: 1.0,
            ttft: [6.0; 6],
            e2e: [0.0, 6.0, 6.0, 6.0, 6.0, 6.0],
        };
        let cur = Snapshot::from_text(&body(&restarted), 12.0).unwrap();
        let text = render(Some(&prev), &cur, 200);
        let alpha = row(&text, "alpha");
        assert_eq!(&alpha[1..4], ["3.0", "3.0", "3.0"], "{text}");
        assert_eq!(alpha[4], "99ms", "buckets that went down are read as new");
        assert_eq!(alpha[10], "-", "refusal series vanished with the restart");
        assert_eq!(alpha[11], "0.5", "1 preemption since the restart, in 2 s");
        for cell in &alpha[1..] {
            assert!(!cell.starts_with('-') || *cell == "-", "{text}");
        }
        assert!(series_increase(Some(10.0), 4.0) >= 0.0);
        assert_eq!(series_increase(Some(1.0), f64::NAN), 0.0);
    }

    #[test]
    fn garbage_input_is_an_error_not_a_panic() {
        for text in [
            "",
            "<html><body>502 Bad Gateway</body></html>",
            "{\"error\": \"not found\"}",
            "fairway_requests_total{tenant=\"a",
            "\u{0}\u{1}\u{fffd}\u{fffd}",
            "up 1\nprocess_cpu_seconds_total 2.5\n",
        ] {
            assert!(Snapshot::from_text(text, 0.0).is_err(), "{text:?}");
        }
        // A body that is only partly odd still reads.
        let mixed = "fairway_queue_depth{tenant=\"a\"} 2\nthis is not a sample\n";
        let snap = Snapshot::from_text(mixed, 0.0).unwrap();
        assert!(render(None, &snap, 80).contains("(no backends)"));
    }

    #[test]
    fn narrow_terminals_drop_whole_columns() {
        let prev = Snapshot::from_text(&body(&alpha_before()), 10.0).unwrap();
        let cur = Snapshot::from_text(&body(&alpha_after()), 12.0).unwrap();
        let text = render(Some(&prev), &cur, 60);
        for line in text.lines() {
            assert!(line.chars().count() <= 60, "{line:?}");
        }
        assert!(text.contains("more columns"), "{text}");
        // The columns still shown are whole.
        let alpha = row(&text, "alpha");
        assert_eq!(&alpha[..5], ["alpha", "12.5", "10.0", "9.0", "995ms!"]);
    }

    #[test]
    fn durations_and_rates_read_well() {
        assert_eq!(fmt_duration(0.012), "12ms");
        assert_eq!(fmt_duration(1.2), "1.20s");
        assert_eq!(fmt_duration(0.000_04), "40us");
        assert_eq!(fmt_duration(0.9996), "1.00s");
        assert_eq!(fmt_duration(250.0), "250s");
        assert_eq!(fmt_duration(f64::NAN), "-");
        assert_eq!(fmt_rate(2.0), "2.0");
        assert_eq!(fmt_rate(0.05), "0.05");
        assert_eq!(fmt_rate(0.0), "0.0");
        assert_eq!(fmt_rate(150.4), "150");
    }
}
