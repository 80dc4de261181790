//! `fairway agent`: the sidecar that runs beside one inference engine on a
//! GPU node and serves one JSON [`AgentReading`] per request, which the
//! gateway's poller pulls with `metrics = "agent"`.
//!
//! - [`engine`]: scrapes the local engine's Prometheus metrics and decodes
//!   them with the shared [`Decoder`] (vLLM, Triton, SGLang or llama.cpp).
//! - `gpu`: per-GPU memory and utilisation from NVML, behind the `nvml`
//!   cargo feature. NVML is loaded at run time, so an agent built with the
//!   feature still starts (and serves the engine part) on a machine without
//!   a GPU or driver; so does one built without it.
//! - [`server`]: the HTTP endpoints (`GET /reading`, `GET /health`).
//!
//! Owns no scheduling: it normalises signals and hands them over. Invariant:
//! every `/reading` answer is either a complete reading of a fresh engine
//! scrape (200) or a 502 naming the engine URL and the cause, so a dead
//! engine is never reported as an idle one.
//!
//! The agent keeps one [`Decoder`], so each reading's p99s cover the window
//! since the previous `/reading` request, whoever made it: poll one agent
//! from one gateway.
//!
//! [`AgentReading`]: crate::poller::dialect::AgentReading
//! [`Decoder`]: crate::poller::dialect::Decoder

pub mod engine;
mod gpu;
pub mod server;

use std::path::PathBuf;
use std::time::Duration;

use crate::config::policy::MetricsDialect;

pub use engine::{AgentConfigError, MAX_SCRAPE_BYTES, ScrapeError};
pub use server::serve;

/// What one agent scrapes and how.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// The engine's metrics endpoint, a full `http://host:port/path` URL
    /// (a URL without a path means `/metrics`).
    pub engine_metrics: String,
    /// How the engine names its metrics; `agent` and `none` are refused.
    pub dialect: MetricsDialect,
    /// The most one engine scrape may take, connect to last body byte;
    /// must be above zero.
    pub timeout: Duration,
    /// The NVML library to load instead of the system's
    /// `libnvidia-ml.so.1`; ignored without the `nvml` feature.
    pub nvml_lib: Option<PathBuf>,
}

impl AgentConfig {
    /// Checks the URL, the dialect and the timeout, as [`serve`] does before
    /// it accepts anything.
    pub fn validate(&self) -> Result<(), AgentConfigError> {
        engine::check(self).map(|_| ())
    }
}
