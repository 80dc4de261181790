//! The request path of one inference call, in order, a function a phase:
//! [`handle`] makes the request's [`Ticket`], then [`identify`] (the
//! tenant), [`read`] (just enough of the body, by protocol), [`route`]
//! (the model's pool), [`admit`] (admission and the fair queue, under the
//! scheduler's lock), [`forward`] (wait for the dispatch and send; the
//! retry and preemption loop), [`relay`] (the answer, streamed back
//! through the ticket), and the ticket's [`finish`](Ticket::finish)
//! (settle, metrics, usage windows, span, access line) when the body ends
//! or the request fails.
//!
//! Every request that enters ends in exactly one recorded outcome: its
//! ticket is made at entry, and dropping an unfinished one finishes it.

use std::sync::Arc;

use http::{Request, Response, StatusCode, header};
use http_body_util::BodyExt;

use crate::core::ids::TenantId;
use crate::core::scheduler::{Arrival, Lane};
use crate::core::spec::{Api, Strategy};
use crate::gateway::forward::{Outgoing, Payload, forward};
use crate::gateway::live_policy::Live;
use crate::gateway::relay::{Mode, RelayBody};
use crate::gateway::scheduling::{Arrived, Pending};
use crate::gateway::state::Gateway;
use crate::gateway::tenant::authenticate;
use crate::gateway::ticket::Ticket;
use crate::gateway::{connections, upstream};
use crate::net::body::{BoxBody, RequestBody};
use crate::protocol::error::{ApiError, close_if_body_unread, rate_limit_headers};
use crate::protocol::openai::RequestInfo;
use crate::protocol::read::read_body;
use crate::protocol::triton::ModelPath;
use crate::protocol::{audio, openai, prompt, triton};

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

/// Attached by the batch runner to an item's request, in the process (a
/// client cannot send it): whose item it is, and how long it may wait for
/// dispatch (its batch's window). It skips the API key and waits in the
/// pool's batch lane (`core::scheduler::Lane::Batch`).
#[derive(Clone, Debug)]
pub struct BatchItem {
    pub tenant: String,
    pub deadline: std::time::Duration,
    /// The runner streams it and can resume it from what it streamed
    /// (`protocol::resume`): it may be preempted mid-answer
    /// (`Lane::Resumable`).
    pub resumable: bool,
    /// Its batch cannot meet its window at the rate it runs: it waits in
    /// its owner's fair queue as live work (by the owner's weight, never
    /// refused for a predicted SLO miss) rather than in the batch lane.
    pub promoted: bool,
}

/// Serves one inference request.
pub async fn handle(gw: Arc<Gateway>, req: Request<RequestBody>, call: Call) -> Response<BoxBody> {
    let start = gw.now();
    let live = gw.live();
    let mut ticket = Ticket::new(gw.clone(), live.clone(), start, req.headers());
    let version = req.version();
    let has_body = !http_body::Body::is_end_stream(req.body());
    match run(&gw, &live, req, call, &mut ticket).await {
        // The ticket finishes when the body ends (or the client leaves).
        Ok((resp, mode, pending)) => relay(resp, mode, ticket, pending),
        Err(e) => {
            log_failure(&e);
            ticket.failed(&e);
            let mut resp = call.error_response(e);
            close_if_body_unread(&mut resp, version, has_body && !ticket.body_read());
            ticket.finish();
            resp
        }
    }
}

/// Logs a failed request at the level its blame gives: ours or a
/// backend's at `WARN`, a client's at `DEBUG`.
fn log_failure(e: &ApiError) {
    let (status, blame) = (e.status().as_u16(), e.blame());
    if blame.level() == tracing::Level::DEBUG {
        tracing::debug!(error = %e, status, %blame, "request failed");
        return;
    }
    // A client or a backend can make these at will: at most one line
    // every 10 s (the access log and the metrics have each).
    static LOG: crate::clock::Throttled =
        crate::clock::Throttled::new(crate::clock::REMOTE_LOG_EVERY);
    if let Some(left_out) = LOG.allow() {
        tracing::warn!(error = %e, status, %blame, left_out, "request failed");
    }
}

/// The phases up to the backend's answer.
async fn run(
    gw: &Arc<Gateway>,
    live: &Arc<Live>,
    req: Request<RequestBody>,
    call: Call,
    ticket: &mut Ticket,
) -> Result<(Response<connections::Body>, Mode, Option<Pending>), ApiError> {
    let tenant = identify(live, &req, ticket)?;
    let path = req.uri().path().to_owned();
    let read = read(live, req, &path, call, ticket).await?;
    let pool = route(gw, live, &read.info, call, tenant, ticket)?;
    // Debug builds only: lets the tests check that a handler panic becomes
    // a 500 with one recorded outcome.
    #[cfg(debug_assertions)]
    if read.parts.headers.contains_key("x-fairway-debug-panic") {
        panic!("x-fairway-debug-panic");
    }
    let salt = cache_salt(live, tenant, call, &read.info);
    let (prefix, tokens) = prompt_tokens(live, &pool, &read, call, salt.as_deref()).await;
    let item = read.parts.extensions.get::<BatchItem>();
    let resumable = item.is_some_and(|i| i.resumable);
    let (pending, preemptible) = admit(
        gw,
        &pool,
        &read.info,
        call,
        (tenant, item),
        (prefix, tokens),
        ticket,
    )?;
    let strip_usage = read.info.stream && !read.info.include_usage && call == Call::Completions;
    let infer = read.triton.as_ref().is_some_and(|p| p.action == "infer");
    let payload = match read.payload {
        Payload::Whole(b) if strip_usage => Payload::Whole(openai::with_usage_requested(&b)),
        body => body,
    };
    let payload = match (payload, &salt) {
        (Payload::Whole(b), Some(salt)) => Payload::Whole(openai::with_cache_salt(
            &b,
            salt,
            read.info.cache_salt.is_some(),
        )),
        (body, _) => body,
    };
    let out = Outgoing {
        parts: &read.parts,
        path: &path,
        triton: read.triton.as_ref(),
        payload,
        model: &read.info.model,
        pool_index: pool.index,
    };
    let (resp, pending) = forward(gw, live, out, pending, preemptible, ticket).await?;
    let mode = Mode::of(call, &resp, strip_usage, infer);
    let pending = (resumable && preemptible && !mode.is_json()).then_some(pending);
    Ok((resp, mode, pending))
}

/// Identify: the tenant of the request's API key (or trusted header).
fn identify(
    live: &Live,
    req: &Request<RequestBody>,
    ticket: &mut Ticket,
) -> Result<TenantId, ApiError> {
    let tenant = match req.extensions().get::<BatchItem>() {
        Some(item) => {
            live.tenant_names
                .get(item.tenant.as_str())
                .copied()
                .ok_or(ApiError::Auth(
                    "The batch's tenant is no longer in the policy.",
                ))?
        }
        None => authenticate(live, req.headers())?,
    };
    ticket.identified(tenant);
    Ok(tenant)
}

/// What was read of a request.
struct Read<'p> {
    parts: http::request::Parts,
    payload: Payload,
    /// What the call's protocol module read of the body.
    info: RequestInfo,
    /// A Triton call's model path (it borrows the request's path).
    triton: Option<ModelPath<'p>>,
}

/// Read: the body within `body_read_timeout` (an upload only to its
/// `model` field, the rest streamed to the backend later), parsed by the
/// call's protocol module for just what the scheduler needs.
async fn read<'p>(
    live: &Live,
    req: Request<RequestBody>,
    path: &'p str,
    call: Call,
    ticket: &mut Ticket,
) -> Result<Read<'p>, ApiError> {
    let server = &live.policy.server;
    if call == Call::Audio {
        let limit = server.max_upload_bytes;
        let (parts, a, upload) = audio::read_head(req, limit, server.body_read_timeout).await?;
        let info = RequestInfo {
            model: a.model,
            stream: a.stream,
            include_usage: false,
            max_tokens: None,
            choices: 1,
            prompt_tokens: a.prompt_tokens,
            cache_salt: None,
        };
        return Ok(Read {
            parts,
            payload: Payload::Upload(upload),
            info,
            triton: None,
        });
    }
    let (parts, body) = read_body(req, server.max_body_bytes, server.body_read_timeout).await?;
    ticket.body_was_read(true);
    let (info, triton) = match call {
        Call::Triton => {
            let p = triton::model_path(path).ok_or(ApiError::NotFound)?;
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
    Ok(Read {
        parts,
        payload: Payload::Whole(body),
        info,
        triton,
    })
}

/// The scheduler pool a request goes to.
struct Routed {
    id: crate::core::ids::PoolId,
    /// Index into the policy's pools.
    index: usize,
    /// The LoRA adapter the request names (its model), if it names one.
    adapter: Option<String>,
}

/// Route: the model's pool over the call's protocol (a LoRA adapter's
/// base model's), and whether the tenant's limits can be held now.
fn route(
    gw: &Gateway,
    live: &Live,
    info: &RequestInfo,
    call: Call,
    tenant: TenantId,
    ticket: &mut Ticket,
) -> Result<Routed, ApiError> {
    let (id, index, is_adapter) = gw.model_pool(live, &info.model, call.api(), Some(tenant))?;
    let adapter = is_adapter.then(|| info.model.clone());
    ticket.routed(id, index, adapter.as_deref());
    closed_while_store_down(gw, live, tenant)?;
    ticket.asked(info.prompt_tokens, info.max_tokens, info.stream);
    Ok(Routed { id, index, adapter })
}

/// The `cache_salt` the gateway sets on a chat or completions request of
/// `tenant` (`gateway::salt`): `None` when its tenant shares the engines'
/// caches (`prefix_cache = "shared"`, or no tenants declared).
fn cache_salt(live: &Live, tenant: TenantId, call: Call, info: &RequestInfo) -> Option<Arc<str>> {
    if call != Call::Completions {
        return None;
    }
    let index = *live.tenant_policy.get(&tenant)?;
    let Some(client) = info.cache_salt.as_deref() else {
        return live.salts[index].clone();
    };
    let namespace = live.policy.tenants[index].cache_namespace.as_deref()?;
    Some(
        super::salt::salt(
            live.policy.server.cache_salt_secret.as_ref(),
            namespace,
            Some(client),
        )
        .into(),
    )
}

/// The keys of the request's prompt blocks, when its pool routes on
/// cached prefixes (`routing = "prefix_aware"`): its prompt's bytes
/// (`protocol::prompt`) as approximate token ids, keyed by its model or
/// adapter and its `cache_salt` (the gateway's `salt` where it sets one).
/// Computed before the scheduler's lock is
/// taken. Empty for calls with no prompt text to share.
///
/// With the pool's tokenizer (`tokenizer`), the keys are of the prompt's
/// real token ids (the chat rendered with its template), and their count
/// replaces the estimate in the request's cost: returned as the second
/// value, `None` without a tokenizer or when the body cannot be rendered
/// (the keys then fall back to the bytes). A body over
/// [`INLINE_PROMPT_BYTES`] is rendered and tokenized on the blocking pool:
/// a long conversation costs its own request time, not every other
/// request's on the same thread.
async fn prompt_tokens(
    live: &Live,
    pool: &Routed,
    read: &Read<'_>,
    call: Call,
    salt: Option<&str>,
) -> (Vec<u64>, Option<u32>) {
    let policy = &live.policy.pools[pool.index];
    let routed = policy.routing == Strategy::PrefixAware;
    let tokenizer = policy.tokenizer.as_ref();
    if (!routed && tokenizer.is_none())
        || matches!(call, Call::Triton | Call::Audio | Call::Pooling)
    {
        return (Vec::new(), None);
    }
    let Payload::Whole(body) = &read.payload else {
        return (Vec::new(), None);
    };
    let block = policy.prefix.block_tokens;
    let ids = match tokenizer {
        Some(t) if body.len() > INLINE_PROMPT_BYTES => {
            let (t, body) = (t.loaded.clone(), body.clone());
            let ids = tokio::task::spawn_blocking(move || t.prompt_ids(&body));
            ids.await.ok().flatten()
        }
        Some(t) => t.loaded.prompt_ids(body),
        None => None,
    };
    match ids {
        Some(p) => {
            let n = u32::try_from(p.ids.len()).unwrap_or(u32::MAX);
            let keys = if routed {
                crate::tokens::request_keys(
                    &read.info.model,
                    salt.or(p.cache_salt.as_deref()),
                    &p.ids,
                    block,
                )
            } else {
                Vec::new()
            };
            (keys, Some(n))
        }
        None if routed => (prompt::keys(body, &read.info.model, salt, block), None),
        None => (Vec::new(), None),
    }
}

/// The largest body whose prompt is rendered and tokenized where the
/// request runs: about 100 µs of tokenizing, and a render bounded by the
/// template's budget ([`crate::tokens::TEMPLATE_FUEL`]).
const INLINE_PROMPT_BYTES: usize = 32 << 10;

/// Admit: admission and the fair queue, under the scheduler's lock. The
/// request is dispatched at once or waits for the decision a later event
/// makes; returns its decisions and whether it may be preempted.
fn admit(
    gw: &Gateway,
    pool: &Routed,
    info: &RequestInfo,
    call: Call,
    (tenant, item): (TenantId, Option<&BatchItem>),
    (prefix, tokens): (Vec<u64>, Option<u32>),
    ticket: &mut Ticket,
) -> Result<(Pending, bool), ApiError> {
    let arrival = Arrival {
        tenant,
        pool: pool.id,
        prompt_tokens: tokens.unwrap_or(info.prompt_tokens),
        // No output to estimate: pooling has none, and an audio call's
        // is not reported (its duration settles it).
        max_tokens: if matches!(call, Call::Pooling | Call::Audio) {
            Some(0)
        } else {
            info.max_tokens
        },
        choices: info.choices,
        deadline: item.map(|i| i.deadline),
        adapter: None,
        prefix,
        lane: match item {
            Some(i) if i.promoted => Lane::Promoted,
            Some(i) if i.resumable => Lane::Resumable,
            Some(_) => Lane::Batch,
            None => Lane::Live,
        },
    };
    match gw
        .sched()
        .arrive(gw.now(), arrival, pool.adapter.as_deref())
    {
        // Every backend is ejected: answer now rather than queue until
        // `max_wait` for a pool that may stay down.
        Arrived::PoolDown => Err(ApiError::NoBackend(info.model.clone())),
        Arrived::Refused { tenant, refusal } => {
            if let Some(member) = gw.cluster()
                && refusal.limit != crate::core::admission::LimitKind::QueueFull
            {
                // This replica's lease may be what ran out: ask the
                // store sooner than the next sync.
                member.starved();
            }
            Err(ApiError::Refused { tenant, refusal })
        }
        Arrived::Admitted(a) => {
            ticket.admitted(a.id, a.limits);
            Ok((a.pending, a.preemptible))
        }
    }
}

/// Relay: the backend's answer, streamed to the client through the
/// ticket, which finishes when the body ends.
fn relay(
    resp: Response<connections::Body>,
    mode: Mode,
    mut ticket: Ticket,
    pending: Option<Pending>,
) -> Response<BoxBody> {
    let (parts, body) = resp.into_parts();
    let streaming = !mode.is_json();
    ticket.answered(parts.status, streaming);
    let limits = ticket.limits();
    let mut relayed = RelayBody::new(body, mode, ticket);
    if let Some(p) = pending {
        relayed = relayed.preemptible(p);
    }
    let mut out = Response::from_parts(parts, relayed.boxed_unsync());
    upstream::strip_response_headers(out.headers_mut());
    rate_limit_headers(out.headers_mut(), &limits);
    if streaming {
        // The relay may drop the usage chunk or end a cut stream
        // with an error event: the backend's length no longer holds.
        out.headers_mut().remove(header::CONTENT_LENGTH);
    }
    out
}

impl Mode {
    /// How a call's answer is relayed: by its protocol, whether the
    /// backend answered SSE, whether the usage chunk Fairway asked for is
    /// dropped, and whether it is Triton's `infer`.
    fn of(call: Call, resp: &Response<connections::Body>, strip_usage: bool, infer: bool) -> Mode {
        let is_sse = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        match (call, is_sse, strip_usage && resp.status() == StatusCode::OK) {
            (Call::Triton, false, _) if infer => Mode::TritonInfer,
            (Call::Triton, false, _) => Mode::TritonJson,
            (Call::Triton, true, _) => Mode::TritonSse,
            (Call::Responses, false, _) => Mode::ResponsesJson,
            (Call::Responses, true, _) => Mode::ResponsesSse,
            (_, false, _) => Mode::Json,
            (_, true, false) => Mode::Sse,
            (_, true, true) => Mode::SseStripUsage,
        }
    }
}

/// With `[cluster] on_store_failure = "closed"` and the store unreachable,
/// a tenant with limits is refused: its limits cannot be held for the
/// cluster.
fn closed_while_store_down(gw: &Gateway, live: &Live, tenant: TenantId) -> Result<(), ApiError> {
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
