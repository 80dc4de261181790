//! Just enough of Triton's HTTP API (KServe v2 and its generate
//! extension): which model and action a `/v2` path names, what Fairway
//! reads of a generate body (the prompt's size and the output length, in
//! every shape Triton models take it) and of an infer body (its size), and
//! the path to send upstream. Bodies go to the backend untouched.

use bytes::Bytes;
use http::Response;
use serde::Deserialize;

use crate::core::ids::Usage;
use crate::net::body::{self, BoxBody};
use crate::protocol::error::ApiError;
use crate::protocol::openai::RequestInfo;
use crate::protocol::sse::data_lines;

/// `/v2/models/{model}[/versions/{version}][/{action}]`, split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelPath<'a> {
    pub model: &'a str,
    pub version: Option<&'a str>,
    /// `generate`, `generate_stream`, `infer`, `ready`, …; empty for the
    /// model's metadata.
    pub action: &'a str,
}

/// Splits a `/v2/models/...` path; `None` for any other path.
pub fn model_path(path: &str) -> Option<ModelPath<'_>> {
    let rest = path.strip_prefix("/v2/models/")?;
    let (model, rest) = rest.split_once('/').unwrap_or((rest, ""));
    let (version, action) = match rest.strip_prefix("versions/") {
        Some(v) => {
            let (v, action) = v.split_once('/').unwrap_or((v, ""));
            (Some(v), action)
        }
        None => (None, rest),
    };
    let valid = |s: &str| !s.is_empty() && !s.contains('/');
    (valid(model) && version.is_none_or(valid)).then_some(ModelPath {
        model,
        version,
        action,
    })
}

impl ModelPath<'_> {
    /// The same call on a backend that knows the model as `served`.
    pub fn upstream(&self, served: &str) -> String {
        match self.version {
            Some(v) => format!("/v2/models/{served}/versions/{v}/{}", self.action),
            None => format!("/v2/models/{served}/{}", self.action),
        }
    }
}

#[derive(Deserialize)]
struct Generate {
    text_input: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "present")]
    max_tokens: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "present")]
    sampling_param_max_tokens: Option<serde_json::Value>,
    parameters: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A field that is present, `null` included (serde's `Option` would take
/// `null` for absent).
pub fn present<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

/// A count as Triton's JSON-to-tensor mapping takes it into an `INT32`
/// tensor: an integer, or a one-element array of one. Triton refuses any
/// other JSON there with a 500 ("Unable to parse 'data'"), and wraps an
/// integer past `INT32` silently; a negative count is the model's to
/// refuse or clamp.
fn count(v: &serde_json::Value) -> Option<u32> {
    match v {
        serde_json::Value::Array(a) if a.len() == 1 => count(&a[0]),
        v => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| i32::try_from(n).is_ok()),
    }
}

/// What Fairway reads of a generate request to `model`: the prompt's
/// estimated tokens (`text_input`, a string or a one-element array of
/// one) and the output length (`max_tokens`, `parameters.max_tokens` or
/// the LLM-API model's `sampling_param_max_tokens`). Other fields are the
/// model's business. Malformed JSON is a 400, and so is an output length
/// that is not a count from 0 to `INT32`'s largest: Triton would answer
/// most of them with a 500, which is neither the client's answer nor the
/// backend's fault.
pub fn parse_generate(body: &[u8], model: &str, stream: bool) -> Result<RequestInfo, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::InvalidRequest(format!("Request body is not valid UTF-8: {e}")))?;
    if !text.trim_start().starts_with('{') {
        return Err(ApiError::InvalidRequest(
            "Request body must be a JSON object.".into(),
        ));
    }
    let g: Generate = serde_json::from_str(text)
        .map_err(|e| ApiError::InvalidRequest(format!("Request body is not valid JSON: {e}")))?;
    let prompt = match &g.text_input {
        Some(serde_json::Value::String(s)) => crate::tokens::estimate(s),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(serde_json::Value::as_str)
            .map(crate::tokens::estimate)
            .fold(0u32, u32::saturating_add),
        _ => 0,
    };
    let named = [
        ("max_tokens", g.max_tokens.as_ref()),
        (
            "sampling_param_max_tokens",
            g.sampling_param_max_tokens.as_ref(),
        ),
        (
            "parameters.max_tokens",
            g.parameters.as_ref().and_then(|p| p.get("max_tokens")),
        ),
    ];
    let mut max_tokens = None;
    for (name, v) in named {
        let Some(v) = v else { continue };
        let n = count(v).ok_or_else(|| {
            let was = match v {
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::String(_) => "a string".into(),
                serde_json::Value::Array(a) => format!("an array of {}", a.len()),
                serde_json::Value::Object(_) => "an object".into(),
                v => v.to_string(),
            };
            ApiError::InvalidRequest(format!(
                "`{name}` must be an integer from 0 to {} (or a one-element array of one), not {was}.",
                i32::MAX
            ))
        })?;
        max_tokens = max_tokens.or(Some(n));
    }
    Ok(RequestInfo {
        model: model.to_owned(),
        stream,
        // Nothing to splice: Triton's responses carry no usage object.
        include_usage: true,
        max_tokens,
        choices: 1,
        prompt_tokens: prompt,
        cache_salt: None,
    })
}

/// What Fairway reads of an infer request to `model` (a classic tensor
/// model: embeddings, a classifier, a reranker): that it is a JSON object
/// with `inputs` (the JSON header of a binary-tensor request, the first
/// `header_len` bytes, when `Inference-Header-Content-Length` says so), and
/// its size, as its cost: four bytes a token, like text. The tensors are
/// not read; the body goes upstream untouched.
pub fn parse_infer(
    body: &[u8],
    header_len: Option<&http::HeaderValue>,
    model: &str,
) -> Result<RequestInfo, ApiError> {
    let json = match header_len {
        None => body,
        Some(v) => {
            let n = v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or_else(|| {
                    ApiError::InvalidRequest("Invalid Inference-Header-Content-Length.".into())
                })?;
            body.get(..n).ok_or_else(|| {
                ApiError::InvalidRequest(format!(
                    "Inference-Header-Content-Length {n} is past the end of the body ({} bytes).",
                    body.len()
                ))
            })?
        }
    };
    let v: serde_json::Value = serde_json::from_slice(json)
        .map_err(|e| ApiError::InvalidRequest(format!("Request header is not valid JSON: {e}")))?;
    if !v.get("inputs").is_some_and(serde_json::Value::is_array) {
        return Err(ApiError::InvalidRequest(
            "Request must be a JSON object with an `inputs` array.".into(),
        ));
    }
    Ok(RequestInfo {
        model: model.to_owned(),
        stream: false,
        include_usage: true,
        // One pass over the input, no generated output.
        max_tokens: Some(0),
        choices: 1,
        prompt_tokens: u32::try_from(body.len().div_ceil(4))
            .unwrap_or(u32::MAX)
            .max(1),
        cache_salt: None,
    })
}

#[derive(Deserialize)]
struct TritonLite {
    #[serde(default)]
    text_output: Option<serde_json::Value>,
    #[serde(default)]
    num_output_tokens: Option<serde_json::Value>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// What one Triton response (or stream event) says.
#[derive(Debug, PartialEq)]
pub enum Answer {
    /// A response, of this many output tokens: its `num_output_tokens`
    /// where the model returns it, else the estimate of its `text_output`
    /// (a string or a one-element array of one), at least one.
    Tokens(u32),
    /// Triton's error shape, `{"error": "<message>"}`. Triton sends it
    /// under a 200 where the headers have gone: in a stream, and for a
    /// `generate` call whose decoupled model sent more than one response
    /// (a model asked to stream, or one that failed after its response:
    /// Triton's message is the same).
    Error(String),
    /// Neither.
    Other,
}

/// Reads one Triton response or stream event.
pub fn answer(json: &[u8]) -> Answer {
    let Ok(r) = serde_json::from_slice::<TritonLite>(json) else {
        return Answer::Other;
    };
    let first = |v: &serde_json::Value| match v {
        serde_json::Value::Array(a) if a.len() == 1 => a[0].clone(),
        v => v.clone(),
    };
    if let Some(n) = r
        .num_output_tokens
        .as_ref()
        .map(first)
        .and_then(|v| v.as_u64())
    {
        return Answer::Tokens(u32::try_from(n).unwrap_or(u32::MAX));
    }
    match (r.text_output.as_ref().map(first), r.error) {
        (Some(serde_json::Value::String(t)), _) => {
            Answer::Tokens(crate::tokens::estimate(&t).max(1))
        }
        (None, Some(serde_json::Value::String(e))) => Answer::Error(e),
        (None, Some(e)) => Answer::Error(e.to_string()),
        _ => Answer::Other,
    }
}

/// Adds one stream event's output tokens to `usage`, and keeps the first
/// error event's message in `error`.
pub fn add_triton_event(event: &[u8], usage: &mut Option<Usage>, error: &mut Option<String>) {
    for data in data_lines(event) {
        match answer(data) {
            Answer::Tokens(n) => {
                let u = usage.get_or_insert(Usage::default());
                u.completion_tokens = u.completion_tokens.saturating_add(n);
            }
            Answer::Error(e) => {
                error.get_or_insert(e);
            }
            Answer::Other => {}
        }
    }
}

/// Whether a model is decoupled, from its configuration (Triton's
/// `GET /v2/models/{model}/config`): `model_transaction_policy.decoupled`,
/// absent for a classic model. `None`: not a model configuration.
pub fn decoupled(config: &[u8]) -> Option<bool> {
    #[derive(Deserialize)]
    struct Config {
        /// Every configuration has one (a check that this is one).
        #[serde(rename = "name")]
        _name: String,
        #[serde(default)]
        model_transaction_policy: Option<Policy>,
    }
    #[derive(Deserialize)]
    struct Policy {
        #[serde(default)]
        decoupled: bool,
    }
    let c: Config = serde_json::from_slice(config).ok()?;
    Some(c.model_transaction_policy.is_some_and(|p| p.decoupled))
}

/// The event that ends a Triton stream the backend cut: Triton's own
/// in-stream error shape, `data: {"error": "..."}`.
pub fn triton_error_event(cause: &str) -> Bytes {
    let body = serde_json::json!({
        "error": format!("The backend's stream broke: {cause}")
    });
    Bytes::from(format!("data: {body}\n\n"))
}

impl ApiError {
    /// The same response in the shape of Triton's errors on `/v2` routes:
    /// `{"error": "<message>"}`, with the same status and headers.
    pub fn into_triton_response(self) -> Response<BoxBody> {
        let message = self.to_string();
        let mut resp = self.into_response();
        *resp.body_mut() = body::full(Bytes::from(
            serde_json::json!({ "error": message }).to_string(),
        ));
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_paths() {
        let p = model_path("/v2/models/ensemble/generate_stream").unwrap();
        assert_eq!(
            (p.model, p.version, p.action),
            ("ensemble", None, "generate_stream")
        );
        assert_eq!(
            p.upstream("tensorrt_llm_bls"),
            "/v2/models/tensorrt_llm_bls/generate_stream"
        );
        let p = model_path("/v2/models/m/versions/2/generate").unwrap();
        assert_eq!((p.model, p.version, p.action), ("m", Some("2"), "generate"));
        assert_eq!(p.upstream("x"), "/v2/models/x/versions/2/generate");
        let p = model_path("/v2/models/m").unwrap();
        assert_eq!(p.action, "");
        assert_eq!(model_path("/v2/models/m/ready").unwrap().action, "ready");
        assert!(model_path("/v2/models/").is_none());
        assert!(model_path("/v2/models//generate").is_none());
        assert!(model_path("/v1/models/m").is_none());
    }

    #[test]
    fn generate_bodies_in_every_shape() {
        let p = |b: &str| parse_generate(b.as_bytes(), "m", false);
        assert_eq!(
            p(r#"{"text_input":"hello there","max_tokens":20}"#)
                .unwrap()
                .max_tokens,
            Some(20)
        );
        assert_eq!(
            p(r#"{"text_input":"hi","parameters":{"max_tokens":7}}"#)
                .unwrap()
                .max_tokens,
            Some(7)
        );
        assert_eq!(
            p(r#"{"text_input":"hi","sampling_param_max_tokens":9}"#)
                .unwrap()
                .max_tokens,
            Some(9)
        );
        assert_eq!(
            p(r#"{"text_input":["hi"],"max_tokens":[5]}"#)
                .unwrap()
                .max_tokens,
            Some(5)
        );
        let info = p(r#"{"text_input":"a fairly long prompt of several words"}"#).unwrap();
        assert_eq!(info.max_tokens, None);
        assert!(info.prompt_tokens > 3);
        assert_eq!(info.model, "m");
        assert!(p("[1]").is_err());
        assert!(p("{").is_err());
        // An output length Triton could not put in an INT32 tensor: 400
        // here (Triton answers 500 to most, and wraps the too-large).
        for bad in [
            r#""8""#,
            "1.5",
            "null",
            "true",
            "-1",
            "[1,2]",
            "[]",
            "4294967296",
            "2147483648",
        ] {
            let e = p(&format!(r#"{{"text_input":"hi","max_tokens":{bad}}}"#)).unwrap_err();
            assert!(e.to_string().contains("max_tokens"), "{bad}: {e}");
            assert!(
                p(&format!(
                    r#"{{"text_input":"hi","parameters":{{"max_tokens":{bad}}}}}"#
                ))
                .is_err()
            );
        }
        assert_eq!(
            p(r#"{"text_input":"hi","max_tokens":2147483647}"#)
                .unwrap()
                .max_tokens,
            Some(i32::MAX as u32)
        );
        assert_eq!(
            p(r#"{"text_input":"hi","max_tokens":0}"#)
                .unwrap()
                .max_tokens,
            Some(0)
        );
        assert!(parse_generate(&[0xff, 0xfe], "m", false).is_err());
    }

    #[test]
    fn decoupled_models_are_told_by_their_configuration() {
        let stream = br#"{"name":"toy_stream","backend":"python","max_batch_size":0,"model_transaction_policy":{"decoupled":true}}"#;
        assert_eq!(decoupled(stream), Some(true));
        assert_eq!(
            decoupled(br#"{"name":"toy","backend":"python"}"#),
            Some(false)
        );
        assert_eq!(
            decoupled(br#"{"name":"x","model_transaction_policy":{"decoupled":false}}"#),
            Some(false)
        );
        assert_eq!(decoupled(br#"{"error":"Request for unknown model"}"#), None);
    }

    #[test]
    fn infer_bodies_json_and_binary() {
        let json =
            br#"{"inputs":[{"name":"INPUT0","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]}"#;
        let info = parse_infer(json, None, "m").unwrap();
        assert_eq!(info.max_tokens, Some(0));
        assert_eq!(info.prompt_tokens as usize, json.len().div_ceil(4));
        // Binary tensors: a JSON header, then raw bytes.
        let header = br#"{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}]}"#;
        let mut body = header.to_vec();
        body.extend_from_slice(&[0u8; 16]);
        let len = http::HeaderValue::from(header.len());
        assert!(parse_infer(&body, Some(&len), "m").is_ok());
        let past = http::HeaderValue::from(body.len() + 1);
        assert!(parse_infer(&body, Some(&past), "m").is_err());
        assert!(
            parse_infer(&body, None, "m").is_err(),
            "binary bytes are not JSON"
        );
        assert!(parse_infer(br#"{"outputs":[]}"#, None, "m").is_err());
    }
}
