//! One request's life in the gateway, and its one recorded outcome.
//!
//! A [`Ticket`] is made when a request enters and records when it drops, so
//! an early return, an error, the end of the body, the client hanging up
//! (the future or the body is dropped) or a handler panic (the ticket drops
//! as it unwinds) each count once: in `fairway_requests_total`, the access
//! log and, when traces are on, the request's spans.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request, Response};
use opentelemetry::trace::TraceId;

use crate::core::admission::RateLimits;
use crate::core::ids::{BackendId, PoolId, RequestId, TenantId, Usage};
use crate::core::time::Instant;
use crate::fault::Chain;
use crate::gateway::access::AccessLine;
use crate::gateway::live_policy::Live;
use crate::gateway::scheduling::Settle;
use crate::gateway::spans::{SpanPhase, Spans};
use crate::gateway::state::Gateway;
use crate::gateway::triton_stop::StopCall;
use crate::net::body::BoxBody;
use crate::net::headers::X_REQUEST_ID;
use crate::outcome::{Outcome, RefusedBy};
use crate::protocol::error::{ApiError, close_if_body_unread};
use crate::protocol::upstream::UpstreamError;
use crate::telemetry::metrics::RequestRecord;
use crate::telemetry::otel;
use crate::telemetry::usage::UsageRecord;

/// Whether a backend's answer is its failure (the outcome, and its
/// outlier detection): a 5xx, except 501, which says the backend does not
/// serve what was asked (Triton's answer to `infer` on a decoupled model),
/// as any backend of the pool would.
pub fn backend_fault(status: http::StatusCode) -> bool {
    status.is_server_error() && status != http::StatusCode::NOT_IMPLEMENTED
}

/// How a relayed body ended.
#[derive(Debug)]
pub enum BodyEnd<'a> {
    Complete {
        usage: Option<Usage>,
    },
    /// The backend's stream broke off.
    UpstreamError(&'a UpstreamError),
    /// The body was an error (Triton's shape): under a 2xx (where Triton's
    /// headers had gone), the backend failed the request.
    ErrorBody(String),
    /// A resumable batch item's stream, cut by a preemption (it had left
    /// the scheduler already).
    Preempted,
}

/// One request's life in the gateway; records its outcome exactly once.
pub struct Ticket {
    gw: Arc<Gateway>,
    live: Arc<Live>,
    start: Instant,
    /// The request's `x-request-id` (the edge sets one on every request).
    request_id: Option<HeaderValue>,
    /// The caller's trace id from `traceparent`, for the access log when
    /// traces are off (when on, the request span carries it).
    caller_trace: Option<TraceId>,
    tenant: Option<TenantId>,
    pool: Option<(PoolId, usize)>,
    /// The LoRA adapter the request names, on its base model's pool.
    adapter: Option<Arc<str>>,
    /// Set once admitted: the scheduler knows the request.
    id: Option<RequestId>,
    /// The tenant's buckets once admitted, for the answer's
    /// `x-ratelimit-*` headers.
    limits: RateLimits,
    backend: Option<BackendId>,
    backend_name: Arc<str>,
    sent: Option<Instant>,
    first_byte: Option<Instant>,
    queue_wait: Option<Duration>,
    prompt_estimate: u32,
    /// What the client asked for (`max_tokens`, `stream`), for the access
    /// log, so `fairway workload --from-access-log` can replay it.
    max_tokens: Option<u32>,
    stream_requested: bool,
    /// The whole request body was read (else an early answer closes the
    /// connection).
    body_read: bool,
    /// The request's spans (all `Span::none()` when traces are off).
    spans: Spans,
    /// The response is an SSE stream: its first byte is the first token.
    streaming: bool,
    /// Times the request was preempted and queued again.
    preempted: u32,
    outcome: Option<Outcome>,
    usage: Option<Usage>,
    gpu_seconds: f64,
    status: u16,
    /// A Triton generate call the client tagged with `triton-request-id`:
    /// the stop request to send its backend if the client goes away.
    stop_call: Option<StopCall>,
    /// Whether [`finish`](Ticket::finish) ran.
    finished: bool,
    /// Whether the TTFT went to the scheduler at the first byte (the batch
    /// lane's loop on), not to be fed again at the settle.
    ttft_fed: bool,
}

impl Ticket {
    pub fn new(gw: Arc<Gateway>, live: Arc<Live>, start: Instant, headers: &HeaderMap) -> Self {
        let request_id = headers.get(&X_REQUEST_ID).cloned();
        let spans = Spans::new(&gw, headers, request_id.as_ref());
        let caller_trace = match gw.traces() {
            None => otel::caller_trace_id(headers),
            Some(_) => None,
        };
        Ticket {
            gw,
            live,
            start,
            request_id,
            caller_trace,
            tenant: None,
            pool: None,
            adapter: None,
            id: None,
            limits: RateLimits::default(),
            backend: None,
            backend_name: Arc::from(""),
            sent: None,
            first_byte: None,
            queue_wait: None,
            prompt_estimate: 0,
            max_tokens: None,
            stream_requested: false,
            body_read: false,
            spans,
            streaming: false,
            preempted: 0,
            outcome: None,
            usage: None,
            gpu_seconds: 0.0,
            status: 0,
            stop_call: None,
            finished: false,
            ttft_fed: false,
        }
    }

    /// When the request entered.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Its place in the scheduler, once admitted.
    pub fn id(&self) -> Option<RequestId> {
        self.id
    }

    /// Its tenant's limits, for the answer's `x-ratelimit-*` headers.
    pub fn limits(&self) -> RateLimits {
        self.limits
    }

    /// The backend it was sent to last ("" before any).
    pub fn backend_name(&self) -> &Arc<str> {
        &self.backend_name
    }

    /// Whether the whole request body was read.
    pub fn body_read(&self) -> bool {
        self.body_read
    }

    /// The client's tenant is known.
    pub fn identified(&mut self, tenant: TenantId) {
        self.tenant = Some(tenant);
    }

    /// The request body was read whole (else an early answer closes the
    /// connection), or, for an upload, as far as `whole` says.
    pub fn body_was_read(&mut self, whole: bool) {
        self.body_read = whole;
    }

    /// The request goes to `pool` (`index` in the policy's pools), naming
    /// LoRA `adapter` if any.
    pub fn routed(&mut self, pool: PoolId, index: usize, adapter: Option<&str>) {
        self.pool = Some((pool, index));
        self.adapter = adapter.map(Arc::from);
    }

    /// What the client asked for, for the access log (so `fairway
    /// workload --from-access-log` can replay it): the prompt's estimated
    /// tokens, `max_tokens` and `stream`.
    pub fn asked(&mut self, prompt_estimate: u32, max_tokens: Option<u32>, stream: bool) {
        self.prompt_estimate = prompt_estimate;
        self.max_tokens = max_tokens;
        self.stream_requested = stream;
    }

    /// Admitted as `id`, under its tenant's `limits`: the queue phase
    /// begins.
    pub fn admitted(&mut self, id: RequestId, limits: RateLimits) {
        self.id = Some(id);
        self.limits = limits;
        self.spans.next(&self.gw, SpanPhase::Queue);
    }

    /// The scheduler shed the request: it is gone from it already.
    pub fn shed(&mut self) {
        self.id = None;
    }

    /// Dispatched now: the queue wait ends.
    pub fn dispatched(&mut self, now: Instant) {
        self.queue_wait = Some(now - self.start);
    }

    /// Sent to `backend` (named `name`) at `now`; its upstream phase
    /// begins, and its trace context goes into `headers`.
    pub fn sent(
        &mut self,
        now: Instant,
        backend: BackendId,
        name: Arc<str>,
        headers: &mut HeaderMap,
    ) {
        self.sent = Some(now);
        self.backend = Some(backend);
        self.backend_name = name;
        if let (Some(adapter), Some((_, pool))) = (&self.adapter, self.pool) {
            let model = &self.live.policy.pools[pool].model;
            self.gw
                .metrics()
                .record_adapter(model, adapter, &self.backend_name);
        }
        let upstream = SpanPhase::Upstream {
            backend: &self.backend_name,
        };
        self.spans.next(&self.gw, upstream);
        self.spans.inject(&self.gw, headers);
    }

    /// A Triton generate call the client tagged: `stop` is sent to its
    /// backend if the client goes away.
    pub fn stop_with(&mut self, stop: StopCall) {
        self.stop_call = Some(stop);
    }

    /// Preempted, and queued again.
    pub fn preempted(&mut self) {
        self.preempted += 1;
    }

    /// The backend answered with `status`: an error status is the
    /// backend's refusal or failure; `streaming` when the answer is SSE
    /// (its first byte is then the first token).
    pub fn answered(&mut self, status: http::StatusCode, streaming: bool) {
        self.status = status.as_u16();
        self.streaming = streaming;
        if backend_fault(status) {
            self.outcome = Some(Outcome::FailedUpstream);
        } else if status.is_client_error() || status.is_server_error() {
            self.outcome = Some(Outcome::Refused(RefusedBy::Backend));
        }
    }

    /// The request failed with `e`, answered with its status.
    pub fn failed(&mut self, e: &ApiError) {
        self.outcome = Some(e.outcome());
        self.status = e.status().as_u16();
    }

    /// The prompt's estimated tokens (Triton reports none of its own).
    pub fn prompt_estimate(&self) -> u32 {
        self.prompt_estimate
    }

    /// Notes the first body byte from the backend (TTFT); `resumable`: a
    /// resumable batch item's, whose prefill the scheduler counts until
    /// then. With the batch lane's loop on, a streamed request's TTFT goes
    /// to the scheduler now rather than at its end, so the loop follows
    /// live latency a whole answer sooner.
    pub fn first_byte(&mut self, resumable: bool) {
        if self.first_byte.is_some() {
            return;
        }
        let now = self.gw.now();
        self.first_byte = Some(now);
        self.spans.next(&self.gw, SpanPhase::Stream);
        let Some(id) = self.id else { return };
        if resumable {
            self.gw.sched().first_token(now, id);
        } else if self.streaming
            && self
                .live
                .policy
                .batch
                .as_ref()
                .is_some_and(|b| b.live_latency_target > 0.0)
            && let (Some(backend), Some(sent)) = (self.backend, self.sent)
        {
            self.gw.sched().ttft(now, id, backend, now - sent);
            self.ttft_fed = true;
        }
    }

    /// The backend created a Responses API response with this id: later
    /// calls on it go to the same backend, for the same tenant.
    pub fn response_created(&self, id: String) {
        if let (Some(backend), Some(tenant)) = (self.backend, self.tenant) {
            self.gw.response_created(&id, backend, tenant);
        }
    }

    /// The body ended (complete or broken): the request is finished.
    pub fn end(mut self, how: BodyEnd<'_>) {
        match how {
            BodyEnd::Complete { usage } => {
                self.usage = usage;
                if self.outcome.is_none() {
                    self.outcome = Some(Outcome::Served);
                }
            }
            BodyEnd::UpstreamError(cause) => {
                static LOG: crate::clock::Throttled =
                    crate::clock::Throttled::new(crate::clock::REMOTE_LOG_EVERY);
                if let Some(left_out) = LOG.allow() {
                    tracing::warn!(backend = %self.backend_name, cause = %Chain(cause), left_out, "stream from backend broke");
                }
                self.upstream_failed();
            }
            // Under an error status the outcome is already the status's.
            BodyEnd::ErrorBody(message) if self.outcome.is_none() => {
                static LOG: crate::clock::Throttled =
                    crate::clock::Throttled::new(crate::clock::REMOTE_LOG_EVERY);
                if let Some(left_out) = LOG.allow() {
                    tracing::warn!(backend = %self.backend_name, %message, left_out, "the backend answered 200 with an error");
                }
                self.upstream_failed();
            }
            BodyEnd::ErrorBody(_) => {}
            BodyEnd::Preempted => {
                self.preempted += 1;
                self.outcome = Some(Outcome::Cancelled);
            }
        }
        self.finish();
    }

    /// The backend failed the request: the outcome, and a failure for its
    /// outlier detection.
    fn upstream_failed(&mut self) {
        self.outcome = Some(Outcome::FailedUpstream);
        if let Some(b) = self.backend {
            self.gw.backend_failed(b);
        }
    }

    /// Ends the request in the scheduler (completion or cancel).
    fn settle(&mut self, now: Instant) {
        let Some(id) = self.id.take() else { return };
        let ttft = match (self.streaming, self.sent, self.first_byte) {
            (true, Some(sent), Some(first)) if !self.ttft_fed => Some(first - sent),
            _ => None,
        };
        let settled = self.gw.sched().settle(
            now,
            Settle {
                id,
                tenant: self.tenant,
                backend: self.backend,
                served: self.outcome == Some(Outcome::Served),
                usage: self.usage,
                ttft,
            },
        );
        if let Some(g) = settled.gpu_seconds {
            self.gpu_seconds = g;
        }
        if let Some(e) = settled.ejected {
            self.gw.report_ejection(now, e);
        }
    }

    /// Sets the request span's closing fields.
    fn close_spans(&self, tenant: &str, model: &str, outcome: Outcome) {
        let span = &self.spans.request;
        if span.is_none() {
            return;
        }
        span.record("fairway.tenant", tenant);
        span.record("fairway.model", model);
        span.record("fairway.backend", &*self.backend_name);
        span.record("fairway.outcome", outcome.as_str());
        span.record("http.response.status_code", i64::from(self.status));
        if outcome != Outcome::Served {
            span.record("otel.status_code", "ERROR");
        }
        if self.first_byte.is_some() {
            let usage = self.usage.unwrap_or_default();
            self.spans
                .phase
                .record("gen_ai.usage.input_tokens", i64::from(usage.prompt_tokens));
            self.spans.phase.record(
                "gen_ai.usage.output_tokens",
                i64::from(usage.completion_tokens),
            );
        }
    }
}

impl Ticket {
    /// Finishes the request: settles it in the scheduler, records its
    /// metrics and its tenant's usage windows, closes its spans and writes
    /// its access line. The request path calls it where a request ends
    /// (the relay at the end of the body, `handle` on an error); dropping
    /// a ticket that was not finished (the client went away, a panic
    /// unwinding) finishes it, as cancelled or as an error.
    pub fn finish(mut self) {
        self.finish_now();
    }

    fn finish_now(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let now = self.gw.now();
        let outcome = self.final_outcome();
        self.settle(now);
        let live = self.live.clone();
        let end = self.summary(&live, now, outcome);
        self.record_metrics(&live, &end);
        self.record_usage(&live, &end);
        self.close_spans(end.tenant, end.model, outcome);
        self.write_access_line(&end);
    }

    /// The request's one outcome: the one recorded, else an error (a
    /// handler panic unwinds, and the edge answers 500) or a cancel (the
    /// client went away). A cancelled Triton generate call is stopped on
    /// its backend.
    fn final_outcome(&mut self) -> Outcome {
        if std::thread::panicking() {
            self.outcome = Some(Outcome::Error);
            self.status = 500;
        } else if self.outcome.is_none() {
            self.outcome = Some(Outcome::Cancelled);
        }
        let outcome = self.outcome.unwrap_or(Outcome::Cancelled);
        if outcome == Outcome::Cancelled
            && self.sent.is_some()
            && let Some(stop) = self.stop_call.take()
        {
            stop.send();
        }
        outcome
    }

    /// What the records of a finished request are made of.
    fn summary<'l>(&self, live: &'l Live, now: Instant, outcome: Outcome) -> End<'l> {
        let policy = &live.policy;
        let tenant_index = self.tenant.map(|t| {
            live.tenant_policy
                .get(&t)
                .copied()
                .unwrap_or(policy.tenants.len())
        });
        let tenant_policy = tenant_index.and_then(|i| policy.tenants.get(i));
        let tenant = match (tenant_index, tenant_policy) {
            (_, Some(p)) => p.name.as_str(),
            (Some(_), None) => "default",
            (None, None) => "unknown",
        };
        let pool_index = self.pool.map(|(_, i)| i);
        let model = pool_index.map_or("unknown", |i| policy.pools[i].model.as_str());
        let e2e = now - self.start;
        let ttft = self.first_byte.map(|t| t - self.start);
        let goodput = outcome == Outcome::Served
            && tenant_policy
                .is_none_or(|p| e2e <= p.slo.e2e && ttft.is_some_and(|t| t <= p.slo.ttft));
        End {
            outcome,
            tenant,
            model,
            tenant_index,
            pool_index,
            e2e,
            ttft,
            goodput,
            usage: self.usage.unwrap_or_default(),
            wall: crate::clock::unix_time(),
        }
    }

    /// `fairway_requests_total` and the request's histograms.
    fn record_metrics(&self, live: &Live, end: &End<'_>) {
        let overhead = self
            .sent
            .map(|s| (s - self.start).saturating_sub(self.queue_wait.unwrap_or_default()));
        // Resolved when the policy was loaded; a request refused before it
        // had a tenant or a model looks its series up.
        let looked_up;
        let series = match (end.tenant_index, end.pool_index) {
            (Some(t), Some(p)) => &live.series[t][p],
            _ => {
                looked_up = self.gw.metrics().series(
                    end.tenant,
                    end.model,
                    Default::default(),
                    live.policy.histograms_by_tenant(),
                );
                &looked_up
            }
        };
        self.gw.metrics().record(
            series,
            &RequestRecord {
                outcome: end.outcome,
                goodput: end.goodput,
                queue_wait: self.queue_wait,
                ttft: end.ttft,
                e2e: end.e2e,
                prompt_tokens: end.usage.prompt_tokens,
                completion_tokens: end.usage.completion_tokens,
                gpu_seconds: self.gpu_seconds,
                overhead,
            },
        );
    }

    /// The tenant's usage windows (the usage page).
    fn record_usage(&self, live: &Live, end: &End<'_>) {
        if let Some(windows) = end.tenant_index.and_then(|t| live.usage.get(t)) {
            windows.lock().record(
                end.wall.as_secs_f64(),
                &UsageRecord {
                    outcome: end.outcome,
                    goodput: end.goodput,
                    ttft: end.ttft.map(|d| d.as_secs_f64()),
                    e2e: end.e2e.as_secs_f64(),
                    queue_wait: self.queue_wait.map(|d| d.as_secs_f64()),
                    preempted: self.preempted > 0,
                    gpu_seconds: self.gpu_seconds,
                },
            );
        }
    }

    /// The access line, inside the request span when traces are on (the
    /// log line and the trace are one tree).
    fn write_access_line(&self, end: &End<'_>) {
        let trace_id = otel::trace_id(&self.spans.request).or(self.caller_trace);
        AccessLine {
            unix_micros: i64::try_from(end.wall.as_micros()).unwrap_or(i64::MAX),
            request_id: self.request_id.as_ref().and_then(|v| v.to_str().ok()),
            trace_id: trace_id.map(|t| u128::from_be_bytes(t.to_bytes())),
            tenant: end.tenant,
            model: end.model,
            adapter: self.adapter.as_deref(),
            backend: &self.backend_name,
            outcome: end.outcome,
            status: self.status,
            queue_wait_ms: self.queue_wait.map(|d| d.as_secs_f64() * 1e3),
            ttft_ms: end.ttft.map(|d| d.as_secs_f64() * 1e3),
            e2e_ms: end.e2e.as_secs_f64() * 1e3,
            prompt_tokens: end.usage.prompt_tokens,
            completion_tokens: end.usage.completion_tokens,
            prompt_tokens_estimate: self.prompt_estimate,
            max_tokens: self.max_tokens,
            stream: self.stream_requested,
            preempted: self.preempted,
            gpu_seconds: self.gpu_seconds,
        }
        .log(&self.spans.request);
    }
}

/// A finished request as its records see it.
struct End<'l> {
    outcome: Outcome,
    tenant: &'l str,
    model: &'l str,
    /// Index into the live series and usage windows, by tenant and pool.
    tenant_index: Option<usize>,
    pool_index: Option<usize>,
    e2e: Duration,
    ttft: Option<Duration>,
    /// Served within the tenant's SLO.
    goodput: bool,
    usage: Usage,
    wall: Duration,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.finish_now();
    }
}

/// Answers a request that the edge refuses before the scheduling path
/// (over a cap, draining, body too large), recording its one outcome.
pub fn refuse<B: http_body::Body>(
    gw: &Arc<Gateway>,
    req: &Request<B>,
    error: ApiError,
) -> Response<BoxBody> {
    let mut ticket = Ticket::new(gw.clone(), gw.live(), gw.now(), req.headers());
    ticket.failed(&error);
    let mut resp = error.into_response_for(req.uri().path());
    close_if_body_unread(&mut resp, req.version(), !req.body().is_end_stream());
    ticket.finish();
    resp
}
