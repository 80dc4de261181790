//! LoRA adapters: a real gateway in front of two simulated vLLM backends
//! that serve adapters (their `/v1/models`, LoRA slots, load times and
//! metrics), over TCP; and the replay's count of adapter loads.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use fairway::config::load_policy;
use fairway::replay::scenario::Scenario;
use fairway::replay::sim::RunOptions;
use fairway::replay::{Compare, run_variant, variants};
use fairway::sim::backend::SimBackend;
use http::StatusCode;
use support::*;

const POLICY: &str = r#"
[poller]
interval = "50ms"

[[pools]]
model = "base"
adapters = ["sql", "chat"]
backends = [
  { name = "b0", url = "http://{b0}", max_inflight = 2 },
  { name = "b1", url = "http://{b1}", max_inflight = 2 },
]

[[tenants]]
name = "alpha"
api_keys = ["ka"]

[[tenants]]
name = "beta"
api_keys = ["kb"]
adapters = ["chat"]
"#;

async fn lora_sim() -> fairway::sim::backend::SimHandle {
    SimBackend::builder("base")
        .max_num_seqs(8)
        .decode_step(Duration::from_millis(2), Duration::from_micros(10))
        .lora(&["sql", "chat"], 2)
        .lora_residency_metrics()
        .start()
        .await
        .unwrap()
}

fn chat_for(model: &str, max_tokens: u32, stream: bool) -> String {
    format!(
        r#"{{"model":"{model}","max_tokens":{max_tokens},"stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    )
}

/// A plain chat call for `model` with `max_tokens`, as tenant `key`.
async fn call(
    c: &HttpClient,
    gw: &fairway::edge::server::Server,
    key: &str,
    model: &str,
    max_tokens: u32,
) -> Reply {
    let body = chat_for(model, max_tokens, false);
    send(c, post(gw.addr(), "/v1/chat/completions", Some(key), body)).await
}

/// `GET /v1/models` as `key` (none: without a key): `id<parent` each.
async fn models(
    c: &HttpClient,
    gw: &fairway::edge::server::Server,
    key: Option<&str>,
) -> Vec<String> {
    let mut req = http::Request::get(format!("http://{}/v1/models", gw.addr()));
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let r = send(
        c,
        req.body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    r.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}<{}",
                m["id"].as_str().unwrap(),
                m["parent"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// `fairway_adapter_requests_total` of `adapter` sent to `backend`.
async fn sent_to(gw: &fairway::edge::server::Server, adapter: &str, backend: &str) -> f64 {
    metric_sum(
        &scrape(gw).await,
        &format!(
            "fairway_adapter_requests_total{{model=\"base\",adapter=\"{adapter}\",backend=\"{backend}\"}}"
        ),
    )
}

#[tokio::test]
async fn an_adapter_goes_where_it_is_loaded_until_that_backend_is_full_then_spreads() {
    let b0 = lora_sim().await;
    let b1 = lora_sim().await;
    let gw = gateway(&format!("{SERVER}{POLICY}"), &[&b0, &b1]).await;
    let c = client();
    // Another client's request loads "sql" on b1, straight to the engine.
    let r = send(
        &c,
        post(
            b1.addr(),
            "/v1/chat/completions",
            None,
            chat_for("sql", 2, false),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // The gateway reads b1's residency series at its next polls.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Held open (streams of 300 tokens), one after another: the first two
    // go to b1, where "sql" is loaded; b1's window is then full, and the
    // next two go to b0.
    let mut open_streams = Vec::new();
    for (n, (want_b0, want_b1)) in [(0.0, 1.0), (0.0, 2.0), (1.0, 2.0), (2.0, 2.0)]
        .into_iter()
        .enumerate()
    {
        let resp = open(
            &c,
            post(
                gw.addr(),
                "/v1/chat/completions",
                Some("ka"),
                chat_for("sql", 300, true),
            ),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        open_streams.push(resp);
        assert_eq!(
            (
                sent_to(&gw, "sql", "b0").await,
                sent_to(&gw, "sql", "b1").await
            ),
            (want_b0, want_b1),
            "after request {}",
            n + 1
        );
    }
    drop(open_streams);

    // The adapter reaches the engine by its own name, and the usage is
    // settled on the base model's series.
    let r = call(&c, &gw, "ka", "chat", 3).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["model"], "chat");
    let text = scrape(&gw).await;
    assert!(
        metric_sum(
            &text,
            "fairway_completion_tokens_total{tenant=\"alpha\",model=\"base\""
        ) >= 3.0
    );
    promtool_check(&text);
    // What the poller reads of b1's LoRA series: its resident adapters.
    let scraped = get(&c, format!("http://{}/metrics", b1.addr()))
        .await
        .text();
    let reading = fairway::poller::Decoder::new(fairway::config::MetricsDialect::Vllm)
        .decode(&scraped, fairway::core::time::Instant::ZERO)
        .unwrap();
    let lora = reading.lora.unwrap();
    assert!(
        lora.resident && lora.adapters.contains(&"sql".to_owned()),
        "{lora:?}"
    );
    assert_eq!(lora.max_loaded, Some(2));
}

#[tokio::test]
async fn tenants_see_and_call_only_their_adapters() {
    let b0 = lora_sim().await;
    let b1 = lora_sim().await;
    let gw = gateway(&format!("{SERVER}{POLICY}"), &[&b0, &b1]).await;
    let c = client();
    assert_eq!(
        models(&c, &gw, Some("ka")).await,
        ["base<", "sql<base", "chat<base"]
    );
    assert_eq!(models(&c, &gw, Some("kb")).await, ["base<", "chat<base"]);
    // Without a key, no adapter names.
    assert_eq!(models(&c, &gw, None).await, ["base<"]);
    // Beta may not call "sql": as for a model it does not have.
    let r = call(&c, &gw, "kb", "sql", 2).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let r = call(&c, &gw, "kb", "chat", 2).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}

#[tokio::test]
async fn adapters_the_backends_list_are_served_without_being_in_the_policy() {
    let b0 = lora_sim().await;
    let b1 = lora_sim().await;
    let policy = POLICY.replace("adapters = [\"sql\", \"chat\"]\n", "");
    assert!(!policy.contains("\"sql\""));
    let gw = gateway(&format!("{SERVER}{policy}"), &[&b0, &b1]).await;
    let c = client();
    // The poller reads the backends' /v1/models at its first tick.
    let served = eventually(Duration::from_secs(5), async || {
        let r = call(&c, &gw, "ka", "sql", 2).await;
        r.status == StatusCode::OK
    })
    .await;
    assert!(served, "an adapter the backends list is served");
    assert_eq!(
        sent_to(&gw, "sql", "b0").await + sent_to(&gw, "sql", "b1").await,
        1.0
    );
    assert_eq!(models(&c, &gw, None).await, ["base<"]);
    assert_eq!(
        models(&c, &gw, Some("ka")).await,
        ["base<", "chat<base", "sql<base"]
    );
    // Still unknown: a name nobody lists.
    let r = call(&c, &gw, "ka", "nope", 2).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

/// The shipped comparison (`config/lora.toml`, `config/scenarios/lora.toml`):
/// eight adapters with Zipf-like popularity on four engines with two
/// slots each.
#[test]
fn adapter_affinity_loads_fewer_adapters_than_least_outstanding_in_replay() {
    let policy = load_policy(std::path::Path::new("config/lora.toml"))
        .unwrap()
        .0;
    let text = std::fs::read_to_string("config/scenarios/lora.toml").unwrap();
    let work = Scenario::from_toml(&text)
        .unwrap()
        .generate(&policy.pools[0].model, 1);
    let opts = RunOptions {
        seed: 1,
        progress: None,
        replicas: 1,
        ingress: Default::default(),
    };
    let runs: Vec<_> = variants(&policy, Some(Compare::Adapters))
        .into_iter()
        .map(|v| run_variant(&policy, &work, v, &opts).0)
        .collect();
    let (with, without) = (&runs[0], &runs[1]);
    assert!(with.adapter_affinity && !without.adapter_affinity);
    let (a, b) = (with.adapter_loads.unwrap(), without.adapter_loads.unwrap());
    assert!(
        a * 4 < b,
        "adapter loads: {a} with affinity, {b} with least_outstanding alone"
    );
    // Fewer loads, and nothing lost: every request served both ways.
    for r in &runs {
        assert_eq!(r.tenants["default"].served, work.len(), "{}", r.routing());
    }
}
