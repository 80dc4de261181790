//! The SVG charts of one run: per-tenant TTFT p99 over time and queue
//! depth.

use std::fmt::Write as _;

use super::percentile;
use crate::replay::sim::Trace;

const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

/// Two charts of one run, as SVG: per-tenant TTFT p99 over time (per
/// 5-second bin of arrival, log scale) and per-tenant queue depth.
pub fn svg(title: &str, trace: &Trace) -> String {
    const W: f64 = 900.0;
    const H: f64 = 260.0;
    const L: f64 = 60.0;
    const BIN: f64 = 5.0;
    let end = trace.queue.last().map_or(trace.makespan, |q| q.at).max(1.0);
    let x = |t: f64| L + (t / end) * (W - L - 20.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{}" font-family="sans-serif" font-size="12">"#,
        2.0 * H + 120.0
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{L}" y="18" font-size="14">{}</text>"#,
        escape(title)
    );

    // TTFT p99 per bin, log10 from 10 ms to the largest.
    let top1 = 30.0;
    let bins = (end / BIN).ceil() as usize + 1;
    let mut series = Vec::new();
    let mut ymax: f64 = 1.0;
    for ti in 0..trace.tenants.len() {
        let mut per_bin: Vec<Vec<f64>> = vec![Vec::new(); bins];
        for (t, r) in &trace.requests {
            if *t == ti
                && let Some(v) = r.ttft
            {
                per_bin[((r.arrived / BIN) as usize).min(bins - 1)].push(v);
            }
        }
        let pts: Vec<(f64, f64)> = per_bin
            .iter_mut()
            .enumerate()
            .filter_map(|(b, v)| percentile(v, 0.99).map(|p| (b as f64 * BIN + BIN / 2.0, p)))
            .collect();
        ymax = pts.iter().map(|p| p.1).fold(ymax, f64::max);
        series.push(pts);
    }
    // The SLO lines are drawn inside the plot too.
    let slos: Vec<(usize, f64)> = trace
        .slo_ttft
        .iter()
        .enumerate()
        .filter_map(|(ti, s)| s.filter(|s| s.is_finite() && *s > 0.0).map(|s| (ti, s)))
        .collect();
    ymax = slos.iter().map(|s| s.1).fold(ymax, f64::max);
    let (lo, hi) = (0.01f64.log10(), ymax.log10().ceil());
    let y1 = |v: f64| top1 + H - ((v.max(0.01).log10() - lo) / (hi - lo)) * H;
    axes(&mut s, top1, H, L, W, "TTFT p99 (s, log)", end);
    let mut d = -2i32;
    while f64::from(d) <= hi {
        let v = 10f64.powi(d);
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{:.1}" text-anchor="end">{}</text><line x1="{L}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#eee"/>"##,
            L - 4.0,
            y1(v) + 4.0,
            v,
            W - 20.0,
            y1(v),
            y1(v)
        );
        d += 1;
    }
    for (ti, pts) in series.iter().enumerate() {
        polyline(
            &mut s,
            pts.iter().map(|&(t, v)| (x(t), y1(v))),
            COLOURS[ti % COLOURS.len()],
        );
    }
    // Each tenant's TTFT SLO: a dashed line in its colour, labelled.
    for (k, &(ti, slo)) in slos.iter().enumerate() {
        let colour = COLOURS[ti % COLOURS.len()];
        let y = y1(slo);
        let _ = writeln!(
            s,
            r#"<line x1="{L}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="{colour}" stroke-dasharray="6 4"/><text x="{}" y="{:.1}" text-anchor="end" fill="{colour}">{} SLO {}</text>"#,
            W - 20.0,
            W - 24.0 - k as f64 * 110.0,
            y - 4.0,
            escape(&trace.tenants[ti]),
            secs_label(slo)
        );
    }

    // Queue depth.
    let top2 = top1 + H + 50.0;
    let qmax = trace
        .queue
        .iter()
        .flat_map(|q| q.queued.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let y2 = |v: f64| top2 + H - v / qmax * H;
    axes(&mut s, top2, H, L, W, "queued requests", end);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{:.1}" text-anchor="end">{qmax}</text>"#,
        L - 4.0,
        top2 + 4.0
    );
    // At most ~1000 points a line.
    let step = (trace.queue.len() / 1000).max(1);
    for ti in 0..trace.tenants.len() {
        polyline(
            &mut s,
            trace.queue.iter().step_by(step).map(|q| {
                (
                    x(q.at),
                    y2(f64::from(q.queued.get(ti).copied().unwrap_or(0))),
                )
            }),
            COLOURS[ti % COLOURS.len()],
        );
    }
    for (ti, name) in trace.tenants.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="18" fill="{}">■ {}</text>"#,
            W - 300.0 + ti as f64 * 90.0,
            COLOURS[ti % COLOURS.len()],
            escape(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn axes(s: &mut String, top: f64, h: f64, l: f64, w: f64, label: &str, end: f64) {
    let _ = writeln!(
        s,
        r##"<line x1="{l}" y1="{top}" x2="{l}" y2="{}" stroke="#333"/><line x1="{l}" y1="{}" x2="{}" y2="{}" stroke="#333"/>"##,
        top + h,
        top + h,
        w - 20.0,
        top + h
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}">{}</text>"#,
        l + 6.0,
        top + 12.0,
        escape(label),
    );
    // The time axis: ticks at a round step, at most ten, labelled.
    let step = TIME_STEPS
        .iter()
        .copied()
        .find(|st| end / st <= 10.0)
        .unwrap_or_else(|| (end / 10.0).ceil());
    let x = |t: f64| l + (t / end) * (w - l - 20.0);
    let mut t = 0.0;
    while t <= end + 1e-9 {
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1}" y2="{2}" stroke="#333"/><text x="{0:.1}" y="{3}" text-anchor="middle">{4}</text>"##,
            x(t),
            top + h,
            top + h + 4.0,
            top + h + 16.0,
            secs_label(t)
        );
        t += step;
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="end">time since the first arrival</text>"#,
        w - 20.0,
        top + h + 30.0
    );
}

/// Round steps for a time axis, in seconds.
const TIME_STEPS: [f64; 14] = [
    0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

/// A duration for a label: milliseconds under a second, else seconds, or
/// minutes from two minutes.
fn secs_label(v: f64) -> String {
    if v > 0.0 && v < 1.0 {
        format!("{:.0} ms", v * 1e3)
    } else if v >= 120.0 && (v / 60.0).fract() == 0.0 {
        format!("{:.0} min", v / 60.0)
    } else if v.fract() == 0.0 {
        format!("{v:.0} s")
    } else {
        format!("{v:.1} s")
    }
}

fn polyline(s: &mut String, pts: impl Iterator<Item = (f64, f64)>, colour: &str) {
    let mut p = String::new();
    for (x, y) in pts {
        let _ = write!(p, "{x:.1},{y:.1} ");
    }
    let _ = writeln!(
        s,
        r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
        p.trim_end()
    );
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
