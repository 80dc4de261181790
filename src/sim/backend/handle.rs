//! Starting an in-process simulated backend: [`SimBackend`]'s builder and
//! the handle of the running server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::kv_publisher::KvLink;
use super::{Fault, Flavour, Shared, SimBackendConfig, serve_shared};
use crate::config::EngineParams;
use crate::sim::engine::EngineStats;

/// Entry point for starting an in-process simulated backend.
#[derive(Debug)]
pub struct SimBackend;

impl SimBackend {
    /// A builder for a backend serving `model` with default engine parameters
    /// on `127.0.0.1:0`.
    pub fn builder(model: impl Into<String>) -> SimBackendBuilder {
        SimBackendBuilder {
            cfg: SimBackendConfig {
                model: model.into(),
                engine: EngineParams::default(),
                fault: Fault::None,
                flavour: Flavour::Vllm,
                adapters: Vec::new(),
                residency_metrics: false,
                kv_events: None,
            },
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        }
    }
}

/// Builds and starts a simulated backend; see [`SimBackend::builder`].
#[derive(Clone, Debug)]
#[must_use]
pub struct SimBackendBuilder {
    cfg: SimBackendConfig,
    listen: SocketAddr,
}

impl SimBackendBuilder {
    /// Most sequences in the running batch.
    pub fn max_num_seqs(mut self, n: u32) -> Self {
        self.cfg.engine.max_num_seqs = n;
        self
    }

    /// KV cache capacity in tokens.
    pub fn kv_tokens(mut self, tokens: u64) -> Self {
        self.cfg.engine.kv_tokens = tokens;
        self
    }

    /// Prefill throughput, prompt tokens per simulated second.
    pub fn prefill_tokens_per_s(mut self, tokens_per_s: f64) -> Self {
        self.cfg.engine.prefill_tokens_per_s = tokens_per_s;
        self
    }

    /// Decode step time (simulated): `base` for one sequence plus `per_seq`
    /// for each additional one.
    pub fn decode_step(mut self, base: Duration, per_seq: Duration) -> Self {
        self.cfg.engine.decode_step_base = base;
        self.cfg.engine.decode_step_per_seq = per_seq;
        self
    }

    /// Simulated seconds per wall second (10.0 runs ten times faster).
    pub fn time_scale(mut self, scale: f64) -> Self {
        self.cfg.engine.time_scale = scale;
        self
    }

    /// Longest prompt + output accepted, in tokens.
    pub fn max_model_len(mut self, tokens: u32) -> Self {
        self.cfg.engine.max_model_len = tokens;
        self
    }

    /// Replaces all engine parameters.
    pub fn engine(mut self, params: EngineParams) -> Self {
        self.cfg.engine = params;
        self
    }

    /// LoRA adapters it serves, by name, with at most `max_loras` on the
    /// GPU at once.
    pub fn lora(mut self, adapters: &[&str], max_loras: u32) -> Self {
        self.cfg.adapters = adapters.iter().map(|a| a.to_string()).collect();
        self.cfg.engine.max_loras = max_loras;
        self
    }

    /// Also export the LoRA residency series (see
    /// [`SimBackendConfig::residency_metrics`]).
    pub fn lora_residency_metrics(mut self) -> Self {
        self.cfg.residency_metrics = true;
        self
    }

    /// The server it imitates.
    pub fn flavour(mut self, flavour: Flavour) -> Self {
        self.cfg.flavour = flavour;
        self
    }

    /// The address to bind (port 0 picks a free one).
    /// Publishes KV events as vLLM does, on a PUB and a replay socket at
    /// these addresses (port 0: any free one; see
    /// [`SimHandle::kv_events`]).
    pub fn kv_events(mut self, publish: SocketAddr, replay: SocketAddr) -> Self {
        self.cfg.kv_events = Some((publish, replay));
        self
    }

    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Binds the listener and starts serving in a background task.
    pub async fn start(self) -> std::io::Result<SimHandle> {
        let listener = TcpListener::bind(self.listen).await?;
        let addr = listener.local_addr()?;
        let kv = match self.cfg.kv_events {
            Some((publish, replay)) => Some(KvLink::bind(publish, replay).await?),
            None => None,
        };
        let shared = Shared::new(self.cfg, kv);
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let stop = async move {
            let _ = stop_rx.await;
        };
        // Task "sim-backend-serve", owned by the handle; shutdown() stops it,
        // Drop aborts it (and with it every connection and the driver).
        let task = tokio::spawn(serve_shared(listener, Arc::clone(&shared), stop));
        Ok(SimHandle {
            addr,
            shared,
            stop: Some(stop_tx),
            task: Some(task),
        })
    }
}

/// A running in-process simulated backend.
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl SimHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL, `http://IP:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The KV-event PUB and replay endpoints (`tcp://IP:PORT`), when it
    /// publishes them.
    pub fn kv_events(&self) -> Option<(String, String)> {
        let kv = self.shared.kv.as_ref()?;
        Some((kv.endpoint.clone(), kv.replay.clone()))
    }

    /// Numbers the next `n` KV-event batches but does not send them (as a
    /// PUB socket drops messages for a slow subscriber): the subscriber
    /// sees a gap; the replay socket still has them.
    pub fn lose_kv_batches(&self, n: u64) {
        if let Some(kv) = &self.shared.kv {
            kv.drop_next.store(n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Switches the failure mode for requests arriving from now on.
    pub fn set_fault(&self, fault: Fault) {
        *self.shared.fault.lock() = fault;
    }

    /// The engine's current state and counters.
    pub fn stats(&self) -> EngineStats {
        self.shared.stats()
    }

    /// Triton flavours: stop requests (`{"stop": true}` with a
    /// `triton-request-id`) received so far.
    pub fn stop_requests(&self) -> u64 {
        self.shared.stops.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops accepting, lets in-flight responses finish, and waits.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "sim backend stopped with an error"),
                Err(e) => tracing::warn!(error = %e, "sim backend task failed"),
            }
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        if let Some(kv) = &self.shared.kv {
            kv.stop.cancel();
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
