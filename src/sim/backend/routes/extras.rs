//! vLLM's routes beside generation on the simulated backend: Anthropic's
//! token count, `/tokenize` and `/detokenize`, the pooling routes (rerank,
//! score, classify, pooling) and audio transcription.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::{engine_error, json, read_body};
use crate::sim::backend::metrics::FinishReason;
use crate::sim::backend::openai::{self, ApiError, Endpoint};
use crate::sim::backend::pooling;
use crate::sim::backend::{Body, Delivery, Shared, TOKEN_TEXT};

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
pub(super) async fn count_tokens(
    shared: &Shared,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let v = model_body(shared, req).await?;
    let n = tokens_in(&v, &["system", "messages"]);
    let body = serde_json::json!({ "input_tokens": n });
    Ok(json(StatusCode::OK, Bytes::from(body.to_string())))
}

/// `/tokenize` (one id per estimated token) and `/detokenize`.
pub(super) async fn tokenize(
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
        serde_json::json!({ "prompt": TOKEN_TEXT.repeat(n) })
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
pub(super) async fn pooling(
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
            let body = pooling::pooling_response(path, &v, &shared.model, guard.id, tokens);
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
pub(super) async fn transcription(
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
            form.feed(&data)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
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
