//! The simulated backend's routes: fault injection, `/health`, `/metrics`,
//! `/v1/models` and the generation and embedding endpoints, each turning a
//! request into engine work through [`Shared::submit`].
//!
//! Owns no state; a generation's [`SeqGuard`] lives in the response body
//! (streaming) or the handler future (non-streaming), so a client that goes
//! away cancels its sequence.

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
use super::openai::{self, ApiError, Endpoint, StreamHead};
use super::triton::{self, TritonError};
use super::{Body, Delivery, Fault, Flavour, MAX_BODY_BYTES, SeqGuard, Shared};
use crate::sim::engine::EngineError;

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
            })) => {
                this.is_done = true;
                if this.store {
                    let whole =
                        this.head
                            .full_response(prompt_tokens, completion_tokens, this.reason);
                    this.guard
                        .shared
                        .store_response(this.head.id.clone(), whole);
                }
                this.head.done_event(
                    prompt_tokens,
                    completion_tokens,
                    this.include_usage,
                    this.reason,
                )
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

/// Reads a JSON body and checks its `model`.
async fn model_body(
    shared: &Shared,
    req: Request<Incoming>,
) -> Result<serde_json::Value, ApiError> {
    let body = read_body(req).await?;
    let v: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))?;
    let model = v.get("model").and_then(|m| m.as_str()).unwrap_or_default();
    if model != shared.model {
        return Err(ApiError::model_not_found(model));
    }
    Ok(v)
}

/// The prompt tokens of the fields a pooling or tokenize request names.
fn tokens_in(v: &serde_json::Value, fields: &[&str]) -> u32 {
    let mut text = String::new();
    for f in fields {
        if let Some(x) = v.get(*f) {
            openai::text_of(x, &mut text);
        }
    }
    crate::tokens::estimate(&text)
}

/// `/v1/messages/count_tokens`: `{"input_tokens": N}`.
async fn count_tokens(shared: &Shared, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let v = model_body(shared, req).await?;
    let n = tokens_in(&v, &["system", "messages"]);
    let body = serde_json::json!({ "input_tokens": n });
    Ok(json(StatusCode::OK, Bytes::from(body.to_string())))
}

/// `/tokenize` (one id per estimated token) and `/detokenize`.
async fn tokenize(
    shared: &Shared,
    path: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let v = model_body(shared, req).await?;
    let body = if path == "/detokenize" {
        let n = v
            .get("tokens")
            .and_then(|t| t.as_array())
            .map_or(0, Vec::len);
        serde_json::json!({ "prompt": super::TOKEN_TEXT.repeat(n) })
    } else {
        let n = tokens_in(&v, &["prompt", "messages"]);
        serde_json::json!({
            "count": n,
            "max_model_len": shared.max_model_len,
            "tokens": (0..n).collect::<Vec<u32>>(),
            "token_strs": null,
        })
    };
    Ok(json(StatusCode::OK, Bytes::from(body.to_string())))
}

/// vLLM's pooling routes: one engine pass over the input (its prefill),
/// then an answer in the route's shape with a score per item.
async fn pooling(
    shared: &Arc<Shared>,
    path: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let v = model_body(shared, req).await?;
    let tokens = tokens_in(
        &v,
        &[
            "input",
            "query",
            "documents",
            "text_1",
            "text_2",
            "messages",
        ],
    );
    let (guard, mut rx) = shared
        .submit(tokens.max(1), 1, FinishReason::Length)
        .map_err(|err| engine_error(err, Endpoint::Completions))?;
    // The guard lives across the wait, so a dropped connection cancels.
    while let Some(d) = rx.recv().await {
        if let Delivery::Finished { .. } = d {
            let body = openai::pooling_response(path, &v, &shared.model, guard.id, tokens);
            return Ok(json(StatusCode::OK, Bytes::from(body.to_string())));
        }
    }
    Err(ApiError::internal("engine dropped the request"))
}

/// vLLM's transcription and translation routes: the multipart form is
/// read as it arrives (never held whole), then one engine pass sized by
/// the audio's duration (at most one 30 s window's prefill, and about
/// three words a second of output) answers `{"text", "usage"}` with the
/// duration, as vLLM does. `stream` and `response_format` are not
/// simulated: the answer is always that JSON.
async fn transcription(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    use crate::protocol::audio;
    let boundary = audio::boundary(req.headers())
        .map(str::to_owned)
        .ok_or_else(|| ApiError::bad_request("Expected a multipart/form-data body".into()))?;
    let mut form = audio::Form::new(&boundary);
    let mut body = req.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| ApiError::bad_request(format!("Could not read the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            form.feed(&data).map_err(ApiError::bad_request)?;
        }
    }
    let model = form.model.clone().unwrap_or_default();
    if model != shared.model {
        return Err(ApiError::model_not_found(&model));
    }
    let seconds = form.seconds(None);
    if seconds <= 0.0 {
        return Err(ApiError::bad_request("The form has no audio file".into()));
    }
    let window = (30.0 * audio::TOKENS_PER_SECOND) as u32;
    let prompt = ((seconds * audio::TOKENS_PER_SECOND) as u32).clamp(1, window);
    let words =
        ((seconds * 3.0) as u32).clamp(1, shared.max_model_len.saturating_sub(prompt).max(1));
    let (guard, mut rx) = shared
        .submit(prompt, words, FinishReason::Stop)
        .map_err(|err| engine_error(err, Endpoint::Completions))?;
    let _guard = guard;
    while let Some(d) = rx.recv().await {
        if let Delivery::Finished { .. } = d {
            let text = vec!["word"; words as usize].join(" ");
            let body = serde_json::json!({
                "text": text,
                "usage": {"type": "duration", "seconds": seconds.ceil() as u64},
            });
            return Ok(json(StatusCode::OK, Bytes::from(body.to_string())));
        }
    }
    Err(ApiError::internal("engine dropped the request"))
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
            openai::models_response(&shared.model, &shared.adapters, shared.max_model_len, 0),
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
    let (guard, mut rx) = shared
        .submit_for(adapter, g.prompt_tokens, g.output_tokens, reason)
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
        } = d
        {
            let body = head.full_response(prompt_tokens, completion_tokens, reason);
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
                openai::embedding_response(&e.model, &e.inputs, e.prompt_tokens),
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

/// `/v2/models/{name}[/versions/{v}][/{action}]`: the model's name and the
/// action (empty for the metadata route).
fn model_route(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/v2/models/")?;
    let (name, rest) = rest.split_once('/').unwrap_or((rest, ""));
    let rest = match rest.strip_prefix("versions/") {
        Some(v) => v.split_once('/').map_or("", |(_, action)| action),
        None => rest,
    };
    (!name.is_empty()).then_some((name, rest))
}

/// Triton's routes: KServe v2 health, server and model metadata, and the
/// generate extension; `/infer` on this decoupled model is refused as
/// Triton refuses it over HTTP.
async fn triton_routes(
    shared: &Arc<Shared>,
    method: &Method,
    path: &str,
    req: Request<Incoming>,
    fault: Fault,
) -> Response<Body> {
    let backend = match shared.flavour {
        Flavour::TritonVllm => triton::Backend::Vllm,
        Flavour::TritonTensor => triton::Backend::Tensor,
        _ => triton::Backend::TensorRtLlm,
    };
    let empty = || full(StatusCode::OK, "text/plain", Bytes::new());
    match (method, path) {
        (&Method::GET, "/v2/health/live" | "/v2/health/ready") => return empty(),
        (&Method::GET, "/v2") => return json(StatusCode::OK, triton::server_metadata()),
        (&Method::GET, "/metrics") => {
            return full(
                StatusCode::OK,
                "text/plain; charset=utf-8; version=0.0.4",
                Bytes::from(shared.metrics_text()),
            );
        }
        _ => {}
    }
    let Some((model, action)) = model_route(path) else {
        return triton_error(&TritonError {
            status: 404,
            message: "Not Found".to_owned(),
        });
    };
    if model != shared.model {
        return triton_error(&TritonError::unknown_model(model));
    }
    match (method, action) {
        (&Method::GET, "") => json(StatusCode::OK, triton::model_metadata(model, backend)),
        (&Method::GET, "ready") => empty(),
        (&Method::POST, "infer") if backend == triton::Backend::Tensor => triton_infer(shared, req)
            .await
            .unwrap_or_else(|e| triton_error(&e)),
        (&Method::POST, "infer") => triton_error(&TritonError {
            status: 501,
            message: "HTTP end point doesn't support models with decoupled transaction policy"
                .to_owned(),
        }),
        (&Method::POST, "generate" | "generate_stream") => {
            triton_generate(shared, req, action == "generate_stream", fault)
                .await
                .unwrap_or_else(|e| triton_error(&e))
        }
        _ => triton_error(&TritonError {
            status: 404,
            message: "Not Found".to_owned(),
        }),
    }
}

/// A body of `generate_stream` events, one per token; it closes after the
/// last (Triton sends no `[DONE]`).
struct TritonStream {
    rx: mpsc::UnboundedReceiver<Delivery>,
    model: String,
    _guard: SeqGuard,
}

impl Stream for TritonStream {
    type Item = Result<Frame<Bytes>, std::io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match this.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None | Some(Delivery::Finished { .. })) => Poll::Ready(None),
            Poll::Ready(Some(Delivery::Token { .. })) => {
                Poll::Ready(Some(Ok(Frame::data(triton::stream_event(&this.model)))))
            }
        }
    }
}

async fn triton_generate(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    stream: bool,
    fault: Fault,
) -> Result<Response<Body>, TritonError> {
    let tag = req
        .headers()
        .get("triton-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = read_body(req)
        .await
        .map_err(|e| TritonError::invalid(e.message))?;
    if triton::is_stop(&body) {
        // The LLM-API model's cancellation: a second call with the same
        // `triton-request-id` and `"stop": true`.
        if let Some(t) = &tag {
            shared.stop_tagged(t);
        }
        return Ok(json(StatusCode::OK, triton::response(&shared.model, "")));
    }
    let g = triton::parse_generate(&body)?;
    if u64::from(g.prompt_tokens) + u64::from(g.max_tokens) > u64::from(shared.max_model_len) {
        return Err(TritonError::invalid(format!(
            "The prompt ({} tokens) plus max_tokens ({}) exceed the model's maximum length ({})",
            g.prompt_tokens, g.max_tokens, shared.max_model_len
        )));
    }
    let reason = if g.output_tokens < g.max_tokens {
        FinishReason::Stop
    } else {
        FinishReason::Length
    };
    let (guard, mut rx) = shared
        .submit(g.prompt_tokens, g.output_tokens, reason)
        .map_err(|e| TritonError::invalid(e.to_string()))?;
    if let Some(tag) = tag {
        shared.tag(tag, guard.id);
    }
    if stream {
        let events = TritonStream {
            rx,
            model: shared.model.clone(),
            _guard: guard,
        };
        let body = match fault {
            Fault::CutStream => cut_after_two(events),
            _ => BodyExt::boxed(StreamBody::new(events)),
        };
        let mut resp = Response::new(body);
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/event-stream; charset=utf-8"),
        );
        return Ok(resp);
    }
    // The guard lives across the wait, so a dropped connection cancels.
    let _guard = guard;
    while let Some(d) = rx.recv().await {
        if let Delivery::Finished {
            completion_tokens, ..
        } = d
        {
            let text = triton::text(completion_tokens);
            return Ok(json(StatusCode::OK, triton::response(&shared.model, &text)));
        }
    }
    Err(TritonError {
        status: 500,
        message: "engine dropped the request".to_owned(),
    })
}

/// An infer call on a classic model: one engine pass over the request's
/// size, then one output tensor (JSON, also for a binary-tensor request).
async fn triton_infer(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, TritonError> {
    let header_len = req
        .headers()
        .get("inference-header-content-length")
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or_else(|| TritonError::invalid("invalid Inference-Header-Content-Length"))
        })
        .transpose()?;
    let body = read_body(req)
        .await
        .map_err(|e| TritonError::invalid(e.message))?;
    let tokens = triton::parse_infer(&body, header_len)?;
    let id = request_id(header_len.map_or(&body[..], |n| &body[..n]));
    let (guard, mut rx) = shared
        .submit(tokens, 1, FinishReason::Length)
        .map_err(|e| TritonError::invalid(e.to_string()))?;
    let _guard = guard;
    while let Some(d) = rx.recv().await {
        if let Delivery::Finished { .. } = d {
            return Ok(json(
                StatusCode::OK,
                triton::infer_response(&shared.model, id.as_deref()),
            ));
        }
    }
    Err(TritonError {
        status: 500,
        message: "engine dropped the request".to_owned(),
    })
}

/// The request's `id`, which Triton echoes in its response.
fn request_id(json: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(json)
        .ok()?
        .get("id")?
        .as_str()
        .map(str::to_owned)
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
