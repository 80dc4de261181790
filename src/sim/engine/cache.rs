//! The engine's prefix cache (vLLM's automatic prefix caching): full
//! prompt blocks are kept by key after their sequence ends, on an LRU list
//! of idle blocks, and a later sequence whose prompt starts with the same
//! keys takes them instead of prefilling them again.
//!
//! Counts only: a cached block is one of the engine's KV blocks. The
//! engine's free blocks include the idle cached ones, which it evicts,
//! least recently used first, when it needs an empty block.

use std::collections::{BTreeMap, HashMap};

#[derive(Clone, Copy, Debug)]
struct Block {
    /// Running sequences using it.
    refs: u32,
    /// When it last went idle (its key in `idle`).
    stamp: u64,
}

/// What the engine's blocks hold, by key. See the module docs.
#[derive(Debug, Default)]
pub(super) struct PrefixCache {
    blocks: HashMap<u64, Block>,
    /// Idle blocks (no running sequence), least recently used first.
    idle: BTreeMap<u64, u64>,
    stamp: u64,
}

impl PrefixCache {
    /// Idle cached blocks: free, but holding a prefix until evicted.
    pub(super) fn idle(&self) -> u64 {
        self.idle.len() as u64
    }

    /// How many of `keys`' leading blocks are cached, and how many of
    /// those are idle (taking them takes them off the free blocks).
    pub(super) fn hit(&self, keys: &[u64]) -> (usize, u64) {
        let mut idle = 0;
        for (n, k) in keys.iter().enumerate() {
            match self.blocks.get(k) {
                Some(b) => idle += u64::from(b.refs == 0),
                None => return (n, idle),
            }
        }
        (keys.len(), idle)
    }

    /// Takes a reference on each of `keys` (all cached).
    pub(super) fn acquire(&mut self, keys: &[u64]) {
        for k in keys {
            if let Some(b) = self.blocks.get_mut(k) {
                if b.refs == 0 {
                    self.idle.remove(&b.stamp);
                }
                b.refs += 1;
            }
        }
    }

    /// Caches the blocks of `keys` (just prefilled) with one reference
    /// each, up to the first that is cached already (its block stays the
    /// sequence's own). Returns how many were added.
    pub(super) fn insert(&mut self, keys: &[u64]) -> usize {
        for (n, k) in keys.iter().enumerate() {
            if self.blocks.contains_key(k) {
                return n;
            }
            self.blocks.insert(*k, Block { refs: 1, stamp: 0 });
        }
        keys.len()
    }

    /// Drops a reference on each of `keys`; returns how many went idle.
    pub(super) fn release(&mut self, keys: &[u64]) -> u64 {
        let mut idle = 0;
        // Last block first, so that of one prompt's blocks the deepest is
        // evicted first (vLLM frees a request's blocks in reverse order).
        for k in keys.iter().rev() {
            if let Some(b) = self.blocks.get_mut(k) {
                b.refs = b.refs.saturating_sub(1);
                if b.refs == 0 {
                    self.stamp += 1;
                    b.stamp = self.stamp;
                    self.idle.insert(self.stamp, *k);
                    idle += 1;
                }
            }
        }
        idle
    }

    /// Evicts `n` idle blocks, least recently used first, appending their
    /// keys to `evicted`.
    pub(super) fn evict(&mut self, n: u64, evicted: &mut Vec<u64>) {
        for _ in 0..n {
            let Some((_, k)) = self.idle.pop_first() else {
                return;
            };
            self.blocks.remove(&k);
            evicted.push(k);
        }
    }

    /// Forgets every idle block (a cache reset); returns how many.
    pub(super) fn clear_idle(&mut self, evicted: &mut Vec<u64>) -> u64 {
        let n = self.idle();
        self.evict(n, evicted);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_blocks_are_evicted_least_recently_used_first() {
        let mut c = PrefixCache::default();
        assert_eq!(c.insert(&[1, 2, 3]), 3);
        assert_eq!(c.hit(&[1, 2, 9]), (2, 0));
        assert_eq!(c.release(&[1, 2, 3]), 3);
        assert_eq!(c.hit(&[1, 2, 3]), (3, 3));
        c.acquire(&[1]);
        assert_eq!(c.idle(), 2);
        let mut gone = Vec::new();
        c.evict(1, &mut gone);
        // Released deepest first: 3 went idle first, so it goes first.
        assert_eq!(gone, vec![3]);
        assert_eq!(c.hit(&[1, 2, 3]), (2, 1));
        // A block in use is never evicted.
        c.evict(5, &mut gone);
        assert_eq!(gone, vec![3, 2]);
        assert_eq!(c.hit(&[1]), (1, 0));
    }

    #[test]
    fn insert_stops_at_a_block_already_cached() {
        let mut c = PrefixCache::default();
        c.insert(&[5]);
        assert_eq!(c.insert(&[4, 5, 6]), 1);
        assert_eq!(c.hit(&[4, 5]), (2, 0));
        assert_eq!(c.hit(&[6]), (0, 0));
    }
}
