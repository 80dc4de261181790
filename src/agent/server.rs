//! The agent's HTTP endpoints.
//!
//! - `GET /reading`: scrapes the engine and reads the GPUs, then answers 200
//!   with an [`AgentReading`], or 502 `{"error": "..."}` naming the engine
//!   URL and the cause when the scrape failed (the gateway counts a failed
//!   scrape; it never sees a stale or empty reading).
//!   A node agent (no engine) answers 404 here.
//! - `GET /node`: 200 with a [`NodeReading`] for the placement service: the
//!   node's GPUs and the engine's model, GPUs and TTFT p99 (a failed scrape
//!   is named in `engine.error`, never a 502: the GPUs are still news).
//! - `GET /health`: 200 `ok` while the agent runs. It says nothing about the
//!   engine: the gateway probes the engine's own health endpoint.
//! - Other paths 404, other methods 405, both with a JSON error body.
//!
//! Owns the accept loop and the connection tasks; a failing engine is
//! logged once at warn when it starts failing and once at info when it
//! recovers, at debug in between, since the gateway polls several times a
//! second.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::AgentConfig;
use super::engine::{Engine, Reader};
use super::gpu::Gpus;
use super::node::{EngineOnNode, NodeReading};
use crate::net::scrape::ScrapeError;
use crate::poller::dialect::AgentReading;

/// How long a drain waits for in-flight readings beyond one scrape timeout.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Everything a request needs.
#[derive(Debug)]
struct Agent {
    /// `None`: a node agent.
    engine: Option<Engine>,
    gpus: Gpus,
    node: String,
    model: Option<String>,
    engine_gpus: Option<Vec<u32>>,
    /// Whether the last scrape failed, so that only changes log above debug.
    is_failing: AtomicBool,
}

/// Serves `cfg` on `listener` until `shutdown` resolves, then lets in-flight
/// readings finish and returns.
///
/// Fails at once, with [`std::io::ErrorKind::InvalidInput`], when `cfg`
/// does not validate ([`AgentConfig::validate`]). Loads NVML before the
/// first accept; its absence is logged, never an error.
pub async fn serve(
    listener: TcpListener,
    cfg: AgentConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let invalid = |e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
    cfg.validate().map_err(invalid)?;
    let engine = match &cfg.engine_metrics {
        Some(url) => Some(Engine::new(url, &cfg).map_err(invalid)?),
        None => None,
    };
    let gpus = match cfg.simulated_gpus {
        Some(gpus) => Gpus::simulated(gpus),
        None => Gpus::open(cfg.nvml_lib.as_deref()),
    };
    let agent = Arc::new(Agent {
        engine,
        gpus,
        node: cfg.node,
        model: cfg.model,
        engine_gpus: cfg.engine_gpus,
        is_failing: AtomicBool::new(false),
    });
    // Every connection task lives in this set: dropping the serve future
    // aborts them all.
    let mut tasks = JoinSet::new();
    let graceful = GracefulShutdown::new();
    crate::net::accept::accept_until(
        &listener,
        shutdown,
        &graceful,
        &mut tasks,
        "agent",
        move |req| handle(Arc::clone(&agent), req),
    )
    .await;
    drop(listener);
    if tokio::time::timeout(cfg.timeout + DRAIN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("agent drain timed out; closing the remaining connections");
    }
    tasks.shutdown().await;
    Ok(())
}

async fn handle(
    agent: Arc<Agent>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let resp = match (req.method(), req.uri().path()) {
        (&Method::GET, "/reading") => reading(&agent).await,
        (&Method::GET, "/node") => node(&agent).await,
        (&Method::GET, "/health") => {
            let mut resp = respond(StatusCode::OK, Bytes::from_static(b"ok"));
            set_content_type(&mut resp, "text/plain; charset=utf-8");
            resp
        }
        (method, path @ ("/reading" | "/node" | "/health")) => {
            let mut resp = error(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("method {method} is not allowed on {path}; use GET"),
            );
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET"));
            resp
        }
        (_, path) => error(
            StatusCode::NOT_FOUND,
            &format!(
                "no endpoint {path}; the agent serves GET /reading, GET /node and GET /health"
            ),
        ),
    };
    Ok(resp)
}

/// One reading: the engine scrape and the GPUs, read concurrently.
async fn reading(agent: &Agent) -> Response<Full<Bytes>> {
    let Some(engine) = &agent.engine else {
        return error(
            StatusCode::NOT_FOUND,
            "this agent runs without an engine (no --engine-metrics); placement reads GET /node",
        );
    };
    let (engine, gpus) = tokio::join!(engine.read(Reader::Gateway), agent.gpus.read());
    let reading = match engine {
        Ok(reading) => reading,
        Err(e) => {
            let cause = chain(&e);
            agent.failing(&cause);
            return error(StatusCode::BAD_GATEWAY, &cause);
        }
    };
    agent.recovered();
    let mut doc = AgentReading::from_reading(&reading, gpus);
    if !doc.gpus.is_empty() {
        // NVML sees every process on the GPUs, the engine only its own.
        let sum = |f: fn(&crate::poller::dialect::AgentGpu) -> u64| {
            doc.gpus.iter().map(f).fold(0u64, u64::saturating_add)
        };
        doc.gpu_memory_used_bytes = Some(sum(|g| g.memory_used_bytes));
        doc.gpu_memory_total_bytes = Some(sum(|g| g.memory_total_bytes));
    }
    to_json(&doc)
}

/// The node's GPUs and, beside an engine, what it runs where.
async fn node(agent: &Agent) -> Response<Full<Bytes>> {
    let (engine, gpus) = match &agent.engine {
        Some(engine) => {
            let (read, gpus) = tokio::join!(engine.read(Reader::Placement), agent.gpus.read());
            (Some(read), gpus)
        }
        None => (None, agent.gpus.read().await),
    };
    // `--model`, else the model the engine's metrics name.
    let model = || {
        agent
            .model
            .clone()
            .or_else(|| agent.engine.as_ref().and_then(Engine::model))
    };
    let engine = engine.map(|read| {
        // Not the GPUs this agent sees: inside a container NVML numbers
        // them from 0, whatever they are on the node.
        let gpus = agent.engine_gpus.clone().unwrap_or_default();
        match read {
            Ok(reading) => {
                agent.recovered();
                EngineOnNode {
                    model: model(),
                    gpus,
                    ttft_p99_seconds: reading.ttft_p99.map(|d| d.as_secs_f64()),
                    kv_usage: reading.kv_usage,
                    error: None,
                }
            }
            Err(e) => {
                let cause = chain(&e);
                agent.failing(&cause);
                EngineOnNode {
                    model: model(),
                    gpus,
                    error: Some(cause),
                    ..EngineOnNode::default()
                }
            }
        }
    });
    to_json(&NodeReading {
        node: agent.node.clone(),
        gpus,
        engine,
    })
}

impl Agent {
    /// Logs a failing scrape at warn when it starts failing.
    fn failing(&self, cause: &str) {
        if self.is_failing.swap(true, Ordering::Relaxed) {
            tracing::debug!(error = %cause, "engine scrape failed");
        } else {
            tracing::warn!(error = %cause, "engine scrape failing");
        }
    }

    /// Logs a recovery once.
    fn recovered(&self) {
        if self.is_failing.swap(false, Ordering::Relaxed) {
            let url = self.engine.as_ref().map(Engine::url);
            tracing::info!(url, "engine scrape recovered");
        }
    }
}

fn to_json(doc: &impl serde::Serialize) -> Response<Full<Bytes>> {
    match serde_json::to_vec(doc) {
        Ok(body) => json(StatusCode::OK, Bytes::from(body)),
        Err(e) => {
            tracing::error!(error = %e, "serializing the reading failed");
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "serializing the reading failed",
            )
        }
    }
}

/// `e` and its sources, `outer: inner: innermost`.
fn chain(e: &ScrapeError) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn respond(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp
}

fn set_content_type(resp: &mut Response<Full<Bytes>>, value: &'static str) {
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
}

fn json(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut resp = respond(status, body);
    set_content_type(&mut resp, "application/json");
    resp
}

/// A JSON `{"error": message}` answer.
fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "error": message }).to_string();
    json(status, Bytes::from(body))
}
