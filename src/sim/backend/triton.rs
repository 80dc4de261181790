//! Triton Inference Server's HTTP wire format, for the simulated backend's
//! Triton flavours: the KServe v2 health and model routes, the generate
//! extension (`generate`, `generate_stream`), Triton's error body and its
//! metric names (`nv_inference_*`, and `nv_trt_llm_*` for the TensorRT-LLM
//! backend or `vllm:*` with Triton's labels for the vLLM backend).
//!
//! Shapes as Triton's documentation and sources give them: a generate
//! request is `{"text_input": "...", ...}` with the output length as
//! `max_tokens` (TensorRT-LLM ensembles), `parameters.max_tokens` or
//! `sampling_param_max_tokens` (the TensorRT-LLM LLM-API model); a response
//! is `{"model_name", "model_version", "text_output"}`; a stream is one
//! `data: <response>` event per token and then closes, with no `[DONE]`;
//! every error is `{"error": "<message>"}`.

use std::fmt::Write as _;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;

use super::TOKEN_TEXT;
use super::metrics::RequestMetrics;
use crate::prom::{self, Kind};
use crate::protocol::triton::present;
use crate::sim::engine::EngineStats;

/// Output tokens when the request names none (the vLLM backend's default).
const DEFAULT_MAX_TOKENS: u32 = 16;

/// Which Triton backend the simulated model runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Backend {
    /// TensorRT-LLM (the in-flight batcher): `nv_trt_llm_*` metrics.
    TensorRtLlm,
    /// Triton's vLLM backend: `vllm:*` request histograms, no KV gauges.
    Vllm,
    /// A classic (non-decoupled) tensor model served through `/infer`: an
    /// embedding model, a classifier, a reranker.
    Tensor,
}

/// A Triton error: its HTTP status and message.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct TritonError {
    pub status: u16,
    pub message: String,
}

impl TritonError {
    /// INVALID_ARG, which Triton answers with 400.
    pub(super) fn invalid(message: impl Into<String>) -> Self {
        TritonError {
            status: 400,
            message: message.into(),
        }
    }

    /// NOT_FOUND (404), Triton's message for a model it does not serve.
    pub(super) fn unknown_model(model: &str) -> Self {
        TritonError {
            status: 404,
            message: format!("Request for unknown model: '{model}' is not found"),
        }
    }

    /// `{"error": "<message>"}`.
    pub(super) fn body(&self) -> Bytes {
        Bytes::from(json!({ "error": self.message }).to_string())
    }
}

/// What the simulator reads of a generate request.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Generate {
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    /// `"stream": true`: one response per token (a decoupled model's
    /// streaming; on `generate`, Triton's error under a 200).
    pub stream: bool,
    /// Tokens the simulated model will produce (`sim_output_tokens`, a
    /// simulator extension, else `max_tokens`).
    pub output_tokens: u32,
}

#[derive(Deserialize)]
struct RawGenerate {
    text_input: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "present")]
    max_tokens: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "present")]
    sampling_param_max_tokens: Option<serde_json::Value>,
    #[serde(default)]
    parameters: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    stream: Option<serde_json::Value>,
    sim_output_tokens: Option<u32>,
}

/// A count as Triton's JSON-to-tensor conversion takes it into an `INT32`
/// input: an integer, or a one-element array of one. As the real server
/// answers: other JSON is a 500 ("Unable to parse 'data'"), an array of
/// another length a 400; a count below 1 is the model's to refuse (400).
fn count(v: &serde_json::Value) -> Result<u32, TritonError> {
    match v {
        serde_json::Value::Array(a) if a.len() == 1 => count(&a[0]),
        serde_json::Value::Array(_) => Err(TritonError::invalid(
            "The schema can not convert input 'max_tokens' to tensor with proper shape",
        )),
        v => match v.as_i64() {
            None => Err(TritonError {
                status: 500,
                message: "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer".to_owned(),
            }),
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| TritonError::invalid("max_tokens must be a positive integer")),
        },
    }
}

/// Parses a generate request's body.
pub(super) fn parse_generate(body: &[u8]) -> Result<Generate, TritonError> {
    let raw: RawGenerate = serde_json::from_slice(body).map_err(|e| {
        TritonError::invalid(format!("failed to parse the request JSON buffer: {e}"))
    })?;
    let text = match raw.text_input {
        Some(serde_json::Value::String(s)) => s,
        Some(serde_json::Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            a[0].as_str().unwrap_or_default().to_owned()
        }
        Some(_) => {
            return Err(TritonError::invalid(
                "unable to parse 'text_input': expected a string",
            ));
        }
        None => {
            return Err(TritonError::invalid("expected 'text_input' in the request"));
        }
    };
    let named = raw
        .max_tokens
        .as_ref()
        .or(raw.sampling_param_max_tokens.as_ref())
        .or_else(|| raw.parameters.as_ref().and_then(|p| p.get("max_tokens")));
    let max_tokens = match named {
        None => DEFAULT_MAX_TOKENS,
        Some(v) => count(v)?,
    };
    let stream = match &raw.stream {
        None => false,
        Some(serde_json::Value::Array(a)) if a.len() == 1 => a[0].as_bool().unwrap_or(false),
        Some(v) => v.as_bool().unwrap_or(false),
    };
    Ok(Generate {
        prompt_tokens: crate::tokens::estimate(&text).max(1),
        max_tokens,
        stream,
        output_tokens: raw
            .sim_output_tokens
            .map_or(max_tokens, |n| n.clamp(1, max_tokens)),
    })
}

/// What the simulator reads of an infer request: its size, as the tokens
/// of work it stands for (four bytes a token, at least one).
pub(super) fn parse_infer(body: &[u8], header_len: Option<usize>) -> Result<u32, TritonError> {
    let json = match header_len {
        Some(n) if n <= body.len() => &body[..n],
        Some(n) => {
            return Err(TritonError::invalid(format!(
                "Inference-Header-Content-Length {n} is past the end of the body ({} bytes)",
                body.len()
            )));
        }
        None => body,
    };
    let v: serde_json::Value = serde_json::from_slice(json).map_err(|e| {
        TritonError::invalid(format!("failed to parse the request JSON buffer: {e}"))
    })?;
    if !v.get("inputs").is_some_and(serde_json::Value::is_array) {
        return Err(TritonError::invalid("expected 'inputs' in the request"));
    }
    Ok(u32::try_from(body.len().div_ceil(4))
        .unwrap_or(u32::MAX)
        .max(1))
}

/// An infer response: one FP32 output tensor.
pub(super) fn infer_response(model: &str, id: Option<&str>) -> Bytes {
    let mut v = json!({
        "model_name": model,
        "model_version": "1",
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4], "data": [0.5, 0.25, 0.125, 0.0625]}],
    });
    if let Some(id) = id {
        v["id"] = json!(id);
    }
    Bytes::from(v.to_string())
}

/// Whether a generate body is the LLM-API model's stop request,
/// `{"stop": true, ...}`.
pub(super) fn is_stop(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("stop").and_then(serde_json::Value::as_bool))
        .unwrap_or(false)
}

/// A generate response (and, in a stream, one event's JSON).
pub(super) fn response(model: &str, text: &str) -> Bytes {
    Bytes::from(
        json!({ "model_name": model, "model_version": "1", "text_output": text }).to_string(),
    )
}

/// One `generate_stream` event: a token's text.
pub(super) fn stream_event(model: &str) -> Bytes {
    let mut out = b"data: ".to_vec();
    out.extend_from_slice(&response(model, TOKEN_TEXT));
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The whole text of a non-streaming response of `tokens` tokens.
pub(super) fn text(tokens: u32) -> String {
    TOKEN_TEXT.repeat(tokens as usize)
}

/// `GET /v2/models/{model}`: the model's metadata.
pub(super) fn model_metadata(model: &str, backend: Backend) -> Bytes {
    let platform = match backend {
        Backend::TensorRtLlm => "tensorrt_llm",
        Backend::Vllm => "vllm",
        Backend::Tensor => "onnxruntime_onnx",
    };
    Bytes::from(
        json!({
            "name": model,
            "versions": ["1"],
            "platform": platform,
            "inputs": [
                {"name": "text_input", "datatype": "BYTES", "shape": [-1]},
                {"name": "max_tokens", "datatype": "INT32", "shape": [-1]},
                {"name": "stream", "datatype": "BOOL", "shape": [-1]},
            ],
            "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}],
        })
        .to_string(),
    )
}

/// `GET /v2/models/{model}/config`: the parts of the model's
/// configuration a client reads: its backend, and the transaction policy
/// (decoupled for the LLM backends, absent for a classic model, as Triton
/// leaves it out).
pub(super) fn model_config(model: &str, backend: Backend) -> Bytes {
    let (name, decoupled) = match backend {
        Backend::TensorRtLlm => ("tensorrtllm", true),
        Backend::Vllm => ("vllm", true),
        Backend::Tensor => ("onnxruntime", false),
    };
    let mut v = json!({
        "name": model,
        "platform": "",
        "backend": name,
        "max_batch_size": 0,
        "input": [
            {"name": "text_input", "data_type": "TYPE_STRING", "dims": [-1]},
            {"name": "max_tokens", "data_type": "TYPE_INT32", "dims": [-1], "optional": true},
            {"name": "stream", "data_type": "TYPE_BOOL", "dims": [-1], "optional": true},
        ],
        "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]}],
    });
    if decoupled {
        v["model_transaction_policy"] = json!({ "decoupled": true });
    }
    Bytes::from(v.to_string())
}

/// What Triton answers, under a 200, to `generate` on a decoupled model
/// that sends more than one response.
pub(super) fn several_responses() -> TritonError {
    TritonError {
        status: 200,
        message: "generate expects model to produce exactly 1 response, use generate stream for model that generates various number of responses".to_owned(),
    }
}

/// `GET /v2`: the server's metadata.
pub(super) fn server_metadata() -> Bytes {
    Bytes::from(
        json!({
            "name": "triton",
            "version": "2.59.0",
            "extensions": ["classification", "sequence", "model_repository", "schedule_policy",
                "model_configuration", "system_shared_memory", "cuda_shared_memory",
                "binary_tensor_data", "parameters", "statistics", "trace", "logging"],
        })
        .to_string(),
    )
}

/// The `/metrics` text of a Triton server running the simulated model:
/// `nv_inference_*` for every model, then the backend's own families.
/// The pending count is 0: a decoupled model's `execute()` returns at once,
/// so Triton never sees its requests wait (the engine's queue is in the
/// backend's families, or nowhere).
pub(super) fn render_metrics(
    model: &str,
    backend: Backend,
    stats: &EngineStats,
    req: &RequestMetrics,
) -> String {
    let labels = format!("model=\"{}\",version=\"1\"", prom::escape(model));
    let mut s = String::with_capacity(4 * 1024);
    let (ok, cancelled) = req.outcomes();
    prom::family(
        &mut s,
        "nv_inference_request_success",
        Kind::Counter,
        "Number of successful inference requests, all batch sizes",
    );
    let _ = writeln!(s, "nv_inference_request_success{{{labels}}} {ok}");
    prom::family(
        &mut s,
        "nv_inference_request_failure",
        Kind::Counter,
        "Number of failed inference requests, all batch sizes",
    );
    for (reason, n) in [
        ("REJECTED", 0),
        ("CANCELED", cancelled),
        ("BACKEND", 0),
        ("OTHER", 0),
    ] {
        let _ = writeln!(
            s,
            "nv_inference_request_failure{{{labels},reason=\"{reason}\"}} {n}"
        );
    }
    prom::family(
        &mut s,
        "nv_inference_count",
        Kind::Counter,
        "Number of inferences performed (does not include cached requests)",
    );
    let _ = writeln!(s, "nv_inference_count{{{labels}}} {ok}");
    prom::family(
        &mut s,
        "nv_inference_exec_count",
        Kind::Counter,
        "Number of model executions performed (does not include cached requests)",
    );
    let _ = writeln!(s, "nv_inference_exec_count{{{labels}}} {}", ok + cancelled);
    prom::family(
        &mut s,
        "nv_inference_pending_request_count",
        Kind::Gauge,
        "Instantaneous number of pending requests awaiting execution per-model.",
    );
    // Decoupled models leave execute() at once: nothing pends. A classic
    // model's requests wait in Triton's scheduler.
    let pending = if backend == Backend::Tensor {
        stats.waiting
    } else {
        0
    };
    let _ = writeln!(
        s,
        "nv_inference_pending_request_count{{{labels}}} {pending}"
    );
    match backend {
        Backend::TensorRtLlm => {
            prom::family(
                &mut s,
                "nv_trt_llm_request_metrics",
                Kind::Gauge,
                "TRT LLM request metrics",
            );
            let active = stats.running + stats.waiting;
            for (ty, v) in [
                ("waiting", stats.waiting),
                ("context", 0),
                ("scheduled", stats.running),
                ("max", 0),
                ("active", active),
            ] {
                let _ = writeln!(
                    s,
                    "nv_trt_llm_request_metrics{{{labels},request_type=\"{ty}\"}} {v}"
                );
            }
            prom::family(
                &mut s,
                "nv_trt_llm_kv_cache_block_metrics",
                Kind::Gauge,
                "TRT LLM KV cache block metrics",
            );
            let total = stats.kv_blocks_total;
            let used = stats.kv_blocks_used.min(total);
            let fraction = if total > 0 {
                used as f64 / total as f64
            } else {
                0.0
            };
            for (ty, v) in [
                ("max", total.to_string()),
                ("free", (total - used).to_string()),
                ("used", used.to_string()),
                ("tokens_per", stats.block_size.to_string()),
                ("fraction", fraction.to_string()),
            ] {
                let _ = writeln!(
                    s,
                    "nv_trt_llm_kv_cache_block_metrics{{{labels},kv_cache_block_type=\"{ty}\"}} {v}"
                );
            }
        }
        Backend::Vllm => req.render_vllm_histograms(&mut s, &labels),
        Backend::Tensor => {}
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generate_reads_every_shape_of_max_tokens() {
        let g = |body: &str| parse_generate(body.as_bytes());
        assert_eq!(
            g(r#"{"text_input":"hello world","max_tokens":20}"#)
                .unwrap()
                .max_tokens,
            20
        );
        assert_eq!(
            g(r#"{"text_input":"hi","parameters":{"max_tokens":7,"temperature":0.1}}"#)
                .unwrap()
                .max_tokens,
            7
        );
        assert_eq!(
            g(r#"{"text_input":"hi","sampling_param_max_tokens":9}"#)
                .unwrap()
                .max_tokens,
            9
        );
        assert_eq!(
            g(r#"{"text_input":["hi"],"max_tokens":[5]}"#)
                .unwrap()
                .max_tokens,
            5
        );
        assert_eq!(
            g(r#"{"text_input":"hi"}"#).unwrap().max_tokens,
            DEFAULT_MAX_TOKENS
        );
        assert_eq!(
            g(r#"{"text_input":"hi","max_tokens":8,"sim_output_tokens":3}"#)
                .unwrap()
                .output_tokens,
            3
        );
        let e = g(r#"{"max_tokens":8}"#).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(
            g(r#"{"text_input":"hi","max_tokens":0}"#)
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(g("not json").unwrap_err().status, 400);
        // As the real server answers a malformed INT32 input.
        for bad in [r#""8""#, "1.5", "null", "true"] {
            let body = format!(r#"{{"text_input":"hi","max_tokens":{bad}}}"#);
            assert_eq!(g(&body).unwrap_err().status, 500, "{bad}");
        }
        assert_eq!(
            g(r#"{"text_input":"hi","max_tokens":[1,2]}"#)
                .unwrap_err()
                .status,
            400
        );
        assert!(g(r#"{"text_input":"hi","stream":true}"#).unwrap().stream);
        // Triton's error shape: a plain string under "error".
        let body: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert!(body["error"].is_string(), "{body}");
    }

    #[test]
    fn stream_events_are_sse_data_lines_of_responses() {
        let ev = stream_event("m");
        let text = std::str::from_utf8(&ev).unwrap();
        assert!(
            text.starts_with("data: {") && text.ends_with("}\n\n"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&text[6..text.len() - 2]).unwrap();
        assert_eq!(json["model_name"], "m");
        assert_eq!(json["text_output"], TOKEN_TEXT);
    }
}
