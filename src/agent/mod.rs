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

mod config;
pub mod engine;
mod gpu;
pub mod node;
pub mod server;

pub use config::*;
pub use engine::MAX_SCRAPE_BYTES;
pub use node::{EngineOnNode, NodeReading, SimulatedGpusError, parse_simulated_gpus};
pub use server::serve;
