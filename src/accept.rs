//! The accept loop of Fairway's small plain-HTTP servers (the simulated
//! backend and the GPU-node agent): HTTP/1.1 and h2c on one port, every
//! connection watched for a graceful drain.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Serves each connection accepted on `listener` with `handle` until
/// `shutdown` resolves. Connection tasks go into `tasks` and are watched by
/// `graceful`, so the caller drains (or aborts) them as it needs. A failed
/// accept (out of file descriptors and the like) backs off and keeps
/// serving; `what` names the server in that log line.
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
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::debug!(error = %e, "{what} accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let svc = service_fn(handle.clone());
                let conn = builder.serve_connection(TokioIo::new(stream), svc).into_owned();
                let conn = graceful.watch(conn);
                tasks.spawn(async move {
                    // A client that resets mid-response is normal here.
                    let _ = conn.await;
                });
            }
        }
        while tasks.try_join_next().is_some() {}
    }
}
