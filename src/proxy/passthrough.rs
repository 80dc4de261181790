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

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::BodyExt;
use parking_lot::Mutex;

use crate::core::ids::{BackendId, TenantId};
use crate::core::spec::Api;
use crate::core::time::Instant;
use crate::proxy::body::{BoxBody, RequestBody};
use crate::proxy::error::{ApiError, close_if_body_unread};
use crate::proxy::gateway::{Gateway, Live};
use crate::proxy::tenant::authenticate;
use crate::proxy::{openai, pool, upstream};

/// How long the gateway remembers which backend created a response.
pub const RESPONSE_MEMORY: Duration = Duration::from_secs(3600);
/// Most response ids remembered (about 100 bytes each).
pub const RESPONSES_REMEMBERED: usize = 100_000;
/// Longest wait for a pass-through call's response headers.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Which backend created each recent Responses API response, for whom.
#[derive(Debug, Default)]
pub struct ResponseOrigins {
    inner: Mutex<Origins>,
}

#[derive(Debug, Default)]
struct Origins {
    by_id: HashMap<Box<str>, Origin>,
    /// Ids in the order they were remembered (so also of expiry).
    order: VecDeque<(Instant, Box<str>)>,
}

#[derive(Debug, Clone, Copy)]
struct Origin {
    backend: BackendId,
    tenant: TenantId,
    at: Instant,
}

impl ResponseOrigins {
    /// Remembers that `backend` created response `id` for `tenant`.
    pub fn remember(&self, now: Instant, id: &str, backend: BackendId, tenant: TenantId) {
        let mut o = self.inner.lock();
        o.forget_old(now, 1);
        let id: Box<str> = id.into();
        o.order.push_back((now, id.clone()));
        o.by_id.insert(
            id,
            Origin {
                backend,
                tenant,
                at: now,
            },
        );
    }

    /// The backend that created `id`, if it did so for `tenant`.
    pub fn find(&self, now: Instant, id: &str, tenant: TenantId) -> Option<BackendId> {
        let mut o = self.inner.lock();
        o.forget_old(now, 0);
        o.by_id
            .get(id)
            .filter(|origin| origin.tenant == tenant)
            .map(|origin| origin.backend)
    }

    /// Ids remembered now.
    pub fn len(&self) -> usize {
        self.inner.lock().by_id.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Origins {
    /// Forgets ids older than [`RESPONSE_MEMORY`], and the oldest until
    /// `room` more fit.
    fn forget_old(&mut self, now: Instant, room: usize) {
        while let Some((at, _)) = self.order.front() {
            let expired = now.saturating_since(*at) >= RESPONSE_MEMORY;
            if !expired && self.order.len() + room <= RESPONSES_REMEMBERED {
                break;
            }
            if let Some((at, id)) = self.order.pop_front()
                && self.by_id.get(&id).is_some_and(|o| o.at == at)
            {
                // Not remembered again since.
                self.by_id.remove(&id);
            }
        }
    }
}

/// `/v1/responses/{id}[/...]`: the id in the path, if it is one.
pub fn response_id(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/responses/")?;
    let id = rest.split('/').next().unwrap_or(rest);
    (!id.is_empty()).then_some(id)
}

/// Forwards a call on a stored response to the backend that created it.
pub async fn stored_response(gw: Arc<Gateway>, req: Request<RequestBody>) -> Response<BoxBody> {
    let live = gw.live.load_full();
    let origin = authenticate(&live, req.headers()).and_then(|tenant| {
        let id = response_id(req.uri().path()).ok_or(ApiError::NotFound)?;
        gw.responses
            .find(gw.clock.now(), id, tenant)
            .ok_or_else(|| ApiError::UnknownResponse(id.to_owned()))
    });
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
    let live = gw.live.load_full();
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
        crate::proxy::dispatch::read_body(req, server.max_body_bytes, server.body_read_timeout);
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
        live.policy.server.trust_tenant_header.as_deref(),
        parts,
        path,
        address,
        upstream::whole(body),
    )?;
    let resp = match tokio::time::timeout(TIMEOUT, pool::send(&address.authority, up)).await {
        Err(_) => {
            return Err(ApiError::UpstreamTimeout {
                backend: name,
                timeout: TIMEOUT,
            });
        }
        Ok(Err(e)) => {
            return Err(ApiError::Upstream {
                backend: name,
                cause: e.to_string(),
            });
        }
        Ok(Ok(r)) => r,
    };
    let (mut parts, body) = resp.into_parts();
    upstream::strip_response_headers(&mut parts.headers);
    let body = body.map_err(|e| -> crate::proxy::body::BodyError { Box::new(e) });
    Ok(Response::from_parts(parts, body.boxed_unsync()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_found_by_their_tenant_only_and_forgotten_in_time() {
        let o = ResponseOrigins::default();
        let t0 = Instant::from_nanos(1);
        let (a, b) = (TenantId(0), TenantId(1));
        o.remember(t0, "resp_1", BackendId(3), a);
        assert_eq!(o.find(t0, "resp_1", a), Some(BackendId(3)));
        assert_eq!(o.find(t0, "resp_1", b), None);
        assert_eq!(o.find(t0, "resp_2", a), None);
        let later = t0 + RESPONSE_MEMORY;
        assert_eq!(o.find(later, "resp_1", a), None);
        assert!(o.is_empty());
    }

    #[test]
    fn memory_is_bounded() {
        let o = ResponseOrigins::default();
        let t0 = Instant::from_nanos(1);
        for i in 0..RESPONSES_REMEMBERED + 10 {
            o.remember(t0, &format!("resp_{i}"), BackendId(0), TenantId(0));
        }
        assert_eq!(o.len(), RESPONSES_REMEMBERED);
        assert_eq!(o.find(t0, "resp_0", TenantId(0)), None);
        let last = format!("resp_{}", RESPONSES_REMEMBERED + 9);
        assert_eq!(o.find(t0, &last, TenantId(0)), Some(BackendId(0)));
    }

    #[test]
    fn ids_come_from_the_path() {
        assert_eq!(response_id("/v1/responses/resp_1"), Some("resp_1"));
        assert_eq!(response_id("/v1/responses/resp_1/cancel"), Some("resp_1"));
        assert_eq!(response_id("/v1/responses/"), None);
        assert_eq!(response_id("/v1/responses"), None);
    }
}
