//! Listeners, the client edge, connection serving and shutdown.
//!
//! [`serve`] is the entry point (`fairway serve` and the tests use it):
//! given bound listeners and a policy, it starts the policy's simulated
//! backends, the pollers, the deadline and fairness tasks and the accept
//! loops, serves until its shutdown future resolves, then drains. Every
//! task it spawns is owned and joined before it returns. [`Server`] is the
//! same thing as a handle, for callers that need the gateway while it runs.
//!
//! Connections are served by hyper-util's auto builder, so HTTP/1.1 and h2c
//! (prior knowledge) share one port; with `[server] tls`, rustls terminates
//! TLS first and ALPN picks the protocol. Shutdown stops accepting, lets
//! in-flight responses finish up to `drain_timeout`, then aborts what is
//! left.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tower::Service;
use tracing::instrument::WithSubscriber;

use crate::clock::Clock;
use crate::config::Policy;
use crate::core::fairness::FairnessMeter;
use crate::core::scheduler::Scheduler;
use crate::edge::listeners::{Listeners, worker_sockets};
use crate::edge::services::{PolicySource, Services, start_sims};
use crate::edge::stack::edge;
use crate::edge::{admin, conn, reload};
use crate::gateway::handle::{Gateway, Parts};
use crate::gateway::live::derive_live;
use crate::gateway::scheduling::Scheduling;
use crate::net::accept::accept_loop;
use crate::net::body::BodyError;
use crate::net::tls;
use crate::poller::Pollers;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::otel::Traces;

/// How a served policy is reloaded.
#[derive(Debug, Default)]
pub struct ServeOptions {
    pub source: PolicySource,
    /// Re-read the policy file this often and reload when it changed.
    pub watch: Option<Duration>,
    /// Reload on each signal received here (SIGHUP), installed by the
    /// caller before it announces the listeners.
    pub reload_signal: Option<tokio::signal::unix::Signal>,
    /// The process's log format. With traces on, the gateway serves each
    /// connection under its own dispatch, which then writes logs in this
    /// format too, so log lines carry their request's span (`None`: logs
    /// inside requests are dropped while traces are on; tests).
    pub log: Option<crate::telemetry::LogFormat>,
}

/// Serves `policy` on `listeners` until `shutdown` resolves, then drains
/// in-flight responses (up to `[server] drain_timeout`) and returns once
/// every task it started has ended.
pub async fn serve(
    listeners: Listeners,
    policy: Policy,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let server = Server::from_listeners(listeners, policy, options).await?;
    shutdown.await;
    server.shutdown().await;
    Ok(())
}

/// A running gateway.
pub struct Server {
    addr: SocketAddr,
    admin_addr: SocketAddr,
    services: Arc<Services>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Server {
    /// Binds the policy's listeners and starts serving.
    pub async fn start(policy: Policy, source: PolicySource) -> std::io::Result<Server> {
        let listeners = Listeners::bind(&policy).await?;
        let options = ServeOptions {
            source,
            ..ServeOptions::default()
        };
        Server::from_listeners(listeners, policy, options).await
    }

    /// Starts serving on listeners the caller bound. The client listener
    /// is joined by a socket per further worker, which needs it bound as
    /// [`Listeners::bind`] binds it (`SO_REUSEPORT`); one bound otherwise
    /// is served by one worker.
    pub async fn from_listeners(
        listeners: Listeners,
        policy: Policy,
        options: ServeOptions,
    ) -> std::io::Result<Server> {
        let ServeOptions {
            source,
            watch,
            reload_signal,
            log,
        } = options;
        let tls = match &policy.server.tls {
            Some(t) => {
                Some(tls::load(&t.cert, &t.key, "server.tls").map_err(std::io::Error::other)?)
            }
            None => None,
        };
        let addr = listeners.api.local_addr()?;
        let admin_addr = listeners.admin.local_addr()?;
        // Every worker's socket is bound before this returns.
        let sockets = worker_sockets(listeners.api, policy.server.workers.max(1));
        let clock = Clock::new();
        let sims = start_sims(&policy, &HashMap::new()).await?;
        let sim_authorities: HashMap<String, String> = sims
            .iter()
            .map(|(n, h)| (n.clone(), h.addr().to_string()))
            .collect();
        let (cluster, syncer) = match &policy.cluster {
            Some(c) => {
                let (syncer, member) = crate::cluster::join(c)
                    .await
                    .map_err(std::io::Error::other)?;
                (Some(Arc::new(member)), Some(syncer))
            }
            None => (None, None),
        };
        let spec = crate::gateway::handle::cluster_spec(&policy, cluster.as_deref());
        let sched = Scheduler::new(&spec, clock.now(), rand::random());
        let fairness = FairnessMeter::new(policy.telemetry.fairness_window);
        let policy_telemetry = policy.telemetry.clone();
        let metrics = Metrics::new();
        let live = derive_live(
            Arc::new(policy),
            &sched,
            &metrics,
            &sim_authorities,
            &source.text,
            crate::clock::unix_seconds(),
        );
        let client = crate::net::client::client();
        let traces =
            Traces::start(&policy_telemetry, client.clone(), log).map_err(std::io::Error::other)?;
        let pollers = Pollers::new(client.clone(), clock);
        let gateway = Arc::new(Gateway::new(Parts {
            clock,
            live,
            sched: Scheduling::new(sched, fairness),
            metrics,
            client,
            traces,
            cluster: cluster.clone(),
        }));
        let services = Arc::new(Services {
            gateway: gateway.clone(),
            sim_authorities: Mutex::new(sim_authorities),
            sims: Mutex::new(sims),
            source: Mutex::new(source),
            reload_lock: tokio::sync::Mutex::new(()),
            tls: arc_swap::ArcSwapOption::new(tls),
            pollers: Mutex::new(pollers),
        });
        {
            let sims = services.sim_authorities.lock().clone();
            let policy = gateway.live().policy.clone();
            services.pollers.lock().reconcile(&gateway, &policy, &sims);
        }
        let shutdown = CancellationToken::new();
        let mut tasks = JoinSet::new();
        if let Some(period) = watch {
            tasks.spawn(reload::watch(services.clone(), period, shutdown.clone()));
        }
        if let (Some(mut syncer), Some(member)) = (syncer, cluster) {
            // The first leases, before the first request.
            syncer.sync(&member, &*gateway).await;
            let replica: Arc<dyn crate::cluster::Replica> = gateway.clone();
            tasks.spawn(syncer.run(member, replica, shutdown.clone()));
        }
        if let Some(signal) = reload_signal {
            tasks.spawn(reload_on_signal(services.clone(), signal, shutdown.clone()));
        }
        let task = tokio::spawn(run(
            services.clone(),
            sockets,
            listeners.admin,
            shutdown.clone(),
            tasks,
        ));
        Ok(Server {
            addr,
            admin_addr,
            services,
            shutdown,
            task,
        })
    }

    /// The client listener's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin listener's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The shared state (tests and the admin views).
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.services.gateway
    }

    /// The gateway with what the server runs beside it (reload).
    pub fn services(&self) -> &Arc<Services> {
        &self.services
    }

    /// A token that starts shutdown when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Starts shutdown and waits until the drain is over.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }

    /// Waits until the server stops (after its shutdown token is cancelled).
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

/// Reloads the policy on each signal until shutdown.
async fn reload_on_signal(
    services: Arc<Services>,
    mut signal: tokio::signal::unix::Signal,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            got = signal.recv() => {
                if got.is_none() {
                    return;
                }
                let _ = reload::reload(&services).await;
            }
        }
    }
}

async fn run(
    services: Arc<Services>,
    sockets: Vec<std::net::TcpListener>,
    admin_listener: TcpListener,
    shutdown: CancellationToken,
    mut tasks: JoinSet<()>,
) {
    let gw = services.gateway.clone();
    let server_policy = gw.live().policy.server.clone();
    tasks.spawn(deadline_task(gw.clone(), shutdown.clone()));
    let window = gw.live().policy.telemetry.fairness_window;
    tasks.spawn(fairness_task(gw.clone(), shutdown.clone(), window));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(server_policy.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let edge = edge(gw.clone(), server_policy.max_requests);
    let max_connections = connection_limit(server_policy.max_connections);
    let caps = conn::Caps::new(max_connections, server_policy.max_connections_per_client);
    let header_read_timeout = server_policy.header_read_timeout;
    let idle_timeout = server_policy.idle_timeout;
    // Cancelled when the drain starts (client connections) and when it
    // ends (admin connections, which serve `/readyz` meanwhile).
    let drain_clients = CancellationToken::new();
    let stop_admin = CancellationToken::new();
    let mut admin_conns = JoinSet::new();
    let accepted = client_connections(ClientConnections {
        services: services.clone(),
        edge,
        caps,
        builders: Arc::new(Builders::new(&builder)),
        drain: drain_clients.clone(),
        header_read_timeout,
        idle_timeout,
    });
    let mut workers = Workers::start(sockets, &accepted, &shutdown, &gw);
    // The workers stop accepting at shutdown, then drain; the admin
    // listener serves on (`/readyz` answers "draining") until the drain
    // ends.
    let clients = async {
        shutdown.cancelled().await;
        gw.start_draining();
        let drain = gw.live().policy.server.drain_timeout;
        tracing::info!(?drain, "draining");
        drain_clients.cancel();
        workers.drain().await;
        stop_admin.cancel();
    };
    let admin = accept_loop(
        &admin_listener,
        stop_admin.cancelled(),
        "admin listener",
        || accept_error(&gw),
        |stream: TcpStream, _| {
            let services = services.clone();
            let svc = tower::service_fn(move |req| {
                let services = services.clone();
                async move { Ok::<_, Infallible>(admin::route(services, req).await) }
            });
            let activity = conn::Activity::new();
            let svc = TowerToHyperService::new(conn::Tracked::new(svc, activity.clone()));
            let conn = builder
                .serve_connection(TokioIo::new(stream), svc)
                .into_owned();
            let stop = stop_admin.clone();
            while admin_conns.try_join_next().is_some() {}
            admin_conns.spawn(async move {
                conn::drive(conn, &activity, idle_timeout, &stop).await;
            });
        },
    );
    tokio::join!(clients, admin);
    // Admin connections get a moment to finish their answers.
    let admin_ended = async { while admin_conns.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(Duration::from_secs(1), admin_ended).await;
    admin_conns.abort_all();
    while admin_conns.join_next().await.is_some() {}
    while tasks.join_next().await.is_some() {}
    stop_services(&services).await;
}

/// `[server] max_connections`, lowered to what the file-descriptor limit
/// allows (with a warning).
fn connection_limit(configured: usize) -> usize {
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
struct ClientConnections<E> {
    services: Arc<Services>,
    /// The tower stack every request passes.
    edge: E,
    caps: conn::Caps,
    /// Shared, not cloned per connection: a connection whose protocol the
    /// first bytes tell keeps no builder of its own.
    builders: Arc<Builders>,
    /// Cancelled when the drain starts.
    drain: CancellationToken,
    header_read_timeout: Duration,
    idle_timeout: Duration,
}

/// What a worker does with a connection it accepted: the connection's
/// whole life, as a task for that worker's runtime (past its caps, it is
/// closed at once).
fn client_connections<E, B>(c: ClientConnections<E>) -> Accepted
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
        let slot = match caps.acquire(peer.ip(), &gw) {
            Ok(slot) => slot,
            Err(cap) => {
                connection_refused(&gw, peer, cap);
                return None;
            }
        };
        let activity = conn::Activity::new();
        let tracked = conn::Tracked::new(edge.clone(), activity.clone());
        let svc = TowerToHyperService::new(tracked);
        let builders = builders.clone();
        let stop = drain.clone();
        let tls = services.tls.load_full();
        let dispatch = gw.traces().map(|t| t.dispatch().clone());
        let conn_gw = gw.clone();
        let serve = async move {
            let _slot = slot;
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
        // With traces on, the connection runs under the gateway's
        // dispatch: its requests' spans and log lines are one tree.
        Some(match dispatch {
            None => Box::pin(serve) as ConnTask,
            Some(d) => Box::pin(serve.with_subscriber(d)),
        })
    })
}

/// Stops what the server ran beside the gateway: the pollers (joined),
/// the in-process simulated backends, and the trace exporter (the spans
/// still queued are exported first).
async fn stop_services(services: &Services) {
    let pollers = services.pollers.lock().stop_all();
    pollers.await;
    for (_, h) in services.sims.lock().drain(..) {
        drop(h);
    }
    // Export the spans still queued; the exporter blocks on the runtime
    // that carries its requests, so it waits on a blocking thread.
    let traces_gw = services.gateway.clone();
    let _ = tokio::task::spawn_blocking(move || {
        if let Some(t) = traces_gw.traces() {
            t.shutdown();
        }
    })
    .await;
}

/// What an HTTP/2 client sends first (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The client listener's connection builders: by protocol, and the one
/// that reads the first bytes to tell.
struct Builders {
    auto: auto::Builder<TokioExecutor>,
    http1: auto::Builder<TokioExecutor>,
    http2: auto::Builder<TokioExecutor>,
}

impl Builders {
    fn new(auto: &auto::Builder<TokioExecutor>) -> Builders {
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
type ConnTask = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Makes the task for a connection a worker accepted; `None`: refused at
/// a cap (and counted).
type Accepted = Arc<dyn Fn(TcpStream, SocketAddr) -> Option<ConnTask> + Send + Sync>;

/// Counts a failed accept.
fn accept_error(gw: &Gateway) {
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
struct Workers {
    done: Vec<tokio::sync::oneshot::Receiver<()>>,
}

impl Workers {
    fn start(
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
    async fn drain(&mut self) {
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
            crate::gateway::pool::sweep();
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
static REFUSALS_LOG: conn::Throttled = conn::Throttled::new(Duration::from_secs(60));
/// Connections ended by a client's protocol error, likewise.
static PROTOCOL_ERRORS_LOG: conn::Throttled = conn::Throttled::new(Duration::from_secs(60));

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

/// Samples the tenants' weighted service and backlog ten times per
/// `[telemetry] fairness_window` for the `fairway_jain_fairness_index`
/// gauge. Service is counted when a response ends, so the window should
/// span several response times.
async fn fairness_task(gw: Arc<Gateway>, shutdown: CancellationToken, window: Duration) {
    let mut tick = tokio::time::interval(window / 10);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let live = gw.live();
        gw.sched().sample_fairness(gw.now(), |t| {
            live.tenant_policy
                .get(&t)
                .map_or(1.0, |&i| live.policy.tenants[i].weight)
        });
    }
}

/// Sheds queued requests at their deadlines.
async fn deadline_task(gw: Arc<Gateway>, shutdown: CancellationToken) {
    loop {
        let next = gw.sched().next_wakeup();
        let sleep = async {
            match next {
                Some(t) => tokio::time::sleep_until(gw.clock().to_std(t).into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = gw.woken() => continue,
            _ = sleep => {}
        }
        for name in gw.sched().on_tick(gw.now()) {
            tracing::info!(backend = %name, "backend back from outlier ejection");
        }
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
