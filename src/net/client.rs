//! The HTTP client of everything but the request path: the pollers, the
//! trace exporter, Triton's metadata calls and placement. (Requests go
//! through the gateway's own per-thread pool, `gateway::connections`, with the
//! same timeouts.)

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// How long a connection may sit idle in a pool.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// The most idle connections kept for one backend.
pub const MAX_IDLE: usize = 1024;
/// The longest a connection may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// hyper-util's client, with whole bodies.
pub type Client = hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>;

/// A new client: keep-alive connections pooled per host, `TCP_NODELAY`,
/// [`CONNECT_TIMEOUT`] to connect, [`IDLE_TIMEOUT`] and [`MAX_IDLE`] for
/// the idle ones.
pub fn client() -> Client {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_idle_timeout(IDLE_TIMEOUT)
        .pool_max_idle_per_host(MAX_IDLE)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(connector)
}

/// What went wrong with a call through the client: the underlying error
/// (the connection's), which says more than the client's wrapper.
pub fn cause(e: &hyper_util::client::legacy::Error) -> String {
    std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string())
}
