//! The engine's prefix-cache changes, and the same changes as the KV
//! events vLLM publishes for them: one translation for the simulated
//! backend's publisher and the replay's precise mode.

use std::borrow::Cow;

use crate::poller::kv_events::{EngineHash, KvEvent};

/// A change of the engine's prefix cache, as its KV events report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheChange {
    /// Sequence `id`'s prompt blocks `first..first + keys.len()` entered
    /// the cache, after the block keyed `parent` (`None`: from the start).
    Stored {
        id: u64,
        parent: Option<u64>,
        first: usize,
        keys: Vec<u64>,
    },
    /// Blocks left the cache (evicted for room, or a reset).
    Removed(Vec<u64>),
}

/// What the events show of a stored sequence's prompt: its token ids, its
/// LoRA adapter and its `cache_salt`.
#[derive(Debug)]
pub struct StoredPrompt<'p> {
    pub ids: Cow<'p, [u32]>,
    pub lora: Option<&'p str>,
    pub salt: Option<&'p str>,
}

/// `changes` as vLLM's KV events, the engine's keys as its block hashes
/// (`block_size` tokens a block). `prompt` finds a stored sequence's
/// prompt by its id; a change whose prompt it does not find, or whose
/// blocks its ids do not cover, is left out.
pub fn kv_events<'p>(
    changes: Vec<CacheChange>,
    block_size: u32,
    mut prompt: impl FnMut(u64) -> Option<StoredPrompt<'p>>,
) -> Vec<KvEvent> {
    let bs = block_size as usize;
    let gpu = || Some("GPU".to_owned());
    changes
        .into_iter()
        .filter_map(|c| match c {
            CacheChange::Stored {
                id,
                parent,
                first,
                keys,
            } => {
                let p = prompt(id)?;
                let ids = p.ids.get(first * bs..(first + keys.len()) * bs)?;
                Some(KvEvent::BlockStored {
                    block_hashes: keys.into_iter().map(EngineHash::Int).collect(),
                    parent: parent.map(EngineHash::Int),
                    token_ids: ids.to_vec(),
                    block_size,
                    lora_name: p.lora.map(str::to_owned),
                    medium: gpu(),
                    group_idx: None,
                    // vLLM puts the salt in a prompt's first block only.
                    salt: p.salt.filter(|_| first == 0).map(str::to_owned),
                })
            }
            CacheChange::Removed(keys) => Some(KvEvent::BlockRemoved {
                block_hashes: keys.into_iter().map(EngineHash::Int).collect(),
                medium: gpu(),
                group_idx: None,
            }),
        })
        .collect()
}
