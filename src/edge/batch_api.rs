//! The Files and Batch routes (`/v1/files`, `/v1/batches`), as the
//! official SDKs call them: the caller (a tenant by its API key, or the
//! operator by the admin token), the form or JSON body, the answer in
//! OpenAI's shape. What they do is `batch::Batches`'.
//!
//! - `POST /v1/files`: a multipart form with `file` and `purpose`
//!   (`batch`), streamed to the store's disk as it arrives, up to
//!   `[batch] max_file_bytes` (413 past it).
//! - `GET /v1/files` (`after`, `limit`, `order`), `GET /v1/files/{id}`,
//!   `GET /v1/files/{id}/content`, `DELETE /v1/files/{id}`.
//! - `POST /v1/batches`, `GET /v1/batches` (`after`, `limit`, newest
//!   first), `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use serde::Serialize;
use serde_json::json;

use crate::batch::{BatchError, Batches, Scope};
use crate::edge::usage_page::{Caller, caller};
use crate::gateway::state::Gateway;
use crate::net::body::{self, BoxBody, RequestBody};
use crate::protocol::error::ApiError;

/// Whether the batch routes own `path`.
pub fn owns(path: &str) -> bool {
    path == "/v1/files"
        || path.starts_with("/v1/files/")
        || path == "/v1/batches"
        || path.starts_with("/v1/batches/")
}

fn error(status: StatusCode, kind: &str, code: &str, message: &str) -> Response<BoxBody> {
    let mut resp = Response::new(body::json(&json!({
        "error": {"message": message, "type": kind, "param": null, "code": code}
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
        BatchError::NotFound(..) => error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            &msg,
        ),
        BatchError::Invalid(_) => error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_request",
            &msg,
        ),
        BatchError::Conflict(_) => error(
            StatusCode::CONFLICT,
            "invalid_request_error",
            "conflict",
            &msg,
        ),
        BatchError::TooLarge(_) => error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "too_large",
            &msg,
        ),
        BatchError::Store(s) => {
            // Every upload while the disk is full would write one.
            static LOG: crate::clock::Throttled =
                crate::clock::Throttled::new(crate::clock::REMOTE_LOG_EVERY);
            if let Some(left_out) = LOG.allow() {
                tracing::error!(error = %s, left_out, "batch store");
            }
            let status = if s.is_full() {
                StatusCode::INSUFFICIENT_STORAGE
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            error(status, "server_error", "store_error", &msg)
        }
    }
}

pub(super) fn ok<T: Serialize>(v: &T) -> Response<BoxBody> {
    let mut resp = Response::new(body::full(serde_json::to_vec(v).unwrap_or_default()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// Who is asking, as the usage page reads it, with the tenant by name.
pub(super) fn scope(gw: &Gateway, headers: &HeaderMap) -> Result<Scope, ApiError> {
    Ok(match caller(&gw.live(), headers)? {
        Caller::Operator => Scope::Operator,
        Caller::Tenant(t) => Scope::Tenant(gw.sched().tenant_name(t)),
    })
}

pub(super) fn query(req: &Request<RequestBody>) -> HashMap<String, String> {
    req.uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// A page of a list: after the id `after`, at most `limit` (1 to `max`).
fn page<T: Serialize>(
    all: Vec<T>,
    id: impl Fn(&T) -> &str,
    q: &HashMap<String, String>,
    max: usize,
) -> Response<BoxBody> {
    let limit = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(20)
        .clamp(1, max);
    let start = q
        .get("after")
        .and_then(|a| all.iter().position(|x| id(x) == a).map(|i| i + 1))
        .unwrap_or(0);
    let rest: Vec<&T> = all.iter().skip(start).collect();
    let data: Vec<&T> = rest.iter().take(limit).copied().collect();
    ok(&json!({
        "object": "list",
        "data": data,
        "first_id": data.first().map(|x| id(x)),
        "last_id": data.last().map(|x| id(x)),
        "has_more": rest.len() > limit,
    }))
}

/// Routes a Files or Batch call.
pub async fn route(
    gw: &Arc<Gateway>,
    batches: Option<&Arc<Batches>>,
    req: Request<RequestBody>,
) -> Response<BoxBody> {
    let Some(b) = batches else {
        return error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            "The Files and Batch APIs are off here: the policy has no [batch] section.",
        );
    };
    let who = match scope(gw, req.headers()) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let path = req.uri().path().to_owned();
    let q = query(&req);
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let result = match (req.method().clone(), parts.as_slice()) {
        (Method::POST, ["v1", "files"]) => match &who {
            Scope::Tenant(owner) => upload(b, owner, req).await.map(|f| ok(&f)),
            Scope::Operator => Err(BatchError::Invalid(
                "files belong to a tenant: upload with its API key".into(),
            )),
        },
        (Method::GET, ["v1", "files"]) => b.files(&who).await.map(|mut fs| {
            if q.get("order").map(String::as_str) != Some("asc") {
                fs.reverse();
            }
            if let Some(p) = q.get("purpose") {
                fs.retain(|f| &f.purpose == p);
            }
            page(fs, |f| f.id.as_str(), &q, 10_000)
        }),
        (Method::GET, ["v1", "files", id]) => b.file(&who, id).await.map(|f| ok(&f)),
        (Method::GET, ["v1", "files", id, "content"]) => b.content(&who, id).await.map(|c| {
            let mut resp = Response::new(body::full(Bytes::from(c)));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/jsonl"),
            );
            resp
        }),
        (Method::DELETE, ["v1", "files", id]) => b
            .delete_file(&who, id)
            .await
            .map(|()| ok(&json!({"id": id, "object": "file", "deleted": true}))),
        (Method::POST, ["v1", "batches"]) => match &who {
            Scope::Tenant(owner) => match read_json(req, 1 << 20).await {
                Ok(body) => b.create(owner, &body).await.map(|x| ok(&x)),
                Err(e) => return e.into_response(),
            },
            Scope::Operator => Err(BatchError::Invalid(
                "batches belong to a tenant: create them with its API key".into(),
            )),
        },
        // Anthropic's message batches are listed on their own route.
        (Method::GET, ["v1", "batches"]) => b.batches(&who).await.map(|mut bs| {
            bs.retain(|x| {
                !x.id
                    .starts_with(crate::protocol::message_batches::ID_PREFIX)
            });
            page(bs, |x| x.id.as_str(), &q, 100)
        }),
        (Method::GET, ["v1", "batches", id]) => b.batch(&who, id).await.map(|x| ok(&x)),
        (Method::POST, ["v1", "batches", id, "cancel"]) => b.cancel(&who, id).await.map(|x| ok(&x)),
        _ => return ApiError::NotFound.into_response(),
    };
    result.unwrap_or_else(answer)
}

pub(super) async fn read_json(
    req: Request<RequestBody>,
    limit: usize,
) -> Result<Vec<u8>, ApiError> {
    let body = http_body_util::Limited::new(req.into_body(), limit)
        .collect()
        .await
        .map_err(|_| ApiError::BodyTooLarge(limit))?;
    Ok(body.to_bytes().to_vec())
}

/// Streams a `POST /v1/files` form's `file` to the store's disk.
async fn upload(
    b: &Batches,
    owner: &str,
    req: Request<RequestBody>,
) -> Result<crate::protocol::batch::FileObject, BatchError> {
    let boundary = crate::protocol::audio::boundary(req.headers())
        .map(str::to_owned)
        .ok_or_else(|| BatchError::Invalid("send the file as multipart/form-data".into()))?;
    let max = b.limits().max_file_bytes;
    let stream = req.into_body().into_data_stream();
    let mut form = multer::Multipart::new(stream, boundary);
    let mut purpose = None;
    let mut stored = None;
    let bad = |e: multer::Error| BatchError::Invalid(format!("the form does not read: {e}"));
    while let Some(mut field) = form.next_field().await.map_err(bad)? {
        match field.name() {
            Some("purpose") => purpose = Some(field.text().await.map_err(bad)?),
            Some("file") if stored.is_none() => {
                let filename = field.file_name().unwrap_or("upload.jsonl").to_owned();
                let (id, path, file) = b.begin_upload().await?;
                let mut out = std::io::BufWriter::new(file);
                let mut bytes = 0u64;
                let written = loop {
                    match field.chunk().await {
                        Ok(Some(c)) => {
                            bytes += c.len() as u64;
                            if bytes > max {
                                break Err(BatchError::TooLarge(format!(
                                    "the file is over the {max} bytes a file may hold"
                                )));
                            }
                            if let Err(e) = out.write_all(&c) {
                                break Err(BatchError::Store(
                                    crate::batch::store::StoreError::Io {
                                        path: path.clone(),
                                        source: e,
                                    },
                                ));
                            }
                        }
                        Ok(None) => break Ok(()),
                        Err(e) => break Err(bad(e)),
                    }
                };
                let flushed = written.and_then(|()| {
                    out.flush().map_err(|e| {
                        BatchError::Store(crate::batch::store::StoreError::Io {
                            path: path.clone(),
                            source: e,
                        })
                    })
                });
                if let Err(e) = flushed {
                    let _ = std::fs::remove_file(&path);
                    return Err(e);
                }
                stored = Some((id, path, filename, bytes));
            }
            _ => {}
        }
    }
    let Some((id, path, filename, bytes)) = stored else {
        return Err(BatchError::Invalid("the form has no `file`".into()));
    };
    let purpose = purpose.unwrap_or_default();
    if purpose != "batch" {
        let _ = std::fs::remove_file(&path);
        return Err(BatchError::Invalid(format!(
            "purpose must be \"batch\" here, not \"{purpose}\""
        )));
    }
    b.finish_upload(owner, (id, path), filename, purpose, bytes)
        .await
}
