//! One backend's KV-event stream turned into prefix-index changes in the
//! pool's canonical blocks (sans-IO: the subscriber passes each message's
//! sequence number and decoded batch).
//!
//! **Keys from the events' tokens.** A `BlockStored` carries the token ids
//! of its chain of engine blocks and the engine's hash of the block before
//! it. The feed remembers, for each engine block it has seen, where the
//! canonical chain stood after it (the last canonical key and the tokens
//! since, when the canonical block is longer than the engine's), so a
//! chain that continues a known block is keyed exactly as the gateway
//! keys a prompt (`crate::tokens::block_keys`), whatever the engine's own
//! hash function and seed. A chain whose parent it has not seen (stored
//! before the subscription started, or forgotten under the cap) cannot be
//! keyed and is counted `unanchored`; the engine's next request for that
//! prefix stores its blocks again only if it evicted them, so such a
//! prefix is relearned from Fairway's own sends (held for
//! `PREFIX_GUESS`) until then.
//!
//! **Removals.** Each engine block remembers the canonical keys that were
//! completed in it; a `BlockRemoved` removes those. With a canonical block
//! longer than the engine's (64 and 16), a canonical key goes when the
//! engine evicts the block that completed it (vLLM evicts a prompt's
//! deepest block first, so that is the usual order).
//!
//! Only the GPU tier of the main KV group counts (`medium` absent or
//! `"GPU"`, `group_idx` absent or 0): offloaded copies are slower to use
//! and hybrid models' other groups repeat the same tokens.
//!
//! **Bounded.** At most `cap` engine blocks are remembered, the oldest
//! forgotten first. Each costs about 100 bytes, plus 4 bytes per token of
//! an unfinished canonical block when the canonical block is longer than
//! the engine's: set `prefix_block_tokens` to the engine's block size (or
//! a divisor of it) and that part is empty.

use std::collections::{HashMap, VecDeque};

use xxhash_rust::xxh3::xxh3_64;

use super::{EngineHash, EventBatch, KvEvent};
use crate::core::scheduler::PrefixEvent;
use crate::tokens::{chain_key, prefix_root};

/// Where a message's sequence number puts it against the last applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sequence {
    /// The first message since the feed started or was reset.
    First,
    /// The one after the last.
    Next,
    /// Messages `missing..seq` were lost.
    Gap { missing: u64 },
    /// Already applied (a replayed or repeated message).
    Old,
    /// Lower than the last: the publisher restarted (vLLM counts from 0
    /// per process).
    Restart,
}

/// What a feed has seen, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeedStats {
    pub batches: u64,
    pub events: u64,
    /// `BlockStored` chains whose parent block was unknown.
    pub unanchored: u64,
    /// Events of another tier or KV group, or whose token ids do not fill
    /// their blocks.
    pub ignored: u64,
    /// Engine blocks forgotten under the cap.
    pub forgotten: u64,
}

#[derive(Debug)]
struct Anchor {
    /// The canonical key of the last complete canonical block up to and
    /// including this engine block (the root before the first).
    chain: u64,
    /// Tokens after that canonical block, up to the end of this one.
    pending: Box<[u32]>,
    /// Canonical keys completed within this engine block.
    keys: Box<[u64]>,
    /// Insertion number, to match `order` entries.
    stamp: u64,
}

/// One backend's feed. See the module docs.
#[derive(Debug)]
pub struct Feed {
    model: String,
    block: usize,
    cap: usize,
    blocks: HashMap<u64, Anchor>,
    /// Engine blocks in insertion order, with their `stamp` (an entry whose
    /// stamp no longer matches was removed or stored again).
    order: VecDeque<(u64, u64)>,
    stamp: u64,
    last: Option<u64>,
    scratch: Vec<u8>,
    pub stats: FeedStats,
}

/// An engine hash as a map key: integers as they are, bytes hashed.
fn fold(h: &EngineHash) -> u64 {
    match h {
        EngineHash::Int(n) => *n,
        EngineHash::Bytes(b) => xxh3_64(b),
    }
}

fn main_gpu_tier(medium: &Option<String>, group_idx: Option<i64>) -> bool {
    medium
        .as_deref()
        .is_none_or(|m| m.eq_ignore_ascii_case("gpu"))
        && group_idx.unwrap_or(0) == 0
}

impl Feed {
    /// A feed for a backend of the pool serving `model`, keyed in blocks
    /// of `block_tokens`, remembering at most `cap` engine blocks.
    pub fn new(model: &str, block_tokens: u32, cap: usize) -> Self {
        Feed {
            model: model.to_owned(),
            block: block_tokens.max(1) as usize,
            cap: cap.max(1),
            blocks: HashMap::new(),
            order: VecDeque::new(),
            stamp: 0,
            last: None,
            scratch: Vec::new(),
            stats: FeedStats::default(),
        }
    }

    /// The last sequence number applied.
    pub fn last(&self) -> Option<u64> {
        self.last
    }

    /// Where `seq` stands (nothing changes).
    pub fn sequence(&self, seq: u64) -> Sequence {
        match self.last {
            None => Sequence::First,
            Some(l) if seq == l.wrapping_add(1) => Sequence::Next,
            Some(l) if seq > l => Sequence::Gap { missing: l + 1 },
            Some(l) if seq == l => Sequence::Old,
            Some(_) => Sequence::Restart,
        }
    }

    /// Forgets everything (a restart, a gap that cannot be replayed, a
    /// new subscription): the index must drop the backend's entries.
    pub fn reset(&mut self) {
        self.blocks.clear();
        self.order.clear();
        self.last = None;
    }

    /// Applies message `seq`'s batch, appending the index changes to `out`.
    pub fn apply(&mut self, seq: u64, batch: &EventBatch, out: &mut Vec<PrefixEvent>) {
        self.last = Some(seq);
        self.stats.batches += 1;
        for e in &batch.events {
            self.stats.events += 1;
            match e {
                KvEvent::BlockStored {
                    block_hashes,
                    parent,
                    token_ids,
                    block_size,
                    lora_name,
                    medium,
                    group_idx,
                    salt,
                } => {
                    let size = *block_size as usize;
                    if !main_gpu_tier(medium, *group_idx)
                        || size == 0
                        || token_ids.len() != block_hashes.len() * size
                    {
                        self.stats.ignored += 1;
                        continue;
                    }
                    let start = match parent {
                        None => Some((
                            prefix_root(
                                lora_name.as_deref().unwrap_or(&self.model),
                                salt.as_deref(),
                            ),
                            Vec::new(),
                        )),
                        Some(p) => self
                            .blocks
                            .get(&fold(p))
                            .map(|a| (a.chain, a.pending.to_vec())),
                    };
                    let Some((chain, pending)) = start else {
                        self.stats.unanchored += 1;
                        continue;
                    };
                    let keys = self.store(block_hashes, token_ids, size, chain, pending);
                    if !keys.is_empty() {
                        out.push(PrefixEvent::Stored(keys));
                    }
                }
                KvEvent::BlockRemoved {
                    block_hashes,
                    medium,
                    group_idx,
                } => {
                    if !main_gpu_tier(medium, *group_idx) {
                        self.stats.ignored += 1;
                        continue;
                    }
                    let keys: Vec<u64> = block_hashes
                        .iter()
                        .filter_map(|h| self.blocks.remove(&fold(h)))
                        .flat_map(|a| a.keys.into_vec())
                        .collect();
                    if !keys.is_empty() {
                        out.push(PrefixEvent::Removed(keys));
                    }
                }
                KvEvent::AllBlocksCleared => {
                    self.blocks.clear();
                    self.order.clear();
                    out.push(PrefixEvent::Cleared);
                }
            }
        }
    }

    /// Keys a chain of engine blocks from `chain`/`pending` on, remembers
    /// each block, and returns the canonical keys completed.
    fn store(
        &mut self,
        hashes: &[EngineHash],
        tokens: &[u32],
        size: usize,
        mut chain: u64,
        mut pending: Vec<u32>,
    ) -> Vec<u64> {
        let mut all = Vec::new();
        for (h, ids) in hashes.iter().zip(tokens.chunks_exact(size)) {
            let first = all.len();
            pending.extend_from_slice(ids);
            let mut used = 0;
            while pending.len() - used >= self.block {
                chain = chain_key(chain, &pending[used..used + self.block], &mut self.scratch);
                all.push(chain);
                used += self.block;
            }
            pending.drain(..used);
            self.remember(
                fold(h),
                Anchor {
                    chain,
                    pending: pending.as_slice().into(),
                    keys: all[first..].into(),
                    stamp: 0,
                },
            );
        }
        all
    }

    fn remember(&mut self, hash: u64, mut anchor: Anchor) {
        while self.blocks.len() >= self.cap && !self.blocks.contains_key(&hash) {
            let Some((old, stamp)) = self.order.pop_front() else {
                break;
            };
            if self.blocks.get(&old).is_some_and(|a| a.stamp == stamp) {
                self.blocks.remove(&old);
                self.stats.forgotten += 1;
            }
        }
        self.stamp += 1;
        anchor.stamp = self.stamp;
        self.blocks.insert(hash, anchor);
        self.order.push_back((hash, self.stamp));
        // Entries of removed or re-stored blocks linger in `order`: drop
        // them once they are as many as the live ones.
        if self.order.len() > 2 * self.cap {
            let blocks = &self.blocks;
            self.order
                .retain(|(h, g)| blocks.get(h).is_some_and(|a| a.stamp == *g));
        }
    }

    /// Engine blocks remembered.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

#[cfg(test)]
mod tests;
