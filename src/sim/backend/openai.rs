//! vLLM's OpenAI-compatible wire format for the simulated backend: request
//! parsing into token counts, response and SSE chunk bodies, error bodies.
//!
//! Owns no state; the token text is a fixed word, so responses are
//! deterministic given the request.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};

use super::TOKEN_TEXT;
use super::metrics::FinishReason;

/// Template tokens vLLM's chat template adds per message (roughly).
const TOKENS_PER_MESSAGE: u32 = 4;

/// `max_tokens` when the request has none (vLLM's completions default).
const DEFAULT_MAX_TOKENS: u32 = 16;

/// Which generation endpoint a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
    /// The Responses API, `/v1/responses`.
    Responses,
    /// Anthropic's Messages, `/v1/messages`.
    Messages,
}

/// A generation request reduced to what the engine needs.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Generation {
    pub model: String,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    /// Tokens to generate: `sim_output_tokens` capped at `max_tokens`.
    pub output_tokens: u32,
    pub is_stream: bool,
    pub include_usage: bool,
    /// Completions asked for (`n`): each as long as the one the engine runs.
    pub n: u32,
    /// The Responses API's `max_output_tokens`, as given.
    pub max_output_tokens: Option<u32>,
    /// The Responses API's `store` (default true): kept for `GET`.
    pub store: bool,
    /// vLLM's `return_token_ids` (chat and completions streams): the
    /// prompt's ids on the first chunk, each token's on its own.
    pub token_ids: bool,
}

impl Generation {
    /// `length` when generation stops at `max_tokens`, else `stop`.
    pub(super) fn finish_reason(&self) -> FinishReason {
        if self.output_tokens >= self.max_tokens {
            FinishReason::Length
        } else {
            FinishReason::Stop
        }
    }
}

/// An embeddings request reduced to its inputs' token counts.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Embedding {
    pub model: String,
    pub inputs: Vec<String>,
    pub prompt_tokens: u32,
}

/// A request the backend refuses before the engine sees it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
}

impl ApiError {
    pub(super) fn bad_request(message: String) -> Self {
        ApiError {
            status: 400,
            kind: "BadRequestError",
            message,
            param: None,
        }
    }

    pub(super) fn model_not_found(model: &str) -> Self {
        ApiError {
            status: 404,
            kind: "NotFoundError",
            message: format!("The model `{model}` does not exist."),
            param: Some("model"),
        }
    }

    pub(super) fn internal(message: &str) -> Self {
        ApiError {
            status: 500,
            kind: "InternalServerError",
            message: message.to_owned(),
            param: None,
        }
    }

    pub(super) fn context_too_long(
        max_model_len: u32,
        prompt: u32,
        output: u32,
        endpoint: Endpoint,
    ) -> Self {
        let what = match endpoint {
            Endpoint::Chat | Endpoint::Messages => "messages",
            Endpoint::Completions | Endpoint::Responses => "prompt",
        };
        ApiError::bad_request(format!(
            "This model's maximum context length is {max_model_len} tokens. However, you requested \
             {} tokens ({prompt} in the {what}, {output} in the completion). Please reduce the \
             length of the {what} or completion.",
            u64::from(prompt) + u64::from(output)
        ))
    }

    /// vLLM's nested error body (v0.10.1+): `code` is the HTTP status.
    pub(super) fn body(&self) -> Bytes {
        let v = json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.status,
        }});
        Bytes::from(v.to_string())
    }
}

#[derive(Deserialize)]
struct RawRequest {
    model: Option<String>,
    messages: Option<Vec<RawMessage>>,
    prompt: Option<Texts>,
    input: Option<Value>,
    instructions: Option<Value>,
    system: Option<Value>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    max_output_tokens: Option<u32>,
    n: Option<u32>,
    store: Option<bool>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    sim_output_tokens: Option<u32>,
    #[serde(default)]
    return_token_ids: bool,
}

#[derive(Deserialize)]
struct RawMessage {
    content: Option<Content>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    text: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Texts {
    One(String),
    Many(Vec<String>),
    /// A prompt of token ids, as vLLM takes it.
    Ids(Vec<u32>),
}

impl Texts {
    /// The texts; ids are not a text (embeddings take texts only here).
    fn into_vec(self) -> Option<Vec<String>> {
        match self {
            Texts::One(s) => Some(vec![s]),
            Texts::Many(v) => Some(v),
            Texts::Ids(_) => None,
        }
    }

    /// The prompt's tokens.
    fn tokens(self) -> u32 {
        match self {
            Texts::One(s) => crate::tokens::estimate(&s),
            Texts::Many(v) => crate::tokens::estimate(&v.concat()),
            Texts::Ids(ids) => u32::try_from(ids.len()).unwrap_or(u32::MAX),
        }
    }
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The text in a JSON value: strings, and the `text`, `content` and
/// `output` of objects (content parts, input items, blocks).
pub(super) fn text_of(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => out.push_str(s),
        Value::Array(a) => a.iter().for_each(|v| text_of(v, out)),
        Value::Object(o) => ["text", "content", "output"]
            .iter()
            .filter_map(|k| o.get(*k))
            .for_each(|v| text_of(v, out)),
        _ => {}
    }
}

fn parse_raw(body: &[u8]) -> Result<RawRequest, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))
}

/// Parses a chat or completions body; validation against the engine's
/// limits is the caller's.
pub(super) fn parse_generation(endpoint: Endpoint, body: &[u8]) -> Result<Generation, ApiError> {
    let raw = parse_raw(body)?;
    let mut extra = String::new();
    for v in [&raw.instructions, &raw.system].into_iter().flatten() {
        text_of(v, &mut extra);
    }
    let extra = crate::tokens::estimate(&extra);
    let prompt_tokens = match endpoint {
        Endpoint::Responses => {
            let input = raw
                .input
                .as_ref()
                .ok_or_else(|| ApiError::bad_request("Field required: input".to_owned()))?;
            let mut text = String::new();
            text_of(input, &mut text);
            crate::tokens::estimate(&text)
        }
        Endpoint::Chat | Endpoint::Messages => {
            let messages = raw
                .messages
                .ok_or_else(|| ApiError::bad_request("Field required: messages".to_owned()))?;
            let mut text = String::new();
            for m in &messages {
                match &m.content {
                    Some(Content::Text(t)) => text.push_str(t),
                    Some(Content::Parts(parts)) => {
                        for p in parts {
                            text.push_str(p.text.as_deref().unwrap_or(""));
                        }
                    }
                    None => {}
                }
            }
            let template = u32::try_from(messages.len())
                .unwrap_or(u32::MAX)
                .saturating_mul(TOKENS_PER_MESSAGE);
            crate::tokens::estimate(&text).saturating_add(template)
        }
        Endpoint::Completions => raw
            .prompt
            .ok_or_else(|| ApiError::bad_request("Field required: prompt".to_owned()))?
            .tokens(),
    };
    let prompt_tokens = prompt_tokens.saturating_add(extra);
    if endpoint == Endpoint::Messages && raw.max_tokens.is_none() {
        return Err(ApiError::bad_request(
            "Field required: max_tokens".to_owned(),
        ));
    }
    let max_tokens = raw
        .max_completion_tokens
        .or(raw.max_tokens)
        .or(raw.max_output_tokens)
        .unwrap_or(DEFAULT_MAX_TOKENS);
    if max_tokens == 0 {
        return Err(ApiError::bad_request(
            "max_tokens must be at least 1, got 0.".to_owned(),
        ));
    }
    let output_tokens = raw
        .sim_output_tokens
        .map_or(max_tokens, |n| n.clamp(1, max_tokens));
    Ok(Generation {
        model: raw.model.unwrap_or_default(),
        prompt_tokens,
        max_tokens,
        output_tokens,
        is_stream: raw.stream,
        include_usage: raw.stream_options.is_some_and(|o| o.include_usage),
        n: match endpoint {
            Endpoint::Chat | Endpoint::Completions => raw.n.unwrap_or(1).clamp(1, 128),
            Endpoint::Responses | Endpoint::Messages => 1,
        },
        max_output_tokens: raw.max_output_tokens,
        store: raw.store.unwrap_or(true),
        token_ids: raw.return_token_ids,
    })
}

/// Parses an embeddings body.
pub(super) fn parse_embedding(body: &[u8]) -> Result<Embedding, ApiError> {
    let raw = parse_raw(body)?;
    let inputs = raw
        .input
        .ok_or_else(|| ApiError::bad_request("Field required: input".to_owned()))
        .and_then(|v| {
            serde_json::from_value::<Texts>(v)
                .ok()
                .and_then(Texts::into_vec)
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "`input` must be a string or a list of strings".to_owned(),
                    )
                })
        })?;
    let prompt_tokens = inputs.iter().fold(0u32, |acc, s| {
        acc.saturating_add(crate::tokens::estimate(s))
    });
    Ok(Embedding {
        model: raw.model.unwrap_or_default(),
        inputs,
        prompt_tokens,
    })
}

/// The response id for request `id`.
pub(super) fn response_id(endpoint: Endpoint, salt: u32, id: u64) -> String {
    match endpoint {
        Endpoint::Chat => format!("chatcmpl-{salt:08x}{id:016x}"),
        Endpoint::Completions => format!("cmpl-{salt:08x}{id:016x}"),
        Endpoint::Responses => format!("resp_{salt:08x}{id:016x}"),
        Endpoint::Messages => format!("msg_{salt:08x}{id:016x}"),
    }
}

/// What a finished sequence used: its prompt (`cached` of it found in
/// the prefix cache) and one choice's completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::sim::backend) struct Usage {
    pub prompt: u32,
    pub cached: u32,
    pub completion: u32,
}

/// Chat and completions usage, with vLLM's `prompt_tokens_details` (as
/// `--enable-prompt-tokens-details` reports it).
fn usage(u: Usage, completion: u32) -> Value {
    json!({
        "prompt_tokens": u.prompt,
        "completion_tokens": completion,
        "total_tokens": u64::from(u.prompt) + u64::from(completion),
        "prompt_tokens_details": {"cached_tokens": u.cached},
    })
}

fn sse(v: &Value, out: &mut Vec<u8>) {
    out.extend_from_slice(b"data: ");
    // Writing a `Value` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, v);
    out.extend_from_slice(b"\n\n");
}

/// Everything a stream's chunks share.
#[derive(Clone, Debug)]
pub(super) struct StreamHead {
    pub endpoint: Endpoint,
    pub id: String,
    pub model: String,
    pub created: u64,
    /// Choices per event (`n`): each the same text.
    pub n: u32,
    /// The prompt's tokens (Anthropic's `message_start` carries them).
    pub prompt_tokens: u32,
    /// The Responses API's event numbering and response object.
    pub responses: super::dialects::Responses,
    /// Token ids asked for (`return_token_ids`).
    pub token_ids: bool,
}

impl StreamHead {
    pub(super) fn new(endpoint: Endpoint, id: String, g: &Generation) -> Self {
        StreamHead {
            endpoint,
            responses: super::dialects::Responses {
                id: id.clone(),
                model: g.model.clone(),
                max_output_tokens: g.max_output_tokens,
                seq: 0,
            },
            id,
            model: g.model.clone(),
            created: crate::clock::unix_seconds(),
            n: g.n.max(1),
            prompt_tokens: g.prompt_tokens,
            token_ids: g.token_ids,
        }
    }

    fn object(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            _ => "text_completion",
        }
    }

    fn chunk(&self, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// The SSE bytes for token `index` (1-based); the first chat token is
    /// preceded by the `role` chunk, the last carries `finish_reason`.
    /// With `n` > 1, each choice gets its chunk.
    pub(super) fn token_event(&mut self, index: u32, finish: Option<FinishReason>) -> Bytes {
        let mut out = Vec::with_capacity(512);
        let finish = finish.map(FinishReason::as_str);
        for choice in 0..self.n {
            match self.endpoint {
                Endpoint::Chat => {
                    if index == 1 {
                        let role = json!([{"index": choice,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": null, "finish_reason": null}]);
                        let c = self.with_ids(self.chunk(role), None, true);
                        sse(&c, &mut out);
                    }
                    let c = json!([{"index": choice, "delta": {"content": TOKEN_TEXT},
                        "logprobs": null, "finish_reason": finish}]);
                    let c = self.with_ids(self.chunk(c), Some(index), false);
                    sse(&c, &mut out);
                }
                Endpoint::Completions => {
                    let c = json!([{"index": choice, "text": TOKEN_TEXT, "logprobs": null,
                        "finish_reason": finish, "stop_reason": null}]);
                    let c = self.with_ids(self.chunk(c), Some(index), index == 1);
                    sse(&c, &mut out);
                }
                Endpoint::Responses => self.responses.token(index, &mut out),
                Endpoint::Messages => super::dialects::message_token(
                    &self.id,
                    &self.model,
                    self.prompt_tokens,
                    index,
                    &mut out,
                ),
            }
        }
        Bytes::from(out)
    }

    /// `chunk` with vLLM's token ids when asked for: the prompt's
    /// (`prompt`, the first chunk), token `index`'s (its id is its index).
    fn with_ids(&self, mut chunk: Value, index: Option<u32>, prompt: bool) -> Value {
        if !self.token_ids {
            return chunk;
        }
        if prompt {
            // vLLM puts them on a chat chunk, on a completion's choice.
            let ids = json!((0..self.prompt_tokens).collect::<Vec<_>>());
            match self.endpoint {
                Endpoint::Completions => chunk["choices"][0]["prompt_token_ids"] = ids,
                _ => chunk["prompt_token_ids"] = ids,
            }
        }
        if let Some(i) = index {
            chunk["choices"][0]["token_ids"] = json!([i]);
        }
        chunk
    }

    /// The stream's tail. Chat and completions: the usage chunk when
    /// asked for, then `[DONE]`; the Responses API and Messages close
    /// with their own events, usage always in them. `completion` counts
    /// one choice.
    pub(super) fn done_event(
        &mut self,
        u: Usage,
        include_usage: bool,
        finish: FinishReason,
    ) -> Bytes {
        let (prompt, completion) = (u.prompt, u.completion);
        let mut out = Vec::with_capacity(256);
        match self.endpoint {
            Endpoint::Responses => self.responses.done(prompt, completion, finish, &mut out),
            Endpoint::Messages => super::dialects::message_done(completion, finish, &mut out),
            Endpoint::Chat | Endpoint::Completions => {
                if include_usage {
                    let mut c = self.chunk(json!([]));
                    c["usage"] = usage(u, completion.saturating_mul(self.n));
                    sse(&c, &mut out);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
        }
        Bytes::from(out)
    }

    /// The whole non-streaming response body; `completion` counts one
    /// choice.
    pub(super) fn full_response(&self, u: Usage, finish: FinishReason) -> Bytes {
        let (prompt, completion) = (u.prompt, u.completion);
        let text = TOKEN_TEXT.repeat(completion as usize);
        let choice = |i: u32| match self.endpoint {
            Endpoint::Chat => json!({"index": i, "message": {"role": "assistant", "content": text},
                "logprobs": null, "finish_reason": finish.as_str()}),
            _ => json!({"index": i, "text": text, "logprobs": null,
                "finish_reason": finish.as_str(), "stop_reason": null}),
        };
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion",
            Endpoint::Completions => "text_completion",
            Endpoint::Responses => {
                return Bytes::from(
                    self.responses
                        .object(Some((prompt, completion)), finish)
                        .to_string(),
                );
            }
            Endpoint::Messages => {
                let m = super::dialects::message(&self.id, &self.model, prompt, completion, finish);
                return Bytes::from(m.to_string());
            }
        };
        let v = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": (0..self.n).map(choice).collect::<Vec<_>>(),
            "usage": usage(u, completion.saturating_mul(self.n)),
        });
        Bytes::from(v.to_string())
    }
}

/// The `/v1/models` body.
/// `/v1/models`: the base model, then each LoRA adapter with the base as
/// its `parent` (vLLM's shape).
pub(super) fn models_response(
    model: &str,
    adapters: &[String],
    max_model_len: u32,
    created: u64,
) -> Bytes {
    let base = json!({
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": null,
        "max_model_len": max_model_len,
        "permission": [],
    });
    let loras = adapters.iter().map(|a| {
        json!({
            "id": a,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": a,
            "parent": model,
            "max_model_len": max_model_len,
            "permission": [],
        })
    });
    let data: Vec<_> = std::iter::once(base).chain(loras).collect();
    Bytes::from(json!({"object": "list", "data": data}).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_prompt_tokens_count_text_and_template() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"abcd"},
            {"role":"user","content":[{"type":"text","text":"efgh"},{"type":"image_url"}]}]}"#;
        let g = parse_generation(Endpoint::Chat, body).unwrap();
        assert_eq!(g.prompt_tokens, 2 + 2 * TOKENS_PER_MESSAGE);
        assert_eq!(g.max_tokens, 16);
        assert_eq!(g.output_tokens, 16);
        assert!(!g.is_stream);
    }

    #[test]
    fn sim_output_tokens_is_capped_and_gives_stop() {
        let body = br#"{"model":"m","prompt":["ab","cd"],"max_tokens":10,"sim_output_tokens":3,
            "stream":true,"stream_options":{"include_usage":true}}"#;
        let g = parse_generation(Endpoint::Completions, body).unwrap();
        assert_eq!((g.prompt_tokens, g.output_tokens), (1, 3));
        assert_eq!(g.finish_reason(), FinishReason::Stop);
        assert!(g.is_stream && g.include_usage);
        let body =
            br#"{"model":"m","prompt":"x","max_completion_tokens":5,"sim_output_tokens":50}"#;
        let g = parse_generation(Endpoint::Completions, body).unwrap();
        assert_eq!(g.output_tokens, 5);
        assert_eq!(g.finish_reason(), FinishReason::Length);
    }

    #[test]
    fn malformed_bodies_are_bad_requests() {
        for body in [
            &b"{"[..],
            br#"{"model":"m"}"#,
            br#"{"model":"m","prompt":"x","max_tokens":0}"#,
        ] {
            let e = parse_generation(Endpoint::Completions, body).unwrap_err();
            assert_eq!((e.status, e.kind), (400, "BadRequestError"));
        }
    }
}
