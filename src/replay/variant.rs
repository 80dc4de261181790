//! A replay run's variant: the discipline, the routing strategy and
//! whether SLO-aware admission is on, as a comparison varies them.

use crate::config::{Discipline, Policy, Strategy};
use crate::core::spec::OnLate;

/// One run of a comparison: a discipline, a routing strategy, and whether
/// the tenants' SLO-aware admission (`on_late`) is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub discipline: Discipline,
    pub strategy: Strategy,
    /// `false`: every tenant's `on_late` is `serve`, as before SLO-aware
    /// admission (the baselines).
    pub slo_admission: bool,
    /// Requests for a LoRA adapter prefer backends that have it loaded.
    pub adapter_affinity: bool,
    /// Every backend's KV events feed its pool's prefix index (precise
    /// mode: the simulated engines' cache changes, delivered at once).
    pub kv_events: bool,
    /// How the workload's batch items (`batch_api` tenants) are sent.
    pub batch: BatchMode,
}

/// How a workload's batch items are sent (`--compare batch`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchMode {
    /// As the workload says: in the batch lane, resumed from their tokens
    /// when preempted mid-answer.
    #[default]
    Lane,
    /// In the batch lane, restarted from zero when preempted
    /// (`[batch] resume = false`).
    Restart,
    /// As live requests, the way a team without the Batch API sends them.
    Live,
    /// Not at all: the other tenants alone, the baseline.
    Dropped,
}

impl BatchMode {
    /// Its name in tables (empty for the lane, the default).
    pub fn as_str(self) -> &'static str {
        match self {
            BatchMode::Lane => "",
            BatchMode::Restart => "batch restarted",
            BatchMode::Live => "batch as live",
            BatchMode::Dropped => "without the batch",
        }
    }
}

impl Variant {
    /// The policy as it is: its discipline, its first pool's routing, and
    /// SLO-aware admission when any tenant has it.
    pub fn of(policy: &Policy) -> Self {
        Variant {
            discipline: policy.queue.discipline,
            strategy: policy
                .pools
                .first()
                .map_or(Strategy::LeastOutstanding, |p| p.routing),
            slo_admission: policy.tenants.iter().any(|t| t.on_late != OnLate::Serve),
            adapter_affinity: policy.pools.first().is_none_or(|p| p.adapter_affinity),
            kv_events: policy
                .pools
                .first()
                .is_some_and(|p| p.backends.iter().any(|b| b.kv_events.is_some())),
            batch: BatchMode::Lane,
        }
    }

    /// Its routing in tables: the strategy, `+events` in precise mode;
    /// `oracle` for the greedy strategy on the engines' events.
    pub fn routing(&self) -> String {
        let events = self.kv_events && self.strategy.routes_on_prefixes();
        match self.strategy {
            Strategy::PrefixGreedy if events => "oracle".to_owned(),
            Strategy::PrefixAware if events => "prefix_aware+events".to_owned(),
            s => s.as_str().to_owned(),
        }
    }
}
