//! The scheduling path of one inference request, in order: identify the
//! tenant, read just enough of the body, admit, queue until a window opens,
//! forward, relay, account. One `async fn`, calling the sans-IO core under
//! one lock that is never held across an `.await`.
//!
//! Every request that enters ends in exactly one recorded outcome: its
//! [`Ticket`] is made at entry and records when it drops.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::BodyExt;

use crate::core::ids::BackendId;
use crate::core::scheduler::{Arrival, Decision};
use crate::core::spec::Api;
use crate::gateway::handle::Gateway;
use crate::gateway::live::Live;
use crate::gateway::relay::{Mode, RelayBody};
use crate::gateway::scheduling::{Arrived, Pending};
use crate::gateway::tenant::authenticate;
use crate::gateway::ticket::{Phase, StopCall, Ticket};
use crate::gateway::{pool, upstream};
use crate::net::body::{BoxBody, RequestBody};
use crate::outcome::{Outcome, RefusedBy};
use crate::protocol::error::{ApiError, close_if_body_unread, rate_limit_headers};
use crate::protocol::read::read_body;
use crate::protocol::{audio, openai, triton};

/// The kind of inference call, by its route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `/v1/chat/completions`, `/v1/completions`: a stream whose client
    /// did not ask for usage is asked for it, and the relay drops that
    /// chunk.
    Completions,
    /// `/v1/responses`: usage from the response or its
    /// `response.completed` event; the response's id is remembered.
    Responses,
    /// Anthropic's `/v1/messages`: usage from the message or its
    /// `message_start` and `message_delta` events; Fairway's own errors in
    /// Anthropic's shape.
    Messages,
    /// `/v1/embeddings` and vLLM's pooling routes (`/v1/rerank`,
    /// `/v1/score`, `/classify`, `/pooling`): one pass over the input, no
    /// output tokens.
    Pooling,
    /// `/v2/models/{model}[/versions/{v}]/generate`, `/generate_stream`
    /// and `/infer`.
    Triton,
    /// `/v1/audio/transcriptions` and `/translations`: a multipart upload,
    /// streamed to the backend (see [`audio`]).
    Audio,
}

impl Call {
    /// The protocol the call's backends speak.
    fn api(self) -> Api {
        match self {
            Call::Triton => Api::Triton,
            _ => Api::OpenAi,
        }
    }

    /// A Fairway error in the route's own error shape.
    fn error_response(self, e: ApiError) -> Response<BoxBody> {
        match self {
            Call::Triton => e.into_triton_response(),
            Call::Messages => e.into_anthropic_response(),
            _ => e.into_response(),
        }
    }
}

/// Serves one inference request.
pub async fn handle(gw: Arc<Gateway>, req: Request<RequestBody>, call: Call) -> Response<BoxBody> {
    let start = gw.now();
    let live = gw.live();
    let mut ticket = Ticket::new(gw.clone(), live.clone(), start, req.headers());
    let version = req.version();
    let has_body = !http_body::Body::is_end_stream(req.body());
    match run(&gw, &live, req, call, &mut ticket).await {
        Ok((resp, mode)) => {
            let (parts, body) = resp.into_parts();
            ticket.status = parts.status.as_u16();
            ticket.streaming = !mode.is_json();
            if parts.status.is_client_error() {
                ticket.outcome = Some(Outcome::Refused(RefusedBy::Backend));
            } else if parts.status.is_server_error() {
                ticket.outcome = Some(Outcome::FailedUpstream);
            }
            let streaming = ticket.streaming;
            let limits = ticket.limits;
            let mut out =
                Response::from_parts(parts, RelayBody::new(body, mode, ticket).boxed_unsync());
            upstream::strip_response_headers(out.headers_mut());
            rate_limit_headers(out.headers_mut(), &limits);
            if streaming {
                // The relay may drop the usage chunk or end a cut stream
                // with an error event: the backend's length no longer holds.
                out.headers_mut().remove(header::CONTENT_LENGTH);
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
            let mut resp = call.error_response(e);
            close_if_body_unread(&mut resp, version, has_body && !ticket.body_read);
            resp
        }
    }
}

async fn run(
    gw: &Arc<Gateway>,
    live: &Arc<Live>,
    req: Request<RequestBody>,
    call: Call,
    ticket: &mut Ticket,
) -> Result<(Response<pool::Body>, Mode), ApiError> {
    let tenant = authenticate(live, req.headers())?;
    ticket.tenant = Some(tenant);
    let path = req.uri().path().to_owned();
    let server = &live.policy.server;
    let (parts, body, info, triton_path) = if call == Call::Audio {
        let limit = server.max_upload_bytes;
        let (parts, a, upload) = audio::read_head(req, limit, server.body_read_timeout).await?;
        let info = openai::RequestInfo {
            model: a.model,
            stream: a.stream,
            include_usage: false,
            max_tokens: None,
            choices: 1,
            prompt_tokens: a.prompt_tokens,
        };
        (parts, Payload::Upload(upload), info, None)
    } else {
        let (parts, body) = read_body(req, server.max_body_bytes, server.body_read_timeout).await?;
        ticket.body_read = true;
        let (info, triton_path) = match call {
            Call::Triton => {
                let p = triton::model_path(&path).ok_or(ApiError::NotFound)?;
                let info = if p.action == "infer" {
                    let header_len = parts.headers.get("inference-header-content-length");
                    triton::parse_infer(&body, header_len, p.model)?
                } else {
                    triton::parse_generate(&body, p.model, p.action == "generate_stream")?
                };
                (info, Some(p))
            }
            _ => (openai::parse(&body)?, None),
        };
        (parts, Payload::Whole(body), info, triton_path)
    };
    let api = call.api();
    let (pool, pool_index, is_adapter) = gw.model_pool(live, &info.model, api, Some(tenant))?;
    ticket.pool = Some((pool, pool_index));
    let adapter = is_adapter.then_some(info.model.as_str());
    ticket.adapter = adapter.map(Arc::from);
    closed_while_store_down(gw, live, tenant)?;
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
    let arrival = Arrival {
        tenant,
        pool,
        prompt_tokens: info.prompt_tokens,
        // No output to estimate: pooling has none, and an audio call's
        // is not reported (its duration settles it).
        max_tokens: if matches!(call, Call::Pooling | Call::Audio) {
            Some(0)
        } else {
            info.max_tokens
        },
        choices: info.choices,
        deadline: None,
        adapter: None,
    };

    // Admit, and either dispatch now or wait for the scheduler's decision.
    let (mut pending, preemptible) = match gw.sched().arrive(gw.now(), arrival, adapter) {
        // Every backend is ejected: answer now rather than queue until
        // `max_wait` for a pool that may stay down.
        Arrived::PoolDown => return Err(ApiError::NoBackend(info.model.clone())),
        Arrived::Refused { tenant, refusal } => {
            if let Some(member) = gw.cluster()
                && refusal.limit != crate::core::admission::LimitKind::QueueFull
            {
                // This replica's lease may be what ran out: ask the
                // store sooner than the next sync.
                member.starved();
            }
            return Err(ApiError::Refused { tenant, refusal });
        }
        Arrived::Admitted(a) => {
            ticket.id = Some(a.id);
            ticket.limits = a.limits;
            ticket.spans.next(gw, Phase::Queue);
            (a.pending, a.preemptible)
        }
    };
    let strip_usage = info.stream && !info.include_usage && call == Call::Completions;
    let body = match body {
        Payload::Whole(b) if strip_usage => Payload::Whole(openai::with_usage_requested(&b)),
        body => body,
    };
    // A connection that fails before the request was written is retried
    // once, on another backend: the failed one is ejected, and the request
    // goes back to the head of its queue. Nothing reached a backend or the
    // client, so this is safe for streaming requests too.
    let mut retried = false;
    let resp = loop {
        let backend = await_dispatch(gw, ticket, &mut pending).await?;
        ticket.queue_wait = Some(gw.now() - ticket.start);
        if preemptible
            && matches!(body, Payload::Upload(_))
            && let Some(id) = ticket.id
            && !gw.sched().response_started(id, &mut pending)
        {
            // An upload cannot be sent twice, so it is never preempted
            // once sent; this one was preempted just before.
            ticket.preempted += 1;
            continue;
        }
        let address = live.addresses.get(&backend).cloned().or_else(|| {
            // A backend added by a reload after this request took its policy.
            gw.live().addresses.get(&backend).cloned()
        });
        let Some(address) = address else {
            return Err(ApiError::NoBackend(info.model.clone()));
        };
        let up_path = match &triton_path {
            // The backend may know the model by another name.
            Some(p) => p.upstream(
                live.served_models
                    .get(&backend)
                    .map_or(p.model, String::as_str),
            ),
            None => path.clone(),
        };
        let mut up = upstream::request(
            server.trust_tenant_header.as_deref(),
            &parts,
            &up_path,
            &address,
            body.to_send(),
        )?;
        if let Some(p) = &triton_path
            && p.action != "infer"
            && let Some(id) = parts.headers.get("triton-request-id")
        {
            ticket.stop_call = Some(StopCall {
                address: address.clone(),
                path: up_path.clone(),
                request_id: id.clone(),
            });
        }
        ticket.sent = Some(gw.now());
        ticket.backend = Some(backend);
        ticket.backend_name = match live.backend_names.get(&backend) {
            Some(name) => name.clone(),
            // A backend added by a reload after this request took its policy.
            None => Arc::from(gw.sched().with(|s| s.backend_name(backend).to_owned())),
        };
        if let Some(adapter) = &ticket.adapter {
            let model = &live.policy.pools[pool_index].model;
            gw.metrics()
                .record_adapter(model, adapter, &ticket.backend_name);
        }
        let upstream_span = Phase::Upstream {
            backend: &ticket.backend_name,
        };
        ticket.spans.next(gw, upstream_span);
        ticket.spans.inject(gw, up.headers_mut());
        // An upload's backend answers once it has the whole body, which
        // the client has `body_read_timeout` to send.
        let allowed = match &body {
            Payload::Upload(_) => pool_policy.timeout + server.body_read_timeout,
            Payload::Whole(_) => pool_policy.timeout,
        };
        let sent = tokio::time::timeout(allowed, pool::send(&address.authority, up));
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
        if let Payload::Upload(u) = &body {
            ticket.body_read = u.finished();
            // The client's fault, not the backend's.
            if !matches!(result, Some(Ok(Ok(_))))
                && let Some(e) = u.failure(server.max_upload_bytes)
            {
                return Err(e);
            }
        }
        let Some(result) = result else {
            tracing::info!(backend = %ticket.backend_name, "preempted; queued again");
            ticket.preempted += 1;
            continue;
        };
        // A failure while the client was still uploading may be the
        // client's: it is not held against the backend (a refused
        // connection still is).
        let uploading = matches!(&body, Payload::Upload(u) if u.unfinished())
            && !matches!(&result, Ok(Err(e)) if e.is_connect());
        if !uploading
            && !result
                .as_ref()
                .is_ok_and(|r| r.as_ref().is_ok_and(|r| !r.status().is_server_error()))
        {
            gw.backend_failed(backend);
        }
        match result {
            Err(_) => {
                return Err(ApiError::UpstreamTimeout {
                    backend: ticket.backend_name.to_string(),
                    timeout: allowed,
                });
            }
            Ok(Err(e)) => {
                let cause = e.to_string();
                if !e.is_connect() {
                    return Err(ApiError::Upstream {
                        backend: ticket.backend_name.to_string(),
                        cause,
                    });
                }
                tracing::warn!(backend = %ticket.backend_name, %cause, retried, "connection to backend failed; ejecting it");
                let Some(id) = ticket.id else {
                    return Err(ApiError::Internal("request left the scheduler".into()));
                };
                let requeued = gw
                    .sched()
                    .requeue(gw.now(), id, backend, retried, preemptible);
                let Some(requeued) = requeued else {
                    // Retried already, or no other healthy backend.
                    return Err(ApiError::Upstream {
                        backend: ticket.backend_name.to_string(),
                        cause,
                    });
                };
                retried = true;
                pending = requeued;
            }
            Ok(Ok(r)) => {
                if preemptible
                    && let Some(id) = ticket.id
                    && !gw.sched().response_started(id, &mut pending)
                {
                    // Preempted just before its response started: drop
                    // the response and wait for the next dispatch.
                    ticket.preempted += 1;
                    continue;
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
    let mode = match (call, is_sse, strip_usage && resp.status() == StatusCode::OK) {
        (Call::Triton, false, _) => Mode::TritonJson,
        (Call::Triton, true, _) => Mode::TritonSse,
        (Call::Responses, false, _) => Mode::ResponsesJson,
        (Call::Responses, true, _) => Mode::ResponsesSse,
        (_, false, _) => Mode::Json,
        (_, true, false) => Mode::Sse,
        (_, true, true) => Mode::SseStripUsage,
    };
    Ok((resp, mode))
}

/// A request's body: read whole, or an upload streamed as it arrives.
enum Payload {
    Whole(Bytes),
    Upload(audio::Upload),
}

impl Payload {
    /// The body for one attempt to send the request.
    fn to_send(&self) -> upstream::UpBody {
        match self {
            Payload::Whole(b) => upstream::whole(b.clone()),
            Payload::Upload(u) => http_body_util::Either::Right(u.resend()),
        }
    }
}

/// With `[cluster] on_store_failure = "closed"` and the store unreachable,
/// a tenant with limits is refused: its limits cannot be held for the
/// cluster.
fn closed_while_store_down(
    gw: &Gateway,
    live: &Live,
    tenant: crate::core::ids::TenantId,
) -> Result<(), ApiError> {
    let (Some(cluster), Some(member)) = (&live.policy.cluster, gw.cluster()) else {
        return Ok(());
    };
    if cluster.on_store_failure != crate::config::StoreFailure::Closed || member.store_up() {
        return Ok(());
    }
    let Some(t) = live
        .tenant_policy
        .get(&tenant)
        .map(|&i| &live.policy.tenants[i])
    else {
        return Ok(());
    };
    let limited =
        t.rate.is_some() || t.gpu_seconds_per_hour.is_some() || t.max_concurrency.is_some();
    if limited {
        return Err(ApiError::StoreUnavailable(
            t.name.clone(),
            cluster.sync_interval,
        ));
    }
    Ok(())
}

/// Waits for the scheduler to dispatch (or shed) the ticket's request.
async fn await_dispatch(
    gw: &Arc<Gateway>,
    ticket: &mut Ticket,
    pending: &mut Pending,
) -> Result<BackendId, ApiError> {
    if pending.is_waiting() {
        // The deadline task re-reads the earliest deadline.
        gw.wake();
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
