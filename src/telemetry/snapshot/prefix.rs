//! The prefix-routing families: each pool's index, what it predicted per
//! backend against what the engines reported, and the KV-event
//! subscribers.

use super::{BackendGauges, PrefixGauges, Snapshot};
use crate::core::routing::Placement;
use crate::prom::{self, Kind};

/// The prefix indexes, and what they predicted per backend.
pub(super) fn encode_prefix(w: &mut String, snap: &Snapshot) {
    type Get = fn(&PrefixGauges) -> f64;
    let families: [(&str, Kind, &str, Get); 5] = [
        (
            "fairway_prefix_index_entries",
            Kind::Gauge,
            "Blocks in the model's prefix index.",
            |p| p.entries as f64,
        ),
        (
            "fairway_prefix_index_capacity",
            Kind::Gauge,
            "The most blocks the model's prefix index holds (prefix_index_blocks).",
            |p| p.capacity as f64,
        ),
        (
            "fairway_prefix_index_evictions_total",
            Kind::Counter,
            "Blocks evicted from the model's prefix index to make room.",
            |p| p.evictions as f64,
        ),
        (
            "fairway_prefix_spills_total",
            Kind::Counter,
            "Requests sent to the least loaded backend, for themselves only, because the home of their prefix was too busy or full.",
            |p| {
                (p.placements[Placement::Spill.index()] + p.placements[Placement::Lent.index()])
                    as f64
            },
        ),
        (
            "fairway_prefix_local_dispatches_total",
            Kind::Counter,
            "Requests the fair queue served out of its order, within the fairness bound, because their prefix was cached on a backend with room ([queue] locality).",
            |p| p.local as f64,
        ),
    ];
    for (name, kind, help, get) in families {
        let mut f = prom::family(w, name, kind, help);
        for p in &snap.prefix {
            f.sample(&[("model", &p.model)], get(p));
        }
    }
    let mut f = prom::family(
        w,
        "fairway_prefix_placements_total",
        Kind::Counter,
        "Requests the prefix strategy placed, by how their backend relates to their prefix's homes: home, spill (the least loaded, its home past the load bound: for this request only), lent (the least loaded, its home taking no request now: for this request only), adopted (a backend holding a homeless prefix became its home), new (a new home), unplaced (no full block: the least loaded).",
    );
    for p in &snap.prefix {
        for placed in Placement::ALL {
            let labels = [("model", p.model.as_str()), ("placement", placed.as_str())];
            f.sample(&labels, p.placements[placed.index()]);
        }
    }
    let mut f = prom::family(
        w,
        "fairway_chat_template_fallbacks_total",
        Kind::Counter,
        "Chats whose prompt fell back to the byte approximation: their model's chat template failed on them (reason=\"failed\") or ran past its budget (reason=\"budget\").",
    );
    for (model, failed, over) in &snap.template_fallbacks {
        for (reason, n) in [("failed", failed), ("budget", over)] {
            f.sample(&[("model", model), ("reason", reason)], n);
        }
    }
    encode_cached_tokens(w, &snap.backends);
    encode_kv_events(w, snap);
}

/// Per backend, the prompt tokens the prefix index predicted it held
/// against those it reported cached.
fn encode_cached_tokens(w: &mut String, backends: &[BackendGauges]) {
    type Count = fn(&BackendGauges) -> Option<u64>;
    let per_backend: [(&str, &str, Count); 3] = [
        (
            "fairway_prefix_predicted_cached_tokens_total",
            "Prompt tokens the prefix index predicted a backend held, over the requests sent to it.",
            |b| b.predicted_cached_tokens,
        ),
        (
            "fairway_backend_cached_prompt_tokens_total",
            "Prompt tokens a backend reported it found in its prefix cache (cached_tokens in its usage).",
            |b| Some(b.reported_cached_tokens),
        ),
        (
            "fairway_backend_reported_prompt_tokens_total",
            "Prompt tokens of the requests whose usage reported a cached count (the cache hit rate's denominator).",
            |b| Some(b.reported_prompt_tokens),
        ),
    ];
    for (name, help, get) in per_backend {
        let mut f = prom::family(w, name, Kind::Counter, help);
        for b in backends {
            if let Some(v) = get(b) {
                f.sample(&[("backend", &b.backend), ("model", &b.model)], v);
            }
        }
    }
}

/// The KV-event subscribers' families (backends with `kv_events` only).
fn encode_kv_events(w: &mut String, snap: &Snapshot) {
    use crate::poller::KvEventCounts as C;
    type Get = fn(&C) -> f64;
    let families: [(&str, Kind, &str, Get); 10] = [
        (
            "fairway_kv_events_connected",
            Kind::Gauge,
            "1 while the backend's KV events are followed (precise prefix routing); 0 while its publisher cannot be reached.",
            |c| f64::from(u8::from(c.connected)),
        ),
        (
            "fairway_kv_events_batches_total",
            Kind::Counter,
            "KV-event batches applied from the backend.",
            |c| c.batches as f64,
        ),
        (
            "fairway_kv_events_total",
            Kind::Counter,
            "KV events received from the backend.",
            |c| c.events as f64,
        ),
        (
            "fairway_kv_events_gaps_total",
            Kind::Counter,
            "Gaps in the backend's KV-event sequence.",
            |c| c.gaps as f64,
        ),
        (
            "fairway_kv_events_replayed_total",
            Kind::Counter,
            "Gaps filled from the backend's replay socket.",
            |c| c.replayed as f64,
        ),
        (
            "fairway_kv_events_resets_total",
            Kind::Counter,
            "Times the backend's prefix entries were dropped to be relearned (an engine restart, a gap not replayed).",
            |c| c.resets as f64,
        ),
        (
            "fairway_kv_events_decode_errors_total",
            Kind::Counter,
            "KV-event messages from the backend that were not a batch.",
            |c| c.decode_errors as f64,
        ),
        (
            "fairway_kv_events_unanchored_total",
            Kind::Counter,
            "Stored-block events whose parent block was unknown (not keyed).",
            |c| c.unanchored as f64,
        ),
        (
            "fairway_kv_events_watchdog_total",
            Kind::Counter,
            "KV-event subscriptions replaced after a silence.",
            |c| c.watchdog as f64,
        ),
        (
            "fairway_kv_events_lag_seconds",
            Kind::Gauge,
            "From the engine's timestamp of the last KV-event batch to its arrival.",
            |c| c.lag_ms as f64 / 1000.0,
        ),
    ];
    if snap.backends.iter().all(|b| b.kv_events.is_none()) {
        return;
    }
    for (name, kind, help, get) in families {
        let mut f = prom::family(w, name, kind, help);
        for b in &snap.backends {
            if let Some(c) = &b.kv_events {
                f.sample(&[("backend", &b.backend), ("model", &b.model)], get(c));
            }
        }
    }
}
