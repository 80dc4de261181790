//! Fairway in front of a real Triton Inference Server: PyTriton's bundled
//! `tritonserver` (CPU only, from the venv `tests/run.sh` makes in
//! `target/triton-venv`) serving `tests/triton/toy_triton.py`'s two toy text
//! models, `toy` (classic) and `toy_stream` (decoupled, one response per
//! token when asked to stream). One server for the whole file (it loads in
//! about 6 s); each test starts its own gateway in front of it. Skipped
//! where the venv is missing, except in CI.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::disallowed_methods)] // waits for the server on the wall clock

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use http_body_util::BodyExt;
use support::*;

const KEY: &str = "sk-triton";

/// The real server, started once for the file. It stops itself when the
/// test process is gone (the script watches its parent), so a static
/// that is never dropped leaves nothing behind.
struct Triton {
    _child: Child,
    http: u16,
    metrics: u16,
}

fn triton() -> Option<&'static Triton> {
    static SERVER: OnceLock<Option<Triton>> = OnceLock::new();
    SERVER.get_or_init(start_triton).as_ref()
}

fn start_triton() -> Option<Triton> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("target/triton-venv/bin/python");
    let ready = python.exists()
        && Command::new(&python)
            .args(["-c", "import pytriton"])
            .output()
            .is_ok_and(|o| o.status.success());
    if !ready {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install Triton (tests/run.sh makes target/triton-venv)"
        );
        eprintln!("skipped: no Triton in target/triton-venv (run tests/run.sh)");
        return None;
    }
    // The Python backend's stub links the venv Python's libpython.
    let libdir = Command::new(&python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))",
        ])
        .output()
        .unwrap();
    let libdir = String::from_utf8(libdir.stdout).unwrap();
    let (http, grpc, metrics) = (free_port(), free_port(), free_port());
    let mut child = Command::new(&python)
        .arg(root.join("tests/triton/toy_triton.py"))
        .args([http, grpc, metrics].map(|p| p.to_string()))
        .env("LD_LIBRARY_PATH", libdir.trim())
        .env("TOY_TOKEN_DELAY", "0.02")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the Triton script starts");
    let out = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if line.contains("TOY_TRITON_SERVING") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(90))
        .expect("Triton serves both models within 90 s");
    Some(Triton {
        _child: child,
        http,
        metrics,
    })
}

impl Triton {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    /// Triton's own `/metrics`.
    async fn metrics(&self) -> String {
        get(
            &client(),
            format!("http://127.0.0.1:{}/metrics", self.metrics),
        )
        .await
        .text()
    }
}

/// `llm` served by the decoupled `toy_stream`, `toy` by the classic one;
/// `extra` goes in the `llm` pool, and `llm_backends` backends serve it
/// (names `triton-llm`, `triton-llm-2`, … on the same server).
fn policy(t: &Triton, extra: &str, llm_backends: usize) -> String {
    let (url, m) = (t.url(), t.metrics);
    let llm: String = (1..=llm_backends)
        .map(|i| {
            let name = if i == 1 {
                "triton-llm".to_owned()
            } else {
                format!("triton-llm-{i}")
            };
            format!(
                "[[pools.backends]]\nname = \"{name}\"\nurl = \"{url}\"\nprotocol = \"triton\"\n\
                 served_model = \"toy_stream\"\nmetrics_url = \"http://127.0.0.1:{m}/metrics\"\n"
            )
        })
        .collect();
    format!(
        "{SERVER}[poller]\ninterval = \"100ms\"\n\
         [[pools]]\nmodel = \"llm\"\n{extra}\n{llm}\
         [[pools]]\nmodel = \"toy\"\n\
         [[pools.backends]]\nname = \"triton-toy\"\nurl = \"{url}\"\nprotocol = \"triton\"\n\
         metrics_url = \"http://127.0.0.1:{m}/metrics\"\n\
         [[tenants]]\nname = \"a\"\napi_keys = [\"{KEY}\"]\n"
    )
}

/// `POST`s `body` to `path` through the gateway at `addr`, with the
/// tenant's key.
async fn call(
    c: &HttpClient,
    addr: SocketAddr,
    path: &str,
    body: impl Into<bytes::Bytes>,
) -> Reply {
    send(c, post(addr, path, Some(KEY), body)).await
}

fn generate(text: &str, max_tokens: u32, stream: bool) -> String {
    format!(r#"{{"text_input": "{text}", "max_tokens": {max_tokens}, "stream": {stream}}}"#)
}

/// Requests the gateway counted, by outcome.
fn outcomes(m: &str, model: &str, outcome: &str) -> f64 {
    metric_sum(
        m,
        &format!("fairway_requests_total{{tenant=\"a\",model=\"{model}\",outcome=\"{outcome}\""),
    )
}

#[tokio::test]
async fn generate_stream_and_infer_pass_through_with_one_outcome_each() {
    let Some(t) = triton() else { return };
    let gw = gateway(&policy(t, "", 1), &[]).await;
    let c = client();
    let addr = gw.addr();

    // generate on the classic model and on the decoupled one.
    let r = call(
        &c,
        addr,
        "/v2/models/toy/generate",
        generate("hi", 4, false),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["text_output"], "hi0 hi1 hi2 hi3");
    assert_eq!(r.json()["model_name"], "toy");
    let r = call(
        &c,
        addr,
        "/v2/models/llm/generate",
        generate("a b", 3, false),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["text_output"], "a0 b1 a2");

    // generate_stream: Triton's own bytes, event by event.
    let body = generate("x y", 5, true);
    let direct = send(
        &c,
        post_to(&t.url(), "/v2/models/toy_stream/generate_stream", &body),
    )
    .await;
    let through = call(&c, addr, "/v2/models/llm/generate_stream", body).await;
    assert_eq!(through.status, 200);
    assert_eq!(through.body, direct.body);
    assert_eq!(through.text().matches("data: ").count(), 5);

    // infer with JSON tensors and with binary ones, the request's id echoed.
    let json = r#"{"id":"r1","inputs":[{"name":"text_input","datatype":"BYTES","shape":[1],"data":["p q"]},{"name":"max_tokens","datatype":"INT32","shape":[1],"data":[3]}]}"#;
    let r = call(&c, addr, "/v2/models/toy/infer", json).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], "r1");
    assert_eq!(r.json()["outputs"][0]["data"][0], "p0 q1 p2");
    let (binary, header_len) = binary_infer("p q", 2);
    let mut req = post(addr, "/v2/models/toy/infer", Some(KEY), binary.clone());
    req.headers_mut().insert(
        "inference-header-content-length",
        header_len.to_string().parse().unwrap(),
    );
    req.headers_mut()
        .insert("content-type", "application/octet-stream".parse().unwrap());
    let r = send(&c, req).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Triton answers the binary output after its JSON header.
    let header_len: usize = r.headers["inference-header-content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let out: serde_json::Value = serde_json::from_slice(&r.body[..header_len]).unwrap();
    assert_eq!(out["outputs"][0]["name"], "text_output");
    assert!(r.body[header_len..].ends_with(b"p0 q1"));
    // Triton's own 501 for infer on the decoupled model.
    let r = call(&c, addr, "/v2/models/llm/infer", json).await;
    assert_eq!(r.status, 501, "{}", r.text());
    assert!(r.text().contains("decoupled"));

    // Health, readiness and metadata in Triton's shape.
    for path in [
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/llm/ready",
    ] {
        let r = get(&c, format!("http://{addr}{path}")).await;
        assert_eq!(r.status, 200, "{path}");
    }
    let mut meta = http::Request::get(format!("http://{addr}/v2/models/llm"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    meta.headers_mut()
        .insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    let r = send(&c, meta).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["name"], "llm");
    assert_eq!(r.json()["inputs"][2]["name"], "stream");

    // One outcome per request: 5 served, the 501 refused by the backend
    // (it serves no infer on that model, nor would any Triton).
    let m = scrape(&gw).await;
    assert_eq!(outcomes(&m, "toy", "served"), 3.0, "{m}");
    assert_eq!(outcomes(&m, "llm", "served"), 2.0, "{m}");
    assert_eq!(outcomes(&m, "llm", "refused"), 1.0, "{m}");
    assert_eq!(metric_sum(&m, "fairway_requests_total{"), 6.0, "{m}");
    assert_eq!(
        metric(&m, "fairway_backend_healthy{backend=\"triton-llm\"").unwrap(),
        1.0
    );
    // infer is charged by its size: four bytes a token (docs/triton.md).
    let prompt = metric(
        &m,
        "fairway_prompt_tokens_total{tenant=\"a\",model=\"toy\"}",
    )
    .unwrap();
    let infer_tokens = (json.len().div_ceil(4) + binary.len().div_ceil(4)) as f64;
    assert!(prompt >= infer_tokens, "{prompt} < {infer_tokens}");
}

/// A binary-tensor infer request: the JSON header, then `text_input` (a
/// BYTES element: its length, little-endian, then its bytes) and
/// `max_tokens` (an INT32). Returns the body and the header's length.
fn binary_infer(text: &str, max_tokens: i32) -> (Vec<u8>, usize) {
    let text_size = 4 + text.len();
    let header = format!(
        r#"{{"inputs":[{{"name":"text_input","datatype":"BYTES","shape":[1],"parameters":{{"binary_data_size":{text_size}}}}},{{"name":"max_tokens","datatype":"INT32","shape":[1],"parameters":{{"binary_data_size":4}}}}],"outputs":[{{"name":"text_output","parameters":{{"binary_data":true}}}}]}}"#
    );
    let mut body = header.as_bytes().to_vec();
    body.extend_from_slice(&(text.len() as u32).to_le_bytes());
    body.extend_from_slice(text.as_bytes());
    body.extend_from_slice(&max_tokens.to_le_bytes());
    (body, header.len())
}

fn post_to(
    base: &str,
    path: &str,
    body: &str,
) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    http::Request::post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_owned(),
        )))
        .unwrap()
}

#[tokio::test]
async fn an_error_triton_sends_under_a_200_is_a_failure_held_against_the_backend() {
    let Some(t) = triton() else { return };
    // Two backends on the one server, taken in turn: three failures in a
    // row eject one (never the last).
    let gw = gateway(
        &policy(
            t,
            "routing = \"round_robin\"\neject_after_failures = 3\nejection_time = \"30s\"",
            2,
        ),
        &[],
    )
    .await;
    let c = client();
    let addr = gw.addr();
    // generate on the decoupled model asked to stream: Triton's 200 with
    // an error body, passed on as it is.
    let r = call(&c, addr, "/v2/models/llm/generate", generate("hi", 4, true)).await;
    assert_eq!(r.status, 200);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("exactly 1 response"),
        "{}",
        r.text()
    );
    // A model failing mid-stream: Triton's error event after the first.
    let r = call(
        &c,
        addr,
        "/v2/models/llm/generate_stream",
        generate("fail here", 4, true),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.text().contains("data: {\"error\""), "{}", r.text());
    // And after its one response, on generate (Triton's message is the
    // same as for the first case).
    for _ in 0..4 {
        let r = call(
            &c,
            addr,
            "/v2/models/llm/generate",
            generate("fail again", 2, false),
        )
        .await;
        assert_eq!(r.status, 200);
        assert!(r.json()["error"].is_string(), "{}", r.text());
    }
    let m = scrape(&gw).await;
    assert_eq!(outcomes(&m, "llm", "failed_upstream"), 6.0, "{m}");
    assert_eq!(outcomes(&m, "llm", "served"), 0.0, "{m}");
    assert_eq!(
        metric_sum(&m, "fairway_goodput_total{tenant=\"a\",model=\"llm\"}"),
        0.0,
        "{m}"
    );
    // Three failures in a row at one: the outlier detection ejects it.
    assert_eq!(
        metric_sum(&m, "fairway_backend_ejections_total{backend=\"triton-llm"),
        1.0,
        "{m}"
    );
    // The classic model's backend is another: still served.
    let r = call(
        &c,
        addr,
        "/v2/models/toy/generate",
        generate("ok", 1, false),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn a_malformed_max_tokens_is_a_400_that_never_reaches_triton() {
    let Some(t) = triton() else { return };
    let gw = gateway(&policy(t, "", 1), &[]).await;
    let c = client();
    let addr = gw.addr();
    // What Triton itself answers with a 500.
    let direct = send(
        &c,
        post_to(
            &t.url(),
            "/v2/models/toy/generate",
            r#"{"text_input":"hi","max_tokens":"8"}"#,
        ),
    )
    .await;
    assert_eq!(direct.status, 500, "{}", direct.text());
    // (Its counters settle after its answer.)
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = t.metrics().await;
    for bad in [r#""8""#, "1.5", "null", "-1", "[1,2]", "4294967296"] {
        let body = format!(r#"{{"text_input":"hi","max_tokens":{bad}}}"#);
        let r = call(&c, addr, "/v2/models/toy/generate", body).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(
            r.json()["error"].as_str().unwrap().contains("max_tokens"),
            "{}",
            r.text()
        );
    }
    // Triton saw none of them.
    let seen = |m: &str| {
        metric(m, "nv_inference_request_success{model=\"toy\"").unwrap_or(0.0)
            + metric_sum(m, "nv_inference_request_failure{model=\"toy\"")
    };
    assert_eq!(seen(&t.metrics().await), seen(&before));
    // Triton's own 400 (the model raises without its input) is refused by
    // the backend, not its failure.
    let r = call(&c, addr, "/v2/models/toy/generate", r#"{"max_tokens":2}"#).await;
    assert_eq!(r.status, 400, "{}", r.text());
    // (Counted under model "unknown": a body refused before it is read
    // names no model the policy vouches for.)
    let m = scrape(&gw).await;
    assert_eq!(
        metric(
            &m,
            "fairway_requests_total{tenant=\"a\",model=\"unknown\",outcome=\"refused\",reason=\"invalid_request\"}"
        ),
        Some(6.0),
        "{m}"
    );
    assert_eq!(outcomes(&m, "toy", "refused"), 1.0, "{m}");
    assert_eq!(outcomes(&m, "toy", "failed_upstream"), 0.0, "{m}");
    assert_eq!(
        metric(&m, "fairway_backend_ejections_total{backend=\"triton-toy\"").unwrap_or(0.0),
        0.0
    );
    let r = call(
        &c,
        addr,
        "/v2/models/toy/generate",
        generate("hi", 2, false),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn readings_follow_tritons_series_and_the_models_transaction_policy() {
    let Some(t) = triton() else { return };
    let gw = gateway(&policy(t, "", 1), &[]).await;
    let source = |m: &str, backend: &str| {
        m.lines()
            .find(|l| {
                l.starts_with(&format!(
                    "fairway_backend_reading_source{{backend=\"{backend}\",model="
                )) && l.contains("signal=\"waiting\"")
            })
            .map(str::to_owned)
    };
    let mut m = String::new();
    let both = eventually(Duration::from_secs(10), async || {
        m = scrape(&gw).await;
        source(&m, "triton-llm").is_some() && source(&m, "triton-toy").is_some()
    })
    .await;
    assert!(both, "{m}");
    // The classic model's pending count is its queue; the decoupled one's
    // is not (its configuration says decoupled).
    assert!(
        source(&m, "triton-toy")
            .unwrap()
            .contains("source=\"nv_inference_pending_request_count\""),
        "{m}"
    );
    assert!(
        source(&m, "triton-llm")
            .unwrap()
            .contains("decoupled model (its model configuration)"),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "fairway_backend_scrape_errors_total{backend=\"triton-llm\""
        )
        .unwrap_or(0.0),
        0.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "fairway_backend_healthy{backend=\"triton-llm\"").unwrap(),
        1.0
    );
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_stream_is_one_cancelled_request() {
    let Some(t) = triton() else { return };
    let gw = gateway(&policy(t, "", 1), &[]).await;
    let c = client();
    let addr = gw.addr();
    // 100 tokens 20 ms apart: hang up after the first event.
    let resp = open(
        &c,
        post(
            addr,
            "/v2/models/llm/generate_stream",
            Some(KEY),
            generate("long", 100, true),
        ),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(first.starts_with(b"data: {"), "{first:?}");
    drop(body);
    let mut m = String::new();
    let ended = eventually(Duration::from_secs(5), async || {
        m = scrape(&gw).await;
        outcomes(&m, "llm", "cancelled") == 1.0
    })
    .await;
    assert!(ended, "{m}");
    assert_eq!(metric_sum(&m, "fairway_requests_total{"), 1.0, "{m}");
    assert_eq!(
        metric(&m, "fairway_backend_in_flight{backend=\"triton-llm\"").unwrap(),
        0.0,
        "{m}"
    );
    // The next call is served.
    let r = call(
        &c,
        addr,
        "/v2/models/llm/generate",
        generate("hi", 2, false),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
}
