//! Client connections: the workers, each accepting on its own socket of
//! the client port, and what a worker does with a connection it accepted
//! (its caps, TLS, the protocol from its first bytes, the tower stack, its
//! end logged and counted).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::Service;
use tracing::instrument::WithSubscriber;

use crate::edge::conn;
use crate::edge::services::Services;
use crate::gateway::state::Gateway;
use crate::net::accept::accept_loop;
use crate::net::body::BodyError;
use crate::net::tls;

/// `[server] max_connections`, lowered to what the file-descriptor limit
/// allows (with a warning).
pub(super) fn connection_limit(configured: usize) -> usize {
    match conn::fd_connection_limit() {
        Some(fd_cap) if fd_cap < configured => {
            tracing::warn!(
                max_connections = fd_cap,
                configured,
                reserve = conn::FD_RESERVE,
                "the file-descriptor limit lowers max_connections (raise it with `ulimit -n`)"
            );
            fd_cap.max(1)
        }
        _ => configured,
    }
}

/// What the client connections are served with.
pub(super) struct ClientConnections<E> {
    pub(super) services: Arc<Services>,
    /// The tower stack every request passes.
    pub(super) edge: E,
    pub(super) caps: conn::Caps,
    /// Shared, not cloned per connection: a connection whose protocol the
    /// first bytes tell keeps no builder of its own.
    pub(super) builders: Arc<Builders>,
    /// Cancelled when the drain starts.
    pub(super) drain: CancellationToken,
    pub(super) header_read_timeout: Duration,
    pub(super) idle_timeout: Duration,
}

/// What a worker does with a connection it accepted: the connection's
/// whole life, as a task for that worker's runtime (past its caps, it is
/// closed at once).
pub(super) fn client_connections<E, B>(c: ClientConnections<E>) -> Accepted
where
    E: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    E::Future: Send + 'static,
    B: http_body::Body<Data = Bytes, Error = BodyError> + Send + 'static,
{
    let ClientConnections {
        services,
        edge,
        caps,
        builders,
        drain,
        header_read_timeout,
        idle_timeout,
    } = c;
    let gw = services.gateway.clone();
    Arc::new(move |stream: TcpStream, peer: SocketAddr| {
        let activity = conn::Activity::new();
        let slot = match caps.acquire(peer.ip(), &activity, &gw) {
            Ok(slot) => slot,
            Err(cap) => {
                connection_refused(&gw, peer, cap);
                return None;
            }
        };
        let tracked = conn::Tracked::new(edge.clone(), activity.clone(), peer, Some(gw.clone()));
        let svc = TowerToHyperService::new(tracked);
        let builders = builders.clone();
        let stop = drain.clone();
        let tls = services.tls.load_full();
        let dispatch = gw.traces().map(|t| t.dispatch().clone());
        let conn_gw = gw.clone();
        let (first_request, closing_gw) = (activity.clone(), gw.clone());
        let serve = async move {
            let ended = match tls {
                None => {
                    // hyper's header-read timeout starts once it knows
                    // the protocol, which it learns from the first
                    // bytes: a client that sends none is closed here.
                    // The bytes seen tell the protocol too.
                    let mut head = [0u8; H2_PREFACE.len()];
                    let first = tokio::time::timeout(header_read_timeout, stream.peek(&mut head));
                    let Ok(Ok(seen @ 1..)) = first.await else {
                        tracing::debug!(%peer, "closed: no request in time");
                        return;
                    };
                    let builder = builders.for_first_bytes(&head[..seen]);
                    let conn = builder.serve_connection(TokioIo::new(stream), svc);
                    conn::drive(conn.into_owned(), &activity, idle_timeout, &stop).await
                }
                Some(config) => {
                    // The handshake runs in the connection's own task, so a
                    // slow client never holds up the accept loop.
                    let Some(tls_stream) = tls::handshake(config, stream, peer).await else {
                        return;
                    };
                    let io = TokioIo::new(tls_stream);
                    let conn = builders.auto.serve_connection(io, svc);
                    conn::drive(conn.into_owned(), &activity, idle_timeout, &stop).await
                }
            };
            connection_ended(&conn_gw, peer, ended);
        };
        // Until its first request that authenticates, a connection may be
        // pushed out by newer ones (`conn::Caps`) and has
        // `header_read_timeout` to send it, HTTP/2 included (hyper's
        // header timeout is HTTP/1's only).
        let serve = async move {
            let unproven = async {
                tokio::select! {
                    () = slot.evicted() => {}
                    () = tokio::time::sleep(header_read_timeout) => {}
                }
            };
            let mut serve = std::pin::pin!(serve);
            tokio::select! {
                () = serve.as_mut() => return,
                () = unproven, if !first_request.proven() => {}
            }
            if first_request.proven() {
                // Proven in the meantime: it keeps its slot.
                serve.await;
            } else {
                closing_gw
                    .metrics()
                    .edge
                    .evicted_unproven
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%peer, "closed: no request in time, or pushed out by newer connections");
            }
            drop(slot);
        };
        // With traces on, the connection runs under the gateway's
        // dispatch: its requests' spans and log lines are one tree.
        Some(match dispatch {
            None => Box::pin(serve) as ConnTask,
            Some(d) => Box::pin(serve.with_subscriber(d)),
        })
    })
}

/// What an HTTP/2 client sends first (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The client listener's connection builders: by protocol, and the one
/// that reads the first bytes to tell.
pub(super) struct Builders {
    auto: auto::Builder<TokioExecutor>,
    http1: auto::Builder<TokioExecutor>,
    http2: auto::Builder<TokioExecutor>,
}

impl Builders {
    pub(super) fn new(auto: &auto::Builder<TokioExecutor>) -> Builders {
        Builders {
            auto: auto.clone(),
            http1: auto.clone().http1_only(),
            http2: auto.clone().http2_only(),
        }
    }

    /// The builder for a plain-text connection whose first bytes are
    /// `seen` (peeked, still unread): HTTP/1 unless they begin the h2
    /// preface, h2 when they are all of it. On a part of it, the auto
    /// builder reads on to tell; otherwise hyper reads the request at
    /// once, without a read of its own for the preface first.
    fn for_first_bytes(&self, seen: &[u8]) -> &auto::Builder<TokioExecutor> {
        if !H2_PREFACE.starts_with(seen) {
            &self.http1
        } else if seen.len() == H2_PREFACE.len() {
            &self.http2
        } else {
            &self.auto
        }
    }
}

/// A client connection's whole life, ready to run on a worker.
pub(super) type ConnTask = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Makes the task for a connection a worker accepted; `None`: refused at
/// a cap (and counted).
pub(super) type Accepted = Arc<dyn Fn(TcpStream, SocketAddr) -> Option<ConnTask> + Send + Sync>;

/// Counts a failed accept.
pub(super) fn accept_error(gw: &Gateway) {
    gw.metrics()
        .edge
        .accept_errors
        .fetch_add(1, Ordering::Relaxed);
}

/// The threads that serve client connections: each runs a current-thread
/// runtime of its own, with its own backend connections, accepts on its own
/// socket of the client listener (`SO_REUSEPORT`) and serves what it
/// accepts until close. A connection's accept, its requests' reads, their
/// scheduling, upstream calls and response writes all happen on one
/// thread, with no hand-off, no work stealing and no cross-thread
/// wake-ups between them; the scheduler, the policy and the metrics are
/// shared.
pub(super) struct Workers {
    done: Vec<tokio::sync::oneshot::Receiver<()>>,
}

impl Workers {
    pub(super) fn start(
        sockets: Vec<std::net::TcpListener>,
        accepted: &Accepted,
        shutdown: &CancellationToken,
        gw: &Arc<Gateway>,
    ) -> Workers {
        let mut done = Vec::new();
        for (i, socket) in sockets.into_iter().enumerate() {
            let (done_tx, done_rx) = tokio::sync::oneshot::channel();
            let (accepted, shutdown, gw) = (accepted.clone(), shutdown.clone(), gw.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("fairway-worker-{i}"))
                .spawn(move || {
                    match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt.block_on(worker(socket, accepted, shutdown, gw)),
                        Err(e) => tracing::error!(error = %e, "cannot start a worker runtime"),
                    }
                    let _ = done_tx.send(());
                });
            match spawned {
                Ok(_) => done.push(done_rx),
                Err(e) => tracing::error!(error = %e, "cannot start a worker thread"),
            }
        }
        Workers { done }
    }

    /// Waits until every worker has drained: stopped accepting, and its
    /// connections ended or, past `[server] drain_timeout`, cut.
    pub(super) async fn drain(&mut self) {
        for done in &mut self.done {
            let _ = done.await;
        }
    }
}

/// One worker: accepts and serves connections until shutdown, then lets
/// them drain for `[server] drain_timeout` and cuts the rest.
async fn worker(
    socket: std::net::TcpListener,
    accepted: Accepted,
    shutdown: CancellationToken,
    gw: Arc<Gateway>,
) {
    let listener = match TcpListener::from_std(socket) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "a worker cannot listen");
            return;
        }
    };
    let mut conns = JoinSet::new();
    // This thread's idle backend connections are closed in time.
    let sweep = tokio::spawn(async {
        let mut every = tokio::time::interval(crate::net::client::IDLE_TIMEOUT / 3);
        loop {
            every.tick().await;
            crate::gateway::connections::sweep();
        }
    });
    accept_loop(
        &listener,
        shutdown.cancelled(),
        "client listener",
        || accept_error(&gw),
        |stream, peer| {
            while conns.try_join_next().is_some() {}
            if let Some(conn) = accepted(stream, peer) {
                conns.spawn(conn);
            }
        },
    )
    .await;
    drop(listener);
    let timeout = gw.live().policy.server.drain_timeout;
    let all_ended = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(timeout, all_ended).await.is_err() {
        tracing::warn!("drain timeout passed with requests still in flight");
    }
    // Whatever the drain left is cut.
    conns.abort_all();
    while conns.join_next().await.is_some() {}
    sweep.abort();
}

/// Connections refused at a cap, logged at most once a minute (a flood
/// would otherwise flood the log too).
static REFUSALS_LOG: crate::clock::Throttled =
    crate::clock::Throttled::new(Duration::from_secs(60));
/// Connections ended by a client's protocol error, likewise.
static PROTOCOL_ERRORS_LOG: crate::clock::Throttled =
    crate::clock::Throttled::new(Duration::from_secs(60));

/// A connection refused at a cap: closed at once (the client sees a
/// reset), counted, and logged at most once a minute.
fn connection_refused(gw: &Gateway, peer: SocketAddr, cap: conn::CapReached) {
    let edge = &gw.metrics().edge;
    let counter = match cap {
        conn::CapReached::Total => &edge.refused_connections,
        conn::CapReached::PerClient => &edge.refused_per_client,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    if let Some(left_out) = REFUSALS_LOG.allow() {
        tracing::warn!(%peer, refusal = ?cap, left_out, "connection refused at a cap");
    }
}

/// Counts and logs how a client connection ended.
fn connection_ended(gw: &Gateway, peer: SocketAddr, ended: conn::Ended) {
    let edge = &gw.metrics().edge;
    match ended {
        conn::Ended::Closed => {}
        conn::Ended::Idle => {
            edge.closed_idle.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, "closed an idle connection");
        }
        conn::Ended::Error(e) if conn::is_protocol_error(&*e) => {
            edge.closed_protocol_error.fetch_add(1, Ordering::Relaxed);
            if let Some(left_out) = PROTOCOL_ERRORS_LOG.allow() {
                tracing::warn!(
                    %peer, error = %e, left_out,
                    "client connection ended by a protocol error"
                );
            }
        }
        conn::Ended::Error(e) => tracing::debug!(%peer, error = %e, "client connection error"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_first_bytes_pick_the_protocol() {
        let builders = Builders::new(&auto::Builder::new(TokioExecutor::new()));
        let serves = |seen: &[u8]| {
            let b = builders.for_first_bytes(seen);
            (b.is_http1_available(), b.is_http2_available())
        };
        let (http1, http2, either) = ((true, false), (false, true), (true, true));
        assert_eq!(serves(b"POST /v1/chat/completions HTTP/1.1\r\n"), http1);
        assert_eq!(serves(b"GET"), http1);
        assert_eq!(serves(b"PRI * HTTP/1.1"), http1);
        assert_eq!(serves(H2_PREFACE), http2);
        // Too few bytes to tell: read on.
        assert_eq!(serves(b"P"), either);
        assert_eq!(serves(b"PRI * HTTP/2.0\r\n"), either);
    }
}
