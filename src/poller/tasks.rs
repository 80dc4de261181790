//! The I/O half of the poller: one task per backend that, every `[poller]
//! interval`, probes the backend's health endpoint and scrapes its metrics
//! (each within `[poller] timeout`), and feeds the scheduler.
//!
//! - A reading decoded from a scrape goes to [`Scheduler::on_reading`]
//!   (headroom and the adaptive window).
//! - A backend is ejected when its health probe fails (no answer in time,
//!   or a non-2xx status) or its metrics endpoint cannot be reached at all;
//!   the dispatch path also ejects one whose connection fails. An ejected
//!   backend returns at the first tick whose probe answers 2xx.
//! - A scrape that is answered but unusable (an error status, a body with
//!   none of the dialect's metrics, a body over 8 MiB or one that does not
//!   arrive within the timeout) does not eject: the engine is up and
//!   serving, so the reading just goes stale and routing falls back to the
//!   gateway's own counts. It is counted in `scrape_errors`.
//!
//! - An OpenAI-protocol backend's `/v1/models` is read at the first tick
//!   and then every [`MODELS_EVERY`]: the LoRA adapters it lists (entries
//!   with a `parent`) are served by its pool like those the policy names
//!   ([`Sink::on_adapters`]). A failed read keeps the last list.
//! - A Triton-protocol backend's model configuration
//!   (`/v2/models/{model}/config`) is read likewise (every tick until it
//!   answers): a decoupled model's pending count is not a queue (see the
//!   `triton` dialect).
//!
//! Tasks are matched to backends by name; a reload that changes a
//! backend's address, dialect or poller settings restarts its task (and
//! with it the histogram window), one that removes the backend stops it.
//!
//! [`Scheduler::on_reading`]: crate::core::scheduler::Scheduler::on_reading

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::Clock;
use crate::config::{BackendTarget, MetricsDialect, Policy};
use crate::core::reading::Reading;
use crate::core::scheduler::PrefixEvent;
use crate::core::spec::Api;
use crate::net::client::Client;
use crate::net::scrape::{ScrapeError, get};
use crate::poller::Decoder;
use crate::poller::dialect::Sources;
mod kv_subscriber;

pub use kv_subscriber::KvEventCounts;
use kv_subscriber::{KvStats, KvTarget, follow};

/// Largest scrape body read; a larger one fails the scrape.
const MAX_SCRAPE_BYTES: usize = 8 << 20;
/// How often a backend's `/v1/models` is read for its adapters.
const MODELS_EVERY: Duration = Duration::from_secs(30);

/// What one backend's task talks to, and how often.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    dialect: MetricsDialect,
    /// `http://…` URL of the scrape; `None` for dialect `none`.
    metrics: Option<String>,
    /// `http://…` URL of the health probe.
    health: String,
    /// `http://…/v1/models`, for an OpenAI-protocol backend, and its
    /// pool's model.
    models: Option<(String, String)>,
    /// `http://…/v2/models/{model}/config`, for a Triton-protocol
    /// backend read in the `triton` dialect: whether the model is
    /// decoupled.
    config: Option<String>,
    interval: Duration,
    timeout: Duration,
}

/// Where the poller tasks report: the gateway, which feeds the scheduler.
pub trait Sink: Send + Sync + 'static {
    /// One tick of backend `name`: whether it is up (its probe answered
    /// 2xx and its metrics endpoint was reached), and the reading decoded
    /// from its scrape, if any. Returns whether it was up before the tick;
    /// `None` when the scheduler does not know the backend (a reload
    /// removed it).
    fn on_poll(&self, name: &str, up: bool, reading: Option<Reading>) -> Option<bool>;
    /// The LoRA adapters backend `name`, serving `model`, lists.
    fn on_adapters(&self, name: &str, model: &str, adapters: Vec<String>);
    /// Backend `name` is polled no longer: forget what it listed.
    fn forget(&self, name: &str);
    /// Backend `name`'s KV events: whether they are followed now (a
    /// change drops what the prefix index held for it), and the changes
    /// of its cache since the last call.
    fn on_kv_events(&self, name: &str, followed: bool, events: &[PrefixEvent]) {
        let _ = (name, followed, events);
    }
}

/// Counters of one backend's poller, read at `/metrics` scrape time.
#[derive(Debug, Default)]
pub struct PollStats {
    /// Scrapes that failed: unreachable, error status, or undecodable.
    pub scrape_errors: AtomicU64,
    /// Where the last good reading's load signals came from.
    pub sources: parking_lot::Mutex<Sources>,
}

/// The running poller tasks, by backend name.
#[derive(Debug)]
pub struct Pollers {
    /// The probes' and scrapes' client, and the readings' clock.
    client: Client,
    clock: Clock,
    running: HashMap<String, (Target, CancellationToken)>,
    stats: HashMap<String, Arc<PollStats>>,
    /// The KV-event subscribers, by backend name.
    following: HashMap<String, (KvTarget, CancellationToken)>,
    kv_stats: HashMap<String, Arc<KvStats>>,
    /// Every poller task, running or stopping, so shutdown can join them.
    tasks: TaskTracker,
}

impl Pollers {
    /// No tasks yet; they will probe and scrape through `client` and stamp
    /// readings with `clock`.
    pub fn new(client: Client, clock: Clock) -> Self {
        Pollers {
            client,
            clock,
            running: HashMap::new(),
            stats: HashMap::new(),
            following: HashMap::new(),
            kv_stats: HashMap::new(),
            tasks: TaskTracker::new(),
        }
    }

    /// Starts, restarts or stops tasks so that exactly the backends of
    /// `policy` are polled as it says. `sims` maps in-process simulated
    /// backends to their `host:port`, and `sim_kv` those that publish KV
    /// events to their publisher's and replay socket's `tcp://` addresses.
    pub fn reconcile<S: Sink>(
        &mut self,
        sink: &Arc<S>,
        policy: &Policy,
        sims: &HashMap<String, String>,
        sim_kv: &HashMap<String, (String, String)>,
    ) {
        let mut wanted = HashMap::new();
        let backends = policy
            .pools
            .iter()
            .flat_map(|p| p.backends.iter().map(move |b| (p, b)));
        for (pool, b) in backends {
            let authority = match &b.target {
                BackendTarget::Url { authority } => authority.clone(),
                BackendTarget::Sim { .. } => match sims.get(&b.name) {
                    Some(a) => a.clone(),
                    None => continue,
                },
            };
            let metrics = match (b.metrics, &b.metrics_url) {
                (MetricsDialect::None, _) => None,
                (_, Some(e)) => Some(format!("http://{}{}", e.authority, e.path)),
                (_, None) => Some(format!("http://{authority}/metrics")),
            };
            wanted.insert(
                b.name.clone(),
                Target {
                    dialect: b.metrics,
                    metrics,
                    health: format!("http://{authority}{}", b.health_path),
                    models: (b.protocol == Api::OpenAi)
                        .then(|| (format!("http://{authority}/v1/models"), pool.model.clone())),
                    config: (b.protocol == Api::Triton && b.metrics == MetricsDialect::Triton)
                        .then(|| {
                            let model = b.served_model.as_deref().unwrap_or(&pool.model);
                            format!("http://{authority}/v2/models/{model}/config")
                        }),
                    interval: policy.poller.interval,
                    timeout: policy.poller.timeout,
                },
            );
        }
        let (client, clock, tasks) = (&self.client, self.clock, &self.tasks);
        reconcile_tasks(
            &mut self.running,
            &mut self.stats,
            wanted,
            |name| sink.forget(name),
            |name, target, stats, stop| {
                let sink = Arc::downgrade(sink) as Weak<dyn Sink>;
                let via = Via {
                    client: client.clone(),
                    clock,
                };
                tasks.spawn(poll(sink, via, name, target, stats, stop));
            },
        );
        self.follow(sink, policy, sim_kv);
    }

    /// Starts, restarts or stops the KV-event subscribers so that exactly
    /// the backends of `policy` with `kv_events` are followed.
    fn follow<S: Sink>(
        &mut self,
        sink: &Arc<S>,
        policy: &Policy,
        sim_kv: &HashMap<String, (String, String)>,
    ) {
        let mut wanted = HashMap::new();
        for pool in &policy.pools {
            for b in &pool.backends {
                if let Some(source) = &b.kv_events {
                    // An in-process simulated engine's: its own addresses.
                    let source = match (source.endpoint.is_empty(), sim_kv.get(&b.name)) {
                        (false, _) => source.clone(),
                        (true, Some((endpoint, replay))) => crate::config::KvEventsSource {
                            endpoint: endpoint.clone(),
                            replay: Some(replay.clone()),
                            topic: String::new(),
                        },
                        (true, None) => continue,
                    };
                    let target = KvTarget {
                        source,
                        model: pool.model.clone(),
                        block_tokens: pool.prefix.block_tokens,
                        cap: pool.prefix.index_blocks,
                    };
                    wanted.insert(b.name.clone(), target);
                }
            }
        }
        let tasks = &self.tasks;
        reconcile_tasks(
            &mut self.following,
            &mut self.kv_stats,
            wanted,
            |name| sink.on_kv_events(name, false, &[]),
            |name, target, stats, stop| {
                let sink = Arc::downgrade(sink) as Weak<dyn Sink>;
                tasks.spawn(follow(sink, name, target, stats, stop));
            },
        );
    }

    /// What backend `name`'s KV-event subscriber did (`None`: it has none).
    pub fn kv_events(&self, backend: &str) -> Option<KvEventCounts> {
        self.kv_stats.get(backend).map(|s| s.counts())
    }

    /// Failed scrapes of a backend so far.
    pub fn scrape_errors(&self, backend: &str) -> u64 {
        self.stats
            .get(backend)
            .map_or(0, |s| s.scrape_errors.load(Ordering::Relaxed))
    }

    /// Where a backend's last good reading came from.
    pub fn sources(&self, backend: &str) -> Sources {
        self.stats
            .get(backend)
            .map_or_else(Sources::default, |s| *s.sources.lock())
    }

    /// Stops every task (shutdown); await the result to join them.
    pub fn stop_all(&mut self) -> impl std::future::Future<Output = ()> + use<> {
        for (_, (_, stop)) in self.running.drain() {
            stop.cancel();
        }
        for (_, (_, stop)) in self.following.drain() {
            stop.cancel();
        }
        let tasks = self.tasks.clone();
        tasks.close();
        async move { tasks.wait().await }
    }
}

/// Keeps exactly the `wanted` tasks (by backend name) in `running`: stops
/// those gone or changed (`stopped` tells the gateway), starts the new ones
/// with `start` (its counters kept across a restart), and drops the
/// counters of the gone.
fn reconcile_tasks<T: PartialEq + Clone, St: Default>(
    running: &mut HashMap<String, (T, CancellationToken)>,
    stats: &mut HashMap<String, Arc<St>>,
    wanted: HashMap<String, T>,
    mut stopped: impl FnMut(&str),
    mut start: impl FnMut(String, T, Arc<St>, CancellationToken),
) {
    running.retain(|name, (target, stop)| {
        let keep = wanted.get(name) == Some(target);
        if !keep {
            stop.cancel();
            stopped(name);
        }
        keep
    });
    stats.retain(|name, _| wanted.contains_key(name));
    for (name, target) in wanted {
        if running.contains_key(&name) {
            continue;
        }
        let stop = CancellationToken::new();
        let st = stats.entry(name.clone()).or_default().clone();
        start(name.clone(), target.clone(), st, stop.clone());
        running.insert(name, (target, stop));
    }
}

/// What a poller task probes and scrapes through.
struct Via {
    client: Client,
    clock: Clock,
}

/// One backend's loop; ends when cancelled or the gateway is gone.
async fn poll(
    sink: Weak<dyn Sink>,
    via: Via,
    name: String,
    target: Target,
    stats: Arc<PollStats>,
    stop: CancellationToken,
) {
    let mut decoder = Decoder::new(target.dialect);
    let mut tick = tokio::time::interval(target.interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Log a failure when it starts or changes, not at every tick.
    let mut last_problem: Option<String> = None;
    let models_every = (MODELS_EVERY.as_secs_f64() / target.interval.as_secs_f64().max(1e-3))
        .ceil()
        .max(1.0) as u64;
    let mut ticks = 0u64;
    let mut config_read = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Some(sink) = sink.upgrade() else { return };
        if ticks.is_multiple_of(models_every)
            && let Some((url, model)) = &target.models
            && let Ok(body) = get(&via.client, url, target.timeout, 1 << 20).await
            && let Some(adapters) = from_models_list(&body)
        {
            sink.on_adapters(&name, model, adapters);
        }
        // A Triton model's configuration: at the first tick and then as
        // often as the adapters, every tick until it is read.
        if (ticks.is_multiple_of(models_every) || !config_read)
            && let Some(url) = &target.config
            && let Ok(body) = get(&via.client, url, target.timeout, 1 << 20).await
            && let Some(decoupled) = crate::protocol::triton::decoupled(&body)
        {
            decoder.set_decoupled(decoupled);
            config_read = true;
        }
        ticks += 1;
        let (probe, scrape) =
            tokio::join!(probe(&via, &target), scrape(&via, &target, &mut decoder));
        let unreachable = matches!(&scrape, Some(Err(e)) if e.is_unreachable());
        let problem = match (&probe, &scrape) {
            (Err(e), _) => Some(format!("health probe: {e}")),
            (Ok(()), Some(Err(e))) => Some(format!("metrics: {e}")),
            _ => None,
        };
        match &scrape {
            Some(Err(_)) => {
                stats.scrape_errors.fetch_add(1, Ordering::Relaxed);
            }
            Some(Ok(_)) => *stats.sources.lock() = decoder.sources(),
            None => {}
        }
        let up = probe.is_ok() && !unreachable;
        let reading = match scrape {
            Some(Ok(reading)) if up => Some(reading),
            _ => None,
        };
        let Some(was_up) = sink.on_poll(&name, up, reading) else {
            continue;
        };
        match (was_up, up) {
            (true, false) => {
                tracing::warn!(backend = %name, problem = problem.as_deref().unwrap_or(""), "backend ejected");
            }
            (false, true) => tracing::info!(backend = %name, "backend healthy again"),
            _ => {}
        }
        if problem != last_problem {
            if let Some(p) = &problem
                && up
            {
                tracing::warn!(backend = %name, problem = %p, "backend reading unavailable");
            }
            last_problem = problem;
        }
    }
}

/// `GET` the health URL: `Ok` on a 2xx answer, body included, within the
/// timeout.
async fn probe(via: &Via, target: &Target) -> Result<(), ScrapeError> {
    get(&via.client, &target.health, target.timeout, 64 << 10)
        .await
        .map(|_| ())
}

/// Scrapes and decodes; `None` for dialect `none`.
async fn scrape(
    via: &Via,
    target: &Target,
    decoder: &mut Decoder,
) -> Option<Result<Reading, ScrapeError>> {
    let url = target.metrics.as_deref()?;
    let body = match get(&via.client, url, target.timeout, MAX_SCRAPE_BYTES).await {
        Ok(body) => body,
        Err(e) => return Some(Err(e)),
    };
    let text = String::from_utf8_lossy(&body);
    Some(
        decoder
            .decode(&text, via.clock.now())
            .map_err(|e| ScrapeError::unusable(url, e)),
    )
}

/// The adapters in a `/v1/models` answer: the entries with a `parent`.
pub fn from_models_list(body: &[u8]) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct List {
        data: Vec<Card>,
    }
    #[derive(serde::Deserialize)]
    struct Card {
        id: String,
        #[serde(default)]
        parent: Option<String>,
    }
    let list: List = serde_json::from_slice(body).ok()?;
    Some(
        list.data
            .into_iter()
            .filter(|c| c.parent.is_some())
            .map(|c| c.id)
            .collect(),
    )
}
