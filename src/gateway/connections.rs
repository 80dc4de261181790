//! The connections to the backends, kept by the thread that uses them.
//!
//! Each thread that sends requests upstream (in practice, the workers)
//! keeps its own idle HTTP/1 connections, by backend address: a
//! connection is made, used and reused by one thread, with no lock and no
//! task besides the connection's own. hyper-util's pool, used before,
//! shares one pool among all threads behind a lock, hashes a key at each
//! checkout and spawns a task per request to wait for the connection to be
//! free again: together about 3.5 % of the gateway's CPU under load
//! (docs/benchmarks/2026-12-05.md).
//!
//! What it keeps of that pool:
//! - a connection goes back to its pool when its response's body has
//!   ended (HTTP/1 carries one exchange at a time), and is closed when the
//!   body is dropped before its end or fails;
//! - a request that a pooled connection could not take (the backend
//!   closed it while it sat idle) is sent again on a new connection; a
//!   request that was written is never sent twice;
//! - idle connections are closed after [`IDLE_TIMEOUT`], and at most
//!   [`MAX_IDLE`] are kept per backend;
//! - connecting takes at most [`CONNECT_TIMEOUT`], with `TCP_NODELAY`,
//!   trying each address the name resolves to in turn.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::uri::Authority;
use http::{Request, Response};
use http_body::Frame;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::gateway::upstream::UpBody;
use crate::net::client::{CONNECT_TIMEOUT, IDLE_TIMEOUT, MAX_IDLE};

use crate::protocol::upstream::UpstreamError;

/// Reads from a backend go into a buffer of this size rather than hyper's
/// adaptive one (8 KiB to start): every held stream keeps its upstream
/// connection's buffer, and the smaller one saves about 1 KiB of RSS per
/// idle stream at no measured CPU cost (docs/benchmarks/2026-12-04.md).
const READ_BUFFER: usize = 4096;

type Sender = http1::SendRequest<UpBody>;

struct Idle {
    sender: Sender,
    since: Instant,
}

/// A thread's idle connections, by backend.
#[derive(Default)]
struct IdleByBackend {
    idle: HashMap<Authority, VecDeque<Idle>>,
}

thread_local! {
    static POOL: RefCell<IdleByBackend> = RefCell::new(IdleByBackend::default());
}

impl IdleByBackend {
    /// The most recently used connection to `authority` that is ready for
    /// a request. The ones passed over (closed, idle too long, or not
    /// ready, which does not happen in practice: a connection is given
    /// back once its exchange is over) are dropped.
    fn take(&mut self, authority: &Authority, now: Instant) -> Option<Sender> {
        let idle = self.idle.get_mut(authority)?;
        while let Some(c) = idle.pop_back() {
            if c.sender.is_ready() && now.duration_since(c.since) < IDLE_TIMEOUT {
                return Some(c.sender);
            }
        }
        None
    }

    fn put(&mut self, authority: Authority, sender: Sender, now: Instant) {
        if sender.is_closed() {
            return;
        }
        let idle = self.idle.entry(authority).or_default();
        // The oldest are at the front.
        while idle
            .front()
            .is_some_and(|c| now.duration_since(c.since) >= IDLE_TIMEOUT || c.sender.is_closed())
            || idle.len() >= MAX_IDLE
        {
            idle.pop_front();
        }
        idle.push_back(Idle { sender, since: now });
    }

    /// Drops the connections that are closed or have been idle too long.
    fn sweep(&mut self, now: Instant) {
        self.idle.retain(|_, idle| {
            idle.retain(|c| !c.sender.is_closed() && now.duration_since(c.since) < IDLE_TIMEOUT);
            !idle.is_empty()
        });
    }
}

/// Closes this thread's connections that have sat idle past
/// [`IDLE_TIMEOUT`]; run now and then by each worker.
pub fn sweep() {
    let now = Instant::now();
    POOL.with(|p| p.borrow_mut().sweep(now));
}

/// Idle connections this thread holds.
#[cfg(test)]
fn idle_count() -> usize {
    POOL.with(|p| p.borrow().idle.values().map(VecDeque::len).sum())
}

/// Sends `req` (its URI in origin form, its `Host` set) to the backend at
/// `authority`, on an idle connection of this thread's or a new one.
pub async fn send(
    authority: &Authority,
    req: Request<UpBody>,
) -> Result<Response<Body>, UpstreamError> {
    let pooled = POOL.with(|p| p.borrow_mut().take(authority, Instant::now()));
    let req = match pooled {
        Some(mut sender) => match sender.try_send_request(req).await {
            Ok(resp) => return Ok(Body::wrap(resp, authority, sender)),
            Err(mut e) => match e.take_message() {
                // Not written: the connection was closing.
                Some(req) => req,
                None => return Err(e.into_error().into()),
            },
        },
        None => req,
    };
    let mut sender = connect(authority).await?;
    let resp = sender.send_request(req).await?;
    Ok(Body::wrap(resp, authority, sender))
}

/// Opens a connection to `authority` and starts driving it on this
/// thread's runtime.
async fn connect(authority: &Authority) -> Result<Sender, UpstreamError> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, open(authority))
        .await
        .map_err(|_| UpstreamError::ConnectTimeout {
            authority: authority.clone(),
            after: CONNECT_TIMEOUT,
        })?
        .map_err(|source| UpstreamError::Connect {
            authority: authority.clone(),
            source,
        })?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = http1::Builder::new()
        .read_buf_exact_size(Some(READ_BUFFER))
        .handshake(TokioIo::new(stream))
        .await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "backend connection ended");
        }
    });
    Ok(sender)
}

/// A TCP connection to the first address of `authority` that answers.
async fn open(authority: &Authority) -> std::io::Result<TcpStream> {
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port = authority.port_u16().unwrap_or(80);
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        match TcpStream::connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, "the name has no address")
    }))
}

/// A backend's response body; when it ends, its connection goes back to
/// the pool of the thread that reads it.
pub struct Body {
    inner: Incoming,
    back: Option<(Authority, Sender)>,
}

impl Body {
    fn wrap(resp: Response<Incoming>, authority: &Authority, sender: Sender) -> Response<Body> {
        resp.map(|inner| {
            let mut body = Body {
                inner,
                back: Some((authority.clone(), sender)),
            };
            // A body with nothing in it (a 204, a HEAD) has ended already.
            if http_body::Body::is_end_stream(&body.inner) {
                body.give_back();
            }
            body
        })
    }

    /// The exchange is over: the connection may carry the next.
    fn give_back(&mut self) {
        if let Some((authority, sender)) = self.back.take() {
            POOL.with(|p| p.borrow_mut().put(authority, sender, Instant::now()));
        }
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        match &frame {
            None => self.give_back(),
            // The last frame of a body of known length.
            Some(Ok(_)) if self.inner.is_end_stream() => self.give_back(),
            Some(Ok(_)) => {}
            // A failed connection is not reused.
            Some(Err(_)) => self.back = None,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A backend on port 0 that answers every request with `answer` (raw
    /// HTTP/1 bytes), closing each connection after its `per_conn`th
    /// answer; the second value counts the connections it accepted.
    async fn backend(answer: &'static [u8], per_conn: usize) -> (Authority, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string().parse().unwrap();
        let conns = Arc::new(AtomicUsize::new(0));
        let counted = conns.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    for _ in 0..per_conn {
                        // Each request here is one small read.
                        if matches!(s.read(&mut buf).await, Ok(0) | Err(_)) {
                            return;
                        }
                        if s.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (authority, conns)
    }

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    const CLOSE: &[u8] = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok";
    const CHUNKED: &[u8] =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";

    fn get(authority: &Authority) -> Request<UpBody> {
        Request::get("/")
            .header(http::header::HOST, authority.as_str())
            .body(crate::gateway::upstream::whole(Bytes::new()))
            .unwrap()
    }

    async fn call(authority: &Authority) -> Result<Bytes, UpstreamError> {
        let resp = send(authority, get(authority)).await?;
        Ok(resp.into_body().collect().await?.to_bytes())
    }

    #[tokio::test]
    async fn a_connection_is_reused_once_its_body_has_ended() {
        for answer in [OK, CHUNKED] {
            let (authority, conns) = backend(answer, usize::MAX).await;
            for _ in 0..5 {
                assert_eq!(call(&authority).await.unwrap(), "ok");
            }
            assert_eq!(conns.load(Ordering::Relaxed), 1);
        }
        assert_eq!(idle_count(), 2);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_takes_its_connection_with_it() {
        let (authority, conns) = backend(CHUNKED, usize::MAX).await;
        let resp = send(&authority, get(&authority)).await.unwrap();
        drop(resp);
        assert_eq!(idle_count(), 0);
        assert_eq!(call(&authority).await.unwrap(), "ok");
        assert_eq!(conns.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn requests_to_a_backend_that_closes_its_connections_all_succeed() {
        // Each connection is closed by the backend after one answer, said
        // (`connection: close`) or not; whether the pool has seen the
        // close or only finds the connection unready, the request goes
        // out on a new one.
        for answer in [OK, CLOSE] {
            let (authority, conns) = backend(answer, 1).await;
            for i in 0..50 {
                assert_eq!(call(&authority).await.unwrap(), "ok", "request {i}");
                if i % 2 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            assert_eq!(conns.load(Ordering::Relaxed), 50);
        }
    }

    #[tokio::test]
    async fn a_backend_that_cannot_be_reached_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority: Authority = listener.local_addr().unwrap().to_string().parse().unwrap();
        drop(listener);
        let e = call(&authority).await.unwrap_err();
        assert!(e.is_connect(), "{e}");
        assert!(e.to_string().contains(authority.as_str()), "{e}");
    }

    #[tokio::test]
    async fn idle_connections_expire() {
        let (authority, _) = backend(OK, usize::MAX).await;
        call(&authority).await.unwrap();
        let now = Instant::now();
        POOL.with(|p| {
            let mut p = p.borrow_mut();
            let sender = p.take(&authority, now).unwrap();
            p.put(authority.clone(), sender, now);
            assert!(p.take(&authority, now + IDLE_TIMEOUT).is_none());
            assert_eq!(p.idle.get(&authority).map_or(0, VecDeque::len), 0);
        });
        call(&authority).await.unwrap();
        POOL.with(|p| p.borrow_mut().sweep(Instant::now() + IDLE_TIMEOUT));
        assert_eq!(idle_count(), 0);
    }
}
