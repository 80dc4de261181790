//! The OpenAI Files and Batch APIs' wire format: the file and batch
//! objects, an input file's lines checked all at once (every problem with
//! its line number), and the output and error files' lines.
//!
//! An input line is `{"custom_id", "method": "POST", "url", "body"}`; every
//! `url` must be the batch's endpoint, every `custom_id` unique, every
//! `body` a request the endpoint takes, for a model the policy serves, not
//! streamed. An output line is `{"id", "custom_id", "response":
//! {"status_code", "request_id", "body"}, "error": null}`; a line that got
//! no response (cancelled, expired, failed without an answer) is
//! `{"id", "custom_id", "response": null, "error": {"code", "message"}}`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The endpoints a batch may name.
pub const ENDPOINTS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
];

/// The completion windows a batch may ask for (OpenAI's only one).
pub const WINDOWS: &[&str] = &["24h"];

/// Seconds of the one completion window.
pub const WINDOW_SECONDS: u64 = 24 * 3600;

/// A file, as `/v1/files` answers it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileObject {
    pub id: String,
    pub object: String,
    pub bytes: u64,
    pub created_at: u64,
    pub filename: String,
    /// `batch` for an upload; `batch_output` for a batch's output and
    /// error files.
    pub purpose: String,
    /// Always `processed`: a file is stored whole or not at all.
    pub status: String,
    pub expires_at: Option<u64>,
    pub status_details: Option<String>,
}

impl FileObject {
    pub fn new(id: String, bytes: u64, created_at: u64, filename: String, purpose: &str) -> Self {
        FileObject {
            id,
            object: "file".into(),
            bytes,
            created_at,
            filename,
            purpose: purpose.into(),
            status: "processed".into(),
            expires_at: None,
            status_details: None,
        }
    }
}

/// A batch's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Validating,
    Failed,
    InProgress,
    Finalizing,
    Completed,
    Expired,
    Cancelling,
    Cancelled,
}

impl Status {
    /// Whether the batch has ended (nothing more will run or change).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Status::Failed | Status::Completed | Status::Expired | Status::Cancelled
        )
    }
}

/// One problem of an input file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LineError {
    pub code: String,
    pub message: String,
    /// 1-based; `None` for a problem of the whole file.
    pub line: Option<u32>,
    pub param: Option<String>,
}

/// `errors` of a batch that could not start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Errors {
    pub object: String,
    pub data: Vec<LineError>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestCounts {
    pub total: u32,
    pub completed: u32,
    pub failed: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CachedTokens {
    pub cached_tokens: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReasoningTokens {
    pub reasoning_tokens: u64,
}

/// Tokens over the batch's served items.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchUsage {
    pub input_tokens: u64,
    pub input_tokens_details: CachedTokens,
    pub output_tokens: u64,
    pub output_tokens_details: ReasoningTokens,
    pub total_tokens: u64,
}

/// A batch, as `/v1/batches` answers it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    pub id: String,
    pub object: String,
    pub endpoint: String,
    pub model: Option<String>,
    pub input_file_id: String,
    pub completion_window: String,
    pub status: Status,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub errors: Option<Errors>,
    pub created_at: u64,
    pub in_progress_at: Option<u64>,
    pub expires_at: Option<u64>,
    pub finalizing_at: Option<u64>,
    pub completed_at: Option<u64>,
    pub failed_at: Option<u64>,
    pub expired_at: Option<u64>,
    pub cancelling_at: Option<u64>,
    pub cancelled_at: Option<u64>,
    pub request_counts: RequestCounts,
    pub metadata: Option<serde_json::Map<String, Value>>,
    pub usage: BatchUsage,
    /// Fairway's own, while the batch runs (never stored): when its last
    /// item is projected to have a result at the rate its items have had
    /// one, and whether that is past `expires_at` (its items are then
    /// promoted to their owner's live lane).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projected_completion_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at_risk: Option<bool>,
}

impl Batch {
    /// When it ended (completed, failed, expired or cancelled); `None`
    /// while it runs.
    pub fn ended_at(&self) -> Option<u64> {
        if !self.status.is_final() {
            return None;
        }
        self.completed_at
            .or(self.failed_at)
            .or(self.expired_at)
            .or(self.cancelled_at)
    }

    /// A batch just created: `validating`, due `window` seconds after
    /// `created_at` (the policy's window, `WINDOW_SECONDS` by default).
    pub fn new(id: String, c: CreateBatch, created_at: u64, window: u64) -> Batch {
        Batch {
            id,
            object: "batch".into(),
            endpoint: c.endpoint,
            model: None,
            input_file_id: c.input_file_id,
            completion_window: c.completion_window,
            status: Status::Validating,
            output_file_id: None,
            error_file_id: None,
            errors: None,
            created_at,
            in_progress_at: None,
            expires_at: Some(created_at + window),
            finalizing_at: None,
            completed_at: None,
            failed_at: None,
            expired_at: None,
            cancelling_at: None,
            cancelled_at: None,
            request_counts: RequestCounts::default(),
            metadata: c.metadata,
            usage: BatchUsage::default(),
            projected_completion_at: None,
            deadline_at_risk: None,
        }
    }
}

/// `POST /v1/batches`'s body.
#[derive(Clone, Debug, Deserialize)]
pub struct CreateBatch {
    pub input_file_id: String,
    pub endpoint: String,
    pub completion_window: String,
    #[serde(default)]
    pub metadata: Option<serde_json::Map<String, Value>>,
}

/// Why a create body was refused: the client's fault, and the same body
/// fails again. Its message is the one the client reads.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// Not JSON of a create's shape.
    #[error(transparent)]
    Json(serde_json::Error),
    #[error("endpoint must be one of {}, not \"{endpoint}\"", ENDPOINTS.join(", "))]
    Endpoint { endpoint: String },
    #[error("completion_window must be \"24h\", not \"{0}\"")]
    Window(String),
    #[error("metadata holds at most 16 pairs")]
    MetadataPairs,
    /// A metadata key or value over its length, or a value not a string.
    #[error("metadata \"{0}\": keys up to 64 characters, string values up to 512")]
    MetadataPair(String),
}

impl CreateBatch {
    /// The body, checked as OpenAI checks it: a known endpoint and
    /// window, at most 16 metadata pairs of keys up to 64 and string
    /// values up to 512 characters.
    pub fn parse(body: &[u8]) -> Result<CreateBatch, CreateError> {
        let c: CreateBatch = serde_json::from_slice(body).map_err(CreateError::Json)?;
        if !ENDPOINTS.contains(&c.endpoint.as_str()) {
            return Err(CreateError::Endpoint {
                endpoint: c.endpoint,
            });
        }
        if !WINDOWS.contains(&c.completion_window.as_str()) {
            return Err(CreateError::Window(c.completion_window));
        }
        if let Some(m) = &c.metadata {
            if m.len() > 16 {
                return Err(CreateError::MetadataPairs);
            }
            for (k, v) in m {
                let ok =
                    k.chars().count() <= 64 && v.as_str().is_some_and(|s| s.chars().count() <= 512);
                if !ok {
                    return Err(CreateError::MetadataPair(k.clone()));
                }
            }
        }
        Ok(c)
    }
}

/// One line of an input file, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// 1-based.
    pub line: u32,
    pub custom_id: String,
    pub model: String,
    /// The request body, as the line gave it (shared: each try of the
    /// item sends it again).
    pub body: bytes::Bytes,
}

#[derive(Deserialize)]
struct InputLine {
    custom_id: Option<Value>,
    method: Option<Value>,
    url: Option<Value>,
    body: Option<Value>,
}

/// What an input file is checked against.
pub struct Limits<'a> {
    pub endpoint: &'a str,
    pub max_lines: usize,
    /// The largest request body a line may carry.
    pub max_body_bytes: usize,
    /// Whether the policy serves a model of this name.
    pub known_model: &'a dyn Fn(&str) -> bool,
}

/// Reads every line of an input file; every problem, with its line, or
/// the items in order. Empty lines are skipped (their numbers still
/// count).
pub fn read_input(text: &[u8], limits: &Limits<'_>) -> Result<Vec<Item>, Vec<LineError>> {
    const MAX_ERRORS: usize = 100;
    let mut items = Vec::new();
    let mut errors = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let err = |line: u32, code: &str, message: String, param: Option<&str>| LineError {
        code: code.into(),
        message,
        line: Some(line),
        param: param.map(str::to_owned),
    };
    let mut count = 0usize;
    for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        count += 1;
        if count > limits.max_lines {
            errors.push(err(
                line,
                "too_many_requests",
                format!("the file holds more than {} requests", limits.max_lines),
                None,
            ));
            break;
        }
        if errors.len() >= MAX_ERRORS {
            continue;
        }
        match check_line(raw, limits) {
            Ok((custom_id, model, body)) => {
                if !seen.insert(custom_id.clone()) {
                    errors.push(err(
                        line,
                        "duplicate_custom_id",
                        format!("custom_id \"{custom_id}\" is on an earlier line too"),
                        Some("custom_id"),
                    ));
                } else {
                    items.push(Item {
                        line,
                        custom_id,
                        model,
                        body: body.into(),
                    });
                }
            }
            Err((code, message, param)) => errors.push(err(line, code, message, param)),
        }
    }
    if count == 0 && errors.is_empty() {
        errors.push(LineError {
            code: "empty_file".into(),
            message: "the file holds no request".into(),
            line: None,
            param: None,
        });
    }
    if errors.is_empty() {
        Ok(items)
    } else {
        Err(errors)
    }
}

type LineProblem = (&'static str, String, Option<&'static str>);

fn check_line(raw: &[u8], limits: &Limits<'_>) -> Result<(String, String, Vec<u8>), LineProblem> {
    let l: InputLine = serde_json::from_slice(raw)
        .map_err(|e| ("invalid_json_line", format!("not a JSON object: {e}"), None))?;
    let custom_id = match l.custom_id {
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 512 => s,
        _ => {
            return Err((
                "invalid_custom_id",
                "custom_id must be a string of 1 to 512 bytes".into(),
                Some("custom_id"),
            ));
        }
    };
    if l.method.as_ref().and_then(Value::as_str) != Some("POST") {
        return Err((
            "invalid_method",
            "method must be \"POST\"".into(),
            Some("method"),
        ));
    }
    let url = l.url.as_ref().and_then(Value::as_str).unwrap_or_default();
    if url != limits.endpoint {
        return Err((
            "mismatched_endpoint",
            format!(
                "url \"{url}\" is not the batch's endpoint \"{}\"",
                limits.endpoint
            ),
            Some("url"),
        ));
    }
    let Some(Value::Object(body)) = l.body else {
        return Err((
            "invalid_body",
            "body must be a JSON object".into(),
            Some("body"),
        ));
    };
    let model = match body.get("model") {
        Some(Value::String(m)) if (limits.known_model)(m) => m.clone(),
        Some(Value::String(m)) => {
            return Err((
                "model_not_found",
                format!("the model \"{m}\" is not served here"),
                Some("body.model"),
            ));
        }
        _ => {
            return Err((
                "invalid_body",
                "body.model must be a string".into(),
                Some("body.model"),
            ));
        }
    };
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        return Err((
            "invalid_body",
            "a batch request is not streamed: drop \"stream\"".into(),
            Some("body.stream"),
        ));
    }
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    if bytes.len() > limits.max_body_bytes {
        return Err((
            "body_too_large",
            format!(
                "the body is {} bytes, over the {} a request may send",
                bytes.len(),
                limits.max_body_bytes
            ),
            Some("body"),
        ));
    }
    Ok((custom_id, model, bytes))
}

/// An output line: the item's HTTP answer.
pub fn output_line(
    id: &str,
    custom_id: &str,
    status: u16,
    request_id: &str,
    body: &[u8],
) -> String {
    let body: Value = serde_json::from_slice(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()));
    serde_json::json!({
        "id": id,
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": null,
    })
    .to_string()
}

/// An error line: the item got no answer.
pub fn error_line(id: &str, custom_id: &str, code: &str, message: &str) -> String {
    serde_json::json!({
        "id": id,
        "custom_id": custom_id,
        "response": null,
        "error": {"code": code, "message": message},
    })
    .to_string()
}

/// The usage an answer reports: (prompt, cached, completion, reasoning)
/// tokens, from chat or completions (`prompt_tokens`), the Responses API
/// (`input_tokens`) or embeddings.
pub fn answer_usage(body: &[u8]) -> (u64, u64, u64, u64) {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return (0, 0, 0, 0);
    };
    let u = &v["usage"];
    let n = |a: &str, b: &str| u[a].as_u64().or_else(|| u[b].as_u64()).unwrap_or(0);
    let prompt = n("prompt_tokens", "input_tokens");
    let completion = n("completion_tokens", "output_tokens");
    let cached = u["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .or_else(|| u["input_tokens_details"]["cached_tokens"].as_u64())
        .unwrap_or(0);
    let reasoning = u["completion_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .or_else(|| u["output_tokens_details"]["reasoning_tokens"].as_u64())
        .unwrap_or(0);
    (prompt, cached, completion, reasoning)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(known: &dyn Fn(&str) -> bool) -> Limits<'_> {
        Limits {
            endpoint: "/v1/chat/completions",
            max_lines: 3,
            max_body_bytes: 200,
            known_model: known,
        }
    }

    fn line(id: &str, model: &str) -> String {
        format!(
            r#"{{"custom_id":"{id}","method":"POST","url":"/v1/chat/completions","body":{{"model":"{model}","messages":[]}}}}"#
        )
    }

    #[test]
    fn a_good_file_reads_in_order_and_skips_blank_lines() {
        let known = |m: &str| m == "m";
        let text = format!("{}\n\n{}\r\n", line("a", "m"), line("b", "m"));
        let items = read_input(text.as_bytes(), &limits(&known)).unwrap();
        assert_eq!(
            items
                .iter()
                .map(|i| (i.line, i.custom_id.as_str()))
                .collect::<Vec<_>>(),
            [(1, "a"), (3, "b")]
        );
        assert_eq!(items[0].model, "m");
    }

    #[test]
    fn every_problem_is_reported_with_its_line() {
        let known = |m: &str| m == "m";
        let text = [
            line("a", "m"),
            "not json".into(),
            line("a", "m"),
            line("c", "other"),
            line("d", "m").replace("/v1/chat/completions", "/v1/embeddings"),
            line("e", "m").replace("\"messages\":[]", "\"stream\":true"),
        ]
        .join("\n");
        let mut l = limits(&known);
        l.max_lines = 10;
        let errors = read_input(text.as_bytes(), &l).unwrap_err();
        let got: Vec<(Option<u32>, &str)> =
            errors.iter().map(|e| (e.line, e.code.as_str())).collect();
        assert_eq!(
            got,
            [
                (Some(2), "invalid_json_line"),
                (Some(3), "duplicate_custom_id"),
                (Some(4), "model_not_found"),
                (Some(5), "mismatched_endpoint"),
                (Some(6), "invalid_body"),
            ]
        );
    }

    #[test]
    fn limits_on_lines_bodies_and_emptiness() {
        let known = |_: &str| true;
        let four = (0..4)
            .map(|i| line(&i.to_string(), "m"))
            .collect::<Vec<_>>()
            .join("\n");
        let e = read_input(four.as_bytes(), &limits(&known)).unwrap_err();
        assert_eq!(
            (e[0].line, e[0].code.as_str()),
            (Some(4), "too_many_requests")
        );
        let big = line("x", "m").replace("[]", &format!("[\"{}\"]", "y".repeat(300)));
        let e = read_input(big.as_bytes(), &limits(&known)).unwrap_err();
        assert_eq!(e[0].code, "body_too_large");
        let e = read_input(b"\n \n", &limits(&known)).unwrap_err();
        assert_eq!((e[0].line, e[0].code.as_str()), (None, "empty_file"));
    }

    #[test]
    fn create_is_checked() {
        let ok = br#"{"input_file_id":"file-1","endpoint":"/v1/chat/completions","completion_window":"24h","metadata":{"k":"v"}}"#;
        assert!(CreateBatch::parse(ok).is_ok());
        for bad in [
            r#"{"input_file_id":"f","endpoint":"/v1/images","completion_window":"24h"}"#,
            r#"{"input_file_id":"f","endpoint":"/v1/completions","completion_window":"1h"}"#,
            r#"{"input_file_id":"f","endpoint":"/v1/completions","completion_window":"24h","metadata":{"k":1}}"#,
            r#"{"endpoint":"/v1/completions","completion_window":"24h"}"#,
        ] {
            assert!(CreateBatch::parse(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn lines_and_usage() {
        let out = output_line(
            "r1",
            "a",
            200,
            "req",
            br#"{"usage":{"prompt_tokens":3,"completion_tokens":4}}"#,
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["response"]["body"]["usage"]["prompt_tokens"], 3);
        assert!(v["error"].is_null());
        let err = error_line("r2", "b", "batch_cancelled", "cancelled");
        let v: Value = serde_json::from_str(&err).unwrap();
        assert!(v["response"].is_null());
        assert_eq!(v["error"]["code"], "batch_cancelled");
        assert_eq!(
            answer_usage(br#"{"usage":{"input_tokens":5,"output_tokens":6,"input_tokens_details":{"cached_tokens":2}}}"#),
            (5, 2, 6, 0)
        );
    }
}
