//! The simulated backend's `/metrics` text: vLLM V1 names and labels in the
//! Prometheus 0.0.4 text format.
//!
//! Owns the request-level series the engine does not know (latency
//! histograms, finish reasons); engine gauges and counters are read from
//! [`EngineStats`] at scrape time so they always reflect real engine state.

use std::fmt::Write as _;

use crate::prom::{self, Kind};
use crate::sim::engine::EngineStats;

/// vLLM's default `time_to_first_token_seconds` bounds (0.10-era), seconds.
pub(crate) const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// vLLM's default request-latency family bounds (0.10-era), seconds.
pub(crate) const LATENCY_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A cumulative-on-export histogram with fixed bounds.
#[derive(Clone, Debug)]
struct Histogram {
    bounds: &'static [f64],
    /// Per-bucket counts (not cumulative); the last is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    fn observe(&mut self, v: f64) {
        let i = self.bounds.partition_point(|b| *b < v);
        self.counts[i] += 1;
        self.sum += v;
    }
}

/// Why a request left the engine, as vLLM labels `request_success_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FinishReason {
    /// Generated up to a natural end (`sim_output_tokens` below `max_tokens`).
    Stop,
    /// Hit `max_tokens`.
    Length,
    /// Client went away or the request was cancelled.
    Abort,
}

impl FinishReason {
    /// The OpenAI / vLLM spelling.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// Request-level series kept by the backend, in wall seconds.
#[derive(Clone, Debug)]
pub(super) struct RequestMetrics {
    ttft: Histogram,
    e2e: Histogram,
    /// Indexed by `FinishReason as usize`.
    finished: [u64; 3],
}

impl RequestMetrics {
    pub(super) fn new() -> Self {
        RequestMetrics {
            ttft: Histogram::new(&TTFT_BUCKETS),
            e2e: Histogram::new(&LATENCY_BUCKETS),
            finished: [0; 3],
        }
    }

    /// Records a first token `secs` wall seconds after arrival.
    pub(super) fn on_first_token(&mut self, secs: f64) {
        self.ttft.observe(secs);
    }

    /// Requests finished (stop or length) and aborted so far.
    pub(super) fn outcomes(&self) -> (u64, u64) {
        (
            self.finished[FinishReason::Stop as usize]
                + self.finished[FinishReason::Length as usize],
            self.finished[FinishReason::Abort as usize],
        )
    }

    /// The TTFT and end-to-end histograms under vLLM's names with other
    /// `labels` (Triton's vLLM backend exports them so).
    pub(super) fn render_vllm_histograms(&self, s: &mut String, labels: &str) {
        histogram(
            s,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            &self.ttft,
        );
        histogram(
            s,
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            labels,
            &self.e2e,
        );
    }

    /// Records a finished request, `secs` wall seconds after arrival.
    pub(super) fn on_finished(&mut self, reason: FinishReason, secs: f64) {
        self.finished[reason as usize] += 1;
        if reason != FinishReason::Abort {
            self.e2e.observe(secs);
        }
    }
}

/// Renders the scrape.
pub(super) fn render(
    model: &str,
    stats: &EngineStats,
    kv_usage: f64,
    req: &RequestMetrics,
) -> String {
    let labels = format!("engine=\"0\",model_name=\"{}\"", prom::escape(model));
    let mut s = String::with_capacity(8 * 1024);
    gauge(
        &mut s,
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        &labels,
        f64::from(stats.running),
    );
    gauge(
        &mut s,
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        &labels,
        f64::from(stats.waiting),
    );
    gauge(
        &mut s,
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        &labels,
        kv_usage,
    );
    counter(
        &mut s,
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        &labels,
        stats.preemptions_total,
    );
    counter(
        &mut s,
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        &labels,
        stats.prompt_tokens_total,
    );
    counter(
        &mut s,
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        &labels,
        stats.generation_tokens_total,
    );
    counter(
        &mut s,
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        &labels,
        stats.prefix_cache_queries_total,
    );
    counter(
        &mut s,
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        &labels,
        stats.prefix_cache_hits_total,
    );
    prom::family(
        &mut s,
        "vllm:request_success",
        Kind::Counter,
        "Count of successfully processed requests.",
    );
    for reason in [
        FinishReason::Stop,
        FinishReason::Length,
        FinishReason::Abort,
    ] {
        let _ = writeln!(
            s,
            "vllm:request_success_total{{{labels},finished_reason=\"{}\"}} {}",
            reason.as_str(),
            number(req.finished[reason as usize] as f64)
        );
    }
    histogram(
        &mut s,
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &labels,
        &req.ttft,
    );
    histogram(
        &mut s,
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        &labels,
        &req.e2e,
    );
    prom::family(
        &mut s,
        "vllm:cache_config_info",
        Kind::Gauge,
        "Information of the LLMEngine CacheConfig",
    );
    let _ = writeln!(
        s,
        "vllm:cache_config_info{{block_size=\"{}\",engine=\"0\",num_gpu_blocks=\"{}\"}} 1.0",
        stats.block_size, stats.kv_blocks_total
    );
    s
}

/// An engine's LoRA state, for the metrics.
pub(super) struct Lora<'a> {
    pub max_loras: u32,
    /// Adapters of running and waiting requests.
    pub active: Vec<&'a str>,
    /// Adapters on the GPU.
    pub loaded: Vec<&'a str>,
    pub loads: u64,
    /// Each load's time (the simulated loads all take the same).
    pub load_seconds: f64,
    /// Export the proposed residency series too.
    pub residency: bool,
    pub now_unix: f64,
}

/// vLLM's `lora_requests_info` (its value: when it was written, as vLLM
/// sets it), and with `residency` the series vLLM's pending residency
/// metrics add: one `lora_adapter_loaded` per GPU-resident adapter, the
/// slot count, and the load-time histogram.
pub(super) fn render_lora(s: &mut String, model: &str, l: &Lora<'_>) {
    prom::family(
        s,
        "vllm:lora_requests_info",
        Kind::Gauge,
        "Running stats on lora requests.",
    );
    let active = l.active.join(",");
    let active = prom::escape(&active);
    let _ = writeln!(
        s,
        "vllm:lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{active}\",waiting_lora_adapters=\"{active}\"}} {}",
        l.max_loras,
        number(l.now_unix)
    );
    if !l.residency {
        return;
    }
    let labels = format!("engine=\"0\",model_name=\"{}\"", prom::escape(model));
    prom::family(
        s,
        "vllm:lora_adapter_loaded",
        Kind::Gauge,
        "LoRA adapters loaded, by adapter and memory level.",
    );
    for a in &l.loaded {
        let _ = writeln!(
            s,
            "vllm:lora_adapter_loaded{{{labels},adapter_name=\"{}\",level=\"gpu\",pinned=\"false\"}} 1",
            prom::escape(a)
        );
    }
    gauge(
        s,
        "vllm:max_gpu_lora_adapters",
        "Most LoRA adapters on the GPU at once.",
        &labels,
        f64::from(l.max_loras),
    );
    prom::family(
        s,
        "vllm:lora_adapter_load_seconds",
        Kind::Histogram,
        "Time to load a LoRA adapter.",
    );
    let le = number(l.load_seconds);
    let _ = writeln!(
        s,
        "vllm:lora_adapter_load_seconds_bucket{{{labels},le=\"{le}\"}} {}",
        l.loads
    );
    let _ = writeln!(
        s,
        "vllm:lora_adapter_load_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
        l.loads
    );
    let _ = writeln!(
        s,
        "vllm:lora_adapter_load_seconds_sum{{{labels}}} {}",
        number(l.load_seconds * l.loads as f64)
    );
    let _ = writeln!(
        s,
        "vllm:lora_adapter_load_seconds_count{{{labels}}} {}",
        l.loads
    );
}

fn gauge(s: &mut String, name: &str, help: &str, labels: &str, v: f64) {
    prom::family(s, name, Kind::Gauge, help);
    let _ = writeln!(s, "{name}{{{labels}}} {}", number(v));
}

/// A counter family `name` exposed as `name_total`, like prometheus_client.
fn counter(s: &mut String, name: &str, help: &str, labels: &str, v: u64) {
    prom::family(s, name, Kind::Counter, help);
    let _ = writeln!(s, "{name}_total{{{labels}}} {}", number(v as f64));
}

fn histogram(s: &mut String, name: &str, help: &str, labels: &str, h: &Histogram) {
    prom::family(s, name, Kind::Histogram, help);
    let mut cumulative = 0u64;
    for (i, count) in h.counts.iter().enumerate() {
        cumulative += count;
        let le = h
            .bounds
            .get(i)
            .map_or_else(|| "+Inf".to_owned(), |b| number(*b));
        let _ = writeln!(
            s,
            "{name}_bucket{{{labels},le=\"{le}\"}} {}",
            number(cumulative as f64)
        );
    }
    let _ = writeln!(s, "{name}_count{{{labels}}} {}", number(cumulative as f64));
    let _ = writeln!(s, "{name}_sum{{{labels}}} {}", number(h.sum));
}

/// A sample value as Python's prometheus_client prints it (`14.0`).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{v:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_end_in_inf() {
        let mut m = RequestMetrics::new();
        m.on_first_token(0.003);
        m.on_first_token(5000.0);
        let text = render("m", &EngineStats::default(), 0.0, &m);
        let labels = "engine=\"0\",model_name=\"m\"";
        assert!(text.contains(&format!(
            "vllm:time_to_first_token_seconds_bucket{{{labels},le=\"0.001\"}} 0.0\n"
        )));
        assert!(text.contains(&format!(
            "vllm:time_to_first_token_seconds_bucket{{{labels},le=\"0.005\"}} 1.0\n"
        )));
        assert!(text.contains(&format!(
            "vllm:time_to_first_token_seconds_bucket{{{labels},le=\"+Inf\"}} 2.0\n"
        )));
        assert!(text.contains(&format!(
            "vllm:time_to_first_token_seconds_count{{{labels}}} 2.0\n"
        )));
    }

    #[test]
    fn every_family_has_help_and_type_and_model_label() {
        let stats = EngineStats {
            running: 3,
            kv_blocks_total: 99,
            block_size: 16,
            ..Default::default()
        };
        let text = render("a\"b", &stats, 0.25, &RequestMetrics::new());
        assert!(
            text.contains("vllm:num_requests_running{engine=\"0\",model_name=\"a\\\"b\"} 3.0\n")
        );
        assert!(
            text.contains("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"a\\\"b\"} 0.25\n")
        );
        assert!(text.contains(
            "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"99\"} 1.0\n"
        ));
        let types = text.lines().filter(|l| l.starts_with("# TYPE")).count();
        let helps = text.lines().filter(|l| l.starts_with("# HELP")).count();
        assert_eq!(types, 12);
        assert_eq!(helps, 12);
        assert!(text.ends_with('\n'));
    }
}
