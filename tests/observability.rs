//! What operators see: every outcome counted once and accepted by the real
//! `promtool`, goodput that drops when a backend is too slow for the SLO,
//! and a real Prometheus scraping a real gateway.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fairway::sim::backend::{Fault, SimBackend, SimHandle};
use http_body_util::BodyExt;
use support::*;

const M: &str = "sim-model";

async fn slow_sim(step: Duration) -> SimHandle {
    SimBackend::builder(M)
        .max_num_seqs(8)
        .decode_step(step, Duration::from_micros(10))
        .start()
        .await
        .unwrap()
}

fn policy(extra_tenant: &str, window: u32, max_wait: &str) -> String {
    format!(
        r#"{SERVER}
[poller]
interval = "10s"

[queue]
max_wait = "{max_wait}"

[[pools]]
model = "{M}"
timeout = "5s"
[[pools.backends]]
url = "http://{{b0}}"
max_inflight = {window}
metrics = "none"

[[tenants]]
name = "api"
api_keys = ["k-api"]
weight = 3
slo = {{ ttft = "2s", e2e = "4s" }}
{extra_tenant}
"#
    )
}

/// Sends `body` three times as tenant `api`; each must be served.
async fn serve_three(gw: &fairway::edge::server::Server, body: String) {
    let c = client();
    for _ in 0..3 {
        let r = send(
            &c,
            post(
                gw.addr(),
                "/v1/chat/completions",
                Some("k-api"),
                body.clone(),
            ),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

fn outcome(m: &str, o: &str) -> f64 {
    metric_sum(
        m,
        &format!("fairway_requests_total{{tenant=\"api\",model=\"{M}\",outcome=\"{o}\""),
    )
}

#[tokio::test]
async fn every_outcome_is_counted_once_and_promtool_accepts_the_scrape() {
    // One slot, 150 ms to wait for it, 2 ms a token.
    let b = slow_sim(Duration::from_millis(2)).await;
    let text = policy("", 1, "150ms").replace(
        "slo = { ttft = \"2s\", e2e = \"4s\" }",
        "slo = { ttft = \"2s\", e2e = \"4s\" }\nrate = 0.1\nburst = 6",
    );
    let gw = gateway(&text, &[&b]).await;
    let c = client();
    let req = |max_tokens, stream| {
        post(
            gw.addr(),
            "/v1/chat/completions",
            Some("k-api"),
            chat(M, max_tokens, stream),
        )
    };
    let mut sent = 0u32;

    // served
    assert_eq!(send(&c, req(4, false)).await.status, 200);
    sent += 1;
    // shed: a 400 ms request holds the only slot; the next waits past 150 ms.
    let long = tokio::spawn({
        let c = c.clone();
        let r = req(200, false);
        async move { send(&c, r).await.status }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    let shed = send(&c, req(4, false)).await;
    assert_eq!(shed.status, 503, "{}", shed.text());
    assert!(shed.headers.contains_key("retry-after"));
    assert_eq!(long.await.unwrap(), 200);
    sent += 2;
    // cancelled: the client hangs up mid-stream.
    let resp = open(&c, req(500, true)).await;
    let mut body = resp.into_body();
    let _first = body.frame().await;
    drop(body);
    sent += 1;
    // failed upstream: the backend answers 500.
    b.set_fault(Fault::Error);
    let failed = send(&c, req(4, false)).await;
    assert_eq!(failed.status, 500);
    b.set_fault(Fault::None);
    sent += 1;
    // refused: the rate bucket (burst 6, refilling 0.1/s) runs dry.
    let mut refused = 0;
    for _ in 0..4 {
        let r = send(&c, req(1, false)).await;
        sent += 1;
        if r.status == 429 {
            refused += 1;
        }
    }
    assert!(refused >= 1);

    let mut m = String::new();
    let counted = eventually(Duration::from_secs(3), async || {
        m = scrape(&gw).await;
        metric_sum(&m, "fairway_requests_total{") == f64::from(sent)
    })
    .await;
    assert!(counted, "every request counted exactly once:\n{m}");
    for o in ["served", "refused", "shed", "cancelled", "failed_upstream"] {
        assert!(outcome(&m, o) >= 1.0, "{o}:\n{m}");
    }
    assert_eq!(outcome(&m, "refused"), f64::from(refused));
    assert!(m.contains("reason=\"rate\""));
    assert_eq!(
        metric(&m, "fairway_tenant_slo_ttft_seconds{tenant=\"api\"}"),
        Some(2.0)
    );
    assert_eq!(
        metric(&m, "fairway_tenant_slo_e2e_seconds{tenant=\"api\"}"),
        Some(4.0)
    );
    promtool_check(&m);
}

#[tokio::test]
async fn goodput_counts_only_responses_within_the_slo() {
    // 30 tokens at 2 ms: ~60 ms, inside a 250 ms e2e SLO; at 20 ms: ~600 ms, outside.
    let tenant =
        |slo: &str| policy("", 8, "10s").replace("slo = { ttft = \"2s\", e2e = \"4s\" }", slo);
    let slo = "slo = { ttft = \"250ms\", e2e = \"250ms\" }";
    for (step, good) in [
        (Duration::from_millis(2), 3.0),
        (Duration::from_millis(20), 0.0),
    ] {
        let b = slow_sim(step).await;
        let gw = gateway(&tenant(slo), &[&b]).await;
        serve_three(&gw, chat(M, 30, false)).await;
        let m = scrape(&gw).await;
        assert_eq!(outcome(&m, "served"), 3.0, "{m}");
        assert_eq!(
            metric(
                &m,
                &format!("fairway_goodput_total{{tenant=\"api\",model=\"{M}\"}}")
            ),
            Some(good),
            "step {step:?}:\n{m}"
        );
        let attainment = metric(&m, "fairway_slo_attainment_ratio{tenant=\"api\"").unwrap();
        assert!((attainment - good / 3.0).abs() < 1e-9, "{attainment}");
        gw.shutdown().await;
    }
}

/// A Prometheus server on loopback, killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start_prometheus(target: std::net::SocketAddr) -> Option<Prometheus> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("fairway-prom-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: fairway\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    Some(Prometheus {
        child,
        port,
        _dir: TempDir(dir),
    })
}

/// One instant query's result vector.
async fn query(port: u16, q: &str) -> Vec<serde_json::Value> {
    let url = format!(
        "http://127.0.0.1:{port}/api/v1/query?query={}",
        q.bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    );
    let req = http::Request::get(url)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let Ok(resp) = client().request(req).await else {
        return Vec::new();
    };
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

fn value(r: &[serde_json::Value]) -> Option<f64> {
    r.first()?["value"][1].as_str()?.parse().ok()
}

#[tokio::test]
async fn a_real_prometheus_scrapes_outcomes_goodput_and_histograms() {
    let b = slow_sim(Duration::from_millis(1)).await;
    let chat_tenant =
        "[[tenants]]\nname = \"chat\"\napi_keys = [\"k-chat\"]\nrate = 1\nburst = 2\n";
    let gw = gateway(&policy(chat_tenant, 8, "10s"), &[&b]).await;
    let Some(prom) = start_prometheus(gw.admin_addr()) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install prometheus (Debian package prometheus)"
        );
        eprintln!("prometheus not installed; skipping");
        return;
    };
    let c = client();
    let (mut sent, mut served_api) = (0.0, 0.0);
    for i in 0..12 {
        let (key, stream) = if i % 2 == 0 {
            ("k-api", true)
        } else {
            ("k-chat", false)
        };
        let r = send(
            &c,
            post(
                gw.addr(),
                "/v1/chat/completions",
                Some(key),
                chat(M, 5, stream),
            ),
        )
        .await;
        sent += 1.0;
        if key == "k-api" && r.status == 200 {
            served_api += 1.0;
        }
    }
    // chat's bucket (burst 2, 1/s) refuses some of its six.
    let port = prom.port;
    let mut total = None;
    let arrived = eventually(Duration::from_secs(30), async || {
        total = value(&query(port, "sum(fairway_requests_total)").await);
        total == Some(sent)
    })
    .await;
    assert!(arrived, "Prometheus saw {total:?} of {sent} requests");
    let by_outcome = query(port, "sum by (outcome) (fairway_requests_total)").await;
    let served = by_outcome
        .iter()
        .find(|r| r["metric"]["outcome"] == "served")
        .and_then(|r| r["value"][1].as_str()?.parse::<f64>().ok())
        .unwrap();
    let refused = by_outcome
        .iter()
        .find(|r| r["metric"]["outcome"] == "refused")
        .and_then(|r| r["value"][1].as_str()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(refused >= 1.0, "{by_outcome:?}");
    assert_eq!(served + refused, sent, "{by_outcome:?}");
    let goodput = value(&query(port, "sum(fairway_goodput_total{tenant=\"api\"})").await);
    assert_eq!(goodput, Some(served_api));
    let ttft = value(&query(port, "sum(fairway_ttft_seconds_count{tenant=\"api\"})").await);
    assert_eq!(ttft, Some(served_api));
    let p99 = value(
        &query(
            port,
            "histogram_quantile(0.99, sum by (le) (fairway_e2e_seconds_bucket{tenant=\"api\"}))",
        )
        .await,
    )
    .unwrap();
    assert!(p99 > 0.0 && p99 < 4.0, "e2e p99 {p99}");
    let slo = value(&query(port, "fairway_tenant_slo_e2e_seconds{tenant=\"api\"}").await);
    assert_eq!(slo, Some(4.0));
}

#[tokio::test]
async fn fairway_top_shows_tenants_against_their_slo_and_backends() {
    let b = slow_sim(Duration::from_millis(1)).await;
    let gw = gateway(&policy("", 8, "10s"), &[&b]).await;
    serve_three(&gw, chat(M, 3, true)).await;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fairway"));
    cmd.args(["top", "--once", "--interval", "200ms", "--admin"])
        .arg(gw.admin_addr().to_string())
        .env("COLUMNS", "200");
    let out = run_blocking(cmd).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("fairway top"), "{text}");
    let api = text
        .lines()
        .find(|l| l.trim_start().starts_with("api"))
        .unwrap();
    assert!(
        api.contains("2.00s") && api.contains("4.00s"),
        "SLO columns: {api}"
    );
    let backend = text
        .lines()
        .find(|l| l.contains(&b.addr().to_string()))
        .unwrap();
    assert!(backend.contains("up"), "{backend}");

    // A wrong address is a clear error, not a hang.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fairway"));
    cmd.args(["top", "--once", "--admin"])
        .arg(gw.addr().to_string()); // the client port: 404 on /metrics
    let out = run_blocking(cmd).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/metrics"));
}

/// Runs a command off the async workers (the gateway serves meanwhile).
async fn run_blocking(mut cmd: Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

/// Two tenants keep eight requests each outstanding on one backend with a
/// window of 2 for `secs`; returns the live Jain's index gauge after it.
async fn jain_under(discipline: &str, second_tenant_class: &str) -> f64 {
    let b0 = slow_sim(Duration::from_millis(2)).await;
    let text = format!(
        r#"{SERVER}
[telemetry]
fairness_window = "1s"

[queue]
discipline = "{discipline}"

[[pools]]
model = "{M}"
[[pools.backends]]
url = "http://{{b0}}"
max_inflight = 2
metrics = "none"

# The test saturates the backend on purpose: requests wait, however long.
[[tenants]]
name = "a"
api_keys = ["k-a"]
on_late = "serve"

[[tenants]]
name = "b"
api_keys = ["k-b"]
priority = "{second_tenant_class}"
on_late = "serve"
"#
    );
    let gw = gateway(&text, &[&b0]).await;
    let addr = gw.addr();
    let until = tokio::time::Instant::now() + Duration::from_millis(2500);
    let mut clients = Vec::new();
    for key in ["k-a", "k-b"] {
        for _ in 0..8 {
            clients.push(tokio::spawn(async move {
                let c = client();
                while tokio::time::Instant::now() < until {
                    let r = send(
                        &c,
                        post(addr, "/v1/chat/completions", Some(key), chat(M, 10, false)),
                    )
                    .await;
                    assert_eq!(r.status, 200, "{}", r.text());
                }
            }));
        }
    }
    // Read while both are still backlogged (the last windows would see the
    // drain), then let the clients finish.
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let m = scrape(&gw).await;
    for c in clients {
        c.await.unwrap();
    }
    metric(&m, "fairway_jain_fairness_index").unwrap_or_else(|| panic!("no gauge:\n{m}"))
}

#[tokio::test]
async fn the_live_jain_gauge_tells_a_fair_share_from_starvation() {
    // Equal weights under drf: each gets half of what is served.
    let fair = jain_under("drf", "interactive").await;
    assert!(fair >= 0.9, "drf, equal weights: {fair}");
    // Strict priority: the batch tenant, queued all along, gets nothing.
    let starved = jain_under("priority", "batch").await;
    eprintln!("live Jain's index: drf {fair:.3}, priority {starved:.3}");
    assert!(starved < 0.6, "priority starving a batch tenant: {starved}");
}
