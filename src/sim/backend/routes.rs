//! The simulated backend's routes: fault injection, `/health`, `/metrics`,
//! `/v1/models` and the generation and embedding endpoints, each turning a
//! request into engine work through [`Shared::submit`].
//!
//! Owns no state; a generation's [`SeqGuard`] lives in the response body
//! (streaming) or the handler future (non-streaming), so a client that goes
//! away cancels its sequence. The routes beside generation (token counts,
//! tokenize, pooling, transcription) are in `extras`, Triton's in `kserve`.

mod extras;
mod kserve;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{Stream, StreamExt as _};
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use serde::Deserialize;
use tokio::sync::mpsc;

use super::metrics::FinishReason;
use super::openai::{self, ApiError, Endpoint, StreamHead, Usage};
use super::pooling;
use super::triton::TritonError;
use super::{Body, Delivery, Fault, Flavour, MAX_BODY_BYTES, SeqGuard, Shared};
use crate::sim::engine::EngineError;

use self::extras::{count_tokens, pooling, tokenize, transcription};
use self::kserve::triton_routes;

/// A body of SSE frames, one per engine event for this request.
struct TokenStream {
    rx: mpsc::UnboundedReceiver<Delivery>,
    head: StreamHead,
    output_tokens: u32,
    reason: FinishReason,
    include_usage: bool,
    is_done: bool,
    /// A Responses API response to keep for `GET` once complete.
    store: bool,
    guard: SeqGuard,
}

impl Stream for TokenStream {
    type Item = Result<Frame<Bytes>, std::io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.is_done {
            return Poll::Ready(None);
        }
        let bytes = match this.rx.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => {
                this.is_done = true;
                return Poll::Ready(None);
            }
            Poll::Ready(Some(Delivery::Token { index })) => {
                let finish = (index >= this.output_tokens).then_some(this.reason);
                this.head.token_event(index, finish)
            }
            Poll::Ready(Some(Delivery::Finished {
                prompt_tokens,
                completion_tokens,
                cached_tokens,
            })) => {
                this.is_done = true;
                let usage = Usage {
                    prompt: prompt_tokens,
                    cached: cached_tokens,
                    completion: completion_tokens,
                };
                if this.store {
                    let whole = this.head.full_response(usage, this.reason);
                    this.guard
                        .shared
                        .store_response(this.head.id.clone(), whole);
                }
                this.head.done_event(usage, this.include_usage, this.reason)
            }
        };
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }
}

fn full(status: StatusCode, content_type: &str, body: Bytes) -> Response<Body> {
    let mut resp = Response::new(Full::new(body).map_err(|n| match n {}).boxed());
    *resp.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

fn json(status: StatusCode, body: Bytes) -> Response<Body> {
    full(status, "application/json", body)
}

fn error(e: &ApiError) -> Response<Body> {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json(status, e.body())
}

/// An error on `/v1/messages`, in Anthropic's shape.
fn anthropic_error(e: &ApiError) -> Response<Body> {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = super::dialects::anthropic_error(e.status, &e.message);
    json(status, Bytes::from(body.to_string()))
}

/// `GET`/`DELETE /v1/responses/{id}`: a kept response, or 404.
fn stored_response(shared: &Shared, id: &str, delete: bool) -> Response<Body> {
    match shared.stored_response(id, delete) {
        Some(_) if delete => {
            let body = serde_json::json!({"id": id, "object": "response.deleted", "deleted": true});
            json(StatusCode::OK, Bytes::from(body.to_string()))
        }
        Some(body) => json(StatusCode::OK, body),
        None => error(&ApiError {
            status: 404,
            kind: "NotFoundError",
            message: format!("Response with id '{id}' not found."),
            param: None,
        }),
    }
}

pub(super) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    if method == Method::POST && path == "/admin/fault" {
        return Ok(set_fault(&shared, req).await);
    }
    let fault = *shared.fault.lock();
    match fault {
        Fault::None => {}
        Fault::Hang => {
            shared.stop.cancelled().await;
            return Ok(full(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                Bytes::new(),
            ));
        }
        Fault::Error if path == "/health" || path.starts_with("/v2/health") => {
            return Ok(full(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                Bytes::new(),
            ));
        }
        Fault::Error | Fault::ErrorHealthy if is_inference(&method, &path) => {
            return Ok(fault_error(&shared, "simulated backend fault"));
        }
        Fault::Error | Fault::ErrorHealthy => {}
        Fault::Flaky if is_inference(&method, &path) => {
            let n = shared
                .flaky_seen
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n % 3 == 2 {
                return Ok(fault_error(&shared, "simulated flaky backend"));
            }
        }
        Fault::Flaky => {}
        Fault::MetricsError if path == "/metrics" => {
            return Ok(full(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                Bytes::from_static(b"simulated metrics fault\n"),
            ));
        }
        Fault::MetricsHuge if path == "/metrics" => {
            let mut text = shared.metrics_text();
            let pad = "# padding to pass the gateway's scrape limit\n";
            while text.len() < 9 << 20 {
                text.push_str(pad);
            }
            return Ok(full(StatusCode::OK, "text/plain", Bytes::from(text)));
        }
        Fault::MetricsTrickle if path == "/metrics" => {
            let text = Bytes::from(shared.metrics_text());
            let pieces = futures_util::stream::unfold(0usize, move |at| {
                let text = text.clone();
                async move {
                    if at >= text.len() {
                        return None;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    let end = (at + 8).min(text.len());
                    Some((Ok(Frame::data(text.slice(at..end))), end))
                }
            });
            let mut resp = Response::new(BodyExt::boxed(StreamBody::new(pieces)));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain"),
            );
            return Ok(resp);
        }
        Fault::MetricsError
        | Fault::CutStream
        | Fault::SseContentLength
        | Fault::MetricsHuge
        | Fault::MetricsTrickle => {}
    }
    if shared.flavour != Flavour::Vllm {
        return Ok(triton_routes(&shared, &method, &path, req, fault).await);
    }
    let delete = method == Method::DELETE;
    let resp = match (method, path.as_str()) {
        (Method::GET, "/health") => full(StatusCode::OK, "text/plain", Bytes::new()),
        (Method::GET, "/metrics") => full(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            Bytes::from(shared.metrics_text()),
        ),
        (Method::GET, "/v1/models") => json(
            StatusCode::OK,
            openai::models_response(
                &shared.model,
                &shared.adapters,
                shared.max_model_len,
                crate::clock::unix_seconds(),
            ),
        ),
        (Method::POST, "/v1/chat/completions") => generate(&shared, Endpoint::Chat, req, fault)
            .await
            .unwrap_or_else(|e| error(&e)),
        (Method::POST, "/v1/completions") => generate(&shared, Endpoint::Completions, req, fault)
            .await
            .unwrap_or_else(|e| error(&e)),
        (Method::POST, "/v1/responses") => generate(&shared, Endpoint::Responses, req, fault)
            .await
            .unwrap_or_else(|e| error(&e)),
        (Method::POST, "/v1/messages") => generate(&shared, Endpoint::Messages, req, fault)
            .await
            .unwrap_or_else(|e| anthropic_error(&e)),
        (Method::POST, "/v1/messages/count_tokens") => count_tokens(&shared, req)
            .await
            .unwrap_or_else(|e| anthropic_error(&e)),
        (Method::GET | Method::DELETE, p) if p.starts_with("/v1/responses/") => {
            let id = &p["/v1/responses/".len()..];
            stored_response(&shared, id, delete)
        }
        (Method::POST, "/v1/embeddings") => {
            embeddings(&shared, req).await.unwrap_or_else(|e| error(&e))
        }
        (
            Method::POST,
            "/v1/rerank" | "/rerank" | "/v2/rerank" | "/v1/score" | "/score" | "/classify"
            | "/pooling",
        ) => pooling(&shared, &path, req)
            .await
            .unwrap_or_else(|e| error(&e)),
        (Method::POST, p) if crate::protocol::audio::is_upload_route(p) => {
            transcription(&shared, req)
                .await
                .unwrap_or_else(|e| error(&e))
        }
        (Method::POST, "/tokenize" | "/detokenize") => tokenize(&shared, &path, req)
            .await
            .unwrap_or_else(|e| error(&e)),
        _ => json(
            StatusCode::NOT_FOUND,
            Bytes::from_static(br#"{"detail":"Not Found"}"#),
        ),
    };
    Ok(resp)
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, ApiError> {
    match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) => Err(ApiError::bad_request(format!(
            "Could not read the request body: {e}"
        ))),
    }
}

async fn set_fault(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    #[derive(Deserialize)]
    struct FaultBody {
        mode: Fault,
    }
    let parsed = read_body(req).await.and_then(|b| {
        serde_json::from_slice::<FaultBody>(&b)
            .map_err(|e| ApiError::bad_request(format!("Invalid fault body: {e}")))
    });
    match parsed {
        Ok(FaultBody { mode }) => {
            *shared.fault.lock() = mode;
            json(StatusCode::OK, Bytes::from_static(b"{}"))
        }
        Err(e) => error(&e),
    }
}

fn engine_error(e: EngineError, endpoint: Endpoint) -> ApiError {
    match e {
        EngineError::ContextTooLong {
            prompt,
            output,
            max_model_len,
            ..
        } => ApiError::context_too_long(max_model_len, prompt, output, endpoint),
        EngineError::ExceedsKvCache { .. } | EngineError::NoOutput | EngineError::LoraDisabled => {
            ApiError::bad_request(e.to_string())
        }
    }
}

async fn generate(
    shared: &Arc<Shared>,
    endpoint: Endpoint,
    req: Request<Incoming>,
    fault: Fault,
) -> Result<Response<Body>, ApiError> {
    let body = read_body(req).await?;
    let g = openai::parse_generation(endpoint, &body)?;
    let adapter = shared.adapter_of(&g.model)?;
    // vLLM validates against max_tokens, not the (simulator-only) output.
    if u64::from(g.prompt_tokens) + u64::from(g.max_tokens) > u64::from(shared.max_model_len) {
        return Err(ApiError::context_too_long(
            shared.max_model_len,
            g.prompt_tokens,
            g.max_tokens,
            endpoint,
        ));
    }
    let reason = g.finish_reason();
    let prefix = shared.prefix_keys(&g.model, &body);
    let (guard, mut rx) = shared
        .submit_for(adapter, g.prompt_tokens, g.output_tokens, reason, prefix)
        .map_err(|e| engine_error(e, endpoint))?;
    let head = StreamHead::new(
        endpoint,
        openai::response_id(endpoint, shared.salt, guard.id),
        &g,
    );
    if g.is_stream {
        let stream = TokenStream {
            rx,
            head,
            output_tokens: g.output_tokens,
            reason,
            include_usage: g.include_usage,
            is_done: false,
            store: endpoint == Endpoint::Responses && g.store,
            guard,
        };
        let body = match fault {
            Fault::CutStream => cut_after_two(stream),
            Fault::SseContentLength => {
                // Sent whole: hyper gives a body of known size a length.
                let all = BodyExt::collect(StreamBody::new(stream))
                    .await
                    .map_err(|_| ApiError::internal("stream failed"))?;
                Full::new(all.to_bytes()).map_err(|n| match n {}).boxed()
            }
            _ => BodyExt::boxed(StreamBody::new(stream)),
        };
        let mut resp = Response::new(body);
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-cache"),
        );
        return Ok(resp);
    }
    // The guard lives across the wait, so a dropped connection cancels.
    let _guard = guard;
    while let Some(d) = rx.recv().await {
        if let Delivery::Finished {
            prompt_tokens,
            completion_tokens,
            cached_tokens,
        } = d
        {
            let usage = Usage {
                prompt: prompt_tokens,
                cached: cached_tokens,
                completion: completion_tokens,
            };
            let body = head.full_response(usage, reason);
            if endpoint == Endpoint::Responses && g.store {
                shared.store_response(head.id.clone(), body.clone());
            }
            return Ok(json(StatusCode::OK, body));
        }
    }
    Err(ApiError::internal("engine dropped the request"))
}

async fn embeddings(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let body = read_body(req).await?;
    let e = openai::parse_embedding(&body)?;
    if e.model != shared.model {
        return Err(ApiError::model_not_found(&e.model));
    }
    if e.prompt_tokens > shared.max_model_len.saturating_sub(1) {
        return Err(ApiError::bad_request(format!(
            "This model's maximum context length is {} tokens. However, you requested {} tokens \
             in the input for embedding generation. Please reduce the length of the input.",
            shared.max_model_len, e.prompt_tokens
        )));
    }
    // One prefill; the single "output token" marks its end.
    let (guard, mut rx) = shared
        .submit(e.prompt_tokens, 1, FinishReason::Length)
        .map_err(|err| engine_error(err, Endpoint::Completions))?;
    let _guard = guard;
    while let Some(d) = rx.recv().await {
        if let Delivery::Finished { .. } = d {
            return Ok(json(
                StatusCode::OK,
                pooling::embedding_response(&e.model, &e.inputs, e.prompt_tokens),
            ));
        }
    }
    Err(ApiError::internal("engine dropped the request"))
}

/// A generation request: `/v1/*`, or a `POST` under `/v2/models/`.
fn is_inference(method: &Method, path: &str) -> bool {
    path.starts_with("/v1/") || (method == Method::POST && path.starts_with("/v2/models/"))
}

/// A 500 in the flavour's error shape.
fn fault_error(shared: &Shared, message: &str) -> Response<Body> {
    match shared.flavour {
        Flavour::Vllm => error(&ApiError::internal(message)),
        _ => triton_error(&TritonError {
            status: 500,
            message: message.to_owned(),
        }),
    }
}

fn triton_error(e: &TritonError) -> Response<Body> {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json(status, e.body())
}

/// The `CutStream` fault: two events, then the connection breaks. The pause
/// before the error lets hyper write the two events out first; an error in
/// the same poll as the events would drop them with the connection, and the
/// fault would sometimes be a stream cut before its first event.
fn cut_after_two<S>(events: S) -> Body
where
    S: Stream<Item = Result<Frame<Bytes>, std::io::Error>> + Send + Sync + 'static,
{
    BodyExt::boxed(StreamBody::new(events.take(2).chain(
        futures_util::stream::once(async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            Err(std::io::Error::other("simulated stream cut"))
        }),
    )))
}
