//! The server: what `serve` starts, runs and stops. The listeners are
//! bound in `listeners.rs`, client connections are served by the workers
//! of `clients.rs`, and every request passes the tower stack of
//! `stack.rs`.
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
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::Policy;
use crate::core::fairness::FairnessMeter;
use crate::core::scheduler::Scheduler;
use crate::edge::clients::{
    Builders, ClientConnections, Workers, accept_error, client_connections, connection_limit,
};
use crate::edge::listeners::{Listeners, worker_sockets};
use crate::edge::services::{PolicySource, Services, start_sims};
use crate::edge::stack::edge;
use crate::edge::{admin, conn, reload};
use crate::gateway::live_policy::derive_live;
use crate::gateway::scheduling::Scheduling;
use crate::gateway::state::{Gateway, Parts};
use crate::net::accept::accept_loop;
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
        let spec = crate::gateway::state::cluster_spec(&policy, cluster.as_deref());
        let mut sched = Scheduler::new(&spec, clock.now(), rand::random());
        if cluster.is_some() {
            sched.share_homes();
        }
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
        let policy = gateway.live().policy.clone();
        let batches = match &policy.batch {
            Some(b) => {
                let replica = gateway
                    .cluster()
                    .map(|m| m.replica.clone())
                    .unwrap_or_default();
                let opened = crate::batch::Batches::open(
                    b,
                    policy.cluster.as_ref(),
                    &replica,
                    gateway.clone(),
                );
                Some(opened.map_err(std::io::Error::other)?)
            }
            None => None,
        };
        let services = Arc::new(Services {
            batches,
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
            let kv = services.sim_kv_events();
            let policy = gateway.live().policy.clone();
            services
                .pollers
                .lock()
                .reconcile(&gateway, &policy, &sims, &kv);
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
        if let Some(usage) = gateway.shared_usage() {
            let source: Arc<dyn crate::gateway::usage_share::UsageSource> = gateway.clone();
            tasks.spawn(usage.clone().run(source, shutdown.clone()));
        }
        if let Some(signal) = reload_signal {
            tasks.spawn(reload_on_signal(services.clone(), signal, shutdown.clone()));
        }
        if let Some(b) = &services.batches {
            tasks.spawn(b.clone().run(shutdown.clone()));
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
    let edge = edge(
        gw.clone(),
        services.batches.clone(),
        server_policy.max_requests,
    );
    let max_connections = connection_limit(server_policy.max_connections);
    let caps = conn::Caps::new(
        server_policy.max_connections,
        max_connections,
        server_policy.max_connections_per_client,
    );
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
        |stream: TcpStream, peer| {
            let services = services.clone();
            let svc = tower::service_fn(move |req| {
                let services = services.clone();
                async move { Ok::<_, Infallible>(admin::route(services, req).await) }
            });
            let activity = conn::Activity::new();
            let svc =
                TowerToHyperService::new(conn::Tracked::new(svc, activity.clone(), peer, None));
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
