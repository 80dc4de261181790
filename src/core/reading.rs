//! A backend's normalised reading: what its metrics said at one instant.
//! Produced by the poller (any dialect); consumed by routing and windows.

use std::time::Duration;

use crate::core::time::Instant;

/// One backend's normalised scrape. Fields a dialect does not export are `None`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reading {
    /// When it was read, on the scheduler's clock.
    pub at: Instant,
    /// KV-cache usage, 0..1.
    pub kv_usage: Option<f64>,
    /// Requests in the engine's running batch.
    pub running: Option<u32>,
    /// Requests queued inside the engine.
    pub waiting: Option<u32>,
    /// TTFT p99 over the last scrape window.
    pub ttft_p99: Option<Duration>,
    /// End-to-end latency p99 over the last scrape window.
    pub e2e_p99: Option<Duration>,
    /// KV capacity in tokens, when the backend reports it.
    pub kv_tokens: Option<u64>,
    /// GPU memory used and total, in bytes, when known.
    pub gpu_memory_used: Option<u64>,
    pub gpu_memory_total: Option<u64>,
    /// LoRA adapters, when the engine reports them.
    pub lora: Option<LoraReading>,
}

/// What an engine says of its LoRA adapters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoraReading {
    /// Adapters it has loaded on the GPU (`resident`), or, from vLLM's
    /// `lora_requests_info`, those its running and waiting requests use
    /// (loaded, or about to be).
    pub adapters: Vec<String>,
    /// `true`: `adapters` is the engine's GPU residency
    /// (`vllm:lora_adapter_loaded`), not only its activity.
    pub resident: bool,
    /// Most adapters it holds on the GPU at once (`--max-loras`).
    pub max_loaded: Option<u32>,
}
