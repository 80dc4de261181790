//! The proxy path end to end: a real gateway on port 0 in front of real
//! simulated backends, over TCP and SSE.

#![allow(clippy::disallowed_methods)] // tests time real streams with the wall clock

mod support;

use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use support::*;

const M: &str = "sim-model";

fn one_pool(extra_backends: usize) -> String {
    let mut s = format!(
        "{SERVER}\n[[pools]]\nmodel = \"{M}\"\ntimeout = \"2s\"\n[[pools.backends]]\nurl = \"http://{{b0}}\"\nmax_inflight = 64\n"
    );
    for i in 1..=extra_backends {
        s += &format!("[[pools.backends]]\nurl = \"http://{{b{i}}}\"\nmax_inflight = 64\n");
    }
    s
}

#[tokio::test]
async fn chat_non_streaming_is_relayed_with_usage() {
    let b = sim(M, 8).await;
    let gw = gateway(&one_pool(0), &[&b]).await;
    let r = send(
        &client(),
        post(gw.addr(), "/v1/chat/completions", None, chat(M, 5, false)),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["completion_tokens"], 5);
}

#[tokio::test]
async fn completions_and_models_list() {
    let b = sim(M, 8).await;
    let gw = gateway(&one_pool(0), &[&b]).await;
    let c = client();
    let body = serde_json::json!({"model": M, "prompt": "Once upon", "max_tokens": 3}).to_string();
    let r = send(&c, post(gw.addr(), "/v1/completions", None, body)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["object"], "text_completion");
    let r = get(&c, format!("http://{}/v1/models", gw.addr())).await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], M);
}

#[tokio::test]
async fn stream_is_byte_identical_and_first_chunk_arrives_early() {
    let b = sim(M, 8).await;
    let gw = gateway(&one_pool(0), &[&b]).await;
    let c = client();
    // Through the gateway (which asks the backend for usage and drops it).
    let started = Instant::now();
    let resp = open(
        &c,
        post(gw.addr(), "/v1/chat/completions", None, chat(M, 40, true)),
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
    let mut first = None;
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.unwrap();
        if let Ok(d) = frame.into_data() {
            first.get_or_insert_with(|| started.elapsed());
            bytes.extend_from_slice(&d);
        }
    }
    let total = started.elapsed();
    let first = first.unwrap();
    assert!(
        first * 3 < total,
        "first chunk at {first:?}, last at {total:?}"
    );
    // Directly from the backend: the same bytes, apart from ids and timestamps.
    let direct = send(
        &c,
        post(b.addr(), "/v1/chat/completions", None, chat(M, 40, true)),
    )
    .await;
    let normalise = |s: &str| -> Vec<String> {
        s.split("\n\n")
            .map(|e| {
                match e
                    .strip_prefix("data: ")
                    .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok())
                {
                    Some(mut v) => {
                        v["id"] = "x".into();
                        v["created"] = 0.into();
                        v.to_string()
                    }
                    None => e.to_owned(),
                }
            })
            .collect()
    };
    let via = String::from_utf8(bytes).unwrap();
    assert!(
        !via.contains("\"usage\""),
        "the usage chunk Fairway asked for is not shown: {via}"
    );
    assert_eq!(normalise(&via), normalise(&direct.text()));
    assert!(via.ends_with("data: [DONE]\n\n"));
}

#[tokio::test]
async fn stream_with_include_usage_keeps_the_usage_chunk() {
    let b = sim(M, 8).await;
    let gw = gateway(&one_pool(0), &[&b]).await;
    let body = serde_json::json!({"model": M, "prompt": "x", "max_tokens": 4, "stream": true,
                                  "stream_options": {"include_usage": true}})
    .to_string();
    let r = send(&client(), post(gw.addr(), "/v1/completions", None, body)).await;
    assert!(r.text().contains("\"usage\""), "{}", r.text());
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let b = sim(M, 8).await;
    let gw = gateway(&one_pool(0), &[&b]).await;
    let c = client();
    let r = send(
        &c,
        post(
            gw.addr(),
            "/v1/chat/completions",
            None,
            chat("nope", 5, false),
        ),
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let r = send(
        &c,
        post(gw.addr(), "/v1/chat/completions", None, "{not json"),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let r = send(
        &c,
        post(
            gw.addr(),
            "/v1/chat/completions",
            None,
            r#"{"messages":[]}"#,
        ),
    )
    .await;
    assert_eq!(r.status, 400);
    let big = format!(r#"{{"model":"{M}","prompt":"{}"}}"#, "a".repeat(70_000));
    let r = send(&c, post(gw.addr(), "/v1/completions", None, big)).await;
    assert_eq!(r.status, 413);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("65536")
    );
    // Backend errors pass through unchanged (vLLM's 400 for over-context).
    let body = serde_json::json!({"model": M, "prompt": "x", "max_tokens": 100_000}).to_string();
    let r = send(&c, post(gw.addr(), "/v1/completions", None, body)).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "BadRequestError");
    let metrics = scrape(&gw).await;
    assert_eq!(
        metric_sum(&metrics, "fairway_requests_total{"),
        5.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn dead_backend_is_503_at_once_and_slow_headers_504() {
    let b = sim(M, 8).await;
    let addr = b.addr();
    b.shutdown().await;
    let text = one_pool(0).replace("{b0}", &addr.to_string());
    let gw = gateway(&text, &[]).await;
    let c = client();
    // The poller's first probe finds nothing listening and ejects it; a
    // request that got there first fails its connection with the same effect.
    let ready = format!("http://{}/readyz", gw.admin_addr());
    assert!(
        eventually(Duration::from_secs(5), async || get(&c, ready.clone())
            .await
            .status
            == 503)
        .await
    );
    let started = Instant::now();
    let r = send(
        &c,
        post(gw.addr(), "/v1/chat/completions", None, chat(M, 5, false)),
    )
    .await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "no_healthy_backend");
    assert!(r.headers.contains_key("retry-after"));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "no wait in the queue"
    );

    let slow = sim(M, 8).await;
    slow.set_fault(fairway::sim::backend::Fault::Hang);
    // A slow poller, so that the hung health probe does not eject the
    // backend before the request's own timeout fires.
    let text = one_pool(0).replace("timeout = \"2s\"", "timeout = \"200ms\"")
        + "[poller]\ninterval = \"10s\"\n";
    let gw = gateway(&text, &[&slow]).await;
    let r = send(
        &client(),
        post(gw.addr(), "/v1/chat/completions", None, chat(M, 5, false)),
    )
    .await;
    assert_eq!(r.status, 504, "{}", r.text());
}

#[tokio::test]
async fn client_disconnect_cancels_the_backend_request() {
    let b = sim(M, 8).await;
    let gw = gateway(&one_pool(0), &[&b]).await;
    let c = client();
    let resp = open(
        &c,
        post(gw.addr(), "/v1/chat/completions", None, chat(M, 2000, true)),
    )
    .await;
    let mut body = resp.into_body();
    body.frame().await.unwrap().unwrap();
    let running = || async {
        let m = get(&client(), format!("http://{}/metrics", b.addr()))
            .await
            .text();
        metric(&m, "vllm:num_requests_running").unwrap_or(-1.0)
    };
    assert_eq!(running().await, 1.0);
    drop(body);
    assert!(
        eventually(Duration::from_secs(5), async || running().await == 0.0).await,
        "backend still runs it"
    );
    let gm = async || {
        get(&client(), format!("http://{}/metrics", gw.admin_addr()))
            .await
            .text()
    };
    assert!(
        eventually(Duration::from_secs(5), async || metric(
            &gm().await,
            "fairway_requests_total{tenant=\"default\",model=\"sim-model\",outcome=\"cancelled\""
        ) == Some(1.0))
        .await
    );
}

#[tokio::test]
async fn load_spreads_across_two_backends() {
    let (b0, b1) = (sim(M, 64).await, sim(M, 64).await);
    let gw = gateway(&one_pool(1), &[&b0, &b1]).await;
    let c = client();
    let mut streams = Vec::new();
    for _ in 0..10 {
        streams.push(
            open(
                &c,
                post(gw.addr(), "/v1/chat/completions", None, chat(M, 5000, true)),
            )
            .await,
        );
    }
    for b in [&b0, &b1] {
        let m = get(&c, format!("http://{}/metrics", b.addr())).await.text();
        // A request that arrived mid-step waits for the next step to join the batch.
        let held = metric(&m, "vllm:num_requests_running").unwrap()
            + metric(&m, "vllm:num_requests_waiting").unwrap();
        assert_eq!(held, 5.0, "least outstanding splits 10 as 5 + 5");
    }
    drop(streams);
}

#[tokio::test]
async fn h2c_prior_knowledge_is_served() {
    let b = sim(M, 8).await;
    let gw = gateway(&one_pool(0), &[&b]).await;
    let c: HttpClient =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build_http();
    let r = send(
        &c,
        post(gw.addr(), "/v1/chat/completions", None, chat(M, 3, false)),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn graceful_drain_finishes_an_in_flight_stream() {
    let b = sim(M, 8).await;
    let gw = gateway(&one_pool(0), &[&b]).await;
    let addr = gw.addr();
    let c = client();
    let resp = open(
        &c,
        post(addr, "/v1/chat/completions", None, chat(M, 1000, true)),
    )
    .await;
    let admin = gw.admin_addr();
    let stop = tokio::spawn(gw.shutdown());
    // While the stream drains, the client listener is closed and the admin
    // listener answers: /readyz says draining, /metrics still scrapes.
    assert!(
        eventually(Duration::from_secs(2), async || {
            tokio::net::TcpStream::connect(addr).await.is_err()
        })
        .await,
        "still accepting while draining"
    );
    let ready = get(&client(), format!("http://{admin}/readyz")).await;
    assert_eq!(ready.status, 503);
    assert_eq!(ready.text(), "draining\n");
    let m = get(&client(), format!("http://{admin}/metrics")).await;
    assert_eq!(m.status, 200);
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("stream completes during drain")
        .to_bytes();
    assert!(String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"));
    stop.await.unwrap();
    assert!(
        tokio::net::TcpStream::connect(admin).await.is_err(),
        "admin listener closed after the drain"
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}
