//! Metrics dialects: how each kind of backend names the signals Fairway
//! schedules on, and how a scrape becomes a [`Reading`].
//!
//! Rules shared by every Prometheus dialect:
//! - Series whose name ends in `_created` (creation timestamps that Python's
//!   `prometheus_client` adds) are dropped before anything else.
//! - Counts (running, waiting) and bytes are summed over every series of the
//!   metric, so a vLLM data-parallel deployment (one series per `engine`
//!   label) or a Triton server with several models or GPUs reads as a whole.
//! - Fractions (KV usage) are averaged over the series instead, because the
//!   sum of per-engine fractions is not a fraction. Values are clamped to
//!   0..1.
//! - `NaN` and infinite values count as missing; negative counts too.
//! - Histogram buckets are summed by their `le` bound over every series, and
//!   a [`HistogramWindow`] turns the cumulative buckets of two consecutive
//!   scrapes into the p99 of what was observed in between.
//!
//! Per dialect (names as in the backend reference, `backends.md`):
//! - `vllm`: `vllm:kv_cache_usage_perc`, falling back to the pre-0.9
//!   `vllm:gpu_cache_usage_perc`; `vllm:num_requests_running`,
//!   `vllm:num_requests_waiting`; histograms
//!   `vllm:time_to_first_token_seconds` and `vllm:e2e_request_latency_seconds`;
//!   KV capacity from `vllm:cache_config_info{block_size,num_gpu_blocks}`.
//! - `triton`: KV usage from the TensorRT-LLM backend's
//!   `nv_trt_llm_kv_cache_block_metrics` as `used`/`max`, checked against
//!   `free` and `fraction` (see [`kv_from_blocks`]: the reporter can shift
//!   values onto the wrong labels); KV capacity `max` × `tokens_per`;
//!   running `nv_trt_llm_request_metrics{request_type="scheduled"}` (else
//!   `"active"`); waiting `request_type="waiting"`, else the generic
//!   `nv_inference_pending_request_count`, except for a decoupled model
//!   (the vLLM backend's `vllm:` series present), where it reads about 0
//!   under load and is not used; GPU memory from
//!   `nv_gpu_memory_used_bytes` / `nv_gpu_memory_total_bytes`; TTFT from the
//!   opt-in `nv_inference_first_response_histogram_ms` (milliseconds; bucket
//!   lines with or without `_bucket`), else from the vLLM backend's
//!   `vllm:time_to_first_token_seconds`; end-to-end only from the vLLM
//!   backend's `vllm:e2e_request_latency_seconds`.
//! - `trtllm` (`trtllm-serve`): `trtllm_kv_cache_used_blocks` /
//!   `trtllm_kv_cache_max_blocks` checked against `_free_blocks` and
//!   `trtllm_kv_cache_utilization` as for `triton`; capacity ×
//!   `trtllm_kv_cache_tokens_per_block`; `trtllm_num_requests_running`,
//!   `trtllm_num_requests_waiting`; histograms
//!   `trtllm_time_to_first_token_seconds`,
//!   `trtllm_e2e_request_latency_seconds`.
//! - `sglang`: `sglang:token_usage`, `sglang:num_running_reqs`,
//!   `sglang:num_queue_reqs`, histograms `sglang:time_to_first_token_seconds`
//!   and `sglang:e2e_request_latency_seconds`, KV capacity from
//!   `sglang:cache_config_info{page_size,num_pages}`.
//! - `llamacpp`: `llamacpp:requests_processing`, `llamacpp:requests_deferred`,
//!   and `llamacpp:kv_cache_usage_ratio` where a build still exports it
//!   (it was removed upstream in 2025).
//! - `agent`: the body is JSON, an [`AgentReading`]; the sidecar has already
//!   computed the p99s, so no histogram window is involved.
//! - `none`: there is nothing to decode; [`Decoder::decode`] returns
//!   [`DecodeError::NoDialect`]. The poller should not scrape such a
//!   backend at all.
//!
//! Each reading's load signals carry their source ([`Sources`]: the series
//! read, or why none was), which `/metrics` shows per backend.
//!
//! A scrape that parses but holds none of the dialect's metrics is an error
//! ([`DecodeError::NoKnownMetrics`]), since it almost always means a wrong
//! dialect or a wrong port in the policy file.
//!
//! The histogram arithmetic is in `histogram`, the agent's document in
//! `agent`.

mod agent;
mod histogram;

use std::time::Duration;

pub use self::agent::{AgentGpu, AgentReading};
pub use self::histogram::{HistogramBucket, HistogramWindow, collect_buckets, quantile};

use crate::config::policy::MetricsDialect;
use crate::core::reading::{LoraReading, Reading};
use crate::core::time::Instant;
use crate::poller::expo::{self, ParseError, Sample};

/// Why a scrape could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The body is not a Prometheus exposition.
    #[error("metrics text: {0}")]
    Parse(#[from] ParseError),
    /// The body is not an agent JSON document.
    #[error("agent JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The body parsed, but holds none of the dialect's metrics.
    #[error("no {dialect:?} metrics in the scrape")]
    NoKnownMetrics { dialect: MetricsDialect },
    /// The backend's dialect is `none`: there is nothing to decode.
    #[error("metrics dialect is `none`; nothing to decode")]
    NoDialect,
}

/// One GPU as the agent reports it.
/// Decodes one backend's scrapes, keeping the histogram baselines between
/// them. One `Decoder` per backend.
#[derive(Clone, Debug)]
pub struct Decoder {
    dialect: MetricsDialect,
    ttft: HistogramWindow,
    e2e: HistogramWindow,
    sources: Sources,
    /// Whether the Triton model is decoupled, from its model configuration
    /// (`None`: not read).
    decoupled: Option<bool>,
}

impl Decoder {
    pub fn new(dialect: MetricsDialect) -> Self {
        Decoder {
            dialect,
            ttft: HistogramWindow::new(),
            e2e: HistogramWindow::new(),
            sources: Sources::default(),
            decoupled: None,
        }
    }

    /// The Triton model's transaction policy, read from its configuration
    /// (`model_transaction_policy.decoupled`).
    pub fn set_decoupled(&mut self, decoupled: bool) {
        self.decoupled = Some(decoupled);
    }

    /// Where the last good reading's load signals came from.
    pub fn sources(&self) -> Sources {
        self.sources
    }

    pub fn dialect(&self) -> MetricsDialect {
        self.dialect
    }

    /// Decodes a scrape `body` read at `at`.
    ///
    /// A failed decode leaves the histogram baselines as they were, so the
    /// next good scrape's p99 covers both windows.
    pub fn decode(&mut self, body: &str, at: Instant) -> Result<Reading, DecodeError> {
        let signals = match self.dialect {
            MetricsDialect::None => return Err(DecodeError::NoDialect),
            MetricsDialect::Agent => {
                let agent: AgentReading = serde_json::from_str(body)?;
                return Ok(agent.to_reading(at));
            }
            dialect => {
                let parsed = expo::parse(body)?;
                let samples: Vec<&Sample> = parsed
                    .samples
                    .iter()
                    .filter(|s| !s.name.ends_with("_created"))
                    .collect();
                let signals = match dialect {
                    MetricsDialect::Triton => triton(&samples, self.decoupled),
                    MetricsDialect::Trtllm => trtllm(&samples),
                    MetricsDialect::Sglang => sglang(&samples),
                    MetricsDialect::Llamacpp => llamacpp(&samples),
                    _ => vllm(&samples),
                };
                if signals.is_empty() {
                    return Err(DecodeError::NoKnownMetrics { dialect });
                }
                signals
            }
        };
        self.sources = signals.sources;
        let ttft = self.ttft.observe(&signals.ttft);
        let e2e = self.e2e.observe(&signals.e2e);
        Ok(Reading {
            at,
            kv_usage: signals.kv_usage.and_then(fraction),
            running: signals.running.and_then(count),
            waiting: signals.waiting.and_then(count),
            ttft_p99: ttft.and_then(|v| seconds(v * signals.ttft_scale)),
            e2e_p99: e2e.and_then(|v| seconds(v * signals.e2e_scale)),
            kv_tokens: signals.kv_tokens,
            gpu_memory_used: signals.gpu_used.and_then(bytes),
            gpu_memory_total: signals.gpu_total.and_then(bytes),
            lora: signals.lora,
        })
    }
}

/// What a Prometheus dialect found, before unit conversion.
#[derive(Debug, Default)]
struct Signals {
    kv_usage: Option<f64>,
    running: Option<f64>,
    waiting: Option<f64>,
    kv_tokens: Option<u64>,
    gpu_used: Option<f64>,
    gpu_total: Option<f64>,
    ttft: Vec<HistogramBucket>,
    /// Seconds per unit of the TTFT bucket bounds.
    ttft_scale: f64,
    e2e: Vec<HistogramBucket>,
    e2e_scale: f64,
    sources: Sources,
    lora: Option<LoraReading>,
}

/// Which series each of a reading's load signals came from, for the
/// operator (`fairway_backend_reading_source`). `None`: not read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sources {
    pub kv_usage: Option<&'static str>,
    pub running: Option<&'static str>,
    pub waiting: Option<&'static str>,
}

impl Sources {
    /// (signal, source) pairs, for metrics.
    pub fn pairs(&self) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
        [
            ("kv_usage", self.kv_usage),
            ("running", self.running),
            ("waiting", self.waiting),
        ]
        .into_iter()
        .filter_map(|(signal, source)| source.map(|s| (signal, s)))
    }
}

impl Signals {
    fn new() -> Self {
        Signals {
            ttft_scale: 1.0,
            e2e_scale: 1.0,
            ..Signals::default()
        }
    }

    fn is_empty(&self) -> bool {
        self.kv_usage.is_none()
            && self.running.is_none()
            && self.waiting.is_none()
            && self.kv_tokens.is_none()
            && self.gpu_used.is_none()
            && self.gpu_total.is_none()
            && self.ttft.is_empty()
            && self.e2e.is_empty()
            && self.sources.waiting.is_none()
    }
}

fn vllm(samples: &[&Sample]) -> Signals {
    let mut s = Signals::new();
    (s.kv_usage, s.sources.kv_usage) = first(
        samples,
        &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
        mean,
    );
    (s.running, s.sources.running) = first(samples, &["vllm:num_requests_running"], sum);
    (s.waiting, s.sources.waiting) = first(samples, &["vllm:num_requests_waiting"], sum);
    s.kv_tokens = capacity(
        samples,
        "vllm:cache_config_info",
        "block_size",
        "num_gpu_blocks",
    );
    s.ttft = collect_buckets(
        samples.iter().copied(),
        "vllm:time_to_first_token_seconds",
        false,
    );
    s.e2e = collect_buckets(
        samples.iter().copied(),
        "vllm:e2e_request_latency_seconds",
        false,
    );
    s.lora = vllm_lora(samples);
    s
}

/// vLLM's LoRA adapters: GPU residency from `vllm:lora_adapter_loaded`
/// (`{adapter_name, level="gpu"}` = 1, with `vllm:max_gpu_lora_adapters`)
/// where the engine exports it; else `vllm:lora_requests_info`, an info
/// gauge whose newest series (the largest value, a timestamp) lists the
/// adapters of running and waiting requests (`running_lora_adapters`,
/// `waiting_lora_adapters`, comma-separated) and `max_lora`. vLLM fills
/// both lists from one dict, so they are read as one set.
fn vllm_lora(samples: &[&Sample]) -> Option<LoraReading> {
    let resident: Vec<&Sample> = samples
        .iter()
        .copied()
        .filter(|s| s.name == "vllm:lora_adapter_loaded")
        .collect();
    if !resident.is_empty() {
        let mut adapters: Vec<String> = resident
            .iter()
            .filter(|s| s.value >= 1.0 && s.label("level").is_none_or(|l| l == "gpu"))
            .filter_map(|s| s.label("adapter_name").map(str::to_owned))
            .collect();
        adapters.sort();
        adapters.dedup();
        let max_loaded = samples
            .iter()
            .find(|s| s.name == "vllm:max_gpu_lora_adapters")
            .and_then(|s| count(s.value));
        return Some(LoraReading {
            adapters,
            resident: true,
            max_loaded,
        });
    }
    let info = samples
        .iter()
        .filter(|s| s.name == "vllm:lora_requests_info" && s.value.is_finite())
        .max_by(|a, b| a.value.total_cmp(&b.value))?;
    let mut adapters: Vec<String> = ["running_lora_adapters", "waiting_lora_adapters"]
        .iter()
        .filter_map(|l| info.label(l))
        .flat_map(|list| list.split(','))
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect();
    adapters.sort();
    adapters.dedup();
    Some(LoraReading {
        adapters,
        resident: false,
        max_loaded: info.label("max_lora").and_then(|m| m.trim().parse().ok()),
    })
}

/// How far a reported KV fraction may be from `used`/`max` and still agree.
const KV_AGREEMENT: f64 = 0.02;

/// KV usage from block counts (`used`, `free`, `max`) and a reported
/// fraction. TensorRT-LLM's reporter skips keys missing from the
/// executor's stats and assigns the rest to labels by position, so one
/// missing key shifts values onto the wrong labels. The counts are used
/// when they hold together (`used + free = max`, within a block or 1 %) or
/// agree with the fraction; the fraction alone when there are no counts;
/// nothing when the figures contradict each other (the gateway then
/// routes on its own in-flight counts). Values outside 0..1 are rejected,
/// not clamped. Returns the usage and its source, named by `names`
/// (the counts, the fraction, the rejection).
fn kv_from_blocks(
    counts: (Option<f64>, Option<f64>, Option<f64>),
    fraction: Option<f64>,
    names: [&'static str; 3],
) -> (Option<f64>, Option<&'static str>) {
    let (used, free, max) = counts;
    let in_range = |v: f64| (0.0..=1.0).contains(&v).then_some(v);
    let ratio = match (used, max) {
        (Some(u), Some(m)) if m > 0.0 => in_range(u / m),
        _ => None,
    };
    let consistent = match (used, free, max) {
        (Some(u), Some(f), Some(m)) => Some((u + f - m).abs() <= (0.01 * m).max(1.0)),
        _ => None,
    };
    let fraction = fraction.and_then(in_range);
    if max == Some(0.0) {
        // No cache (yet): nothing to read.
        return (None, None);
    }
    match (ratio, fraction, consistent) {
        (Some(r), _, Some(true)) => (Some(r), Some(names[0])),
        (Some(r), Some(f), _) if (r - f).abs() <= KV_AGREEMENT => (Some(r), Some(names[0])),
        (Some(r), None, None) => (Some(r), Some(names[0])),
        (None, Some(f), None) if used.is_none() || max.is_none() => (Some(f), Some(names[1])),
        (None, None, None) if used.is_none() && max.is_none() => (None, None),
        _ => (None, Some(names[2])),
    }
}

/// `decoupled`: the model's transaction policy, where its configuration
/// was read.
fn triton(samples: &[&Sample], decoupled: Option<bool>) -> Signals {
    const KV: &str = "nv_trt_llm_kv_cache_block_metrics";
    const REQ: &str = "nv_trt_llm_request_metrics";
    const PENDING: &str = "nv_inference_pending_request_count";
    fn kv(ty: &str) -> Option<(&str, &str)> {
        Some(("kv_cache_block_type", ty))
    }
    fn req(ty: &str) -> Option<(&str, &str)> {
        Some(("request_type", ty))
    }
    let mut s = Signals::new();
    (s.kv_usage, s.sources.kv_usage) = kv_from_blocks(
        (
            sum(samples, KV, kv("used")),
            sum(samples, KV, kv("free")),
            sum(samples, KV, kv("max")),
        ),
        mean(samples, KV, kv("fraction")),
        [
            "nv_trt_llm_kv_cache_block_metrics used/max",
            "nv_trt_llm_kv_cache_block_metrics fraction",
            "none: nv_trt_llm_kv_cache_block_metrics contradicts itself",
        ],
    );
    s.kv_tokens = match (
        sum(samples, KV, kv("max")),
        mean(samples, KV, kv("tokens_per")),
    ) {
        (Some(blocks), Some(per)) => bytes(blocks * per),
        _ => None,
    };
    if let Some(n) = sum(samples, REQ, req("scheduled")) {
        s.running = Some(n);
        s.sources.running = Some("nv_trt_llm_request_metrics scheduled");
    } else if let Some(n) = sum(samples, REQ, req("active")) {
        s.running = Some(n);
        s.sources.running = Some("nv_trt_llm_request_metrics active");
    }
    // The generic pending count is decremented when the backend's execute()
    // is entered; decoupled models (Triton's vLLM backend, the TensorRT-LLM
    // LLM-API model, a decoupled Python model) return from it at once, so
    // it reads about 0 under load. It is a queue only for classic models:
    // for a decoupled one (by its configuration, or the vLLM backend's
    // series where the configuration was not read) the gateway's own
    // in-flight count stands in.
    let vllm_backend = samples.iter().any(|x| x.name.starts_with("vllm:"));
    let pending = sum(samples, PENDING, None);
    if let Some(n) = sum(samples, REQ, req("waiting")) {
        s.waiting = Some(n);
        s.sources.waiting = Some("nv_trt_llm_request_metrics waiting");
    } else if decoupled == Some(true) && pending.is_some() {
        // Triton's own series, read and set aside: a reading all the same.
        s.sources.waiting = Some(
            "none: decoupled model (its model configuration), the gateway's in-flight count is used",
        );
    } else if decoupled.is_none() && vllm_backend {
        s.sources.waiting = Some("none: decoupled model, the gateway's in-flight count is used");
    } else if let Some(n) = pending {
        s.waiting = Some(n);
        s.sources.waiting = Some(PENDING);
    }
    s.gpu_used = sum(samples, "nv_gpu_memory_used_bytes", None);
    s.gpu_total = sum(samples, "nv_gpu_memory_total_bytes", None);
    s.ttft = collect_buckets(
        samples.iter().copied(),
        "nv_inference_first_response_histogram_ms",
        true,
    );
    if s.ttft.is_empty() {
        s.ttft = collect_buckets(
            samples.iter().copied(),
            "vllm:time_to_first_token_seconds",
            false,
        );
    } else {
        s.ttft_scale = 1e-3;
    }
    s.e2e = collect_buckets(
        samples.iter().copied(),
        "vllm:e2e_request_latency_seconds",
        false,
    );
    s
}

/// `trtllm-serve` (TensorRT-LLM's own OpenAI server): `trtllm_*` names.
fn trtllm(samples: &[&Sample]) -> Signals {
    let mut s = Signals::new();
    (s.kv_usage, s.sources.kv_usage) = kv_from_blocks(
        (
            sum(samples, "trtllm_kv_cache_used_blocks", None),
            sum(samples, "trtllm_kv_cache_free_blocks", None),
            sum(samples, "trtllm_kv_cache_max_blocks", None),
        ),
        mean(samples, "trtllm_kv_cache_utilization", None),
        [
            "trtllm_kv_cache_used_blocks/trtllm_kv_cache_max_blocks",
            "trtllm_kv_cache_utilization",
            "none: trtllm_kv_cache_* blocks and utilization disagree",
        ],
    );
    s.kv_tokens = match (
        sum(samples, "trtllm_kv_cache_max_blocks", None),
        mean(samples, "trtllm_kv_cache_tokens_per_block", None),
    ) {
        (Some(blocks), Some(per)) => bytes(blocks * per),
        _ => None,
    };
    s.running = sum(samples, "trtllm_num_requests_running", None);
    s.waiting = sum(samples, "trtllm_num_requests_waiting", None);
    s.sources.running = s.running.map(|_| "trtllm_num_requests_running");
    s.sources.waiting = s.waiting.map(|_| "trtllm_num_requests_waiting");
    s.ttft = collect_buckets(
        samples.iter().copied(),
        "trtllm_time_to_first_token_seconds",
        false,
    );
    s.e2e = collect_buckets(
        samples.iter().copied(),
        "trtllm_e2e_request_latency_seconds",
        false,
    );
    s
}

fn sglang(samples: &[&Sample]) -> Signals {
    let mut s = Signals::new();
    (s.kv_usage, s.sources.kv_usage) = first(samples, &["sglang:token_usage"], mean);
    (s.running, s.sources.running) = first(samples, &["sglang:num_running_reqs"], sum);
    (s.waiting, s.sources.waiting) = first(samples, &["sglang:num_queue_reqs"], sum);
    s.kv_tokens = capacity(
        samples,
        "sglang:cache_config_info",
        "page_size",
        "num_pages",
    );
    s.ttft = collect_buckets(
        samples.iter().copied(),
        "sglang:time_to_first_token_seconds",
        false,
    );
    s.e2e = collect_buckets(
        samples.iter().copied(),
        "sglang:e2e_request_latency_seconds",
        false,
    );
    s
}

fn llamacpp(samples: &[&Sample]) -> Signals {
    let mut s = Signals::new();
    (s.kv_usage, s.sources.kv_usage) = first(samples, &["llamacpp:kv_cache_usage_ratio"], mean);
    (s.running, s.sources.running) = first(samples, &["llamacpp:requests_processing"], sum);
    (s.waiting, s.sources.waiting) = first(samples, &["llamacpp:requests_deferred"], sum);
    s
}

type Reduce = fn(&[&Sample], &str, Option<(&str, &str)>) -> Option<f64>;

/// The first of `names` present, reduced over its series, and its name.
fn first(
    samples: &[&Sample],
    names: &[&'static str],
    reduce: Reduce,
) -> (Option<f64>, Option<&'static str>) {
    names
        .iter()
        .find_map(|n| reduce(samples, n, None).map(|v| (Some(v), Some(*n))))
        .unwrap_or((None, None))
}

/// The finite values of series `name`, optionally only those with label
/// `label.0` equal to `label.1`.
fn values<'a>(
    samples: &'a [&'a Sample],
    name: &'a str,
    label: Option<(&'a str, &'a str)>,
) -> impl Iterator<Item = f64> + 'a {
    samples
        .iter()
        .filter(move |s| s.name == name)
        .filter(move |s| label.is_none_or(|(k, v)| s.label(k) == Some(v)))
        .map(|s| s.value)
        .filter(|v| v.is_finite())
}

fn sum(samples: &[&Sample], name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    values(samples, name, label).fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
}

fn mean(samples: &[&Sample], name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    let (n, total) = values(samples, name, label).fold((0u32, 0.0), |(n, t), v| (n + 1, t + v));
    (n > 0).then(|| total / f64::from(n))
}

/// KV capacity in tokens from an info gauge whose labels carry the block
/// size and the block count, summed over series (one per engine).
fn capacity(samples: &[&Sample], name: &str, size_label: &str, blocks_label: &str) -> Option<u64> {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter_map(|s| {
            let size: u64 = s.label(size_label)?.trim().parse().ok()?;
            let blocks: u64 = s.label(blocks_label)?.trim().parse().ok()?;
            size.checked_mul(blocks)
        })
        .fold(None, |acc: Option<u64>, v| {
            Some(acc.unwrap_or(0).saturating_add(v))
        })
}

/// A fraction clamped to 0..1; `NaN` is missing.
fn fraction(v: f64) -> Option<f64> {
    (!v.is_nan()).then(|| v.clamp(0.0, 1.0))
}

/// A non-negative finite count, rounded, saturating at `u32::MAX`.
fn count(v: f64) -> Option<u32> {
    (v.is_finite() && v >= 0.0).then(|| v.round().min(f64::from(u32::MAX)) as u32)
}

/// A non-negative finite byte or token count, rounded (saturating).
fn bytes(v: f64) -> Option<u64> {
    (v.is_finite() && v >= 0.0).then(|| v.round() as u64)
}

/// A non-negative finite number of seconds.
fn seconds(v: f64) -> Option<Duration> {
    if v >= 0.0 {
        Duration::try_from_secs_f64(v).ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
