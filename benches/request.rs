//! Criterion benches for the per-request work on the proxy's path that is
//! not I/O: reading a request body (`openai::parse`), for the shipped
//! bench's chat body and for a long prompt, relaying a JSON answer and
//! reading its usage, and writing the rate-limit headers of an answer.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use fairway::core::admission::{BucketState, RateLimits};
use fairway::gateway::relay::{Mode, relay_frames};
use fairway::protocol::error::rate_limit_headers;
use fairway::protocol::openai::parse;

/// The body `benches/lib.sh` sends (about 200 bytes).
const CHAT: &str = r#"{"model":"bench","messages":[{"role":"system","content":"You are a concise assistant."},{"role":"user","content":"Summarise the main causes of the 1929 stock market crash in two sentences."}],"max_tokens":20,"temperature":0.2}"#;

/// A chat of eight turns of about 1 KiB each, some with content parts.
fn long_chat() -> String {
    let text = "The quick brown fox jumps over the lazy dog, \\\"quoted\\\". ".repeat(18);
    let mut messages = Vec::new();
    for i in 0..8 {
        messages.push(if i % 2 == 0 {
            format!(r#"{{"role":"user","content":"{text}"}}"#)
        } else {
            format!(r#"{{"role":"user","content":[{{"type":"text","text":"{text}"}},{{"type":"image_url","image_url":{{"url":"data:,"}}}}]}}"#)
        });
    }
    format!(
        r#"{{"model":"bench","messages":[{}],"max_tokens":256,"stream":true}}"#,
        messages.join(",")
    )
}

fn request(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse");
    g.bench_function("chat-200B", |b| {
        b.iter(|| parse(black_box(CHAT.as_bytes())))
    });
    let long = long_chat();
    g.bench_function(format!("chat-{}KiB", long.len() / 1024), |b| {
        b.iter(|| parse(black_box(long.as_bytes())))
    });
    g.finish();

    // A 20-token answer as the simulated backend writes it (330 bytes),
    // relayed and its usage read.
    let answer = bytes::Bytes::from_static(br#"{"choices":[{"finish_reason":"length","index":0,"logprobs":null,"message":{"content":" tok tok tok tok tok tok tok tok tok tok tok tok tok tok tok tok tok tok tok tok","role":"assistant"}}],"created":0,"id":"chatcmpl-4b61e8450000000000000001","model":"bench","object":"chat.completion","usage":{"completion_tokens":20,"prompt_tokens":5,"total_tokens":25}}"#);
    c.bench_function("relay/json-330B", |b| {
        b.iter(|| relay_frames(Mode::Json, std::slice::from_ref(black_box(&answer))))
    });

    let bucket = |limit, remaining, ms| BucketState {
        limit,
        remaining,
        reset: Duration::from_millis(ms),
    };
    // A tenant's limits and reset stay, its remaining budget moves.
    let mut remaining = 1.0e6;
    c.bench_function("rate_limit_headers", |b| {
        b.iter(|| {
            remaining -= 0.37;
            let limits = RateLimits {
                requests: Some(bucket(1.0e6, remaining, 1)),
                gpu_seconds: Some(bucket(1.0e9, remaining * 1000.0, 1)),
            };
            let mut h = http::HeaderMap::new();
            h.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            h.insert(
                http::header::CONTENT_LENGTH,
                http::HeaderValue::from(330u64),
            );
            rate_limit_headers(&mut h, black_box(&limits));
            h
        })
    });
}

criterion_group!(benches, request);
criterion_main!(benches);
