//! The simulated backend over real TCP on 127.0.0.1:0, with hyper_util's
//! legacy client: wire format, real streaming, metrics, cancellation, faults.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::*;

type TestClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn send(
    c: &TestClient,
    method: Method,
    url: String,
    body: Option<Value>,
) -> Response<Incoming> {
    let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    let req = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap();
    c.request(req).await.unwrap()
}

async fn post(c: &TestClient, url: String, body: Value) -> (StatusCode, Value) {
    let resp = send(c, Method::POST, url, Some(body)).await;
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

async fn get(c: &TestClient, url: String) -> (StatusCode, String) {
    let resp = send(c, Method::GET, url, None).await;
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

/// The value of the sample whose name and labels start with `prefix`.
fn sample(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {prefix} in\n{text}"))
}

async fn scrape(c: &TestClient, h: &SimHandle) -> String {
    let (status, text) = get(c, format!("{}/metrics", h.url())).await;
    assert_eq!(status, StatusCode::OK);
    text
}

/// Polls `/metrics` until `pred` holds (5 s limit).
async fn scrape_until(c: &TestClient, h: &SimHandle, pred: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = scrape(c, h).await;
        if pred(&text) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition never held:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn running(text: &str) -> f64 {
    sample(text, "vllm:num_requests_running{")
}

fn waiting(text: &str) -> f64 {
    sample(text, "vllm:num_requests_waiting{")
}

/// The JSON payloads of an SSE body (`[DONE]` as a string).
fn events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let data = e.strip_prefix("data: ").unwrap();
            serde_json::from_str(data).unwrap_or_else(|_| Value::String(data.to_owned()))
        })
        .collect()
}

fn chat(model: &str, max_tokens: u32, stream: bool) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hello world!"}],
        "max_tokens": max_tokens, "stream": stream})
}

async fn fast() -> SimHandle {
    SimBackend::builder("m")
        .time_scale(100.0)
        .start()
        .await
        .unwrap()
}

#[tokio::test]
async fn non_streaming_chat_returns_usage_and_text() {
    let h = fast().await;
    let c = client();
    let (status, v) = post(
        &c,
        format!("{}/v1/chat/completions", h.url()),
        chat("m", 5, false),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    // "hello world!" is 12 bytes = 3 tokens, plus 4 for the template.
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12,
            "prompt_tokens_details": {"cached_tokens": 0}})
    );
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], " tok".repeat(5));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let text = scrape(&c, &h).await;
    let labels = "engine=\"0\",model_name=\"m\"";
    assert_eq!(
        sample(&text, &format!("vllm:prompt_tokens_total{{{labels}}}")),
        7.0
    );
    assert_eq!(
        sample(&text, &format!("vllm:generation_tokens_total{{{labels}}}")),
        5.0
    );
    assert_eq!(
        sample(
            &text,
            &format!("vllm:request_success_total{{{labels},finished_reason=\"length\"}}")
        ),
        1.0
    );
    assert_eq!(
        sample(&text, "vllm:time_to_first_token_seconds_count{"),
        1.0
    );
    assert_eq!(
        sample(&text, "vllm:e2e_request_latency_seconds_count{"),
        1.0
    );
}

#[tokio::test]
async fn sim_output_tokens_stops_early_with_stop() {
    let h = fast().await;
    let c = client();
    let body = json!({"model": "m", "prompt": "abcd", "max_tokens": 10, "sim_output_tokens": 3});
    let (status, v) = post(&c, format!("{}/v1/completions", h.url()), body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], " tok tok tok");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn stream_is_really_streamed_token_by_token() {
    // 20 tokens × 10 ms decode steps ≈ 200 ms wall.
    let h = SimBackend::builder("m")
        .decode_step(Duration::from_millis(10), Duration::ZERO)
        .prefill_tokens_per_s(1e6)
        .start()
        .await
        .unwrap();
    let c = client();
    let start = tokio::time::Instant::now();
    let resp = send(
        &c,
        Method::POST,
        format!("{}/v1/chat/completions", h.url()),
        Some(chat("m", 20, true)),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let mut first = None;
    let mut text = String::new();
    while let Some(frame) = body.frame().await {
        let data = frame.unwrap().into_data().unwrap();
        first.get_or_insert_with(|| start.elapsed());
        text.push_str(std::str::from_utf8(&data).unwrap());
    }
    let total = start.elapsed();
    let first = first.unwrap();
    assert!(total >= Duration::from_millis(150), "total {total:?}");
    assert!(first < total / 2, "first {first:?} total {total:?}");

    let ev = events(&text);
    // role chunk + 20 token chunks + [DONE]; no usage chunk unless asked.
    assert_eq!(ev.len(), 22, "{text}");
    assert_eq!(ev[0]["object"], "chat.completion.chunk");
    assert_eq!(ev[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(ev[1]["choices"][0]["delta"]["content"], " tok");
    assert!(ev[1]["choices"][0]["finish_reason"].is_null());
    assert_eq!(ev[20]["choices"][0]["finish_reason"], "length");
    assert_eq!(ev[21], "[DONE]");
    assert!(!text.contains("usage"));
}

#[tokio::test]
async fn usage_chunk_only_when_include_usage() {
    let h = fast().await;
    let c = client();
    let url = format!("{}/v1/completions", h.url());
    let mut body = json!({"model": "m", "prompt": "abcdefgh", "max_tokens": 3, "stream": true,
        "stream_options": {"include_usage": true}});
    let resp = send(&c, Method::POST, url.clone(), Some(body.clone())).await;
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let ev = events(&text);
    assert_eq!(ev.len(), 5, "{text}");
    assert_eq!(ev[0]["object"], "text_completion");
    assert_eq!(ev[0]["choices"][0]["text"], " tok");
    assert_eq!(ev[2]["choices"][0]["finish_reason"], "length");
    assert_eq!(ev[3]["choices"], json!([]));
    assert_eq!(
        ev[3]["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 0}})
    );
    assert_eq!(ev[4], "[DONE]");

    body["stream_options"]["include_usage"] = json!(false);
    let resp = send(&c, Method::POST, url, Some(body)).await;
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert_eq!(events(&text).len(), 4);
    assert!(!text.contains("usage"));
}

#[tokio::test]
async fn unknown_model_is_404_in_vllm_style() {
    let h = fast().await;
    let (status, v) = post(
        &client(),
        format!("{}/v1/chat/completions", h.url()),
        chat("nope", 5, false),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        v,
        json!({"error": {"message": "The model `nope` does not exist.", "type": "NotFoundError",
            "param": "model", "code": 404}})
    );
}

#[tokio::test]
async fn over_context_and_malformed_bodies_are_400() {
    let h = SimBackend::builder("m")
        .max_model_len(100)
        .time_scale(100.0)
        .start()
        .await
        .unwrap();
    let c = client();
    let (status, v) = post(
        &c,
        format!("{}/v1/chat/completions", h.url()),
        chat("m", 95, false),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["type"], "BadRequestError");
    assert_eq!(v["error"]["code"], 400);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with(
            "This model's maximum context length is 100 tokens. However, you requested 102 tokens"
        ),
        "{msg}"
    );

    let req = Request::post(format!("{}/v1/completions", h.url()))
        .body(Full::new(Bytes::from("{not json")))
        .unwrap();
    let resp = c.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let v: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["error"]["type"], "BadRequestError");
}

#[tokio::test]
async fn metrics_reflect_running_and_waiting_requests() {
    let h = SimBackend::builder("m")
        .max_num_seqs(2)
        .decode_step(Duration::from_millis(20), Duration::ZERO)
        .start()
        .await
        .unwrap();
    let c = client();
    let mut streams = Vec::new();
    for _ in 0..3 {
        let resp = send(
            &c,
            Method::POST,
            format!("{}/v1/chat/completions", h.url()),
            Some(chat("m", 1000, true)),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        streams.push(resp);
    }
    let text = scrape_until(&c, &h, |t| running(t) == 2.0 && waiting(t) == 1.0).await;
    let kv = sample(&text, "vllm:kv_cache_usage_perc{");
    assert!(kv > 0.0 && kv < 1.0, "{kv}");
    assert!(text.contains(
        "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"4096\"} 1.0"
    ));
    assert_eq!(h.stats().running, 2);
    drop(streams);
    let text = scrape_until(&c, &h, |t| running(t) == 0.0 && waiting(t) == 0.0).await;
    assert_eq!(sample(&text, "vllm:kv_cache_usage_perc{"), 0.0);
}

#[tokio::test]
async fn dropping_a_stream_midway_cancels_its_sequence() {
    let h = SimBackend::builder("m")
        .decode_step(Duration::from_millis(10), Duration::ZERO)
        .start()
        .await
        .unwrap();
    let c = client();
    let resp = send(
        &c,
        Method::POST,
        format!("{}/v1/chat/completions", h.url()),
        Some(chat("m", 1000, true)),
    )
    .await;
    let mut body = resp.into_body();
    for _ in 0..2 {
        body.frame().await.unwrap().unwrap();
    }
    assert_eq!(running(&scrape(&c, &h).await), 1.0);
    drop(body);
    let text = scrape_until(&c, &h, |t| running(t) == 0.0).await;
    assert_eq!(
        sample(
            &text,
            "vllm:request_success_total{engine=\"0\",model_name=\"m\",finished_reason=\"abort\"}"
        ),
        1.0
    );
    assert_eq!(h.stats().kv_blocks_used, 0);
}

#[tokio::test]
async fn fault_error_gives_500_and_unhealthy() {
    let h = fast().await;
    let c = client();
    assert_eq!(
        get(&c, format!("{}/health", h.url())).await.0,
        StatusCode::OK
    );
    h.set_fault(Fault::Error);
    let (status, v) = post(
        &c,
        format!("{}/v1/chat/completions", h.url()),
        chat("m", 5, false),
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(v["error"]["type"], "InternalServerError");
    assert_eq!(
        get(&c, format!("{}/health", h.url())).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    // /metrics still answers, as on a vLLM whose engine died.
    assert_eq!(
        get(&c, format!("{}/metrics", h.url())).await.0,
        StatusCode::OK
    );
    // A separate process can clear the fault over HTTP.
    let (status, _) = post(
        &c,
        format!("{}/admin/fault", h.url()),
        json!({"mode": "none"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        get(&c, format!("{}/health", h.url())).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn fault_hang_never_answers_and_shutdown_still_drains() {
    let h = fast().await;
    let c = client();
    let (status, _) = post(
        &c,
        format!("{}/admin/fault", h.url()),
        json!({"mode": "hang"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let hung = tokio::time::timeout(
        Duration::from_millis(200),
        send(&c, Method::GET, format!("{}/health", h.url()), None),
    )
    .await;
    assert!(hung.is_err(), "health answered under Fault::Hang");
    let pending = tokio::spawn({
        let c = c.clone();
        let url = format!("{}/v1/chat/completions", h.url());
        async move {
            send(&c, Method::POST, url, Some(chat("m", 5, false)))
                .await
                .status()
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    tokio::time::timeout(Duration::from_secs(5), h.shutdown())
        .await
        .expect("shutdown drained");
    assert_eq!(pending.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn embeddings_and_models_use_openai_formats() {
    let h = fast().await;
    let c = client();
    let body = json!({"model": "m", "input": ["abcd", "abcdefgh"]});
    let (status, v) = post(&c, format!("{}/v1/embeddings", h.url()), body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert_eq!(v["data"][1]["index"], 1);
    assert_eq!(v["data"][0]["embedding"].as_array().unwrap().len(), 8);
    assert_eq!(v["usage"], json!({"prompt_tokens": 3, "total_tokens": 3}));

    let (status, text) = get(&c, format!("{}/v1/models", h.url())).await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["data"][0]["id"], "m");
    assert_eq!(v["data"][0]["owned_by"], "vllm");
    assert_eq!(v["data"][0]["max_model_len"], 8192);
}

#[tokio::test]
async fn h2c_is_served_too() {
    let h = fast().await;
    let c: TestClient = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let (status, v) = post(
        &c,
        format!("{}/v1/chat/completions", h.url()),
        chat("m", 3, false),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn serve_stops_on_its_shutdown_future() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let cfg = SimBackendConfig {
        model: "m".to_owned(),
        engine: EngineParams::default(),
        fault: Fault::None,
        flavour: Flavour::Vllm,
        adapters: Vec::new(),
        residency_metrics: false,
        kv_events: None,
    };
    let server = tokio::spawn(serve(listener, cfg, async move {
        let _ = rx.await;
    }));
    let (status, _) = get(&client(), format!("http://{addr}/health")).await;
    assert_eq!(status, StatusCode::OK);
    tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn dropping_a_non_streaming_request_cancels_its_sequence() {
    let h = SimBackend::builder("m")
        .decode_step(Duration::from_millis(10), Duration::ZERO)
        .start()
        .await
        .unwrap();
    let c = client();
    let waiter = tokio::spawn({
        let c = c.clone();
        let url = format!("{}/v1/chat/completions", h.url());
        async move { send(&c, Method::POST, url, Some(chat("m", 1000, false))).await }
    });
    scrape_until(&c, &h, |t| running(t) == 1.0).await;
    waiter.abort();
    scrape_until(&c, &h, |t| running(t) == 0.0).await;
}

// ------------------------------------------------------------------ Triton

async fn triton(flavour: Flavour) -> SimHandle {
    SimBackend::builder("tensorrt_llm")
        .flavour(flavour)
        .decode_step(Duration::from_millis(5), Duration::ZERO)
        .start()
        .await
        .unwrap()
}

#[tokio::test]
async fn triton_flavour_serves_kserve_v2_and_the_generate_extension() {
    let h = triton(Flavour::TritonTrtllm).await;
    let c = client();
    let base = h.url();
    assert_eq!(
        get(&c, format!("{base}/v2/health/ready")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        get(&c, format!("{base}/v2/health/live")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        get(&c, format!("{base}/v2/models/tensorrt_llm/ready"))
            .await
            .0,
        StatusCode::OK
    );
    let (status, meta) = get(&c, format!("{base}/v2/models/tensorrt_llm")).await;
    assert_eq!(status, StatusCode::OK);
    let meta: Value = serde_json::from_str(&meta).unwrap();
    assert_eq!(meta["name"], "tensorrt_llm");
    assert_eq!(meta["platform"], "tensorrt_llm");
    // No OpenAI routes on Triton's HTTP port.
    let (status, _) = get(&c, format!("{base}/v1/models")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // generate: one JSON object; every shape of max tokens.
    for body in [
        json!({"text_input": "What is ML?", "max_tokens": 4}),
        json!({"text_input": "What is ML?", "parameters": {"max_tokens": 4}}),
        json!({"text_input": "What is ML?", "sampling_param_max_tokens": 4}),
    ] {
        let (status, v) = post(&c, format!("{base}/v2/models/tensorrt_llm/generate"), body).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["model_name"], "tensorrt_llm");
        assert_eq!(v["model_version"], "1");
        assert_eq!(v["text_output"], " tok".repeat(4));
    }
    // With a version in the path.
    let (status, _) = post(
        &c,
        format!("{base}/v2/models/tensorrt_llm/versions/1/generate"),
        json!({"text_input": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    // generate_stream: one `data:` event per token, then the stream closes.
    let resp = send(
        &c,
        Method::POST,
        format!("{base}/v2/models/tensorrt_llm/generate_stream"),
        Some(json!({"text_input": "What is ML?", "max_tokens": 3, "stream": true})),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers()["content-type"],
        "text/event-stream; charset=utf-8"
    );
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 3, "{text}");
    for e in &events {
        let v: Value = serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(v["text_output"], " tok");
    }
    assert!(!text.contains("[DONE]"));

    // Errors: Triton's shape, a plain string under "error".
    let (status, v) = post(
        &c,
        format!("{base}/v2/models/other/generate"),
        json!({"text_input": "x"}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        v["error"],
        "Request for unknown model: 'other' is not found"
    );
    let (status, v) = post(
        &c,
        format!("{base}/v2/models/tensorrt_llm/generate"),
        json!({"max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(v["error"].is_string(), "{v}");
    let (status, v) = post(
        &c,
        format!("{base}/v2/models/tensorrt_llm/infer"),
        json!({"inputs": []}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED);
    assert!(v["error"].as_str().unwrap().contains("decoupled"), "{v}");
}

#[tokio::test]
async fn triton_metrics_read_back_through_the_triton_dialect() {
    use crate::config::MetricsDialect;
    use crate::poller::Decoder;
    let h = triton(Flavour::TritonTrtllm).await;
    let c = client();
    // Two long requests in flight.
    let url = format!("{}/v2/models/tensorrt_llm/generate", h.url());
    let pending: Vec<_> = (0..2)
        .map(|_| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move {
                post(&c, url, json!({"text_input": "x", "max_tokens": 200})).await
            })
        })
        .collect();
    let text = scrape_until(&c, &h, |t| t.contains("request_type=\"scheduled\"} 2")).await;
    assert!(
        text.contains("nv_inference_pending_request_count{model=\"tensorrt_llm\",version=\"1\"} 0")
    );
    let mut d = Decoder::new(MetricsDialect::Triton);
    let r = d.decode(&text, crate::core::time::Instant::ZERO).unwrap();
    assert_eq!(r.running, Some(2));
    assert_eq!(r.waiting, Some(0));
    assert!(r.kv_usage.is_some_and(|k| k > 0.0), "{r:?}");
    assert_eq!(
        d.sources().kv_usage,
        Some("nv_trt_llm_kv_cache_block_metrics used/max")
    );
    for p in pending {
        assert_eq!(p.await.unwrap().0, StatusCode::OK);
    }
    let text = scrape(&c, &h).await;
    assert_eq!(sample(&text, "nv_inference_request_success{"), 2.0);

    // The vLLM-backend flavour: histograms, no KV, a pending count that is
    // not a queue.
    let h = triton(Flavour::TritonVllm).await;
    let (status, _) = post(
        &c,
        format!("{}/v2/models/tensorrt_llm/generate", h.url()),
        json!({"text_input": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let text = scrape(&c, &h).await;
    assert!(text.contains(
        "vllm:time_to_first_token_seconds_bucket{model=\"tensorrt_llm\",version=\"1\",le="
    ));
    assert!(!text.contains("nv_trt_llm"));
    let mut d = Decoder::new(MetricsDialect::Triton);
    let r = d.decode(&text, crate::core::time::Instant::ZERO).unwrap();
    assert_eq!((r.kv_usage, r.waiting), (None, None));
}
