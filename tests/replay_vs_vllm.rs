//! The replay against the real engine: the loads of
//! `benches/prefix-real-vllm.sh`, replayed on two simulated engines
//! calibrated to the real CPU vLLM of that bench (KV cache of 48 blocks of
//! 128 tokens, its prefill and decode times), must predict the real
//! engines' ratio between two routings within 15 %. The real ratios are
//! the bench's medians (docs/benchmarks/2026-12-07-prefix.md, with the
//! command); rerun it and update them when the engine or the routing
//! changes. A replay that flatters a strategy steers every later decision
//! wrong: this keeps it honest on the loads that showed it did.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use fairway::config::parse_policy;
use fairway::replay::report::RunReport;
use fairway::replay::scenario::Scenario;
use fairway::replay::sim::RunOptions;
use fairway::replay::{Compare, run_variant, variants};
use support::SERVER;

/// Two engines as the bench's: vLLM's CPU build on one core each, a
/// random 6-layer Llama of hidden 512. Prefill about 8,000 tokens/s (100-
/// 140 ms per 1,000 tokens), decode 6 ms a step alone; 48 blocks of 128
/// tokens of KV each.
fn policy() -> fairway::config::Policy {
    let backend = r#"
[[pools.backends]]
sim = { max_num_seqs = 64, kv_tokens = 6144, block_size = 128, max_model_len = 2048, max_num_batched_tokens = 2048, prefill_tokens_per_s = 6750.0, decode_step_base = "13ms", decode_step_per_seq = "3ms" }
max_inflight = 8
"#;
    let text = format!(
        r#"{SERVER}
[[pools]]
model = "mid"
ttft_p99_threshold = "60s"
prefix_block_tokens = 128
{backend}{backend}
[[tenants]]
name = "api"
api_keys = ["ka"]
slo = {{ ttft = "60s", e2e = "60s" }}
"#
    );
    parse_policy(&text, "test.toml").unwrap()
}

/// The bench's loads (`prefix_load.py`): `closed`, 12 system prompts of
/// about 900 tokens and a question; `unique`, every prompt its own.
fn scenario(load: &str) -> Scenario {
    let tenant = match load {
        "closed" => "prompt_tokens = [30, 40]\nprefix = { groups = 12, tokens = 900 }",
        _ => "prompt_tokens = [930, 950]",
    };
    Scenario::from_toml(&format!(
        r#"duration = "600s"
[[tenants]]
name = "api"
arrivals = {{ closed = {{ clients = 4, requests = 240 }} }}
output_tokens = [16, 16]
max_tokens = 16
stream = true
{tenant}
"#
    ))
    .unwrap()
}

/// `least_outstanding` and `prefix_aware` with the engines' events,
/// replayed.
fn replayed(load: &str) -> [RunReport; 2] {
    let p = policy();
    let work = scenario(load).generate("mid", 1);
    let all = variants(&p, Some(Compare::Routing));
    let opts = RunOptions {
        seed: 1,
        progress: None,
        replicas: 1,
        ingress: Default::default(),
    };
    // least_outstanding, approximate, precise, the oracle.
    [0, 2].map(|i| run_variant(&p, &work, all[i], &opts).0)
}

/// The real engines' medians, requests per second of `least_outstanding`
/// and `prefix_aware` precise (docs/benchmarks/2026-12-07-prefix.md):
/// `closed`, 5 rounds; `unique`, 5 rounds of the build before the last
/// change to new prefixes' placement, which unique prompts never reach.
const REAL: &[(&str, [f64; 2])] = &[("closed", [12.41, 14.94]), ("unique", [7.70, 7.73])];

#[test]
fn the_replay_predicts_the_real_engines_ratios_within_15_percent() {
    let mut failed = Vec::new();
    for (load, real) in REAL {
        let [lo, precise] = replayed(load);
        let predicted = precise.throughput_rps / lo.throughput_rps;
        let measured = real[1] / real[0];
        let hits = |r: &RunReport| r.prefix.as_ref().map(|p| (p.hit_rate, p.prefill_tokens));
        println!(
            "{load}: prefix_aware/least_outstanding replayed {predicted:.3} ({:.2} against {:.2} req/s; hit rate and prefill {:?} against {:?}), real {measured:.3}",
            precise.throughput_rps,
            lo.throughput_rps,
            hits(&precise),
            hits(&lo)
        );
        if (predicted / measured - 1.0).abs() > 0.15 {
            failed.push(format!("{load}: {predicted:.3} against {measured:.3}"));
        }
    }
    assert!(failed.is_empty(), "{failed:?}");
}
