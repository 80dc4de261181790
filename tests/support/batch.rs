//! The Files and Batch APIs as a client calls them, for the tests that
//! run batches.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use serde_json::{Value, json};

use super::{Reply, client, send};

pub fn request(
    method: Method,
    addr: std::net::SocketAddr,
    path: &str,
    key: &str,
    body: impl Into<Bytes>,
) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Full::new(body.into()))
        .unwrap()
}

/// A bodiless call of tenant (or admin) `key`.
pub async fn call(method: Method, addr: std::net::SocketAddr, path: &str, key: &str) -> Reply {
    send(&client(), request(method, addr, path, key, "")).await
}

pub async fn upload(addr: std::net::SocketAddr, key: &str, purpose: &str, content: &str) -> Reply {
    let boundary = "fairway-test-boundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{purpose}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{content}\r\n--{boundary}--\r\n"
    );
    let req = Request::post(format!("http://{addr}/v1/files"))
        .header("authorization", format!("Bearer {key}"))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    send(&client(), req).await
}

pub async fn create(addr: std::net::SocketAddr, key: &str, file: &str) -> Reply {
    let body = json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h", "metadata": {"suite": "t"}});
    send(
        &client(),
        request(Method::POST, addr, "/v1/batches", key, body.to_string()),
    )
    .await
}

pub async fn batch(addr: std::net::SocketAddr, key: &str, id: &str) -> Value {
    let r = call(Method::GET, addr, &format!("/v1/batches/{id}"), key).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    r.json()
}

/// Polls batch `id` until it has ended.
pub async fn ended(addr: std::net::SocketAddr, key: &str, id: &str, within: Duration) -> Value {
    let start = tokio::time::Instant::now();
    loop {
        let b = batch(addr, key, id).await;
        if ["completed", "failed", "expired", "cancelled"].contains(&b["status"].as_str().unwrap())
        {
            return b;
        }
        assert!(start.elapsed() < within, "batch still {}: {b}", b["status"]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A file's lines, by `custom_id`.
pub async fn lines(addr: std::net::SocketAddr, key: &str, id: &str) -> HashMap<String, Value> {
    let r = call(Method::GET, addr, &format!("/v1/files/{id}/content"), key).await;
    assert_eq!(r.status, StatusCode::OK);
    let mut out = HashMap::new();
    for l in r.text().lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        let id = v["custom_id"].as_str().unwrap().to_owned();
        assert!(out.insert(id.clone(), v).is_none(), "{id} twice");
    }
    out
}

/// `n` chat items for model `model`, `custom_id` `q0`, `q1`, ..., as an
/// input file's text.
pub fn input(n: usize, model: &str, max_tokens: u32) -> String {
    (0..n)
        .map(|i| {
            json!({
                "custom_id": format!("q{i}"),
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": model, "messages": [{"role": "user", "content": format!("question {i}")}], "max_tokens": max_tokens},
            })
            .to_string()
                + "\n"
        })
        .collect()
}

/// Two simulated backends serving `m` with steps slow enough (5 ms) that
/// a batch of a few hundred items is still running when a test acts.
pub async fn slow_pair() -> (
    fairway::sim::backend::SimHandle,
    fairway::sim::backend::SimHandle,
) {
    let slow = || {
        fairway::sim::backend::SimBackend::builder("m")
            .max_num_seqs(8)
            .decode_step(Duration::from_millis(5), Duration::from_micros(10))
            .start()
    };
    (slow().await.unwrap(), slow().await.unwrap())
}
