//! Once shutdown starts, a request that still arrives on an open connection
//! is answered 503 (`retry-after: 1`) and counted `shed`; the load balancer
//! sends the retry to another replica.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{Either, Ready, ready};
use http::{Request, Response};
use tower::{Layer, Service};

use crate::gateway::state::Gateway;
use crate::gateway::ticket::refuse;
use crate::net::body::BoxBody;
use crate::protocol::error::ApiError;

/// Adds [`Drain`].
#[derive(Clone)]
pub struct DrainLayer {
    gw: Arc<Gateway>,
}

impl DrainLayer {
    pub fn new(gw: Arc<Gateway>) -> Self {
        DrainLayer { gw }
    }
}

impl<S> Layer<S> for DrainLayer {
    type Service = Drain<S>;
    fn layer(&self, inner: S) -> Drain<S> {
        Drain {
            gw: self.gw.clone(),
            inner,
        }
    }
}

/// Refuses requests while the gateway drains.
#[derive(Clone)]
pub struct Drain<S> {
    gw: Arc<Gateway>,
    inner: S,
}

impl<S, B> Service<Request<B>> for Drain<S>
where
    B: http_body::Body,
    S: Service<Request<B>, Response = Response<BoxBody>>,
{
    type Response = Response<BoxBody>;
    type Error = S::Error;
    type Future = Either<Ready<Result<Response<BoxBody>, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if self.gw.is_draining() {
            return Either::Left(ready(Ok(refuse(&self.gw, &req, ApiError::Draining))));
        }
        Either::Right(self.inner.call(req))
    }
}
