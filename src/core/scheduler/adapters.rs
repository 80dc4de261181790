//! LoRA adapters: which backend has which loaded, and the routing
//! preference that follows.
//!
//! An engine holds a few adapters on the GPU at once (vLLM's
//! `--max-loras`, 1 by default) and loads a missing one before the request
//! that needs it runs, evicting the least recently used: a load costs
//! milliseconds to seconds, and every request in the batch waits for it.
//! So a request naming an adapter goes, among the backends that may take
//! a request now (window room and headroom: see `candidates`), to the best
//! tier present, and the pool's strategy picks within it:
//!
//! 1. **loaded**: the engine reports it (fresh reading) or Fairway sent it
//!    there among the last `max_loaded` adapters it sent there;
//! 2. **free slot**: fewer adapters known there than it holds at once;
//! 3. **evicts**: the rest.
//!
//! The guard: the preference only orders the candidates, and a backend
//! whose window is full or whose KV or TTFT is past the pool's limits is
//! not one. A hot adapter fills its backends up to their windows, then
//! spills to the next backend (which loads it, and is then preferred too)
//! rather than queueing behind them; the set of backends holding it grows
//! with its load, and shrinks as they evict it.
//!
//! What the engine reports: vLLM's residency series
//! (`vllm:lora_adapter_loaded`) where it exports them, exact; else
//! `vllm:lora_requests_info`, which lists only the adapters of running and
//! waiting requests: those are loaded, but an idle loaded adapter is not
//! listed, which is what the memory of Fairway's own sends covers.

use std::collections::{HashMap, VecDeque};

use crate::core::ids::{AdapterId, BackendId, PoolId};
use crate::core::reading::LoraReading;

use super::Scheduler;

/// Adapter names known at once, at most: names come from the policy and
/// from engines' readings, and a misbehaving engine must not grow the
/// table without bound.
const MAX_ADAPTERS: usize = 4096;

/// The adapter names, interned.
#[derive(Debug, Default)]
pub(super) struct Adapters {
    names: Vec<String>,
    ids: HashMap<String, AdapterId>,
}

impl Adapters {
    fn intern(&mut self, name: &str) -> Option<AdapterId> {
        if let Some(&id) = self.ids.get(name) {
            return Some(id);
        }
        if self.names.len() >= MAX_ADAPTERS {
            return None;
        }
        let id = AdapterId(self.names.len() as u32);
        self.names.push(name.to_owned());
        self.ids.insert(name.to_owned(), id);
        Some(id)
    }
}

/// What a backend is known or believed to hold.
#[derive(Debug, Default)]
pub(super) struct LoraState {
    /// From its last reading.
    reported: Vec<AdapterId>,
    /// The reading was residency, not activity.
    resident: bool,
    /// Most adapters it holds at once, as it reported; 1 (vLLM's default)
    /// until it does.
    max_loaded: Option<u32>,
    /// The adapters Fairway sent it, most recent last, at most
    /// `max_loaded`.
    sent: VecDeque<AdapterId>,
}

/// How well a backend suits a request for an adapter; higher is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Fit {
    Evicts,
    FreeSlot,
    Loaded,
}

impl LoraState {
    fn slots(&self) -> usize {
        self.max_loaded.unwrap_or(1).max(1) as usize
    }

    /// Takes an engine's report (`None`: it reports nothing of adapters).
    pub(super) fn report(&mut self, names: &mut Adapters, reading: Option<&LoraReading>) {
        let Some(r) = reading else {
            self.reported.clear();
            return;
        };
        self.reported = r.adapters.iter().filter_map(|n| names.intern(n)).collect();
        self.resident = r.resident;
        self.max_loaded = r.max_loaded.or(self.max_loaded);
        if self.resident {
            // Residency is exact: what was sent before it and is not in it
            // was evicted (or never loaded).
            let reported = &self.reported;
            self.sent.retain(|a| reported.contains(a));
        }
        let slots = self.slots();
        while self.sent.len() > slots {
            self.sent.pop_front();
        }
    }

    /// Fairway sends it a request for `adapter`.
    pub(super) fn sent(&mut self, adapter: AdapterId) {
        self.sent.retain(|&a| a != adapter);
        self.sent.push_back(adapter);
        if self.sent.len() > self.slots() {
            self.sent.pop_front();
        }
    }

    pub(super) fn fit(&self, adapter: AdapterId) -> Fit {
        if self.reported.contains(&adapter) || self.sent.contains(&adapter) {
            return Fit::Loaded;
        }
        let known = self.reported.len()
            + self
                .sent
                .iter()
                .filter(|a| !self.reported.contains(a))
                .count();
        if known < self.slots() {
            Fit::FreeSlot
        } else {
            Fit::Evicts
        }
    }
}

impl Scheduler {
    /// The id of adapter `name`, made on first use; `None` once
    /// [`MAX_ADAPTERS`] names are known (the request is then routed as one
    /// for its base model).
    pub fn adapter(&mut self, name: &str) -> Option<AdapterId> {
        self.adapters.intern(name)
    }

    /// Narrows the candidates (in `scratch`) for a request for `adapter`
    /// to those the pool's strategy picks among: the first `n` after
    /// this. Where the adapter is loaded, all such backends (the strategy
    /// spreads its load over them); else the one backend that rendezvous
    /// hashing ranks first for the adapter among the best tier, so an
    /// adapter that must be loaded somewhere goes back to the same few
    /// backends each time rather than to whichever is least busy, which
    /// would evict another adapter there and start an eviction storm.
    pub(super) fn order_for_adapter(&mut self, pool: PoolId, adapter: Option<AdapterId>) -> usize {
        let Some(a) = adapter.filter(|_| self.pools[pool.0 as usize].adapter_affinity) else {
            return self.scratch.len();
        };
        let backends = &self.backends;
        let fit = |id: BackendId| backends[id.0 as usize].lora.fit(a);
        // Stable: round-robin and pack keep their order within a tier.
        self.scratch.sort_by_key(|c| std::cmp::Reverse(fit(c.id)));
        let Some(best) = self.scratch.first().map(|c| fit(c.id)) else {
            return 0;
        };
        let n = self
            .scratch
            .iter()
            .take_while(|c| fit(c.id) == best)
            .count();
        if best == Fit::Loaded {
            return n;
        }
        if let Some(home) = (0..n).max_by_key(|&i| rendezvous(a, self.scratch[i].id)) {
            self.scratch.swap(0, home);
        }
        1
    }
}

/// Rendezvous (highest random weight) hashing: each adapter ranks the
/// backends in its own fixed order.
fn rendezvous(a: AdapterId, b: BackendId) -> u64 {
    // SplitMix64's finaliser over the pair.
    let mut x = (u64::from(a.0) << 32 | u64::from(b.0)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(adapters: &[&str], resident: bool, max: Option<u32>) -> LoraReading {
        LoraReading {
            adapters: adapters.iter().map(|s| s.to_string()).collect(),
            resident,
            max_loaded: max,
        }
    }

    #[test]
    fn fit_from_reports_and_sends() {
        let mut names = Adapters::default();
        let a = names.intern("a").unwrap();
        let b = names.intern("b").unwrap();
        let c = names.intern("c").unwrap();
        let mut s = LoraState::default();
        // Nothing known: one slot (vLLM's default), free.
        assert_eq!(s.fit(a), Fit::FreeSlot);
        s.sent(a);
        assert_eq!((s.fit(a), s.fit(b)), (Fit::Loaded, Fit::Evicts));
        // The engine says it holds two; activity shows b.
        s.report(&mut names, Some(&reading(&["b"], false, Some(2))));
        assert_eq!(
            (s.fit(a), s.fit(b), s.fit(c)),
            (Fit::Loaded, Fit::Loaded, Fit::Evicts)
        );
        // Residency is exact: a was evicted.
        s.report(&mut names, Some(&reading(&["b"], true, Some(2))));
        assert_eq!((s.fit(a), s.fit(c)), (Fit::FreeSlot, Fit::FreeSlot));
        // Sends beyond the slots forget the oldest.
        s.sent(a);
        s.sent(c);
        assert_eq!(s.sent.len(), 2);
        assert_eq!(s.fit(a), Fit::Loaded);
    }

    #[test]
    fn the_name_table_is_bounded() {
        let mut names = Adapters::default();
        for i in 0..MAX_ADAPTERS {
            assert!(names.intern(&format!("x{i}")).is_some());
        }
        assert_eq!(names.intern("x7"), Some(AdapterId(7)));
        assert_eq!(names.intern("one-more"), None);
    }
}
