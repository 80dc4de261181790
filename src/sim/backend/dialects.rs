//! The simulated backend's Responses API and Anthropic Messages shapes, as
//! vLLM's `/v1/responses` and `/v1/messages` send them: the whole answer,
//! and the typed SSE events of a stream (`event:` and `data:` lines).
//!
//! A stream's events, in order:
//! - Responses: `response.created`, `response.in_progress`,
//!   `response.output_item.added`, `response.content_part.added`, one
//!   `response.output_text.delta` per token, then `response.output_text.done`,
//!   `response.content_part.done`, `response.output_item.done` and
//!   `response.completed` (with `usage`); no `[DONE]`.
//! - Messages: `message_start` (with the input tokens), `content_block_start`,
//!   `ping`, one `content_block_delta` per token, then `content_block_stop`,
//!   `message_delta` (with the output tokens) and `message_stop`.

use serde_json::{Value, json};

use super::TOKEN_TEXT;
use super::metrics::FinishReason;

/// Writes one typed SSE event.
pub(super) fn event(kind: &str, data: &Value, out: &mut Vec<u8>) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    let _ = serde_json::to_writer(&mut *out, data);
    out.extend_from_slice(b"\n\n");
}

/// The output text of `tokens` tokens.
fn text(tokens: u32) -> String {
    TOKEN_TEXT.repeat(tokens as usize)
}

/// A Responses API stream in progress: numbers its events.
#[derive(Clone, Debug)]
pub(super) struct Responses {
    pub id: String,
    pub model: String,
    pub max_output_tokens: Option<u32>,
    pub seq: u64,
}

impl Responses {
    fn item_id(&self) -> String {
        format!("msg_{}", self.id.trim_start_matches("resp_"))
    }

    fn message(&self, completion: Option<u32>) -> Value {
        let (status, content) = match completion {
            None => ("in_progress", json!([])),
            Some(n) => (
                "completed",
                json!([{"type": "output_text", "text": text(n), "annotations": [], "logprobs": []}]),
            ),
        };
        json!({"type": "message", "id": self.item_id(), "status": status,
            "role": "assistant", "content": content})
    }

    /// The response object: in progress (`usage` `None`), or complete.
    pub fn object(&self, usage: Option<(u32, u32)>, finish: FinishReason) -> Value {
        let (status, output, usage, incomplete) = match usage {
            None => ("in_progress", json!([]), Value::Null, Value::Null),
            Some((prompt, completion)) => {
                let cut = finish == FinishReason::Length && self.max_output_tokens.is_some();
                (
                    if cut { "incomplete" } else { "completed" },
                    json!([self.message(Some(completion))]),
                    json!({
                        "input_tokens": prompt,
                        "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens": completion,
                        "output_tokens_details": {"reasoning_tokens": 0},
                        "total_tokens": u64::from(prompt) + u64::from(completion),
                    }),
                    if cut {
                        json!({"reason": "max_output_tokens"})
                    } else {
                        Value::Null
                    },
                )
            }
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": crate::clock::unix_seconds(),
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": null,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "previous_response_id": null,
            "reasoning": null,
            "store": true,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": null,
            "metadata": {},
        })
    }

    fn emit(&mut self, kind: &str, mut data: Value, out: &mut Vec<u8>) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        event(kind, &data, out);
    }

    /// The events of token `index` (1-based): the opening ones first.
    pub fn token(&mut self, index: u32, out: &mut Vec<u8>) {
        if index == 1 {
            let obj = self.object(None, FinishReason::Stop);
            self.emit("response.created", json!({"response": obj}), out);
            self.emit("response.in_progress", json!({"response": obj}), out);
            let item = self.message(None);
            self.emit(
                "response.output_item.added",
                json!({"output_index": 0, "item": item}),
                out,
            );
            let part = json!({"type": "output_text", "text": "", "annotations": []});
            let item_id = self.item_id();
            self.emit(
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
                out,
            );
        }
        let item_id = self.item_id();
        self.emit(
            "response.output_text.delta",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                "delta": TOKEN_TEXT, "logprobs": []}),
            out,
        );
    }

    /// The closing events, `response.completed` last.
    pub fn done(&mut self, prompt: u32, completion: u32, finish: FinishReason, out: &mut Vec<u8>) {
        let item_id = self.item_id();
        let all = text(completion);
        self.emit(
            "response.output_text.done",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                "text": all, "logprobs": []}),
            out,
        );
        let part = json!({"type": "output_text", "text": all, "annotations": []});
        self.emit(
            "response.content_part.done",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
            out,
        );
        let item = self.message(Some(completion));
        self.emit(
            "response.output_item.done",
            json!({"output_index": 0, "item": item}),
            out,
        );
        let obj = self.object(Some((prompt, completion)), finish);
        let kind = if obj["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.emit(kind, json!({"response": obj}), out);
    }
}

/// Anthropic's `stop_reason` for a finish.
fn stop_reason(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Length => "max_tokens",
        FinishReason::Stop | FinishReason::Abort => "end_turn",
    }
}

/// An Anthropic message: the whole answer.
pub(super) fn message(
    id: &str,
    model: &str,
    prompt: u32,
    completion: u32,
    finish: FinishReason,
) -> Value {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text(completion)}],
        "stop_reason": stop_reason(finish),
        "stop_sequence": null,
        "usage": {"input_tokens": prompt, "output_tokens": completion},
    })
}

/// The events of token `index` (1-based) of a Messages stream.
pub(super) fn message_token(id: &str, model: &str, prompt: u32, index: u32, out: &mut Vec<u8>) {
    if index == 1 {
        let start = json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": prompt, "output_tokens": 1},
        }});
        event("message_start", &start, out);
        let block = json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}});
        event("content_block_start", &block, out);
        event("ping", &json!({"type": "ping"}), out);
    }
    let delta = json!({"type": "content_block_delta", "index": 0,
        "delta": {"type": "text_delta", "text": TOKEN_TEXT}});
    event("content_block_delta", &delta, out);
}

/// The closing events of a Messages stream.
pub(super) fn message_done(completion: u32, finish: FinishReason, out: &mut Vec<u8>) {
    event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
        out,
    );
    let delta = json!({"type": "message_delta",
        "delta": {"stop_reason": stop_reason(finish), "stop_sequence": null},
        "usage": {"output_tokens": completion}});
    event("message_delta", &delta, out);
    event("message_stop", &json!({"type": "message_stop"}), out);
}

/// An error in Anthropic's shape.
pub(super) fn anthropic_error(status: u16, message: &str) -> Value {
    let kind = match status {
        404 => "not_found_error",
        429 => "rate_limit_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}
