//! The audio routes (`/v1/audio/transcriptions`, `/translations`): a real
//! gateway in front of simulated vLLM backends over TCP, with multipart
//! bodies in both field orders (the Python SDK sends `model` first, `curl
//! -F file=@… -F model=…` last), their refusals, and the gateway's memory
//! while a large upload streams through it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::*;

const BOUNDARY: &str = "fairway-test-boundary";

/// One backend serving `m`, one tenant `alpha` with key `ka`.
const ONE_BACKEND: &str = r#"
[[pools]]
model = "m"
backends = [{ name = "b0", url = "http://{b0}" }]

[[tenants]]
name = "alpha"
api_keys = ["ka"]
"#;

fn field(name: &str, value: &str) -> Vec<u8> {
    format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n")
        .into_bytes()
}

fn file_header() -> Vec<u8> {
    format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.mp3\"\r\n\
         Content-Type: audio/mpeg\r\n\r\n"
    )
    .into_bytes()
}

/// A form with `model` before or after a file of `file_len` bytes, whose
/// duration the gateway takes as `file_len / 16000` seconds.
fn form(model: &str, file_len: usize, model_first: bool) -> Vec<u8> {
    let mut out = Vec::new();
    if model_first {
        out.extend(field("model", model));
    }
    out.extend(file_header());
    out.extend(std::iter::repeat_n(0x55u8, file_len));
    out.extend_from_slice(b"\r\n");
    if !model_first {
        out.extend(field("model", model));
    }
    out.extend(field("language", "en"));
    out.extend(format!("--{BOUNDARY}--\r\n").into_bytes());
    out
}

fn upload(
    addr: std::net::SocketAddr,
    path: &str,
    key: Option<&str>,
    body: Vec<u8>,
) -> Request<Full<Bytes>> {
    let mut b = Request::post(format!("http://{addr}{path}")).header(
        "content-type",
        format!("multipart/form-data; boundary={BOUNDARY}"),
    );
    if let Some(k) = key {
        b = b.header("authorization", format!("Bearer {k}"));
    }
    b.body(Full::new(Bytes::from(body))).unwrap()
}

#[tokio::test]
async fn uploads_pass_in_either_field_order_and_are_charged_their_duration() {
    let (_b, gw) = two_tenant_gateway().await;
    let c = client();
    let addr = gw.addr();
    // 64 KB (4 s) with the model first; 640 KB (40 s) with it last, which
    // the gateway reads past its memory share and spools to disk.
    for (len, model_first, path) in [
        (64_000, true, "/v1/audio/transcriptions"),
        (640_000, false, "/v1/audio/translations"),
    ] {
        let r = send(
            &c,
            upload(addr, path, Some("ka"), form("m", len, model_first)),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let v = r.json();
        assert_eq!(v["usage"]["type"], "duration");
        assert_eq!(v["usage"]["seconds"], len / 16_000);
        assert!(v["text"].as_str().unwrap().starts_with("word"));
        assert_eq!(r.headers["x-ratelimit-limit-requests"], "50");
    }
    // Charged 50 encoder positions a second, settled from the usage.
    let text = scrape(&gw).await;
    assert_eq!(
        metric_sum(&text, "fairway_prompt_tokens_total{tenant=\"alpha\""),
        (4.0 + 40.0) * 50.0
    );
    assert_eq!(
        metric_sum(
            &text,
            "fairway_requests_total{tenant=\"alpha\",model=\"m\",outcome=\"served\""
        ),
        2.0
    );
}

#[tokio::test]
async fn bad_uploads_are_refused_with_one_outcome_each() {
    let policy =
        format!("{SERVER}max_upload_bytes = 1000000\nbody_read_timeout = \"1s\"\n{ONE_BACKEND}");
    let b0 = sim("m", 8).await;
    let gw = gateway(&policy, &[&b0]).await;
    let c = client();
    let addr = gw.addr();
    let path = "/v1/audio/transcriptions";
    let small = || form("m", 1000, true);
    let cases: Vec<(Request<Full<Bytes>>, StatusCode)> = vec![
        (upload(addr, path, None, small()), StatusCode::UNAUTHORIZED),
        (
            upload(addr, path, Some("ka"), form("other", 1000, true)),
            StatusCode::NOT_FOUND,
        ),
        // Declared over the limit: refused before a byte is read.
        (
            upload(addr, path, Some("ka"), form("m", 1_200_000, true)),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (
            upload(addr, path, Some("ka"), field("language", "en")),
            StatusCode::BAD_REQUEST,
        ),
        (
            post(addr, path, Some("ka"), r#"{"model":"m"}"#),
            StatusCode::BAD_REQUEST,
        ),
        // A second `model` after the file, with another value: the backend
        // would serve that one, so the upload fails as it streams.
        (
            upload(addr, path, Some("ka"), {
                let mut f = form("m", 200_000, true);
                let end = f.len() - format!("--{BOUNDARY}--\r\n").len();
                f.splice(end..end, field("model", "other"));
                f
            }),
            StatusCode::BAD_REQUEST,
        ),
    ];
    let sent = cases.len();
    for (req, want) in cases {
        let r = send(&c, req).await;
        assert_eq!(r.status, want, "{}", r.text());
        assert!(r.json()["error"]["message"].is_string());
    }
    // Chunked, so the length is only known as it streams: the model comes
    // first, the backend is already receiving, and the gateway stops at
    // the limit with a 413 (the backend is not blamed).
    let r = chunked_upload(addr, "ka", 1_500_000, Duration::ZERO).await;
    assert_eq!(r, StatusCode::PAYLOAD_TOO_LARGE);
    // A client that stops sending mid-file: 408 once `body_read_timeout`
    // passes, and the backend, which was waiting for the rest, is not
    // blamed.
    let r = chunked_upload(addr, "ka", 300_000, Duration::from_secs(3)).await;
    assert_eq!(r, StatusCode::REQUEST_TIMEOUT);
    let r = send(&c, upload(addr, path, Some("ka"), small())).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "the backend stays in: {}",
        r.text()
    );

    let text = scrape(&gw).await;
    assert_eq!(
        metric_sum(&text, "fairway_requests_total{"),
        (sent + 3) as f64,
        "{text}"
    );
    assert_eq!(metric_sum(&text, "fairway_backend_ejections_total{"), 0.0);
    promtool_check(&text);
}

/// A body generated as it is sent, in 64 KiB frames: the model first, then
/// a file of `file_len` bytes, with a pause of `stall` after its first
/// 128 KiB.
fn streamed_form(
    file_len: usize,
    model_first: bool,
    stall: Duration,
) -> StreamBody<futures_util::stream::BoxStream<'static, Result<Frame<Bytes>, std::io::Error>>> {
    let mut head = Vec::new();
    if model_first {
        head.extend(field("model", "m"));
    }
    head.extend(file_header());
    let mut tail = b"\r\n".to_vec();
    if !model_first {
        tail.extend(field("model", "m"));
    }
    tail.extend(format!("--{BOUNDARY}--\r\n").into_bytes());
    let chunk = Bytes::from(vec![0x55u8; 64 << 10]);
    let pieces = (0..file_len.div_ceil(chunk.len())).map(move |i| {
        let n = (file_len - i * chunk.len()).min(chunk.len());
        chunk.slice(..n)
    });
    let frames = std::iter::once(Bytes::from(head))
        .chain(pieces)
        .chain(std::iter::once(Bytes::from(tail)))
        .enumerate();
    let frames = futures_util::stream::iter(frames).then(move |(i, b)| async move {
        if i == 3 && !stall.is_zero() {
            tokio::time::sleep(stall).await;
        }
        Ok(Frame::data(b))
    });
    StreamBody::new(frames.boxed())
}

async fn chunked_upload(
    addr: std::net::SocketAddr,
    key: &str,
    file_len: usize,
    stall: Duration,
) -> StatusCode {
    let c = Client::builder(TokioExecutor::new()).build_http();
    let req = Request::post(format!("http://{addr}/v1/audio/transcriptions"))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .header("authorization", format!("Bearer {key}"))
        .body(streamed_form(file_len, true, stall))
        .unwrap();
    match c.request(req).await {
        Ok(r) => {
            let status = r.status();
            let _ = r.into_body().collect().await;
            status
        }
        Err(e) => panic!("the gateway answers: {e}"),
    }
}

/// The most resident memory a process has had, in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[tokio::test]
async fn a_large_upload_streams_through_without_the_gateway_holding_it() {
    let b0 = sim("m", 8).await;
    let policy = temp_policy(
        "audio-memory",
        &format!("{SERVER}max_upload_bytes = 268435456\n{ONE_BACKEND}")
            .replace("{b0}", &b0.addr().to_string()),
    );
    let gw = ServeProcess::start(&[], &[], &policy, "warn", std::process::Stdio::null());
    let c = Client::builder(TokioExecutor::new()).build_http();
    // A warm-up request, so the baseline includes the connection pools.
    let warm = c
        .request(
            Request::post(format!("http://{}/v1/audio/transcriptions", gw.addr))
                .header(
                    "content-type",
                    format!("multipart/form-data; boundary={BOUNDARY}"),
                )
                .header("authorization", "Bearer ka")
                .body(streamed_form(16_000, true, Duration::ZERO))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(warm.status(), StatusCode::OK);
    let _ = warm.into_body().collect().await;
    let before = peak_rss(gw.pid());
    const FILE: usize = 48 << 20;
    for model_first in [true, false] {
        let req = Request::post(format!("http://{}/v1/audio/transcriptions", gw.addr))
            .header(
                "content-type",
                format!("multipart/form-data; boundary={BOUNDARY}"),
            )
            .header("authorization", "Bearer ka")
            .body(streamed_form(FILE, model_first, Duration::ZERO))
            .unwrap();
        let r = tokio::time::timeout(Duration::from_secs(120), c.request(req))
            .await
            .expect("answered in time")
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "model first: {model_first}");
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v["usage"]["seconds"],
            (FILE as f64 / 16_000.0).ceil() as u64
        );
    }
    let grew = peak_rss(gw.pid()).saturating_sub(before);
    assert!(
        grew < 16 << 20,
        "two {} MiB uploads raised the gateway's peak memory by {} MiB",
        FILE >> 20,
        grew >> 20
    );
}
