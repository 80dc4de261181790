//! `fairway agent`: the process that runs on a GPU node and serves what the
//! gateway and the placement service need to know about it.
//!
//! Two roles, one binary:
//! - **beside an engine** (`--engine-metrics`): one JSON [`AgentReading`]
//!   per `GET /reading`, which the gateway's poller pulls with
//!   `metrics = "agent"`;
//! - **on the node** (without `--engine-metrics`, as a DaemonSet): the
//!   node's GPUs only.
//!
//! Either way `GET /node` serves a [`NodeReading`] for `fairway placement`:
//! the node's name, its GPUs, and the engine's model, GPUs and TTFT p99.
//!
//! - [`engine`]: scrapes the local engine's Prometheus metrics and decodes
//!   them with the shared [`Decoder`] (vLLM, Triton, SGLang or llama.cpp).
//! - `gpu`: per-GPU memory and utilisation from NVML, behind the `nvml`
//!   cargo feature. NVML is loaded at run time, so an agent built with the
//!   feature still starts (and serves the engine part) on a machine without
//!   a GPU or driver; so does one built without it. `--simulate-gpus`
//!   reports given GPUs instead (tests and demos without a GPU).
//! - [`server`]: the HTTP endpoints.
//!
//! Owns no scheduling: it normalises signals and hands them over. Invariant:
//! every `/reading` answer is either a complete reading of a fresh engine
//! scrape (200) or a 502 naming the engine URL and the cause, so a dead
//! engine is never reported as an idle one.
//!
//! The agent keeps one [`Decoder`] per reader, so each `/reading`'s p99s
//! cover the window since the previous `/reading` request, and each
//! `/node`'s since the previous `/node`: poll one agent from one gateway
//! and one placement service.
//!
//! [`AgentReading`]: crate::poller::dialect::AgentReading
//! [`Decoder`]: crate::poller::dialect::Decoder

pub mod engine;
mod gpu;
pub mod node;
pub mod server;

use std::path::PathBuf;
use std::time::Duration;

use crate::config::policy::MetricsDialect;
use crate::poller::dialect::AgentGpu;

pub use engine::{AgentConfigError, MAX_SCRAPE_BYTES};
pub use node::{EngineOnNode, NodeReading, parse_simulated_gpus};
pub use server::serve;

/// What one agent scrapes and how.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// The engine's metrics endpoint, a full `http://host:port/path` URL
    /// (a URL without a path means `/metrics`); `None`: a node agent,
    /// serving the GPUs only.
    pub engine_metrics: Option<String>,
    /// How the engine names its metrics; `agent` and `none` are refused.
    pub dialect: MetricsDialect,
    /// The most one engine scrape may take, connect to last body byte;
    /// must be above zero.
    pub timeout: Duration,
    /// The NVML library to load instead of the system's
    /// `libnvidia-ml.so.1`; ignored without the `nvml` feature.
    pub nvml_lib: Option<PathBuf>,
    /// The node's name as Kubernetes knows it (`spec.nodeName`).
    pub node: String,
    /// The model the engine serves, as placement counts it on its GPUs.
    pub model: Option<String>,
    /// The node's indices (NVML's order on the host) of the GPUs the
    /// engine runs on; `None`: not known (placement then holds the
    /// engine's latency against every GPU of the node and counts its model
    /// on none).
    pub engine_gpus: Option<Vec<u32>>,
    /// GPUs reported instead of NVML's.
    pub simulated_gpus: Option<Vec<AgentGpu>>,
}

impl AgentConfig {
    /// An agent beside the engine whose metrics are at `url`, with the
    /// defaults of the command line and this host's name as the node.
    pub fn for_engine(url: impl Into<String>) -> Self {
        AgentConfig {
            engine_metrics: Some(url.into()),
            ..AgentConfig::for_node(node::host_name())
        }
    }

    /// A node agent (no engine) on `node`.
    pub fn for_node(node: impl Into<String>) -> Self {
        AgentConfig {
            engine_metrics: None,
            dialect: MetricsDialect::Vllm,
            timeout: Duration::from_secs(1),
            nvml_lib: None,
            node: node.into(),
            model: None,
            engine_gpus: None,
            simulated_gpus: None,
        }
    }

    /// Checks the URL, the dialect and the timeout, as [`serve`] does before
    /// it accepts anything.
    pub fn validate(&self) -> Result<(), AgentConfigError> {
        if self.node.trim().is_empty() {
            return Err(AgentConfigError::NoNode);
        }
        match &self.engine_metrics {
            Some(url) => engine::check(url, self).map(|_| ()),
            None => Ok(()),
        }
    }
}
