//! Routing on cached prefixes, live: a real gateway over TCP in front of
//! two simulated vLLM engines that cache prefixes (block-level, LRU) and
//! report `cached_tokens` as vLLM does. Requests sharing a long system
//! prompt land where it is cached; a hot prefix spills when its holder is
//! loaded; LoRA adapters and `cache_salt` keep blocks apart; the index
//! stays under its cap under a flood of distinct prompts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use fairway::sim::backend::SimBackend;
use http::StatusCode;
use support::*;

fn policy(routing: &str, extra: &str) -> String {
    format!(
        r#"{SERVER}
[poller]
interval = "50ms"

[[pools]]
model = "m"
routing = "{routing}"
prefix_block_tokens = 16
adapters = ["m-lora"]
{extra}
backends = [
  {{ name = "b0", url = "http://{{b0}}", max_inflight = 8 }},
  {{ name = "b1", url = "http://{{b1}}", max_inflight = 8 }},
]

[[tenants]]
name = "alpha"
api_keys = ["ka"]
"#
    )
}

async fn engine() -> fairway::sim::backend::SimHandle {
    SimBackend::builder("m")
        .max_num_seqs(16)
        .kv_tokens(64 * 1024)
        .decode_step(Duration::from_millis(2), Duration::from_micros(10))
        .lora(&["m-lora"], 2)
        .start()
        .await
        .unwrap()
}

/// A chat whose system prompt is `system` (long) and question `q`.
fn chat_with(model: &str, system: &str, q: &str, max_tokens: u32, extra: &str) -> String {
    format!(
        r#"{{"model":"{model}","max_tokens":{max_tokens}{extra},"messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{q}"}}]}}"#
    )
}

/// A system prompt of about 600 tokens, distinct per `n`.
fn system(n: u32) -> String {
    format!("You are assistant number {n}. ").repeat(80)
}

/// Sends one chat; returns the cached prompt tokens the engine reported.
async fn cached(c: &HttpClient, gw: &fairway::edge::server::Server, body: String) -> u64 {
    let r = send(c, post(gw.addr(), "/v1/chat/completions", Some("ka"), body)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn requests_sharing_a_prefix_land_where_it_is_cached() {
    let (b0, b1) = (engine().await, engine().await);
    let gw = gateway(&policy("prefix_aware", ""), &[&b0, &b1]).await;
    let c = client();
    // Four system prompts, five questions each, interleaved: after each
    // prompt's first request, every request finds it cached.
    let mut hits = 0;
    for q in 0..5 {
        for s in 0..4 {
            let got = cached(&c, &gw, chat_with("m", &system(s), &format!("q{q}"), 2, "")).await;
            if q == 0 {
                assert_eq!(got, 0, "system {s}: nothing cached yet");
            } else if got > 500 {
                hits += 1;
            }
        }
    }
    assert_eq!(hits, 16, "every repeat found its prefix");
    // Both engines got work: the prefixes were spread, not piled.
    let (s0, s1) = (b0.stats(), b1.stats());
    assert!(
        s0.finished_total >= 5 && s1.finished_total >= 5,
        "{s0:?} {s1:?}"
    );
    let text = scrape(&gw).await;
    assert!(metric(&text, "fairway_prefix_index_entries{model=\"m\"}").unwrap() > 0.0);
    let predicted = metric_sum(&text, "fairway_prefix_predicted_cached_tokens_total{");
    assert!(predicted > 16.0 * 500.0, "{text}");
    // What the engines reported in their usage agrees with the prediction.
    let reported = metric_sum(&text, "fairway_backend_cached_prompt_tokens_total{");
    assert!(
        (reported - predicted).abs() <= 0.05 * predicted,
        "reported {reported}, predicted {predicted}"
    );
    promtool_check(&text);
}

#[tokio::test]
async fn least_outstanding_spreads_a_shared_prefix_over_both_engines() {
    // The baseline the strategy is measured against: with the same
    // requests one at a time, ties go at random and both engines prefill
    // the same prompts.
    let (b0, b1) = (engine().await, engine().await);
    let gw = gateway(&policy("least_outstanding", ""), &[&b0, &b1]).await;
    let c = client();
    for q in 0..12 {
        cached(&c, &gw, chat_with("m", &system(0), &format!("q{q}"), 2, "")).await;
    }
    let (s0, s1) = (b0.stats(), b1.stats());
    assert!(s0.finished_total > 0 && s1.finished_total > 0);
    // Each engine prefilled the system prompt at least once.
    assert!(s0.prefix_cache_queries_total - s0.prefix_cache_hits_total > 500);
    assert!(s1.prefix_cache_queries_total - s1.prefix_cache_hits_total > 500);
}

#[tokio::test]
async fn a_hot_prefix_spills_to_the_other_engine_when_its_holder_is_loaded() {
    let (b0, b1) = (engine().await, engine().await);
    let gw = gateway(&policy("prefix_aware", ""), &[&b0, &b1]).await;
    let c = client();
    cached(&c, &gw, chat_with("m", &system(7), "warm", 2, "")).await;
    let holder_is_b0 = b0.stats().finished_total == 1;
    // Long streams of the same prefix, held open: the holder takes them
    // until it is half a window busier than the other, then they spill.
    let mut open_streams = Vec::new();
    for q in 0..8 {
        let body = chat_with(
            "m",
            &system(7),
            &format!("hot{q}"),
            2000,
            r#","stream":true"#,
        );
        let resp = open(
            &c,
            post(gw.addr(), "/v1/chat/completions", Some("ka"), body),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        open_streams.push(resp);
    }
    let text = scrape(&gw).await;
    let spills = metric(&text, "fairway_prefix_spills_total{model=\"m\"}").unwrap();
    assert!(spills >= 1.0, "{text}");
    let (r0, r1) = (b0.stats().running, b1.stats().running);
    let (holder, other) = if holder_is_b0 { (r0, r1) } else { (r1, r0) };
    assert!(
        holder > other && other >= 1,
        "holder {holder}, other {other}"
    );
    drop(open_streams);
}

/// Tenants' caches are kept apart by the salt the gateway sets
/// (`prefix_cache`): a private tenant shares nothing with another, a
/// group shares within itself, shared tenants with each other; a client's
/// own salt separates its requests and never reaches another namespace.
#[tokio::test]
async fn tenants_caches_are_kept_apart_by_the_gateway() {
    let (b0, b1) = (engine().await, engine().await);
    let mut text = policy("prefix_aware", "");
    for (name, key, cache) in [
        ("beta", "kb", "private"),
        ("gamma", "kc", "group:team"),
        ("delta", "kd", "group:team"),
        ("eps", "ke", "shared"),
        ("zeta", "kf", "shared"),
    ] {
        text += &format!(
            "\n[[tenants]]\nname = \"{name}\"\napi_keys = [\"{key}\"]\nprefix_cache = \"{cache}\"\n"
        );
    }
    let gw = gateway(&text, &[&b0, &b1]).await;
    let c = client();
    let as_tenant = async |key: &str, body: String| {
        let r = send(&c, post(gw.addr(), "/v1/chat/completions", Some(key), body)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    let sys = system(5);
    let chat = |q: &str, extra: &str| chat_with("m", &sys, q, 2, extra);
    // alpha (private by default) and beta: each its own.
    assert_eq!(as_tenant("ka", chat("a", "")).await, 0);
    assert!(as_tenant("ka", chat("b", "")).await > 500);
    assert_eq!(
        as_tenant("kb", chat("c", "")).await,
        0,
        "beta found alpha's"
    );
    assert!(as_tenant("kb", chat("d", "")).await > 500);
    // The same client salt in two namespaces shares nothing either.
    let salted = r#","cache_salt":"x""#;
    assert_eq!(as_tenant("ka", chat("e", salted)).await, 0);
    assert!(as_tenant("ka", chat("f", salted)).await > 500);
    assert_eq!(
        as_tenant("kb", chat("g", salted)).await,
        0,
        "beta's x found alpha's"
    );
    // A group shares within itself, shared tenants with each other, and
    // neither with a private tenant.
    assert_eq!(as_tenant("kc", chat("h", "")).await, 0);
    assert!(as_tenant("kd", chat("i", "")).await > 500);
    assert_eq!(as_tenant("ke", chat("j", "")).await, 0);
    assert!(as_tenant("kf", chat("k", "")).await > 500);
    // Every request went where the index predicted its namespace's blocks.
    let scraped = scrape(&gw).await;
    let predicted = metric_sum(&scraped, "fairway_prefix_predicted_cached_tokens_total{");
    let reported = metric_sum(&scraped, "fairway_backend_cached_prompt_tokens_total{");
    assert!(
        (reported - predicted).abs() <= 0.05 * predicted,
        "reported {reported}, predicted {predicted}"
    );
}

#[tokio::test]
async fn an_adapter_and_a_salt_never_match_the_base_models_blocks() {
    let (b0, b1) = (engine().await, engine().await);
    let gw = gateway(&policy("prefix_aware", ""), &[&b0, &b1]).await;
    let c = client();
    let sys = system(3);
    assert_eq!(cached(&c, &gw, chat_with("m", &sys, "a", 2, "")).await, 0);
    assert!(cached(&c, &gw, chat_with("m", &sys, "b", 2, "")).await > 500);
    // The same text under an adapter, or salted, shares nothing.
    assert_eq!(
        cached(&c, &gw, chat_with("m-lora", &sys, "c", 2, "")).await,
        0
    );
    let salted = r#","cache_salt":"team-a""#;
    assert_eq!(
        cached(&c, &gw, chat_with("m", &sys, "d", 2, salted)).await,
        0
    );
    // Each then finds its own.
    assert!(cached(&c, &gw, chat_with("m-lora", &sys, "e", 2, "")).await > 500);
    assert!(cached(&c, &gw, chat_with("m", &sys, "f", 2, salted)).await > 500);
}

#[tokio::test]
async fn the_index_stays_under_its_cap_under_a_flood_of_distinct_prompts() {
    let (b0, b1) = (engine().await, engine().await);
    let gw = gateway(
        &policy("prefix_aware", "prefix_index_blocks = 64"),
        &[&b0, &b1],
    )
    .await;
    let c = client();
    for n in 0..40 {
        // About 37 blocks of 16 tokens each.
        cached(&c, &gw, chat_with("m", &system(100 + n), "x", 1, "")).await;
        let text = scrape(&gw).await;
        let entries = metric(&text, "fairway_prefix_index_entries{model=\"m\"}").unwrap();
        assert!(entries <= 64.0, "{entries} entries after {n}");
    }
    let text = scrape(&gw).await;
    assert_eq!(
        metric(&text, "fairway_prefix_index_capacity{model=\"m\"}"),
        Some(64.0)
    );
    assert!(metric(&text, "fairway_prefix_index_evictions_total{model=\"m\"}").unwrap() > 1000.0);
}

/// An engine that publishes KV events, its HTTP listener at `listen` and
/// its PUB and replay sockets at `kv` (port 0: any).
async fn events_engine(
    listen: std::net::SocketAddr,
    kv: (std::net::SocketAddr, std::net::SocketAddr),
) -> fairway::sim::backend::SimHandle {
    SimBackend::builder("m")
        .max_num_seqs(16)
        .kv_tokens(64 * 1024)
        .decode_step(Duration::from_millis(2), Duration::from_micros(10))
        .listen(listen)
        .kv_events(kv.0, kv.1)
        .start()
        .await
        .unwrap()
}

fn kv_addrs(b: &fairway::sim::backend::SimHandle) -> (std::net::SocketAddr, std::net::SocketAddr) {
    let (e, r) = b.kv_events().unwrap();
    let addr = |s: &str| s.trim_start_matches("tcp://").parse().unwrap();
    (addr(&e), addr(&r))
}

#[tokio::test]
async fn kv_events_keep_what_each_engine_holds_through_gaps_and_restarts() {
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    let (b0, b1) = (
        events_engine(any, (any, any)).await,
        events_engine(any, (any, any)).await,
    );
    // A TTL of one second: what Fairway guesses from its own sends is
    // gone after it; only what the engines report stays.
    let mut toml = format!(
        r#"{SERVER}
[poller]
interval = "50ms"

[[pools]]
model = "m"
routing = "prefix_aware"
prefix_block_tokens = 16
prefix_ttl = "1s"
backends = [
  {{ name = "b0", url = "http://{{b0}}", max_inflight = 8, kv_events = {{ endpoint = "E0", replay = "R0" }} }},
  {{ name = "b1", url = "http://{{b1}}", max_inflight = 8, kv_events = {{ endpoint = "E1", replay = "R1" }} }},
]

[[tenants]]
name = "alpha"
api_keys = ["ka"]
"#
    );
    for (i, b) in [&b0, &b1].iter().enumerate() {
        let (e, r) = b.kv_events().unwrap();
        toml = toml
            .replace(&format!("E{i}"), &e)
            .replace(&format!("R{i}"), &r);
    }
    let gw = gateway(&toml, &[&b0, &b1]).await;
    let c = client();
    let followed = eventually(Duration::from_secs(10), async || {
        metric_sum(&scrape(&gw).await, "fairway_kv_events_connected{") == 2.0
    })
    .await;
    assert!(followed, "{}", scrape(&gw).await);
    // Give the subscriptions a moment to reach the publishers.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let batches = |text: &str| metric_sum(text, "fairway_kv_events_batches_total{");
    for s in 0..4 {
        cached(&c, &gw, chat_with("m", &system(s), "first", 2, "")).await;
    }
    assert!(
        eventually(Duration::from_secs(5), async || batches(&scrape(&gw).await)
            >= 4.0)
        .await,
        "{}",
        scrape(&gw).await
    );
    // Past the guesses' life, each prompt still goes where it is cached.
    let wait_out_guesses = || tokio::time::sleep(Duration::from_millis(2500));
    wait_out_guesses().await;
    for s in 0..4 {
        let got = cached(&c, &gw, chat_with("m", &system(s), "again", 2, "")).await;
        assert!(got > 500, "system {s} found {got} cached tokens");
    }

    // Lost batches: the gateway sees the gap and replays them.
    b0.lose_kv_batches(1);
    b1.lose_kv_batches(1);
    for s in 10..16 {
        cached(&c, &gw, chat_with("m", &system(s), "first", 2, "")).await;
    }
    let replayed = eventually(Duration::from_secs(5), async || {
        metric_sum(&scrape(&gw).await, "fairway_kv_events_replayed_total{") >= 2.0
    })
    .await;
    let text = scrape(&gw).await;
    assert!(replayed, "{text}");
    assert_eq!(metric_sum(&text, "fairway_kv_events_resets_total{"), 0.0);
    wait_out_guesses().await;
    for s in 10..16 {
        let got = cached(&c, &gw, chat_with("m", &system(s), "again", 2, "")).await;
        assert!(got > 500, "system {s} (its batch replayed) found {got}");
    }

    // b0 restarts (same addresses, an empty cache, its sequence from 0):
    // the gateway drops what b0 held and relearns.
    let (http, kv) = (b0.addr(), kv_addrs(&b0));
    b0.shutdown().await;
    let b0 = events_engine(http, kv).await;
    for s in 20..26 {
        cached(&c, &gw, chat_with("m", &system(s), "first", 2, "")).await;
    }
    let reset = eventually(Duration::from_secs(10), async || {
        metric(
            &scrape(&gw).await,
            "fairway_kv_events_resets_total{backend=\"b0\"",
        )
        .unwrap_or(0.0)
            >= 1.0
    })
    .await;
    assert!(reset, "{}", scrape(&gw).await);
    assert!(b0.stats().finished_total > 0, "b0 serves again");
    // What it held before the restart is no longer predicted there, and
    // what it stores since is.
    wait_out_guesses().await;
    for s in 20..26 {
        let got = cached(&c, &gw, chat_with("m", &system(s), "again", 2, "")).await;
        assert!(got > 500, "system {s} after the restart found {got}");
    }
    promtool_check(&scrape(&gw).await);
}

#[tokio::test]
async fn with_the_pools_tokenizer_prompts_are_keyed_by_their_token_ids() {
    let dir = tempfile::tempdir().unwrap();
    let mut words = vec!["You", "are", "assistant", "number", ".", "first", "again"];
    let digits: Vec<String> = (0..10).map(|d| d.to_string()).collect();
    words.extend(digits.iter().map(String::as_str));
    write_test_tokenizer(dir.path(), &words);
    let (b0, b1) = (engine().await, engine().await);
    let extra = format!(
        "tokenizer = \"{}\"",
        dir.path().join("tokenizer.json").display()
    );
    let gw = gateway(&policy("prefix_aware", &extra), &[&b0, &b1]).await;
    let c = client();
    let mut hits = 0;
    for q in ["first", "again", "again"] {
        for s in 0..4 {
            if cached(&c, &gw, chat_with("m", &system(s), q, 2, "")).await > 500 {
                hits += 1;
            }
        }
    }
    assert_eq!(hits, 8, "every repeat went where its prefix is");
    // The index counted the template's tokens (six a sentence, 480 of the
    // system prompt, 30 blocks of 16), not four bytes a token (2,240
    // bytes, 35 blocks).
    let text = scrape(&gw).await;
    let predicted = metric_sum(&text, "fairway_prefix_predicted_cached_tokens_total{");
    assert_eq!(predicted, 8.0 * 480.0, "{text}");
}

#[tokio::test]
async fn an_in_process_simulated_backend_publishes_its_events_with_kv_events_true() {
    let toml = format!(
        r#"{SERVER}
[[pools]]
model = "m"
routing = "prefix_aware"
prefix_block_tokens = 16
[[pools.backends]]
name = "s0"
sim = {{ kv_tokens = 65536 }}
kv_events = true
"#
    );
    let gw = gateway(&toml, &[]).await;
    let c = client();
    assert!(
        eventually(Duration::from_secs(10), async || {
            metric(
                &scrape(&gw).await,
                "fairway_kv_events_connected{backend=\"s0\"",
            )
            .unwrap_or(0.0)
                == 1.0
        })
        .await,
        "{}",
        scrape(&gw).await
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = send(
        &c,
        post(
            gw.addr(),
            "/v1/chat/completions",
            None,
            chat_with("m", &system(1), "q", 2, ""),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(
        eventually(Duration::from_secs(5), async || {
            metric(
                &scrape(&gw).await,
                "fairway_kv_events_batches_total{backend=\"s0\"",
            )
            .unwrap_or(0.0)
                >= 1.0
        })
        .await,
        "{}",
        scrape(&gw).await
    );
}

/// A chat template whose work grows with the square of the messages (the
/// operator's) and a caller that sends thousands: the render stops at its
/// budget, the request falls back to the byte keys and the estimate and
/// is served, and a steady light load to another pool goes on meanwhile
/// as it did alone. The common template (`m2`) renders as many messages
/// within the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_past_its_budget_falls_back_and_holds_up_no_one() {
    let dir = tempfile::tempdir().unwrap();
    write_test_tokenizer(dir.path(), &["hello", "there"]);
    let quadratic = dir.path().join("quadratic.jinja");
    std::fs::write(
        &quadratic,
        "{% for m in messages %}{% for n in messages %}{{ '' }}{% endfor %}\
         <|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
    )
    .unwrap();
    let roomy = |model: &'static str| {
        SimBackend::builder(model)
            .max_model_len(1 << 20)
            .kv_tokens(4 << 20)
            .decode_step(Duration::from_millis(2), Duration::from_micros(10))
            .start()
    };
    let (b0, b1) = (roomy("m").await.unwrap(), roomy("m2").await.unwrap());
    let b2 = sim("light", 8).await;
    let tok = dir.path().join("tokenizer.json");
    let cfg = dir.path().join("tokenizer_config.json");
    let policy = format!(
        r#"{SERVER}
[[pools]]
model = "m"
tokenizer = "{tok}"
tokenizer_config = "{cfg}"
chat_template = "{quadratic}"
backends = [{{ name = "b0", url = "http://{{b0}}" }}]

[[pools]]
model = "m2"
tokenizer = "{tok}"
tokenizer_config = "{cfg}"
backends = [{{ name = "b1", url = "http://{{b1}}" }}]

[[pools]]
model = "light"
backends = [{{ name = "b2", url = "http://{{b2}}" }}]

[[tenants]]
name = "alpha"
api_keys = ["ka"]
"#,
        tok = tok.display(),
        cfg = cfg.display(),
        quadratic = quadratic.display(),
    )
    .replace("max_body_bytes = 65536", "max_body_bytes = 4194304");
    let gw = gateway(&policy, &[&b0, &b1, &b2]).await;
    let addr = gw.addr();
    let long_chat = |model: &str| {
        let messages: Vec<serde_json::Value> = (0..6000)
            .map(|i| serde_json::json!({"role": "user", "content": format!("hello there {i}")}))
            .collect();
        serde_json::json!({"model": model, "max_tokens": 2, "messages": messages}).to_string()
    };
    let light = async || {
        let start = tokio::time::Instant::now();
        let r = send(
            &client(),
            post(
                addr,
                "/v1/chat/completions",
                Some("ka"),
                chat("light", 2, false),
            ),
        )
        .await;
        assert_eq!(r.status, http::StatusCode::OK);
        start.elapsed().as_secs_f64()
    };
    let mut alone = Vec::new();
    for _ in 0..10 {
        alone.push(light().await);
    }
    let heavy = tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        let r = send(
            &client(),
            post(addr, "/v1/chat/completions", Some("ka"), long_chat("m")),
        )
        .await;
        (r.status, start.elapsed().as_secs_f64())
    });
    let mut during = Vec::new();
    while !heavy.is_finished() {
        during.push(light().await);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, took) = heavy.await.unwrap();
    assert_eq!(status, http::StatusCode::OK, "{took}");
    let r = send(
        &client(),
        post(addr, "/v1/chat/completions", Some("ka"), long_chat("m2")),
    )
    .await;
    assert_eq!(r.status, http::StatusCode::OK);
    let worst = during.iter().copied().fold(0.0, f64::max);
    let worst_alone = alone.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "6,000 messages through the quadratic template: {took:.2} s; a light request alone at worst {worst_alone:.4} s, {} meanwhile at worst {worst:.4} s",
        during.len()
    );
    assert!(
        worst < worst_alone + 0.25,
        "a light request waited {worst} s"
    );
    let m = scrape(&gw).await;
    promtool_check(&m);
    let fallbacks = |model: &str, reason: &str| {
        metric(
            &m,
            &format!(
                "fairway_chat_template_fallbacks_total{{model=\"{model}\",reason=\"{reason}\"}}"
            ),
        )
    };
    assert_eq!(fallbacks("m", "budget"), Some(1.0), "{m}");
    assert_eq!(fallbacks("m2", "budget"), Some(0.0));
    assert_eq!(fallbacks("m2", "failed"), Some(0.0));
}

/// An engine's event feed that sends its sequence numbers out of order
/// at will (each older number reads as a restart) makes the gateway log
/// a line at most every 10 s, with how many it left out; the counters
/// have every one. A real `fairway serve` at its default log level, a
/// feed the test publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_of_out_of_order_sequences_writes_a_few_log_lines_not_thousands() {
    use zeromq::{Socket, SocketSend};
    let port = free_port();
    let mut feed = zeromq::PubSocket::new();
    feed.bind(&format!("tcp://127.0.0.1:{port}")).await.unwrap();
    let b = engine().await;
    let text = policy("prefix_aware", "")
        .replace(
            "max_inflight = 8 },\n  {",
            &format!("max_inflight = 8, kv_events = \"tcp://127.0.0.1:{port}\" }},\n  {{"),
        )
        .replace("{b0}", &b.addr().to_string())
        .replace("{b1}", &b.addr().to_string());
    let path = temp_policy("kv-flood", &text);
    let mut gw = ServeProcess::start(&[], &[], &path, "info", std::process::Stdio::piped());
    let batch = fairway::poller::kv_events::encode_batch(&fairway::poller::kv_events::EventBatch {
        ts: 0.0,
        events: Vec::new(),
        data_parallel_rank: None,
        skipped: 0,
    });
    let resets = async || {
        let m = get(&client(), format!("http://{}/metrics", gw.admin))
            .await
            .text();
        metric_sum(&m, "fairway_kv_events_resets_total")
    };
    let start = tokio::time::Instant::now();
    let mut sent = 0u64;
    while resets().await < 1000.0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the feed was not followed"
        );
        for _ in 0..200 {
            // 10, then 0: an older number, read as the engine restarting.
            for seq in [10u64, 0] {
                let frames = vec![
                    bytes::Bytes::new(),
                    bytes::Bytes::copy_from_slice(&seq.to_be_bytes()),
                    bytes::Bytes::from(batch.clone()),
                ];
                feed.send(zeromq::ZmqMessage::try_from(frames).unwrap())
                    .await
                    .unwrap();
                sent += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let counted = resets().await;
    let _ = gw.child.kill();
    let _ = gw.child.wait();
    let mut log = String::new();
    std::io::Read::read_to_string(gw.child.stderr.as_mut().unwrap(), &mut log).unwrap();
    let lines = log
        .lines()
        .filter(|l| l.contains("relearning its cache"))
        .count();
    eprintln!("{sent} messages, {counted} resets counted, {lines} log lines");
    assert!((1..=4).contains(&lines), "{lines} lines:\n{log}");
}
