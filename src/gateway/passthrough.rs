//! Calls that go to a backend without queueing: they cost the engine next
//! to nothing, so they are authenticated but neither admitted nor charged.
//!
//! - `/tokenize`, `/detokenize` and Anthropic's `/v1/messages/count_tokens`
//!   go to a healthy backend of the model the body names.
//! - `GET`/`DELETE /v1/responses/{id}` (and the routes under it, such as
//!   `POST .../cancel` and `GET .../input_items`) go to the backend that
//!   created the response: the gateway remembers which one, and for which
//!   tenant, for [`RESPONSE_MEMORY`] (at most [`RESPONSES_REMEMBERED`] ids,
//!   the oldest forgotten first). Another tenant's id, or one forgotten,
//!   is a 404 that says so.
//!
//! They are not inference requests: they are not counted in
//! `fairway_requests_total` or the access log, as the health and metadata
//! routes are not.

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::BodyExt;

use crate::core::ids::BackendId;
use crate::core::spec::Api;
use crate::gateway::live_policy::Live;
use crate::gateway::state::Gateway;
use crate::gateway::tenant::authenticate;
use crate::gateway::{connections, upstream};
use crate::net::body::{BoxBody, RequestBody};
use crate::protocol::error::{ApiError, close_if_body_unread};
use crate::protocol::openai;
use crate::protocol::upstream::UpstreamError;

/// Longest wait for a pass-through call's response headers.
const TIMEOUT: Duration = Duration::from_secs(30);

/// `/v1/responses/{id}[/...]`: the id in the path, if it is one.
pub fn response_id(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/responses/")?;
    let id = rest.split('/').next().unwrap_or(rest);
    (!id.is_empty()).then_some(id)
}

/// Forwards a call on a stored response to the backend that created it.
pub async fn stored_response(gw: Arc<Gateway>, req: Request<RequestBody>) -> Response<BoxBody> {
    let live = gw.live();
    let origin = match authenticate(&live, req.headers()) {
        Err(e) => Err(e),
        Ok(tenant) => match response_id(req.uri().path()) {
            None => Err(ApiError::NotFound),
            Some(id) => gw
                .response_origin(id, tenant)
                .await
                .ok_or_else(|| ApiError::UnknownResponse(id.to_owned())),
        },
    };
    match origin {
        Ok(backend) => forward(&live, req, false, |_| Ok(backend)).await,
        Err(e) => answer(e, false, &req),
    }
}

/// Forwards `/tokenize`, `/detokenize` or `/v1/messages/count_tokens` to a
/// healthy backend of the model the body names. `anthropic`: errors in
/// Anthropic's shape.
pub async fn to_model(
    gw: Arc<Gateway>,
    req: Request<RequestBody>,
    anthropic: bool,
) -> Response<BoxBody> {
    let live = gw.live();
    let tenant = match authenticate(&live, req.headers()) {
        Ok(t) => t,
        Err(e) => return answer(e, anthropic, &req),
    };
    let pick = |body: &[u8]| {
        let model = openai::parse(body)?.model;
        gw.healthy_backend(&live, &model, Api::OpenAi, Some(tenant))
    };
    forward(&live, req, anthropic, pick).await
}

/// Fairway's error, in the route's shape, closing an HTTP/1 connection
/// whose request body is left unread.
fn answer(e: ApiError, anthropic: bool, req: &Request<RequestBody>) -> Response<BoxBody> {
    let unread = !http_body::Body::is_end_stream(req.body());
    render(e, anthropic, req.version(), unread)
}

fn render(e: ApiError, anthropic: bool, version: http::Version, unread: bool) -> Response<BoxBody> {
    let mut resp = if anthropic {
        e.into_anthropic_response()
    } else {
        e.into_response()
    };
    close_if_body_unread(&mut resp, version, unread);
    resp
}

/// Reads the body (within the policy's limits), picks the backend from
/// it, sends the request there as the client made it (less its
/// credentials and hop-by-hop headers) and relays the answer unread.
async fn forward(
    live: &Live,
    req: Request<RequestBody>,
    anthropic: bool,
    pick: impl FnOnce(&[u8]) -> Result<BackendId, ApiError>,
) -> Response<BoxBody> {
    let server = &live.policy.server;
    let version = req.version();
    let unread = !http_body::Body::is_end_stream(req.body());
    let path = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned());
    let read =
        crate::protocol::read::read_body(req, server.max_body_bytes, server.body_read_timeout);
    let (parts, body) = match read.await {
        Ok(r) => r,
        Err(e) => return render(e, anthropic, version, unread),
    };
    send(live, &parts, &path, body, pick)
        .await
        .unwrap_or_else(|e| render(e, anthropic, version, false))
}

/// Sends the read request to the backend `pick` names.
async fn send(
    live: &Live,
    parts: &http::request::Parts,
    path: &str,
    body: bytes::Bytes,
    pick: impl FnOnce(&[u8]) -> Result<BackendId, ApiError>,
) -> Result<Response<BoxBody>, ApiError> {
    let backend = pick(&body)?;
    let address = live
        .addresses
        .get(&backend)
        .ok_or_else(|| ApiError::Internal("the backend left the policy".into()))?;
    let name = live
        .backend_names
        .get(&backend)
        .map_or_else(|| address.to_string(), |n| n.to_string());
    let up = upstream::request(
        &live.policy.server,
        parts,
        path,
        address,
        upstream::whole(body),
    )?;
    let resp = match tokio::time::timeout(TIMEOUT, connections::send(&address.authority, up)).await
    {
        Err(_) => {
            return Err(ApiError::UpstreamTimeout {
                backend: name,
                timeout: TIMEOUT,
            });
        }
        Ok(Err(cause)) => {
            return Err(ApiError::Upstream {
                backend: name,
                cause,
            });
        }
        Ok(Ok(r)) => r,
    };
    let (mut parts, body) = resp.into_parts();
    upstream::strip_response_headers(&mut parts.headers);
    let body = body.map_err(|e| -> crate::net::body::BodyError { Box::new(e) });
    Ok(Response::from_parts(parts, body.boxed_unsync()))
}

/// `GET /v2/models/{model}[/versions/{v}]`: the model's metadata, from a
/// healthy Triton backend of its pool (under the model's name there, and
/// answered with the pool's name), with no admission: it costs the engine
/// nothing. 404 for a model with no Triton backends, 503 when none is
/// healthy, 502 when the backend does not answer.
pub async fn triton_metadata(
    gw: &Gateway,
    p: &crate::protocol::triton::ModelPath<'_>,
) -> Result<http::Response<crate::net::body::BoxBody>, ApiError> {
    use http_body_util::BodyExt;
    let live = gw.live();
    let backend = gw.healthy_backend(&live, p.model, crate::core::spec::Api::Triton, None)?;
    let address = live
        .addresses
        .get(&backend)
        .ok_or_else(|| ApiError::NoBackend(p.model.to_owned()))?;
    let served = live
        .served_models
        .get(&backend)
        .map_or(p.model, String::as_str);
    let url = format!(
        "http://{address}{}",
        p.upstream(served).trim_end_matches('/')
    );
    let req = http::Request::get(url)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let unavailable = |cause| ApiError::Upstream {
        backend: address.to_string(),
        cause,
    };
    let resp = tokio::time::timeout(METADATA_TIMEOUT, gw.client().request(req))
        .await
        .map_err(|_| unavailable(UpstreamError::NoAnswer))?
        .map_err(|e| unavailable(UpstreamError::Client(e)))?;
    let (parts, body) = resp.into_parts();
    let body = tokio::time::timeout(
        METADATA_TIMEOUT,
        http_body_util::Limited::new(body, METADATA_LIMIT).collect(),
    )
    .await
    .map_err(|_| unavailable(UpstreamError::BodyTimeout))?
    .map_err(|e| unavailable(UpstreamError::Body(e)))?
    .to_bytes();
    // The client asked for the pool's model: name it so.
    let body = match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(mut v) if parts.status.is_success() && v.get("name").is_some() => {
            v["name"] = serde_json::Value::from(p.model);
            bytes::Bytes::from(v.to_string())
        }
        _ => body,
    };
    let mut out = http::Response::new(crate::net::body::full(body));
    *out.status_mut() = parts.status;
    if let Some(ct) = parts.headers.get(http::header::CONTENT_TYPE) {
        out.headers_mut()
            .insert(http::header::CONTENT_TYPE, ct.clone());
    }
    Ok(out)
}

/// `GET /v2/models`: the models the caller's key may call over Triton's
/// API (every model with Triton backends: the policy gives each tenant
/// every pool), as `{"models": [{"name", "versions"}]}`. Needs a valid key
/// when tenants are declared.
pub fn triton_models(
    gw: &Gateway,
    headers: &http::HeaderMap,
) -> Result<http::Response<crate::net::body::BoxBody>, ApiError> {
    let live = gw.live();
    authenticate(&live, headers)?;
    let mut models: Vec<&str> = live
        .pools
        .iter()
        .filter(|(_, p)| p.triton.is_some())
        .map(|(m, _)| m.as_str())
        .collect();
    models.sort_unstable();
    let body = serde_json::json!({
        "models": models
            .iter()
            .map(|m| serde_json::json!({"name": m, "versions": ["1"]}))
            .collect::<Vec<_>>()
    });
    let mut out = http::Response::new(crate::net::body::full(bytes::Bytes::from(body.to_string())));
    out.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(out)
}

/// How long a metadata call may take, and its largest body.
const METADATA_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
const METADATA_LIMIT: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_from_the_path() {
        assert_eq!(response_id("/v1/responses/resp_1"), Some("resp_1"));
        assert_eq!(response_id("/v1/responses/resp_1/cancel"), Some("resp_1"));
        assert_eq!(response_id("/v1/responses/"), None);
        assert_eq!(response_id("/v1/responses"), None);
    }
}
