//! Simulation against reality: the reference scenario's shape, scaled to a
//! few seconds, played live through a real gateway in front of simulated
//! backends over TCP and SSE, and replayed offline. Per tenant, the live
//! e2e p50 and p99 and TTFT p50 must land within 25 % of what the replay
//! predicts (plus 8 ms for what only the live path has: HTTP, the
//! loopback, timer granularity). TTFT p99 is printed, not asserted: scaled
//! ten times, it is a 15-100 ms tail set by one or two requests, where a
//! debug build on two shared cores and millisecond timers decide more
//! than the policy does.
//!
//! Preemption is on at once (`min_wait = "0s"`), and the live gateway's
//! count of preemptions must land within 25 % (plus 3) of the replay's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;

use fairway::config::parse_policy;
use fairway::replay::Variant;
use fairway::replay::load::{Target, play};
use fairway::replay::report::{RunReport, summarise};
use fairway::replay::scenario::Scenario;
use fairway::replay::sim::{RunOptions, run};
use support::*;

/// Two engines ten times faster than real time, the reference tenants with
/// SLOs scaled by the same factor, the poller at a tenth of its default.
fn policy_text() -> String {
    let backend = r#"
[[pools.backends]]
sim = { max_num_seqs = 16, kv_tokens = 32768, max_num_batched_tokens = 2048, time_scale = 10.0 }
max_inflight = 16
"#;
    format!(
        r#"{SERVER}
[poller]
interval = "25ms"

[queue]
discipline = "drf"
max_wait = "60s"

[preemption]
# Every queued api or chat request may preempt at once: at ten times real
# speed the default 250 ms would never be reached.
min_wait = "0s"

[[pools]]
model = "m"
ttft_p99_threshold = "50ms"
{backend}{backend}
[[tenants]]
name = "api"
api_keys = ["k-api"]
weight = 3
slo = {{ ttft = "50ms", e2e = "1s" }}

[[tenants]]
name = "chat"
api_keys = ["k-chat"]
slo = {{ ttft = "200ms", e2e = "3s" }}

[[tenants]]
name = "evals"
api_keys = ["k-evals"]
priority = "batch"
slo = {{ ttft = "60s", e2e = "90s" }}
"#
    )
}

const SCENARIO: &str = r#"
duration = "6s"

[[tenants]]
name = "api"
arrivals = { poisson = { rate = 40.0 } }
prompt_tokens = [100, 400]
output_tokens = [20, 60]
stream = true

[[tenants]]
name = "chat"
arrivals = { bursts = { every = "1s", size = 20, spread = "500ms", start = "500ms" } }
prompt_tokens = [200, 800]
output_tokens = [30, 80]
stream = true

[[tenants]]
name = "evals"
arrivals = { batch = { at = "1s", count = 300 } }
prompt_tokens = [300, 900]
output_tokens = [20, 60]
"#;

fn close(what: &str, live: Option<f64>, predicted: Option<f64>) -> Result<(), String> {
    let (l, p) = (live.unwrap(), predicted.unwrap());
    let slack = 0.25 * p + 0.008;
    if (l - p).abs() <= slack {
        Ok(())
    } else {
        Err(format!(
            "{what}: live {:.1} ms, replay {:.1} ms",
            l * 1e3,
            p * 1e3
        ))
    }
}

fn compare(live: &RunReport, replayed: &RunReport) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, r) in &replayed.tenants {
        let l = &live.tenants[name];
        assert_eq!(
            l.served, l.requests,
            "{name}: every live request served (refused {}, shed {}, failed {})",
            l.refused, l.shed, l.failed
        );
        for check in [
            close(&format!("{name} ttft p50"), l.ttft_p50_s, r.ttft_p50_s),
            close(&format!("{name} e2e p50"), l.e2e_p50_s, r.e2e_p50_s),
            close(&format!("{name} e2e p99"), l.e2e_p99_s, r.e2e_p99_s),
        ] {
            if let Err(e) = check {
                problems.push(e);
            }
        }
    }
    // Young evals work is preempted for api and chat as often live as in
    // the model. (Rarely, here: the pool's reserve of free slots for
    // tenants below their share leaves api and chat a slot most of the
    // time; tests/replay.rs checks preemption on the reference scenario.)
    let (l, r) = (live.preempted.unwrap_or(0), replayed.preempted.unwrap_or(0));
    if l.abs_diff(r) as f64 > 0.25 * r as f64 + 3.0 {
        problems.push(format!("preemptions: live {l}, replay {r}"));
    }
    problems
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_p50_and_p99_are_within_25_percent_of_the_replay() {
    let text = policy_text();
    let policy = parse_policy(&text, "test.toml").unwrap();
    let scenario = Scenario::from_toml(SCENARIO).unwrap();
    let work = scenario.generate("m", 5);
    let trace = run(
        &policy,
        &work,
        &RunOptions {
            seed: 5,
            progress: None,
            replicas: 1,
            ingress: Default::default(),
        },
    );
    let replayed = summarise(Variant::of(&policy), &trace);

    let keys: HashMap<String, String> = ["api", "chat", "evals"]
        .iter()
        .map(|t| (t.to_string(), format!("k-{t}")))
        .collect();
    // A loaded 2-core machine can stall one run; the model must hold in
    // one of two.
    let mut last = Vec::new();
    for _ in 0..2 {
        let gw = gateway(&text, &[]).await;
        let target = Target {
            authority: gw.addr().to_string(),
            keys: keys.clone(),
            timeout: std::time::Duration::from_secs(20),
            batch_as: fairway::replay::handover::BatchAs::Live,
        };
        let mut live = summarise(Variant::of(&policy), &play(&policy, &work, &target).await);
        let metrics = get(&client(), format!("http://{}/metrics", gw.admin_addr())).await;
        gw.shutdown().await;
        // The client cannot see preemptions; the gateway counts them.
        live.preempted = Some(metric_sum(&metrics.text(), "fairway_preemptions_total") as u64);
        if live.tenants.values().any(|t| t.served < t.requests) {
            eprintln!("{}", metrics.text());
        }
        last = compare(&live, &replayed);
        if last.is_empty() {
            eprintln!(
                "replay:\n{}live:\n{}",
                fairway::replay::report::table(std::slice::from_ref(&replayed)),
                fairway::replay::report::table(std::slice::from_ref(&live))
            );
            return;
        }
        eprintln!(
            "live differs from replay: {last:#?}\nreplay:\n{}live:\n{}",
            fairway::replay::report::table(std::slice::from_ref(&replayed)),
            fairway::replay::report::table(std::slice::from_ref(&live))
        );
    }
    panic!("live differs from replay in two runs: {last:#?}");
}
