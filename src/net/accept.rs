//! The one accept loop, for every listener Fairway serves: the client and
//! admin listeners, the simulated backend and the GPU-node agent.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// First pause after a failed accept; it doubles on each failure in a row.
const BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest pause after a failed accept.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Accepts connections on `listener` until `shutdown` resolves and hands
/// each one to `on_conn` (with `TCP_NODELAY` set). A failed accept (out of
/// file descriptors, say) calls `on_error`, then pauses: 5 ms, doubling up
/// to 1 s while failures continue, so a listener at the fd limit waits
/// for descriptors to free instead of spinning a core on `accept4`. The
/// first failure of a run is logged as a warning; `what` names the
/// listener. Each accept yields, so the tasks `on_conn` spawns run between
/// accepts.
pub(crate) async fn accept_loop(
    listener: &TcpListener,
    shutdown: impl Future<Output = ()>,
    what: &'static str,
    on_error: impl Fn(),
    mut on_conn: impl FnMut(TcpStream, SocketAddr),
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut backoff = BACKOFF_MIN;
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff = BACKOFF_MIN;
                let _ = stream.set_nodelay(true);
                on_conn(stream, peer);
                // The connection's task runs once before the next accept
                // (tokio would take up to 128 in a row): a client that sent
                // its request with its connect is served, or proven, before
                // a flood of accepts behind it can push it out.
                tokio::task::yield_now().await;
            }
            Err(e) => {
                on_error();
                if backoff == BACKOFF_MIN {
                    tracing::warn!(error = %e, "{what}: accept failed; backing off");
                } else {
                    tracing::debug!(error = %e, ?backoff, "{what}: accept failed again");
                }
                tokio::select! {
                    () = &mut shutdown => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// Serves each connection accepted on `listener` with `handle` until
/// `shutdown` resolves (the small plain-HTTP servers: the simulated backend
/// and the agent). Connection tasks go into `tasks` and are watched by
/// `graceful`, so the caller drains (or aborts) them as it needs.
pub(crate) async fn accept_until<H, Fut, B>(
    listener: &TcpListener,
    shutdown: impl Future<Output = ()>,
    graceful: &GracefulShutdown,
    tasks: &mut JoinSet<()>,
    what: &'static str,
    handle: H,
) where
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let builder = auto::Builder::new(TokioExecutor::new());
    accept_loop(
        listener,
        shutdown,
        what,
        || {},
        |stream, _| {
            let svc = service_fn(handle.clone());
            let conn = builder
                .serve_connection(TokioIo::new(stream), svc)
                .into_owned();
            let conn = graceful.watch(conn);
            while tasks.try_join_next().is_some() {}
            tasks.spawn(async move {
                // A client that resets mid-response is normal here.
                let _ = conn.await;
            });
        },
    )
    .await;
}
