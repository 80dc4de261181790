//! The engines' KV-cache events (vLLM's `--kv-events-config`; SGLang and
//! TensorRT-LLM publish the same framing): a sans-IO decoder, and the
//! encoder the simulated engine publishes with.
//!
//! The wire (docs/reference prefix-routing §2): a ZMQ PUB message of three
//! frames, `topic`, `seq` (8 bytes, big-endian, from 0 per publisher
//! process) and a msgpack `EventBatch`. The decoder is tolerant of every
//! encoding in use:
//! - the batch as an array `[ts, events, data_parallel_rank?]` or a map
//!   (`ts`, `events`, `data_parallel_rank`);
//! - each event as a tagged array (`["BlockStored", …]`: vLLM before its
//!   map encoding, SGLang) or a map with a `type` key (vLLM since 0.23,
//!   TensorRT-LLM); fields omitted at the end or unknown are ignored;
//! - block hashes as unsigned or signed integers (SGLang sends negative
//!   ones) or as bytes (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`);
//! - an unknown event type is skipped and counted, not an error.
//!
//! Fairway keys blocks from the events' `token_ids` itself
//! (`crate::tokens::block_keys`); the engine's hashes serve only to find
//! which of its blocks a `BlockRemoved` names.

use rmpv::Value;

pub mod feed;

pub use feed::{Feed, FeedStats, Sequence};

/// An engine's hash of one block, as it sends it: an integer (signed ones
/// kept as their two's-complement bits) or bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum EngineHash {
    Int(u64),
    Bytes(Vec<u8>),
}

/// One event of a batch.
#[derive(Clone, Debug, PartialEq)]
pub enum KvEvent {
    /// Full blocks entered the engine's prefix cache: one chain, each
    /// block `block_size` of `token_ids`, the first after `parent`.
    BlockStored {
        block_hashes: Vec<EngineHash>,
        parent: Option<EngineHash>,
        token_ids: Vec<u32>,
        block_size: u32,
        lora_name: Option<String>,
        /// `"GPU"`, or an offload tier (`"CPU"`, …); `None` when not sent.
        medium: Option<String>,
        /// The KV-cache group (hybrid models); `None` when not sent.
        group_idx: Option<i64>,
        /// The request's `cache_salt`, where the chain starts a prompt
        /// (vLLM puts it in the first block's `extra_keys`; SGLang in
        /// `metadata.cache_salt`).
        salt: Option<String>,
    },
    /// Blocks left the cache (evicted or reused).
    BlockRemoved {
        block_hashes: Vec<EngineHash>,
        medium: Option<String>,
        group_idx: Option<i64>,
    },
    /// The whole cache was reset.
    AllBlocksCleared,
}

/// One scheduler step's events.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EventBatch {
    pub ts: f64,
    pub events: Vec<KvEvent>,
    pub data_parallel_rank: Option<i64>,
    /// Events of a type this decoder does not know, skipped.
    pub skipped: usize,
}

/// Why a payload is not a batch.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KvDecodeError {
    #[error("not msgpack: {0}")]
    Msgpack(String),
    #[error("trailing bytes after the batch")]
    Trailing,
    #[error("the batch is neither [ts, events, rank] nor a map with `events`")]
    Envelope,
    #[error("event {index}: {reason}")]
    Event { index: usize, reason: &'static str },
    #[error("the sequence frame is {0} bytes, not 8")]
    Seq(usize),
}

/// The sequence number of a message's second frame.
pub fn decode_seq(frame: &[u8]) -> Result<u64, KvDecodeError> {
    let b: [u8; 8] = frame
        .try_into()
        .map_err(|_| KvDecodeError::Seq(frame.len()))?;
    Ok(u64::from_be_bytes(b))
}

/// Decodes a message's msgpack payload.
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, KvDecodeError> {
    let mut rd = payload;
    let v = rmpv::decode::read_value(&mut rd).map_err(|e| KvDecodeError::Msgpack(e.to_string()))?;
    if !rd.is_empty() {
        return Err(KvDecodeError::Trailing);
    }
    let (ts, events, rank) = match &v {
        Value::Array(a) => (a.first(), a.get(1), a.get(2)),
        Value::Map(_) => (
            field(&v, "ts"),
            field(&v, "events"),
            field(&v, "data_parallel_rank"),
        ),
        _ => return Err(KvDecodeError::Envelope),
    };
    let Some(Value::Array(list)) = events else {
        return Err(KvDecodeError::Envelope);
    };
    let mut batch = EventBatch {
        ts: ts.and_then(Value::as_f64).unwrap_or(0.0),
        data_parallel_rank: rank.and_then(Value::as_i64),
        ..EventBatch::default()
    };
    for (index, e) in list.iter().enumerate() {
        match event(e).map_err(|reason| KvDecodeError::Event { index, reason })? {
            Some(ev) => batch.events.push(ev),
            None => batch.skipped += 1,
        }
    }
    Ok(batch)
}

/// A map's value under `key` (a string key).
fn field<'v>(map: &'v Value, key: &str) -> Option<&'v Value> {
    map.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

/// The event's fields by name, from either encoding. Positional order:
/// vLLM's `BlockStored(block_hashes, parent_block_hash, token_ids,
/// block_size, lora_id, medium, lora_name, extra_keys, group_idx, …)`,
/// `BlockRemoved(block_hashes, medium, group_idx)`.
struct Fields<'v> {
    value: &'v Value,
    kind: &'v str,
    positional: bool,
}

impl<'v> Fields<'v> {
    fn get(&self, name: &str) -> Option<&'v Value> {
        if !self.positional {
            return field(self.value, name).filter(|v| !v.is_nil());
        }
        let order: &[&str] = match self.kind {
            "BlockStored" => &[
                "block_hashes",
                "parent_block_hash",
                "token_ids",
                "block_size",
                "lora_id",
                "medium",
                "lora_name",
                "extra_keys",
                "group_idx",
            ],
            "BlockRemoved" => &["block_hashes", "medium", "group_idx"],
            _ => &[],
        };
        let i = order.iter().position(|n| *n == name)?;
        // Element 0 is the tag.
        self.value.as_array()?.get(i + 1).filter(|v| !v.is_nil())
    }
}

fn event(v: &Value) -> Result<Option<KvEvent>, &'static str> {
    let (kind, positional) = match v {
        Value::Array(a) => (a.first().and_then(Value::as_str), true),
        Value::Map(_) => (field(v, "type").and_then(Value::as_str), false),
        _ => return Err("neither an array nor a map"),
    };
    let Some(kind) = kind else {
        return Err("no event type");
    };
    let f = Fields {
        value: v,
        kind,
        positional,
    };
    let text = |name| f.get(name).and_then(Value::as_str).map(str::to_owned);
    let group_idx = f.get("group_idx").and_then(Value::as_i64);
    Ok(Some(match kind {
        "BlockStored" => {
            let token_ids = f
                .get("token_ids")
                .and_then(Value::as_array)
                .ok_or("BlockStored without token_ids")?
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or("a token id that is not a u32")?;
            KvEvent::BlockStored {
                block_hashes: hashes(f.get("block_hashes"))?,
                parent: f.get("parent_block_hash").map(hash).transpose()?,
                token_ids,
                block_size: f
                    .get("block_size")
                    .and_then(Value::as_u64)
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(0),
                salt: salt(&f, text("lora_name").as_deref()),
                lora_name: text("lora_name"),
                medium: text("medium"),
                group_idx,
            }
        }
        "BlockRemoved" => KvEvent::BlockRemoved {
            block_hashes: hashes(f.get("block_hashes"))?,
            medium: text("medium"),
            group_idx,
        },
        "AllBlocksCleared" => KvEvent::AllBlocksCleared,
        _ => return Ok(None),
    }))
}

/// The salt of a `BlockStored`: vLLM's first block's `extra_keys` are a
/// tuple of the LoRA name, multimodal hashes and the salt, the salt last;
/// the last string there that is not the LoRA name is taken (a prompt
/// with images and no salt would be read as salted: it matches nothing
/// unsalted, which is right, as its blocks differ anyway). SGLang's
/// `BlockStoredWithMetadata` carries `metadata.cache_salt` where vLLM
/// has `lora_name` (position 7 of the array form).
fn salt(f: &Fields<'_>, lora: Option<&str>) -> Option<String> {
    let metadata = f
        .get("metadata")
        .or_else(|| f.get("lora_name").filter(|v| v.is_map()));
    if let Some(m) = metadata {
        return field(m, "cache_salt")
            .and_then(Value::as_str)
            .map(str::to_owned);
    }
    let first = f.get("extra_keys")?.as_array()?.first()?.as_array()?;
    first
        .iter()
        .rev()
        .filter_map(Value::as_str)
        .find(|k| Some(*k) != lora)
        .map(str::to_owned)
}

fn hashes(v: Option<&Value>) -> Result<Vec<EngineHash>, &'static str> {
    v.and_then(Value::as_array)
        .ok_or("no block_hashes")?
        .iter()
        .map(hash)
        .collect()
}

fn hash(v: &Value) -> Result<EngineHash, &'static str> {
    match v {
        Value::Integer(n) => n
            .as_u64()
            .or_else(|| n.as_i64().map(|i| i as u64))
            .map(EngineHash::Int)
            .ok_or("a hash out of range"),
        Value::Binary(b) => Ok(EngineHash::Bytes(b.clone())),
        _ => Err("a hash that is neither an integer nor bytes"),
    }
}

/// Encodes a batch as vLLM 0.23+ does: the envelope an array, each event
/// a map with its `type` (what the simulated engine publishes).
pub fn encode_batch(batch: &EventBatch) -> Vec<u8> {
    let s = |t: &str| Value::from(t);
    let hash = |h: &EngineHash| match h {
        EngineHash::Int(n) => Value::from(*n),
        EngineHash::Bytes(b) => Value::Binary(b.clone()),
    };
    let hashes = |hs: &[EngineHash]| Value::Array(hs.iter().map(hash).collect());
    let opt = |o: &Option<String>| o.as_deref().map_or(Value::Nil, Value::from);
    let events = batch
        .events
        .iter()
        .map(|e| {
            let mut m = Vec::new();
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
                    m.push((s("type"), s("BlockStored")));
                    m.push((s("block_hashes"), hashes(block_hashes)));
                    m.push((
                        s("parent_block_hash"),
                        parent.as_ref().map_or(Value::Nil, hash),
                    ));
                    m.push((
                        s("token_ids"),
                        Value::Array(token_ids.iter().map(|t| Value::from(*t)).collect()),
                    ));
                    m.push((s("block_size"), Value::from(*block_size)));
                    m.push((s("lora_id"), Value::Nil));
                    m.push((s("medium"), opt(medium)));
                    m.push((s("lora_name"), opt(lora_name)));
                    if let Some(salt) = salt {
                        // vLLM's shape: per block, the first's tuple ends
                        // with the salt.
                        let mut keys = vec![Value::Nil; block_hashes.len().max(1)];
                        keys[0] = Value::Array(vec![s(salt)]);
                        m.push((s("extra_keys"), Value::Array(keys)));
                    }
                    if let Some(g) = group_idx {
                        m.push((s("group_idx"), Value::from(*g)));
                    }
                }
                KvEvent::BlockRemoved {
                    block_hashes,
                    medium,
                    group_idx,
                } => {
                    m.push((s("type"), s("BlockRemoved")));
                    m.push((s("block_hashes"), hashes(block_hashes)));
                    m.push((s("medium"), opt(medium)));
                    if let Some(g) = group_idx {
                        m.push((s("group_idx"), Value::from(*g)));
                    }
                }
                KvEvent::AllBlocksCleared => m.push((s("type"), s("AllBlocksCleared"))),
            }
            Value::Map(m)
        })
        .collect();
    let mut envelope = vec![Value::from(batch.ts), Value::Array(events)];
    if let Some(r) = batch.data_parallel_rank {
        envelope.push(Value::from(r));
    }
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &Value::Array(envelope));
    out
}

#[cfg(test)]
mod tests;
