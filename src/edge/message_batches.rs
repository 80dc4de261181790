//! Anthropic's Message Batches routes (`/v1/messages/batches`), as the
//! official `anthropic` SDK calls them, the answers and errors in
//! Anthropic's shape. What they do is `batch::Batches`' (`batch::messages`),
//! over the same store and runner as the Batch API's.
//!
//! - `POST /v1/messages/batches`: `{"requests": [{"custom_id", "params"}]}`.
//! - `GET /v1/messages/batches` (`limit` 1 to 1,000, `after_id`,
//!   `before_id`; newest first).
//! - `GET /v1/messages/batches/{id}`, `POST /v1/messages/batches/{id}/cancel`.
//! - `GET /v1/messages/batches/{id}/results`: JSONL, once it has ended
//!   (its `results_url`, a path on this gateway).

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use serde_json::json;

use super::batch_api::{ok, query, read_json, scope};
use crate::batch::{BatchError, Batches, Scope};
use crate::gateway::state::Gateway;
use crate::net::body::{self, BoxBody, RequestBody};

/// Whether these routes own `path`.
pub fn owns(path: &str) -> bool {
    path == "/v1/messages/batches" || path.starts_with("/v1/messages/batches/")
}

fn error(status: StatusCode, kind: &str, message: &str) -> Response<BoxBody> {
    let mut resp = Response::new(body::json(&json!({
        "type": "error",
        "error": {"type": kind, "message": message},
    })));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

fn answer(e: BatchError) -> Response<BoxBody> {
    let msg = e.to_string();
    match e {
        BatchError::NotFound(..) => error(StatusCode::NOT_FOUND, "not_found_error", &msg),
        BatchError::Invalid(_) | BatchError::Conflict(_) => {
            error(StatusCode::BAD_REQUEST, "invalid_request_error", &msg)
        }
        BatchError::TooLarge(_) => error(StatusCode::PAYLOAD_TOO_LARGE, "request_too_large", &msg),
        BatchError::Store(s) => {
            tracing::error!(error = %s, "batch store");
            error(StatusCode::INTERNAL_SERVER_ERROR, "api_error", &msg)
        }
    }
}

/// Routes a Message Batches call.
pub async fn route(
    gw: &Arc<Gateway>,
    batches: Option<&Arc<Batches>>,
    req: Request<RequestBody>,
) -> Response<BoxBody> {
    let Some(b) = batches else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found_error",
            "Message Batches are off here: the policy has no [batch] section.",
        );
    };
    let who = match scope(gw, req.headers()) {
        Ok(s) => s,
        Err(e) => return e.into_anthropic_response(),
    };
    let path = req.uri().path().to_owned();
    let q = query(&req);
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let result = match (req.method().clone(), parts.as_slice()) {
        (Method::POST, ["v1", "messages", "batches"]) => match &who {
            Scope::Tenant(owner) => {
                let limit = usize::try_from(b.limits().max_file_bytes).unwrap_or(usize::MAX);
                match read_json(req, limit).await {
                    Ok(body) => b.create_messages(owner, &body).await.map(|x| ok(&x)),
                    Err(e) => return e.into_anthropic_response(),
                }
            }
            Scope::Operator => Err(BatchError::Invalid(
                "batches belong to a tenant: create them with its API key".into(),
            )),
        },
        (Method::GET, ["v1", "messages", "batches"]) => {
            let limit = q
                .get("limit")
                .and_then(|l| l.parse::<usize>().ok())
                .unwrap_or(20)
                .clamp(1, 1000);
            let (after, before) = (q.get("after_id"), q.get("before_id"));
            b.message_batches(
                &who,
                limit,
                after.map(String::as_str),
                before.map(String::as_str),
            )
            .await
            .map(|(data, more)| {
                let id = |v: Option<&serde_json::Value>| v.map(|v| v["id"].clone());
                ok(&json!({
                    "data": data,
                    "has_more": more,
                    "first_id": id(data.first()),
                    "last_id": id(data.last()),
                }))
            })
        }
        (Method::GET, ["v1", "messages", "batches", id]) => {
            b.message_batch(&who, id).await.map(|x| ok(&x))
        }
        (Method::POST, ["v1", "messages", "batches", id, "cancel"]) => async {
            // A message batch's (an OpenAI batch's id is not found here).
            b.message_batch(&who, id).await?;
            b.cancel(&who, id).await?;
            b.message_batch(&who, id).await
        }
        .await
        .map(|x| ok(&x)),
        (Method::GET, ["v1", "messages", "batches", id, "results"]) => {
            b.message_results(&who, id).await.map(|jsonl| {
                let mut resp = Response::new(body::full(Bytes::from(jsonl)));
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/x-jsonl"),
                );
                resp
            })
        }
        _ => {
            return error(
                StatusCode::NOT_FOUND,
                "not_found_error",
                "No such Message Batches route.",
            );
        }
    };
    result.unwrap_or_else(answer)
}
