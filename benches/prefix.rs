//! Criterion benches for prefix-aware routing's work per request, and the
//! index's memory per block:
//! - `keys`: what the gateway adds to a request of a `prefix_aware` pool
//!   before the scheduler's lock: read the prompt (`protocol::prompt`),
//!   cut it into approximate token ids and chain its block keys, for the
//!   bench's 200-byte chat and an 8 KiB conversation of eight turns;
//! - `index`: a lookup over 8 backends and the record of the choice, on a
//!   full index of 1 M blocks;
//! - `tokenizer`: with a pool's tokenizer, the 8 KiB conversation
//!   rendered with a ChatML template, tokenized by a byte-level BPE of
//!   4,000 ids (trained here from the bench's text, as a model's own
//!   would be) and keyed: resent as it is (every piece cached), and with
//!   a new last turn (one piece tokenized), against the bytes' keys;
//! - `kv_events`: an engine's KV-event batch decoded (msgpack) and keyed
//!   by the feed (one `BlockStored` of 32 blocks of 16 tokens, a 512-token
//!   prompt, and one `BlockRemoved` of 8), per batch.
//!
//! Before the benches it prints the index's heap bytes per block at 1 M
//! blocks (`PrefixIndex::heap_bytes`, from the tables' capacities).
//!
//!   cargo bench --bench prefix

#![allow(clippy::expect_used)] // a bench that cannot set up has nothing to measure

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use fairway::core::ids::BackendId;
use fairway::core::prefix::PrefixIndex;
use fairway::core::time::Instant;
use fairway::protocol::prompt;

/// The body `benches/lib.sh` sends (about 200 bytes).
const CHAT: &str = r#"{"model":"bench","messages":[{"role":"system","content":"You are a concise assistant."},{"role":"user","content":"Summarise the main causes of the 1929 stock market crash in two sentences."}],"max_tokens":20,"temperature":0.2}"#;

/// A conversation of eight turns of about 1 KiB each.
fn long_chat() -> String {
    let text = "The quick brown fox jumps over the lazy dog, \\\"quoted\\\". ".repeat(18);
    let messages: Vec<String> = (0..8)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            format!(r#"{{"role":"{role}","content":"{text}"}}"#)
        })
        .collect();
    format!(
        r#"{{"model":"bench","messages":[{}],"max_tokens":256,"stream":true}}"#,
        messages.join(",")
    )
}

fn keys_of(body: &[u8]) -> Vec<u64> {
    prompt::keys(body, "bench", None, 64)
}

fn keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("keys");
    g.bench_function("chat-200B", |b| {
        b.iter(|| keys_of(black_box(CHAT.as_bytes())))
    });
    let long = long_chat();
    g.bench_function("chat-8KiB", |b| {
        b.iter(|| keys_of(black_box(long.as_bytes())))
    });
    g.finish();
}

const BLOCKS: usize = 1 << 20;

/// A full index: 1 M blocks in chains of 32, spread over 8 backends.
fn full_index() -> PrefixIndex {
    let mut ix = PrefixIndex::new(BLOCKS, Some(Duration::from_secs(120)));
    let chains = BLOCKS / 32;
    for c in 0..chains as u64 {
        let keys: Vec<u64> = (0..32)
            .map(|i| (c << 8 | i).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        ix.stored(Instant::ZERO, BackendId((c % 8) as u32), &keys);
    }
    ix
}

fn index(c: &mut Criterion) {
    let mut ix = full_index();
    println!(
        "prefix index: {} blocks, {} heap bytes, {:.1} bytes per block",
        ix.len(),
        ix.heap_bytes(),
        ix.heap_bytes() as f64 / ix.len() as f64
    );
    let long = long_chat();
    let request = keys_of(long.as_bytes());
    let backends: Vec<BackendId> = (0..8).map(BackendId).collect();
    let mut out = Vec::new();
    let mut g = c.benchmark_group("index");
    g.bench_function("match-and-record-8KiB-8-backends", |b| {
        b.iter(|| {
            ix.matched(Instant::ZERO, black_box(&request), &backends, &mut out);
            ix.stored(Instant::ZERO, BackendId(3), &request);
        })
    });
    g.finish();
}

fn kv_events(c: &mut Criterion) {
    use fairway::poller::kv_events::{
        EngineHash, EventBatch, Feed, KvEvent, decode_batch, encode_batch,
    };
    let batch = EventBatch {
        ts: 1.0,
        events: vec![
            KvEvent::BlockStored {
                block_hashes: (1..=32).map(EngineHash::Int).collect(),
                parent: None,
                token_ids: (0..512).collect(),
                block_size: 16,
                lora_name: None,
                medium: Some("GPU".into()),
                group_idx: None,
                salt: None,
            },
            KvEvent::BlockRemoved {
                block_hashes: (100..108).map(EngineHash::Int).collect(),
                medium: Some("GPU".into()),
                group_idx: None,
            },
        ],
        data_parallel_rank: None,
        skipped: 0,
    };
    let payload = encode_batch(&batch);
    let mut g = c.benchmark_group("kv_events");
    g.bench_function("decode", |b| b.iter(|| decode_batch(black_box(&payload))));
    let mut feed = Feed::new("bench", 64, 1 << 16);
    let mut out = Vec::new();
    let mut seq = 0;
    g.bench_function("decode+key", |b| {
        b.iter(|| {
            out.clear();
            let decoded = decode_batch(black_box(&payload)).unwrap_or_default();
            feed.apply(seq, &decoded, &mut out);
            seq += 1;
            out.len()
        })
    });
    g.finish();
}

fn tokenizer(c: &mut Criterion) {
    use std::collections::HashSet;
    use tokenizers::models::TrainerWrapper;
    use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{AddedToken, Tokenizer};

    let dir = tempfile::tempdir().expect("temp dir");
    let mut tok = Tokenizer::new(BPE::default());
    tok.with_pre_tokenizer(Some(ByteLevel::default()));
    let specials = ["<|im_start|>", "<|im_end|>"]
        .map(|t| AddedToken::from(t, true))
        .to_vec();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(4000)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect::<HashSet<char>>())
        .build()
        .into();
    let long = long_chat();
    let corpus = [long.clone(), CHAT.to_owned()];
    tok.train(&mut trainer, corpus.iter()).expect("trains");
    tok.save(dir.path().join("tokenizer.json"), false)
        .expect("saves");
    let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let config = format!(
        r#"{{"chat_template": {}}}"#,
        serde_json::to_string(template).expect("json")
    );
    std::fs::write(dir.path().join("tokenizer_config.json"), config).expect("writes");
    let chat = fairway::tokens::ChatTokenizer::load(
        &dir.path().join("tokenizer.json"),
        Some(&dir.path().join("tokenizer_config.json")),
        None,
    )
    .expect("loads");
    let keys = |body: &[u8]| {
        let p = chat.prompt_ids(body).expect("renders");
        fairway::tokens::request_keys("bench", p.cache_salt.as_deref(), &p.ids, 64)
    };
    let mut g = c.benchmark_group("tokenizer");
    g.bench_function("chat-8KiB-resent", |b| {
        b.iter(|| keys(black_box(long.as_bytes())))
    });
    let mut n = 0u64;
    let shared = long
        .trim_end_matches(r#"],"max_tokens":256,"stream":true}"#)
        .to_owned();
    g.bench_function("chat-8KiB-new-turn", |b| {
        b.iter(|| {
            n += 1;
            let body = format!(
                r#"{shared},{{"role":"user","content":"And what about question {n}?"}}],"max_tokens":256}}"#
            );
            keys(black_box(body.as_bytes()))
        })
    });
    g.bench_function("chat-8KiB-bytes", |b| {
        b.iter(|| keys_of(black_box(long.as_bytes())))
    });
    g.finish();
}

criterion_group!(benches, keys, index, tokenizer, kv_events);
criterion_main!(benches);
