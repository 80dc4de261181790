//! The variants a replay compares (disciplines, strategies) and running one.

use super::report::RunReport;
use super::sim::{RunOptions, Trace};
use super::variant::{BatchMode, Variant};
use super::workload::WorkRequest;
use crate::config::{Discipline, OnLate, Policy, Strategy};

/// Every discipline, in the order reports list them.
pub const DISCIPLINES: [Discipline; 4] = [
    Discipline::Fifo,
    Discipline::Priority,
    Discipline::Wfq,
    Discipline::Drf,
];

/// Every routing strategy, in the order reports list them.
pub const STRATEGIES: [Strategy; 6] = [
    Strategy::LeastOutstanding,
    Strategy::PrefixAware,
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
    /// The policy's routing with LoRA adapter affinity on, then off.
    Adapters,
    /// The workload's batch items (`batch_api` tenants) left out (the
    /// other tenants alone), sent as live requests, then in the batch
    /// lane.
    Batch,
    /// Routing on load alone (`least_outstanding`), then on cached
    /// prefixes and load (`prefix_aware`, fed by Fairway's own sends,
    /// then by the engines' events), then the oracle: every request to
    /// the engine holding most of its prompt with room, on the engines'
    /// events.
    Routing,
}

/// The runs to make: the policy as it is when `compare` is `None`.
/// Comparing disciplines runs each without SLO-aware admission, then the
/// policy's discipline with the policy's admission (when any tenant has
/// one): the new admission against the baselines it must beat. Comparing
/// strategies keeps the policy's discipline and admission. The strategy is
/// the first pool's.
pub fn variants(policy: &Policy, compare: Option<Compare>) -> Vec<Variant> {
    let Variant {
        discipline: d0,
        strategy: s0,
        slo_admission: admits,
        adapter_affinity: affinity,
        kv_events: _,
        batch: _,
    } = Variant::of(policy);
    let v = |discipline, strategy, slo_admission| Variant {
        discipline,
        strategy,
        slo_admission,
        adapter_affinity: affinity,
        kv_events: false,
        batch: BatchMode::Lane,
    };
    let disciplines = |s| {
        let mut out: Vec<Variant> = DISCIPLINES.iter().map(|&d| v(d, s, false)).collect();
        if admits {
            out.push(v(d0, s, true));
        }
        out
    };
    match compare {
        None => vec![v(d0, s0, admits)],
        Some(Compare::Disciplines) => disciplines(s0),
        Some(Compare::Strategies) => STRATEGIES.iter().map(|&s| v(d0, s, admits)).collect(),
        // Prefix routing in approximate mode, then in precise mode, then
        // the oracle.
        Some(Compare::Routing) => vec![
            v(d0, Strategy::LeastOutstanding, admits),
            v(d0, Strategy::PrefixAware, admits),
            Variant {
                kv_events: true,
                ..v(d0, Strategy::PrefixAware, admits)
            },
            Variant {
                kv_events: true,
                ..v(d0, Strategy::PrefixGreedy, admits)
            },
        ],
        Some(Compare::Batch) => [
            BatchMode::Dropped,
            BatchMode::Live,
            BatchMode::Restart,
            BatchMode::Lane,
        ]
        .into_iter()
        .map(|batch| Variant {
            batch,
            ..v(d0, s0, admits)
        })
        .collect(),
        Some(Compare::All) => STRATEGIES.iter().flat_map(|&s| disciplines(s)).collect(),
        Some(Compare::Adapters) => [true, false]
            .into_iter()
            .map(|adapter_affinity| Variant {
                adapter_affinity,
                ..v(d0, s0, admits)
            })
            .collect(),
    }
}

/// Runs `workload` under the policy with its discipline, every pool's
/// routing and (when off) every tenant's `on_late` replaced by the
/// variant's.
pub fn run_variant(
    policy: &Policy,
    workload: &[WorkRequest],
    variant: Variant,
    opts: &RunOptions,
) -> (RunReport, Trace) {
    let mut p = policy.clone();
    p.queue.discipline = variant.discipline;
    for pool in &mut p.pools {
        pool.routing = variant.strategy;
        pool.adapter_affinity = variant.adapter_affinity;
        for b in &mut pool.backends {
            // The replay delivers a simulated engine's events itself: the
            // address is never dialled.
            b.kv_events = (variant.kv_events && variant.strategy.routes_on_prefixes()).then(|| {
                crate::config::KvEventsSource {
                    endpoint: "tcp://replay:1".into(),
                    replay: None,
                    topic: String::new(),
                }
            });
        }
    }
    if !variant.slo_admission {
        for t in &mut p.tenants {
            t.on_late = OnLate::Serve;
        }
    }
    let work: Vec<WorkRequest>;
    if variant.batch == BatchMode::Restart {
        // Only `resume` of the section enters the replay.
        p.batch
            .get_or_insert_with(|| crate::config::policy::BatchPolicy {
                data_dir: std::path::PathBuf::new(),
                max_file_bytes: 0,
                max_lines: 0,
                max_files_per_tenant: 0,
                max_bytes_per_tenant: 0,
                resume: false,
                checkpoint_tokens: 0,
                live_reserve: 0.0,
                live_latency_target: 0.0,
                engine_priority: 0,
                prefill_ahead: crate::config::policy::BatchPolicy::PREFILL_AHEAD,
                window: std::time::Duration::from_secs(crate::protocol::batch::WINDOW_SECONDS),
                gpu_seconds_discount: 0.0,
                retention: std::time::Duration::ZERO,
                object_store: None,
                object_store_endpoint: None,
            })
            .resume = false;
    }
    let workload = match variant.batch {
        BatchMode::Lane | BatchMode::Restart => workload,
        BatchMode::Live => {
            work = workload
                .iter()
                .map(|r| WorkRequest {
                    batch: false,
                    ..r.clone()
                })
                .collect();
            &work
        }
        BatchMode::Dropped => {
            work = workload.iter().filter(|r| !r.batch).cloned().collect();
            &work
        }
    };
    let trace = super::sim::run(&p, workload, opts);
    (super::report::summarise(variant, &trace), trace)
}
