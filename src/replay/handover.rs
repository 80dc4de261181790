//! How `fairway load` plays a workload's batch requests (those of
//! `batch_api` tenants), the three ways a team can send a suite:
//!
//! - `live`: each as a live request at its time (a team without the Batch
//!   API that sends everything at once);
//! - `concurrency=N`: as live requests, N at a time from its time (what
//!   LiteLLM's batch runner does, with no load signal); items not started
//!   when the rest of the workload has ended are left unsent (the run's
//!   shed count for the tenant);
//! - `lane`: handed over through the Batch API (one JSONL file and one
//!   batch per tenant, at its first item's time), polled until the batch
//!   ends; each item is served if its line in the output file answers 200,
//!   and ends when its batch does (the API says no more).

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

use super::workload::WorkRequest;

/// How the batch requests are played.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BatchAs {
    #[default]
    Live,
    Concurrency(usize),
    Lane,
}

/// A `--batch-as` value that is none of the ways: the operator's flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected live, lane or concurrency=N (N > 0), got \"{0}\"")]
pub struct BadBatchAs(String);

impl std::str::FromStr for BatchAs {
    type Err = BadBatchAs;

    fn from_str(s: &str) -> Result<Self, BadBatchAs> {
        match s {
            "live" => Ok(BatchAs::Live),
            "lane" => Ok(BatchAs::Lane),
            _ => s
                .strip_prefix("concurrency=")
                .and_then(|n| n.parse().ok())
                .filter(|n| *n > 0)
                .map(BatchAs::Concurrency)
                .ok_or_else(|| BadBatchAs(s.to_owned())),
        }
    }
}

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Why handing a tenant's items to the Batch API failed: the gateway's
/// answer, or the way to it. `fairway load` counts the items as failed.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// The request could not be made (a key that is no header value).
    #[error("{path}: making the request")]
    Request {
        path: String,
        #[source]
        source: http::Error,
    },
    /// No answer from the gateway.
    #[error("{path}")]
    Send {
        path: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// The answer's body broke off.
    #[error("{path}: reading the answer")]
    Body {
        path: String,
        #[source]
        source: hyper::Error,
    },
    /// An error status, with the body that came with it.
    #[error("{path}: {status} {body}")]
    Status {
        path: String,
        status: StatusCode,
        body: String,
    },
    /// An answer that is not JSON.
    #[error("{path}")]
    Json {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Where and as whom to send.
#[derive(Clone, Debug)]
pub struct Target {
    /// `host:port` of the gateway's client listener.
    pub authority: String,
    /// API key per tenant name; a tenant without one is sent without a key.
    pub keys: HashMap<String, String>,
    /// Longest a request may take, headers to end of body; past it, it
    /// counts as failed.
    pub timeout: Duration,
    /// How the batch requests are played.
    pub batch_as: BatchAs,
}

/// The body of request `i` of the workload, as `fairway load` sends it.
pub fn body(w: &WorkRequest, i: usize, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": w.model,
        "prompt": w.prompt_text(i as u64),
        "max_tokens": w.max_tokens.unwrap_or(w.output_tokens).max(w.output_tokens),
        "sim_output_tokens": w.output_tokens,
        "stream": stream,
    })
}

async fn call(
    client: &HttpClient,
    target: &Target,
    key: Option<&str>,
    method: Method,
    path: &str,
    content_type: &str,
    body: Bytes,
) -> Result<serde_json::Value, HandoverError> {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", target.authority))
        .header(header::CONTENT_TYPE, content_type);
    if let Some(k) = key {
        req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
    }
    let path = path.to_owned();
    let req = match req.body(Full::new(body)) {
        Ok(req) => req,
        Err(source) => return Err(HandoverError::Request { path, source }),
    };
    let resp = match client.request(req).await {
        Ok(resp) => resp,
        Err(source) => return Err(HandoverError::Send { path, source }),
    };
    let status = resp.status();
    let bytes = match resp.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(source) => return Err(HandoverError::Body { path, source }),
    };
    if !status.is_success() {
        return Err(HandoverError::Status {
            path,
            status,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        });
    }
    if path.ends_with("/content") {
        return Ok(serde_json::Value::String(
            String::from_utf8_lossy(&bytes).into_owned(),
        ));
    }
    serde_json::from_slice(&bytes).map_err(|source| HandoverError::Json { path, source })
}

/// Hands `items` (index in the workload, request) of one tenant over as
/// one batch and waits for it to end: which items were answered with 200.
pub async fn hand_over(
    client: &HttpClient,
    target: &Target,
    key: Option<&str>,
    items: &[(usize, &WorkRequest)],
) -> Result<HashMap<usize, bool>, HandoverError> {
    let mut file = String::new();
    for (i, w) in items {
        let line = serde_json::json!({
            "custom_id": format!("r{i}"),
            "method": "POST",
            "url": "/v1/completions",
            "body": body(w, *i, false),
        });
        file.push_str(&line.to_string());
        file.push('\n');
    }
    let boundary = "fairway-load-boundary";
    let form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"suite.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{file}\r\n--{boundary}--\r\n"
    );
    let multipart = format!("multipart/form-data; boundary={boundary}");
    let json = "application/json";
    let f = call(
        client,
        target,
        key,
        Method::POST,
        "/v1/files",
        &multipart,
        form.into(),
    )
    .await?;
    let create = serde_json::json!({
        "input_file_id": f["id"],
        "endpoint": "/v1/completions",
        "completion_window": "24h",
    });
    let b = call(
        client,
        target,
        key,
        Method::POST,
        "/v1/batches",
        json,
        create.to_string().into(),
    )
    .await?;
    let path = format!("/v1/batches/{}", b["id"].as_str().unwrap_or_default());
    let ended = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let b = call(client, target, key, Method::GET, &path, json, Bytes::new()).await?;
        if matches!(
            b["status"].as_str(),
            Some("completed" | "failed" | "expired" | "cancelled")
        ) {
            break b;
        }
    };
    let mut answered = HashMap::new();
    if let Some(out) = ended["output_file_id"].as_str() {
        let path = format!("/v1/files/{out}/content");
        let text = call(client, target, key, Method::GET, &path, json, Bytes::new()).await?;
        for line in text.as_str().unwrap_or_default().lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let i = v["custom_id"]
                .as_str()
                .and_then(|c| c.strip_prefix('r')?.parse().ok());
            if let Some(i) = i {
                answered.insert(i, v["response"]["status_code"] == 200);
            }
        }
    }
    Ok(answered)
}
