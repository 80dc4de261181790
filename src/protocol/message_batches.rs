//! Anthropic's Message Batches (`/v1/messages/batches`), as Anthropic
//! sends them, over the same batches as OpenAI's Batch API: a create's
//! `requests` become a batch input file of `/v1/messages` lines
//! ([`input_lines`]), the batch runs as any other, and its object and
//! results are told in Anthropic's shape ([`message_batch`],
//! [`result_line`]).

use serde::Deserialize;
use serde_json::{Value, json};

use super::batch::{Batch, Status};

/// The endpoint a message batch's items go to.
pub const ENDPOINT: &str = "/v1/messages";
/// The prefix of a message batch's id (an OpenAI batch's is `batch_`).
pub const ID_PREFIX: &str = "msgbatch_";
/// Most requests in one batch (Anthropic's limit).
pub const MAX_REQUESTS: usize = 100_000;

#[derive(Deserialize)]
struct Create {
    requests: Vec<Value>,
}

/// One request of a create: its `custom_id` and `params` (a Messages
/// request body).
#[derive(Clone, Debug, PartialEq)]
pub struct BatchRequest {
    pub custom_id: String,
    pub params: serde_json::Map<String, Value>,
}

/// Why a batch create was refused: the client's fault, and the same body
/// fails again. Its message (with its source's) is the one the client
/// reads.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// Not JSON of a create's shape.
    #[error("the body is not a batch of requests")]
    Json(#[source] serde_json::Error),
    /// Too few or too many requests.
    #[error("requests: a batch holds 1 to {MAX_REQUESTS} requests, not {0}")]
    Count(usize),
    /// One request breaks a rule; `at` is the field's path.
    #[error("{at}: {rule}")]
    Request { at: String, rule: String },
}

/// `POST /v1/messages/batches`'s body, checked as Anthropic checks it:
/// 1 to [`MAX_REQUESTS`] requests, each a `custom_id` of 1 to 64 letters,
/// digits, `_` or `-`, unique in the batch, and `params`, an object with a
/// `model`, not streamed. The error names the request by its index.
pub fn parse_create(body: &[u8]) -> Result<Vec<BatchRequest>, CreateError> {
    let c: Create = serde_json::from_slice(body).map_err(CreateError::Json)?;
    if c.requests.is_empty() || c.requests.len() > MAX_REQUESTS {
        return Err(CreateError::Count(c.requests.len()));
    }
    let mut seen = std::collections::HashSet::new();
    c.requests
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let broken = |what: &str, rule: String| CreateError::Request {
                at: format!("requests.{i}.{what}"),
                rule,
            };
            let custom_id = match r.get("custom_id").and_then(Value::as_str) {
                Some(id)
                    if (1..=64).contains(&id.len())
                        && id
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
                {
                    id.to_owned()
                }
                _ => {
                    return Err(broken(
                        "custom_id",
                        "1 to 64 letters, digits, '_' or '-'".into(),
                    ));
                }
            };
            if !seen.insert(custom_id.clone()) {
                return Err(broken("custom_id", format!("'{custom_id}' is not unique")));
            }
            let Some(Value::Object(params)) = r.get("params").cloned() else {
                return Err(broken("params", "a Messages request object".into()));
            };
            if !params.get("model").is_some_and(Value::is_string) {
                return Err(broken("params.model", "a string".into()));
            }
            if params.get("stream").and_then(Value::as_bool) == Some(true) {
                return Err(broken(
                    "params.stream",
                    "a batch request is not streamed".into(),
                ));
            }
            Ok(BatchRequest { custom_id, params })
        })
        .collect()
}

/// The requests as a batch input file's lines (OpenAI's format).
pub fn input_lines(requests: &[BatchRequest]) -> Vec<String> {
    requests
        .iter()
        .map(|r| {
            json!({
                "custom_id": r.custom_id,
                "method": "POST",
                "url": ENDPOINT,
                "body": r.params,
            })
            .to_string()
        })
        .collect()
}

/// A message batch's request counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub processing: u32,
    pub succeeded: u32,
    pub errored: u32,
    pub canceled: u32,
    pub expired: u32,
}

impl Counts {
    /// A running batch's, from its counts: the items without a result are
    /// processing.
    pub fn running(b: &Batch) -> Counts {
        let c = b.request_counts;
        Counts {
            processing: c.total.saturating_sub(c.completed + c.failed),
            succeeded: c.completed,
            errored: c.failed,
            ..Counts::default()
        }
    }

    /// An ended batch's, from its results' lines ([`kind`] of each).
    pub fn ended<'a>(lines: impl IntoIterator<Item = (bool, &'a str)>) -> Counts {
        let mut c = Counts::default();
        for (ok, line) in lines {
            match kind(ok, line) {
                Kind::Succeeded => c.succeeded += 1,
                Kind::Errored => c.errored += 1,
                Kind::Canceled => c.canceled += 1,
                Kind::Expired => c.expired += 1,
            }
        }
        c
    }
}

/// What became of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Succeeded,
    Errored,
    Canceled,
    Expired,
}

/// What an output or error line (OpenAI's format; `ok`: a 2xx answer)
/// says became of its request.
pub fn kind(ok: bool, line: &str) -> Kind {
    if ok {
        return Kind::Succeeded;
    }
    let code = serde_json::from_str::<Value>(line)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
    match code.as_deref() {
        Some("batch_cancelled") => Kind::Canceled,
        Some("batch_expired") => Kind::Expired,
        _ => Kind::Errored,
    }
}

/// `processing_status`: `in_progress` until the batch ends, `canceling`
/// while a cancel is under way, then `ended`.
pub fn processing_status(s: Status) -> &'static str {
    match s {
        Status::Cancelling => "canceling",
        s if s.is_final() => "ended",
        _ => "in_progress",
    }
}

/// RFC 3339, as Anthropic writes its times.
fn time(unix: Option<u64>) -> Value {
    unix.map_or(Value::Null, |t| {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(t);
        Value::String(humantime::format_rfc3339_seconds(at).to_string())
    })
}

/// The batch as Anthropic's `MessageBatch` object, with its `counts`;
/// `results_url` once it has ended (a path on this gateway).
pub fn message_batch(b: &Batch, counts: Counts) -> Value {
    let status = processing_status(b.status);
    let results_url = (status == "ended").then(|| format!("/v1/messages/batches/{}/results", b.id));
    json!({
        "id": b.id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": {
            "processing": counts.processing,
            "succeeded": counts.succeeded,
            "errored": counts.errored,
            "canceled": counts.canceled,
            "expired": counts.expired,
        },
        "ended_at": time(b.ended_at()),
        "created_at": time(Some(b.created_at)),
        "expires_at": time(b.expires_at),
        "archived_at": null,
        "cancel_initiated_at": time(b.cancelling_at),
        "results_url": results_url,
    })
}

/// An output or error line (OpenAI's format) as Anthropic's result line:
/// `{"custom_id", "result": {"type": "succeeded", "message"}}`, `errored`
/// with the error as Anthropic sends one, `canceled` or `expired`.
pub fn result_line(ok: bool, line: &str) -> String {
    let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
    let result = match kind(ok, line) {
        Kind::Succeeded => json!({"type": "succeeded", "message": v["response"]["body"]}),
        Kind::Canceled => json!({"type": "canceled"}),
        Kind::Expired => json!({"type": "expired"}),
        Kind::Errored => json!({"type": "errored", "error": error_of(&v)}),
    };
    json!({"custom_id": v["custom_id"], "result": result}).to_string()
}

/// The error of a line that got no 2xx answer, as Anthropic's error
/// response: the backend's own when it sent one in that shape, else one
/// made of the status and the message.
fn error_of(line: &Value) -> Value {
    let body = &line["response"]["body"];
    if body["type"] == "error" && body["error"].is_object() {
        return body.clone();
    }
    let status = line["response"]["status_code"].as_u64();
    let kind = match status {
        Some(400 | 422) => "invalid_request_error",
        Some(401) => "authentication_error",
        Some(403) => "permission_error",
        Some(404) => "not_found_error",
        Some(413) => "request_too_large",
        Some(429) => "rate_limit_error",
        Some(529) => "overloaded_error",
        _ => "api_error",
    };
    let message = body["error"]["message"]
        .as_str()
        .or_else(|| line["error"]["message"].as_str())
        .unwrap_or("the request failed");
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_is_checked_as_anthropic_checks_it() {
        let ok = br#"{"requests":[{"custom_id":"a-1","params":{"model":"m","max_tokens":4,"messages":[]}}]}"#;
        let r = parse_create(ok).unwrap();
        assert_eq!(r[0].custom_id, "a-1");
        let line: Value = serde_json::from_str(&input_lines(&r)[0]).unwrap();
        assert_eq!(line["url"], ENDPOINT);
        assert_eq!(line["method"], "POST");
        assert_eq!(line["body"]["model"], "m");
        for (bad, says) in [
            (r#"{"requests":[]}"#.to_owned(), "1 to 100000"),
            (r#"{"requests":[{"custom_id":"a b","params":{"model":"m"}}]}"#.to_owned(), "requests.0.custom_id"),
            (format!(r#"{{"requests":[{{"custom_id":"{}","params":{{"model":"m"}}}}]}}"#, "x".repeat(65)), "requests.0.custom_id"),
            (r#"{"requests":[{"custom_id":"a","params":{"model":"m"}},{"custom_id":"a","params":{"model":"m"}}]}"#.to_owned(), "not unique"),
            (r#"{"requests":[{"custom_id":"a","params":{"max_tokens":1}}]}"#.to_owned(), "params.model"),
            (r#"{"requests":[{"custom_id":"a","params":{"model":"m","stream":true}}]}"#.to_owned(), "params.stream"),
            (r#"{"requests":[{"custom_id":"a"}]}"#.to_owned(), "requests.0.params"),
            ("[]".to_owned(), "not a batch"),
        ] {
            let e = crate::fault::Chain(&parse_create(bad.as_bytes()).unwrap_err()).to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn results_are_told_as_anthropic_tells_them() {
        let ok = json!({"id": "x", "custom_id": "a", "response": {"status_code": 200, "body": {"type": "message", "content": []}}, "error": null}).to_string();
        let v: Value = serde_json::from_str(&result_line(true, &ok)).unwrap();
        assert_eq!(v["custom_id"], "a");
        assert_eq!(v["result"]["type"], "succeeded");
        assert_eq!(v["result"]["message"]["type"], "message");
        let refused = json!({"id": "x", "custom_id": "b", "response": {"status_code": 400, "body": {"error": {"message": "bad", "type": "invalid_request_error"}}}, "error": null}).to_string();
        let v: Value = serde_json::from_str(&result_line(false, &refused)).unwrap();
        assert_eq!(v["result"]["type"], "errored");
        assert_eq!(v["result"]["error"]["type"], "error");
        assert_eq!(
            v["result"]["error"]["error"]["type"],
            "invalid_request_error"
        );
        assert_eq!(v["result"]["error"]["error"]["message"], "bad");
        let cancelled = super::super::batch::error_line("x", "c", "batch_cancelled", "first");
        let expired = super::super::batch::error_line("x", "d", "batch_expired", "first");
        let v: Value = serde_json::from_str(&result_line(false, &cancelled)).unwrap();
        assert_eq!(v["result"], json!({"type": "canceled"}));
        let v: Value = serde_json::from_str(&result_line(false, &expired)).unwrap();
        assert_eq!(v["result"], json!({"type": "expired"}));
        let c = Counts::ended([
            (true, ok.as_str()),
            (false, refused.as_str()),
            (false, cancelled.as_str()),
            (false, expired.as_str()),
        ]);
        assert_eq!(
            c,
            Counts {
                processing: 0,
                succeeded: 1,
                errored: 1,
                canceled: 1,
                expired: 1
            }
        );
    }
}
