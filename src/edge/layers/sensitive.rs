//! Credentials marked sensitive, so that no layer or log can print them
//! (`HeaderValue`'s `Debug` shows `Sensitive`, and HTTP/2 never indexes
//! them): `authorization`, `proxy-authorization`, `api-key`, Anthropic's
//! `x-api-key` and `cookie` on requests, `set-cookie` on responses.
//!
//! One pass over the headers each way, rather than tower-http's
//! `SetSensitive{Request,Response}Headers`, which look each name up with
//! the entry API (five hash lookups per request); with them the edge cost
//! about 600 more instructions per request under callgrind (see
//! `docs/benchmarks/2026-12-03.md`, "Issue 12").

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::header::{AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION, SET_COOKIE};
use http::{HeaderMap, HeaderName, Request, Response};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

const API_KEY: HeaderName = HeaderName::from_static("api-key");
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// Built once: a `const` array would build its names on every use.
static REQUEST: [HeaderName; 5] = [
    AUTHORIZATION,
    PROXY_AUTHORIZATION,
    API_KEY,
    X_API_KEY,
    COOKIE,
];
static RESPONSE: [HeaderName; 1] = [SET_COOKIE];

fn mark(headers: &mut HeaderMap, names: &[HeaderName]) {
    for (name, value) in headers.iter_mut() {
        if names.contains(name) {
            value.set_sensitive(true);
        }
    }
}

/// Adds [`Sensitive`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SensitiveLayer;

impl<S> Layer<S> for SensitiveLayer {
    type Service = Sensitive<S>;
    fn layer(&self, inner: S) -> Sensitive<S> {
        Sensitive { inner }
    }
}

/// Marks credentials sensitive on the request and the response.
#[derive(Clone, Debug)]
pub struct Sensitive<S> {
    inner: S,
}

impl<S, B, R> Service<Request<B>> for Sensitive<S>
where
    S: Service<Request<B>, Response = Response<R>>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = MarkResponse<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        mark(req.headers_mut(), &REQUEST);
        MarkResponse {
            inner: self.inner.call(req),
        }
    }
}

pin_project! {
    /// The inner response future; marks `set-cookie` on the response.
    pub struct MarkResponse<F> {
        #[pin]
        inner: F,
    }
}

impl<F, R, E> Future for MarkResponse<F>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut resp = ready!(self.project().inner.poll(cx))?;
        mark(resp.headers_mut(), &RESPONSE);
        Poll::Ready(Ok(resp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn credentials_are_marked_and_other_headers_are_not() {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        h.insert(API_KEY, HeaderValue::from_static("k"));
        h.insert(X_API_KEY, HeaderValue::from_static("k"));
        h.append(COOKIE, HeaderValue::from_static("a=1"));
        h.append(COOKIE, HeaderValue::from_static("b=2"));
        h.insert("x-other", HeaderValue::from_static("v"));
        mark(&mut h, &REQUEST);
        assert!(h[AUTHORIZATION].is_sensitive());
        assert!(h[API_KEY].is_sensitive());
        assert!(h[X_API_KEY].is_sensitive());
        assert!(h.get_all(COOKIE).iter().all(HeaderValue::is_sensitive));
        assert!(!h["x-other"].is_sensitive());
        assert_eq!(format!("{:?}", h[AUTHORIZATION]), "Sensitive");
    }
}
