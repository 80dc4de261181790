use std::time::Duration;

use super::*;

const AT: Instant = Instant::from_nanos(42);

fn buckets(pairs: &[(f64, f64)]) -> Vec<HistogramBucket> {
    pairs
        .iter()
        .map(|&(le, count)| HistogramBucket { le, count })
        .collect()
}

fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn dur_approx(d: Option<Duration>, secs: f64) -> bool {
    d.is_some_and(|d| (d.as_secs_f64() - secs).abs() < 1e-6)
}

// ---------------------------------------------------------------- quantile

#[test]
fn quantile_interpolates_like_prometheus() {
    // 100 observations: 50 ≤ 0.1, 90 ≤ 0.5, 100 ≤ 1.
    let b = buckets(&[
        (0.1, 50.0),
        (0.5, 90.0),
        (1.0, 100.0),
        (f64::INFINITY, 100.0),
    ]);
    // rank 99 lies in (0.5, 1]: 0.5 + 0.5 * (99 - 90) / 10.
    assert!(approx(quantile(0.99, &b).unwrap(), 0.95));
    // rank 50 is the top of the first bucket, interpolated from 0.
    assert!(approx(quantile(0.5, &b).unwrap(), 0.1));
    assert!(approx(quantile(0.25, &b).unwrap(), 0.05));
    assert_eq!(quantile(1.5, &b), None);
    assert_eq!(quantile(f64::NAN, &b), None);
}

#[test]
fn quantile_in_inf_bucket_is_largest_finite_bound() {
    let b = buckets(&[(0.1, 1.0), (2.5, 2.0), (f64::INFINITY, 100.0)]);
    assert_eq!(quantile(0.99, &b), Some(2.5));
}

#[test]
fn quantile_needs_inf_bucket_and_observations() {
    assert_eq!(quantile(0.99, &buckets(&[(0.1, 1.0), (1.0, 2.0)])), None);
    assert_eq!(quantile(0.99, &buckets(&[(f64::INFINITY, 5.0)])), None);
    assert_eq!(
        quantile(0.99, &buckets(&[(1.0, 0.0), (f64::INFINITY, 0.0)])),
        None
    );
    assert_eq!(quantile(0.99, &[]), None);
}

#[test]
fn quantile_tolerates_unsorted_and_non_monotonic_buckets() {
    let b = buckets(&[(f64::INFINITY, 10.0), (1.0, 10.0), (0.5, 12.0)]);
    // Counts are raised to stay monotonic: 12, 12, 12; rank 6 of 12 in (0, 0.5].
    assert!(approx(quantile(0.5, &b).unwrap(), 0.25));
}

// ---------------------------------------------------------- HistogramWindow

#[test]
fn window_reports_p99_of_the_delta_only() {
    let mut w = HistogramWindow::new();
    // Baseline: many fast requests in the past.
    let first = buckets(&[
        (0.1, 1000.0),
        (0.5, 1000.0),
        (1.0, 1000.0),
        (f64::INFINITY, 1000.0),
    ]);
    assert_eq!(w.observe(&first), None);
    // Window: 10 new requests, all in (0.5, 1].
    let second = buckets(&[
        (0.1, 1000.0),
        (0.5, 1000.0),
        (1.0, 1010.0),
        (f64::INFINITY, 1010.0),
    ]);
    // rank 9.9 of 10 in (0.5, 1]: 0.5 + 0.5 * 0.99.
    assert!(approx(w.observe(&second).unwrap(), 0.995));
    // Cumulative over all time would have said ~0.1; the window does not.
    assert!(quantile(0.99, &second).unwrap() < 0.2);
}

#[test]
fn window_without_new_observations_is_none() {
    let mut w = HistogramWindow::new();
    let b = buckets(&[(0.1, 5.0), (f64::INFINITY, 7.0)]);
    assert_eq!(w.observe(&b), None);
    assert_eq!(w.observe(&b), None);
    assert_eq!(w.observe(&b), None);
}

#[test]
fn window_counter_reset_becomes_new_baseline() {
    let mut w = HistogramWindow::new();
    assert_eq!(
        w.observe(&buckets(&[(1.0, 100.0), (f64::INFINITY, 100.0)])),
        None
    );
    // Backend restarted: counts went down.
    let after = buckets(&[(1.0, 3.0), (f64::INFINITY, 3.0)]);
    assert_eq!(w.observe(&after), None);
    // The restarted counts are the baseline now: 4 new in (1, +Inf].
    let next = buckets(&[(1.0, 3.0), (f64::INFINITY, 7.0)]);
    assert_eq!(w.observe(&next), Some(1.0));
}

#[test]
fn window_bucket_layout_change_and_vanishing() {
    let mut w = HistogramWindow::new();
    assert_eq!(
        w.observe(&buckets(&[(1.0, 1.0), (f64::INFINITY, 1.0)])),
        None
    );
    let relaid = buckets(&[(2.0, 5.0), (f64::INFINITY, 5.0)]);
    assert_eq!(w.observe(&relaid), None);
    assert!(
        w.observe(&buckets(&[(2.0, 6.0), (f64::INFINITY, 6.0)]))
            .is_some()
    );
    // The histogram vanished: baseline dropped, next scrape is a baseline.
    assert_eq!(w.observe(&[]), None);
    assert_eq!(
        w.observe(&buckets(&[(2.0, 9.0), (f64::INFINITY, 9.0)])),
        None
    );
    w.reset();
    assert_eq!(
        w.observe(&buckets(&[(2.0, 9.0), (f64::INFINITY, 9.0)])),
        None
    );
}

// -------------------------------------------------------------------- vLLM

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// A vLLM data-parallel scrape (two engines); `fast`/`slow` are cumulative
/// TTFT bucket counts per engine at le=0.1 and le=0.5 above the le=0.1.
fn vllm_scrape(ttft: [(f64, f64, f64); 2], e2e_total: f64) -> String {
    let mut out = String::from(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n",
    );
    for (engine, running, waiting, kv) in [("0", 14.0, 3.0, 0.8), ("1", 6.0, 1.0, 0.4)] {
        out += &format!(
            "vllm:num_requests_running{{engine=\"{engine}\",model_name=\"{MODEL}\"}} {running}\n\
             vllm:num_requests_waiting{{engine=\"{engine}\",model_name=\"{MODEL}\"}} {waiting}\n\
             vllm:kv_cache_usage_perc{{engine=\"{engine}\",model_name=\"{MODEL}\"}} {kv}\n\
             vllm:cache_config_info{{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"{engine}\",gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"1000\"}} 1.0\n\
             vllm:generation_tokens_total{{engine=\"{engine}\",model_name=\"{MODEL}\"}} 27453.0\n\
             vllm:generation_tokens_created{{engine=\"{engine}\",model_name=\"{MODEL}\"}} 1.7562e+09\n"
        );
    }
    out += "# TYPE vllm:time_to_first_token_seconds histogram\n";
    for (engine, (a, b, inf)) in ["0", "1"].iter().zip(ttft) {
        out += &format!(
            "vllm:time_to_first_token_seconds_bucket{{engine=\"{engine}\",le=\"0.1\",model_name=\"{MODEL}\"}} {a}\n\
             vllm:time_to_first_token_seconds_bucket{{engine=\"{engine}\",le=\"0.5\",model_name=\"{MODEL}\"}} {b}\n\
             vllm:time_to_first_token_seconds_bucket{{engine=\"{engine}\",le=\"+Inf\",model_name=\"{MODEL}\"}} {inf}\n\
             vllm:time_to_first_token_seconds_count{{engine=\"{engine}\",model_name=\"{MODEL}\"}} {inf}\n\
             vllm:time_to_first_token_seconds_sum{{engine=\"{engine}\",model_name=\"{MODEL}\"}} 9.83\n\
             vllm:time_to_first_token_seconds_created{{engine=\"{engine}\",model_name=\"{MODEL}\"}} 1.7562e+09\n"
        );
    }
    out += &format!(
        "# TYPE vllm:e2e_request_latency_seconds histogram\n\
         vllm:e2e_request_latency_seconds_bucket{{engine=\"0\",le=\"1.0\",model_name=\"{MODEL}\"}} {e2e_total}\n\
         vllm:e2e_request_latency_seconds_bucket{{engine=\"0\",le=\"5.0\",model_name=\"{MODEL}\"}} {e2e_total}\n\
         vllm:e2e_request_latency_seconds_bucket{{engine=\"0\",le=\"+Inf\",model_name=\"{MODEL}\"}} {e2e_total}\n\
         http_requests_total{{handler=\"/v1/chat/completions\",method=\"POST\",status=\"2xx\"}} 99.0\n"
    );
    out
}

#[test]
fn vllm_sums_engines_and_windows_histograms() {
    let mut d = Decoder::new(MetricsDialect::Vllm);
    let first = d
        .decode(
            &vllm_scrape([(100.0, 100.0, 100.0), (50.0, 50.0, 50.0)], 10.0),
            AT,
        )
        .unwrap();
    assert_eq!(first.at, AT);
    assert_eq!(first.running, Some(20));
    assert_eq!(first.waiting, Some(4));
    assert!(approx(first.kv_usage.unwrap(), 0.6));
    assert_eq!(first.kv_tokens, Some(2 * 16 * 1000));
    assert_eq!(first.ttft_p99, None);
    assert_eq!(first.e2e_p99, None);
    assert_eq!(first.gpu_memory_used, None);

    // Window: engine 0 saw 10 more in (0.1, 0.5], engine 1 saw 10 in (0.5, +Inf].
    let second = d
        .decode(
            &vllm_scrape([(100.0, 110.0, 110.0), (50.0, 50.0, 60.0)], 12.0),
            AT,
        )
        .unwrap();
    // 20 new: rank 19.8 lies in +Inf, so the largest finite bound.
    assert!(dur_approx(second.ttft_p99, 0.5));
    // 2 new e2e in (0, 1]: 0.99 * 1.
    assert!(dur_approx(second.e2e_p99, 0.99));

    // Window: 100 new on engine 0 in (0, 0.1].
    let third = d
        .decode(
            &vllm_scrape([(200.0, 210.0, 210.0), (50.0, 50.0, 60.0)], 12.0),
            AT,
        )
        .unwrap();
    assert!(dur_approx(third.ttft_p99, 0.099));
    assert_eq!(third.e2e_p99, None);
}

#[test]
fn vllm_ignores_created_series() {
    // A body with only _created series holds no vLLM signal.
    let body = "vllm:time_to_first_token_seconds_created{engine=\"0\"} 1.7e9\n\
                vllm:num_requests_running_created 1.7e9\n";
    let err = Decoder::new(MetricsDialect::Vllm)
        .decode(body, AT)
        .unwrap_err();
    assert!(matches!(
        err,
        DecodeError::NoKnownMetrics {
            dialect: MetricsDialect::Vllm
        }
    ));
}

#[test]
fn vllm_pre_0_9_cache_name_is_a_fallback() {
    let old = "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.3\n\
               vllm:num_requests_running{model_name=\"m\"} 1.0\n";
    let r = Decoder::new(MetricsDialect::Vllm).decode(old, AT).unwrap();
    assert!(approx(r.kv_usage.unwrap(), 0.3));
    let both = "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.3\n\
                vllm:kv_cache_usage_perc{model_name=\"m\"} 0.7\n";
    let r = Decoder::new(MetricsDialect::Vllm).decode(both, AT).unwrap();
    assert!(approx(r.kv_usage.unwrap(), 0.7));
}

#[test]
fn vllm_out_of_range_values_are_dropped_or_clamped() {
    let body = "vllm:kv_cache_usage_perc 1.5\n\
                vllm:num_requests_running NaN\n\
                vllm:num_requests_waiting -3\n";
    let r = Decoder::new(MetricsDialect::Vllm).decode(body, AT).unwrap();
    assert_eq!(r.kv_usage, Some(1.0));
    assert_eq!(r.running, None);
    assert_eq!(r.waiting, None);
}

// ------------------------------------------------------------------ Triton

const TRITON: &str = r#"# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="ensemble",version="1"} 120
nv_inference_request_success{model="tensorrt_llm",version="1"} 120
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="ensemble",version="1"} 7
nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 5
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="tensorrt_llm",version="1"} 11110
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 9
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 11
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 2
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 6000
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 4500
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 1500
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.4875
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-3c1f0c2e-aaaa"} 0.93
nv_gpu_utilization{gpu_uuid="GPU-3c1f0c2e-bbbb"} 0.91
# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{gpu_uuid="GPU-3c1f0c2e-aaaa"} 8.5899345920e+10
nv_gpu_memory_total_bytes{gpu_uuid="GPU-3c1f0c2e-bbbb"} 8.5899345920e+10
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-3c1f0c2e-aaaa"} 7.2e+10
nv_gpu_memory_used_bytes{gpu_uuid="GPU-3c1f0c2e-bbbb"} 7.0e+10
"#;

#[test]
fn triton_trt_llm_metrics() {
    let mut d = Decoder::new(MetricsDialect::Triton);
    let r = d.decode(TRITON, AT).unwrap();
    // used + free = max: the counts hold together, and win over a
    // fraction that disagrees (0.4875, as in TensorRT-LLM's README).
    assert!(approx(r.kv_usage.unwrap(), 0.25));
    assert_eq!(
        d.sources().kv_usage,
        Some("nv_trt_llm_kv_cache_block_metrics used/max")
    );
    assert_eq!(
        d.sources().waiting,
        Some("nv_trt_llm_request_metrics waiting")
    );
    assert_eq!(r.running, Some(9));
    assert_eq!(r.waiting, Some(2));
    assert_eq!(r.kv_tokens, Some(6000 * 64));
    assert_eq!(r.gpu_memory_used, Some(142_000_000_000));
    assert_eq!(r.gpu_memory_total, Some(2 * 85_899_345_920));
    assert_eq!(r.ttft_p99, None);
}

#[test]
fn triton_fallbacks_used_over_max_and_pending_count() {
    let body: String = TRITON
        .lines()
        .filter(|l| !l.contains("\"fraction\"") && !l.contains("nv_trt_llm_request_metrics"))
        .map(|l| format!("{l}\n"))
        .collect();
    let r = Decoder::new(MetricsDialect::Triton)
        .decode(&body, AT)
        .unwrap();
    assert!(approx(r.kv_usage.unwrap(), 0.25));
    assert_eq!(r.running, None);
    assert_eq!(r.waiting, Some(12));
}

#[test]
fn triton_first_response_histogram_in_ms() {
    let scrape = |fast: u32, total: u32| {
        format!(
            "nv_inference_pending_request_count{{model=\"m\",version=\"1\"}} 0\n\
             nv_inference_first_response_histogram_ms_bucket{{model=\"m\",version=\"1\",le=\"100\"}} {fast}\n\
             nv_inference_first_response_histogram_ms{{model=\"m\",version=\"1\",le=\"500\"}} {total}\n\
             nv_inference_first_response_histogram_ms_bucket{{model=\"m\",version=\"1\",le=\"+Inf\"}} {total}\n"
        )
    };
    let mut d = Decoder::new(MetricsDialect::Triton);
    assert_eq!(d.decode(&scrape(10, 10), AT).unwrap().ttft_p99, None);
    // 10 new, all in (100, 500] ms: 100 + 400 * 0.99 ms.
    let r = d.decode(&scrape(10, 20), AT).unwrap();
    assert!(dur_approx(r.ttft_p99, 0.496));
}

#[test]
fn triton_vllm_backend_histograms() {
    let scrape = |n: u32| {
        format!(
            "nv_inference_pending_request_count{{model=\"vllm_model\",version=\"1\"}} 3\n\
             vllm:time_to_first_token_seconds_bucket{{model=\"vllm_model\",version=\"1\",le=\"0.25\"}} {n}\n\
             vllm:time_to_first_token_seconds_bucket{{model=\"vllm_model\",version=\"1\",le=\"+Inf\"}} {n}\n\
             vllm:e2e_request_latency_seconds_bucket{{model=\"vllm_model\",version=\"1\",le=\"2\"}} {n}\n\
             vllm:e2e_request_latency_seconds_bucket{{model=\"vllm_model\",version=\"1\",le=\"+Inf\"}} {n}\n"
        )
    };
    let mut d = Decoder::new(MetricsDialect::Triton);
    d.decode(&scrape(1), AT).unwrap();
    let r = d.decode(&scrape(101), AT).unwrap();
    // The vLLM backend is decoupled: its pending count is not a queue.
    assert_eq!(r.waiting, None);
    assert!(d.sources().waiting.unwrap().starts_with("none: decoupled"));
    assert_eq!(r.kv_usage, None);
    assert!(dur_approx(r.ttft_p99, 0.2475));
    assert!(dur_approx(r.e2e_p99, 1.98));
}

#[test]
fn a_decoupled_model_by_its_configuration_has_no_pending_queue() {
    // A decoupled Python model: no vLLM series to tell it by.
    let scrape = "nv_inference_pending_request_count{model=\"toy_stream\",version=\"1\"} 2\n\
                  nv_inference_request_success{model=\"toy_stream\",version=\"1\"} 7\n";
    let mut d = Decoder::new(MetricsDialect::Triton);
    assert_eq!(d.decode(scrape, AT).unwrap().waiting, Some(2));
    d.set_decoupled(true);
    assert_eq!(d.decode(scrape, AT).unwrap().waiting, None);
    assert!(d.sources().waiting.unwrap().contains("model configuration"));
    // A classic model read as such, even beside the vLLM backend's series.
    let mut d = Decoder::new(MetricsDialect::Triton);
    d.set_decoupled(false);
    let both = format!("{scrape}vllm:num_preemptions_total{{model=\"v\"}} 0\n");
    assert_eq!(d.decode(&both, AT).unwrap().waiting, Some(2));
}

/// TRITON with the `kv_cache_block_type` lines replaced.
fn triton_kv(lines: &[(&str, f64)]) -> String {
    let mut out: String = TRITON
        .lines()
        .filter(|l| !l.contains("kv_cache_block_type"))
        .map(|l| format!("{l}\n"))
        .collect();
    for (ty, v) in lines {
        out.push_str(&format!(
            "nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type=\"{ty}\",model=\"tensorrt_llm\",version=\"1\"}} {v}\n"
        ));
    }
    out
}

#[test]
fn triton_kv_shifted_by_a_missing_stats_key_is_rejected() {
    // The executor's stats lack "free": the reporter assigns the values
    // that follow one label early, so `free` holds the used blocks, `used`
    // the tokens per block, `tokens_per` the fraction and `fraction` the
    // reused blocks.
    let body = triton_kv(&[
        ("max", 6000.0),
        ("free", 1500.0),
        ("used", 64.0),
        ("tokens_per", 0.25),
        ("fraction", 12.0),
    ]);
    let mut d = Decoder::new(MetricsDialect::Triton);
    let r = d.decode(&body, AT).unwrap();
    assert_eq!(r.kv_usage, None, "a shifted reading is no reading");
    assert!(d.sources().kv_usage.unwrap().starts_with("none:"));
    // The rest of the scrape is still read.
    assert_eq!(r.running, Some(9));
}

#[test]
fn triton_kv_cross_checks_counts_and_fraction() {
    let kv = |lines: &[(&str, f64)]| {
        Decoder::new(MetricsDialect::Triton)
            .decode(&triton_kv(lines), AT)
            .unwrap()
            .kv_usage
    };
    // No `free`: the counts are used when the fraction agrees...
    assert!(approx(
        kv(&[("max", 6000.0), ("used", 1500.0), ("fraction", 0.251)]).unwrap(),
        0.25
    ));
    // ...and neither when it does not.
    assert_eq!(
        kv(&[("max", 6000.0), ("used", 1500.0), ("fraction", 0.4875)]),
        None
    );
    // Out of range is rejected, not clamped to 1.
    assert_eq!(
        kv(&[("max", 6000.0), ("used", 7000.0), ("fraction", 1.2)]),
        None
    );
    // An older build with only the fraction.
    assert!(approx(kv(&[("fraction", 0.3)]).unwrap(), 0.3));
    // Only the counts.
    assert!(approx(kv(&[("max", 100.0), ("used", 40.0)]).unwrap(), 0.4));
    // No cache yet.
    assert_eq!(kv(&[("max", 0.0), ("used", 0.0), ("free", 0.0)]), None);
}

#[test]
fn triton_classic_model_queue_is_the_pending_count() {
    let body = "nv_inference_pending_request_count{model=\"resnet50\",version=\"1\"} 4\n\
                nv_inference_pending_request_count{model=\"bert\",version=\"1\"} 3\n";
    let mut d = Decoder::new(MetricsDialect::Triton);
    let r = d.decode(body, AT).unwrap();
    assert_eq!(r.waiting, Some(7));
    assert_eq!(
        d.sources().waiting,
        Some("nv_inference_pending_request_count")
    );
    assert_eq!(d.sources().kv_usage, None);
}

// ------------------------------------------------------------- trtllm-serve

/// `trtllm-serve`'s names (TensorRT-LLM `tensorrt_llm/metrics/collector.py`).
const TRTLLM: &str = r#"# HELP trtllm_num_requests_running Number of requests running.
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{model_name="llama",engine_type="pytorch"} 12
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{model_name="llama",engine_type="pytorch"} 3
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{model_name="llama",engine_type="pytorch"} 0.6
# TYPE trtllm_kv_cache_max_blocks gauge
trtllm_kv_cache_max_blocks{model_name="llama",engine_type="pytorch"} 1000
# TYPE trtllm_kv_cache_free_blocks gauge
trtllm_kv_cache_free_blocks{model_name="llama",engine_type="pytorch"} 400
# TYPE trtllm_kv_cache_used_blocks gauge
trtllm_kv_cache_used_blocks{model_name="llama",engine_type="pytorch"} 600
# TYPE trtllm_kv_cache_tokens_per_block gauge
trtllm_kv_cache_tokens_per_block{model_name="llama",engine_type="pytorch"} 32
# TYPE trtllm_time_to_first_token_seconds histogram
trtllm_time_to_first_token_seconds_bucket{model_name="llama",engine_type="pytorch",le="0.1"} 0
trtllm_time_to_first_token_seconds_bucket{model_name="llama",engine_type="pytorch",le="0.5"} 10
trtllm_time_to_first_token_seconds_bucket{model_name="llama",engine_type="pytorch",le="+Inf"} 10
trtllm_time_to_first_token_seconds_sum{model_name="llama",engine_type="pytorch"} 3.0
trtllm_time_to_first_token_seconds_count{model_name="llama",engine_type="pytorch"} 10
"#;

#[test]
fn trtllm_serve_metrics() {
    let mut d = Decoder::new(MetricsDialect::Trtllm);
    let empty = TRTLLM
        .replace("le=\"0.5\"} 10", "le=\"0.5\"} 0")
        .replace("le=\"+Inf\"} 10", "le=\"+Inf\"} 0");
    d.decode(&empty, AT).unwrap();
    let r = d.decode(TRTLLM, AT).unwrap();
    assert!(approx(r.kv_usage.unwrap(), 0.6));
    assert_eq!(r.running, Some(12));
    assert_eq!(r.waiting, Some(3));
    assert_eq!(r.kv_tokens, Some(32_000));
    // 10 new, all in (0.1, 0.5]: 0.1 + 0.4 * 0.99.
    assert!(dur_approx(r.ttft_p99, 0.496));
    assert_eq!(
        d.sources().kv_usage,
        Some("trtllm_kv_cache_used_blocks/trtllm_kv_cache_max_blocks")
    );
    // vLLM names are not trtllm-serve's.
    assert!(matches!(
        Decoder::new(MetricsDialect::Trtllm).decode("vllm:num_requests_running 3\n", AT),
        Err(DecodeError::NoKnownMetrics { .. })
    ));
}

// ------------------------------------------------------------------ SGLang

fn sglang_scrape(n: u32) -> String {
    format!(
        "# HELP sglang:token_usage The token usage\n\
         # TYPE sglang:token_usage gauge\n\
         sglang:token_usage{{model_name=\"qwen/Qwen2-7B\"}} 0.28\n\
         # TYPE sglang:num_running_reqs gauge\n\
         sglang:num_running_reqs{{model_name=\"qwen/Qwen2-7B\"}} 28.0\n\
         sglang:num_queue_reqs{{model_name=\"qwen/Qwen2-7B\"}} 0.0\n\
         sglang:num_used_tokens{{model_name=\"qwen/Qwen2-7B\"}} 8.128902e+06\n\
         sglang:gen_throughput{{model_name=\"qwen/Qwen2-7B\"}} 355.0\n\
         sglang:cache_config_info{{model_name=\"qwen/Qwen2-7B\",page_size=\"1\",num_pages=\"500000\"}} 1.0\n\
         # TYPE sglang:time_to_first_token_seconds histogram\n\
         sglang:time_to_first_token_seconds_bucket{{le=\"0.1\",model_name=\"qwen/Qwen2-7B\"}} 0.0\n\
         sglang:time_to_first_token_seconds_bucket{{le=\"0.2\",model_name=\"qwen/Qwen2-7B\"}} {n}\n\
         sglang:time_to_first_token_seconds_bucket{{le=\"+Inf\",model_name=\"qwen/Qwen2-7B\"}} {n}\n\
         sglang:time_to_first_token_seconds_sum{{model_name=\"qwen/Qwen2-7B\"}} 12.5\n\
         sglang:time_to_first_token_seconds_count{{model_name=\"qwen/Qwen2-7B\"}} {n}\n\
         sglang:e2e_request_latency_seconds_bucket{{le=\"10.0\",model_name=\"qwen/Qwen2-7B\"}} {n}\n\
         sglang:e2e_request_latency_seconds_bucket{{le=\"+Inf\",model_name=\"qwen/Qwen2-7B\"}} {n}\n"
    )
}

#[test]
fn sglang_metrics() {
    let mut d = Decoder::new(MetricsDialect::Sglang);
    let r = d.decode(&sglang_scrape(100), AT).unwrap();
    assert!(approx(r.kv_usage.unwrap(), 0.28));
    assert_eq!(r.running, Some(28));
    assert_eq!(r.waiting, Some(0));
    assert_eq!(r.kv_tokens, Some(500_000));
    assert_eq!(r.ttft_p99, None);
    let r = d.decode(&sglang_scrape(200), AT).unwrap();
    assert!(dur_approx(r.ttft_p99, 0.199));
    assert!(dur_approx(r.e2e_p99, 9.9));
}

// --------------------------------------------------------------- llama.cpp

#[test]
fn llamacpp_metrics() {
    let current = "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n\
                   # TYPE llamacpp:prompt_tokens_total counter\n\
                   llamacpp:prompt_tokens_total 1024\n\
                   # TYPE llamacpp:requests_processing gauge\n\
                   llamacpp:requests_processing 2\n\
                   # TYPE llamacpp:requests_deferred gauge\n\
                   llamacpp:requests_deferred 5\n\
                   llamacpp:n_tokens_max 4096\n";
    let r = Decoder::new(MetricsDialect::Llamacpp)
        .decode(current, AT)
        .unwrap();
    assert_eq!((r.running, r.waiting, r.kv_usage), (Some(2), Some(5), None));
    let old =
        format!("{current}llamacpp:kv_cache_usage_ratio 0.125\nllamacpp:kv_cache_tokens 512\n");
    let r = Decoder::new(MetricsDialect::Llamacpp)
        .decode(&old, AT)
        .unwrap();
    assert_eq!(r.kv_usage, Some(0.125));
}

// ------------------------------------------------------------------- agent

#[test]
fn agent_json_round_trips_and_decodes() {
    let agent = AgentReading {
        kv_usage: Some(0.5),
        running: Some(3),
        waiting: Some(1),
        ttft_p99_seconds: Some(0.12),
        e2e_p99_seconds: Some(4.5),
        kv_tokens: Some(65_536),
        gpu_memory_used_bytes: None,
        gpu_memory_total_bytes: None,
        gpus: vec![
            AgentGpu {
                index: 0,
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_used_bytes: 70,
                memory_total_bytes: 80,
                utilization: 0.9,
            },
            AgentGpu {
                index: 1,
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_used_bytes: 60,
                memory_total_bytes: 80,
                utilization: 0.8,
            },
        ],
    };
    let json = serde_json::to_string(&agent).unwrap();
    assert_eq!(serde_json::from_str::<AgentReading>(&json).unwrap(), agent);

    let r = Decoder::new(MetricsDialect::Agent)
        .decode(&json, AT)
        .unwrap();
    assert_eq!(r.at, AT);
    assert_eq!(r.kv_usage, Some(0.5));
    assert_eq!((r.running, r.waiting), (Some(3), Some(1)));
    assert!(dur_approx(r.ttft_p99, 0.12));
    assert!(dur_approx(r.e2e_p99, 4.5));
    assert_eq!(r.kv_tokens, Some(65_536));
    assert_eq!(
        (r.gpu_memory_used, r.gpu_memory_total),
        (Some(130), Some(160))
    );

    let back = AgentReading::from_reading(&r, agent.gpus.clone());
    assert_eq!(back.to_reading(AT), r);
}

#[test]
fn agent_json_is_lenient_about_missing_and_unknown_fields() {
    let json = r#"{"running": 2, "ttft_p99_seconds": -1.0, "kv_usage": 3.0, "future_field": [1]}"#;
    let r = Decoder::new(MetricsDialect::Agent)
        .decode(json, AT)
        .unwrap();
    assert_eq!(r.running, Some(2));
    assert_eq!(r.ttft_p99, None);
    assert_eq!(r.kv_usage, Some(1.0));
    assert_eq!(r.gpu_memory_total, None);
    let r = Decoder::new(MetricsDialect::Agent)
        .decode("{}", AT)
        .unwrap();
    assert_eq!(
        r,
        Reading {
            at: AT,
            ..Reading::default()
        }
    );
}

// ---------------------------------------------------------- errors, `none`

#[test]
fn none_dialect_is_an_error() {
    let err = Decoder::new(MetricsDialect::None)
        .decode(&vllm_scrape([(1.0, 1.0, 1.0); 2], 1.0), AT)
        .unwrap_err();
    assert!(matches!(err, DecodeError::NoDialect));
}

#[test]
fn garbage_is_an_error_for_every_dialect() {
    let garbage = [
        "<html><head><title>502 Bad Gateway</title></head></html>",
        "\u{1f}\u{8b}\u{8}\u{0}binary",
        "not metrics at all",
    ];
    for dialect in [
        MetricsDialect::Vllm,
        MetricsDialect::Triton,
        MetricsDialect::Sglang,
        MetricsDialect::Llamacpp,
    ] {
        for body in garbage {
            let err = Decoder::new(dialect).decode(body, AT).unwrap_err();
            assert!(
                matches!(err, DecodeError::Parse(_)),
                "{dialect:?} {body:?} {err}"
            );
        }
        // Valid text, wrong backend.
        let err = Decoder::new(dialect)
            .decode("node_cpu_seconds_total{cpu=\"0\"} 1\n", AT)
            .unwrap_err();
        assert!(matches!(err, DecodeError::NoKnownMetrics { .. }), "{err}");
        assert!(Decoder::new(dialect).decode("", AT).is_err());
    }
    for body in garbage.iter().chain(&["", "[1,2]", "{\"running\": -1}"]) {
        let err = Decoder::new(MetricsDialect::Agent)
            .decode(body, AT)
            .unwrap_err();
        assert!(matches!(err, DecodeError::Json(_)), "{body:?}");
    }
}

#[test]
fn wrong_dialect_reads_nothing() {
    let err = Decoder::new(MetricsDialect::Sglang)
        .decode(TRITON, AT)
        .unwrap_err();
    assert!(matches!(
        err,
        DecodeError::NoKnownMetrics {
            dialect: MetricsDialect::Sglang
        }
    ));
}

#[test]
fn failed_decode_keeps_the_histogram_baseline() {
    let mut d = Decoder::new(MetricsDialect::Sglang);
    d.decode(&sglang_scrape(100), AT).unwrap();
    assert!(d.decode("garbage", AT).is_err());
    let r = d.decode(&sglang_scrape(200), AT).unwrap();
    assert!(dur_approx(r.ttft_p99, 0.199));
    assert_eq!(d.dialect(), MetricsDialect::Sglang);
}

// ---------------------------------------------------------------- LoRA

const VLLM_BASE: &str = "vllm:num_requests_running{model_name=\"m\"} 1\n\
vllm:num_requests_waiting{model_name=\"m\"} 0\n\
vllm:kv_cache_usage_perc{model_name=\"m\"} 0.1\n";

#[test]
fn lora_requests_info_newest_series_gives_the_active_adapters() {
    // Two series of the info gauge: the newest (largest value) counts.
    let body = format!(
        "{VLLM_BASE}# TYPE vllm:lora_requests_info gauge\n\
         vllm:lora_requests_info{{max_lora=\"4\",running_lora_adapters=\"old\",waiting_lora_adapters=\"\"}} 1.7e9\n\
         vllm:lora_requests_info{{max_lora=\"4\",running_lora_adapters=\"sql,chat\",waiting_lora_adapters=\"sql\"}} 1.8e9\n"
    );
    let r = Decoder::new(MetricsDialect::Vllm)
        .decode(&body, AT)
        .unwrap();
    let lora = r.lora.unwrap();
    assert_eq!(lora.adapters, vec!["chat", "sql"]);
    assert!(!lora.resident);
    assert_eq!(lora.max_loaded, Some(4));
    // No LoRA series: nothing known of adapters.
    let r = Decoder::new(MetricsDialect::Vllm)
        .decode(VLLM_BASE, AT)
        .unwrap();
    assert_eq!(r.lora, None);
}

#[test]
fn lora_residency_series_win_over_the_info_gauge() {
    let body = format!(
        "{VLLM_BASE}vllm:lora_requests_info{{max_lora=\"4\",running_lora_adapters=\"a\",waiting_lora_adapters=\"\"}} 1.8e9\n\
         vllm:lora_adapter_loaded{{adapter_name=\"a\",level=\"gpu\",pinned=\"false\"}} 1\n\
         vllm:lora_adapter_loaded{{adapter_name=\"b\",level=\"gpu\",pinned=\"true\"}} 1\n\
         vllm:lora_adapter_loaded{{adapter_name=\"c\",level=\"cpu\",pinned=\"false\"}} 1\n\
         vllm:lora_adapter_loaded{{adapter_name=\"d\",level=\"gpu\",pinned=\"false\"}} 0\n\
         vllm:max_gpu_lora_adapters 2\n"
    );
    let r = Decoder::new(MetricsDialect::Vllm)
        .decode(&body, AT)
        .unwrap();
    let lora = r.lora.unwrap();
    assert_eq!(lora.adapters, vec!["a", "b"]);
    assert!(lora.resident);
    assert_eq!(lora.max_loaded, Some(2));
}
