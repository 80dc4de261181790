//! The placement service: loading its policy, the listener and its TLS,
//! the background poll of the agents and the watch of its files, and the
//! endpoints' routing, `/metrics` and `/nodes`. The extender's and the
//! webhook's decisions are `decide.rs`.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use parking_lot::Mutex;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::nodes::{AgentEntry, Nodes};
use crate::agent::NodeReading;
use crate::clock::Clock;
use crate::config::validate::OTLP_ENDPOINT_ENV;
use crate::config::{ConfigError, PlacementPolicy, Policy, load_policy_with_env};
use crate::core::placement::PodRequest;
use crate::core::time::Instant;
use crate::net::scrape::ScrapeError;

/// Largest request body read (an extender's `NodeList` of a big cluster).
pub(super) const MAX_BODY: usize = 16 << 20;
/// Time a caller has to send its body.
pub(super) const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of a refused HTTP/2 body read to close its stream cleanly.
pub(super) const DRAIN_LIMIT: usize = 2 * MAX_BODY;
/// Decisions kept for `GET /nodes`.
pub(super) const DECISIONS_KEPT: usize = 256;
/// Pods remembered from `CREATE` for their binding.
pub(super) const PODS_KEPT: usize = 10_000;
/// Largest agent answer read.
pub(super) const MAX_READING: usize = 1 << 20;
/// Open connections at once; more are closed at accept.
pub(super) const MAX_CONNECTIONS: usize = 1024;
/// How often the policy and certificate files are checked for changes.
pub(super) const WATCH_INTERVAL: Duration = Duration::from_secs(2);
/// What placement's policy loader puts in a variable it does not have.
const STAND_IN: &str = "unused by fairway placement: ";

/// Why the placement service cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid policy:\n{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Policy(Vec<crate::config::ConfigError>),
    #[error(
        "[placement] tls is not set: Kubernetes calls webhooks and HTTPS extenders over TLS only"
    )]
    NoTls,
    #[error(transparent)]
    Tls(#[from] crate::net::tls::TlsError),
    /// The store's password variable is not set.
    #[error(
        "[cluster] store: the variable {0} (password_env) is not set: placement shares its reservations through the store and needs its password"
    )]
    NoStorePassword(String),
    /// The store's connection could not be set up.
    #[error("[cluster] store")]
    Store(#[source] crate::cluster::ConnectError),
}

/// One answer, kept for `GET /nodes`.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Decision {
    pub(super) unix_time: u64,
    pub(super) what: &'static str,
    pub(super) pod: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) node: Option<String>,
    pub(super) allowed: bool,
    pub(super) message: String,
}

/// What `GET /metrics` counts.
#[derive(Debug, Default)]
pub(super) struct Counters {
    /// By (kind, allowed).
    pub(super) decisions: std::collections::BTreeMap<(&'static str, bool), u64>,
    /// By rule.
    pub(super) refusals: std::collections::BTreeMap<&'static str, u64>,
    /// Agent reads by success.
    pub(super) reads: [u64; 2],
    /// Store calls that failed.
    pub(super) store_errors: u64,
    /// Bindings judged again because another replica reserved on their
    /// node in between.
    pub(super) conflicts: u64,
}

/// The service's state.
pub(super) struct Placement {
    pub(super) path: PathBuf,
    pub(super) clock: Clock,
    pub(super) policy: ArcSwap<PlacementPolicy>,
    pub(super) tls: ArcSwap<rustls::ServerConfig>,
    /// Hash of the policy text, and of the certificate and key files.
    pub(super) hashes: Mutex<(String, String)>,
    pub(super) nodes: Mutex<Nodes>,
    /// Pods seen at `CREATE`, by `namespace/name`.
    pub(super) pods: Mutex<HashMap<String, (PodRequest, Instant)>>,
    pub(super) decisions: Mutex<VecDeque<Decision>>,
    pub(super) counters: Mutex<Counters>,
    pub(super) polled: AtomicBool,
    pub(super) client: crate::net::client::Client,
    /// The cluster's store, with `[cluster]`.
    pub(super) shared: Option<super::shared::Shared>,
    /// Whether the store's last call succeeded.
    pub(super) store_up: AtomicBool,
}

/// The shared policy file, read without the gateway's secrets: placement
/// checks no API key, so a variable the policy names for a key, a token or
/// a password, missing from its environment, stands for a value it never
/// uses. (The collector's variable, which the policy does not name, keeps
/// its meaning.)
fn load_policy(path: &std::path::Path) -> Result<(Policy, String), Vec<ConfigError>> {
    load_policy_with_env(path, &|name| {
        std::env::var(name)
            .ok()
            .or_else(|| (name != OTLP_ENDPOINT_ENV).then(|| format!("{STAND_IN}{name}")))
    })
}

/// The link to `[cluster]`'s store, whose password placement does use.
fn shared(policy: &Policy) -> Result<Option<super::shared::Shared>, StartError> {
    let Some(cluster) = &policy.cluster else {
        return Ok(None);
    };
    if let Some(name) = cluster
        .password
        .as_ref()
        .and_then(|p| p.0.strip_prefix(STAND_IN))
    {
        return Err(StartError::NoStorePassword(name.to_owned()));
    }
    super::shared::Shared::connect(cluster)
        .map(Some)
        .map_err(StartError::Store)
}

/// Loads the policy at `path` and checks that the service can serve it.
pub fn load(path: &std::path::Path) -> Result<PlacementPolicy, StartError> {
    let (policy, _) = load_policy(path).map_err(StartError::Policy)?;
    let placement = policy.placement;
    let tls = placement.tls.as_ref().ok_or(StartError::NoTls)?;
    crate::net::tls::load(&tls.cert, &tls.key, "placement.tls")?;
    Ok(placement)
}

/// Serves the policy at `path` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    path: PathBuf,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let (policy, text) = load_policy(&path).map_err(StartError::Policy)?;
    let shared = shared(&policy)?;
    let placement = policy.placement;
    let tls_policy = placement.tls.clone().ok_or(StartError::NoTls)?;
    let tls = crate::net::tls::load(&tls_policy.cert, &tls_policy.key, "placement.tls")?;
    let svc = Arc::new(Placement {
        clock: Clock::new(),
        policy: ArcSwap::from_pointee(placement),
        tls: ArcSwap::new(tls),
        hashes: Mutex::new((digest(text.as_bytes()), cert_digest(&tls_policy))),
        nodes: Mutex::new(Nodes::default()),
        pods: Mutex::new(HashMap::new()),
        decisions: Mutex::new(VecDeque::new()),
        counters: Mutex::new(Counters::default()),
        polled: AtomicBool::new(false),
        client: crate::net::client::client(),
        path,
        store_up: AtomicBool::new(shared.is_some()),
        shared,
    });
    let stop = tokio_util::sync::CancellationToken::new();
    let background = tokio::spawn({
        let (svc, stop) = (Arc::clone(&svc), stop.clone());
        async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = poll_agents(Arc::clone(&svc)) => {}
                () = watch_files(svc) => {}
            }
        }
    });

    let mut tasks = JoinSet::new();
    let graceful = GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    crate::net::accept::accept_loop(
        &listener,
        shutdown,
        "placement",
        || {},
        |stream, peer| {
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                tracing::debug!(%peer, "too many connections; closed");
                return;
            };
            let config = svc.tls.load_full();
            let svc = Arc::clone(&svc);
            let builder = builder.clone();
            let watcher = graceful.watcher();
            while tasks.try_join_next().is_some() {}
            tasks.spawn(async move {
                let _slot = slot;
                let Some(tls) = crate::net::tls::handshake(config, stream, peer).await else {
                    return;
                };
                let handler = service_fn(move |req| {
                    let svc = Arc::clone(&svc);
                    async move { Ok::<_, Infallible>(svc.handle(req).await) }
                });
                let conn = builder.serve_connection(TokioIo::new(tls), handler);
                let _ = watcher.watch(conn.into_owned()).await;
            });
        },
    )
    .await;
    drop(listener);
    stop.cancel();
    let _ = background.await;
    if tokio::time::timeout(Duration::from_secs(5), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("placement drain timed out; closing the remaining connections");
    }
    tasks.shutdown().await;
    Ok(())
}

fn digest(bytes: &[u8]) -> String {
    crate::hex::hex(&Sha256::digest(bytes))
}

/// The hash of the certificate and key files, empty when unreadable.
fn cert_digest(tls: &crate::config::TlsPolicy) -> String {
    let mut h = Sha256::new();
    for path in [&tls.cert, &tls.key] {
        h.update(std::fs::read(path).unwrap_or_default());
    }
    crate::hex::hex(&h.finalize())
}

/// Re-reads the policy when its text changes, and the certificate when
/// its files do (cert-manager rotates the Secret under the same policy).
/// An invalid file or certificate keeps what runs, with an error logged.
async fn watch_files(svc: Arc<Placement>) {
    loop {
        tokio::time::sleep(WATCH_INTERVAL).await;
        let Ok(text) = tokio::fs::read(&svc.path).await else {
            continue;
        };
        let text_hash = digest(&text);
        if text_hash != svc.hashes.lock().0 {
            match load_policy(&svc.path) {
                Ok((policy, _)) => {
                    let new = policy.placement;
                    if new.listen != svc.policy.load().listen {
                        tracing::warn!(
                            "placement.listen changed; restart to listen on {}",
                            new.listen
                        );
                    }
                    tracing::info!("policy reloaded");
                    svc.policy.store(Arc::new(new));
                }
                Err(errors) => {
                    for e in errors {
                        tracing::error!("policy reload refused: {e}");
                    }
                }
            }
            svc.hashes.lock().0 = text_hash;
        }
        let Some(tls) = svc.policy.load().tls.clone() else {
            tracing::error!("placement.tls was removed; keeping the certificate in use");
            continue;
        };
        let cert_hash = cert_digest(&tls);
        if cert_hash != svc.hashes.lock().1 {
            match crate::net::tls::load(&tls.cert, &tls.key, "placement.tls") {
                Ok(config) => {
                    tracing::info!("certificate reloaded");
                    svc.tls.store(config);
                }
                Err(e) => tracing::error!(error = %e, "certificate reload refused"),
            }
            svc.hashes.lock().1 = cert_hash;
        }
    }
}

/// Reads every agent every `poll_interval`, for ever.
async fn poll_agents(svc: Arc<Placement>) {
    loop {
        let policy = svc.policy.load_full();
        let mut urls = policy.agents.clone();
        for name in &policy.agents_dns {
            match tokio::net::lookup_host(name.as_str()).await {
                Ok(addrs) => urls.extend(addrs.map(|a| format!("http://{a}"))),
                Err(e) => tracing::warn!(name, error = %e, "resolving agents failed"),
            }
        }
        urls.sort();
        urls.dedup();
        let timeout = policy
            .poll_interval
            .clamp(Duration::from_secs(1), Duration::from_secs(5));
        let reads = urls.iter().map(|url| svc.read_agent(url, timeout));
        let results = futures_util::future::join_all(reads).await;
        let at = svc.clock.now();
        {
            let mut nodes = svc.nodes.lock();
            nodes.agents.retain(|url, _| urls.contains(url));
            let mut counters = svc.counters.lock();
            for (url, result) in urls.iter().zip(results) {
                counters.reads[usize::from(result.is_ok())] += 1;
                match result {
                    Ok(reading) => {
                        nodes.agents.insert(url.clone(), AgentEntry { reading, at });
                    }
                    Err(e) => tracing::debug!(url, error = %e, "reading an agent failed"),
                }
            }
        }
        svc.share_reservations(at, policy.stale_after).await;
        svc.polled.store(true, Ordering::Relaxed);
        tokio::time::sleep(policy.poll_interval).await;
    }
}

impl Placement {
    /// Settles the reservations after a poll: with a store, every
    /// replica's (read from it) replace this one's, and those that ended
    /// are dropped there too.
    async fn share_reservations(&self, now: Instant, stale_after: Duration) {
        if let Some(shared) = &self.shared {
            match shared.all(now).await {
                Ok(all) => {
                    self.store_answered();
                    self.nodes.lock().reservations = all;
                }
                Err(e) => self.store_failed(&e),
            }
        }
        self.settle(now, stale_after).await;
    }

    /// Drops the reservations that ended (their engine shows, or they
    /// expired), here and in the store.
    pub(super) async fn settle(&self, now: Instant, stale_after: Duration) {
        let ended = self.nodes.lock().settle(now, stale_after);
        if let (Some(shared), false) = (&self.shared, ended.is_empty())
            && let Err(e) = shared.release(&ended).await
        {
            self.store_failed(&e);
        }
    }

    /// One agent's reading; a failure is the agent's, and the next poll
    /// tries again.
    async fn read_agent(&self, url: &str, timeout: Duration) -> Result<NodeReading, ScrapeError> {
        let url = format!("{url}/node");
        let body = crate::net::scrape::get(&self.client, &url, timeout, MAX_READING).await?;
        serde_json::from_slice::<NodeReading>(&body).map_err(|e| ScrapeError::unusable(&url, e))
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        let takes_body = matches!(path.as_str(), "/filter" | "/prioritize" | "/validate");
        let posted = if method == Method::POST && takes_body {
            match read_body(req).await {
                Ok(body) => body,
                Err(refused) => return refused,
            }
        } else {
            Bytes::new()
        };
        self.answer(&method, &path, &posted).await
    }

    async fn answer(&self, method: &Method, path: &str, body: &[u8]) -> Response<Full<Bytes>> {
        match (method, path) {
            (&Method::GET, "/healthz") => text(StatusCode::OK, "ok"),
            (&Method::GET, "/readyz") => {
                if self.polled.load(Ordering::Relaxed) {
                    text(StatusCode::OK, "ready")
                } else {
                    text(StatusCode::SERVICE_UNAVAILABLE, "agents not read yet")
                }
            }
            (&Method::GET, "/nodes") => json(StatusCode::OK, &self.report()),
            (&Method::GET, "/metrics") => respond(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                self.metrics().into_bytes(),
            ),
            (&Method::POST, "/filter") => self.filter(body),
            (&Method::POST, "/prioritize") => self.prioritize(body),
            (&Method::POST, "/validate") => self.validate(body).await,
            (_, "/healthz" | "/readyz" | "/nodes") => {
                error(StatusCode::METHOD_NOT_ALLOWED, &format!("{path} takes GET"))
            }
            (_, "/filter" | "/prioritize" | "/validate") => error(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("{path} takes POST"),
            ),
            _ => error(
                StatusCode::NOT_FOUND,
                &format!(
                    "no endpoint {path}; placement serves POST /filter, /prioritize, /validate \
                     and GET /nodes, /metrics, /healthz, /readyz"
                ),
            ),
        }
    }
}

/// A request's body, within [`MAX_BODY`] and [`BODY_TIMEOUT`]. A body
/// declared over the limit is refused at its header, before any of it is
/// read, on HTTP/1 and HTTP/2 alike.
async fn read_body(req: Request<Incoming>) -> Result<Bytes, Response<Full<Bytes>>> {
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("the body is over {MAX_BODY} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let http2 = req.version() == http::Version::HTTP_2;
    let mut body = req.into_body();
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        if http2 {
            tokio::spawn(drain(body));
        }
        return Err(too_large());
    }
    let mut read = bytes::BytesMut::new();
    let until = tokio::time::Instant::now() + BODY_TIMEOUT;
    loop {
        match tokio::time::timeout_at(until, body.frame()).await {
            Ok(None) => return Ok(read.freeze()),
            Ok(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if read.len() + data.len() > MAX_BODY {
                    if http2 {
                        tokio::spawn(drain(body));
                    }
                    return Err(too_large());
                }
                read.extend_from_slice(&data);
            }
            Ok(Some(Err(e))) => return Err(bad_request(&format!("reading the body failed: {e}"))),
            Err(_) => {
                return Err(error(
                    StatusCode::REQUEST_TIMEOUT,
                    &format!("the body did not arrive within {BODY_TIMEOUT:?}"),
                ));
            }
        }
    }
}

/// Reads and drops what is left of a refused HTTP/2 request's body, at
/// most [`DRAIN_LIMIT`] bytes within [`BODY_TIMEOUT`]: dropped unread, the
/// body ends its stream with `RST_STREAM`, which a client still sending
/// reports as a stream error and never shows the status it was answered;
/// read to its end, the stream closes cleanly after the answer (RFC 9113
/// §8.1).
async fn drain(mut body: Incoming) {
    let mut read = 0usize;
    let until = tokio::time::Instant::now() + BODY_TIMEOUT;
    while read <= DRAIN_LIMIT {
        match tokio::time::timeout_at(until, body.frame()).await {
            Ok(Some(Ok(frame))) => read += frame.data_ref().map_or(0, Bytes::len),
            _ => return,
        }
    }
}

pub(super) fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: Vec<u8>,
) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

pub(super) fn json(status: StatusCode, value: &impl Serialize) -> Response<Full<Bytes>> {
    match serde_json::to_vec(value) {
        Ok(body) => respond(status, "application/json", body),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("serializing: {e}"),
        ),
    }
}

pub(super) fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    respond(
        status,
        "text/plain; charset=utf-8",
        body.as_bytes().to_vec(),
    )
}

pub(super) fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    json(status, &serde_json::json!({ "error": message }))
}

pub(super) fn bad_request(message: &str) -> Response<Full<Bytes>> {
    error(StatusCode::BAD_REQUEST, message)
}
