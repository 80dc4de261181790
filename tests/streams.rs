//! Streams end honestly, against a real gateway in front of simulated
//! backends over real TCP: a backend that sends its stream with a
//! `Content-Length` while Fairway drops the usage chunk it asked for, and a
//! backend whose stream is cut mid-way; and a client that stops reading an
//! endless stream, which costs the gateway a bounded buffer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

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

/// A backend that answers `GET`s (health probes) with an empty 200 and a
/// `POST` with an SSE stream that never ends, written as fast as the
/// connection takes it; `written` counts the stream's bytes.
async fn endless_stream_backend(
    written: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let written = written.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // One request head (and a small body) at a time.
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    let body_len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    while buf.len() < end + 4 + body_len {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..end + 4 + body_len);
                    if head.starts_with("get") {
                        if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                            .await
                            .is_err()
                        {
                            return;
                        }
                        continue;
                    }
                    let event = format!(
                        "data: {}\n\n",
                        r#"{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}"#
                    );
                    let chunk = format!("{:x}\r\n{event}\r\n", event.len()).repeat(64);
                    if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n").await.is_err() {
                        return;
                    }
                    while s.write_all(chunk.as_bytes()).await.is_ok() {
                        written.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    }
                    return;
                }
            });
        }
    });
    addr
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test]
async fn a_client_that_stops_reading_costs_the_gateway_a_bounded_buffer() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let written = std::sync::Arc::new(AtomicU64::new(0));
    let backend = endless_stream_backend(written.clone()).await;
    let path = temp_policy(
        "stalled-client",
        &format!(
            "{SERVER}\n[[pools]]\nmodel = \"{M}\"\n[[pools.backends]]\nurl = \"http://{backend}\"\nmetrics = \"none\"\n\
             [[tenants]]\nname = \"a\"\napi_keys = [\"{KEY}\"]\n"
        ),
    );
    let gw = ServeProcess::start(&[], &[], &path, "warn", std::process::Stdio::null());
    let rss_before = rss_kib(gw.pid());
    // The client sends a streaming request, reads the response head, and
    // then reads nothing more.
    let mut reader = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let body = chat(M, 100_000, true);
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    reader.write_all(req.as_bytes()).await.unwrap();
    let mut head = [0u8; 512];
    let n = reader.read(&mut head).await.unwrap();
    assert!(
        head[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head[..n])
    );
    // The backend goes on writing until every buffer between it and the
    // client is full, then stops: wait until it has written nothing for
    // half a second.
    let mut last = 0;
    let plateau = eventually(Duration::from_secs(30), async || {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = written.load(Ordering::Relaxed);
        let still = now > 0 && now == last;
        last = now;
        still
    })
    .await;
    let sent = written.load(Ordering::Relaxed);
    assert!(plateau, "the backend never stopped: {sent} bytes");
    // What the backend got out is what the sockets' buffers hold (a few
    // MiB each on loopback) and the gateway's bounded one, not the
    // endless stream.
    assert!(sent < 64 << 20, "{sent} bytes left the backend");
    let grown = rss_kib(gw.pid()).saturating_sub(rss_before);
    eprintln!("backend wrote {sent} bytes; gateway RSS grew {grown} KiB");
    assert!(
        grown < 16 << 10,
        "the gateway grew {grown} KiB holding a stalled stream"
    );
    // The client goes away: the request ends, counted once, as cancelled.
    drop(reader);
    let metrics = format!("http://{}/metrics", gw.admin);
    let cancelled = "fairway_requests_total{tenant=\"a\",model=\"m\",outcome=\"cancelled\",";
    assert!(
        eventually(Duration::from_secs(10), async || {
            metric(&get(&client(), metrics.clone()).await.text(), cancelled) == Some(1.0)
        })
        .await
    );
}
