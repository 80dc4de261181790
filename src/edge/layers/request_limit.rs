//! `[server] max_requests`: the most client requests in flight at once on
//! the whole listener. A request over it is answered 503 at once
//! (`retry-after: 1`, counted `shed` and in
//! `fairway_listener_refusals_total{limit="requests"}`), never queued: the
//! fair queue is where waiting happens, and it needs the parsed request.
//!
//! The slot is held until the response body ends, not until its headers:
//! a streamed completion is in flight for as long as it streams. tower's
//! `ConcurrencyLimit` releases at the headers and waits rather than
//! refuses, which is why this one is ours.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::future::{Either, Ready};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Layer, Service};

use crate::gateway::state::Gateway;
use crate::gateway::ticket::refuse;
use crate::net::body::{BodyError, BoxBody};
use crate::protocol::error::ApiError;

/// Adds [`RequestLimit`]; its clones share one set of slots.
#[derive(Clone)]
pub struct RequestLimitLayer {
    gw: Arc<Gateway>,
    slots: Arc<Semaphore>,
    max: usize,
}

impl RequestLimitLayer {
    pub fn new(gw: Arc<Gateway>, max: usize) -> Self {
        RequestLimitLayer {
            gw,
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }
}

impl<S> Layer<S> for RequestLimitLayer {
    type Service = RequestLimit<S>;
    fn layer(&self, inner: S) -> RequestLimit<S> {
        RequestLimit {
            limit: self.clone(),
            inner,
        }
    }
}

/// Refuses a request when every slot is taken.
#[derive(Clone)]
pub struct RequestLimit<S> {
    limit: RequestLimitLayer,
    inner: S,
}

impl<S, B> Service<Request<B>> for RequestLimit<S>
where
    B: http_body::Body,
    S: Service<Request<B>, Response = Response<BoxBody>>,
{
    type Error = S::Error;
    type Response = Response<PermitBody>;
    type Future = Either<Ready<Result<Response<PermitBody>, S::Error>>, Held<S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        match self.limit.slots.clone().try_acquire_owned() {
            Ok(permit) => Either::Right(Held {
                inner: self.inner.call(req),
                permit: Some(permit),
            }),
            Err(_) => {
                let gw = &self.limit.gw;
                gw.metrics()
                    .edge
                    .refused_requests
                    .fetch_add(1, Ordering::Relaxed);
                let resp = refuse(gw, &req, ApiError::Overloaded(self.limit.max));
                let resp = resp.map(|body| PermitBody {
                    body,
                    _permit: None,
                });
                Either::Left(futures_util::future::ready(Ok(resp)))
            }
        }
    }
}

pin_project! {
    /// The inner response future, holding the request's slot; the slot
    /// moves into the response body.
    pub struct Held<F> {
        #[pin]
        inner: F,
        permit: Option<OwnedSemaphorePermit>,
    }
}

impl<F, E> Future for Held<F>
where
    F: Future<Output = Result<Response<BoxBody>, E>>,
{
    type Output = Result<Response<PermitBody>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let resp = ready!(this.inner.poll(cx))?;
        let permit = this.permit.take();
        Poll::Ready(Ok(resp.map(|body| PermitBody {
            body,
            _permit: permit,
        })))
    }
}

pin_project! {
    /// A response body that frees its request's slot when it is dropped
    /// (ended, or abandoned by the client).
    pub struct PermitBody {
        #[pin]
        body: BoxBody,
        _permit: Option<OwnedSemaphorePermit>,
    }
}

impl Body for PermitBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
