//! The prefix index: which backend of a pool holds which cached block.
//!
//! Keys are canonical block keys (`crate::tokens::block_keys`: each full
//! block of a prompt's token ids, chained to the one before and rooted in
//! the model or adapter and the `cache_salt`). The index is fed plain
//! events and never reads anything itself:
//! - [`stored`](PrefixIndex::stored): backend `b` holds these blocks (from
//!   an engine's KV events, or, in approximate mode, because Fairway just
//!   sent it a request with this prompt);
//! - [`removed`](PrefixIndex::removed) and [`cleared`](PrefixIndex::cleared):
//!   the engine evicted blocks, or all of them (a restart, a reset).
//!
//! **Bounded by construction.** At most `cap` keys, each in a fixed-size
//! slot (the key and up to [`HOLDERS`] backends with the time each was
//! last recorded there, and until when): no allocation per request once the slots are full,
//! and a full index evicts with CLOCK (second chance: a key matched or
//! stored since the hand last passed survives one more round), which
//! approximates LRU at O(1) per insertion. [`ENTRY_BYTES`] is the
//! measured memory per key. In approximate mode holders also age out
//! after a TTL, since Fairway never sees the engine evict.
//!
//! A lookup walks the request's keys in order and stops at the first
//! block no candidate holds, so its cost is the matched prefix, not the
//! prompt.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Duration;

use crate::core::ids::BackendId;
use crate::core::time::Instant;

pub mod homes;

pub use homes::Homes;

/// Backends remembered per block (a new one takes the slot that ends first).
pub const HOLDERS: usize = 4;

/// Heap bytes per key of a full index, at most: the slot (48) and the
/// hash map's buckets (17 bytes each, 1.14 to 2.3 per key as the table
/// grows in powers of two), and the slot vector's growth. Checked by a
/// test at 2^16 keys; `cargo bench --bench prefix` prints it at 2^20
/// (docs/benchmarks/).
pub const ENTRY_BYTES: usize = 140;

/// No backend in this holder position.
const EMPTY: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Holder {
    backend: u32,
    /// Whole seconds since the clock's origin after which it is gone;
    /// `u32::MAX`: until removed (the engine reported it).
    until: u32,
}

const NO_HOLDER: Holder = Holder {
    backend: EMPTY,
    until: 0,
};

#[derive(Clone, Debug)]
struct Slot {
    key: u64,
    holders: [Holder; HOLDERS],
    /// Used since the CLOCK hand last passed.
    referenced: bool,
    /// On the free list (its key is not in the map).
    free: bool,
}

/// Keys are already uniform hashes: the map uses them as they are.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// What a pool's index holds and has done, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Keys held now.
    pub entries: usize,
    /// The cap on keys.
    pub cap: usize,
    /// Keys evicted to make room, since start.
    pub evictions: u64,
}

/// One pool's prefix index. See the module docs.
#[derive(Debug)]
pub struct PrefixIndex {
    cap: usize,
    /// How long [`stored`](Self::stored) holders last (approximate mode);
    /// `None`: until `removed`/`cleared`.
    ttl: Option<Duration>,
    slots: Vec<Slot>,
    map: HashMap<u64, u32, BuildHasherDefault<KeyHasher>>,
    free: Vec<u32>,
    hand: usize,
    evictions: u64,
    /// Blocks each backend is recorded as holding, by backend id.
    held: HashMap<u32, usize>,
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHasher")
    }
}

fn secs(now: Instant) -> u32 {
    u32::try_from(now.as_nanos() / 1_000_000_000).unwrap_or(u32::MAX)
}

impl PrefixIndex {
    /// An empty index of at most `cap` keys (at least 1).
    pub fn new(cap: usize, ttl: Option<Duration>) -> Self {
        PrefixIndex {
            cap: cap.max(1),
            ttl,
            slots: Vec::new(),
            map: HashMap::default(),
            free: Vec::new(),
            hand: 0,
            evictions: 0,
            held: HashMap::default(),
        }
    }

    /// Takes a new cap and TTL (a policy reload); a smaller cap evicts at
    /// once.
    pub fn reconfigure(&mut self, cap: usize, ttl: Option<Duration>) {
        self.ttl = ttl;
        self.cap = cap.max(1);
        while self.map.len() > self.cap {
            self.evict_one(None);
        }
        if self.slots.len() > self.cap {
            // Compact: keep the live slots, renumber them.
            let live: Vec<Slot> = self.slots.drain(..).filter(|s| !s.free).collect();
            self.map.clear();
            for (i, s) in live.iter().enumerate() {
                self.map.insert(s.key, i as u32);
            }
            self.slots = live;
            self.free.clear();
            self.hand = 0;
        }
    }

    pub fn stats(&self) -> IndexStats {
        IndexStats {
            entries: self.map.len(),
            cap: self.cap,
            evictions: self.evictions,
        }
    }

    fn alive(h: &Holder, now: u32) -> bool {
        h.backend != EMPTY && h.until >= now
    }

    /// Records that `backend` holds `keys` (a chain, in order) at `now`,
    /// for the index's TTL.
    pub fn stored(&mut self, now: Instant, backend: BackendId, keys: &[u64]) {
        self.stored_for(now, backend, keys, self.ttl);
    }

    /// Records that `backend` holds `keys` for `life` from `now` (`None`:
    /// until removed, as an engine's own event says). A holder already
    /// recorded keeps the later of its end and the new one: a guess never
    /// shortens what the engine reported.
    pub fn stored_for(
        &mut self,
        now: Instant,
        backend: BackendId,
        keys: &[u64],
        life: Option<Duration>,
    ) {
        let t = secs(now);
        let until = life.map_or(u32::MAX, |l| {
            t.saturating_add(u32::try_from(l.as_secs()).unwrap_or(u32::MAX))
        });
        for &key in keys {
            let i = match self.map.get(&key) {
                Some(&i) => i as usize,
                None => self.insert(key, t),
            };
            let s = &mut self.slots[i];
            s.referenced = true;
            if let Some(h) = s.holders.iter_mut().find(|h| h.backend == backend.0) {
                h.until = h.until.max(until);
                continue;
            }
            // An empty position, else the one that ends first.
            let age = |h: &Holder| {
                if h.backend == EMPTY {
                    0
                } else {
                    u64::from(h.until) + 1
                }
            };
            let mut oldest = 0;
            for (i, h) in s.holders.iter().enumerate() {
                if age(h) < age(&s.holders[oldest]) {
                    oldest = i;
                }
            }
            let h = &mut s.holders[oldest];
            let was = std::mem::replace(
                h,
                Holder {
                    backend: backend.0,
                    until,
                },
            );
            self.count(was.backend, false);
            self.count(backend.0, true);
        }
    }

    /// Blocks `backend` is recorded as holding (an aged-out holder counts
    /// until its block is evicted or taken by another): where a prefix no
    /// one holds yet would crowd the fewest others.
    pub fn held(&self, backend: BackendId) -> usize {
        self.held.get(&backend.0).copied().unwrap_or(0)
    }

    fn count(&mut self, backend: u32, add: bool) {
        if backend == EMPTY {
            return;
        }
        let n = self.held.entry(backend).or_default();
        if add {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
    }

    /// Records that `backend` no longer holds `keys`.
    pub fn removed(&mut self, backend: BackendId, keys: &[u64]) {
        for key in keys {
            if let Some(&i) = self.map.get(key) {
                self.drop_holder(i as usize, backend.0);
            }
        }
    }

    /// Records that `backend` holds nothing (it restarted, reset its
    /// cache, or left the pool). O(entries).
    pub fn cleared(&mut self, backend: BackendId) {
        for i in 0..self.slots.len() {
            if !self.slots[i].free {
                self.drop_holder(i, backend.0);
            }
        }
    }

    fn drop_holder(&mut self, i: usize, backend: u32) {
        let s = &mut self.slots[i];
        let mut dropped = false;
        for h in s.holders.iter_mut().filter(|h| h.backend == backend) {
            *h = NO_HOLDER;
            dropped = true;
        }
        if dropped {
            self.count(backend, false);
        }
        if self.slots[i].holders.iter().all(|h| h.backend == EMPTY) {
            self.release(i);
        }
    }

    fn release(&mut self, i: usize) {
        let holders = std::mem::replace(&mut self.slots[i].holders, [NO_HOLDER; HOLDERS]);
        for h in holders {
            self.count(h.backend, false);
        }
        let s = &mut self.slots[i];
        self.map.remove(&s.key);
        s.free = true;
        self.free.push(i as u32);
    }

    /// A slot for new `key`: a free one, a new one under the cap, or an
    /// evicted one.
    fn insert(&mut self, key: u64, now: u32) -> usize {
        let i = if let Some(i) = self.free.pop() {
            i as usize
        } else if self.slots.len() < self.cap {
            self.slots.push(Slot {
                key,
                holders: [NO_HOLDER; HOLDERS],
                referenced: false,
                free: true,
            });
            self.slots.len() - 1
        } else {
            self.evict_one(Some(now))
        };
        let s = &mut self.slots[i];
        s.key = key;
        s.free = false;
        s.referenced = false;
        s.holders = [NO_HOLDER; HOLDERS];
        self.map.insert(key, i as u32);
        i
    }

    /// Evicts one key by CLOCK and returns its (now free, off the free
    /// list) slot. A slot whose holders all aged out goes first.
    fn evict_one(&mut self, now: Option<u32>) -> usize {
        loop {
            if self.hand >= self.slots.len() {
                self.hand = 0;
            }
            let i = self.hand;
            self.hand += 1;
            let s = &self.slots[i];
            if s.free {
                continue;
            }
            let expired = now.is_some_and(|t| !s.holders.iter().any(|h| Self::alive(h, t)));
            if s.referenced && !expired {
                self.slots[i].referenced = false;
                continue;
            }
            self.release(i);
            // `release` put it last on the free list: it is taken now.
            self.free.pop();
            self.evictions += 1;
            return i;
        }
    }

    /// For each of `backends`, how many of `keys`' leading blocks it
    /// holds, into `out` (same order; cleared first). Marks the matched
    /// keys used.
    pub fn matched(
        &mut self,
        now: Instant,
        keys: &[u64],
        backends: &[BackendId],
        out: &mut Vec<u32>,
    ) {
        out.clear();
        out.resize(backends.len(), 0);
        let t = secs(now);
        let mut open = backends.len();
        for (depth, key) in keys.iter().enumerate() {
            let Some(&i) = self.map.get(key) else {
                break;
            };
            let s = &self.slots[i as usize];
            let mut any = false;
            for (b, n) in backends.iter().zip(out.iter_mut()) {
                if *n as usize != depth {
                    continue; // already stopped matching
                }
                if s.holders
                    .iter()
                    .any(|h| h.backend == b.0 && Self::alive(h, t))
                {
                    *n += 1;
                    any = true;
                } else {
                    open -= 1;
                }
            }
            if !any {
                break;
            }
            self.slots[i as usize].referenced = true;
            if open == 0 {
                break;
            }
        }
    }

    /// Heap bytes of its tables, from their capacities (the hash map's as
    /// hashbrown lays it out: one control byte and one entry per bucket,
    /// buckets a power of two at most 7/8 full).
    pub fn heap_bytes(&self) -> usize {
        let buckets = if self.map.capacity() == 0 {
            0
        } else {
            (self.map.capacity() * 8 / 7).next_power_of_two()
        };
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + buckets * (std::mem::size_of::<(u64, u32)>() + 1)
            + self.free.capacity() * std::mem::size_of::<u32>()
    }

    /// Keys held now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests;
