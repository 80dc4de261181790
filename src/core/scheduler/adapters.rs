//! LoRA adapters: which backend has which loaded, and the routing
//! preference that follows.
//!
//! An engine holds a few adapters on the GPU at once (vLLM's
//! `--max-loras`, 1 by default) and loads a missing one before the request
//! that needs it runs, evicting the least recently used: a load costs
//! milliseconds to seconds, and every request in the batch waits for it.
//! So a request naming an adapter goes, among the backends that may take
//! a request now (window room and headroom: see `candidates`), to the best
//! tier present:
//!
//! 1. **loaded**: the engine reports it (fresh reading) or Fairway sent it
//!    there among the last `max_loaded` adapters it sent there; the pool's
//!    strategy picks among them;
//! 2. **free slot**: fewer adapters known there than it holds at once; the
//!    strategy picks;
//! 3. **evicts**: the backend whose least recently sent adapter was sent
//!    longest ago, so that the eviction falls on the pool's coldest slot (a
//!    pool-wide LRU) rather than on whichever backend is least busy, whose
//!    evicted adapter may be the next request's.
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
use crate::core::time::Instant;

use super::Scheduler;

/// Adapter names known at once, at most. Names come from the policy and
/// from requests (for adapters the policy or a backend lists); the bound
/// is a backstop.
const MAX_ADAPTERS: usize = 4096;

/// The adapter names, interned.
#[derive(Debug, Default)]
pub(super) struct Adapters {
    names: Vec<String>,
    ids: HashMap<String, AdapterId>,
}

impl Adapters {
    pub(super) fn intern(&mut self, name: &str) -> Option<AdapterId> {
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
    /// The adapters Fairway sent it and when it last did, most recent
    /// last, at most `max_loaded`.
    sent: VecDeque<(AdapterId, Instant)>,
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
    /// Only adapters the policy lists or some request has named are kept:
    /// an engine's names do not grow the table.
    pub(super) fn report(&mut self, names: &Adapters, reading: Option<&LoraReading>) {
        let Some(r) = reading else {
            self.reported.clear();
            return;
        };
        self.reported = r
            .adapters
            .iter()
            .filter_map(|n| names.ids.get(n.as_str()).copied())
            .collect();
        self.resident = r.resident;
        self.max_loaded = r.max_loaded.or(self.max_loaded);
        if self.resident {
            // Residency is exact: what was sent before it and is not in it
            // was evicted (or never loaded).
            let reported = &self.reported;
            self.sent.retain(|(a, _)| reported.contains(a));
        }
        let slots = self.slots();
        while self.sent.len() > slots {
            self.sent.pop_front();
        }
    }

    /// Fairway sends it a request for `adapter`.
    pub(super) fn sent(&mut self, adapter: AdapterId, now: Instant) {
        self.sent.retain(|&(a, _)| a != adapter);
        self.sent.push_back((adapter, now));
        if self.sent.len() > self.slots() {
            self.sent.pop_front();
        }
    }

    pub(super) fn fit(&self, adapter: AdapterId) -> Fit {
        let sent = |a: &AdapterId| self.sent.iter().any(|(s, _)| s == a);
        if self.reported.contains(&adapter) || sent(&adapter) {
            return Fit::Loaded;
        }
        let known = self.reported.len()
            + self
                .sent
                .iter()
                .filter(|(a, _)| !self.reported.contains(a))
                .count();
        if known < self.slots() {
            Fit::FreeSlot
        } else {
            Fit::Evicts
        }
    }

    /// When the least recently sent of its adapters was last sent: the
    /// older, the cheaper an eviction there (`ZERO`: none sent).
    fn coldest(&self) -> Instant {
        self.sent.front().map_or(Instant::ZERO, |&(_, at)| at)
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
    /// to those the pool's strategy picks among: the first `n` after this
    /// (see the module docs for the tiers).
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
        if best != Fit::Evicts {
            return n;
        }
        let coldest = |i: usize| backends[self.scratch[i].id.0 as usize].lora.coldest();
        if let Some(home) = (0..n).min_by_key(|&i| coldest(i)) {
            self.scratch.swap(0, home);
        }
        1
    }
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
        // Names no request used are not kept.
        s.report(&names, Some(&reading(&["zzz"], false, None)));
        assert!(s.reported.is_empty());
        // Nothing known: one slot (vLLM's default), free.
        assert_eq!(s.fit(a), Fit::FreeSlot);
        s.sent(a, Instant::ZERO);
        assert_eq!((s.fit(a), s.fit(b)), (Fit::Loaded, Fit::Evicts));
        // The engine says it holds two; activity shows b.
        s.report(&names, Some(&reading(&["b"], false, Some(2))));
        assert_eq!(
            (s.fit(a), s.fit(b), s.fit(c)),
            (Fit::Loaded, Fit::Loaded, Fit::Evicts)
        );
        // Residency is exact: a was evicted.
        s.report(&names, Some(&reading(&["b"], true, Some(2))));
        assert_eq!((s.fit(a), s.fit(c)), (Fit::FreeSlot, Fit::FreeSlot));
        // Sends beyond the slots forget the oldest.
        s.sent(a, Instant::ZERO);
        s.sent(c, Instant::ZERO);
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
