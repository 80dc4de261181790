//! The JSON document Fairway's own `fairway agent` sidecar serves, and the
//! reading the gateway makes of it.

use serde::{Deserialize, Serialize};

use super::{fraction, seconds};
use crate::core::reading::Reading;
use crate::core::time::Instant;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentGpu {
    /// Device index (NVML order).
    pub index: u32,
    /// Product name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    /// GPU utilisation over the last sample period, as a fraction 0..1.
    pub utilization: f64,
}

/// The JSON document `fairway agent` serves: the engine's signals already
/// normalised to base units (fractions, counts, seconds, bytes), plus what
/// NVML says about each GPU. Every engine field may be `null` or absent;
/// unknown fields are ignored so that newer agents stay readable.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentReading {
    /// KV-cache usage, 0..1.
    pub kv_usage: Option<f64>,
    pub running: Option<u32>,
    pub waiting: Option<u32>,
    /// TTFT p99 over the agent's last scrape window, seconds.
    pub ttft_p99_seconds: Option<f64>,
    /// End-to-end latency p99 over the agent's last scrape window, seconds.
    pub e2e_p99_seconds: Option<f64>,
    /// KV capacity in tokens.
    pub kv_tokens: Option<u64>,
    /// GPU memory over all the backend's GPUs; when absent, the sums of
    /// [`Self::gpus`] are used.
    pub gpu_memory_used_bytes: Option<u64>,
    pub gpu_memory_total_bytes: Option<u64>,
    #[serde(default)]
    pub gpus: Vec<AgentGpu>,
}

impl AgentReading {
    /// What the agent serves for an engine `reading` and its `gpus`.
    pub fn from_reading(reading: &Reading, gpus: Vec<AgentGpu>) -> Self {
        AgentReading {
            kv_usage: reading.kv_usage,
            running: reading.running,
            waiting: reading.waiting,
            ttft_p99_seconds: reading.ttft_p99.map(|d| d.as_secs_f64()),
            e2e_p99_seconds: reading.e2e_p99.map(|d| d.as_secs_f64()),
            kv_tokens: reading.kv_tokens,
            gpu_memory_used_bytes: reading.gpu_memory_used,
            gpu_memory_total_bytes: reading.gpu_memory_total,
            gpus,
        }
    }

    /// The gateway's reading of this document, read at `at`. Out-of-range
    /// values are dropped (negative or non-finite seconds) or clamped (KV
    /// usage to 0..1).
    pub fn to_reading(&self, at: Instant) -> Reading {
        let gpu_sum = |f: fn(&AgentGpu) -> u64| {
            if self.gpus.is_empty() {
                None
            } else {
                Some(self.gpus.iter().map(f).fold(0u64, u64::saturating_add))
            }
        };
        Reading {
            at,
            kv_usage: self.kv_usage.and_then(fraction),
            running: self.running,
            waiting: self.waiting,
            ttft_p99: self.ttft_p99_seconds.and_then(seconds),
            e2e_p99: self.e2e_p99_seconds.and_then(seconds),
            kv_tokens: self.kv_tokens,
            gpu_memory_used: self
                .gpu_memory_used_bytes
                .or_else(|| gpu_sum(|g| g.memory_used_bytes)),
            gpu_memory_total: self
                .gpu_memory_total_bytes
                .or_else(|| gpu_sum(|g| g.memory_total_bytes)),
            // The agent's document does not carry adapters (yet).
            lora: None,
        }
    }
}
