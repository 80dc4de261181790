//! Capacity at an SLO (`fairway replay --capacity A`): the highest
//! arrival rate a variant serves with every tenant meeting its own SLO on
//! at least a share `A` of its requests, found by replaying the workload
//! with its arrival times compressed (a closed search on a deterministic
//! replay, not an open-loop run at one rate).
//!
//! Two variants compared at the same `A` compare throughput at equal SLO:
//! the ratio of their capacities.

use std::fmt::Write as _;

use super::compare::run_variant;
use super::report::RunReport;
use super::sim::RunOptions;
use super::variant::Variant;
use super::workload::WorkRequest;
use crate::config::Policy;

/// The search's range of rate multiples, and how many halvings of the
/// bracket it makes once found (2^(1/2^6): to within about 1 %).
const LOWEST: f64 = 1.0 / 64.0;
const HIGHEST: f64 = 64.0;
const REFINE: u32 = 6;

/// A variant's capacity: the highest rate multiple that met the SLOs, and
/// the run at it.
#[derive(Clone, Debug)]
pub struct Capacity {
    /// Arrival rate over the workload's own (2: arrivals twice as dense).
    pub factor: f64,
    /// Requests offered per second at that rate.
    pub offered_rps: f64,
    pub run: RunReport,
}

/// Whether every tenant met its SLO on at least `attainment` of its
/// requests.
fn meets(run: &RunReport, attainment: f64) -> bool {
    run.tenants.values().all(|t| t.slo_attainment >= attainment)
}

/// The workload with every arrival `factor` times sooner.
pub fn compressed(workload: &[WorkRequest], factor: f64) -> Vec<WorkRequest> {
    workload
        .iter()
        .map(|r| WorkRequest {
            t: r.t / factor,
            ..r.clone()
        })
        .collect()
}

/// The variant's capacity at `attainment` (at most [`HIGHEST`] times the
/// workload's rate), or `None` when even [`LOWEST`] times it misses. The search doubles or
/// halves from the workload's own rate until the SLOs flip, then bisects
/// the bracket in log space.
pub fn capacity(
    policy: &Policy,
    workload: &[WorkRequest],
    variant: Variant,
    opts: &RunOptions,
    attainment: f64,
) -> Option<Capacity> {
    let run_at = |factor: f64| {
        let (run, _) = run_variant(policy, &compressed(workload, factor), variant, opts);
        meets(&run, attainment).then_some(run)
    };
    // The highest multiple that met the SLOs, and the lowest that missed
    // (`None`: none up to HIGHEST did, the capacity is at least that).
    let (mut good, mut bad) = match run_at(1.0) {
        Some(run) => {
            let mut good = (1.0, run);
            let mut bad = None;
            while bad.is_none() && good.0 < HIGHEST {
                match run_at(good.0 * 2.0) {
                    Some(run) => good = (good.0 * 2.0, run),
                    None => bad = Some(good.0 * 2.0),
                }
            }
            (good, bad)
        }
        None => {
            let mut bad = 1.0;
            loop {
                if bad / 2.0 < LOWEST {
                    return None;
                }
                if let Some(run) = run_at(bad / 2.0) {
                    break ((bad / 2.0, run), Some(bad));
                }
                bad /= 2.0;
            }
        }
    };
    for _ in 0..REFINE {
        let Some(b) = bad else { break };
        let mid = (good.0 * b).sqrt();
        match run_at(mid) {
            Some(run) => good = (mid, run),
            None => bad = Some(mid),
        }
    }
    let span = workload.iter().map(|r| r.t).fold(0.0, f64::max) / good.0;
    Some(Capacity {
        factor: good.0,
        offered_rps: workload.len() as f64 / span.max(f64::EPSILON),
        run: good.1,
    })
}

/// `--capacity`'s summary: each variant's highest rate multiple within
/// the SLOs, what it offered and served there, and its ratio to the
/// first variant's (`found` pairs a variant's label with its capacity,
/// `None` where it missed at every rate tried).
pub fn table(attainment: f64, found: &[(String, Option<Capacity>)]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "capacity: the highest arrival rate with every tenant within its SLO on at least {:.1}% of its requests",
        attainment * 100.0
    );
    let _ = writeln!(
        s,
        "{:<9} {:<22} {:>7} {:>10} {:>10} {:>9} {:>15} {:>9}",
        "queue",
        "routing",
        "rate x",
        "offered/s",
        "served/s",
        "hit rate",
        "prefill tokens",
        "vs first"
    );
    let first = found
        .first()
        .and_then(|f| f.1.as_ref())
        .map(|c| c.offered_rps);
    for (label, c) in found {
        let Some(c) = c else {
            let _ = writeln!(
                s,
                "{label:<32} misses its SLOs at every rate down to 1/64 of the workload's"
            );
            continue;
        };
        let run = &c.run;
        let (hit, prefill) = run
            .prefix
            .map_or((String::from("-"), String::from("-")), |p| {
                (
                    format!("{:.1}%", p.hit_rate * 100.0),
                    p.prefill_tokens.to_string(),
                )
            });
        let ratio = first.map_or(String::from("-"), |f| format!("{:.2}x", c.offered_rps / f));
        let _ = writeln!(
            s,
            "{:<9} {:<22} {:>7.2} {:>10.2} {:>10.2} {:>9} {:>15} {:>9}",
            run.label(),
            run.routing(),
            c.factor,
            c.offered_rps,
            run.throughput_rps,
            hit,
            prefill,
            ratio,
        );
    }
    s
}

/// `--capacity`'s `--json` document: `{"attainment": A, "capacity":
/// [{"variant", "factor", "offered_rps", "run"}, ...]}`, `factor`,
/// `offered_rps` and `run` `null` where the variant missed at every rate.
pub fn json(attainment: f64, found: &[(String, Option<Capacity>)]) -> String {
    let entries: Vec<serde_json::Value> = found
        .iter()
        .map(|(variant, c)| {
            serde_json::json!({
                "variant": variant,
                "factor": c.as_ref().map(|c| c.factor),
                "offered_rps": c.as_ref().map(|c| c.offered_rps),
                "run": c.as_ref().map(|c| &c.run),
            })
        })
        .collect();
    serde_json::to_string_pretty(&serde_json::json!({
        "attainment": attainment,
        "capacity": entries,
    }))
    .unwrap_or_default()
}
