//! The scheduling path of one inference request, in order: identify the
//! tenant, read just enough of the body, admit, queue until a window opens,
//! forward, relay, account. One `async fn`, calling the sans-IO core under
//! one lock that is never held across an `.await`.
//!
//! Every request that enters ends in exactly one recorded outcome: the
//! [`Ticket`] is created at entry and records on drop, so an early return,
//! an error, the end of the body, or the client hanging up (the future or
//! the body is dropped) each count once.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use sha2::{Digest, Sha256};

use crate::core::ids::{BackendId, PoolId, RequestId, TenantId, Usage};
use crate::core::scheduler::{Arrival, Decision};
use crate::core::time::Instant;
use crate::proxy::body::{BoxBody, RequestBody};
use crate::proxy::error::{ApiError, Outcome, RefusedBy};
use crate::proxy::gateway::{Gateway, Live, Pending};
use crate::proxy::layers::request_id::X_REQUEST_ID;
use crate::proxy::openai;
use crate::proxy::relay::{Mode, RelayBody};
use crate::telemetry::metrics::RequestRecord;
use crate::telemetry::trace::{self, Kind, Span, TraceContext, Value};

/// How a relayed body ended.
#[derive(Debug)]
pub enum BodyEnd {
    Complete { usage: Option<Usage> },
    UpstreamError(String),
}

/// One request's life in the gateway; records its outcome exactly once.
pub struct Ticket {
    gw: Arc<Gateway>,
    live: Arc<Live>,
    start: Instant,
    /// The request's `x-request-id` (set by the edge on every request).
    request_id: Option<HeaderValue>,
    tenant: Option<TenantId>,
    pool: Option<(PoolId, usize)>,
    /// Set once admitted: the scheduler knows the request.
    id: Option<RequestId>,
    backend: Option<BackendId>,
    backend_name: String,
    sent: Option<Instant>,
    first_byte: Option<Instant>,
    queue_wait: Option<Duration>,
    prompt_estimate: u32,
    /// What the client asked for (`max_tokens`, `stream`), for the access
    /// log, so `fairway workload --from-access-log` can replay it.
    max_tokens: Option<u32>,
    stream_requested: bool,
    /// Trace ids, when traces are exported.
    trace: Option<Trace>,
    /// The response is an SSE stream: its first byte is the first token.
    streaming: bool,
    /// Times the request was preempted and queued again.
    preempted: u32,
    outcome: Option<Outcome>,
    usage: Option<Usage>,
    gpu_seconds: f64,
    status: u16,
}

impl Ticket {
    fn new(gw: Arc<Gateway>, live: Arc<Live>, start: Instant, headers: &HeaderMap) -> Self {
        Ticket {
            gw,
            live,
            start,
            request_id: headers.get(X_REQUEST_ID).cloned(),
            tenant: None,
            pool: None,
            id: None,
            backend: None,
            backend_name: String::new(),
            sent: None,
            first_byte: None,
            queue_wait: None,
            prompt_estimate: 0,
            max_tokens: None,
            stream_requested: false,
            trace: None,
            streaming: false,
            preempted: 0,
            outcome: None,
            usage: None,
            gpu_seconds: 0.0,
            status: 0,
        }
    }

    /// Notes the first body byte from the backend (TTFT).
    pub fn first_byte(&mut self) {
        if self.first_byte.is_none() {
            self.first_byte = Some(self.gw.clock.now());
        }
    }

    /// The body ended (complete or broken).
    pub fn end(mut self, how: BodyEnd) {
        match how {
            BodyEnd::Complete { usage } => {
                self.usage = usage;
                if self.outcome.is_none() {
                    self.outcome = Some(Outcome::Served);
                }
            }
            BodyEnd::UpstreamError(cause) => {
                tracing::warn!(backend = %self.backend_name, %cause, "stream from backend broke");
                self.outcome = Some(Outcome::FailedUpstream);
            }
        }
        // Drop records.
    }

    /// Ends the request in the scheduler (completion or cancel).
    fn settle_core(&mut self, now: Instant) {
        let Some(id) = self.id.take() else { return };
        let mut core = self.gw.core.lock();
        core.waiters.remove(&id);
        if self.streaming
            && let (Some(backend), Some(sent), Some(first)) =
                (self.backend, self.sent, self.first_byte)
        {
            core.sched.observe_ttft(backend, first - sent);
        }
        // Served responses correct the fair-queue charge with real usage;
        // anything else ends like a cancel (queued: leaves the queue).
        let (ended, decisions) = match (self.outcome, self.usage) {
            (Some(Outcome::Served), usage @ Some(_)) => {
                match core.sched.on_completion(now, id, usage) {
                    Some((e, d)) => (Some(e), d),
                    None => (None, Vec::new()),
                }
            }
            _ => core.sched.on_cancel(now, id),
        };
        if let Some(e) = ended {
            self.gpu_seconds = e.gpu_seconds;
        }
        if let (Some(Outcome::Served), Some(u), Some(t)) = (self.outcome, self.usage, self.tenant) {
            let i = t.0 as usize;
            if core.service.len() <= i {
                core.service.resize(i + 1, 0.0);
            }
            core.service[i] += f64::from(u.prompt_tokens) + f64::from(u.completion_tokens);
        }
        core.deliver(decisions, None);
    }
}

/// A request's trace: the caller's context and our span ids.
struct Trace {
    ctx: TraceContext,
    request: [u8; 8],
    /// Sent to the backend as its parent in `traceparent`.
    upstream: [u8; 8],
    /// When admission ended (the request was queued).
    admitted: Option<Instant>,
}

impl Ticket {
    /// The request's spans: the server span and its phases.
    fn spans(
        &self,
        t: &Trace,
        end: Instant,
        tenant: &str,
        model: &str,
        outcome: Outcome,
    ) -> Vec<Span> {
        let clock = &self.gw.clock;
        let span = |name, kind, id, parent, from: Instant, to: Instant, attributes| Span {
            trace_id: t.ctx.trace_id,
            span_id: id,
            parent,
            name,
            kind,
            start: clock.unix_nanos(from),
            end: clock.unix_nanos(to),
            attributes,
            error: false,
        };
        let mut root = span(
            "fairway.request",
            Kind::Server,
            t.request,
            t.ctx.parent,
            self.start,
            end,
            vec![
                ("fairway.tenant", Value::Str(tenant.to_owned())),
                ("fairway.model", Value::Str(model.to_owned())),
                ("fairway.backend", Value::Str(self.backend_name.clone())),
                ("fairway.outcome", Value::Str(outcome.as_str().to_owned())),
                (
                    "http.response.status_code",
                    Value::Int(i64::from(self.status)),
                ),
            ],
        );
        root.error = !matches!(outcome, Outcome::Served);
        let mut out = vec![root];
        let admitted = t.admitted.unwrap_or(end);
        out.push(span(
            "fairway.admission",
            Kind::Internal,
            trace::span_id(),
            Some(t.request),
            self.start,
            admitted,
            Vec::new(),
        ));
        if t.admitted.is_some() {
            let dispatched = self.queue_wait.map_or(end, |w| self.start + w);
            out.push(span(
                "fairway.queue",
                Kind::Internal,
                trace::span_id(),
                Some(t.request),
                admitted,
                dispatched,
                vec![(
                    "fairway.queue_wait_s",
                    Value::Float((dispatched - admitted).as_secs_f64()),
                )],
            ));
        }
        if let Some(sent) = self.sent {
            out.push(span(
                "fairway.upstream",
                Kind::Client,
                t.upstream,
                Some(t.request),
                sent,
                self.first_byte.unwrap_or(end),
                vec![("fairway.backend", Value::Str(self.backend_name.clone()))],
            ));
        }
        if let Some(first) = self.first_byte {
            let usage = self.usage.unwrap_or_default();
            out.push(span(
                "fairway.stream",
                Kind::Internal,
                trace::span_id(),
                Some(t.request),
                first,
                end,
                vec![
                    (
                        "gen_ai.usage.input_tokens",
                        Value::Int(i64::from(usage.prompt_tokens)),
                    ),
                    (
                        "gen_ai.usage.output_tokens",
                        Value::Int(i64::from(usage.completion_tokens)),
                    ),
                ],
            ));
        }
        out
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let now = self.gw.clock.now();
        if std::thread::panicking() {
            // Dropped while a handler panic unwinds: the edge answers 500.
            self.outcome = Some(Outcome::Error);
            self.status = 500;
        } else if self.outcome.is_none() {
            self.outcome = Some(Outcome::Cancelled);
        }
        self.settle_core(now);
        let outcome = self.outcome.unwrap_or(Outcome::Cancelled);
        let policy = &self.live.policy;
        let tenant_policy = self
            .tenant
            .and_then(|t| self.live.tenant_policy.get(&t))
            .map(|i| &policy.tenants[*i]);
        let tenant = match (self.tenant, tenant_policy) {
            (_, Some(p)) => p.name.as_str(),
            (Some(_), None) => "default",
            (None, None) => "unknown",
        };
        let model = self
            .pool
            .map_or("unknown", |(_, i)| policy.pools[i].model.as_str());
        let e2e = now - self.start;
        let ttft = self.first_byte.map(|t| t - self.start);
        let goodput = outcome == Outcome::Served
            && tenant_policy
                .is_none_or(|p| e2e <= p.slo.e2e && ttft.is_some_and(|t| t <= p.slo.ttft));
        let overhead = self
            .sent
            .map(|s| (s - self.start).saturating_sub(self.queue_wait.unwrap_or_default()));
        let usage = self.usage.unwrap_or_default();
        self.gw.metrics.record(&RequestRecord {
            tenant,
            model,
            outcome: outcome.as_str(),
            reason: outcome.reason(),
            goodput,
            queue_wait: self.queue_wait,
            ttft,
            e2e,
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            gpu_seconds: self.gpu_seconds,
            overhead,
        });
        if let (Some(t), Some(exporter)) = (&self.trace, &self.gw.tracer) {
            exporter.export(self.spans(t, now, tenant, model, outcome));
        }
        tracing::info!(
            target: "fairway::access",
            request_id = self.request_id.as_ref().and_then(|v| v.to_str().ok()),
            tenant,
            model,
            backend = %self.backend_name,
            outcome = outcome.as_str(),
            reason = outcome.reason(),
            status = self.status,
            queue_wait_ms = self.queue_wait.map(|d| d.as_secs_f64() * 1e3),
            ttft_ms = ttft.map(|d| d.as_secs_f64() * 1e3),
            e2e_ms = e2e.as_secs_f64() * 1e3,
            prompt_tokens = usage.prompt_tokens,
            completion_tokens = usage.completion_tokens,
            prompt_tokens_estimate = self.prompt_estimate,
            max_tokens = self.max_tokens,
            stream = self.stream_requested,
            preempted = self.preempted,
            gpu_seconds = self.gpu_seconds,
            "request"
        );
    }
}

/// Finds the tenant: API key (Bearer or `api-key`), or the trusted tenant
/// header when the operator enabled it, or "default" when no tenants exist.
fn authenticate(live: &Live, headers: &HeaderMap) -> Result<TenantId, ApiError> {
    if let Some(t) = live.default_tenant {
        return Ok(t);
    }
    if let Some(h) = &live.policy.server.trust_tenant_header
        && let Some(name) = headers.get(h.as_str()).and_then(|v| v.to_str().ok())
    {
        return live
            .tenant_names
            .get(name)
            .copied()
            .ok_or(ApiError::Auth("Unknown tenant in trusted tenant header."));
    }
    let key = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .or_else(|| headers.get("api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .ok_or(ApiError::Auth(
            "Missing API key. Send `Authorization: Bearer KEY`.",
        ))?;
    // Keys are stored as SHA-256 digests: the lookup is on the digest, and
    // the final comparison is constant-time, so timing reveals nothing about
    // the stored keys.
    let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    match live.keys.get_key_value(&digest) {
        Some((stored, t)) if constant_time_eq(stored, &digest) => Ok(*t),
        _ => Err(ApiError::Auth("Incorrect API key provided.")),
    }
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads the whole body; the edge's body limit caps it at `limit`.
async fn read_body(
    req: Request<RequestBody>,
    limit: usize,
) -> Result<(http::request::Parts, Bytes), ApiError> {
    let (parts, body) = req.into_parts();
    match body.collect().await {
        Ok(c) => Ok((parts, c.to_bytes())),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::BodyTooLarge(limit)),
        Err(e) => Err(ApiError::InvalidRequest(format!(
            "Could not read request body: {e}"
        ))),
    }
}

/// Answers a request that the edge refuses before the scheduling path
/// (over a cap, draining, body too large), recording its one outcome.
pub fn refuse<B>(gw: &Arc<Gateway>, req: &Request<B>, error: ApiError) -> Response<BoxBody> {
    let mut ticket = Ticket::new(
        gw.clone(),
        gw.live.load_full(),
        gw.clock.now(),
        req.headers(),
    );
    ticket.outcome = Some(error.outcome());
    ticket.status = error.status().as_u16();
    error.into_response()
}

/// Request headers that never go upstream: hop-by-hop, and the client's
/// credentials for Fairway.
const DROP_REQUEST_HEADERS: &[&str] = &[
    "authorization",
    "api-key",
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "expect",
];
const DROP_RESPONSE_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
];

/// Serves one inference request (`/v1/chat/completions`, `/v1/completions`,
/// `/v1/embeddings`).
pub async fn handle(gw: Arc<Gateway>, req: Request<RequestBody>) -> Response<BoxBody> {
    let start = gw.clock.now();
    let live = gw.live.load_full();
    let mut ticket = Ticket::new(gw.clone(), live.clone(), start, req.headers());
    if gw.tracer.is_some() {
        let incoming = req
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok());
        ticket.trace = Some(Trace {
            ctx: TraceContext::from_header(incoming),
            request: trace::span_id(),
            upstream: trace::span_id(),
            admitted: None,
        });
    }
    match run(&gw, &live, req, &mut ticket).await {
        Ok((resp, mode)) => {
            let (parts, body) = resp.into_parts();
            ticket.status = parts.status.as_u16();
            ticket.streaming = !matches!(mode, Mode::Json);
            if parts.status.is_client_error() {
                ticket.outcome = Some(Outcome::Refused(RefusedBy::Backend));
            } else if parts.status.is_server_error() {
                ticket.outcome = Some(Outcome::FailedUpstream);
            }
            let mut out =
                Response::from_parts(parts, RelayBody::new(body, mode, ticket).boxed_unsync());
            let h = out.headers_mut();
            for name in DROP_RESPONSE_HEADERS {
                h.remove(*name);
            }
            out
        }
        Err(e) => {
            let status = e.status();
            if status.is_server_error() {
                tracing::warn!(error = %e, status = status.as_u16(), "request failed");
            }
            ticket.outcome = Some(e.outcome());
            ticket.status = status.as_u16();
            e.into_response()
        }
    }
}

async fn run(
    gw: &Arc<Gateway>,
    live: &Arc<Live>,
    req: Request<RequestBody>,
    ticket: &mut Ticket,
) -> Result<(Response<hyper::body::Incoming>, Mode), ApiError> {
    let tenant = authenticate(live, req.headers())?;
    ticket.tenant = Some(tenant);
    let path = req.uri().path().to_owned();
    let (parts, body) = read_body(req, live.policy.server.max_body_bytes).await?;
    let info = openai::parse(&body)?;
    let &(pool, pool_index) = live
        .pools
        .get(&info.model)
        .ok_or_else(|| ApiError::UnknownModel(info.model.clone()))?;
    ticket.pool = Some((pool, pool_index));
    ticket.prompt_estimate = info.prompt_tokens;
    ticket.max_tokens = info.max_tokens;
    ticket.stream_requested = info.stream;
    // Debug builds only: lets the tests check that a handler panic becomes
    // a 500 with one recorded outcome.
    #[cfg(debug_assertions)]
    if parts.headers.contains_key("x-fairway-debug-panic") {
        panic!("x-fairway-debug-panic");
    }
    let pool_policy = &live.policy.pools[pool_index];
    let is_embedding = path.ends_with("/embeddings");
    let arrival = Arrival {
        tenant,
        pool,
        prompt_tokens: info.prompt_tokens,
        max_tokens: if is_embedding {
            Some(0)
        } else {
            info.max_tokens
        },
        deadline: None,
    };

    // Admit, and either dispatch now or wait for the scheduler's decision.
    let mut pending;
    let preemptible;
    {
        let now = gw.clock.now();
        let mut core = gw.core.lock();
        if !core.sched.pool_is_ready(pool) {
            // Every backend is ejected: answer now rather than queue until
            // `max_wait` for a pool that may stay down.
            return Err(ApiError::NoBackend(info.model.clone()));
        }
        match core.sched.on_arrival(now, arrival) {
            Err(refusal) => {
                return Err(ApiError::Refused {
                    tenant: core.sched.tenant_name(tenant).to_owned(),
                    refusal,
                });
            }
            Ok((id, decisions)) => {
                ticket.id = Some(id);
                if let Some(t) = &mut ticket.trace {
                    t.admitted = Some(gw.clock.now());
                }
                preemptible = core.sched.may_preempt(tenant);
                pending = core.deliver_and_register(decisions, id, preemptible);
            }
        }
    }
    let strip_usage = info.stream && !info.include_usage && !is_embedding;
    let body = if strip_usage {
        openai::with_usage_requested(&body)
    } else {
        body
    };
    // A connection that fails before the request was written is retried
    // once, on another backend: the failed one is ejected, and the request
    // goes back to the head of its queue. Nothing reached a backend or the
    // client, so this is safe for streaming requests too.
    let mut retried = false;
    let resp = loop {
        let backend = await_dispatch(gw, ticket, &mut pending).await?;
        ticket.queue_wait = Some(gw.clock.now() - ticket.start);
        let authority = live.authorities.get(&backend).cloned().or_else(|| {
            // A backend added by a reload after this request took its policy.
            gw.live.load().authorities.get(&backend).cloned()
        });
        let Some(authority) = authority else {
            return Err(ApiError::NoBackend(info.model.clone()));
        };
        let mut up = upstream_request(live, &parts, &path, &authority, body.clone())?;
        if let Some(t) = &ticket.trace
            && let Ok(v) = HeaderValue::from_str(&trace::traceparent(&t.ctx.trace_id, &t.upstream))
        {
            // Ours replaces the client's: the backend's parent is our upstream span.
            up.headers_mut().insert("traceparent", v);
        }
        ticket.sent = Some(gw.clock.now());
        ticket.backend = Some(backend);
        ticket.backend_name = gw.core.lock().sched.backend_name(backend).to_owned();
        let sent = tokio::time::timeout(pool_policy.timeout, gw.client.request(up));
        let result = if preemptible {
            // Batch work: until its response starts, the scheduler may
            // take its slot back. Dropping the upstream call closes the
            // connection, which aborts the request in the engine.
            tokio::select! {
                r = sent => Some(r),
                () = preempted(&mut pending) => None,
            }
        } else {
            Some(sent.await)
        };
        let Some(result) = result else {
            tracing::info!(backend = %ticket.backend_name, "preempted; queued again");
            ticket.preempted += 1;
            continue;
        };
        match result {
            Err(_) => {
                return Err(ApiError::UpstreamTimeout {
                    backend: ticket.backend_name.clone(),
                    timeout: pool_policy.timeout,
                });
            }
            Ok(Err(e)) => {
                let cause =
                    std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
                if !e.is_connect() {
                    return Err(ApiError::Upstream {
                        backend: ticket.backend_name.clone(),
                        cause,
                    });
                }
                tracing::warn!(backend = %ticket.backend_name, %cause, retried, "connection to backend failed; ejecting it");
                let Some(id) = ticket.id else {
                    return Err(ApiError::Internal("request left the scheduler".into()));
                };
                let now = gw.clock.now();
                let mut core = gw.core.lock();
                let requeued = if retried {
                    core.sched.set_health(now, backend, false);
                    None
                } else {
                    core.sched.redispatch(now, id)
                };
                let Some(decisions) = requeued else {
                    // Retried already, or no other healthy backend.
                    return Err(ApiError::Upstream {
                        backend: ticket.backend_name.clone(),
                        cause,
                    });
                };
                retried = true;
                pending = core.deliver_and_register(decisions, id, preemptible);
            }
            Ok(Ok(r)) => {
                if preemptible && let Some(id) = ticket.id {
                    let mut core = gw.core.lock();
                    if pending.preempted_already() || !core.sched.on_response_started(id) {
                        // Preempted just before its response started: drop
                        // the response and wait for the next dispatch.
                        ticket.preempted += 1;
                        continue;
                    }
                }
                break r;
            }
        }
    };
    let is_sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mode = match (is_sse, strip_usage && resp.status() == StatusCode::OK) {
        (false, _) => Mode::Json,
        (true, false) => Mode::Sse,
        (true, true) => Mode::SseStripUsage,
    };
    Ok((resp, mode))
}

/// Waits for the scheduler to dispatch (or shed) the ticket's request.
async fn await_dispatch(
    gw: &Arc<Gateway>,
    ticket: &mut Ticket,
    pending: &mut Pending,
) -> Result<BackendId, ApiError> {
    if pending.is_waiting() {
        // The deadline task re-reads the earliest deadline.
        gw.wake.notify_one();
    }
    loop {
        match pending.next().await {
            Some(Decision::Dispatch { backend, .. }) => return Ok(backend),
            Some(Decision::Shed { retry_after, .. }) => {
                ticket.id = None; // already gone from the scheduler
                return Err(ApiError::Shed { retry_after });
            }
            // Already acted on: the response it was for was dropped.
            Some(Decision::Preempt { .. }) => {}
            None => {
                return Err(ApiError::Internal(
                    "scheduler dropped a queued request".into(),
                ));
            }
        }
    }
}

/// Resolves when the scheduler preempts the in-flight request.
async fn preempted(pending: &mut Pending) {
    loop {
        match pending.next().await {
            Some(Decision::Preempt { .. }) => return,
            // Nothing else comes while a request is in flight.
            Some(_) => {}
            None => std::future::pending().await,
        }
    }
}

/// The request to forward: the client's method, path and headers (less
/// hop-by-hop ones and its credentials for Fairway) and `body`.
fn upstream_request(
    live: &Live,
    parts: &http::request::Parts,
    path: &str,
    authority: &str,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, ApiError> {
    let mut up = Request::builder()
        .method(parts.method.clone())
        .uri(format!("http://{authority}{path}"));
    if let Some(h) = up.headers_mut() {
        for (name, value) in &parts.headers {
            if !DROP_REQUEST_HEADERS.contains(&name.as_str())
                && live.policy.server.trust_tenant_header.as_deref() != Some(name.as_str())
            {
                h.append(name.clone(), value.clone());
            }
        }
        if let Ok(v) = HeaderValue::from_str(&body.len().to_string()) {
            h.insert(header::CONTENT_LENGTH, v);
        }
    }
    up.body(Full::new(body))
        .map_err(|e| ApiError::Internal(e.to_string()))
}
