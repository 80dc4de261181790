//! The routes beyond chat: the Responses API, Anthropic's Messages, vLLM's
//! pooling and tokenizer routes, and `n`. A real gateway in front of two
//! simulated vLLM backends over TCP; the requests carry the wire shape the
//! official `openai` and `anthropic` SDKs send (headers and bodies).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use support::*;

/// A request as the `anthropic` SDK sends it: `x-api-key` and
/// `anthropic-version`.
fn anthropic(addr: std::net::SocketAddr, key: &str, body: &str) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}/v1/messages"))
        .header("content-type", "application/json")
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap()
}

fn with_method(method: http::Method, url: String, key: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(url)
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// `fairway_completion_tokens_total` of a tenant.
async fn completion_tokens(gw: &fairway::edge::server::Server, tenant: &str) -> f64 {
    let text = scrape(gw).await;
    metric_sum(
        &text,
        &format!("fairway_completion_tokens_total{{tenant=\"{tenant}\""),
    )
}

#[tokio::test]
async fn responses_are_scheduled_settled_and_found_again_by_their_creator() {
    let (_b, gw) = two_tenant_gateway().await;
    let c = client();
    let addr = gw.addr();
    // `client.responses.create(model=..., input=..., max_output_tokens=5)`.
    let body = r#"{"model":"m","input":[{"role":"user","content":"Say hello"}],"instructions":"Be brief.","max_output_tokens":5}"#;
    let r = send(&c, post(addr, "/v1/responses", Some("ka"), body)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "response");
    assert_eq!(v["usage"]["output_tokens"], 5);
    // Rate-limit headers on a success, as on chat.
    assert_eq!(r.headers["x-ratelimit-limit-requests"], "50");
    let id = v["id"].as_str().unwrap().to_owned();
    assert_eq!(completion_tokens(&gw, "alpha").await, 5.0);

    // Streamed: every event passes, usage is settled from
    // `response.incomplete`/`response.completed`, and nothing is added.
    let body = r#"{"model":"m","input":"Count to three","max_output_tokens":3,"stream":true}"#;
    let r = send(&c, post(addr, "/v1/responses", Some("ka"), body)).await;
    assert_eq!(r.status, StatusCode::OK);
    let text = r.text();
    assert!(
        text.starts_with("event: response.created\ndata: {"),
        "{text}"
    );
    assert_eq!(text.matches("event: response.output_text.delta").count(), 3);
    assert!(!text.contains("[DONE]") && !text.contains("stream_options"));
    assert!(text.ends_with("\n\n"));
    assert_eq!(completion_tokens(&gw, "alpha").await, 8.0);
    let streamed_id = text
        .split("\"id\":\"")
        .find(|s| s.starts_with("resp_"))
        .and_then(|s| s.split('"').next())
        .unwrap()
        .to_owned();

    // Found again on the backend that made it, by its own tenant only.
    for id in [&id, &streamed_id] {
        let url = format!("http://{addr}/v1/responses/{id}");
        let r = send(&c, with_method(http::Method::GET, url.clone(), "ka")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.json()["id"], id.as_str());
        for url in [
            url.clone(),
            format!("{url}?include=x"),
            format!("{url}/input_items"),
        ] {
            let r = send(&c, with_method(http::Method::GET, url, "kb")).await;
            assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());
            assert_eq!(r.json()["error"]["code"], "response_not_found");
        }
    }
    let r = send(
        &c,
        with_method(
            http::Method::GET,
            format!("http://{addr}/v1/responses/resp_unknown"),
            "ka",
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = get(&c, format!("http://{addr}/v1/responses/{id}")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "no key, no answer");

    // Deleted on its backend: gone from there afterwards.
    let url = format!("http://{addr}/v1/responses/{id}");
    let r = send(&c, with_method(http::Method::DELETE, url.clone(), "ka")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["deleted"], true);
    let r = send(&c, with_method(http::Method::GET, url, "ka")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    // Only the inference calls were counted as requests.
    let text = scrape(&gw).await;
    let served = metric_sum(
        &text,
        "fairway_requests_total{tenant=\"alpha\",model=\"m\",outcome=\"served\"",
    );
    assert_eq!(served, 2.0);
}

#[tokio::test]
async fn anthropic_messages_pass_with_x_api_key_and_refusals_are_in_anthropics_shape() {
    let (_b, gw) = two_tenant_gateway().await;
    let c = client();
    let addr = gw.addr();
    let body = r#"{"model":"m","max_tokens":4,"system":"You are terse.","messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}]}"#;
    let r = send(&c, anthropic(addr, "ka", body)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["usage"]["output_tokens"], 4);
    assert_eq!(completion_tokens(&gw, "alpha").await, 4.0);

    // Streamed: the typed events pass untouched; usage from
    // `message_start` (input) and `message_delta` (output).
    let body =
        r#"{"model":"m","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"Hi"}]}"#;
    let r = send(&c, anthropic(addr, "ka", body)).await;
    assert_eq!(r.status, StatusCode::OK);
    let text = r.text();
    let kinds: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(kinds.first(), Some(&"message_start"));
    assert_eq!(kinds.last(), Some(&"message_stop"));
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "content_block_delta")
            .count(),
        3
    );
    assert_eq!(completion_tokens(&gw, "alpha").await, 7.0);
    let text = scrape(&gw).await;
    assert!(metric_sum(&text, "fairway_prompt_tokens_total{tenant=\"alpha\"") > 0.0);

    // Beta's one request of burst, then a 429 in Anthropic's error shape
    // with `retry-after`, which the SDK honours.
    let body = r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"Hi"}]}"#;
    assert_eq!(
        send(&c, anthropic(addr, "kb", body)).await.status,
        StatusCode::OK
    );
    let r = send(&c, anthropic(addr, "kb", body)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let v = r.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("beta"));
    assert!(r.headers.contains_key("retry-after"));

    // A bad key and a malformed body, in the same shape.
    let r = send(&c, anthropic(addr, "nope", body)).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    let r = send(&c, anthropic(addr, "ka", "{not json")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");

    // count_tokens passes with the key, unqueued.
    let req = Request::post(format!("http://{addr}/v1/messages/count_tokens"))
        .header("x-api-key", "ka")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"user","content":"hello world"}]}"#,
        )))
        .unwrap();
    let r = send(&c, req).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(r.json()["input_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn pooling_routes_cost_their_input_and_tokenizer_routes_are_not_queued() {
    let (_b, gw) = two_tenant_gateway().await;
    let c = client();
    let addr = gw.addr();
    let cases = [
        (
            "/v1/rerank",
            r#"{"model":"m","query":"q","documents":["doc one","doc two"]}"#,
        ),
        (
            "/v1/score",
            r#"{"model":"m","text_1":"a","text_2":["b","c"]}"#,
        ),
        ("/classify", r#"{"model":"m","input":["good","bad"]}"#),
        ("/pooling", r#"{"model":"m","input":"vector me"}"#),
    ];
    for (path, body) in cases {
        let r = send(&c, post(addr, path, Some("ka"), body)).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text());
    }
    let text = scrape(&gw).await;
    let served = metric_sum(
        &text,
        "fairway_requests_total{tenant=\"alpha\",model=\"m\",outcome=\"served\"",
    );
    assert_eq!(served, 4.0);
    assert_eq!(completion_tokens(&gw, "alpha").await, 0.0);
    assert!(metric_sum(&text, "fairway_prompt_tokens_total{tenant=\"alpha\"") > 0.0);

    // Beta spends its one request; the tokenizer still answers it, since
    // those calls are not admitted.
    let chat = chat("m", 1, false);
    assert_eq!(
        send(
            &c,
            post(addr, "/v1/chat/completions", Some("kb"), chat.clone())
        )
        .await
        .status,
        StatusCode::OK
    );
    assert_eq!(
        send(&c, post(addr, "/v1/chat/completions", Some("kb"), chat))
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let r = send(
        &c,
        post(
            addr,
            "/tokenize",
            Some("kb"),
            r#"{"model":"m","prompt":"hello world"}"#,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["count"], 3);
    let r = send(
        &c,
        post(
            addr,
            "/detokenize",
            Some("kb"),
            r#"{"model":"m","tokens":[1,2]}"#,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    // But with a key, and for a model the policy has.
    let r = send(
        &c,
        post(addr, "/tokenize", None, r#"{"model":"m","prompt":"x"}"#),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = send(
        &c,
        post(
            addr,
            "/tokenize",
            Some("ka"),
            r#"{"model":"other","prompt":"x"}"#,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
}

#[tokio::test]
async fn n_choices_are_served_and_counted() {
    let (_b, gw) = two_tenant_gateway().await;
    let c = client();
    let addr = gw.addr();
    let body = r#"{"model":"m","n":3,"max_tokens":2,"messages":[{"role":"user","content":"Hi"}]}"#;
    let r = send(&c, post(addr, "/v1/chat/completions", Some("ka"), body)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"].as_array().unwrap().len(), 3);
    assert_eq!(v["usage"]["completion_tokens"], 6);
    assert_eq!(completion_tokens(&gw, "alpha").await, 6.0);
    // Streamed without `include_usage`: each choice's chunks, and the
    // usage Fairway asked for is read and dropped.
    let body = r#"{"model":"m","n":2,"max_tokens":2,"stream":true,"messages":[{"role":"user","content":"Hi"}]}"#;
    let r = send(&c, post(addr, "/v1/chat/completions", Some("ka"), body)).await;
    let text = r.text();
    assert!(
        text.contains("\"index\":1") && !text.contains("\"usage\""),
        "{text}"
    );
    assert_eq!(completion_tokens(&gw, "alpha").await, 10.0);
}

#[tokio::test]
async fn every_new_route_refuses_cleanly_with_one_outcome_each() {
    let (_b, gw) = two_tenant_gateway().await;
    let c = client();
    let addr = gw.addr();
    let routes = [
        "/v1/responses",
        "/v1/messages",
        "/v1/rerank",
        "/rerank",
        "/v2/rerank",
        "/v1/score",
        "/score",
        "/classify",
        "/pooling",
    ];
    let oversized = format!(r#"{{"model":"m","input":"{}"}}"#, "x".repeat(70_000));
    for route in routes {
        let r = send(&c, post(addr, route, None, r#"{"model":"m","input":"x"}"#)).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{route}");
        let r = send(
            &c,
            post(addr, route, Some("ka"), r#"{"model":"nope","input":"x"}"#),
        )
        .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{route}");
        let r = send(&c, post(addr, route, Some("ka"), oversized.clone())).await;
        assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{route}");
        // Each in its route's error shape.
        let v = r.json();
        if route == "/v1/messages" {
            assert_eq!(v["type"], "error", "{route}");
            assert!(v["error"]["type"].is_string(), "{route}");
        } else {
            assert!(v["error"]["message"].is_string(), "{route}");
        }
    }
    let text = scrape(&gw).await;
    assert_eq!(
        metric_sum(&text, "fairway_requests_total{"),
        (routes.len() * 3) as f64,
        "{text}"
    );
}
