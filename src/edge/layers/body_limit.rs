//! `[server] max_body_bytes` (`max_upload_bytes` on the audio upload
//! routes): a body whose `Content-Length` is over the
//! limit is answered 413 before a byte of it is read; any other body is
//! wrapped in [`Limited`], so the handler's read stops at the limit (and
//! answers 413 then). The limit is read from the live policy on every
//! request, so a reload changes it; tower-http's `RequestBodyLimit` fixes it
//! when the stack is built and answers in its own body shape, which is why
//! this one is ours.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{Either, Ready, ready};
use http::{Request, Response, header};
use http_body_util::Limited;
use tower::{Layer, Service};

use crate::gateway::state::Gateway;
use crate::gateway::ticket::refuse;
use crate::net::body::{BoxBody, RequestBody};
use crate::protocol::error::ApiError;

/// Adds [`BodyLimit`].
#[derive(Clone)]
pub struct BodyLimitLayer {
    gw: Arc<Gateway>,
}

impl BodyLimitLayer {
    pub fn new(gw: Arc<Gateway>) -> Self {
        BodyLimitLayer { gw }
    }
}

impl<S> Layer<S> for BodyLimitLayer {
    type Service = BodyLimit<S>;
    fn layer(&self, inner: S) -> BodyLimit<S> {
        BodyLimit {
            gw: self.gw.clone(),
            inner,
        }
    }
}

/// Room for a file upload's form around the file itself.
const FORM_OVERHEAD: u64 = 64 << 10;

/// The largest body a request to `path` may send.
pub fn body_limit(policy: &crate::config::Policy, path: &str) -> usize {
    let server = &policy.server;
    if crate::protocol::audio::is_upload_route(path) {
        server.max_upload_bytes
    } else if path == "/v1/files"
        && let Some(b) = &policy.batch
    {
        usize::try_from(b.max_file_bytes.saturating_add(FORM_OVERHEAD)).unwrap_or(usize::MAX)
    } else {
        server.max_body_bytes
    }
}

/// Caps the request body at the policy's `max_body_bytes`.
#[derive(Clone)]
pub struct BodyLimit<S> {
    gw: Arc<Gateway>,
    inner: S,
}

impl<S> Service<Request<hyper::body::Incoming>> for BodyLimit<S>
where
    S: Service<Request<RequestBody>, Response = Response<BoxBody>>,
{
    type Response = Response<BoxBody>;
    type Error = S::Error;
    type Future = Either<Ready<Result<Response<BoxBody>, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<hyper::body::Incoming>) -> Self::Future {
        let limit = body_limit(&self.gw.live().policy, req.uri().path());
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|len| len > limit as u64) {
            return Either::Left(ready(Ok(refuse(
                &self.gw,
                &req,
                ApiError::BodyTooLarge(limit),
            ))));
        }
        Either::Right(
            self.inner
                .call(req.map(|b| RequestBody::Client(Limited::new(b, limit)))),
        )
    }
}
