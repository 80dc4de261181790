//! The scheduling policy live: auth, fair shares, admission refusals and
//! cancellation of queued requests, through a real gateway and simulated
//! backends.

mod support;

use std::time::Duration;

use http_body_util::BodyExt;
use support::*;

const M: &str = "sim-model";

fn policy(tenants: &str, window: u32, extra_server: &str) -> String {
    format!(
        "{SERVER}{extra_server}\n[queue]\nmax_wait = \"20s\"\n[[pools]]\nmodel = \"{M}\"\n\
         [[pools.backends]]\nurl = \"http://{{b0}}\"\nmax_inflight = {window}\n\
         [[pools.backends]]\nurl = \"http://{{b1}}\"\nmax_inflight = {window}\n{tenants}"
    )
}

const TENANTS: &str = r#"
[[tenants]]
name = "api"
api_keys = ["sk-api"]
weight = 3
[[tenants]]
name = "chat"
api_keys = ["sk-chat"]
weight = 1
[[tenants]]
name = "evals"
api_keys = ["sk-evals"]
rate = 2
burst = 2
"#;

async fn served_by(gw: &fairway::edge::server::Server) -> String {
    get(&client(), format!("http://{}/metrics", gw.admin_addr()))
        .await
        .text()
}

#[tokio::test]
async fn api_keys_map_to_tenants_and_bad_keys_get_401() {
    let (b0, b1) = (sim(M, 8).await, sim(M, 8).await);
    let gw = gateway(&policy(TENANTS, 8, ""), &[&b0, &b1]).await;
    let c = client();
    let r = send(
        &c,
        post(gw.addr(), "/v1/chat/completions", None, chat(M, 2, false)),
    )
    .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = send(
        &c,
        post(
            gw.addr(),
            "/v1/chat/completions",
            Some("sk-wrong"),
            chat(M, 2, false),
        ),
    )
    .await;
    assert_eq!(r.status, 401);
    for key in ["sk-api", "sk-chat", "sk-evals"] {
        let r = send(
            &c,
            post(
                gw.addr(),
                "/v1/chat/completions",
                Some(key),
                chat(M, 2, false),
            ),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    // Azure-style header.
    let mut req = post(gw.addr(), "/v1/chat/completions", None, chat(M, 2, false));
    req.headers_mut()
        .insert("api-key", "sk-chat".parse().unwrap());
    assert_eq!(send(&c, req).await.status, 200);
    // A tenant header is not trusted unless the operator opted in.
    let mut req = post(gw.addr(), "/v1/chat/completions", None, chat(M, 2, false));
    req.headers_mut()
        .insert("x-fairway-tenant", "api".parse().unwrap());
    assert_eq!(send(&c, req).await.status, 401);
    let m = served_by(&gw).await;
    for t in ["api", "chat", "evals"] {
        let want = if t == "chat" { 2.0 } else { 1.0 };
        assert_eq!(
            metric(
                &m,
                &format!("fairway_requests_total{{tenant=\"{t}\",model=\"{M}\",outcome=\"served\"")
            ),
            Some(want),
            "{m}"
        );
    }
    assert!(!m.contains("sk-"), "keys never appear in metrics");
    let policy_view = get(&c, format!("http://{}/admin/policy", gw.admin_addr()))
        .await
        .text();
    assert!(
        !policy_view.contains("sk-"),
        "keys never appear in the admin view: {policy_view}"
    );
}

#[tokio::test]
async fn trusted_tenant_header_when_enabled() {
    let (b0, b1) = (sim(M, 8).await, sim(M, 8).await);
    let gw = gateway(
        &policy(TENANTS, 8, "trust_tenant_header = \"x-fairway-tenant\"\n"),
        &[&b0, &b1],
    )
    .await;
    let mut req = post(gw.addr(), "/v1/chat/completions", None, chat(M, 2, false));
    req.headers_mut()
        .insert("x-fairway-tenant", "api".parse().unwrap());
    assert_eq!(send(&client(), req).await.status, 200);
}

#[tokio::test]
async fn weights_three_to_one_share_a_saturated_cluster() {
    // Two backends with a window of 2 each: 4 requests run, the rest queue.
    let (b0, b1) = (sim(M, 8).await, sim(M, 8).await);
    let gw = gateway(&policy(TENANTS, 2, ""), &[&b0, &b1]).await;
    let addr = gw.addr();
    let start = tokio::time::Instant::now();
    let stop = start + Duration::from_millis(3000);
    // Count only completions inside a window where both tenants are
    // backlogged: the ramp-up before it and the drain of the last queued
    // requests after it serve whoever is left, not the fair share.
    let window = (
        start + Duration::from_millis(500),
        start + Duration::from_millis(2500),
    );
    let mut tasks = Vec::new();
    // Each tenant keeps 16 requests outstanding for the whole run.
    for key in ["sk-api", "sk-chat"] {
        for _ in 0..16 {
            tasks.push(tokio::spawn(async move {
                let c = client();
                let mut n = 0u32;
                while tokio::time::Instant::now() < stop {
                    let r = send(
                        &c,
                        post(addr, "/v1/chat/completions", Some(key), chat(M, 10, false)),
                    )
                    .await;
                    assert_eq!(r.status, 200, "{}", r.text());
                    let done = tokio::time::Instant::now();
                    n += u32::from(window.0 <= done && done < window.1);
                }
                (key, n)
            }));
        }
    }
    let mut served = [0u32; 2];
    for t in tasks {
        let (key, n) = t.await.unwrap();
        served[usize::from(key == "sk-chat")] += n;
    }
    let ratio = f64::from(served[0]) / f64::from(served[1]);
    assert!(
        (ratio - 3.0).abs() <= 0.3,
        "served api:chat = {served:?} ({ratio:.2})"
    );
}

#[tokio::test]
async fn rate_limited_tenant_gets_429_with_a_retry_after_that_works() {
    let (b0, b1) = (sim(M, 8).await, sim(M, 8).await);
    let gw = gateway(&policy(TENANTS, 8, ""), &[&b0, &b1]).await;
    let c = client();
    let ask = async || {
        send(
            &c,
            post(
                gw.addr(),
                "/v1/chat/completions",
                Some("sk-evals"),
                chat(M, 1, false),
            ),
        )
        .await
    };
    // Successful answers carry the bucket's state too.
    for remaining in ["1", "0"] {
        let r = ask().await;
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["x-ratelimit-limit-requests"], "2");
        assert_eq!(r.headers["x-ratelimit-remaining-requests"], remaining);
        assert!(r.headers.contains_key("x-ratelimit-reset-requests"));
        assert!(!r.headers.contains_key("x-ratelimit-limit-gpu-seconds"));
    }
    let r = ask().await;
    assert_eq!(r.status, 429);
    assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
    assert_eq!(r.headers["x-ratelimit-limit-requests"], "2");
    assert_eq!(r.headers["x-ratelimit-remaining-requests"], "0");
    assert!(r.headers.contains_key("x-ratelimit-reset-requests"));
    let wait_ms: u64 = r.headers["retry-after-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        r.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    tokio::time::sleep(Duration::from_millis(wait_ms + 20)).await;
    let r = ask().await;
    assert_eq!(r.status, 200, "honouring retry-after succeeds");
    let m = served_by(&gw).await;
    assert_eq!(
        metric(
            &m,
            "fairway_requests_total{tenant=\"evals\",model=\"sim-model\",outcome=\"refused\",reason=\"rate\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn spent_gpu_budget_refuses_until_it_refills() {
    let tenants = r#"
[[tenants]]
name = "small"
api_keys = ["sk-small"]
gpu_seconds_per_hour = 0.36
"#;
    let (b0, b1) = (sim(M, 8).await, sim(M, 8).await);
    let gw = gateway(&policy(tenants, 8, ""), &[&b0, &b1]).await;
    let c = client();
    // One long request alone on a 1-GPU backend uses ~0.6 GPU-s: the budget
    // (0.36/h, refilling 0.1 ms per second) goes into debt.
    let r = send(
        &c,
        post(
            gw.addr(),
            "/v1/chat/completions",
            Some("sk-small"),
            chat(M, 300, false),
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    // The budget in GPU-seconds, on the successful answer: 0.36 an hour,
    // this request's estimate taken out.
    assert_eq!(r.headers["x-ratelimit-limit-gpu-seconds"], "0.36");
    let left: f64 = r.headers["x-ratelimit-remaining-gpu-seconds"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(left < 0.36, "{left}");
    assert!(r.headers.contains_key("x-ratelimit-reset-gpu-seconds"));
    assert!(!r.headers.contains_key("x-ratelimit-limit-requests"));
    let r = send(
        &c,
        post(
            gw.addr(),
            "/v1/chat/completions",
            Some("sk-small"),
            chat(M, 1, false),
        ),
    )
    .await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.text().contains("GPU-seconds"), "{}", r.text());
    let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry > 60, "refill is slow: {retry}s");
    let m = served_by(&gw).await;
    assert!(
        metric(&m, "fairway_gpu_seconds_bucket_level{tenant=\"small\"}").unwrap() < 0.0,
        "{m}"
    );
    assert!(metric(&m, "fairway_gpu_seconds_total{tenant=\"small\"}").unwrap() > 0.4);
}

#[tokio::test]
async fn queued_request_whose_client_hangs_up_leaves_the_queue() {
    let (b0, b1) = (sim(M, 8).await, sim(M, 8).await);
    let gw = gateway(&policy(TENANTS, 1, ""), &[&b0, &b1]).await;
    let c = client();
    // Fill both windows with long streams.
    let mut running = Vec::new();
    for _ in 0..2 {
        let resp = open(
            &c,
            post(
                gw.addr(),
                "/v1/chat/completions",
                Some("sk-api"),
                chat(M, 3000, true),
            ),
        )
        .await;
        running.push(resp.into_body());
    }
    // A third request queues; its client then gives up.
    let addr = gw.addr();
    let queued = tokio::spawn(async move {
        send(
            &client(),
            post(
                addr,
                "/v1/chat/completions",
                Some("sk-chat"),
                chat(M, 1, false),
            ),
        )
        .await
    });
    let depth = async || {
        metric(
            &served_by(&gw).await,
            "fairway_queue_depth{tenant=\"chat\"}",
        )
        .unwrap_or(-1.0)
    };
    assert!(
        eventually(Duration::from_secs(5), async || depth().await == 1.0).await,
        "request queued"
    );
    queued.abort();
    assert!(
        eventually(Duration::from_secs(5), async || depth().await == 0.0).await,
        "gone from the queue"
    );
    let m = served_by(&gw).await;
    assert_eq!(
        metric(
            &m,
            "fairway_requests_total{tenant=\"chat\",model=\"sim-model\",outcome=\"cancelled\""
        ),
        Some(1.0)
    );
    for mut b in running {
        let _ = b.frame().await;
    }
}

/// Two tenants on one backend with a window of 2: `jobs` (batch) fills it
/// with long non-streamed requests, then `app` (interactive) arrives.
fn preemption_policy(preemption: &str) -> String {
    format!(
        "{SERVER}\n[preemption]\n{preemption}\n[[pools]]\nmodel = \"{M}\"\n\
         [[pools.backends]]\nurl = \"http://{{b0}}\"\nmax_inflight = 2\n\
         [[tenants]]\nname = \"jobs\"\napi_keys = [\"sk-jobs\"]\npriority = \"batch\"\n\
         [[tenants]]\nname = \"app\"\napi_keys = [\"sk-app\"]\non_late = \"serve\"\n"
    )
}

/// Fills the window with two ~2 s batch requests, then times one short
/// interactive request. Returns its latency, the batch statuses and the
/// scrape after everything ended.
async fn interactive_behind_batch(preemption: &str) -> (Duration, Vec<u16>, String, u64) {
    let b0 = sim(M, 8).await;
    let gw = gateway(&preemption_policy(preemption), &[&b0]).await;
    let addr = gw.addr();
    let jobs: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(async move {
                send(
                    &client(),
                    post(
                        addr,
                        "/v1/chat/completions",
                        Some("sk-jobs"),
                        chat(M, 1000, false),
                    ),
                )
                .await
                .status
            })
        })
        .collect();
    while b0.stats().running < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Both have run 150 ms when the interactive request arrives.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let start = tokio::time::Instant::now();
    let r = send(
        &client(),
        post(
            addr,
            "/v1/chat/completions",
            Some("sk-app"),
            chat(M, 5, false),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let latency = start.elapsed();
    let mut statuses = Vec::new();
    for j in jobs {
        statuses.push(j.await.map_or(0, |s| s.as_u16()));
    }
    let m = served_by(&gw).await;
    (latency, statuses, m, b0.stats().finished_total)
}

#[tokio::test]
async fn interactive_work_preempts_young_batch_work_which_is_served_later() {
    let (latency, statuses, m, finished) =
        interactive_behind_batch("min_wait = \"50ms\"\nmigration_threshold = \"5m\"").await;
    assert!(latency < Duration::from_millis(1000), "waited {latency:?}");
    // The preempted job was queued again and served: nothing lost.
    assert_eq!(statuses, [200, 200]);
    assert_eq!(
        metric(&m, "fairway_preemptions_total{tenant=\"jobs\"}"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            &format!("fairway_requests_total{{tenant=\"jobs\",model=\"{M}\",outcome=\"served\""),
        ),
        Some(2.0)
    );
    // Its first run was aborted in the engine, not left to finish.
    assert_eq!(finished, 3);
}

#[tokio::test]
async fn work_past_the_migration_threshold_is_never_preempted() {
    let (latency, statuses, m, finished) =
        interactive_behind_batch("min_wait = \"0s\"\nmigration_threshold = \"100ms\"").await;
    // The batch work ran past 100 ms: the interactive request waits for a slot.
    assert!(
        latency > Duration::from_millis(1000),
        "waited only {latency:?}"
    );
    assert_eq!(statuses, [200, 200]);
    assert_eq!(
        metric(&m, "fairway_preemptions_total{tenant=\"jobs\"}"),
        Some(0.0)
    );
    assert_eq!(finished, 3);
}

/// Issue 17, live: a tenant flooding far over its share gets fast 429s
/// (reason `slo`) whose `retry-after`, honoured, succeeds, while a tenant
/// inside its share keeps its SLO.
#[tokio::test]
async fn over_share_tenant_gets_fast_slo_refusals_while_an_in_share_tenant_keeps_its_slo() {
    const SLO: Duration = Duration::from_millis(400);
    let tenants = r#"
[[tenants]]
name = "api"
api_keys = ["sk-api"]
weight = 3
slo = { ttft = "400ms", e2e = "2s" }
[[tenants]]
name = "flood"
api_keys = ["sk-flood"]
weight = 1
slo = { ttft = "400ms", e2e = "2s" }
"#;
    // Four slots of 20-token requests (about 40 ms each): about 100
    // requests a second. `api` asks for well under its 3/4 of them; the
    // flood keeps far more than a 400 ms budget's worth queued.
    let (b0, b1) = (sim(M, 8).await, sim(M, 8).await);
    let gw = gateway(&policy(tenants, 2, ""), &[&b0, &b1]).await;
    let addr = gw.addr();
    let start = tokio::time::Instant::now();
    let phase2 = start + Duration::from_secs(4);
    let stop = start + Duration::from_secs(7);

    // `api`: one request at a time, 50 ms apart, through both phases.
    let api = tokio::spawn(async move {
        let c = client();
        let mut slowest = Duration::ZERO;
        let mut n = 0;
        while tokio::time::Instant::now() < stop {
            let sent = tokio::time::Instant::now();
            let r = send(
                &c,
                post(
                    addr,
                    "/v1/chat/completions",
                    Some("sk-api"),
                    chat(M, 20, false),
                ),
            )
            .await;
            assert_eq!(
                r.status,
                200,
                "the in-share tenant was refused: {}",
                r.text()
            );
            slowest = slowest.max(sent.elapsed());
            n += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (n, slowest)
    });

    // A flood client sends one request and, refused (429) or shed (503),
    // waits the `retry-after-ms` it was given and sends it again, until
    // it is served. Returns the refusals it got: (status, how long the
    // answer took) for each attempt, in order, then its final 200.
    async fn until_served(c: &HttpClient, addr: std::net::SocketAddr) -> Vec<(u16, Duration)> {
        let mut attempts = Vec::new();
        loop {
            let sent = tokio::time::Instant::now();
            let r = send(
                c,
                post(
                    addr,
                    "/v1/chat/completions",
                    Some("sk-flood"),
                    chat(M, 20, false),
                ),
            )
            .await;
            attempts.push((r.status.as_u16(), sent.elapsed()));
            match r.status.as_u16() {
                200 => return attempts,
                429 => assert!(r.text().contains("time-to-first-token SLO"), "{}", r.text()),
                503 => assert_eq!(r.json()["error"]["code"], "overloaded"),
                s => panic!("{s}: {}", r.text()),
            }
            let ms: u64 = r.headers["retry-after-ms"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            let secs: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
            assert!(secs >= 1 && secs * 1000 >= ms, "{secs} s, {ms} ms");
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }

    // Phase 1, a persistent flood: 48 clients, each sending again as soon
    // as it is served.
    let mut flood = Vec::new();
    for _ in 0..48 {
        flood.push(tokio::spawn(async move {
            let c = client();
            let mut all = Vec::new();
            while tokio::time::Instant::now() < phase2 {
                all.push(until_served(&c, addr).await);
            }
            all
        }));
    }
    let mut persistent = Vec::new();
    for f in flood {
        persistent.extend(f.await.unwrap());
    }
    // Phase 2, a burst: 150 requests at once, each from a client that
    // honours its retry-after.
    let burst: Vec<_> = (0..150)
        .map(|_| tokio::spawn(async move { until_served(&client(), addr).await }))
        .collect();
    let mut bursted = Vec::new();
    for b in burst {
        bursted.push(b.await.unwrap());
    }
    let (api_n, api_slowest) = api.await.unwrap();

    // The in-share tenant: never refused (asserted as it ran), and every
    // response within its TTFT SLO (these are whole 20-token responses).
    assert!(api_n > 20, "{api_n}");
    assert!(
        api_slowest < SLO,
        "api's slowest response took {api_slowest:?}"
    );
    // The flood was refused, and fast: well before a queued request's
    // budget would have run out.
    let refusals: Vec<Duration> = persistent
        .iter()
        .chain(&bursted)
        .flatten()
        .filter(|(s, _)| *s == 429)
        .map(|(_, took)| *took)
        .collect();
    assert!(refusals.len() >= 20, "{} refusals", refusals.len());
    let slowest = refusals.iter().max().unwrap();
    assert!(*slowest < SLO / 2, "a 429 took {slowest:?}");
    // Everything it sent was served in the end, and the burst's refusals
    // were told to come back as the pool could take them: each was served
    // on its first retry.
    assert!(persistent.len() > 100, "{}", persistent.len());
    let refused_in_burst = bursted.iter().filter(|a| a[0].0 == 429).count();
    assert!(
        refused_in_burst >= 50,
        "{refused_in_burst} of the burst refused"
    );
    for a in &bursted {
        assert!(
            a.len() <= 2,
            "refused again after honouring retry-after: {a:?}"
        );
    }
    let m = served_by(&gw).await;
    let count = |tenant: &str, outcome: &str, reason: &str| {
        metric(
            &m,
            &format!(
                "fairway_requests_total{{tenant=\"{tenant}\",model=\"{M}\",outcome=\"{outcome}\",reason=\"{reason}\"}}"
            ),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(count("flood", "refused", "slo") as usize, refusals.len());
    assert_eq!(count("api", "refused", "slo"), 0.0);
    assert_eq!(count("api", "served", ""), f64::from(api_n));
}
