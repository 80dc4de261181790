//! Triton backends: a real gateway in front of a simulated Triton
//! (TensorRT-LLM flavour, Triton's wire format and metric names) and a
//! simulated vLLM in one pool. `/v2` generate calls go to the Triton
//! backend under its own model name, OpenAI calls to vLLM; errors on `/v2`
//! routes keep Triton's `{"error": "..."}` shape.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use fairway::sim::backend::{Flavour, SimBackend};
use http_body_util::BodyExt;
use support::*;

const KEY: &str = "sk-triton";

async fn triton_sim() -> fairway::sim::backend::SimHandle {
    SimBackend::builder("tensorrt_llm")
        .flavour(Flavour::TritonTrtllm)
        .decode_step(Duration::from_millis(20), Duration::ZERO)
        .start()
        .await
        .unwrap()
}

fn policy(triton: std::net::SocketAddr, vllm: std::net::SocketAddr) -> String {
    format!(
        "{SERVER}\n[[pools]]\nmodel = \"llama\"\n\
         [[pools.backends]]\nurl = \"http://{vllm}\"\n\
         [[pools.backends]]\nurl = \"http://{triton}\"\nprotocol = \"triton\"\nserved_model = \"tensorrt_llm\"\n\
         [[tenants]]\nname = \"a\"\napi_keys = [\"{KEY}\"]\n\
         [[tenants]]\nname = \"slow\"\napi_keys = [\"sk-slow\"]\nrate = 0.01\nburst = 1\n"
    )
}

fn generate(max_tokens: u32) -> String {
    format!(r#"{{"text_input": "What is machine learning?", "max_tokens": {max_tokens}}}"#)
}

#[tokio::test]
async fn generate_calls_reach_the_triton_backend_and_openai_calls_the_vllm_one() {
    let t = triton_sim().await;
    let v = sim("llama", 8).await;
    let gw = gateway(&policy(t.addr(), v.addr()), &[]).await;
    let c = client();

    // generate: one JSON object from the Triton backend, under its name.
    let r = send(
        &c,
        post(
            gw.addr(),
            "/v2/models/llama/generate",
            Some(KEY),
            generate(4),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    assert_eq!(body["model_name"], "tensorrt_llm");
    assert_eq!(body["text_output"], " tok".repeat(4));
    // With a version in the path, too.
    let r = send(
        &c,
        post(
            gw.addr(),
            "/v2/models/llama/versions/1/generate",
            Some(KEY),
            generate(1),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());

    // generate_stream: the backend's bytes, event by event; the first long
    // before the last (20 tokens of 20 ms).
    let started = tokio::time::Instant::now();
    let resp = open(
        &c,
        post(
            gw.addr(),
            "/v2/models/llama/generate_stream",
            Some(KEY),
            generate(20),
        ),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut body = resp.into_body();
    let mut relayed = Vec::new();
    let mut first = None;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            first.get_or_insert_with(|| started.elapsed());
            relayed.extend_from_slice(&data);
        }
    }
    let total = started.elapsed();
    let first = first.unwrap();
    assert!(
        first * 4 < total,
        "first event at {first:?}, last at {total:?}"
    );
    let direct = send(
        &c,
        post(
            t.addr(),
            "/v2/models/tensorrt_llm/generate_stream",
            None,
            generate(20),
        ),
    )
    .await;
    assert_eq!(
        relayed,
        direct.body.to_vec(),
        "the stream is relayed byte for byte"
    );

    // OpenAI calls for the same model go to the vLLM backend.
    let r = send(
        &c,
        post(
            gw.addr(),
            "/v1/chat/completions",
            Some(KEY),
            chat("llama", 2, false),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["object"], "chat.completion");

    // Triton's health routes, answered from the pool.
    let base = format!("http://{}", gw.addr());
    assert_eq!(get(&c, format!("{base}/v2/health/live")).await.status, 200);
    assert_eq!(get(&c, format!("{base}/v2/health/ready")).await.status, 200);
    assert_eq!(
        get(&c, format!("{base}/v2/models/llama/ready"))
            .await
            .status,
        200
    );
    assert_eq!(
        get(&c, format!("{base}/v2/models/other/ready"))
            .await
            .status,
        400
    );
    // What the key may call over Triton's API; a key is needed.
    let r = send(
        &c,
        http::Request::get(format!("{base}/v2/models"))
            .header("authorization", format!("Bearer {KEY}"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["models"][0]["name"], "llama");
    let r = get(&c, format!("{base}/v2/models")).await;
    assert_eq!(r.status, 401);
    assert!(r.json()["error"].is_string(), "{}", r.text());
    // The model's metadata, from the Triton backend, under the pool's name.
    let r = get(&c, format!("{base}/v2/models/llama")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["name"], "llama");
    assert_eq!(r.json()["platform"], "tensorrt_llm");
    let r = get(&c, format!("{base}/v2/models/other")).await;
    assert_eq!(r.status, 404);
    assert!(r.json()["error"].is_string(), "{}", r.text());

    // Every request ended in exactly one outcome, and the Triton calls'
    // output tokens (4 + 1 + 20, read from the responses) are counted with
    // the OpenAI call's 2.
    let m = scrape(&gw).await;
    assert_eq!(
        metric_sum(&m, "fairway_requests_total{tenant=\"a\""),
        4.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "fairway_completion_tokens_total{tenant=\"a\""),
        27.0,
        "{m}"
    );
}

#[tokio::test]
async fn errors_on_v2_routes_keep_tritons_shape() {
    let t = triton_sim().await;
    let v = sim("llama", 8).await;
    let gw = gateway(&policy(t.addr(), v.addr()), &[]).await;
    let c = client();
    let shape = |r: &Reply| {
        let body = r.json();
        assert!(
            body["error"].is_string(),
            "not Triton's shape: {}",
            r.text()
        );
    };
    // No key: 401.
    let r = send(
        &c,
        post(gw.addr(), "/v2/models/llama/generate", None, generate(1)),
    )
    .await;
    assert_eq!(r.status, 401);
    shape(&r);
    // The rate limit: 429 with retry-after.
    let slow = |n| {
        post(
            gw.addr(),
            "/v2/models/llama/generate",
            Some("sk-slow"),
            generate(n),
        )
    };
    assert_eq!(send(&c, slow(1)).await.status, 200);
    let r = send(&c, slow(1)).await;
    assert_eq!(r.status, 429);
    shape(&r);
    assert!(r.headers.contains_key("retry-after"));
    // An unknown model, and a malformed body.
    let r = send(
        &c,
        post(
            gw.addr(),
            "/v2/models/nope/generate",
            Some(KEY),
            generate(1),
        ),
    )
    .await;
    assert_eq!(r.status, 404);
    shape(&r);
    let r = send(
        &c,
        post(gw.addr(), "/v2/models/llama/generate", Some(KEY), "{"),
    )
    .await;
    assert_eq!(r.status, 400);
    shape(&r);
    // A route Fairway does not carry, in Triton's shape too.
    let r = send(
        &c,
        post(gw.addr(), "/v2/models/llama/config", Some(KEY), "{}"),
    )
    .await;
    assert_eq!(r.status, 404);
    shape(&r);
    // An infer call on the decoupled LLM: Triton's own 501 comes back.
    let infer =
        r#"{"inputs":[{"name":"text_input","shape":[1],"datatype":"BYTES","data":["hi"]}]}"#;
    let r = send(
        &c,
        post(gw.addr(), "/v2/models/llama/infer", Some(KEY), infer),
    )
    .await;
    assert_eq!(r.status, 501);
    assert!(
        r.json()["error"].as_str().unwrap().contains("decoupled"),
        "{}",
        r.text()
    );
    // The backend's own error passes through as it is.
    let r = send(
        &c,
        post(
            gw.addr(),
            "/v2/models/llama/generate",
            Some(KEY),
            r#"{"max_tokens": 2}"#,
        ),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"], "expected 'text_input' in the request");
}

#[tokio::test]
async fn a_client_that_hangs_up_on_a_stream_ends_the_backends_work() {
    let t = triton_sim().await;
    let v = sim("llama", 8).await;
    let gw = gateway(&policy(t.addr(), v.addr()), &[]).await;
    let c = client();
    let mut req = post(
        gw.addr(),
        "/v2/models/llama/generate_stream",
        Some(KEY),
        generate(500),
    );
    req.headers_mut().insert(
        "triton-request-id",
        http::HeaderValue::from_static("call-42"),
    );
    let resp = open(&c, req).await;
    let mut body = resp.into_body();
    let _ = body.frame().await.unwrap().unwrap();
    drop(body);
    // The backend's sequence is cancelled: Triton counts it CANCELED.
    let cancelled = eventually(Duration::from_secs(5), async || {
        let m = get(&client(), format!("http://{}/metrics", t.addr())).await.text();
        metric(&m, "nv_inference_request_failure{model=\"tensorrt_llm\",version=\"1\",reason=\"CANCELED\"}")
            == Some(1.0)
    })
    .await;
    assert!(cancelled);
    // The call was tagged: the LLM-API model's stop request went too
    // (with the same triton-request-id), and the call is cancelled once.
    assert!(eventually(Duration::from_secs(5), async || t.stop_requests() == 1).await);
    let m = get(&client(), format!("http://{}/metrics", t.addr()))
        .await
        .text();
    assert_eq!(
        metric(
            &m,
            "nv_inference_request_failure{model=\"tensorrt_llm\",version=\"1\",reason=\"CANCELED\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn weights_three_to_one_hold_for_generate_calls() {
    // Two Triton backends with a window of 2 each: 4 requests run, the
    // rest queue in the gateway's fair queue.
    let (b0, b1) = (triton_sim().await, triton_sim().await);
    let text = format!(
        "{SERVER}\n[queue]\nmax_wait = \"20s\"\n[[pools]]\nmodel = \"llama\"\n\
         [[pools.backends]]\nurl = \"http://{}\"\nprotocol = \"triton\"\nserved_model = \"tensorrt_llm\"\nmax_inflight = 2\n\
         [[pools.backends]]\nurl = \"http://{}\"\nprotocol = \"triton\"\nserved_model = \"tensorrt_llm\"\nmax_inflight = 2\n\
         [[tenants]]\nname = \"api\"\napi_keys = [\"sk-api\"]\nweight = 3\non_late = \"serve\"\n\
         [[tenants]]\nname = \"chat\"\napi_keys = [\"sk-chat\"]\nweight = 1\non_late = \"serve\"\n",
        b0.addr(),
        b1.addr()
    );
    let gw = gateway(&text, &[]).await;
    let addr = gw.addr();
    let start = tokio::time::Instant::now();
    let stop = start + Duration::from_millis(3000);
    // Only completions while both tenants are backlogged count.
    let window = (
        start + Duration::from_millis(500),
        start + Duration::from_millis(2500),
    );
    let mut tasks = Vec::new();
    for key in ["sk-api", "sk-chat"] {
        for _ in 0..16 {
            tasks.push(tokio::spawn(async move {
                let c = client();
                let mut n = 0u32;
                while tokio::time::Instant::now() < stop {
                    let r = send(
                        &c,
                        post(addr, "/v2/models/llama/generate", Some(key), generate(3)),
                    )
                    .await;
                    assert_eq!(r.status, 200, "{}", r.text());
                    let done = tokio::time::Instant::now();
                    n += u32::from(window.0 <= done && done < window.1);
                }
                (key, n)
            }));
        }
    }
    let mut served = [0u32; 2];
    for t in tasks {
        let (key, n) = t.await.unwrap();
        served[usize::from(key == "sk-chat")] += n;
    }
    let ratio = f64::from(served[0]) / f64::from(served[1]);
    eprintln!("generate, weights 3:1: served {served:?} ({ratio:.2})");
    assert!(
        (ratio - 3.0).abs() <= 0.3,
        "served api:chat = {served:?} ({ratio:.2})"
    );
}

#[tokio::test]
async fn triton_kv_readings_steer_requests_away_from_a_full_backend() {
    // One backend with a small KV cache that long requests fill; the
    // other with room. The poller reads Triton's block metrics.
    let small = SimBackend::builder("tensorrt_llm")
        .flavour(Flavour::TritonTrtllm)
        .kv_tokens(2048)
        .decode_step(Duration::from_millis(20), Duration::ZERO)
        .start()
        .await
        .unwrap();
    let big = triton_sim().await;
    let text = format!(
        "{SERVER}\n[poller]\ninterval = \"50ms\"\n[[pools]]\nmodel = \"llama\"\nkv_high_watermark = 0.5\n\
         [[pools.backends]]\nname = \"small\"\nurl = \"http://{}\"\nprotocol = \"triton\"\nserved_model = \"tensorrt_llm\"\n\
         [[pools.backends]]\nname = \"big\"\nurl = \"http://{}\"\nprotocol = \"triton\"\nserved_model = \"tensorrt_llm\"\n\
         [[tenants]]\nname = \"a\"\napi_keys = [\"{KEY}\"]\n",
        small.addr(),
        big.addr()
    );
    let gw = gateway(&text, &[]).await;
    let c = client();
    // Fill the small one: direct requests whose prompts take most of its
    // cache, held for a while.
    let prompt = "word ".repeat(1500);
    let filler: Vec<_> = (0..2)
        .map(|_| {
            let (c, addr, prompt) = (c.clone(), small.addr(), prompt.clone());
            tokio::spawn(async move {
                let body = format!(r#"{{"text_input": "{prompt}", "max_tokens": 100}}"#);
                send(
                    &c,
                    post(addr, "/v2/models/tensorrt_llm/generate", None, body),
                )
                .await
            })
        })
        .collect();
    let admin = gw.admin_addr();
    let full = eventually(Duration::from_secs(5), async || {
        let m = get(&client(), format!("http://{admin}/metrics"))
            .await
            .text();
        metric(&m, "fairway_backend_kv_usage_ratio{backend=\"small\"").is_some_and(|k| k >= 0.5)
    })
    .await;
    assert!(full, "the gateway never read the small backend's KV");
    let m = get(&c, format!("http://{admin}/metrics")).await.text();
    assert!(
        m.contains("fairway_backend_reading_source{backend=\"small\",model=\"llama\",signal=\"kv_usage\",source=\"nv_trt_llm_kv_cache_block_metrics used/max\"} 1"),
        "{m}"
    );
    // While it is full, every generate call goes to the other.
    for _ in 0..10 {
        let r = send(
            &c,
            post(
                gw.addr(),
                "/v2/models/llama/generate",
                Some(KEY),
                generate(1),
            ),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let m = get(&c, format!("http://{}/metrics", big.addr()))
        .await
        .text();
    assert_eq!(
        metric(
            &m,
            "nv_inference_request_success{model=\"tensorrt_llm\",version=\"1\"}"
        ),
        Some(10.0),
        "{m}"
    );
    for f in filler {
        f.await.unwrap();
    }
}

#[tokio::test]
async fn infer_calls_on_a_classic_model_pass_through_untouched() {
    let embedder = SimBackend::builder("embedder_onnx")
        .flavour(Flavour::TritonTensor)
        .start()
        .await
        .unwrap();
    let text = format!(
        "{SERVER}\n[[pools]]\nmodel = \"embedder\"\n\
         [[pools.backends]]\nurl = \"http://{}\"\nprotocol = \"triton\"\nserved_model = \"embedder_onnx\"\n\
         [[tenants]]\nname = \"a\"\napi_keys = [\"{KEY}\"]\n",
        embedder.addr()
    );
    let gw = gateway(&text, &[]).await;
    let c = client();
    // JSON tensors.
    let body = r#"{"id":"req-7","inputs":[{"name":"INPUT0","shape":[1,3],"datatype":"FP32","data":[1.0,2.0,3.0]}]}"#;
    let r = send(
        &c,
        post(gw.addr(), "/v2/models/embedder/infer", Some(KEY), body),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["model_name"], "embedder_onnx");
    assert_eq!(v["id"], "req-7");
    assert_eq!(v["outputs"][0]["datatype"], "FP32");
    // The binary-tensor extension: a JSON header, then raw bytes, with its
    // length in Inference-Header-Content-Length, passed on as it is.
    let header = r#"{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}]}"#;
    let mut raw = header.as_bytes().to_vec();
    raw.extend_from_slice(&[0u8; 16]);
    let mut req = post(gw.addr(), "/v2/models/embedder/infer", Some(KEY), raw);
    req.headers_mut().insert(
        "inference-header-content-length",
        http::HeaderValue::from(header.len()),
    );
    req.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/octet-stream"),
    );
    let r = send(&c, req).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // A body that is not what the header says: 400 in Triton's shape.
    let mut req = post(gw.addr(), "/v2/models/embedder/infer", Some(KEY), "{}");
    req.headers_mut().insert(
        "inference-header-content-length",
        http::HeaderValue::from(999),
    );
    let r = send(&c, req).await;
    assert_eq!(r.status, 400);
    assert!(r.json()["error"].is_string(), "{}", r.text());
    // One outcome each; the backend saw the two good ones.
    let m = scrape(&gw).await;
    assert_eq!(
        metric_sum(&m, "fairway_requests_total{tenant=\"a\""),
        3.0,
        "{m}"
    );
    let m = get(&c, format!("http://{}/metrics", embedder.addr()))
        .await
        .text();
    assert_eq!(
        metric(
            &m,
            "nv_inference_request_success{model=\"embedder_onnx\",version=\"1\"}"
        ),
        Some(2.0),
        "{m}"
    );
}

#[tokio::test]
async fn interactive_generate_preempts_young_batch_generate_work() {
    // One Triton backend with a window of 2, filled by two long batch
    // generate calls; an interactive call takes a slot from the youngest.
    let b = SimBackend::builder("tensorrt_llm")
        .flavour(Flavour::TritonTrtllm)
        .max_num_seqs(8)
        .decode_step(Duration::from_millis(2), Duration::from_micros(10))
        .start()
        .await
        .unwrap();
    let text = format!(
        "{SERVER}\n[preemption]\nmin_wait = \"50ms\"\n[[pools]]\nmodel = \"llama\"\n\
         [[pools.backends]]\nurl = \"http://{}\"\nprotocol = \"triton\"\nserved_model = \"tensorrt_llm\"\nmax_inflight = 2\n\
         [[tenants]]\nname = \"jobs\"\napi_keys = [\"sk-jobs\"]\npriority = \"batch\"\n\
         [[tenants]]\nname = \"app\"\napi_keys = [\"sk-app\"]\n",
        b.addr()
    );
    let gw = gateway(&text, &[]).await;
    let addr = gw.addr();
    let jobs: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(async move {
                send(
                    &client(),
                    post(
                        addr,
                        "/v2/models/llama/generate",
                        Some("sk-jobs"),
                        generate(1000),
                    ),
                )
                .await
                .status
            })
        })
        .collect();
    while b.stats().running < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let start = tokio::time::Instant::now();
    let r = send(
        &client(),
        post(
            addr,
            "/v2/models/llama/generate",
            Some("sk-app"),
            generate(5),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let latency = start.elapsed();
    assert!(latency < Duration::from_millis(1000), "waited {latency:?}");
    for j in jobs {
        assert_eq!(j.await.unwrap(), 200);
    }
    let m = get(&client(), format!("http://{}/metrics", gw.admin_addr()))
        .await
        .text();
    assert_eq!(
        metric(&m, "fairway_preemptions_total{tenant=\"jobs\"}"),
        Some(1.0),
        "{m}"
    );
    // The preempted first run was cancelled at the backend, not finished.
    let bm = get(&client(), format!("http://{}/metrics", b.addr()))
        .await
        .text();
    assert_eq!(
        metric(
            &bm,
            "nv_inference_request_failure{model=\"tensorrt_llm\",version=\"1\",reason=\"CANCELED\"}"
        ),
        Some(1.0),
        "{bm}"
    );
}
