//! `fairway agent` over real TCP: an in-process agent in front of a
//! simulated vLLM backend, a dead engine, a hung engine, and the real
//! binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use fairway::agent::{AgentConfig, NodeReading, serve};
use fairway::config::policy::MetricsDialect;
use fairway::core::time::Instant;
use fairway::poller::dialect::{AgentReading, Decoder};
use fairway::sim::backend::{Fault, SimBackend, SimHandle};
use http::{Request, StatusCode};
use http_body_util::Full;
use support::{Reply, client, get, post, send};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// An in-process agent on port 0; dropping it stops the agent.
struct Agent {
    addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

impl Agent {
    async fn start(engine_metrics: String, timeout: Duration) -> Agent {
        Agent::with(AgentConfig {
            timeout,
            ..AgentConfig::for_engine(engine_metrics)
        })
        .await
    }

    async fn with(cfg: AgentConfig) -> Agent {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(serve(listener, cfg, async move {
            let _ = stopped.await;
        }));
        Agent { addr, _stop: stop }
    }

    async fn get(&self, path: &str) -> Reply {
        get(&client(), format!("http://{}{path}", self.addr)).await
    }
}

async fn sim() -> SimHandle {
    SimBackend::builder("m")
        .decode_step(Duration::from_millis(2), Duration::from_micros(10))
        .start()
        .await
        .expect("sim backend starts")
}

/// Asserts a 200 reading and decodes it as the gateway's poller would.
fn decode(reply: &Reply) -> (serde_json::Value, fairway::core::reading::Reading) {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(
        reply.headers.get("content-type").unwrap(),
        "application/json"
    );
    let reading = Decoder::new(MetricsDialect::Agent)
        .decode(&reply.text(), Instant::ZERO)
        .unwrap_or_else(|e| panic!("agent reading does not decode ({e}): {}", reply.text()));
    (reply.json(), reading)
}

/// A closed port: bound, then released.
async fn dead_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

#[tokio::test]
async fn reading_carries_the_engine_signals_and_windows_the_p99s() {
    let sim = sim().await;
    let agent = Agent::start(format!("{}/metrics", sim.url()), Duration::from_secs(2)).await;

    let (doc, first) = decode(&agent.get("/reading").await);
    for key in ["running", "waiting", "kv_usage"] {
        assert!(doc[key].is_number(), "{key} missing: {doc}");
    }
    assert!(doc["gpus"].is_array(), "{doc}");
    assert_eq!(first.running, Some(0));
    assert_eq!(first.waiting, Some(0));
    assert!(first.kv_tokens.is_some(), "{doc}");

    let chat = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;
    let reply = send(
        &client(),
        post(sim.addr(), "/v1/chat/completions", None, chat),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());

    // The agent's decoder kept the first scrape's histograms, so the second
    // reading's p99s cover the one request served in between.
    let (doc, second) = decode(&agent.get("/reading").await);
    assert!(second.ttft_p99.is_some(), "{doc}");
    assert!(second.e2e_p99.is_some(), "{doc}");
    let parsed: AgentReading = serde_json::from_value(doc).unwrap();
    assert_eq!(parsed.running, Some(0));
}

/// `/node`, for placement: a node agent serves its GPUs only; an engine
/// agent adds the engine's model, GPUs and TTFT p99 over its own window
/// (the gateway's `/reading` does not consume it), and names a failed
/// scrape instead of failing.
#[tokio::test]
async fn node_reading_for_placement() {
    let gpus = fairway::agent::parse_simulated_gpus("80:10,80:0").unwrap();
    let node = Agent::with(AgentConfig {
        simulated_gpus: Some(gpus.clone()),
        ..AgentConfig::for_node("gpu-node-1")
    })
    .await;
    let reply = node.get("/node").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let doc: NodeReading = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(
        (doc.node.as_str(), doc.gpus.len(), doc.engine),
        ("gpu-node-1", 2, None)
    );
    assert_eq!(doc.gpus[0].memory_used_bytes, 10_000_000_000);
    let no_engine = node.get("/reading").await;
    assert_eq!(no_engine.status, StatusCode::NOT_FOUND);
    assert!(
        no_engine.text().contains("GET /node"),
        "{}",
        no_engine.text()
    );

    let sim = sim().await;
    let engine = Agent::with(AgentConfig {
        model: Some("llama".into()),
        engine_gpus: Some(vec![1]),
        node: "gpu-node-1".into(),
        ..AgentConfig::for_engine(format!("{}/metrics", sim.url()))
    })
    .await;
    engine.get("/node").await;
    let chat = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;
    let reply = send(
        &client(),
        post(sim.addr(), "/v1/chat/completions", None, chat),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    decode(&engine.get("/reading").await);
    let doc: NodeReading = serde_json::from_slice(&engine.get("/node").await.body).unwrap();
    let e = doc.engine.unwrap();
    assert_eq!(
        (e.model.as_deref(), e.gpus.as_slice(), e.error),
        (Some("llama"), &[1][..], None)
    );
    assert!(
        e.ttft_p99_seconds.is_some(),
        "the /reading in between took the window"
    );

    // Without --model, the model the engine's metrics name.
    let unnamed = Agent::with(AgentConfig::for_engine(format!("{}/metrics", sim.url()))).await;
    let doc: NodeReading = serde_json::from_slice(&unnamed.get("/node").await.body).unwrap();
    assert_eq!(doc.engine.unwrap().model.as_deref(), Some("m"));

    let dead = Agent::with(AgentConfig {
        node: "gpu-node-2".into(),
        ..AgentConfig::for_engine(format!("http://{}/metrics", dead_addr().await))
    })
    .await;
    let doc: NodeReading = serde_json::from_slice(&dead.get("/node").await.body).unwrap();
    let error = doc.engine.unwrap().error.unwrap();
    assert!(error.contains("/metrics"), "{error}");
}

#[tokio::test]
async fn health_answers_and_unknown_routes_do_not() {
    let engine = dead_addr().await;
    let agent = Agent::start(format!("http://{engine}/metrics"), Duration::from_secs(1)).await;

    let health = agent.get("/health").await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.text(), "ok");

    let missing = agent.get("/metrics").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.json()["error"].is_string(), "{}", missing.text());

    let req = Request::post(format!("http://{}/reading", agent.addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let wrong = send(&client(), req).await;
    assert_eq!(wrong.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(wrong.headers.get("allow").unwrap(), "GET");
    assert!(wrong.json()["error"].is_string(), "{}", wrong.text());
}

#[tokio::test]
async fn engine_down_is_a_502_naming_the_url() {
    let engine = dead_addr().await;
    let url = format!("http://{engine}/metrics");
    let agent = Agent::start(url.clone(), Duration::from_secs(1)).await;

    let reply = agent.get("/reading").await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.text());
    let error = reply.json()["error"].as_str().unwrap().to_owned();
    assert!(error.contains(&url), "{error}");
    // The agent keeps serving; the next scrape fails the same way.
    assert_eq!(agent.get("/reading").await.status, StatusCode::BAD_GATEWAY);
}

#[tokio::test]
async fn hung_engine_times_out_into_a_502() {
    let sim = sim().await;
    sim.set_fault(Fault::Hang);
    let url = format!("{}/metrics", sim.url());
    let agent = Agent::start(url.clone(), Duration::from_millis(200)).await;

    let reply = agent.get("/reading").await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.text());
    let error = reply.json()["error"].as_str().unwrap().to_owned();
    assert!(error.contains(&url) && error.contains("within"), "{error}");

    // Recovery needs no restart.
    sim.set_fault(Fault::None);
    decode(&agent.get("/reading").await);
}

#[tokio::test]
async fn wrong_endpoint_is_a_502_not_an_empty_reading() {
    let sim = sim().await;
    let url = format!("{}/v1/models", sim.url());
    let agent = Agent::start(url.clone(), Duration::from_secs(1)).await;

    let reply = agent.get("/reading").await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.text());
    let error = reply.json()["error"].as_str().unwrap().to_owned();
    assert!(error.contains(&url), "{error}");
}

#[tokio::test]
async fn invalid_config_is_refused_before_serving() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cfg = AgentConfig::for_engine("https://127.0.0.1:1/metrics");
    assert!(cfg.validate().is_err());
    let err = serve(listener, cfg, std::future::pending())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

/// The agent binary; killed on drop so a failed assert leaves no process.
struct Binary(Child);

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn binary_prints_its_address_serves_readings_and_stops_on_sigterm() {
    let sim = sim().await;
    let engine_url = format!("{}/metrics", sim.url());
    let mut child = Binary(
        Command::new(env!("CARGO_BIN_EXE_fairway"))
            .args(["agent", "--listen", "127.0.0.1:0", "--engine-metrics"])
            .arg(&engine_url)
            .args(["--timeout", "2s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the fairway binary starts"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    let rest = line
        .strip_prefix("fairway agent listening on http://")
        .unwrap_or_else(|| panic!("unexpected listen line: {line:?}"));
    let (addr, engine) = rest.trim_end().split_once(' ').unwrap();
    assert!(engine.ends_with(&format!(", {engine_url})")), "{engine}");

    let reply = get(&client(), format!("http://{addr}/reading")).await;
    decode(&reply);

    let pid = child.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let exited = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let status = exited
        .await
        .expect("the agent stops within 10 s of SIGTERM");
    assert!(status.success(), "agent exited with {status}");
}
