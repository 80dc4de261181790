//! Response body type shared by the proxy: boxed, so relayed streams and
//! generated error bodies have one type.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

/// The error type of every body we serve.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed response body.
pub type BoxBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BodyError>;

/// A request's body as the request path reads it: a client's, capped at
/// the policy's `max_body_bytes` by the edge, or one made in the process
/// (an item of a batch the gateway runs).
#[derive(Debug)]
pub enum RequestBody {
    Client(http_body_util::Limited<hyper::body::Incoming>),
    Local(Full<Bytes>),
}

impl RequestBody {
    /// A body made in the process.
    pub fn local(b: impl Into<Bytes>) -> Self {
        RequestBody::Local(Full::new(b.into()))
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            RequestBody::Client(b) => std::pin::Pin::new(b).poll_frame(cx),
            RequestBody::Local(b) => std::pin::Pin::new(b)
                .poll_frame(cx)
                .map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Client(b) => b.is_end_stream(),
            RequestBody::Local(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            RequestBody::Client(b) => b.size_hint(),
            RequestBody::Local(b) => b.size_hint(),
        }
    }
}

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
