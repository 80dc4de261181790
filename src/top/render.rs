//! [`render`]: the view as plain text, two tables under a header line.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::format::{fmt_count, fmt_duration, fmt_opt_duration, fmt_pct, fmt_rate};
use super::rates::{increase, p99_between, p99_by_model, series_increase};
use super::snapshot::{ClusterFigures, Series, Snapshot};
use super::table::{push_line, write_table};

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
    push_line(&mut out, &head_line(base, cur, dt), width);
    if let Some(c) = &cur.cluster {
        push_line(&mut out, &cluster_line(c), width);
    }
    out.push('\n');
    write_tenants(&mut out, base, cur, dt, width);
    out.push('\n');
    super::batches::render(base.map(|p| &p.batches), &cur.batches, dt, &mut out, width);
    write_backends(&mut out, prev, cur, width);
    out
}

/// The header line: the fairness index, Fairway's overhead p99 and the
/// window the rates are over.
fn head_line(base: Option<&Snapshot>, cur: &Snapshot, dt: Option<f64>) -> String {
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
    head
}

/// The replica's view of its cluster: the store, and what it holds of
/// the tenants' limits (its leases, or its shares while the store is
/// unreachable).
fn cluster_line(c: &ClusterFigures) -> String {
    let num = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
    let store = match c.store_up {
        Some(u) if u >= 1.0 => "up",
        Some(_) => "DOWN",
        None => "-",
    };
    let mut line = format!(
        "cluster  replica {} of {}  store {store}",
        c.replica,
        num(c.replicas)
    );
    if let Some(rtt) = c.rtt_seconds.filter(|_| store == "up") {
        let _ = write!(line, " (rtt {})", fmt_duration(rtt));
    }
    if c.leasing.is_some_and(|l| l >= 1.0) {
        let mut by_tenant: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for ((t, limit), held) in &c.leases {
            let unit = match limit.as_str() {
                "rate" => "req",
                "gpu_seconds" => "GPU-s",
                _ => "slots",
            };
            by_tenant
                .entry(t)
                .or_default()
                .push(format!("{held:.1} {unit}"));
        }
        if !by_tenant.is_empty() {
            line.push_str("  leases");
            for (t, parts) in by_tenant {
                let _ = write!(line, " {t} {}", parts.join("/"));
            }
        }
    } else if !c.shares.is_empty() {
        line.push_str("  shares");
        for (t, s) in &c.shares {
            let _ = write!(line, " {t} {:.0}%", s * 100.0);
        }
    }
    line
}

/// The tenants' table: rates between the scrapes, p99s against the SLO
/// targets, queues and refusals.
fn write_tenants(
    out: &mut String,
    base: Option<&Snapshot>,
    cur: &Snapshot,
    dt: Option<f64>,
    width: usize,
) {
    let mut rows = Vec::new();
    for (name, t) in &cur.tenants {
        let pt = base.and_then(|p| p.tenants.get(name));
        let rate = |inc: f64| dt.map_or_else(|| "-".to_owned(), |d| fmt_rate(inc / d));
        let prev_requests = pt.map(|p| &p.requests);
        let requests = increase(prev_requests, &t.requests, |_| true);
        let served = increase(prev_requests, &t.requests, |k| k.1 == "served");
        let goodput = increase(pt.map(|p| &p.goodput), &t.goodput, |_| true);
        // The gateway's sketches of the last minute where it exports them
        // (within 2 %); else the buckets between the two scrapes.
        let ttft = t
            .recent_ttft_p99
            .or_else(|| p99_by_model(pt.map(|p| &p.ttft), &t.ttft));
        let e2e = t
            .recent_e2e_p99
            .or_else(|| p99_by_model(pt.map(|p| &p.e2e), &t.e2e));
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
        push_line(out, "(no tenants yet)", width);
        return;
    }
    write_table(
        out,
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

/// The backends' table: health, window, KV usage and the prefix cache's
/// hit rate since `prev`.
fn write_backends(out: &mut String, prev: Option<&Snapshot>, cur: &Snapshot, width: usize) {
    let mut rows = Vec::new();
    for (key, b) in &cur.backends {
        let (backend, model) = key;
        // The share of prompt tokens the engine found in its prefix cache
        // since the last scrape (without one, since it started).
        let was = prev.and_then(|p| p.backends.get(key));
        let hit = match (b.cached_tokens, b.prompt_tokens) {
            (Some(c), Some(p)) => {
                let dc = series_increase(was.and_then(|w| w.cached_tokens), c);
                let dp = series_increase(was.and_then(|w| w.prompt_tokens), p);
                (dp > 0.0).then(|| (dc / dp).min(1.0))
            }
            _ => None,
        };
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
            fmt_pct(hit),
            fmt_count(b.waiting),
            fmt_opt_duration(b.reading_age),
        ]);
    }
    if rows.is_empty() {
        push_line(out, "(no backends)", width);
        return;
    }
    write_table(
        out,
        &[
            "backend",
            "model",
            "healthy",
            "in flight/window",
            "kv %",
            "cache hit %",
            "waiting",
            "reading age",
        ],
        &[true, true, true, false, false, false, false, false],
        &rows,
        width,
    );
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

#[cfg(test)]
mod tests {
    use super::super::fixtures::{
        Alpha, alpha_after, alpha_before, body, hist, line_index, push, row,
    };
    use super::*;

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
            ["gpu-a", "llama", "up", "3/8", "42%", "60%", "2", "250ms"]
        );
        assert_eq!(
            row(&text, "gpu-b"),
            ["gpu-b", "mistral", "DOWN", "0/4", "-", "-", "-", "12.50s"]
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
        // The prefix cache's hit rate between the scrapes.
        assert_eq!(row(&text, "gpu-a")[5], "80%");
    }

    /// The gateway's sketches of the last minute win over the buckets:
    /// a 511 ms p99 reads 511 ms, not a point between 0.5 and 1 s.
    #[test]
    fn the_recent_sketch_quantiles_are_shown_where_exported() {
        let prev = Snapshot::from_text(&body(&alpha_before()), 10.0).unwrap();
        let mut text = body(&alpha_after());
        for (name, v) in [
            ("fairway_tenant_recent_ttft_p99_seconds", 0.511),
            ("fairway_tenant_recent_e2e_p99_seconds", 3.2),
        ] {
            text.push_str(&format!("# TYPE {name} gauge\n"));
            push(&mut text, name, &[("tenant", "alpha")], v);
        }
        let cur = Snapshot::from_text(&text, 12.0).unwrap();
        let shown = render(Some(&prev), &cur, 200);
        let r = row(&shown, "alpha");
        assert_eq!(r[4..8], ["511ms!", "500ms", "3.20s", "5.00s"]);
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
    fn a_replica_shows_its_cluster_view() {
        let text = "fairway_build_info{version=\"0\"} 1\n\
            fairway_cluster_replicas{replica=\"r1\"} 3\n\
            fairway_cluster_store_up{replica=\"r1\"} 1\n\
            fairway_cluster_store_rtt_seconds{replica=\"r1\"} 0.0004\n\
            fairway_cluster_tenant_share{replica=\"r1\",tenant=\"api\"} 0.5\n";
        let snap = Snapshot::from_text(text, 0.0).unwrap();
        let out = render(None, &snap, 0);
        let line = out.lines().nth(1).unwrap();
        assert!(
            line.starts_with("cluster  replica r1 of 3  store up"),
            "{out}"
        );
        assert!(line.contains("shares api 50%"), "{out}");
        // Leasing: what is held here instead of the shares.
        let leasing = format!(
            "{text}fairway_cluster_leasing{{replica=\"r1\"}} 1\n\
             fairway_cluster_lease{{replica=\"r1\",tenant=\"api\",limit=\"rate\"}} 2.5\n\
             fairway_cluster_lease{{replica=\"r1\",tenant=\"api\",limit=\"concurrency\"}} 3\n"
        );
        let out = render(None, &Snapshot::from_text(&leasing, 0.0).unwrap(), 0);
        let line = out.lines().nth(1).unwrap();
        assert!(line.contains("leases api 3.0 slots/2.5 req"), "{out}");
        assert!(!line.contains("shares"), "{out}");
        let down = text.replace("store_up{replica=\"r1\"} 1", "store_up{replica=\"r1\"} 0");
        let out = render(None, &Snapshot::from_text(&down, 0.0).unwrap(), 0);
        assert!(out.contains("store DOWN"), "{out}");
        // Without a cluster, no line.
        let alone = render(
            None,
            &Snapshot::from_text("fairway_build_info 1\n", 0.0).unwrap(),
            0,
        );
        assert!(!alone.contains("cluster"), "{alone}");
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
        assert!(super::super::rates::series_increase(Some(10.0), 4.0) >= 0.0);
        assert_eq!(
            super::super::rates::series_increase(Some(1.0), f64::NAN),
            0.0
        );
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
    fn a_partly_odd_body_renders() {
        let mixed = "fairway_queue_depth{tenant=\"a\"} 2\nthis is not a sample\n";
        let snap = Snapshot::from_text(mixed, 0.0).unwrap();
        assert!(render(None, &snap, 80).contains("(no backends)"));
    }

    const BATCH_BODY: &str = "\
fairway_batch_items{tenant=\"evals\",state=\"pending\"} 80
fairway_batch_items{tenant=\"evals\",state=\"running\"} 8
fairway_batch_items{tenant=\"evals\",state=\"completed\"} 12
fairway_batch_items{tenant=\"evals\",state=\"failed\"} 0
fairway_batch_items_preempted_total{tenant=\"evals\"} PRE
fairway_batch_items_resumed_total{tenant=\"evals\"} PRE
fairway_batch_resume_tokens_saved_total{tenant=\"evals\"} TOK
fairway_batch_deadline_slack_seconds{tenant=\"evals\",batch=\"batch_a\"} 3600
fairway_batch_deadline_slack_seconds{tenant=\"evals\",batch=\"batch_b\"} -90
";

    fn batch_row(text: &str) -> Vec<String> {
        let line = text.lines().find(|l| l.starts_with("evals ")).unwrap();
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn the_batch_lane_shows_items_resume_rates_and_late_batches() {
        let at = |t: f64, pre: &str, tok: &str| {
            let body = BATCH_BODY.replace("PRE", pre).replace("TOK", tok);
            Snapshot::from_text(&body, t).unwrap()
        };
        let (a, b) = (at(0.0, "10", "1000"), at(10.0, "30", "5000"));
        let text = render(Some(&a), &b, 200);
        assert!(text.contains("batch lane"), "{text}");
        assert_eq!(
            batch_row(&text),
            [
                "evals", "80", "8", "12", "0", "2.0", "2.0", "400", "1", "of", "2", "-90.00s"
            ],
            "{text}"
        );
        // Without batch figures there is no such table.
        let plain = Snapshot::from_text("fairway_jain_fairness_index 1\n", 0.0).unwrap();
        assert!(!render(None, &plain, 200).contains("batch lane"));
    }
}
