//! The request Fairway sends a backend, and the response headers it passes
//! back: hop-by-hop headers and the client's credentials for Fairway stay
//! behind.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, header};
use http_body_util::Full;

use crate::proxy::error::ApiError;
use crate::proxy::gateway::Live;

/// Request headers that never go upstream: hop-by-hop, and the client's
/// credentials for Fairway.
const DROP_REQUEST_HEADERS: &[&str] = &[
    "authorization",
    "api-key",
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "expect",
];
/// Response headers that never go back to the client: hop-by-hop.
const DROP_RESPONSE_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
];

/// Removes the hop-by-hop headers from a backend's response.
pub fn strip_response_headers(h: &mut HeaderMap) {
    for name in DROP_RESPONSE_HEADERS {
        h.remove(*name);
    }
}

/// The request to forward: the client's method, path and headers (less
/// hop-by-hop ones and its credentials for Fairway) and `body`.
pub fn request(
    live: &Live,
    parts: &http::request::Parts,
    path: &str,
    authority: &str,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, ApiError> {
    let mut up = Request::builder()
        .method(parts.method.clone())
        .uri(format!("http://{authority}{path}"));
    if let Some(h) = up.headers_mut() {
        for (name, value) in &parts.headers {
            if !DROP_REQUEST_HEADERS.contains(&name.as_str())
                && live.policy.server.trust_tenant_header.as_deref() != Some(name.as_str())
            {
                h.append(name.clone(), value.clone());
            }
        }
        if let Ok(v) = HeaderValue::from_str(&body.len().to_string()) {
            h.insert(header::CONTENT_LENGTH, v);
        }
    }
    up.body(Full::new(body))
        .map_err(|e| ApiError::Internal(e.to_string()))
}
