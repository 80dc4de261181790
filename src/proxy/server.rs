//! Listeners, connection serving and shutdown.
//!
//! [`Server::start`] binds the client and admin listeners, starts the
//! policy's simulated backends, the pollers, the deadline task and the
//! accept loops, and
//! returns a handle. Connections are served by hyper-util's auto builder, so
//! HTTP/1.1 and h2c (prior knowledge) share one port. Shutdown stops
//! accepting, lets in-flight responses finish up to `drain_timeout`, then
//! returns.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::{Method, Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::{BackendTarget, Policy};
use crate::core::fairness::FairnessMeter;
use crate::core::scheduler::Scheduler;
use crate::proxy::body::BoxBody;
use crate::proxy::error::ApiError;
use crate::proxy::gateway::{CoreState, Gateway, derive_live};
use crate::proxy::{admin, dispatch, tls};
use crate::sim::backend::{SimBackend, SimHandle};
use crate::telemetry::metrics::Metrics;

/// A running gateway.
pub struct Server {
    addr: SocketAddr,
    admin_addr: SocketAddr,
    gateway: Arc<Gateway>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

/// Where the policy came from, for reloads.
#[derive(Clone, Debug)]
pub struct PolicySource {
    /// The file to re-read on reload (`None`: the policy was given in memory).
    pub path: Option<PathBuf>,
    /// Its text (for the hash shown by `/admin/policy`).
    pub text: String,
}

impl Server {
    /// Binds the policy's listeners and starts serving.
    pub async fn start(policy: Policy, source: PolicySource) -> std::io::Result<Server> {
        let tls = match &policy.server.tls {
            Some(t) => Some(tls::load(t).map_err(std::io::Error::other)?),
            None => None,
        };
        let listener = TcpListener::bind(policy.server.listen).await?;
        let admin = TcpListener::bind(policy.server.admin_listen).await?;
        let addr = listener.local_addr()?;
        let admin_addr = admin.local_addr()?;
        let clock = Clock::new();
        let sims = start_sims(&policy, &HashMap::new()).await?;
        let sim_authorities: HashMap<String, String> = sims
            .iter()
            .map(|(n, h)| (n.clone(), h.addr().to_string()))
            .collect();
        let sched = Scheduler::new(&policy.scheduler_spec(), clock.now(), rand::random());
        let tracer = otlp_exporter(&policy);
        let fairness = FairnessMeter::new(policy.telemetry.fairness_window);
        let live = derive_live(
            Arc::new(policy),
            &sched,
            &sim_authorities,
            &source.text,
            unix_now(),
        );
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(1024)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(connector);
        let gateway = Arc::new(Gateway {
            clock,
            live: ArcSwap::from_pointee(live),
            core: Mutex::new(CoreState {
                sched,
                waiters: HashMap::new(),
                service: Vec::new(),
                fairness,
            }),
            metrics: Metrics::new(),
            client,
            wake: Notify::new(),
            draining: Default::default(),
            sim_authorities: Mutex::new(sim_authorities),
            sims: Mutex::new(sims),
            source: Mutex::new(source),
            reload_lock: tokio::sync::Mutex::new(()),
            tls: arc_swap::ArcSwapOption::new(tls),
            pollers: Mutex::new(Default::default()),
            tracer,
        });
        {
            let sims = gateway.sim_authorities.lock().clone();
            let policy = gateway.live.load().policy.clone();
            gateway.pollers.lock().reconcile(&gateway, &policy, &sims);
        }
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(gateway.clone(), listener, admin, shutdown.clone()));
        Ok(Server {
            addr,
            admin_addr,
            gateway,
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
        &self.gateway
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

/// Starts the in-process simulated backends a policy declares that are not
/// already running (`running` maps backend names to addresses).
pub async fn start_sims(
    policy: &Policy,
    running: &HashMap<String, String>,
) -> std::io::Result<Vec<(String, SimHandle)>> {
    let mut out = Vec::new();
    for pool in &policy.pools {
        for b in &pool.backends {
            if let BackendTarget::Sim { params } = &b.target {
                if running.contains_key(&b.name) {
                    continue;
                }
                let h = SimBackend::builder(pool.model.clone())
                    .engine(params.clone())
                    .start()
                    .await?;
                tracing::info!(backend = %b.name, addr = %h.addr(), "started simulated backend");
                out.push((b.name.clone(), h));
            }
        }
    }
    Ok(out)
}

fn unix_now() -> u64 {
    #[allow(clippy::disallowed_methods)]
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Seconds since the Unix epoch, for the admin views.
pub fn unix_time() -> u64 {
    unix_now()
}

async fn run(
    gw: Arc<Gateway>,
    listener: TcpListener,
    admin: TcpListener,
    shutdown: CancellationToken,
) {
    let graceful = GracefulShutdown::new();
    let deadlines = tokio::spawn(deadline_task(gw.clone(), shutdown.clone()));
    let window = gw.live.load().policy.telemetry.fairness_window;
    let fairness = tokio::spawn(fairness_task(gw.clone(), shutdown.clone(), window));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30));
    builder.http2().timer(TokioTimer::new());
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let gw2 = gw.clone();
                let svc = service_fn(move |req| {
                    let gw = gw2.clone();
                    async move { Ok::<_, Infallible>(route(gw, req).await) }
                });
                match gw.tls.load_full() {
                    None => {
                        let conn = builder.serve_connection(TokioIo::new(stream), svc).into_owned();
                        tokio::spawn(graceful.watch(conn));
                    }
                    Some(config) => {
                        // The handshake runs in the connection's own task, so a
                        // slow client never holds up the accept loop.
                        let builder = builder.clone();
                        let watcher = graceful.watcher();
                        tokio::spawn(async move {
                            let accept = tokio_rustls::TlsAcceptor::from(config).accept(stream);
                            match tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, accept).await {
                                Ok(Ok(tls_stream)) => {
                                    let conn = builder
                                        .serve_connection(TokioIo::new(tls_stream), svc)
                                        .into_owned();
                                    let _ = watcher.watch(conn).await;
                                }
                                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                            }
                        });
                    }
                }
            }
            accepted = admin.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let gw = gw.clone();
                let svc = service_fn(move |req| {
                    let gw = gw.clone();
                    async move { Ok::<_, Infallible>(admin::route(gw, req).await) }
                });
                let conn = builder.serve_connection(TokioIo::new(stream), svc).into_owned();
                tokio::spawn(graceful.watch(conn));
            }
        }
    }
    gw.draining.store(true, Ordering::Relaxed);
    drop(listener);
    drop(admin);
    let drain = gw.live.load().policy.server.drain_timeout;
    tracing::info!(?drain, "draining");
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain timeout passed with requests still in flight");
    }
    deadlines.abort();
    fairness.abort();
    gw.pollers.lock().stop_all();
    for (_, h) in gw.sims.lock().drain(..) {
        drop(h);
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
        let live = gw.live.load();
        let now = gw.clock.now();
        let mut core = gw.core.lock();
        let ids: Vec<_> = core.sched.tenants().collect();
        let mut service = Vec::with_capacity(ids.len());
        let mut backlogged = Vec::with_capacity(ids.len());
        for t in ids {
            let weight = live
                .tenant_policy
                .get(&t)
                .map_or(1.0, |&i| live.policy.tenants[i].weight);
            let tokens = core.service.get(t.0 as usize).copied().unwrap_or(0.0);
            service.push(tokens / weight);
            backlogged.push(core.sched.tenant_view(now, t).queued > 0);
        }
        core.fairness.sample(now, &service, &backlogged);
    }
}

/// Sheds queued requests at their deadlines.
async fn deadline_task(gw: Arc<Gateway>, shutdown: CancellationToken) {
    loop {
        let next = gw.core.lock().sched.next_wakeup();
        let sleep = async {
            match next {
                Some(t) => tokio::time::sleep_until(gw.clock.to_std(t).into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = gw.wake.notified() => continue,
            _ = sleep => {}
        }
        let now = gw.clock.now();
        let mut core = gw.core.lock();
        let decisions = core.sched.on_tick(now);
        core.deliver(decisions, None);
    }
}

async fn route(gw: Arc<Gateway>, req: Request<Incoming>) -> Response<BoxBody> {
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings") => {
            dispatch::handle(gw, req).await
        }
        (&Method::GET, "/v1/models") => admin::models(&gw),
        _ => ApiError::NotFound.into_response(),
    }
}

/// The trace exporter for `[telemetry] otlp_endpoint`, or for
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (both read and checked with the policy).
fn otlp_exporter(policy: &Policy) -> Option<crate::telemetry::trace::Exporter> {
    let endpoint = policy.telemetry.otlp_endpoint.as_deref()?;
    tracing::info!(%endpoint, "exporting traces over OTLP/HTTP");
    Some(crate::telemetry::trace::Exporter::start(
        endpoint,
        policy.telemetry.service_name.clone(),
    ))
}
