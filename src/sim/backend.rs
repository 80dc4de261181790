//! The simulated backend: an HTTP server that exposes one [`Engine`] with
//! vLLM's OpenAI-compatible wire format, `/health` and `/metrics`.
//!
//! Owns the engine (behind one `parking_lot::Mutex`, never held across an
//! `.await`), the task that drives it in scaled wall time, the per-request
//! event channels and the request-level metrics. It does not own the engine
//! model itself (`sim::engine`), the builder and the running server's
//! handle (`handle`), the endpoints (`routes`), the wire format (`openai`,
//! `pooling`) or the text exposition (`metrics`).
//!
//! Time: simulated = wall × `time_scale`, on one [`Clock`] per backend.
//! Invariant: a request is in `State::live` exactly while the engine holds
//! its sequence; whoever removes it (the driver on `Finished`, the request's
//! guard on drop) settles it, so a dropped stream always cancels.

mod dialects;
mod handle;
mod kv_publisher;
pub(crate) mod metrics;
mod openai;
mod pooling;
mod routes;
mod triton;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use hyper_util::server::graceful::GracefulShutdown;
use parking_lot::Mutex;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use self::handle::{SimBackend, SimBackendBuilder, SimHandle};
use self::kv_publisher::{KvLink, SeqPrompt};
use self::metrics::{FinishReason, RequestMetrics};
use crate::clock::Clock;
use crate::config::EngineParams;
use crate::core::time::Instant;
use crate::sim::engine::{Engine, EngineError, EngineEvent, EngineStats, SeqRequest};

/// Text of every generated token.
const TOKEN_TEXT: &str = " tok";

/// Largest request body the backend reads.
const MAX_BODY_BYTES: usize = 16 << 20;

/// A value unlike that of any other backend in this process or another.
fn id_salt() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.finish() as u32
}

/// Responses API responses kept for `GET` (vLLM keeps them in memory too).
const STORED_RESPONSES: usize = 1024;

/// The response body type of every endpoint.
/// Response bodies; an error cuts the connection (the `cut-stream` fault).
type Body = BoxBody<Bytes, std::io::Error>;

/// What a simulated backend serves.
#[derive(Clone, Debug, PartialEq)]
pub struct SimBackendConfig {
    /// The served model name (`--served-model-name`); other names get 404.
    pub model: String,
    /// The engine model and its time scale.
    pub engine: EngineParams,
    /// The failure mode at start (switch later with `POST /admin/fault`).
    pub fault: Fault,
    /// The server it imitates.
    pub flavour: Flavour,
    /// LoRA adapters served on top of `model` (vLLM's `--lora-modules`).
    pub adapters: Vec<String>,
    /// Export the LoRA residency series proposed for vLLM
    /// (`vllm:lora_adapter_loaded`, `vllm:max_gpu_lora_adapters`,
    /// `vllm:lora_adapter_load_seconds`) besides `vllm:lora_requests_info`.
    pub residency_metrics: bool,
    /// Publish KV events (vLLM's `--kv-events-config`): the PUB socket's
    /// and the replay socket's addresses to bind.
    pub kv_events: Option<(std::net::SocketAddr, std::net::SocketAddr)>,
}

/// The server a simulated backend imitates, wire format and metric names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Flavour {
    /// vLLM's OpenAI-compatible server: `/v1/*`, `/health`, `vllm:*`.
    #[default]
    Vllm,
    /// Triton with the TensorRT-LLM backend: `/v2/*` (KServe v2 and the
    /// generate extension), `nv_inference_*` and `nv_trt_llm_*` metrics.
    TritonTrtllm,
    /// Triton with its vLLM backend: `/v2/*`, `nv_inference_*` and the
    /// backend's `vllm:*` histograms (no KV gauges).
    TritonVllm,
    /// Triton serving a classic (non-decoupled) tensor model through
    /// `/v2/models/{m}/infer`: an embedding model, a classifier.
    TritonTensor,
}

/// A scripted failure mode of a simulated backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Serve normally.
    #[default]
    None,
    /// `/v1/*` answers 500 and `/health` 503.
    Error,
    /// `/v1/*` answers 500 at once while `/health` still answers 200: a
    /// backend that fails fast, which only outlier ejection catches.
    #[serde(alias = "error_healthy")]
    ErrorHealthy,
    /// Every third `/v1/*` request answers 500 (never two failures in a
    /// row) while `/health` answers 200: only success-rate outlier
    /// detection catches it.
    Flaky,
    /// Accept requests but never send response headers (`/health` and
    /// `/metrics` too); only `/admin/fault` still answers.
    Hang,
    /// Serve normally, except `/metrics`, which answers 500: the gateway's
    /// reading goes stale while the backend stays up.
    #[serde(alias = "metrics_error")]
    MetricsError,
    /// Streams break after their first two events: the connection is cut
    /// with no end to the chunked body, as when an engine dies mid-stream.
    #[serde(alias = "cut_stream")]
    CutStream,
    /// Serve normally, except `/metrics`, which answers a 9 MiB body (past
    /// the gateway's 8 MiB scrape limit).
    #[serde(alias = "metrics_huge")]
    MetricsHuge,
    /// Serve normally, except `/metrics`, which sends its body a few bytes
    /// every 100 ms, never finishing within a scrape timeout.
    #[serde(alias = "metrics_trickle")]
    MetricsTrickle,
    /// Streams are sent whole at the end, with a `Content-Length`, as some
    /// servers and proxies in front of engines do.
    #[serde(alias = "sse_content_length")]
    SseContentLength,
}

/// Serves `cfg` on `listener` until `shutdown` resolves, then drains.
pub async fn serve(
    listener: TcpListener,
    cfg: SimBackendConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let kv = match cfg.kv_events {
        Some((publish, replay)) => Some(KvLink::bind(publish, replay).await?),
        None => None,
    };
    serve_shared(listener, Shared::new(cfg, kv), shutdown).await
}

async fn serve_shared(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Every task lives in this set: dropping the serve future (Drop of the
    // handle aborts it) aborts the driver and all connections.
    let mut tasks = JoinSet::new();
    let driver = tasks.spawn(drive(Arc::clone(&shared)));
    let graceful = GracefulShutdown::new();
    let handler = Arc::clone(&shared);
    crate::net::accept::accept_until(
        &listener,
        shutdown,
        &graceful,
        &mut tasks,
        "sim backend",
        move |req| routes::handle(Arc::clone(&handler), req),
    )
    .await;
    drop(listener);
    // Hung requests (Fault::Hang) would block the drain forever.
    shared.stop.cancel();
    if let Some(kv) = &shared.kv {
        kv.stop.cancel();
    }
    graceful.shutdown().await;
    driver.abort();
    tasks.shutdown().await;
    Ok(())
}

/// What the driver tells one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Delivery {
    Token {
        index: u32,
    },
    Finished {
        prompt_tokens: u32,
        completion_tokens: u32,
        /// Prompt tokens found in the prefix cache.
        cached_tokens: u32,
    },
}

/// A request the engine holds.
#[derive(Debug)]
struct Live {
    tx: mpsc::UnboundedSender<Delivery>,
    /// Simulated arrival time.
    arrival: Instant,
    reason: FinishReason,
    has_first_token: bool,
    /// Its prompt as the KV events show it (only when they are published).
    prompt: Option<SeqPrompt>,
}

/// Everything behind the backend's one lock.
#[derive(Debug)]
struct State {
    engine: Engine,
    next_id: u64,
    live: HashMap<u64, Live>,
    metrics: RequestMetrics,
    /// Reused event buffer.
    events: Vec<EngineEvent>,
}

/// State shared by the driver, the handlers and the handle.
#[derive(Debug)]
struct Shared {
    model: String,
    /// LoRA adapters it serves; an adapter's engine id is its index.
    adapters: Vec<String>,
    residency_metrics: bool,
    flavour: Flavour,
    max_model_len: u32,
    /// The engine's KV block, in tokens: what its prefix keys are cut by.
    block_size: u32,
    time_scale: f64,
    clock: Clock,
    state: Mutex<State>,
    /// Wakes the driver after a submit or cancel changed the schedule.
    wake: Notify,
    fault: Mutex<Fault>,
    /// `/v1/*` requests seen under the `flaky` fault.
    flaky_seen: std::sync::atomic::AtomicU64,
    /// Triton flavours: live generate calls by their `triton-request-id`,
    /// for the LLM-API model's stop request; and the stop requests received.
    triton_ids: Mutex<HashMap<String, u64>>,
    stops: std::sync::atomic::AtomicU64,
    /// Responses API responses kept for `GET /v1/responses/{id}` (the
    /// last [`STORED_RESPONSES`]).
    stored: Mutex<std::collections::VecDeque<(String, Bytes)>>,
    /// Makes this backend's response ids unlike any other's, as an
    /// engine's random ids are.
    salt: u32,
    /// Cancelled when the server drains.
    stop: CancellationToken,
    /// Where its KV events are published, when they are.
    kv: Option<KvLink>,
}

impl Shared {
    fn new(cfg: SimBackendConfig, kv: Option<KvLink>) -> Arc<Self> {
        let time_scale = if cfg.engine.time_scale.is_finite() && cfg.engine.time_scale > 0.0 {
            cfg.engine.time_scale
        } else {
            1.0
        };
        Arc::new(Shared {
            model: cfg.model,
            adapters: cfg.adapters,
            residency_metrics: cfg.residency_metrics,
            flavour: cfg.flavour,
            max_model_len: cfg.engine.max_model_len,
            block_size: cfg.engine.block_size.max(1),
            time_scale,
            clock: Clock::new(),
            state: Mutex::new(State {
                engine: {
                    let mut e = Engine::new(cfg.engine);
                    if kv.is_some() {
                        e.record_cache_changes();
                    }
                    e
                },
                next_id: 1,
                live: HashMap::new(),
                metrics: RequestMetrics::new(),
                events: Vec::new(),
            }),
            wake: Notify::new(),
            fault: Mutex::new(cfg.fault),
            flaky_seen: Default::default(),
            triton_ids: Mutex::new(HashMap::new()),
            stops: Default::default(),
            stored: Default::default(),
            salt: id_salt(),
            stop: CancellationToken::new(),
            kv,
        })
    }

    /// The current simulated time.
    fn sim_now(&self) -> Instant {
        let wall = self.clock.now().as_nanos() as f64;
        Instant::from_nanos((wall * self.time_scale) as u64)
    }

    /// The wall instant at which simulated time reaches `t` (rounded up so
    /// that waking then finds the step ended).
    fn wall_at(&self, t: Instant) -> tokio::time::Instant {
        let wall = (t.as_nanos() as f64 / self.time_scale).ceil() as u64 + 1;
        tokio::time::Instant::from_std(self.clock.to_std(Instant::from_nanos(wall)))
    }

    /// Wall seconds from simulated `from` to `to`, as a client sees them.
    fn wall_secs(&self, from: Instant, to: Instant) -> f64 {
        (to - from).as_secs_f64() / self.time_scale
    }

    fn stats(&self) -> EngineStats {
        let now = self.sim_now();
        let mut st = self.state.lock();
        self.advance(&mut st, now);
        st.engine.stats()
    }

    /// Runs the engine up to `now` and hands each event to its request.
    fn advance(&self, st: &mut State, now: Instant) {
        let State {
            engine,
            live,
            metrics,
            events,
            ..
        } = st;
        events.clear();
        engine.advance(now, events);
        // Before the finished leave `live`: a sequence admitted and
        // finished in this advance still has its prompt.
        if let Some(kv) = &self.kv {
            kv.publish(engine.take_cache_changes(), self.block_size, |id| {
                live.get(&id).and_then(|l| l.prompt.as_ref())
            });
        }
        for ev in events.iter() {
            match *ev {
                EngineEvent::Token { id, index, at } => {
                    if let Some(l) = live.get_mut(&id) {
                        if !l.has_first_token {
                            l.has_first_token = true;
                            metrics.on_first_token(self.wall_secs(l.arrival, at));
                        }
                        // A closed receiver means the guard is about to cancel.
                        let _ = l.tx.send(Delivery::Token { index });
                    }
                }
                EngineEvent::Finished {
                    id,
                    at,
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                } => {
                    if let Some(l) = live.remove(&id) {
                        metrics.on_finished(l.reason, self.wall_secs(l.arrival, at));
                        let _ = l.tx.send(Delivery::Finished {
                            prompt_tokens,
                            completion_tokens,
                            cached_tokens,
                        });
                    }
                }
                EngineEvent::Admitted { .. } | EngineEvent::Preempted { .. } => {}
            }
        }
    }

    /// Puts a sequence for the base model in the engine; the guard cancels
    /// it when dropped.
    fn submit(
        self: &Arc<Self>,
        prompt_tokens: u32,
        output_tokens: u32,
        reason: FinishReason,
    ) -> Result<(SeqGuard, mpsc::UnboundedReceiver<Delivery>), EngineError> {
        self.submit_for(
            None,
            prompt_tokens,
            output_tokens,
            reason,
            (Vec::new(), None),
        )
    }

    /// The engine's adapter id of `model`: `None` for the base model, 404
    /// for a name it does not serve.
    fn adapter_of(&self, model: &str) -> Result<Option<u32>, openai::ApiError> {
        if model == self.model {
            return Ok(None);
        }
        match self.adapters.iter().position(|a| a == model) {
            Some(i) => Ok(Some(i as u32)),
            None => Err(openai::ApiError::model_not_found(model)),
        }
    }

    /// The keys of a request body's prompt blocks at the engine's block
    /// size, as Fairway keys them: what the prefix cache matches; and,
    /// when KV events are published, the prompt as they show it.
    fn prefix_keys(&self, model: &str, body: &[u8]) -> (Vec<u64>, Option<SeqPrompt>) {
        let Some(p) = crate::protocol::prompt::read(body) else {
            return (Vec::new(), None);
        };
        let salt = p.cache_salt.as_deref();
        let keys = crate::tokens::text_keys(model, salt, &p.text, self.block_size);
        let prompt = self.kv.as_ref().map(|_| SeqPrompt {
            ids: crate::tokens::approximate_ids(&p.text),
            lora: (model != self.model).then(|| model.to_owned()),
            salt: p.cache_salt.clone(),
        });
        (keys, prompt)
    }

    /// Puts a sequence in the engine, with `adapter` (see
    /// [`Shared::adapter_of`]) and its prompt's block keys.
    fn submit_for(
        self: &Arc<Self>,
        adapter: Option<u32>,
        prompt_tokens: u32,
        output_tokens: u32,
        reason: FinishReason,
        (prefix, prompt): (Vec<u64>, Option<SeqPrompt>),
    ) -> Result<(SeqGuard, mpsc::UnboundedReceiver<Delivery>), EngineError> {
        let now = self.sim_now();
        let (tx, rx) = mpsc::unbounded_channel();
        let id = {
            let mut st = self.state.lock();
            self.advance(&mut st, now);
            let id = st.next_id;
            st.next_id += 1;
            st.engine.submit(
                now,
                SeqRequest {
                    id,
                    prompt_tokens,
                    output_tokens,
                    adapter,
                    prefix,
                },
            )?;
            st.live.insert(
                id,
                Live {
                    tx,
                    arrival: now,
                    reason,
                    has_first_token: false,
                    prompt,
                },
            );
            id
        };
        self.wake.notify_one();
        Ok((
            SeqGuard {
                shared: Arc::clone(self),
                id,
            },
            rx,
        ))
    }

    /// Keeps a Responses API response for later `GET`s.
    fn store_response(&self, id: String, body: Bytes) {
        let mut stored = self.stored.lock();
        if stored.len() >= STORED_RESPONSES {
            stored.pop_front();
        }
        stored.push_back((id, body));
    }

    /// A kept response, removed when `delete`.
    fn stored_response(&self, id: &str, delete: bool) -> Option<Bytes> {
        let mut stored = self.stored.lock();
        let at = stored.iter().position(|(i, _)| i == id)?;
        if delete {
            stored.remove(at).map(|(_, b)| b)
        } else {
            Some(stored[at].1.clone())
        }
    }

    /// Remembers a generate call's `triton-request-id`, forgetting those of
    /// calls that ended.
    fn tag(&self, tag: String, id: u64) {
        let st = self.state.lock();
        let mut ids = self.triton_ids.lock();
        ids.retain(|_, seq| st.live.contains_key(seq));
        ids.insert(tag, id);
    }

    /// The LLM-API model's stop request: cancels the live call tagged
    /// `tag`, if it has not ended already (the client's connection closing
    /// may have cancelled it first). Counted either way.
    fn stop_tagged(&self, tag: &str) {
        self.stops
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = self.triton_ids.lock().remove(tag);
        if let Some(id) = id {
            self.cancel(id);
        }
    }

    /// Cancels sequence `id` unless the engine already finished it: it
    /// leaves the engine, counted as aborted.
    fn cancel(&self, id: u64) {
        let now = self.sim_now();
        let was_live = {
            let mut st = self.state.lock();
            match st.live.remove(&id) {
                Some(l) => {
                    st.engine.cancel(id);
                    let secs = self.wall_secs(l.arrival, now);
                    st.metrics.on_finished(FinishReason::Abort, secs);
                    true
                }
                None => false,
            }
        };
        if was_live {
            self.wake.notify_one();
        }
    }

    fn metrics_text(&self) -> String {
        let now = self.sim_now();
        let mut st = self.state.lock();
        self.advance(&mut st, now);
        let stats = st.engine.stats();
        match self.flavour {
            Flavour::Vllm => {
                let mut text =
                    metrics::render(&self.model, &stats, st.engine.kv_usage(), &st.metrics);
                if !self.adapters.is_empty() {
                    let name = |ids: &[u32]| -> Vec<&str> {
                        ids.iter()
                            .filter_map(|&i| self.adapters.get(i as usize).map(String::as_str))
                            .collect()
                    };
                    let lora = metrics::Lora {
                        max_loras: st.engine.params().max_loras,
                        active: name(&st.engine.active_adapters()),
                        loaded: name(st.engine.loaded_adapters()),
                        loads: stats.lora_loads_total,
                        load_seconds: st.engine.params().lora_load_time.as_secs_f64(),
                        residency: self.residency_metrics,
                        now_unix: crate::clock::unix_seconds() as f64,
                    };
                    metrics::render_lora(&mut text, &self.model, &lora);
                }
                text
            }
            Flavour::TritonTrtllm => triton::render_metrics(
                &self.model,
                triton::Backend::TensorRtLlm,
                &stats,
                &st.metrics,
            ),
            Flavour::TritonVllm => {
                triton::render_metrics(&self.model, triton::Backend::Vllm, &stats, &st.metrics)
            }
            Flavour::TritonTensor => {
                triton::render_metrics(&self.model, triton::Backend::Tensor, &stats, &st.metrics)
            }
        }
    }
}

/// Cancels its sequence on drop unless the engine already finished it.
#[derive(Debug)]
struct SeqGuard {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for SeqGuard {
    fn drop(&mut self) {
        self.shared.cancel(self.id);
    }
}

/// The engine task: sleeps until the next step boundary or a wake-up, then
/// advances. Task "sim-backend-driver", owned by the serve task's JoinSet.
async fn drive(shared: Arc<Shared>) {
    loop {
        let next = {
            let now = shared.sim_now();
            let mut st = shared.state.lock();
            shared.advance(&mut st, now);
            st.engine.next_event_at()
        };
        match next {
            Some(t) => {
                let deadline = shared.wall_at(t);
                tokio::select! {
                    () = shared.wake.notified() => {}
                    () = tokio::time::sleep_until(deadline) => {}
                }
            }
            None => shared.wake.notified().await,
        }
    }
}

#[cfg(test)]
mod tests;
