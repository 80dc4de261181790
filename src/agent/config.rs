//! The agent's configuration: the engine it reads, its dialect, timeout and node name.

use super::engine::AgentConfigError;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::policy::MetricsDialect;
use crate::poller::dialect::AgentGpu;

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
            ..AgentConfig::for_node(super::node::host_name())
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
            Some(url) => super::engine::check(url, self).map(|_| ()),
            None => Ok(()),
        }
    }
}
