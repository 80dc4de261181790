//! `fairway placement`: the Kubernetes side of placement. A kube-scheduler
//! extender and a validating admission webhook, over HTTPS, that apply
//! `core::placement`'s rules to what the agents on the GPU nodes read.
//!
//! A process of its own, not a listener of `fairway serve`: it answers the
//! API server and the scheduler, not clients; it scales, restarts and
//! fails independently of the data path (a webhook outage must not take
//! the gateway with it, nor a gateway rollout the webhook), and it reads
//! the node agents, which the gateway does not. It shares the policy file,
//! so `fairway check` validates its `[placement]` section with the rest.
//!
//! Endpoints:
//! - `POST /filter`, `POST /prioritize`: the extender (`ExtenderArgs` in;
//!   `ExtenderFilterResult`, `HostPriorityList` out);
//! - `POST /validate`: `AdmissionReview` v1 for pod `CREATE` (refuses a
//!   model pod no known node can take, or one created already bound to a
//!   node without headroom) and `pods/binding` (refuses a binding to a node
//!   without headroom; allowed bindings reserve the model's memory on the
//!   GPU chosen, unless `dryRun`);
//! - `GET /nodes`: the nodes as the rules see them, the reservations and
//!   the latest decisions with their messages;
//! - `GET /metrics`: decisions by kind and result, refusals by rule, agent
//!   reads, nodes known and fresh, reservations (Prometheus text);
//! - `GET /healthz` (always 200), `GET /readyz` (200 once the agents have
//!   been polled once).
//!
//! Every answer is computed from memory: the agents are polled in the
//! background every `poll_interval`, so a request never waits on an agent
//! and the webhook answers well within Kubernetes' timeout. Bodies are
//! bounded (16 MiB, 10 s). A pod without the `fairway.dev/model-size-gb`
//! annotation is not placement's business and is always allowed.

pub mod k8s;
pub mod nodes;

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
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use self::k8s::{
    AdmissionRequest, AdmissionReview, Binding, ExtenderArgs, ExtenderFilterResult, HostPriority,
    Pod, Verdict,
};
use self::nodes::{AgentEntry, Nodes, Reservation};
use crate::agent::NodeReading;
use crate::clock::{Clock, unix_seconds};
use crate::config::validate::OTLP_ENDPOINT_ENV;
use crate::config::{ConfigError, PlacementPolicy, Policy, load_policy_with_env};
use crate::core::placement::{Fit, PodRequest, Refusal, assess};
use crate::core::time::Instant;
use crate::prom::{self, Kind};

/// Largest request body read (an extender's `NodeList` of a big cluster).
const MAX_BODY: usize = 16 << 20;
/// Time a caller has to send its body.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Decisions kept for `GET /nodes`.
const DECISIONS_KEPT: usize = 256;
/// Pods remembered from `CREATE` for their binding, and for how long.
const PODS_KEPT: usize = 10_000;
const POD_TTL: Duration = Duration::from_secs(3600);
/// Largest agent answer read.
const MAX_READING: usize = 1 << 20;
/// Open connections at once; more are closed at accept.
const MAX_CONNECTIONS: usize = 1024;
/// How often the policy and certificate files are checked for changes.
const WATCH_INTERVAL: Duration = Duration::from_secs(2);

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
}

/// One answer, kept for `GET /nodes`.
#[derive(Clone, Debug, Serialize)]
struct Decision {
    unix_time: u64,
    what: &'static str,
    pod: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    allowed: bool,
    message: String,
}

/// What `GET /metrics` counts.
#[derive(Debug, Default)]
struct Counters {
    /// By (kind, allowed).
    decisions: std::collections::BTreeMap<(&'static str, bool), u64>,
    /// By rule.
    refusals: std::collections::BTreeMap<&'static str, u64>,
    /// Agent reads by success.
    reads: [u64; 2],
}

/// The service's state.
struct Placement {
    path: PathBuf,
    clock: Clock,
    policy: ArcSwap<PlacementPolicy>,
    tls: ArcSwap<rustls::ServerConfig>,
    /// Hash of the policy text, and of the certificate and key files.
    hashes: Mutex<(String, String)>,
    nodes: Mutex<Nodes>,
    /// Pods seen at `CREATE`, by `namespace/name`.
    pods: Mutex<HashMap<String, (PodRequest, Instant)>>,
    decisions: Mutex<VecDeque<Decision>>,
    counters: Mutex<Counters>,
    polled: AtomicBool,
    client: crate::net::client::Client,
}

/// The shared policy file, read without the gateway's secrets: placement
/// checks no API key, so a variable the policy names for a key, a token or
/// a password, missing from its environment, stands for a value it never
/// uses. (The collector's variable, which the policy does not name, keeps
/// its meaning.)
fn load_policy(path: &std::path::Path) -> Result<(Policy, String), Vec<ConfigError>> {
    load_policy_with_env(path, &|name| {
        std::env::var(name).ok().or_else(|| {
            (name != OTLP_ENDPOINT_ENV).then(|| format!("unused by fairway placement: {name}"))
        })
    })
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
            drop(counters);
            nodes.settle(at, policy.stale_after);
        }
        svc.polled.store(true, Ordering::Relaxed);
        tokio::time::sleep(policy.poll_interval).await;
    }
}

impl Placement {
    async fn read_agent(&self, url: &str, timeout: Duration) -> Result<NodeReading, String> {
        let url = format!("{url}/node");
        let body = crate::net::scrape::get(&self.client, &url, timeout, MAX_READING)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::from_slice::<NodeReading>(&body).map_err(|e| e.to_string())
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = req.uri().path().to_owned();
        match (req.method(), path.as_str()) {
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
            (&Method::POST, "/filter" | "/prioritize" | "/validate") => {
                let body = match read_body(req).await {
                    Ok(body) => body,
                    Err(resp) => return resp,
                };
                match path.as_str() {
                    "/filter" => self.filter(&body),
                    "/prioritize" => self.prioritize(&body),
                    _ => self.validate(&body),
                }
            }
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

    /// `node` judged for `pod` now.
    fn assess(&self, node: &str, pod: &PodRequest) -> Result<Fit, Vec<Refusal>> {
        let policy = self.policy.load();
        let now = self.clock.now();
        let state = self.nodes.lock().state(node, now, policy.stale_after);
        assess(&policy.spec(), now, &state, pod)
    }

    fn record(
        &self,
        what: &'static str,
        pod: String,
        node: Option<String>,
        allowed: bool,
        message: String,
    ) {
        let mut d = self.decisions.lock();
        if d.len() == DECISIONS_KEPT {
            d.pop_front();
        }
        d.push_back(Decision {
            unix_time: unix_seconds(),
            what,
            pod,
            node,
            allowed,
            message,
        });
    }

    /// Counts one decision of `kind` and the rules that refused it.
    fn count(&self, kind: &'static str, allowed: bool, refusals: &[Refusal]) {
        let mut c = self.counters.lock();
        *c.decisions.entry((kind, allowed)).or_default() += 1;
        for r in refusals {
            *c.refusals.entry(r.rule.as_str()).or_default() += 1;
        }
    }

    fn filter(&self, body: &[u8]) -> Response<Full<Bytes>> {
        let args: ExtenderArgs = match serde_json::from_slice(body) {
            Ok(a) => a,
            Err(e) => return bad_request(&format!("not an ExtenderArgs body: {e}")),
        };
        let mut result = ExtenderFilterResult::default();
        let names = candidate_names(&args);
        let pod = match args.pod.request() {
            Ok(Some(pod)) => pod,
            Ok(None) => {
                result.nodes = args.nodes;
                result.node_names = args.nodenames;
                return json(StatusCode::OK, &result);
            }
            Err(e) => {
                result.error = e;
                return json(StatusCode::OK, &result);
            }
        };
        let mut passed = Vec::new();
        for name in names {
            match self.assess(&name, &pod) {
                Ok(_) => {
                    self.count("filter", true, &[]);
                    passed.push(name);
                }
                Err(refusals) => {
                    self.count("filter", false, &refusals);
                    let message = joined(&refusals);
                    self.record(
                        "filter",
                        args.pod.key(),
                        Some(name.clone()),
                        false,
                        message.clone(),
                    );
                    result.failed_nodes.insert(name, message);
                }
            }
        }
        if let Some(mut list) = args.nodes {
            list.items
                .retain(|n| k8s::node_name(n).is_some_and(|n| passed.iter().any(|p| p == n)));
            result.nodes = Some(list);
        }
        if args.nodenames.is_some() {
            result.node_names = Some(passed);
        }
        json(StatusCode::OK, &result)
    }

    fn prioritize(&self, body: &[u8]) -> Response<Full<Bytes>> {
        let args: ExtenderArgs = match serde_json::from_slice(body) {
            Ok(a) => a,
            Err(e) => return bad_request(&format!("not an ExtenderArgs body: {e}")),
        };
        let pod = args.pod.request().ok().flatten();
        let scores: Vec<HostPriority> = candidate_names(&args)
            .into_iter()
            .map(|host| {
                let score = pod
                    .as_ref()
                    .and_then(|pod| self.assess(&host, pod).ok())
                    .map_or(0, |fit| i64::from(fit.score));
                HostPriority { host, score }
            })
            .collect();
        json(StatusCode::OK, &scores)
    }

    fn validate(&self, body: &[u8]) -> Response<Full<Bytes>> {
        let review: AdmissionReview = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => return bad_request(&format!("not an AdmissionReview body: {e}")),
        };
        if review.api_version != "admission.k8s.io/v1" || review.kind != "AdmissionReview" {
            return bad_request(&format!(
                "expected apiVersion admission.k8s.io/v1, kind AdmissionReview; got {}, {}",
                review.api_version, review.kind
            ));
        }
        let Some(req) = review.request else {
            return bad_request("the AdmissionReview has no request");
        };
        let verdict = self.admit(&req);
        json(StatusCode::OK, &verdict.review(&req.uid))
    }

    /// The webhook's decision on one request.
    fn admit(&self, req: &AdmissionRequest) -> Verdict {
        if req.operation != "CREATE" || req.resource.resource != "pods" {
            return Verdict::allow();
        }
        let Some(object) = &req.object else {
            return Verdict::deny(400, "the request has no object".into());
        };
        match req.sub_resource.as_str() {
            "" => match serde_json::from_value::<Pod>(object.clone()) {
                Ok(pod) => self.admit_pod(req, &pod),
                Err(e) => Verdict::deny(400, format!("the object is not a Pod: {e}")),
            },
            "binding" => match serde_json::from_value::<Binding>(object.clone()) {
                Ok(binding) => self.admit_binding(req, &binding),
                Err(e) => Verdict::deny(400, format!("the object is not a Binding: {e}")),
            },
            _ => Verdict::allow(),
        }
    }

    fn admit_pod(&self, req: &AdmissionRequest, pod: &Pod) -> Verdict {
        let request = match pod.request() {
            Ok(Some(r)) => r,
            Ok(None) => return Verdict::allow(),
            Err(e) => return Verdict::deny(400, e),
        };
        let mut pod = pod.clone();
        if pod.metadata.namespace.is_empty() {
            pod.metadata.namespace.clone_from(&req.namespace);
        }
        let key = pod.key();
        if !pod.spec.node_name.is_empty() {
            // Created already bound: this is the only check it gets.
            return self.bind(req, key, &pod.spec.node_name, request);
        }
        if !req.dry_run {
            self.remember(&key, request.clone());
        }
        let names = self.nodes.lock().names();
        if names.is_empty() {
            return match self.policy.load().on_stale {
                crate::core::placement::OnStale::Allow => Verdict::allow_with(
                    "fairway placement has no agent readings yet; pod not checked".into(),
                ),
                crate::core::placement::OnStale::Refuse => {
                    let message = format!(
                        "no GPU node has reported to fairway placement, and placement.on_stale is \"refuse\" (pod {key})"
                    );
                    self.count("pod", false, &[]);
                    self.record("pod", key, None, false, message.clone());
                    Verdict::deny(403, message)
                }
            };
        }
        let mut refusals = Vec::new();
        for name in &names {
            match self.assess(name, &request) {
                Ok(_) => {
                    self.count("pod", true, &[]);
                    return Verdict::allow();
                }
                Err(mut r) => refusals.append(&mut r),
            }
        }
        let message = format!(
            "no GPU node can take model {} ({:.1} GB) for pod {key}: {}",
            request.model,
            request.memory as f64 / 1e9,
            joined(&refusals)
        );
        self.count("pod", false, &refusals);
        self.record("pod", key, None, false, message.clone());
        Verdict::deny(403, message)
    }

    fn admit_binding(&self, req: &AdmissionRequest, binding: &Binding) -> Verdict {
        let name = if req.name.is_empty() {
            &binding.metadata.name
        } else {
            &req.name
        };
        let namespace = if req.namespace.is_empty() {
            &binding.metadata.namespace
        } else {
            &req.namespace
        };
        let key = format!("{namespace}/{name}");
        let request = {
            let now = self.clock.now();
            let pods = self.pods.lock();
            pods.get(&key)
                .filter(|(_, seen)| now.saturating_since(*seen) <= POD_TTL)
                .map(|(r, _)| r.clone())
        };
        let Some(request) = request else {
            // Not a model pod, or one created before this process started.
            return Verdict::allow();
        };
        self.bind(req, key, &binding.target.name, request)
    }

    /// Judges `node` for the pod `key`; an allowed, non-dry-run placement
    /// reserves the model's memory on the chosen GPU.
    fn bind(
        &self,
        req: &AdmissionRequest,
        key: String,
        node: &str,
        request: PodRequest,
    ) -> Verdict {
        let (what, kind) = if req.dry_run {
            ("binding (dry run)", "binding_dry_run")
        } else {
            ("binding", "binding")
        };
        match self.assess(node, &request) {
            Ok(fit) => {
                let message = match fit.gpu {
                    Some(gpu) => format!("GPU {gpu}, score {}", fit.score),
                    None => "no fresh reading; allowed unchecked (placement.on_stale)".to_owned(),
                };
                if let (Some(gpu), false) = (fit.gpu, req.dry_run) {
                    let until = self.clock.now() + self.policy.load().reservation_ttl;
                    self.nodes.lock().reservations.push(Reservation {
                        pod: key.clone(),
                        node: node.to_owned(),
                        gpu,
                        request,
                        until,
                    });
                    self.pods.lock().remove(&key);
                }
                self.count(kind, true, &[]);
                self.record(what, key, Some(node.to_owned()), true, message);
                Verdict::allow()
            }
            Err(refusals) => {
                let message = format!("pod {key} cannot go on node {node}: {}", joined(&refusals));
                self.count(kind, false, &refusals);
                self.record(what, key, Some(node.to_owned()), false, message.clone());
                Verdict::deny(403, message)
            }
        }
    }

    fn remember(&self, key: &str, request: PodRequest) {
        let now = self.clock.now();
        let mut pods = self.pods.lock();
        if pods.len() >= PODS_KEPT {
            pods.retain(|_, (_, seen)| now.saturating_since(*seen) <= POD_TTL);
            if pods.len() >= PODS_KEPT
                && let Some(oldest) = pods
                    .iter()
                    .min_by_key(|(_, (_, seen))| *seen)
                    .map(|(k, _)| k.clone())
            {
                pods.remove(&oldest);
            }
        }
        pods.insert(key.to_owned(), (request, now));
    }

    /// `GET /metrics`, Prometheus text.
    fn metrics(&self) -> String {
        use std::fmt::Write;
        let policy = self.policy.load();
        let now = self.clock.now();
        let (known, fresh, reservations) = {
            let nodes = self.nodes.lock();
            let names = nodes.names();
            let fresh = names
                .iter()
                .filter(|n| !nodes.state(n, now, policy.stale_after).gpus.is_empty())
                .count();
            (names.len(), fresh, nodes.reservations.len())
        };
        let c = self.counters.lock();
        let mut w = String::new();
        prom::family(
            &mut w,
            "fairway_placement_decisions_total",
            Kind::Counter,
            "Placement decisions by kind (filter: one per node judged) and result.",
        );
        for ((kind, allowed), n) in &c.decisions {
            let result = if *allowed { "allowed" } else { "refused" };
            let _ = writeln!(
                w,
                "fairway_placement_decisions_total{{kind=\"{kind}\",result=\"{result}\"}} {n}"
            );
        }
        prom::family(
            &mut w,
            "fairway_placement_refusals_total",
            Kind::Counter,
            "Refusals by rule (one per GPU or node that failed it).",
        );
        for (rule, n) in &c.refusals {
            let _ = writeln!(w, "fairway_placement_refusals_total{{rule=\"{rule}\"}} {n}");
        }
        prom::family(
            &mut w,
            "fairway_placement_agent_reads_total",
            Kind::Counter,
            "Reads of the agents' GET /node by result.",
        );
        let _ = writeln!(
            w,
            "fairway_placement_agent_reads_total{{result=\"ok\"}} {}\n\
             fairway_placement_agent_reads_total{{result=\"failed\"}} {}",
            c.reads[1], c.reads[0]
        );
        prom::family(
            &mut w,
            "fairway_placement_nodes",
            Kind::Gauge,
            "Nodes an agent has reported, and those with a fresh reading.",
        );
        let _ = writeln!(
            w,
            "fairway_placement_nodes{{reading=\"any\"}} {known}\n\
             fairway_placement_nodes{{reading=\"fresh\"}} {fresh}"
        );
        prom::family(
            &mut w,
            "fairway_placement_reservations",
            Kind::Gauge,
            "Memory reservations held for allowed bindings.",
        );
        let _ = writeln!(w, "fairway_placement_reservations {reservations}");
        w
    }

    /// `GET /nodes`.
    fn report(&self) -> Value {
        let policy = self.policy.load();
        let now = self.clock.now();
        let nodes = self.nodes.lock();
        let states: Vec<Value> = nodes
            .names()
            .iter()
            .map(|name| {
                let s = nodes.state(name, now, policy.stale_after);
                serde_json::json!({
                    "name": s.name,
                    "reading_age_seconds": s.read_at.map(|at| now.saturating_since(at).as_secs_f64()),
                    "gpus": s.gpus.iter().map(|g| serde_json::json!({
                        "index": g.index,
                        "memory_total_bytes": g.memory_total,
                        "memory_used_bytes": g.memory_used,
                        "models": g.models,
                        "ttft_p99_seconds": g.ttft_p99.map(|d| d.as_secs_f64()),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let reservations: Vec<Value> = nodes
            .reservations
            .iter()
            .map(|r| {
                serde_json::json!({
                    "pod": r.pod,
                    "node": r.node,
                    "gpu": r.gpu,
                    "model": r.request.model,
                    "memory_bytes": r.request.memory,
                    "expires_in_seconds": r.until.saturating_since(now).as_secs_f64(),
                })
            })
            .collect();
        serde_json::json!({
            "nodes": states,
            "reservations": reservations,
            "decisions": self.decisions.lock().iter().rev().collect::<Vec<_>>(),
        })
    }
}

/// The node names an extender call asks about.
fn candidate_names(args: &ExtenderArgs) -> Vec<String> {
    match (&args.nodenames, &args.nodes) {
        (Some(names), _) => names.clone(),
        (None, Some(list)) => list
            .items
            .iter()
            .filter_map(|n| k8s::node_name(n).map(str::to_owned))
            .collect(),
        (None, None) => Vec::new(),
    }
}

fn joined(refusals: &[Refusal]) -> String {
    refusals
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, Response<Full<Bytes>>> {
    let read = Limited::new(req.into_body(), MAX_BODY).collect();
    match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Ok(Ok(body)) => Ok(body.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("the body is over {MAX_BODY} bytes"),
        )),
        Ok(Err(e)) => Err(bad_request(&format!("reading the body failed: {e}"))),
        Err(_) => Err(error(
            StatusCode::REQUEST_TIMEOUT,
            &format!("the body did not arrive within {BODY_TIMEOUT:?}"),
        )),
    }
}

fn respond(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn json(status: StatusCode, value: &impl Serialize) -> Response<Full<Bytes>> {
    match serde_json::to_vec(value) {
        Ok(body) => respond(status, "application/json", body),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("serializing: {e}"),
        ),
    }
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    respond(
        status,
        "text/plain; charset=utf-8",
        body.as_bytes().to_vec(),
    )
}

fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    json(status, &serde_json::json!({ "error": message }))
}

fn bad_request(message: &str) -> Response<Full<Bytes>> {
    error(StatusCode::BAD_REQUEST, message)
}
