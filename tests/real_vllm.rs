//! Precise prefix routing against a real vLLM (the CPU build of vLLM 0.32,
//! a small model and tokenizer made locally; no GPU, no downloads):
//! the engine's KV events decode, Fairway keys their token ids as it keys
//! the same prompts rendered with the model's own tokenizer and chat
//! template, and the cached tokens the engine reports agree with what
//! Fairway predicted from its events.
//!
//! Ignored in the main suite (the engine is a 6 GB install): run it with
//! `tests/real-vllm.sh`, which starts the engine with its KV events on and
//! passes where it is in `FAIRWAY_REAL_VLLM_*`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use http::StatusCode;
use support::*;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run tests/real-vllm.sh"))
}

#[tokio::test]
#[ignore = "needs a real vLLM: tests/real-vllm.sh"]
async fn real_vllm_events_match_fairways_keys_and_its_cached_tokens() {
    let url = env("FAIRWAY_REAL_VLLM_URL");
    let events = env("FAIRWAY_REAL_VLLM_EVENTS");
    let replay = env("FAIRWAY_REAL_VLLM_REPLAY");
    let model_dir = env("FAIRWAY_REAL_VLLM_MODEL_DIR");
    let model = std::env::var("FAIRWAY_REAL_VLLM_MODEL").unwrap_or_else(|_| "tiny".into());
    // The engine's block (128 on the CPU build) as the canonical block; a
    // TTL of one second, so that after it only what the engine's events
    // reported is in the index.
    let toml = format!(
        r#"{SERVER}
[poller]
interval = "200ms"

[[pools]]
model = "{model}"
routing = "prefix_aware"
prefix_block_tokens = 128
prefix_ttl = "1s"
tokenizer = "{model_dir}/tokenizer.json"
ttft_p99_threshold = "60s"
backends = [
  {{ name = "vllm", url = "{url}", max_inflight = 8, kv_events = {{ endpoint = "{events}", replay = "{replay}" }} }},
]
"#
    );
    let gw = gateway(&toml, &[]).await;
    let c = client();
    assert!(
        eventually(Duration::from_secs(20), async || {
            metric(&scrape(&gw).await, "fairway_kv_events_connected{").unwrap_or(0.0) == 1.0
        })
        .await,
        "{}",
        scrape(&gw).await
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A system prompt of several engine blocks, unique to this run.
    let nonce = std::process::id();
    let system =
        format!("Run {nonce}. ") + &"You are a careful assistant who answers briefly. ".repeat(40);
    let chat_with = |q: &str, extra: &str| {
        format!(
            r#"{{"model":"{model}","max_tokens":4,"temperature":0,"ignore_eos":true{extra},"messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{q}"}}]}}"#
        )
    };
    let chat = |q: &str| chat_with(q, "");
    let send = async |body: String| {
        let r = support::send(&c, post(gw.addr(), "/v1/chat/completions", None, body)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let u = &r.json()["usage"];
        (
            u["prompt_tokens"].as_u64().unwrap(),
            u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
        )
    };
    let (prompt, cached) = send(chat("first question")).await;
    assert!(
        prompt > 3 * 128,
        "a prompt of {prompt} tokens spans too few blocks"
    );
    assert_eq!(cached, 0, "a new prompt");
    assert!(
        eventually(Duration::from_secs(10), async || {
            metric_sum(&scrape(&gw).await, "fairway_kv_events_batches_total{") >= 1.0
        })
        .await
    );
    let text = scrape(&gw).await;
    assert_eq!(
        metric_sum(&text, "fairway_kv_events_decode_errors_total{"),
        0.0,
        "{text}"
    );
    assert_eq!(
        metric_sum(&text, "fairway_kv_events_unanchored_total{"),
        0.0,
        "{text}"
    );
    let predicted = |t: &str| metric_sum(t, "fairway_prefix_predicted_cached_tokens_total{");
    let before = predicted(&text);
    // Past the guess: the index holds the prompt only if the keys Fairway
    // made of the engine's token ids equal those of the rendered request.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let (_, cached) = send(chat("second question")).await;
    let text = scrape(&gw).await;
    let now = predicted(&text) - before;
    assert!(cached >= 3 * 128, "the engine found {cached} cached tokens");
    assert_eq!(
        now, cached as f64,
        "Fairway predicted {now} cached tokens from the engine's events; the engine reported {cached}\n{text}"
    );

    // A salted prompt: the engine caches it apart (its first block's
    // extra keys carry the salt), and so does Fairway's index.
    let salted = |q: &str| chat_with(q, r#","cache_salt":"team-a""#);
    let (_, cached) = send(salted("first question")).await;
    assert_eq!(
        cached, 0,
        "the salt keeps it apart from the unsalted prompt"
    );
    let before = predicted(&scrape(&gw).await);
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let (_, cached) = send(salted("second question")).await;
    let text = scrape(&gw).await;
    let now = predicted(&text) - before;
    assert!(cached >= 3 * 128, "the engine found {cached} cached tokens");
    assert_eq!(
        now, cached as f64,
        "salted: predicted {now}, reported {cached}\n{text}"
    );
    assert_eq!(
        metric_sum(&text, "fairway_kv_events_unanchored_total{"),
        0.0,
        "{text}"
    );
}
