//! Tokens without a tokenizer, the keys of cached prefixes, and a pool's
//! own tokenizer and chat template ([`chat`]).
//!
//! - [`estimate`]: the token-count estimate shared by the gateway (cost
//!   before dispatch) and the simulated engine: about four bytes of text
//!   per token.
//! - [`approximate_ids`]: the same approximation as token ids, for prefix
//!   routing where a pool names no tokenizer: each id is four bytes of the
//!   prompt's text (little-endian, the last zero-padded). Two prompts that
//!   share their first `4·n` bytes share their first `n` ids, which is all
//!   a prefix key needs; the simulated engine "tokenizes" the same way, so
//!   its cache and Fairway's index agree exactly.
//! - [`BlockKeys`]: the canonical key of each full block of a token
//!   sequence, `hash(parent key, the block's ids)`, rooted in the model or
//!   LoRA adapter and the request's `cache_salt`, so that neither ever
//!   matches another's blocks. Fairway computes these from token ids
//!   itself (from the request, or from an engine's KV events), never from
//!   the engine's own hashes: they do not depend on the engine's hash
//!   seed or algorithm, and any block size can be canonical.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

pub mod chat;

pub use chat::{ChatError, ChatTokenizer, LoadError};

/// Estimated tokens in `text`: `ceil(len / 4)`, at least 1 for non-empty text.
pub fn estimate(text: &str) -> u32 {
    u32::try_from(text.len().div_ceil(4)).unwrap_or(u32::MAX)
}

/// Bytes of text per approximate token.
pub const BYTES_PER_TOKEN: usize = 4;

/// Approximate token ids of `text`: one per four bytes (see the module
/// docs). `approximate_ids(t).len() == ceil(t.len() / 4)`.
pub fn approximate_ids(text: &[u8]) -> Vec<u32> {
    text.chunks(BYTES_PER_TOKEN)
        .map(|c| {
            let mut b = [0u8; BYTES_PER_TOKEN];
            b[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(b)
        })
        .collect()
}

/// The root of a request's block keys: its model (or LoRA adapter) and
/// its `cache_salt`. Requests with different roots share no block.
pub fn prefix_root(model: &str, salt: Option<&str>) -> u64 {
    let m = xxh3_64(model.as_bytes());
    match salt {
        // The salt is hashed apart from the model so that no pair of
        // (model, salt) strings can run together into another's.
        Some(s) => xxh3_64_with_seed(s.as_bytes(), m ^ 0x5a17_5a17_5a17_5a17),
        None => m,
    }
}

/// The canonical keys of a token sequence's full blocks, each chained to
/// the one before: `key[i] = xxh3(ids of block i, seed = key[i-1])`,
/// `key[-1] = root`. A partial last block has no key (an engine caches
/// only full blocks).
pub fn block_keys(root: u64, ids: &[u32], block_tokens: u32) -> Vec<u64> {
    let n = block_tokens.max(1) as usize;
    let mut keys = Vec::with_capacity(ids.len() / n);
    let mut parent = root;
    let mut bytes = Vec::with_capacity(n * 4);
    for block in ids.chunks_exact(n) {
        parent = chain_key(parent, block, &mut bytes);
        keys.push(parent);
    }
    keys
}

/// The key of the block of `ids` after the block keyed `parent` (the
/// root for the first): `bytes` is scratch.
pub fn chain_key(parent: u64, ids: &[u32], bytes: &mut Vec<u8>) -> u64 {
    bytes.clear();
    bytes.extend(ids.iter().flat_map(|t| t.to_le_bytes()));
    xxh3_64_with_seed(bytes, parent)
}

/// The keys of a request: its ids' full blocks, chained from its root.
/// (Kept beside the pieces so that the gateway, the simulated engine and
/// the replay cannot key a request two ways.)
pub fn request_keys(model: &str, salt: Option<&str>, ids: &[u32], block_tokens: u32) -> Vec<u64> {
    block_keys(prefix_root(model, salt), ids, block_tokens)
}

/// [`request_keys`] of a text's [`approximate_ids`], straight from its
/// bytes: a full block of approximate ids is its `4 · block_tokens` bytes
/// as they are (an id's little-endian bytes are the text's), so no id is
/// built. What the gateway computes per request.
pub fn text_keys(model: &str, salt: Option<&str>, text: &[u8], block_tokens: u32) -> Vec<u64> {
    let n = block_tokens.max(1) as usize * BYTES_PER_TOKEN;
    let mut parent = prefix_root(model, salt);
    let blocks = text.chunks_exact(n);
    let rest = blocks.remainder();
    let mut keys: Vec<u64> = blocks
        .map(|block| {
            parent = xxh3_64_with_seed(block, parent);
            parent
        })
        .collect();
    // The last id is zero-padded: a remainder whose ids fill a block is a
    // full block too.
    if rest.len() > n - BYTES_PER_TOKEN {
        let mut block = rest.to_vec();
        block.resize(n, 0);
        keys.push(xxh3_64_with_seed(&block, parent));
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_bytes_a_token() {
        assert_eq!(estimate(""), 0);
        assert_eq!(estimate("a"), 1);
        assert_eq!(estimate("abcdefgh"), 2);
    }

    #[test]
    fn approximate_ids_are_the_bytes_four_at_a_time() {
        assert_eq!(approximate_ids(b""), Vec::<u32>::new());
        assert_eq!(
            approximate_ids(b"abcdE"),
            vec![u32::from_le_bytes(*b"abcd"), u32::from(b'E')]
        );
        for t in ["", "a", "abcd", "abcde", "x".repeat(4099).as_str()] {
            assert_eq!(approximate_ids(t.as_bytes()).len() as u32, estimate(t));
        }
    }

    #[test]
    fn keys_chain_so_a_shared_prefix_shares_its_keys_and_nothing_after() {
        let a: Vec<u32> = (0..40).collect();
        let mut b = a.clone();
        b[25] = 999;
        let (ka, kb) = (block_keys(7, &a, 8), block_keys(7, &b, 8));
        // 40 ids in blocks of 8: five full blocks; the change is in block 3.
        assert_eq!(ka.len(), 5);
        assert_eq!(ka[..3], kb[..3]);
        assert!(ka[3..].iter().zip(&kb[3..]).all(|(x, y)| x != y));
        // A partial block has no key.
        assert_eq!(block_keys(7, &a[..15], 8).len(), 1);
    }

    #[test]
    fn keys_from_the_text_are_the_keys_of_its_approximate_ids() {
        let text: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        for len in [0, 3, 63, 64, 65, 1000, 5000] {
            for block in [1, 16, 64] {
                let t = &text[..len];
                assert_eq!(
                    text_keys("m", Some("s"), t, block),
                    request_keys("m", Some("s"), &approximate_ids(t), block),
                    "{len} bytes, blocks of {block}"
                );
            }
        }
    }

    #[test]
    fn the_model_the_adapter_and_the_salt_keep_blocks_apart() {
        let ids: Vec<u32> = (0..64).collect();
        let base = request_keys("llama", None, &ids, 16);
        for other in [
            request_keys("llama-lora-a", None, &ids, 16),
            request_keys("llama", Some("tenant-a"), &ids, 16),
            request_keys("llama", Some(""), &ids, 16),
        ] {
            assert!(base.iter().zip(&other).all(|(x, y)| x != y));
        }
        assert_eq!(base, request_keys("llama", None, &ids, 16));
        assert_ne!(prefix_root("ab", Some("c")), prefix_root("a", Some("bc")));
    }
}
