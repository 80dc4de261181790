//! Triton's routes on the simulated backend: KServe v2 health, server and
//! model metadata, `infer` on a tensor model, and the generate extension.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::sync::mpsc;

use super::{cut_after_two, full, json, read_body, triton_error};
use crate::sim::backend::metrics::FinishReason;
use crate::sim::backend::triton::{self, TritonError};
use crate::sim::backend::{Body, Delivery, Fault, Flavour, SeqGuard, Shared};

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
pub(super) async fn triton_routes(
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
        (&Method::GET, "config") => json(StatusCode::OK, triton::model_config(model, backend)),
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
            if g.stream && completion_tokens > 1 {
                // The decoupled model sent a response per token.
                return Err(triton::several_responses());
            }
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
