//! The agent's HTTP endpoints.
//!
//! - `GET /reading`: scrapes the engine and reads the GPUs, then answers 200
//!   with an [`AgentReading`], or 502 `{"error": "..."}` naming the engine
//!   URL and the cause when the scrape failed (the gateway counts a failed
//!   scrape; it never sees a stale or empty reading).
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
use super::engine::{Engine, ScrapeError};
use super::gpu::Gpus;
use crate::poller::dialect::AgentReading;

/// How long a drain waits for in-flight readings beyond one scrape timeout.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Everything a request needs.
#[derive(Debug)]
struct Agent {
    engine: Engine,
    gpus: Gpus,
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
    let engine =
        Engine::new(&cfg).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let agent = Arc::new(Agent {
        engine,
        gpus: Gpus::open(cfg.nvml_lib.as_deref()),
        is_failing: AtomicBool::new(false),
    });
    // Every connection task lives in this set: dropping the serve future
    // aborts them all.
    let mut tasks = JoinSet::new();
    let graceful = GracefulShutdown::new();
    crate::accept::accept_until(
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
        (&Method::GET, "/health") => {
            let mut resp = respond(StatusCode::OK, Bytes::from_static(b"ok"));
            set_content_type(&mut resp, "text/plain; charset=utf-8");
            resp
        }
        (method, path @ ("/reading" | "/health")) => {
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
            &format!("no endpoint {path}; the agent serves GET /reading and GET /health"),
        ),
    };
    Ok(resp)
}

/// One reading: the engine scrape and the GPUs, read concurrently.
async fn reading(agent: &Agent) -> Response<Full<Bytes>> {
    let (engine, gpus) = tokio::join!(agent.engine.read(), agent.gpus.read());
    let reading = match engine {
        Ok(reading) => reading,
        Err(e) => {
            let cause = chain(&e);
            if agent.is_failing.swap(true, Ordering::Relaxed) {
                tracing::debug!(error = %cause, "engine scrape failed");
            } else {
                tracing::warn!(error = %cause, "engine scrape failing; answering 502");
            }
            return error(StatusCode::BAD_GATEWAY, &cause);
        }
    };
    if agent.is_failing.swap(false, Ordering::Relaxed) {
        tracing::info!(url = agent.engine.url(), "engine scrape recovered");
    }
    let mut doc = AgentReading::from_reading(&reading, gpus);
    if !doc.gpus.is_empty() {
        // NVML sees every process on the GPUs, the engine only its own.
        let sum = |f: fn(&crate::poller::dialect::AgentGpu) -> u64| {
            doc.gpus.iter().map(f).fold(0u64, u64::saturating_add)
        };
        doc.gpu_memory_used_bytes = Some(sum(|g| g.memory_used_bytes));
        doc.gpu_memory_total_bytes = Some(sum(|g| g.memory_total_bytes));
    }
    match serde_json::to_vec(&doc) {
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
