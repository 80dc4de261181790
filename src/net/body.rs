//! Response body type shared by the proxy: boxed, so relayed streams and
//! generated error bodies have one type.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

/// The error type of every body we serve.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed response body.
pub type BoxBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BodyError>;

/// A client request's body, as the edge hands it on: capped at the
/// policy's `max_body_bytes`.
pub type RequestBody = http_body_util::Limited<hyper::body::Incoming>;

/// A complete body from bytes.
pub fn full(b: impl Into<Bytes>) -> BoxBody {
    Full::new(b.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A JSON body.
pub fn json(v: &serde_json::Value) -> BoxBody {
    full(v.to_string())
}
