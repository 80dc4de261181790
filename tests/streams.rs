//! Streams end honestly, against a real gateway in front of simulated
//! backends over real TCP: a backend that sends its stream with a
//! `Content-Length` while Fairway drops the usage chunk it asked for, and a
//! backend whose stream is cut mid-way.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use fairway::sim::backend::Fault;
use support::*;

const M: &str = "m";
const KEY: &str = "sk-streams";

fn policy() -> String {
    format!(
        "{SERVER}\n[[pools]]\nmodel = \"{M}\"\neject_after_failures = 100\n[[pools.backends]]\nurl = \"http://{{b0}}\"\n\
         [[tenants]]\nname = \"a\"\napi_keys = [\"{KEY}\"]\n"
    )
}

/// The `data:` payloads of an SSE body.
fn events(body: &str) -> Vec<&str> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect()
}

async fn scrape(gw: &fairway::proxy::server::Server) -> String {
    get(&client(), format!("http://{}/metrics", gw.admin_addr()))
        .await
        .text()
}

#[tokio::test]
async fn a_stream_sent_with_a_content_length_reaches_the_client_whole_without_the_usage_chunk() {
    let b = sim(M, 8).await;
    b.set_fault(Fault::SseContentLength);
    let gw = gateway(&policy(), &[&b]).await;
    let c = client();
    // Directly, the backend's stream has a length (the fault's point).
    let direct = send(
        &c,
        post(b.addr(), "/v1/chat/completions", None, chat(M, 5, true)),
    )
    .await;
    assert!(direct.headers.get("content-length").is_some());
    // Through Fairway, which asks the backend for usage and drops that
    // chunk: no stale length, the whole stream, then a clean end.
    let r = send(
        &c,
        post(
            gw.addr(),
            "/v1/chat/completions",
            Some(KEY),
            chat(M, 5, true),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.headers.get("content-length").is_none(), "{:?}", r.headers);
    let body = r.text();
    let ev = events(&body);
    assert_eq!(ev.last(), Some(&"[DONE]"), "{body}");
    assert_eq!(ev.len(), events(&direct.text()).len(), "{body}");
    assert!(!body.contains("\"usage\""), "usage chunk passed on: {body}");
    let m = scrape(&gw).await;
    assert_eq!(metric_sum(&m, "fairway_requests_total{"), 1.0, "{m}");
    assert_eq!(
        metric(
            &m,
            "fairway_requests_total{tenant=\"a\",model=\"m\",outcome=\"served\","
        ),
        Some(1.0),
        "{m}"
    );
    // Usage still reached the accounting: tokens were counted.
    assert!(
        metric_sum(&m, "fairway_completion_tokens_total{") > 0.0,
        "{m}"
    );
}

#[tokio::test]
async fn a_stream_cut_by_the_backend_ends_with_an_error_event_counted_failed_upstream() {
    let b = sim(M, 8).await;
    b.set_fault(Fault::CutStream);
    let gw = gateway(&policy(), &[&b]).await;
    let c = client();
    for include_usage in [false, true] {
        let mut body: serde_json::Value = serde_json::from_str(&chat(M, 20, true)).unwrap();
        if include_usage {
            body["stream_options"] = serde_json::json!({"include_usage": true});
        }
        // The body completes: the client reads to a clean end.
        let r = send(
            &c,
            post(
                gw.addr(),
                "/v1/chat/completions",
                Some(KEY),
                body.to_string(),
            ),
        )
        .await;
        assert_eq!(r.status, 200);
        let text = r.text();
        let ev = events(&text);
        assert!(ev.len() >= 2, "{text}");
        let last: serde_json::Value = serde_json::from_str(ev.last().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], "upstream_stream_broken", "{text}");
        assert_eq!(last["error"]["type"], "upstream_error", "{text}");
        // The events before it are whole chunks.
        for e in &ev[..ev.len() - 1] {
            let chunk: serde_json::Value = serde_json::from_str(e).unwrap();
            assert!(chunk["choices"].is_array(), "{e}");
        }
        assert!(!text.contains("[DONE]"), "{text}");
    }
    let m = scrape(&gw).await;
    assert_eq!(metric_sum(&m, "fairway_requests_total{"), 2.0, "{m}");
    assert_eq!(
        metric(
            &m,
            "fairway_requests_total{tenant=\"a\",model=\"m\",outcome=\"failed_upstream\","
        ),
        Some(2.0),
        "{m}"
    );
    // The connection is still good for the next request.
    b.set_fault(Fault::None);
    let r = send(
        &c,
        post(
            gw.addr(),
            "/v1/chat/completions",
            Some(KEY),
            chat(M, 3, true),
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(events(&r.text()).last(), Some(&"[DONE]"));
}
