//! Summaries of replay runs: per-tenant latency, goodput and attainment;
//! the side-by-side table, the JSON report and the SVG charts.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::config::policy::as_display;
use crate::config::{Discipline, Strategy};
use crate::core::fairness::jain;
use crate::core::queue::FAIRNESS_BOUND;
use crate::replay::sim::{Outcome, Trace};
use crate::replay::variant::{BatchMode, Variant};

mod svg;

pub use svg::svg;

/// One tenant's figures in one run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TenantReport {
    pub requests: usize,
    pub served: usize,
    pub ttft_p50_s: Option<f64>,
    pub ttft_p99_s: Option<f64>,
    pub e2e_p50_s: Option<f64>,
    pub e2e_p99_s: Option<f64>,
    /// Responses within the tenant's SLO per second of offered load (first
    /// to last arrival of the workload).
    pub goodput_rps: f64,
    /// Responses within SLO over every request the tenant sent (refused,
    /// shed and failed ones count as misses).
    pub slo_attainment: f64,
    pub refused: usize,
    pub shed: usize,
    pub failed: usize,
    /// Service while backlogged with other tenants, over its weighted fair
    /// share of what they got together (1: exactly its share; `null`:
    /// never backlogged with another, or not measured).
    pub fair_share: Option<f64>,
}

/// One run's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunReport {
    #[serde(serialize_with = "as_display")]
    pub discipline: Discipline,
    #[serde(serialize_with = "as_display")]
    pub strategy: Strategy,
    /// Whether the tenants' SLO-aware admission (`on_late`) was on.
    pub slo_admission: bool,
    /// Whether requests for a LoRA adapter preferred backends with it loaded.
    pub adapter_affinity: bool,
    /// Whether the engines' KV events fed the prefix index (precise mode).
    pub kv_events: bool,
    /// How the batch items were sent: `lane`, `live`, or `dropped`.
    pub batch: BatchMode,
    /// LoRA adapter loads on all engines (`null`: no request named an
    /// adapter, or not known).
    pub adapter_loads: Option<u64>,
    /// Jain's index of backlogged tenants' weighted service, over the
    /// periods they were backlogged together (`null`: never two backlogged
    /// tenants at once).
    pub jain: Option<f64>,
    /// Proportional SLO attainment: Jain's index of the tenants' SLO
    /// attainments (1: every tenant met its own SLO equally often,
    /// whatever its SLO and share; `null`: no tenant).
    pub slo_jain: Option<f64>,
    /// Preemptions of in-flight batch requests (`null`: not known).
    pub preempted: Option<u64>,
    /// Generated tokens that preemptions threw away, generated again
    /// later (`null`: not known).
    pub lost_tokens: Option<u64>,
    /// Batch items continued from their tokens after a preemption
    /// (`null`: not known).
    pub resumed: Option<u64>,
    pub utilisation: f64,
    pub throughput_rps: f64,
    /// Responses within their tenant's SLO per second of offered load.
    pub goodput_rps: f64,
    pub output_tokens_per_s: f64,
    pub makespan_s: f64,
    /// How the fair-queue cost charged at dispatch compares with what it
    /// settled to: the ratio charged / settled over served requests, at
    /// p50 and p99 (`null`: nothing settled, or not known).
    pub estimate_ratio_p50: Option<f64>,
    pub estimate_ratio_p99: Option<f64>,
    /// The same ratio's p1: how far under the real cost the estimate goes.
    pub estimate_ratio_p1: Option<f64>,
    /// The fairness bound's ratio: the largest gap seen between two
    /// backlogged tenants' counters, over the largest single charge per
    /// weight plus the most a tenant had in flight
    /// ([`crate::core::queue::FairQueue::bound`]); at most
    /// [`FAIRNESS_BOUND`] (`null`: not measured, or never two tenants
    /// backlogged under `drf` or `wfq`).
    pub bound_ratio: Option<f64>,
    /// The engines' prefix caches (`null`: no request shared a prefix and
    /// no pool routed on them, or not known).
    pub prefix: Option<PrefixReport>,
    pub tenants: BTreeMap<String, TenantReport>,
}

/// What the engines' prefix caches did over a run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PrefixReport {
    /// Prompt tokens found cached, over prompt tokens admitted.
    pub hit_rate: f64,
    /// Prompt tokens the gateway's prefix index predicted cached where it
    /// sent them, over prompt tokens admitted (0 when no pool routed on
    /// prefixes).
    pub predicted_hit_rate: f64,
    /// Prompt tokens the engines computed (prefills and re-prefills after
    /// preemptions).
    pub prefill_tokens: u64,
    /// Requests served out of the fair queue's order for their cached
    /// prefix (`[queue] locality`).
    pub local_dispatches: u64,
}

impl RunReport {
    /// The run's name in tables: its discipline, `+slo` with SLO-aware
    /// admission on.
    pub fn label(&self) -> String {
        let mut s = if self.slo_admission {
            format!("{}+slo", self.discipline)
        } else {
            self.discipline.to_string()
        };
        if self.batch != BatchMode::Lane {
            s = format!("{s}, {}", self.batch.as_str());
        }
        s
    }

    /// Its routing in tables: the strategy, `+events` in precise mode,
    /// `+lora` when requests for an adapter preferred backends with it
    /// loaded; `oracle` for the greedy strategy on the engines' events.
    pub fn routing(&self) -> String {
        let mut s = Variant {
            discipline: self.discipline,
            strategy: self.strategy,
            slo_admission: self.slo_admission,
            adapter_affinity: self.adapter_affinity,
            kv_events: self.kv_events,
            batch: self.batch,
        }
        .routing();
        if self.adapter_affinity && self.adapter_loads.is_some() {
            s.push_str("+lora");
        }
        s
    }
}

/// Summarises a trace.
pub fn summarise(variant: Variant, trace: &Trace) -> RunReport {
    let Variant {
        discipline,
        strategy,
        slo_admission,
        adapter_affinity,
        kv_events,
        batch,
    } = variant;
    let mut tenants = BTreeMap::new();
    // Rates are per second of offered load (first to last arrival), the
    // same for every run of a workload: a run that refuses what it cannot
    // serve ends sooner, and per second of its own makespan would look
    // better for it.
    let (first, last) = trace
        .requests
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (_, r)| {
            (lo.min(r.arrived), hi.max(r.arrived))
        });
    let offered = if last > first {
        last - first
    } else {
        trace.makespan
    };
    let span = trace.makespan;
    for (ti, name) in trace.tenants.iter().enumerate() {
        let mine: Vec<_> = trace
            .requests
            .iter()
            .filter(|(t, _)| *t == ti)
            .map(|(_, r)| r)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let mut ttft: Vec<f64> = mine.iter().filter_map(|r| r.ttft).collect();
        let mut e2e: Vec<f64> = mine.iter().filter_map(|r| r.e2e).collect();
        let count = |f: fn(&Outcome) -> bool| mine.iter().filter(|r| f(&r.outcome)).count();
        let good = mine.iter().filter(|r| r.good).count();
        tenants.insert(
            name.clone(),
            TenantReport {
                requests: mine.len(),
                served: count(|o| *o == Outcome::Served),
                ttft_p50_s: percentile(&mut ttft, 0.50),
                ttft_p99_s: percentile(&mut ttft, 0.99),
                e2e_p50_s: percentile(&mut e2e, 0.50),
                e2e_p99_s: percentile(&mut e2e, 0.99),
                goodput_rps: good as f64 / offered,
                slo_attainment: good as f64 / mine.len() as f64,
                refused: count(|o| matches!(o, Outcome::Refused(_))),
                shed: count(|o| *o == Outcome::Shed),
                failed: count(|o| *o == Outcome::FailedUpstream),
                fair_share: trace.shares.get(ti).copied().flatten(),
            },
        );
    }
    let served = trace
        .requests
        .iter()
        .filter(|(_, r)| r.outcome == Outcome::Served)
        .count();
    let good = trace.requests.iter().filter(|(_, r)| r.good).count();
    let mut ratios: Vec<f64> = trace
        .estimates
        .iter()
        .filter(|(_, settled)| *settled > 0.0)
        .map(|(charged, settled)| charged / settled)
        .collect();
    RunReport {
        estimate_ratio_p50: percentile(&mut ratios, 0.50),
        estimate_ratio_p99: percentile(&mut ratios, 0.99),
        estimate_ratio_p1: percentile(&mut ratios, 0.01),
        bound_ratio: trace.bound_ratio,
        prefix: trace.prefix.map(|p| {
            let of = |n: u64| n as f64 / p.prompt_tokens.max(1) as f64;
            PrefixReport {
                hit_rate: of(p.cached_tokens),
                predicted_hit_rate: of(p.predicted_tokens),
                prefill_tokens: p.prefill_tokens,
                local_dispatches: p.local_dispatches,
            }
        }),
        discipline,
        strategy,
        slo_admission,
        adapter_affinity,
        kv_events,
        batch,
        adapter_loads: trace.adapter_loads,
        jain: trace.jain,
        slo_jain: jain(
            &tenants
                .values()
                .map(|t: &TenantReport| t.slo_attainment)
                .collect::<Vec<_>>(),
        ),
        preempted: trace.preempted,
        lost_tokens: trace.lost_tokens,
        resumed: trace.resumed,
        utilisation: trace.utilisation,
        throughput_rps: served as f64 / span,
        goodput_rps: good as f64 / offered,
        output_tokens_per_s: trace.output_tokens as f64 / span,
        makespan_s: span,
        tenants,
    }
}

/// Nearest-rank percentile; sorts `xs`.
pub fn percentile(xs: &mut [f64], q: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    Some(xs[rank - 1])
}

/// The runs side by side: one line per run and tenant.
pub fn table(runs: &[RunReport]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<9} {:<22} {:>6} {:>6} {:>5} {:>7} {:>7} | {:<8} {:>9} {:>9} {:>9} {:>8} {:>7} {:>7} {:>6} {:>6}",
        "queue",
        "routing",
        "jain",
        "slo_j",
        "util",
        "good/s",
        "preempt",
        "tenant",
        "ttft_p50",
        "ttft_p99",
        "e2e_p99",
        "good/s",
        "slo",
        "refused",
        "shed",
        "share"
    );
    for r in runs {
        for (i, (name, t)) in r.tenants.iter().enumerate() {
            let head = if i == 0 {
                format!(
                    "{:<9} {:<22} {:>6} {:>6} {:>5.0}% {:>7.2} {:>7}",
                    r.label(),
                    r.routing(),
                    r.jain.map_or("-".into(), |j| format!("{j:.3}")),
                    r.slo_jain.map_or("-".into(), |j| format!("{j:.3}")),
                    r.utilisation * 100.0,
                    r.goodput_rps,
                    r.preempted.map_or("-".into(), |n| n.to_string())
                )
            } else {
                format!(
                    "{:<9} {:<22} {:>6} {:>6} {:>5} {:>7} {:>7}",
                    "", "", "", "", "", "", ""
                )
            };
            let _ = writeln!(
                s,
                "{head} | {:<8} {:>9} {:>9} {:>9} {:>8.2} {:>6.1}% {:>7} {:>6} {:>6}",
                name,
                secs(t.ttft_p50_s),
                secs(t.ttft_p99_s),
                secs(t.e2e_p99_s),
                t.goodput_rps,
                t.slo_attainment * 100.0,
                t.refused,
                t.shed,
                t.fair_share.map_or("-".into(), |f| format!("{f:.2}"))
            );
        }
    }
    // How far the cost charged at dispatch was from what it settled to.
    let estimates: Vec<String> = runs
        .iter()
        .filter_map(|r| {
            Some(format!(
                "{}: p1 {:.2}x p50 {:.2}x p99 {:.2}x",
                r.label(),
                r.estimate_ratio_p1?,
                r.estimate_ratio_p50?,
                r.estimate_ratio_p99?
            ))
        })
        .collect();
    let loads: Vec<String> = runs
        .iter()
        .filter_map(|r| {
            Some(format!(
                "{} {}: {}",
                r.label(),
                r.routing(),
                r.adapter_loads?
            ))
        })
        .collect();
    if !loads.is_empty() {
        let _ = writeln!(s, "LoRA adapter loads: {}", loads.join("; "));
    }
    let prefixes: Vec<String> = runs
        .iter()
        .filter_map(|r| {
            let p = r.prefix?;
            Some(format!(
                "{} {}: hit {:.1}% (predicted {:.1}%), {} tokens prefilled, {} served first for locality",
                r.label(),
                r.routing(),
                p.hit_rate * 100.0,
                p.predicted_hit_rate * 100.0,
                p.prefill_tokens,
                p.local_dispatches
            ))
        })
        .collect();
    if !prefixes.is_empty() {
        let _ = writeln!(
            s,
            "prefix cache, prompt tokens found cached in the engines: {}",
            prefixes.join("; ")
        );
    }
    if !estimates.is_empty() {
        let _ = writeln!(
            s,
            "cost charged at dispatch / settled: {}",
            estimates.join("; ")
        );
    }
    let bounds: Vec<String> = runs
        .iter()
        .filter_map(|r| {
            let ratio = r.bound_ratio?;
            let held = if ratio <= FAIRNESS_BOUND {
                "held"
            } else {
                "BROKEN"
            };
            Some(format!("{}: {ratio:.2} ({held})", r.label()))
        })
        .collect();
    if !bounds.is_empty() {
        let _ = writeln!(
            s,
            "fairness bound, backlogged tenants' largest counter gap / (largest charge + most in flight), \
             at most {FAIRNESS_BOUND}: {}",
            bounds.join("; ")
        );
    }
    s
}

fn secs(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x < 1.0 => format!("{:.0}ms", x * 1e3),
        Some(x) => format!("{x:.2}s"),
    }
}

/// The `--json` document: `{"runs": [...]}`.
pub fn json(runs: &[RunReport]) -> String {
    serde_json::to_string_pretty(&serde_json::json!({ "runs": runs })).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut v, 0.99), Some(99.0));
        assert_eq!(percentile(&mut v, 0.5), Some(50.0));
        assert_eq!(percentile(&mut [], 0.5), None);
        assert_eq!(percentile(&mut [3.0], 0.99), Some(3.0));
    }

    #[test]
    fn the_estimate_ratio_is_charged_over_settled() {
        // 50 requests charged 2 and settled 1, one charged 1 and settled
        // 4, and one without a settled cost, which is left out.
        let mut estimates = vec![(2.0, 1.0); 50];
        estimates.push((1.0, 4.0));
        estimates.push((1.0, 0.0));
        let trace = Trace {
            tenants: Vec::new(),
            slo_ttft: Vec::new(),
            requests: Vec::new(),
            queue: Vec::new(),
            jain: None,
            shares: Vec::new(),
            utilisation: 0.0,
            makespan: 1.0,
            output_tokens: 0,
            preempted: None,
            lost_tokens: None,
            resumed: None,
            adapter_loads: None,
            prefix: None,
            estimates,
            bound_ratio: None,
        };
        let variant = Variant {
            discipline: Discipline::Drf,
            strategy: Strategy::LeastOutstanding,
            slo_admission: false,
            adapter_affinity: true,
            kv_events: false,
            batch: Default::default(),
        };
        let r = summarise(variant, &trace);
        assert_eq!(r.estimate_ratio_p50, Some(2.0));
        assert_eq!(r.estimate_ratio_p99, Some(2.0));
        assert_eq!(r.estimate_ratio_p1, Some(0.25));
        assert!(table(&[r]).contains("drf: p1 0.25x p50 2.00x p99 2.00x"));
    }

    #[test]
    fn the_svg_draws_each_slo_and_labels_time() {
        use crate::replay::sim::{QueueSample, RequestResult};
        let served = |arrived: f64, ttft: f64| RequestResult {
            outcome: Outcome::Served,
            arrived,
            queue_wait: Some(0.0),
            ttft: Some(ttft),
            e2e: Some(ttft),
            good: true,
        };
        let trace = Trace {
            tenants: vec!["api".into(), "<b>evals</b>".into()],
            slo_ttft: vec![Some(0.4), None],
            requests: vec![(0, served(1.0, 0.2)), (1, served(50.0, 3.0))],
            queue: vec![QueueSample {
                at: 95.0,
                queued: vec![0, 3],
            }],
            jain: None,
            shares: Vec::new(),
            utilisation: 0.0,
            makespan: 95.0,
            output_tokens: 0,
            preempted: None,
            lost_tokens: None,
            resumed: None,
            adapter_loads: None,
            prefix: None,
            estimates: Vec::new(),
            bound_ratio: None,
        };
        let svg = svg("run", &trace);
        // One SLO line (api's), dashed, labelled with its target.
        assert_eq!(svg.matches("stroke-dasharray").count(), 1, "{svg}");
        assert!(svg.contains(">api SLO 400 ms</text>"), "{svg}");
        // Ticks every 10 s from 0 to 90 on both plots, and the axis named.
        assert!(
            svg.contains(">0 s</text>") && svg.contains(">90 s</text>"),
            "{svg}"
        );
        assert_eq!(
            svg.matches(">time since the first arrival</text>").count(),
            2
        );
        // Names are text, not markup.
        assert!(svg.contains("&lt;b&gt;evals&lt;/b&gt;") && !svg.contains("<b>"));
    }
}
