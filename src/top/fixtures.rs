//! Test fixtures shared by the view's tests: a realistic gateway body
//! whose tenant alpha changes between two scrapes, and readers of the
//! rendered text.

use std::fmt::Write as _;

const BOUNDS: [&str; 6] = ["0.1", "0.5", "1", "2.5", "5", "+Inf"];

pub(super) fn push(out: &mut String, name: &str, labels: &[(&str, &str)], v: f64) {
    if labels.is_empty() {
        let _ = writeln!(out, "{name} {v}");
        return;
    }
    let l: Vec<String> = labels.iter().map(|(k, x)| format!("{k}=\"{x}\"")).collect();
    let _ = writeln!(out, "{name}{{{}}} {v}", l.join(","));
}

pub(super) fn hist(out: &mut String, family: &str, tenant: &str, model: &str, counts: [f64; 6]) {
    let bucket = format!("{family}_bucket");
    for (le, c) in BOUNDS.iter().zip(counts) {
        push(
            out,
            &bucket,
            &[("tenant", tenant), ("model", model), ("le", *le)],
            c,
        );
    }
    let tm = [("tenant", tenant), ("model", model)];
    push(out, &format!("{family}_sum"), &tm, 1.5);
    push(out, &format!("{family}_count"), &tm, counts[5]);
}

/// Tenant alpha's counters, which the tests vary between scrapes.
pub(super) struct Alpha {
    pub(super) served: f64,
    pub(super) refused_rate: f64,
    pub(super) refused_concurrency: f64,
    pub(super) goodput: f64,
    pub(super) preempted: f64,
    pub(super) ttft: [f64; 6],
    pub(super) e2e: [f64; 6],
}

/// The first scrape's alpha.
pub(super) fn alpha_before() -> Alpha {
    Alpha {
        served: 100.0,
        refused_rate: 0.0,
        refused_concurrency: 0.0,
        goodput: 95.0,
        preempted: 7.0,
        ttft: [95.0, 100.0, 100.0, 100.0, 100.0, 100.0],
        e2e: [0.0, 0.0, 50.0, 100.0, 100.0, 100.0],
    }
}

/// Two seconds later: 20 served (TTFT 0.5-1s, e2e 1-5s), 4 refused by
/// rate, 1 by concurrency, 18 good, 3 preempted.
pub(super) fn alpha_after() -> Alpha {
    Alpha {
        served: 120.0,
        refused_rate: 4.0,
        refused_concurrency: 1.0,
        goodput: 113.0,
        preempted: 10.0,
        ttft: [95.0, 100.0, 120.0, 120.0, 120.0, 120.0],
        e2e: [0.0, 0.0, 50.0, 110.0, 120.0, 120.0],
    }
}

/// A realistic gateway body: alpha (one model, SLOs), beta (two models,
/// no SLO), gamma (gauges only), two backends with gpu-b ejected.
pub(super) fn body(a: &Alpha) -> String {
    let mut o = String::new();
    o.push_str("# HELP fairway_build_info Build information.\n");
    o.push_str("# TYPE fairway_build_info gauge\n");
    push(&mut o, "fairway_build_info", &[("version", "0.1.0")], 1.0);
    o.push_str("# HELP fairway_requests_total Requests by final outcome.\n");
    o.push_str("# TYPE fairway_requests_total counter\n");
    let req = |tenant, model, outcome, reason| {
        [
            ("tenant", tenant),
            ("model", model),
            ("outcome", outcome),
            ("reason", reason),
        ]
    };
    push(
        &mut o,
        "fairway_requests_total",
        &req("alpha", "llama", "served", ""),
        a.served,
    );
    if a.refused_concurrency > 0.0 {
        push(
            &mut o,
            "fairway_requests_total",
            &req("alpha", "llama", "refused", "concurrency"),
            a.refused_concurrency,
        );
    }
    if a.refused_rate > 0.0 {
        push(
            &mut o,
            "fairway_requests_total",
            &req("alpha", "llama", "refused", "rate"),
            a.refused_rate,
        );
    }
    push(
        &mut o,
        "fairway_requests_total",
        &req("beta", "llama", "served", ""),
        10.0,
    );
    push(
        &mut o,
        "fairway_requests_total",
        &req("beta", "mistral", "served", ""),
        10.0,
    );
    o.push_str("# TYPE fairway_preemptions_total counter\n");
    push(
        &mut o,
        "fairway_preemptions_total",
        &[("tenant", "alpha")],
        a.preempted,
    );
    o.push_str("# TYPE fairway_goodput_total counter\n");
    let tm = |tenant, model| [("tenant", tenant), ("model", model)];
    push(
        &mut o,
        "fairway_goodput_total",
        &tm("alpha", "llama"),
        a.goodput,
    );
    push(&mut o, "fairway_goodput_total", &tm("beta", "llama"), 10.0);
    push(
        &mut o,
        "fairway_goodput_total",
        &tm("beta", "mistral"),
        10.0,
    );
    o.push_str("# TYPE fairway_slo_attainment_ratio gauge\n");
    push(
        &mut o,
        "fairway_slo_attainment_ratio",
        &tm("alpha", "llama"),
        0.9,
    );
    o.push_str("# TYPE fairway_ttft_seconds histogram\n");
    hist(&mut o, "fairway_ttft_seconds", "alpha", "llama", a.ttft);
    hist(&mut o, "fairway_ttft_seconds", "beta", "llama", [10.0; 6]);
    hist(
        &mut o,
        "fairway_ttft_seconds",
        "beta",
        "mistral",
        [0.0, 10.0, 10.0, 10.0, 10.0, 10.0],
    );
    o.push_str("# TYPE fairway_e2e_seconds histogram\n");
    hist(&mut o, "fairway_e2e_seconds", "alpha", "llama", a.e2e);
    let b_e2e = [0.0, 10.0, 10.0, 10.0, 10.0, 10.0];
    hist(&mut o, "fairway_e2e_seconds", "beta", "llama", b_e2e);
    hist(&mut o, "fairway_e2e_seconds", "beta", "mistral", b_e2e);
    o.push_str("# TYPE fairway_overhead_seconds histogram\n");
    for (le, c) in [
        ("0.000025", 0.0),
        ("0.00005", 60.0),
        ("0.0001", 100.0),
        ("+Inf", 100.0),
    ] {
        push(&mut o, "fairway_overhead_seconds_bucket", &[("le", le)], c);
    }
    push(&mut o, "fairway_overhead_seconds_sum", &[], 0.006);
    push(&mut o, "fairway_overhead_seconds_count", &[], 100.0);
    o.push_str("# TYPE fairway_config_reloads_total counter\n");
    push(
        &mut o,
        "fairway_config_reloads_total",
        &[("result", "ok")],
        1.0,
    );
    o.push_str("# TYPE fairway_queue_depth gauge\n");
    for (t, v) in [("alpha", 3.0), ("beta", 0.0), ("gamma", 7.0)] {
        push(&mut o, "fairway_queue_depth", &[("tenant", t)], v);
    }
    o.push_str("# TYPE fairway_tenant_in_flight gauge\n");
    for (t, v) in [("alpha", 5.0), ("beta", 1.0), ("gamma", 0.0)] {
        push(&mut o, "fairway_tenant_in_flight", &[("tenant", t)], v);
    }
    push(
        &mut o,
        "fairway_rate_bucket_requests",
        &[("tenant", "alpha")],
        2.5,
    );
    push(
        &mut o,
        "fairway_tenant_slo_ttft_seconds",
        &[("tenant", "alpha")],
        0.5,
    );
    push(
        &mut o,
        "fairway_tenant_slo_e2e_seconds",
        &[("tenant", "alpha")],
        5.0,
    );
    o.push_str("# TYPE fairway_jain_fairness_index gauge\n");
    push(&mut o, "fairway_jain_fairness_index", &[], 0.93);
    let a_l = [("backend", "gpu-a"), ("model", "llama")];
    let b_m = [("backend", "gpu-b"), ("model", "mistral")];
    // gpu-b first: the view sorts by name, not by body order.
    push(&mut o, "fairway_backend_in_flight", &b_m, 0.0);
    push(&mut o, "fairway_backend_in_flight", &a_l, 3.0);
    push(&mut o, "fairway_backend_window", &b_m, 4.0);
    push(&mut o, "fairway_backend_window", &a_l, 8.0);
    push(&mut o, "fairway_backend_healthy", &b_m, 0.0);
    push(&mut o, "fairway_backend_healthy", &a_l, 1.0);
    push(&mut o, "fairway_backend_kv_usage_ratio", &a_l, 0.42);
    push(&mut o, "fairway_backend_running", &a_l, 3.0);
    push(&mut o, "fairway_backend_waiting", &a_l, 2.0);
    push(&mut o, "fairway_backend_ttft_p99_seconds", &a_l, 0.3);
    push(&mut o, "fairway_backend_reading_age_seconds", &b_m, 12.5);
    push(&mut o, "fairway_backend_reading_age_seconds", &a_l, 0.25);
    push(&mut o, "fairway_backend_scrape_errors_total", &b_m, 7.0);
    push(&mut o, "fairway_backend_scrape_errors_total", &a_l, 0.0);
    // gpu-a's prefix cache: 60 % of prompt tokens found cached over its
    // life before, 80 % of those between the two scrapes.
    let (cached, prompt) = (40.0 * a.served - 1000.0, 50.0 * a.served);
    push(
        &mut o,
        "fairway_backend_cached_prompt_tokens_total",
        &a_l,
        cached,
    );
    push(
        &mut o,
        "fairway_backend_reported_prompt_tokens_total",
        &a_l,
        prompt,
    );
    o
}

/// The cells of the line whose first word is `first`.
pub(super) fn row<'a>(text: &'a str, first: &str) -> Vec<&'a str> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&first))
        .unwrap_or_else(|| panic!("no line for {first} in\n{text}"))
}

pub(super) fn line_index(text: &str, first: &str) -> usize {
    text.lines()
        .position(|l| l.split_whitespace().next() == Some(first))
        .unwrap()
}
