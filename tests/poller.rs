//! The poller live: a real gateway scraping real simulated backends over
//! TCP. KV-aware routing, latency-aware routing, ejection and return, and
//! the fallback to the gateway's own counts when readings go stale.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use fairway::sim::backend::{Fault, SimBackend, SimHandle};
use support::*;

const M: &str = "sim-model";
/// KV cache of the small backend, in tokens (256 blocks of 16).
const SMALL_KV: u64 = 4096;

/// Two named backends `a` and `b`, polled every 50 ms.
fn two_backends() -> String {
    format!(
        "{SERVER}
[poller]
interval = \"50ms\"
[[pools]]
model = \"{M}\"
timeout = \"10s\"
[[pools.backends]]
name = \"a\"
url = \"http://{{b0}}\"
max_inflight = 16
[[pools.backends]]
name = \"b\"
url = \"http://{{b1}}\"
max_inflight = 16
"
    )
}

async fn small_kv_sim() -> SimHandle {
    SimBackend::builder(M)
        .kv_tokens(SMALL_KV)
        .decode_step(Duration::from_millis(5), Duration::from_micros(10))
        .start()
        .await
        .expect("sim starts")
}

/// Sends a long request straight to the backend (another client of the
/// engine, not through the gateway) that holds most of its KV cache for
/// about three seconds.
fn fill_directly(b: &SimHandle) -> tokio::task::JoinHandle<u16> {
    let prompt = "x".repeat(3400 * 4);
    let body = serde_json::json!({
        "model": M,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 600,
    })
    .to_string();
    let addr = b.addr();
    tokio::spawn(async move {
        send(&client(), post(addr, "/v1/chat/completions", None, body))
            .await
            .status
            .as_u16()
    })
}

async fn gateway_metrics(gw: &fairway::edge::server::Server) -> String {
    get(&client(), format!("http://{}/metrics", gw.admin_addr()))
        .await
        .text()
}

fn series(backend: &str, name: &str) -> String {
    format!("{name}{{backend=\"{backend}\"")
}

/// Sends `n` short requests through the gateway at once; returns their statuses.
async fn burst(gw: &fairway::edge::server::Server, n: usize) -> Vec<u16> {
    let addr = gw.addr();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            tokio::spawn(async move {
                send(
                    &client(),
                    post(addr, "/v1/chat/completions", None, chat(M, 5, false)),
                )
                .await
                .status
                .as_u16()
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Waits until the gateway's reading of backend `a` shows its KV cache at
/// the watermark; returns the series it watched.
async fn until_a_reads_full(gw: &fairway::edge::server::Server) -> String {
    let kv = series("a", "fairway_backend_kv_usage_ratio");
    assert!(
        eventually(Duration::from_secs(5), async || {
            metric(&gateway_metrics(gw).await, &kv).is_some_and(|v| v >= 0.8)
        })
        .await,
        "{}",
        gateway_metrics(gw).await
    );
    kv
}

#[tokio::test]
async fn a_backend_whose_kv_fills_gets_nothing_until_it_drains() {
    let a = small_kv_sim().await;
    let b = sim(M, 64).await;
    let gw = gateway(&two_backends(), &[&a, &b]).await;
    let filler = fill_directly(&a);
    // The gateway sees the full cache in a reading.
    let kv = until_a_reads_full(&gw).await;
    let before = a.stats().prompt_tokens_total;
    let statuses = burst(&gw, 12).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    // None of the twelve went to `a`, and all were served by `b`.
    assert!(!filler.is_finished());
    assert_eq!(a.stats().prompt_tokens_total, before);
    assert_eq!(b.stats().finished_total, 12);

    // `a` drains; the next readings show room, and it receives work again.
    assert_eq!(filler.await.unwrap(), 200);
    assert!(
        eventually(Duration::from_secs(5), async || {
            metric(&gateway_metrics(&gw).await, &kv).is_some_and(|v| v < 0.8)
        })
        .await
    );
    let statuses = burst(&gw, 12).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert!(a.stats().finished_total > 1, "a is used again once drained");
}

#[tokio::test]
async fn a_slower_backend_receives_proportionally_fewer() {
    let fast = sim(M, 64).await;
    let slow = SimBackend::builder(M)
        .max_num_seqs(64)
        .decode_step(Duration::from_millis(20), Duration::from_micros(10))
        .start()
        .await
        .unwrap();
    let gw = gateway(&two_backends(), &[&fast, &slow]).await;
    // Eight closed-loop clients, 20 tokens a request: the fast backend
    // finishes each in ~40 ms, the slow one in ~400 ms, so with least
    // outstanding the fast one holds fewer in flight and gets more.
    let addr = gw.addr();
    let workers: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(async move {
                let c = client();
                for _ in 0..12 {
                    let r = send(
                        &c,
                        post(addr, "/v1/chat/completions", None, chat(M, 20, false)),
                    )
                    .await;
                    assert_eq!(r.status, 200, "{}", r.text());
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let (f, s) = (fast.stats().finished_total, slow.stats().finished_total);
    assert_eq!(f + s, 96);
    assert!(f >= 2 * s, "fast {f}, slow {s}");
}

#[tokio::test]
async fn a_killed_backend_is_ejected_without_failed_requests_and_comes_back() {
    let a = sim(M, 64).await;
    let b = sim(M, 64).await;
    let b_addr = b.addr();
    let gw = gateway(&two_backends(), &[&a, &b]).await;
    let healthy = series("b", "fairway_backend_healthy");
    assert!(
        eventually(Duration::from_secs(5), async || {
            metric(&gateway_metrics(&gw).await, &healthy) == Some(1.0)
        })
        .await
    );
    assert!(burst(&gw, 8).await.iter().all(|s| *s == 200));

    // Kill `b` between requests: every later request is served, the first
    // ones by the retry on `a` after their connection to `b` fails.
    drop(b);
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.extend(burst(&gw, 8).await);
    }
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let m = gateway_metrics(&gw).await;
    assert_eq!(metric(&m, &healthy), Some(0.0), "{m}");
    let ready = format!("http://{}/readyz", gw.admin_addr());
    assert_eq!(
        get(&client(), ready.clone()).await.status,
        200,
        "a still serves"
    );

    // Restarted on the same address, it is probed healthy and used again.
    let b = SimBackend::builder(M)
        .listen(b_addr)
        .decode_step(Duration::from_millis(2), Duration::from_micros(10))
        .start()
        .await
        .expect("rebind the killed backend's port");
    assert!(
        eventually(Duration::from_secs(5), async || {
            metric(&gateway_metrics(&gw).await, &healthy) == Some(1.0)
        })
        .await
    );
    assert!(burst(&gw, 16).await.iter().all(|s| *s == 200));
    assert!(b.stats().finished_total > 0, "b serves again");
    let m = gateway_metrics(&gw).await;
    assert!(
        metric(&m, &series("b", "fairway_backend_scrape_errors_total")).unwrap() >= 1.0,
        "{m}"
    );

    // With both down, readiness says so and requests fail at once.
    drop(b);
    drop(a);
    assert!(
        eventually(Duration::from_secs(5), async || {
            get(&client(), ready.clone()).await.status == 503
        })
        .await
    );
    assert!(burst(&gw, 2).await.iter().all(|s| *s == 503));
}

#[tokio::test]
async fn stale_readings_fall_back_to_the_gateways_own_counts() {
    let a = small_kv_sim().await;
    let b = sim(M, 64).await;
    let gw = gateway(&two_backends(), &[&a, &b]).await;
    let filler = fill_directly(&a);
    let kv = until_a_reads_full(&gw).await;
    let before = a.stats().prompt_tokens_total;
    // `a`'s metrics break while it keeps serving: its last reading (full)
    // goes stale after three intervals and is no longer exported or used.
    a.set_fault(Fault::MetricsError);
    assert!(
        eventually(Duration::from_secs(5), async || {
            metric(&gateway_metrics(&gw).await, &kv).is_none()
        })
        .await
    );
    let m = gateway_metrics(&gw).await;
    assert_eq!(
        metric(&m, &series("a", "fairway_backend_healthy")),
        Some(1.0)
    );
    assert!(metric(&m, &series("a", "fairway_backend_scrape_errors_total")).unwrap() >= 1.0);
    // Routing now goes by the gateway's own in-flight counts, on which `a`
    // (nothing of ours in flight) looks idle: it gets requests again, which
    // wait in its engine behind the filler.
    let load = tokio::spawn({
        let addr = gw.addr();
        async move {
            let mut n = 0;
            for _ in 0..8 {
                let c = client();
                let r = send(
                    &c,
                    post(addr, "/v1/chat/completions", None, chat(M, 5, false)),
                )
                .await;
                n += usize::from(r.status == 200);
            }
            n
        }
    });
    let load2 = burst(&gw, 8);
    let (served, statuses) = tokio::join!(load, load2);
    assert_eq!(served.unwrap(), 8);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert!(
        a.stats().prompt_tokens_total > before,
        "a received requests on local counts"
    );
    assert_eq!(filler.await.unwrap(), 200);
}

#[tokio::test]
async fn a_scrape_too_large_or_too_slow_never_ejects_a_healthy_backend() {
    for fault in [Fault::MetricsHuge, Fault::MetricsTrickle] {
        let a = sim(M, 8).await;
        let b = sim(M, 8).await;
        a.set_fault(fault);
        let text = two_backends().replace(
            "interval = \"50ms\"",
            "interval = \"100ms\"\ntimeout = \"300ms\"",
        );
        let gw = gateway(&text, &[&a, &b]).await;
        let errors = series("a", "fairway_backend_scrape_errors_total");
        assert!(
            eventually(Duration::from_secs(5), async || {
                metric(&gateway_metrics(&gw).await, &errors).is_some_and(|n| n >= 3.0)
            })
            .await,
            "{fault:?}: {}",
            gateway_metrics(&gw).await
        );
        // Failed scrapes, yet still healthy and still served.
        let m = gateway_metrics(&gw).await;
        assert_eq!(
            metric(&m, &series("a", "fairway_backend_healthy")),
            Some(1.0),
            "{fault:?}: {m}"
        );
        let statuses = burst(&gw, 8).await;
        assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
        assert!(
            a.stats().prompt_tokens_total > 0,
            "{fault:?}: a got no requests"
        );
    }
}
