//! Precise prefix routing against a real vLLM (the CPU build of vLLM 0.32,
//! a small model and tokenizer made locally; no GPU, no downloads):
//! the engine's KV events decode, Fairway keys their token ids as it keys
//! the same prompts rendered with the model's own tokenizer and chat
//! template, and the cached tokens the engine reports agree with what
//! Fairway predicted from its events. And a batch item's resume
//! (`protocol::resume`) on the engine's own wire: a greedy answer cut
//! mid-stream and continued from its token ids is the uninterrupted one.
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

/// The events of an SSE body, each with its blank line.
fn events(body: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(end) = fairway::protocol::sse::event_end(rest) {
        let (e, tail) = rest.split_at(end);
        out.push(e);
        rest = tail;
    }
    out
}

#[tokio::test]
#[ignore = "needs a real vLLM: tests/real-vllm.sh"]
async fn a_greedy_answer_cut_and_resumed_by_token_ids_is_the_uninterrupted_one() {
    use fairway::protocol::resume::{self, Ended, Kind, Progress};
    use serde_json::{Value, json};
    let url = env("FAIRWAY_REAL_VLLM_URL");
    let model = std::env::var("FAIRWAY_REAL_VLLM_MODEL").unwrap_or_else(|_| "tiny".into());
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let c = client();
    let chat = json!({
        "model": model,
        "messages": [{"role": "user", "content": "Count slowly from one to forty."}],
        "max_tokens": 24, "temperature": 0, "ignore_eos": true,
    });
    let completion = json!({
        "model": model, "prompt": "Count slowly from one to forty:",
        "max_tokens": 24, "temperature": 0, "ignore_eos": true,
    });
    for (endpoint, item, kind) in [
        ("/v1/chat/completions", chat, Kind::Chat),
        ("/v1/completions", completion, Kind::Completions),
    ] {
        let text = |v: &Value| match kind {
            Kind::Chat => v["choices"][0]["message"]["content"].clone(),
            Kind::Completions => v["choices"][0]["text"].clone(),
        };
        assert_eq!(resume::resumable(endpoint, &item), Ok(kind));
        let whole = send(&c, post(addr, endpoint, None, item.to_string())).await;
        assert_eq!(whole.status, StatusCode::OK, "{}", whole.text());
        let whole: Value = whole.json();

        // The item streamed as the runner sends it, cut after its 10th
        // event as a preemption cuts it.
        let r = send(&c, post(addr, endpoint, None, resume::streamed(&item))).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let mut cut: Vec<u8> = events(&r.body)[..10].concat();
        cut.extend_from_slice(&fairway::protocol::openai::preempted_event());
        let mut p = Progress::default();
        let shown = String::from_utf8_lossy(&cut).into_owned();
        assert_eq!(p.read(&cut), Ended::Preempted, "{shown}");
        assert!(p.generated() >= 9, "token ids per chunk: {shown}");
        let cont = p
            .continuation(&item)
            .expect("resumable from the engine's token ids");
        let r = send(&c, post(addr, "/v1/completions", None, cont)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(p.read(&r.body), Ended::Done);
        let stitched: Value = serde_json::from_slice(&p.answer(kind, &item)).unwrap();
        assert_eq!(
            text(&stitched),
            text(&whole),
            "stitched {stitched}\nwhole {whole}"
        );
        for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
            assert_eq!(stitched["usage"][k], whole["usage"][k], "{k}");
        }
        assert_eq!(
            stitched["choices"][0]["finish_reason"],
            whole["choices"][0]["finish_reason"]
        );
        // Its shape is the engine's: every field it has, the engine's
        // answer has too (the engine's own extensions are left out).
        let message = |v: &Value| v["choices"][0].get("message").cloned().unwrap_or(json!({}));
        for (s, w) in [
            (&stitched, &whole),
            (&stitched["choices"][0], &whole["choices"][0]),
            (&message(&stitched), &message(&whole)),
        ] {
            for k in s.as_object().unwrap().keys() {
                assert!(w.get(k).is_some(), "{k} is not in {w}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real vLLM: tests/real-vllm.sh"]
async fn a_batch_preempted_by_live_work_resumes_to_the_engines_own_answers() {
    use serde_json::{Value, json};
    use support::batch::{ended, lines, upload};
    let url = env("FAIRWAY_REAL_VLLM_URL");
    let model = std::env::var("FAIRWAY_REAL_VLLM_MODEL").unwrap_or_else(|_| "tiny".into());
    let dir = tempfile::tempdir().unwrap();
    // Two slots on the engine, live work preempting after 10 ms.
    let toml = format!(
        r#"{SERVER}
[batch]
data_dir = "{data}"

[preemption]
min_wait = "10ms"

[[pools]]
model = "{model}"
ttft_p99_threshold = "60s"
backends = [{{ name = "vllm", url = "{url}", max_inflight = 2 }}]

[[tenants]]
name = "api"
api_keys = ["ka"]
weight = 3

[[tenants]]
name = "evals"
api_keys = ["ke"]
"#,
        data = dir.path().join("data").display()
    );
    let gw = gateway(&toml, &[]).await;
    let addr = gw.addr();
    // Greedy items long enough to be cut mid-answer.
    let body = |i: usize| {
        json!({"model": model, "messages": [{"role": "user", "content": format!("Item {i}: count to ninety.")}],
            "max_tokens": 160, "temperature": 0, "ignore_eos": true})
    };
    let n = 6;
    let input: String = (0..n)
        .map(|i| {
            json!({"custom_id": format!("q{i}"), "method": "POST", "url": "/v1/chat/completions",
                "body": body(i)})
            .to_string()
                + "\n"
        })
        .collect();
    let f = upload(addr, "ke", "batch", &input).await;
    assert_eq!(f.status, StatusCode::OK, "{}", f.text());
    let c = support::batch::create(addr, "ke", f.json()["id"].as_str().unwrap()).await;
    let id = c.json()["id"].as_str().unwrap().to_owned();
    let live = tokio::spawn(async move {
        let c = client();
        let mut ok = 0;
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
            let r = send(
                &c,
                post(addr, "/v1/chat/completions", Some("ka"), chat.to_string()),
            )
            .await;
            ok += usize::from(r.status == StatusCode::OK);
        }
        ok
    });
    let b = ended(addr, "ke", &id, Duration::from_secs(300)).await;
    assert_eq!(live.await.unwrap(), 10);
    assert_eq!(b["status"], "completed", "{b}");
    let m = scrape(&gw).await;
    let count = |name: &str| metric(&m, &format!("{name}{{tenant=\"evals\"}}")).unwrap_or(0.0);
    let preempted = count("fairway_batch_items_preempted_total");
    assert!(preempted >= 1.0, "no item was preempted mid-answer");
    assert_eq!(count("fairway_batch_items_resumed_total"), preempted);
    assert_eq!(count("fairway_batch_items_restarted_total"), 0.0);
    eprintln!(
        "{preempted} preemptions, {} tokens kept",
        count("fairway_batch_resume_tokens_saved_total")
    );
    // Each answer is the engine's own uninterrupted one.
    let out = lines(addr, "ke", b["output_file_id"].as_str().unwrap()).await;
    let url: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let c = client();
    for i in 0..n {
        let got = &out[&format!("q{i}")]["response"]["body"];
        let r = send(
            &c,
            post(url, "/v1/chat/completions", None, body(i).to_string()),
        )
        .await;
        let want: Value = r.json();
        assert_eq!(
            got["choices"][0]["message"]["content"], want["choices"][0]["message"]["content"],
            "q{i}"
        );
        assert_eq!(
            got["usage"]["prompt_tokens"],
            want["usage"]["prompt_tokens"]
        );
        assert_eq!(got["usage"]["completion_tokens"], 160);
    }
}
