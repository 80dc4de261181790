//! Placement's own views: `GET /metrics` (Prometheus text) and
//! `GET /nodes` (the nodes as the rules see them, the reservations and the
//! latest decisions).

use std::sync::atomic::Ordering;

use serde_json::Value;

use super::service::{Counters, Placement};
use crate::prom::{self, Kind};

impl Placement {
    /// `GET /metrics`, Prometheus text.
    pub(super) fn metrics(&self) -> String {
        let policy = self.policy.load();
        let now = self.clock.now();
        let (known, fresh, reservations) = {
            let nodes = self.nodes.lock();
            let names = nodes.names();
            let fresh = names
                .iter()
                .filter(|n| !nodes.state(n, now, policy.stale_after).gpus.is_empty())
                .count();
            (names.len(), fresh, nodes.reservations.len())
        };
        let c = self.counters.lock();
        let store_up = self
            .shared
            .as_ref()
            .map(|_| u8::from(self.store_up.load(Ordering::Relaxed)));
        families(&c, known, fresh, reservations, store_up)
    }

    /// `GET /nodes`.
    pub(super) fn report(&self) -> Value {
        let policy = self.policy.load();
        let now = self.clock.now();
        let nodes = self.nodes.lock();
        let states: Vec<Value> = nodes
            .names()
            .iter()
            .map(|name| {
                let s = nodes.state(name, now, policy.stale_after);
                serde_json::json!({
                    "name": s.name,
                    "reading_age_seconds": s.read_at.map(|at| now.saturating_since(at).as_secs_f64()),
                    "gpus": s.gpus.iter().map(|g| serde_json::json!({
                        "index": g.index,
                        "memory_total_bytes": g.memory_total,
                        "memory_used_bytes": g.memory_used,
                        "models": g.models,
                        "ttft_p99_seconds": g.ttft_p99.map(|d| d.as_secs_f64()),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let reservations: Vec<Value> = nodes
            .reservations
            .iter()
            .map(|r| {
                serde_json::json!({
                    "pod": r.pod,
                    "node": r.node,
                    "gpu": r.gpu,
                    "model": r.request.model,
                    "memory_bytes": r.request.memory,
                    "expires_in_seconds": r.until.saturating_since(now).as_secs_f64(),
                })
            })
            .collect();
        serde_json::json!({
            "nodes": states,
            "reservations": reservations,
            "shared": self.shared.is_some(),
            "decisions": self.decisions.lock().iter().rev().collect::<Vec<_>>(),
        })
    }
}

/// Placement's families, `store_up` (1 or 0) with a cluster store.
fn families(
    c: &Counters,
    known: usize,
    fresh: usize,
    reservations: usize,
    store_up: Option<u8>,
) -> String {
    let mut w = String::new();
    let mut f = prom::family(
        &mut w,
        "fairway_placement_decisions_total",
        Kind::Counter,
        "Placement decisions by kind (filter: one per node judged) and result.",
    );
    for ((kind, allowed), n) in &c.decisions {
        let result = if *allowed { "allowed" } else { "refused" };
        f.sample(&[("kind", kind), ("result", result)], n);
    }
    let mut f = prom::family(
        &mut w,
        "fairway_placement_refusals_total",
        Kind::Counter,
        "Refusals by rule (one per GPU or node that failed it).",
    );
    for (rule, n) in &c.refusals {
        f.sample(&[("rule", rule)], n);
    }
    prom::family(
        &mut w,
        "fairway_placement_agent_reads_total",
        Kind::Counter,
        "Reads of the agents' GET /node by result.",
    )
    .sample(&[("result", "ok")], c.reads[1])
    .sample(&[("result", "failed")], c.reads[0]);
    prom::family(
        &mut w,
        "fairway_placement_nodes",
        Kind::Gauge,
        "Nodes an agent has reported, and those with a fresh reading.",
    )
    .sample(&[("reading", "any")], known)
    .sample(&[("reading", "fresh")], fresh);
    prom::family(
        &mut w,
        "fairway_placement_reservations",
        Kind::Gauge,
        "Memory reservations held for allowed bindings.",
    )
    .sample(&[], reservations);
    if let Some(up) = store_up {
        prom::family(
            &mut w,
            "fairway_placement_store_up",
            Kind::Gauge,
            "Whether the last call to the cluster's store, which holds the reservations of every placement replica, succeeded.",
        )
        .sample(&[], up);
        prom::family(
            &mut w,
            "fairway_placement_store_errors_total",
            Kind::Counter,
            "Calls to the cluster's store that failed (judged with this replica's reservations only).",
        )
        .sample(&[], c.store_errors);
        prom::family(
            &mut w,
            "fairway_placement_binding_conflicts_total",
            Kind::Counter,
            "Bindings judged again because another placement replica reserved on their node in between.",
        )
        .sample(&[], c.conflicts);
    }
    w
}
