//! The exposition after mixed traffic: outcome counters add up, and the real
//! `promtool` accepts it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::*;

const M: &str = "sim-model";

#[tokio::test]
async fn outcomes_add_up_and_promtool_accepts_the_scrape() {
    let b = sim(M, 8).await;
    let text = format!(
        "{SERVER}\n[[pools]]\nmodel = \"{M}\"\n[[pools.backends]]\nurl = \"http://{{b0}}\"\n\
         [[tenants]]\nname = \"api\"\napi_keys = [\"k\"]\nrate = 3\nburst = 3\nslo = {{ ttft = \"5s\", e2e = \"10s\" }}\n"
    );
    let gw = gateway(&text, &[&b]).await;
    let c = client();
    let mut sent = 0;
    for _ in 0..5 {
        send(
            &c,
            post(
                gw.addr(),
                "/v1/chat/completions",
                Some("k"),
                chat(M, 2, false),
            ),
        )
        .await; // 3 served, 2 refused
        sent += 1;
    }
    send(
        &c,
        post(
            gw.addr(),
            "/v1/chat/completions",
            Some("bad"),
            chat(M, 2, false),
        ),
    )
    .await;
    send(
        &c,
        post(gw.addr(), "/v1/chat/completions", Some("k"), "{oops"),
    )
    .await;
    sent += 2;
    let m = scrape(&gw).await;
    assert_eq!(
        metric_sum(&m, "fairway_requests_total{"),
        f64::from(sent),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "fairway_requests_total{tenant=\"api\",model=\"sim-model\",outcome=\"served\""
        ),
        Some(3.0)
    );
    assert_eq!(
        metric(
            &m,
            "fairway_goodput_total{tenant=\"api\",model=\"sim-model\"}"
        ),
        Some(3.0)
    );
    assert_eq!(
        metric(
            &m,
            "fairway_ttft_seconds_count{tenant=\"api\",model=\"sim-model\"}"
        ),
        Some(3.0)
    );
    assert!(metric(&m, "fairway_overhead_seconds_count").unwrap() >= 3.0);

    promtool_check(&m);
}
