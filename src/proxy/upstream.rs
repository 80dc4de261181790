//! The request Fairway sends a backend, and the response headers it passes
//! back: hop-by-hop headers and the client's credentials for Fairway stay
//! behind.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, header};
use http_body::Body;
use http_body_util::{Either, Full};

use crate::proxy::error::ApiError;
use crate::proxy::gateway::Live;

/// Request headers that never go upstream: hop-by-hop, and the client's
/// credentials for Fairway.
const DROP_REQUEST_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "api-key",
    "x-api-key",
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

/// True when `connection` lists `name` (RFC 9110 §7.6.1: such headers are
/// hop-by-hop too, whatever their name).
fn named_in_connection(connection: Option<&HeaderValue>, name: &str) -> bool {
    connection
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(name)))
}

/// Removes the hop-by-hop headers from a backend's response, including
/// those its `Connection` header names.
pub fn strip_response_headers(h: &mut HeaderMap) {
    if let Some(listed) = h.get(header::CONNECTION).and_then(|v| v.to_str().ok()) {
        let listed: Vec<String> = listed.split(',').map(|t| t.trim().to_owned()).collect();
        for name in listed {
            h.remove(name.as_str());
        }
    }
    for name in DROP_RESPONSE_HEADERS {
        h.remove(*name);
    }
}

/// What went wrong with a call to a backend: the underlying error (the
/// connection's), which says more than the client's wrapper.
pub fn cause(e: &hyper_util::client::legacy::Error) -> String {
    std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string())
}

/// A backend request's body: whole, or an upload streamed from the
/// client.
pub type UpBody = Either<Full<Bytes>, crate::proxy::audio::Upload>;

/// A whole body.
pub fn whole(b: impl Into<Bytes>) -> UpBody {
    Either::Left(Full::new(b.into()))
}

/// The request to forward: the client's method, path and headers (less
/// hop-by-hop ones and its credentials for Fairway) and `body`.
pub fn request(
    live: &Live,
    parts: &http::request::Parts,
    path: &str,
    authority: &str,
    body: UpBody,
) -> Result<Request<UpBody>, ApiError> {
    let mut up = Request::builder()
        .method(parts.method.clone())
        .uri(format!("http://{authority}{path}"));
    let connection = parts.headers.get(header::CONNECTION);
    if let Some(h) = up.headers_mut() {
        for (name, value) in &parts.headers {
            if !DROP_REQUEST_HEADERS.contains(&name.as_str())
                && live.policy.server.trust_tenant_header.as_deref() != Some(name.as_str())
                && !named_in_connection(connection, name.as_str())
            {
                h.append(name.clone(), value.clone());
            }
        }
        // An upload is sent as the client sent it: with its length, or
        // chunked.
        let length = match &body {
            Either::Left(b) => b.size_hint().exact().map(|n| n.to_string()),
            Either::Right(_) => parts
                .headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        };
        if let Some(v) = length.and_then(|l| HeaderValue::from_str(&l).ok()) {
            h.insert(header::CONTENT_LENGTH, v);
        }
    }
    up.body(body).map_err(|e| ApiError::Internal(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_named_in_connection_are_hop_by_hop() {
        let c = HeaderValue::from_static("keep-alive, X-Secret");
        assert!(named_in_connection(Some(&c), "x-secret"));
        assert!(!named_in_connection(Some(&c), "x-other"));
        assert!(!named_in_connection(None, "x-secret"));
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, c);
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_response_headers(&mut h);
        assert!(h.get("x-secret").is_none() && h.get(header::CONNECTION).is_none());
        assert!(h.get("x-kept").is_some());
    }
}
