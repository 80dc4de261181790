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
    /// Its KV usage is at the pool's watermark: in a pool routing on
    /// prefixes it is still a candidate, but only as the home of the
    /// request's prefix (whose blocks its engine keeps cached: going home
    /// costs it few new blocks, where a copy elsewhere evicts another
    /// prefix), never a new home, a spill or a request without one.
    pub kv_full: bool,
}

impl Candidate {
    /// Outstanding work over capacity: `(in_flight + waiting) / window`.
    pub fn load(&self) -> f64 {
        f64::from(self.in_flight + self.waiting) / f64::from(self.window.max(1))
    }

    /// Requests outstanding at the backend over its whole window (its own
    /// alone; in a cluster, this replica's share of it divided by the
    /// share): a gap between two backends' is then counted in as many
    /// requests, whatever the number of replicas, where [`Self::load`]'s
    /// would take each request of this replica's for one of every
    /// replica's. Outstanding is this replica's in flight and the
    /// requests waiting in the engine past that number (other gateways'
    /// queued work): not their sum, which counts this replica's requests
    /// waiting in the engine twice, and sent one request away from its
    /// home in seven on two real engines whose caches were full.
    pub fn whole_load(&self) -> f64 {
        let share = self.window_share.clamp(f64::MIN_POSITIVE, 1.0);
        let outstanding = self.in_flight + self.waiting.saturating_sub(self.in_flight);
        f64::from(outstanding) * share / f64::from(self.window.max(1))
    }
}
