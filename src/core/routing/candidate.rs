//! A backend that may take a request now, as the strategies see it.

use crate::core::ids::BackendId;

/// A backend that may take a request now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub id: BackendId,
    /// Requests Fairway has in flight there.
    pub in_flight: u32,
    /// Requests waiting inside the engine, from a fresh reading (else 0).
    pub waiting: u32,
    /// Current dispatch window (> in_flight for a candidate): this
    /// replica's share of the backend's, in a cluster.
    pub window: u32,
    /// That share (1 alone).
    pub window_share: f64,
    /// KV usage from a fresh reading.
    pub kv_usage: Option<f64>,
    /// Prompt tokens of this request it holds cached, by the pool's prefix
    /// index (0 without one).
    pub cached_tokens: u32,
    /// Whether `cached_tokens` is its engine's own word (its KV events are
    /// followed), rather than a guess from this replica's sends.
    pub events: bool,
    /// Prompt tokens of this request whose blocks have it as their home
    /// (`crate::core::prefix::Homes`; 0 without).
    pub home_tokens: u32,
    /// Its share of the pool's partition: blocks homed on it over its
    /// cache's blocks (a new prefix goes where it fits).
    pub homed: f64,
    /// This request's prompt, in the same unit.
    pub need: f64,
}

impl Candidate {
    /// Outstanding work over capacity: `(in_flight + waiting) / window`.
    pub fn load(&self) -> f64 {
        f64::from(self.in_flight + self.waiting) / f64::from(self.window.max(1))
    }

    /// Outstanding work over the backend's whole window (its own alone;
    /// in a cluster, over this replica's share of it divided by the
    /// share): a gap between two backends' is then counted in as many
    /// requests, whatever the number of replicas, where [`Self::load`]'s
    /// would take each request of this replica's for one of every
    /// replica's.
    pub fn whole_load(&self) -> f64 {
        self.load() * self.window_share.clamp(f64::MIN_POSITIVE, 1.0)
    }
}
