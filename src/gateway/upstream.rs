//! The request Fairway sends a backend, and the response headers it passes
//! back: hop-by-hop headers and the client's credentials for Fairway stay
//! behind.

use bytes::Bytes;
use http::uri::{Authority, PathAndQuery};
use http::{HeaderMap, HeaderName, HeaderValue, Request, header};
use http_body::Body;
use http_body_util::{Either, Full};

use crate::config::ServerPolicy;
use crate::net::headers::{X_FORWARDED_FOR, forwarded_for};
use crate::protocol::error::ApiError;

const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Request headers that never go upstream: hop-by-hop, and the client's
/// credentials for Fairway. (Constants, not strings: every request checks
/// each header against them.)
const DROP_REQUEST_HEADERS: [HeaderName; 13] = [
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("api-key"),
    HeaderName::from_static("x-api-key"),
    header::HOST,
    header::CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::CONTENT_LENGTH,
    header::EXPECT,
];
/// Response headers that never go back to the client: hop-by-hop.
const DROP_RESPONSE_HEADERS: [HeaderName; 7] = [
    header::CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::TRAILER,
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
        h.remove(name);
    }
}

/// What went wrong with a call through hyper-util's client (the pollers'):
/// the underlying error (the connection's), which says more than the
/// client's wrapper.
pub fn cause(e: &hyper_util::client::legacy::Error) -> String {
    std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string())
}

/// A backend request's body: whole, or an upload streamed from the
/// client.
pub type UpBody = Either<Full<Bytes>, crate::protocol::audio::Upload>;

/// A whole body.
pub fn whole(b: impl Into<Bytes>) -> UpBody {
    Either::Left(Full::new(b.into()))
}

/// Where a backend is reached: its authority, and the `Host` header that
/// names it (made once at policy load).
#[derive(Clone, Debug)]
pub struct Address {
    pub authority: Authority,
    pub host: HeaderValue,
}

impl Address {
    /// The address of `authority` (`host:port`), if it is one.
    pub fn parse(authority: &str) -> Option<Address> {
        let authority: Authority = authority.parse().ok()?;
        // As an HTTP client writes it: no user information, and no port
        // when it is the default.
        let host = match authority.port_u16() {
            None | Some(80) => HeaderValue::from_str(authority.host()),
            Some(port) => HeaderValue::from_str(&format!("{}:{port}", authority.host())),
        }
        .ok()?;
        Some(Address { authority, host })
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.authority.fmt(f)
    }
}

/// The request to forward to `address` (see [`crate::gateway::connections::send`]):
/// the client's method, path and headers (less hop-by-hop ones and its
/// credentials for Fairway), `X-Forwarded-For` ending with the client
/// connection's address ([`forwarded_for`]), and `body`.
pub fn request(
    server: &ServerPolicy,
    parts: &http::request::Parts,
    path: &str,
    address: &Address,
    body: UpBody,
) -> Result<Request<UpBody>, ApiError> {
    // Origin form: the connection is the backend's already.
    let uri = PathAndQuery::try_from(path).map_err(|e| ApiError::Internal(e.to_string()))?;
    let mut up = Request::builder()
        .method(parts.method.clone())
        .uri(http::Uri::from(uri));
    let connection = parts.headers.get(header::CONNECTION);
    if let Some(h) = up.headers_mut() {
        h.reserve(parts.headers.len() + 2);
        h.insert(header::HOST, address.host.clone());
        let trust_tenant_header = server.trust_tenant_header.as_deref();
        for (name, value) in &parts.headers {
            if !DROP_REQUEST_HEADERS.contains(name)
                && name != X_FORWARDED_FOR
                && trust_tenant_header != Some(name.as_str())
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
        let given = parts.headers.get_all(X_FORWARDED_FOR).iter();
        if let Some(v) = forwarded_for(given, server.trusted_hops) {
            h.insert(X_FORWARDED_FOR, v);
        }
    }
    up.body(body).map_err(|e| ApiError::Internal(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_names_its_host_as_a_client_would() {
        let host = |a: &str| Address::parse(a).map(|a| a.host);
        assert_eq!(host("10.0.0.7:8000").unwrap(), "10.0.0.7:8000");
        assert_eq!(host("vllm.svc:80").unwrap(), "vllm.svc");
        assert_eq!(host("vllm.svc").unwrap(), "vllm.svc");
        assert_eq!(host("[::1]:9000").unwrap(), "[::1]:9000");
        assert_eq!(host("user:pw@10.0.0.7:8000").unwrap(), "10.0.0.7:8000");
        assert!(host("not an authority").is_none());
    }

    #[test]
    fn the_upstream_request_carries_the_backend_host_not_the_clients() {
        let req = Request::post("/v1/chat/completions")
            .header(header::HOST, "gateway.example")
            .header(header::AUTHORIZATION, "Bearer sk-secret")
            .header("x-kept", "1")
            .header("x-tenant", "evals")
            .body(())
            .unwrap();
        let (parts, ()) = req.into_parts();
        let address = Address::parse("10.0.0.7:8000").unwrap();
        let path = "/v1/chat/completions?x=1";
        let policy = crate::config::parse_policy(
            "[server]\ntrust_tenant_header = \"x-tenant\"\n\
             [[pools]]\nmodel = \"m\"\n[[pools.backends]]\nurl = \"http://a:1\"\n",
            "p.toml",
        )
        .unwrap();
        let up = request(&policy.server, &parts, path, &address, whole("{}")).unwrap();
        assert_eq!(up.uri(), "/v1/chat/completions?x=1");
        assert_eq!(up.headers()[header::HOST], "10.0.0.7:8000");
        assert_eq!(up.headers()[header::CONTENT_LENGTH], "2");
        assert_eq!(up.headers()["x-kept"], "1");
        assert!(up.headers().get(header::AUTHORIZATION).is_none());
        assert!(up.headers().get("x-tenant").is_none());
    }

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
