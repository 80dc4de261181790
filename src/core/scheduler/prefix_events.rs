//! Precise mode: what each engine reports of its own prefix cache (its KV
//! events, keyed by the gateway in the pool's canonical blocks), fed into
//! the pool's prefix index.
//!
//! While a backend's events are followed, what it reported it holds stays
//! in the index until it reports the blocks gone; what Fairway sends it is
//! recorded for [`PREFIX_GUESS`] only, so the next request of a
//! conversation finds it before the engine's event arrives. When the
//! subscription starts or is lost (a gap that cannot be replayed, an
//! engine restart, a silent socket) the backend's entries are dropped and
//! relearned: stale holdings would send requests to an engine that no
//! longer has their prefix.

use std::time::Duration;

use crate::core::ids::BackendId;
use crate::core::scheduler::Scheduler;
use crate::core::time::Instant;

/// How long a prompt just sent to an event-fed backend counts as held
/// before the engine's own event confirms it (the engine reports blocks
/// as it fills them, within a step of starting the prefill); the pool's
/// `prefix_ttl` when that is shorter.
pub const PREFIX_GUESS: Duration = Duration::from_secs(10);

/// One change of a backend's prefix cache, in canonical block keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrefixEvent {
    /// The engine holds these blocks (a chain, in order).
    Stored(Vec<u64>),
    /// The engine evicted these blocks.
    Removed(Vec<u64>),
    /// The engine holds nothing (a reset, or a restart).
    Cleared,
}

impl Scheduler {
    /// Starts (`true`) or stops following `backend`'s KV events. Either
    /// change drops what the index recorded for it (see the module docs);
    /// no change changes nothing.
    pub fn set_prefix_events(&mut self, backend: BackendId, live: bool) {
        let Some(b) = self.backends.get_mut(backend.0 as usize) else {
            return;
        };
        if b.prefix_events == live {
            return;
        }
        b.prefix_events = live;
        if let Some(ix) = self.pools[b.pool.0 as usize].prefix.as_mut() {
            ix.cleared(backend);
        }
    }

    /// An event of `backend`'s engine. Ignored unless its events are
    /// followed and its pool routes on prefixes.
    pub fn on_prefix_event(&mut self, now: Instant, backend: BackendId, event: &PrefixEvent) {
        let Some(b) = self.backends.get(backend.0 as usize) else {
            return;
        };
        if !b.prefix_events {
            return;
        }
        let Some(ix) = self.pools[b.pool.0 as usize].prefix.as_mut() else {
            return;
        };
        match event {
            PrefixEvent::Stored(keys) => ix.stored_for(now, backend, keys, None),
            PrefixEvent::Removed(keys) => ix.removed(backend, keys),
            PrefixEvent::Cleared => ix.cleared(backend),
        }
    }
}
