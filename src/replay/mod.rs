//! `fairway replay`: the policy evaluated offline.
//!
//! - [`workload`]: the JSONL workload format, and access log → workload.
//! - [`scenario`]: generated workloads (the reference scenario, scenario files).
//! - [`sim`]: the discrete-event simulation driving the live scheduler
//!   against simulated engines on a simulated clock.
//! - [`report`]: per-tenant and overall figures, table, JSON, SVG.
//! - [`live`]: the same workload played against a running gateway (`fairway load`).

pub mod live;
pub mod report;
pub mod scenario;
pub mod sim;
pub mod workload;

use crate::config::{Discipline, Policy, Strategy};
use report::RunReport;
use sim::{RunOptions, Trace};
use workload::WorkRequest;

/// Every discipline, in the order reports list them.
pub const DISCIPLINES: [Discipline; 4] = [
    Discipline::Fifo,
    Discipline::Priority,
    Discipline::Wfq,
    Discipline::Drf,
];

/// Every routing strategy, in the order reports list them.
pub const STRATEGIES: [Strategy; 5] = [
    Strategy::LeastOutstanding,
    Strategy::P2c,
    Strategy::RoundRobin,
    Strategy::Random,
    Strategy::Pack,
];

/// What `--compare` varies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Compare {
    /// Each discipline, with the policy's routing.
    Disciplines,
    /// Each routing strategy, with the policy's discipline.
    Strategies,
    /// Every discipline with every strategy.
    All,
}

/// The (discipline, strategy) pairs to run: the policy's own when
/// `compare` is `None`. The strategy is the first pool's.
pub fn variants(policy: &Policy, compare: Option<Compare>) -> Vec<(Discipline, Strategy)> {
    let d0 = policy.queue.discipline;
    let s0 = policy
        .pools
        .first()
        .map_or(Strategy::LeastOutstanding, |p| p.routing);
    match compare {
        None => vec![(d0, s0)],
        Some(Compare::Disciplines) => DISCIPLINES.iter().map(|&d| (d, s0)).collect(),
        Some(Compare::Strategies) => STRATEGIES.iter().map(|&s| (d0, s)).collect(),
        Some(Compare::All) => DISCIPLINES
            .iter()
            .flat_map(|&d| STRATEGIES.iter().map(move |&s| (d, s)))
            .collect(),
    }
}

/// Runs `workload` with the policy's discipline and every pool's routing
/// replaced by the given ones.
pub fn run_variant(
    policy: &Policy,
    workload: &[WorkRequest],
    discipline: Discipline,
    strategy: Strategy,
    opts: &RunOptions,
) -> (RunReport, Trace) {
    let mut p = policy.clone();
    p.queue.discipline = discipline;
    for pool in &mut p.pools {
        pool.routing = strategy;
    }
    let trace = sim::run(&p, workload, opts);
    (report::summarise(discipline, strategy, &trace), trace)
}
