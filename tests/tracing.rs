//! Traces: a request's spans reach a local OTLP/HTTP receiver, joined to
//! the caller's trace, carrying the tenant; the backend receives a
//! `traceparent` whose parent is the gateway's upstream span.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use support::*;

const COMPLETION: &str = r#"{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}"#;

#[tokio::test]
async fn spans_reach_the_collector_and_the_backend_gets_traceparent() {
    let (collector, exported) = recorder("{}").await;
    let (backend, received) = recorder(COMPLETION).await;
    let text = format!(
        r#"{SERVER}
[telemetry]
otlp_endpoint = "http://{collector}"
service_name = "fairway-test"

[[pools]]
model = "m"
[[pools.backends]]
url = "http://{backend}"
metrics = "none"

[[tenants]]
name = "api"
api_keys = ["k-api"]
"#
    );
    let gw = gateway(&text, &[]).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let mut req = post(
        gw.addr(),
        "/v1/chat/completions",
        Some("k-api"),
        chat("m", 4, false),
    );
    req.headers_mut().insert(
        "traceparent",
        format!("00-{trace}-{caller_span}-01").parse().unwrap(),
    );
    let r = send(&client(), req).await;
    assert_eq!(r.status, 200, "{}", r.text());

    let mut spans = Vec::new();
    let arrived = eventually(Duration::from_secs(5), async || {
        spans = exported
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, body)| {
                let v: serde_json::Value = serde_json::from_slice(body).unwrap();
                v["resourceSpans"][0]["scopeSpans"][0]["spans"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
        spans.iter().any(|s| s["name"] == "fairway.request")
    })
    .await;
    assert!(arrived, "no spans exported");
    let by_name = |n: &str| spans.iter().find(|s| s["name"] == n).unwrap().clone();
    let root = by_name("fairway.request");
    assert!(spans.iter().all(|s| s["traceId"] == trace), "{spans:#?}");
    assert_eq!(root["parentSpanId"], caller_span);
    let attr = |s: &serde_json::Value, k: &str| {
        s["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["key"] == k)
            .map(|a| a["value"].clone())
    };
    assert_eq!(attr(&root, "fairway.tenant").unwrap()["stringValue"], "api");
    assert_eq!(
        attr(&root, "fairway.outcome").unwrap()["stringValue"],
        "served"
    );
    for child in [
        "fairway.admission",
        "fairway.queue",
        "fairway.upstream",
        "fairway.stream",
    ] {
        assert_eq!(by_name(child)["parentSpanId"], root["spanId"], "{child}");
    }
    // The backend's parent is the upstream span, in the caller's trace;
    // the collector was told the service name.
    let upstream = by_name("fairway.upstream");
    // (The poller's health probes are recorded too; the request is the POST.)
    let got = received
        .lock()
        .unwrap()
        .iter()
        .find(|(h, _)| h.contains_key("content-length"))
        .map(|(h, _)| h["traceparent"].to_str().unwrap().to_owned())
        .unwrap();
    assert_eq!(
        got,
        format!("00-{trace}-{}-01", upstream["spanId"].as_str().unwrap())
    );
    let body: serde_json::Value = serde_json::from_slice(&exported.lock().unwrap()[0].1).unwrap();
    assert_eq!(
        body["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
        "fairway-test"
    );
    assert_eq!(
        exported.lock().unwrap()[0].0["content-type"],
        "application/json"
    );
}

#[tokio::test]
async fn without_an_endpoint_the_client_traceparent_passes_through_untouched() {
    let (backend, received) = recorder(COMPLETION).await;
    let text = format!(
        "{SERVER}\n[[pools]]\nmodel = \"m\"\n[[pools.backends]]\nurl = \"http://{backend}\"\nmetrics = \"none\"\n"
    );
    let gw = gateway(&text, &[]).await;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut req = post(gw.addr(), "/v1/chat/completions", None, chat("m", 4, false));
    req.headers_mut().insert("traceparent", tp.parse().unwrap());
    assert_eq!(send(&client(), req).await.status, 200);
    let seen = received.lock().unwrap();
    let posts: Vec<_> = seen
        .iter()
        .filter(|(h, _)| h.contains_key("content-length"))
        .collect();
    assert_eq!(posts.last().unwrap().0["traceparent"], tp);
}
