//! What the server runs beside the gateway and changes on reload: the
//! in-process simulated backends, the pollers, the client listener's TLS
//! configuration and the policy's source. The request path needs none of
//! it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;

use crate::config::{BackendTarget, Policy};
use crate::core::spec::Api;
use crate::gateway::state::Gateway;
use crate::poller::Pollers;
use crate::sim::backend::{SimBackend, SimHandle};

/// The gateway and what the server runs beside it.
pub struct Services {
    pub gateway: Arc<Gateway>,
    /// `host:port` of sim backends started in-process, by backend name.
    pub sim_authorities: Mutex<HashMap<String, String>>,
    /// Handles of those sim backends (dropping one stops it).
    pub sims: Mutex<Vec<(String, SimHandle)>>,
    /// The policy file, for reloads.
    pub source: Mutex<PolicySource>,
    /// Serialises reloads.
    pub reload_lock: tokio::sync::Mutex<()>,
    /// TLS configuration of the client listener, re-read on reload.
    pub tls: ArcSwapOption<rustls::ServerConfig>,
    /// One poller task per backend.
    pub pollers: Mutex<Pollers>,
    /// The Files and Batch APIs and their runner (`[batch]`, read at
    /// start).
    pub batches: Option<Arc<crate::batch::Batches>>,
}

impl Services {
    /// The KV-event endpoints (publisher, replay) of the in-process
    /// simulated backends that publish them, by backend name.
    pub fn sim_kv_events(&self) -> HashMap<String, (String, String)> {
        self.sims
            .lock()
            .iter()
            .filter_map(|(n, h)| h.kv_events().map(|e| (n.clone(), e)))
            .collect()
    }
}

/// Where the policy came from, for reloads.
#[derive(Clone, Debug, Default)]
pub struct PolicySource {
    /// The file to re-read on reload (`None`: the policy was given in memory).
    pub path: Option<PathBuf>,
    /// Its text (for the hash shown by `/admin/policy`).
    pub text: String,
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
                // A Triton backend is simulated as Triton (TensorRT-LLM),
                // serving the model under its name there.
                let flavour = match b.protocol {
                    Api::Triton => crate::sim::backend::Flavour::TritonTrtllm,
                    Api::OpenAi => crate::sim::backend::Flavour::Vllm,
                };
                let name = b.served_model.clone().unwrap_or_else(|| pool.model.clone());
                let mut builder = SimBackend::builder(name)
                    .engine(params.clone())
                    .flavour(flavour);
                if b.kv_events.is_some() {
                    // `kv_events = true`: it publishes, on ports of its own.
                    let any = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
                    builder = builder.kv_events(any, any);
                }
                let h = builder.start().await?;
                tracing::info!(backend = %b.name, addr = %h.addr(), "started simulated backend");
                out.push((b.name.clone(), h));
            }
        }
    }
    Ok(out)
}
