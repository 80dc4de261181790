//! `x-request-id` on every request and every response: the client's when
//! it is usable, else one we make.
//!
//! This is one small layer rather than tower-http's `SetRequestId` and
//! `PropagateRequestId` (which this replaced): those keep any id the client
//! sends, however long or odd, and store the id a second time in the
//! request's extensions, a map allocated per request. With them the edge
//! cost about 1,000 more instructions per request under callgrind (see
//! `docs/benchmarks/2026-12-03.md`, "Issue 12").

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{HeaderMap, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::net::headers::X_REQUEST_ID;

/// Longest client id kept; longer ones are replaced.
const MAX_LEN: usize = 128;

/// The client's id if it sent exactly one that is 1–128 visible ASCII
/// characters (it is logged, sent to the backend and echoed back).
fn client_id(h: &HeaderMap) -> Option<&HeaderValue> {
    let mut values = h.get_all(&X_REQUEST_ID).iter();
    let v = values.next()?;
    let b = v.as_bytes();
    let usable = values.next().is_none()
        && !b.is_empty()
        && b.len() <= MAX_LEN
        && b.iter().all(u8::is_ascii_graphic);
    usable.then_some(v)
}

/// A new id: 128 random bits as 32 lowercase hex digits.
pub fn make_id() -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits = rand::random::<u128>();
    let mut id = [0u8; 32];
    for (i, c) in id.iter_mut().enumerate() {
        *c = HEX[((bits >> (124 - 4 * i)) & 0xf) as usize];
    }
    // Hex digits are always a valid header value.
    HeaderValue::from_bytes(&id).unwrap_or(HeaderValue::from_static("0"))
}

/// Adds [`RequestId`].
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestIdLayer;

impl<S> Layer<S> for RequestIdLayer {
    type Service = RequestId<S>;
    fn layer(&self, inner: S) -> RequestId<S> {
        RequestId { inner }
    }
}

/// Sets `x-request-id` on the request (keeping a usable client id) and
/// the same value on the response.
#[derive(Clone, Debug)]
pub struct RequestId<S> {
    inner: S,
}

impl<S, B, R> Service<Request<B>> for RequestId<S>
where
    S: Service<Request<B>, Response = Response<R>>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = WithId<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let id = match client_id(req.headers()) {
            Some(v) => v.clone(),
            None => {
                let v = make_id();
                req.headers_mut().insert(X_REQUEST_ID, v.clone());
                v
            }
        };
        WithId {
            inner: self.inner.call(req),
            id: Some(id),
        }
    }
}

pin_project! {
    /// The inner response future; puts the id on the response.
    pub struct WithId<F> {
        #[pin]
        inner: F,
        id: Option<HeaderValue>,
    }
}

impl<F, R, E> Future for WithId<F>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut resp = ready!(this.inner.poll(cx))?;
        if let Some(id) = this.id.take() {
            resp.headers_mut().insert(X_REQUEST_ID, id);
        }
        Poll::Ready(Ok(resp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(values: &[&[u8]]) -> Option<HeaderValue> {
        let mut h = HeaderMap::new();
        for v in values {
            if let Ok(v) = HeaderValue::from_bytes(v) {
                h.append(X_REQUEST_ID, v);
            }
        }
        client_id(&h).cloned()
    }

    #[test]
    fn keeps_a_usable_client_id_and_drops_the_rest() {
        assert_eq!(
            kept(&[b"abc-123"]).as_ref().map(HeaderValue::as_bytes),
            Some(&b"abc-123"[..])
        );
        assert_eq!(kept(&[]), None);
        assert_eq!(kept(&[b""]), None);
        assert_eq!(kept(&[b"a b"]), None);
        assert_eq!(kept(&[&[b'x'; 129]]), None);
        assert!(kept(&[&[b'x'; 128]]).is_some());
        assert_eq!(kept(&[b"a", b"b"]), None);
        assert_eq!(kept(&[b"caf\xc3\xa9"]), None);
    }

    #[test]
    fn made_ids_are_32_hex_digits_and_differ() {
        let (a, b) = (make_id(), make_id());
        assert_eq!(a.len(), 32);
        assert!(a.as_bytes().iter().all(u8::is_ascii_hexdigit));
        assert_ne!(a, b);
    }
}
