//! The Files and Batch APIs over real TCP (docs/batch.md): a batch runs
//! to its output beside live traffic, every item exactly once; bad files
//! fail with their lines; a cancel keeps what finished; one tenant cannot
//! see or cancel another's; a `kill -9` mid-batch loses and doubles
//! nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use serde_json::{Value, json};
use support::batch::*;
use support::*;

/// A gateway whose batch store is in `dir`: tenant `api` (key `ka`,
/// interactive) and `evals` (key `ke`), two sims serving `m`.
fn policy(dir: &std::path::Path, extra: &str) -> String {
    std::fs::write(dir.join("admin-token"), "admin-secret").unwrap();
    format!(
        r#"{SERVER}
admin_token_file = "{}"

[batch]
data_dir = "{}"
{extra}

[[pools]]
model = "m"
backends = [{{ name = "b0", url = "http://{{b0}}" }}, {{ name = "b1", url = "http://{{b1}}" }}]

[[tenants]]
name = "api"
api_keys = ["ka"]
weight = 3
slo = {{ ttft = "2s", e2e = "20s" }}

[[tenants]]
name = "evals"
api_keys = ["ke"]
"#,
        dir.join("admin-token").display(),
        dir.join("data").display()
    )
}

/// Uploads `n` items and creates their batch; its id.
async fn start(addr: std::net::SocketAddr, n: usize, max_tokens: u32) -> String {
    let f = upload(addr, "ke", "batch", &input(n, "m", max_tokens)).await;
    assert_eq!(f.status, StatusCode::OK, "{}", f.text());
    let c = create(addr, "ke", f.json()["id"].as_str().unwrap()).await;
    assert_eq!(c.status, StatusCode::OK, "{}", c.text());
    c.json()["id"].as_str().unwrap().to_owned()
}

/// Waits until batch `id` has `n` items completed.
async fn until_completed(addr: std::net::SocketAddr, id: &str, n: u64) {
    let start = tokio::time::Instant::now();
    while batch(addr, "ke", id).await["request_counts"]["completed"]
        .as_u64()
        .unwrap()
        < n
    {
        assert!(start.elapsed() < Duration::from_secs(30), "{id}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_runs_beside_live_traffic_to_its_output_each_item_once() {
    let dir = tempfile::tempdir().unwrap();
    let (b0, b1) = (sim("m", 8).await, sim("m", 8).await);
    let gw = gateway(&policy(dir.path(), ""), &[&b0, &b1]).await;
    let addr = gw.addr();

    let f = upload(addr, "ke", "batch", &input(120, "m", 16)).await;
    assert_eq!(f.status, StatusCode::OK, "{}", f.text());
    let file = f.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(f.json()["purpose"], "batch");
    let c = create(addr, "ke", &file).await;
    assert_eq!(c.status, StatusCode::OK, "{}", c.text());
    let id = c.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(c.json()["status"], "validating");
    assert_eq!(c.json()["metadata"]["suite"], "t");

    // Live traffic meanwhile, served within its SLO.
    let c2 = client();
    let mut live_ok = 0;
    for _ in 0..20 {
        let r = send(
            &c2,
            post(
                addr,
                "/v1/chat/completions",
                Some("ka"),
                chat("m", 8, false),
            ),
        )
        .await;
        live_ok += usize::from(r.status == StatusCode::OK);
    }
    assert_eq!(live_ok, 20);

    let b = ended(addr, "ke", &id, Duration::from_secs(60)).await;
    assert_eq!(b["status"], "completed", "{b}");
    assert_eq!(
        b["request_counts"],
        json!({"total": 120, "completed": 120, "failed": 0})
    );
    assert!(
        b["usage"]["output_tokens"].as_u64().unwrap() >= 120 * 16,
        "{b}"
    );
    assert!(b["error_file_id"].is_null());
    let out = lines(addr, "ke", b["output_file_id"].as_str().unwrap()).await;
    assert_eq!(out.len(), 120);
    for (cid, l) in &out {
        assert_eq!(l["response"]["status_code"], 200, "{cid}");
        assert_eq!(l["response"]["body"]["object"], "chat.completion");
        assert!(l["error"].is_null());
    }

    // Another tenant sees none of it, nor can cancel it; the operator
    // sees it.
    for path in [
        format!("/v1/batches/{id}"),
        format!("/v1/files/{file}"),
        format!("/v1/files/{file}/content"),
    ] {
        let r = call(Method::GET, addr, &path, "ka").await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}");
    }
    let r = call(
        Method::POST,
        addr,
        &format!("/v1/batches/{id}/cancel"),
        "ka",
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = call(Method::GET, addr, "/v1/batches", "ka").await;
    assert_eq!(r.json()["data"], json!([]));
    let r = call(Method::GET, addr, "/v1/batches", "admin-secret").await;
    assert_eq!(r.json()["data"][0]["id"], id.as_str());
    let r = call(Method::GET, addr, "/v1/files?limit=1", "ke").await;
    assert_eq!(r.json()["data"].as_array().unwrap().len(), 1);
    assert_eq!(r.json()["has_more"], true, "{}", r.text());
    // A finished batch is not cancelled; its input may now be deleted.
    let r = call(
        Method::POST,
        addr,
        &format!("/v1/batches/{id}/cancel"),
        "ke",
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    let r = call(Method::DELETE, addr, &format!("/v1/files/{file}"), "ke").await;
    assert_eq!(r.json()["deleted"], true);
    let r = call(Method::GET, addr, &format!("/v1/files/{file}"), "ke").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    // Every item was a request of its owner's, counted once; the batch is
    // in the batch families (promtool reads them).
    let m = scrape(&gw).await;
    promtool_check(&m);
    assert_eq!(
        metric(&m, "fairway_batches{tenant=\"evals\",status=\"completed\"}"),
        Some(1.0)
    );
    assert!(
        metric(
            &m,
            "fairway_requests_total{tenant=\"evals\",model=\"m\",outcome=\"served\",reason=\"\"}"
        )
        .unwrap()
            >= 120.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_preempted_mid_answer_resume_and_their_answers_are_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (b0, b1) = (sim("m", 2).await, sim("m", 2).await);
    // Two slots a backend: the items fill all four.
    let extra = "\n[preemption]\nmin_wait = \"10ms\"\n";
    let toml = policy(dir.path(), extra).replace("}\" }", "}\", max_inflight = 2 }");
    let gw = gateway(&toml, &[&b0, &b1]).await;
    let addr = gw.addr();
    // 400 tokens at 2 ms: each item answers for about a second.
    let (n, max_tokens) = (16, 400);
    let id = start(addr, n, max_tokens).await;

    // Live work keeps arriving while the items answer: each waits for a
    // slot that only a preemption frees.
    let live = tokio::spawn(async move {
        let c = client();
        let mut statuses = Vec::new();
        for _ in 0..12 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let body = chat("m", 4, false);
            let r = send(&c, post(addr, "/v1/chat/completions", Some("ka"), body)).await;
            statuses.push(r.status);
        }
        statuses
    });
    // While it runs, its own counts are in the batch's gauges.
    let resumed = format!(
        "fairway_batch_running_preemptions{{tenant=\"evals\",batch=\"{id}\",what=\"resumed\"}}"
    );
    let mut seen = 0.0;
    let running =
        |b: &Value| ["validating", "in_progress"].contains(&b["status"].as_str().unwrap());
    while seen < 1.0 && running(&batch(addr, "ke", &id).await) {
        seen = metric(&scrape(&gw).await, &resumed).unwrap_or(0.0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen >= 1.0, "no resume counted for the batch while it ran");
    let b = ended(addr, "ke", &id, Duration::from_secs(90)).await;
    assert!(live.await.unwrap().iter().all(|s| *s == StatusCode::OK));
    assert_eq!(b["status"], "completed", "{b}");
    assert_eq!(b["request_counts"]["completed"], n);

    let m = scrape(&gw).await;
    promtool_check(&m);
    let count = |name: &str| metric(&m, &format!("{name}{{tenant=\"evals\"}}")).unwrap_or(0.0);
    let preempted = count("fairway_batch_items_preempted_total");
    assert!(preempted >= 1.0, "no item was preempted mid-answer");
    assert_eq!(count("fairway_batch_items_resumed_total"), preempted);
    assert_eq!(count("fairway_batch_items_restarted_total"), 0.0);
    assert!(count("fairway_batch_resume_tokens_saved_total") >= 1.0);

    // Every answer is whole, as one uninterrupted call gives it: all its
    // tokens once, the prompt counted once, its finish reason.
    let out = lines(addr, "ke", b["output_file_id"].as_str().unwrap()).await;
    assert_eq!(out.len(), n);
    let direct = client();
    for (cid, l) in &out {
        let body = &l["response"]["body"];
        assert_eq!(body["object"], "chat.completion", "{cid}");
        let text = body["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(text, " tok".repeat(max_tokens as usize), "{cid}");
        assert_eq!(body["choices"][0]["finish_reason"], "length", "{cid}");
        assert_eq!(body["usage"]["completion_tokens"], max_tokens, "{cid}");
        // The prompt as the engine counts it, asked of it directly.
        let i: usize = cid[1..].parse().unwrap();
        let item: Value = serde_json::from_str(input(n, "m", 1).lines().nth(i).unwrap()).unwrap();
        let r = send(
            &direct,
            post(
                b0.addr(),
                "/v1/chat/completions",
                None,
                item["body"].to_string(),
            ),
        )
        .await;
        assert_eq!(
            body["usage"]["prompt_tokens"],
            r.json()["usage"]["prompt_tokens"],
            "{cid}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_too_short_for_the_load_is_reported_before_it_expires() {
    let dir = tempfile::tempdir().unwrap();
    let (b0, b1) = (sim("m", 1).await, sim("m", 1).await);
    // One slot a backend, 0.2 s an item: 120 items need 12 s of a 6 s window.
    let toml = policy(dir.path(), "window = \"6s\"").replace("}\" }", "}\", max_inflight = 1 }");
    let gw = gateway(&toml, &[&b0, &b1]).await;
    let addr = gw.addr();
    let (n, max_tokens) = (120, 100);
    let id = start(addr, n, max_tokens).await;
    let start = tokio::time::Instant::now();
    let b = loop {
        let b = batch(addr, "ke", &id).await;
        if b["deadline_at_risk"] == true {
            break b;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "no warning: {b}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Said while it runs, well before it expires.
    assert_eq!(b["status"], "in_progress", "{b}");
    let now = fairway::clock::unix_seconds();
    let expires = b["expires_at"].as_u64().unwrap();
    assert!(now + 2 <= expires, "{b}");
    assert!(
        b["projected_completion_at"].as_u64().unwrap() > expires,
        "{b}"
    );
    let m = scrape(&gw).await;
    promtool_check(&m);
    let slack = metric(
        &m,
        &format!("fairway_batch_deadline_slack_seconds{{tenant=\"evals\",batch=\"{id}\"}}"),
    )
    .unwrap();
    assert!(slack < 0.0, "{slack}");
    // It then expires with what finished, every item once.
    let b = ended(addr, "ke", &id, Duration::from_secs(30)).await;
    assert_eq!(b["status"], "expired", "{b}");
    let c = &b["request_counts"];
    assert!(c["completed"].as_u64().unwrap() > 0, "{b}");
    assert_eq!(
        c["completed"].as_u64().unwrap() + c["failed"].as_u64().unwrap(),
        n as u64
    );
    assert!(
        b.get("deadline_at_risk").is_none(),
        "only while it runs: {b}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_batch_and_its_outputs_go_after_their_retention() {
    let dir = tempfile::tempdir().unwrap();
    let b0 = sim("m", 8).await;
    let toml = policy(dir.path(), "retention = \"1s\"")
        .replace(", { name = \"b1\", url = \"http://{b1}\" }", "");
    let gw = gateway(&toml, &[&b0]).await;
    let addr = gw.addr();
    let f = upload(addr, "ke", "batch", &input(4, "m", 4)).await;
    let input_id = f.json()["id"].as_str().unwrap().to_owned();
    let c = create(addr, "ke", &input_id).await;
    let id = c.json()["id"].as_str().unwrap().to_owned();
    let b = ended(addr, "ke", &id, Duration::from_secs(20)).await;
    assert_eq!(b["status"], "completed", "{b}");
    let output = b["output_file_id"].as_str().unwrap().to_owned();
    let start = tokio::time::Instant::now();
    while call(Method::GET, addr, &format!("/v1/batches/{id}"), "ke")
        .await
        .status
        == StatusCode::OK
    {
        assert!(start.elapsed() < Duration::from_secs(10), "still kept");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = call(Method::GET, addr, &format!("/v1/files/{output}"), "ke").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "its output goes with it");
    let r = call(Method::GET, addr, &format!("/v1/files/{input_id}"), "ke").await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "its input is its owner's to delete"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_files_and_bad_calls_get_clear_errors_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let b0 = sim("m", 8).await;
    let gw = gateway(&policy(dir.path(), "max_file_bytes = 4000"), &[&b0, &b0]).await;
    let addr = gw.addr();
    let good = input(1, "m", 4);
    let bad = [
        good.clone(),
        "{not json\n".into(),
        good.clone(),
        input(1, "nope", 4).replace("q0", "q9"),
        input(1, "m", 4)
            .replace("q0", "q8")
            .replace("/v1/chat/completions", "/v1/embeddings"),
    ]
    .concat();
    let f = upload(addr, "ke", "batch", &bad).await;
    let file = f.json()["id"].as_str().unwrap().to_owned();
    let id = create(addr, "ke", &file).await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let b = ended(addr, "ke", &id, Duration::from_secs(10)).await;
    assert_eq!(b["status"], "failed", "{b}");
    let errors: Vec<(u64, &str)> = b["errors"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["line"].as_u64().unwrap(), e["code"].as_str().unwrap()))
        .collect();
    assert_eq!(
        errors,
        [
            (2, "invalid_json_line"),
            (3, "duplicate_custom_id"),
            (4, "model_not_found"),
            (5, "mismatched_endpoint")
        ]
    );
    assert_eq!(b["request_counts"]["completed"], 0);
    assert!(b["output_file_id"].is_null());

    // A file over the limit, a wrong purpose, a wrong endpoint or window,
    // a file that is not there.
    let r = upload(addr, "ke", "batch", &input(40, "m", 4)).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.text());
    let r = upload(addr, "ke", "fine-tune", &good).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    for body in [
        json!({"input_file_id": file, "endpoint": "/v1/images/generations", "completion_window": "24h"}),
        json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "1h"}),
    ] {
        let r = send(
            &client(),
            request(Method::POST, addr, "/v1/batches", "ke", body.to_string()),
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
        assert!(r.json()["error"]["message"].as_str().unwrap().len() > 10);
    }
    let r = create(addr, "ke", "file-nope").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // Another tenant's file cannot be batched.
    let r = create(addr, "ka", &file).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // No key, no batch.
    let r = send(
        &client(),
        Request::get(format!("http://{addr}/v1/batches"))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // Nothing ran.
    let m = scrape(&gw).await;
    assert!(
        metric(&m, "fairway_requests_total{tenant=\"evals\"").is_none(),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_keeps_what_finished_and_every_item_has_one_line() {
    let dir = tempfile::tempdir().unwrap();
    // Slow engines: a batch that cannot finish before the cancel.
    let slow = || {
        fairway::sim::backend::SimBackend::builder("m")
            .max_num_seqs(4)
            .decode_step(Duration::from_millis(20), Duration::from_micros(10))
            .start()
    };
    let (b0, b1) = (slow().await.unwrap(), slow().await.unwrap());
    let gw = gateway(&policy(dir.path(), ""), &[&b0, &b1]).await;
    let addr = gw.addr();
    let id = start(addr, 200, 32).await;
    until_completed(addr, &id, 5).await;
    // Mid-batch, the items' states are in /metrics.
    let m = scrape(&gw).await;
    let pending = metric(
        &m,
        "fairway_batch_items{tenant=\"evals\",state=\"pending\"}",
    )
    .unwrap();
    let done = metric(
        &m,
        "fairway_batch_items{tenant=\"evals\",state=\"completed\"}",
    )
    .unwrap();
    assert!(pending > 0.0 && done >= 5.0, "{m}");
    let r = call(
        Method::POST,
        addr,
        &format!("/v1/batches/{id}/cancel"),
        "ke",
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(["cancelling", "cancelled"].contains(&r.json()["status"].as_str().unwrap()));
    let b = ended(addr, "ke", &id, Duration::from_secs(20)).await;
    assert_eq!(b["status"], "cancelled", "{b}");
    let done = b["request_counts"]["completed"].as_u64().unwrap();
    let failed = b["request_counts"]["failed"].as_u64().unwrap();
    assert!((5..200).contains(&done), "{b}");
    assert_eq!(done + failed, 200, "{b}");
    let out = lines(addr, "ke", b["output_file_id"].as_str().unwrap()).await;
    let err = lines(addr, "ke", b["error_file_id"].as_str().unwrap()).await;
    assert_eq!(out.len() as u64, done);
    assert_eq!(err.len() as u64, failed);
    assert!(
        err.values()
            .all(|l| l["error"]["code"] == "batch_cancelled")
    );
    assert!(out.keys().all(|k| !err.contains_key(k)));
}

/// A real `fairway serve` killed with SIGKILL mid-batch, then started
/// again on the same data directory: the batch finishes, every item in
/// the output exactly once.
#[test]
fn a_kill_mid_batch_loses_and_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (b0, b1) = rt.block_on(slow_pair());
    let text = policy(dir.path(), "")
        .replace("{b0}", &b0.addr().to_string())
        .replace("{b1}", &b1.addr().to_string());
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, text).unwrap();
    let gw = ServeProcess::start(&[], &[], &path, "warn", std::process::Stdio::null());
    let addr = gw.addr;
    let id = rt.block_on(async {
        let id = start(addr, 150, 24).await;
        until_completed(addr, &id, 20).await;
        id
    });
    drop(gw); // SIGKILL
    let gw = ServeProcess::start(&[], &[], &path, "warn", std::process::Stdio::null());
    let addr = gw.addr;
    rt.block_on(async {
        let b = ended(addr, "ke", &id, Duration::from_secs(60)).await;
        assert_eq!(b["status"], "completed", "{b}");
        assert_eq!(
            b["request_counts"],
            json!({"total": 150, "completed": 150, "failed": 0})
        );
        let out = lines(addr, "ke", b["output_file_id"].as_str().unwrap()).await;
        assert_eq!(out.len(), 150);
    });
}

/// Generated tokens the sims `b` counted (`vllm:generation_tokens_total`).
async fn engine_tokens(b: &[&fairway::sim::backend::SimHandle]) -> f64 {
    let mut n = 0.0;
    for b in b {
        let text = get(&client(), format!("http://{}/metrics", b.addr()))
            .await
            .text();
        n += metric_sum(&text, "vllm:generation_tokens_total");
    }
    n
}

/// Items preempted and resumed mid-answer, the gateway killed with
/// `kill -9` while they answer, restarted on the same store: every item
/// once, each answer as one uninterrupted call gives it, and the engines
/// generated again no more than what the kill cut, at most
/// `checkpoint_tokens` an item in flight (each preemption's cut costs a
/// few tokens more: those the engine made before it saw the stream go).
#[test]
fn a_kill_mid_item_costs_no_more_than_its_last_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (b0, b1) = rt.block_on(async { (sim("m", 2).await, sim("m", 2).await) });
    let checkpoint = 32;
    let extra = format!("checkpoint_tokens = {checkpoint}\n\n[preemption]\nmin_wait = \"10ms\"\n");
    // Two slots a backend: the items fill all four.
    let text = policy(dir.path(), &extra)
        .replace("}\" }", "}\", max_inflight = 2 }")
        .replace("{b0}", &b0.addr().to_string())
        .replace("{b1}", &b1.addr().to_string());
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, text).unwrap();
    let gw = ServeProcess::start(&[], &[], &path, "warn", std::process::Stdio::null());
    let (addr, admin) = (gw.addr, gw.admin);
    // 1,000 tokens at 2 ms: each item answers for two seconds.
    let (n, max_tokens) = (8, 1000);
    let (id, live) = rt.block_on(async {
        let id = start(addr, n, max_tokens).await;
        // Live work keeps arriving: each request waits for a slot that
        // only a preemption frees.
        let live = tokio::spawn(async move {
            let c = client();
            let mut ok = 0;
            for _ in 0..6 {
                tokio::time::sleep(Duration::from_millis(150)).await;
                let r = send(
                    &c,
                    post(
                        addr,
                        "/v1/chat/completions",
                        Some("ka"),
                        chat("m", 4, false),
                    ),
                )
                .await;
                ok += u32::from(r.status == StatusCode::OK);
            }
            ok
        });
        let resumed = format!(
            "fairway_batch_running_preemptions{{tenant=\"evals\",batch=\"{id}\",what=\"resumed\"}}"
        );
        let t0 = tokio::time::Instant::now();
        loop {
            let m = get(&client(), format!("http://{admin}/metrics"))
                .await
                .text();
            if metric(&m, &resumed).unwrap_or(0.0) >= 1.0 {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "no item resumed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let live = live.await.unwrap();
        // The items answer on: each in flight is hundreds of tokens in.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let b = batch(addr, "ke", &id).await;
        assert!(
            b["request_counts"]["completed"].as_u64().unwrap() < n as u64,
            "{b}"
        );
        (id, live)
    });
    drop(gw); // SIGKILL, items mid-answer
    let gw = ServeProcess::start(&[], &[], &path, "warn", std::process::Stdio::null());
    let addr = gw.addr;
    rt.block_on(async {
        let b = ended(addr, "ke", &id, Duration::from_secs(60)).await;
        assert_eq!(b["status"], "completed", "{b}");
        assert_eq!(b["request_counts"]["completed"], n);
        let out = lines(addr, "ke", b["output_file_id"].as_str().unwrap()).await;
        assert_eq!(out.len(), n);
        for (cid, l) in &out {
            let body = &l["response"]["body"];
            let text = body["choices"][0]["message"]["content"].as_str().unwrap();
            assert_eq!(text, " tok".repeat(max_tokens as usize), "{cid}");
            assert_eq!(body["choices"][0]["finish_reason"], "length", "{cid}");
            assert_eq!(body["usage"]["completion_tokens"], max_tokens, "{cid}");
        }
        // What the engines generated beyond the answers: the kill's cut,
        // at most a checkpoint's worth for each of the four slots, and a
        // few tokens a preemption.
        let again = engine_tokens(&[&b0, &b1]).await
            - f64::from(max_tokens) * n as f64
            - f64::from(4 * live);
        eprintln!("tokens generated again: {again}");
        assert!(again >= 0.0, "{again}");
        assert!(
            again <= f64::from(4 * checkpoint + 64),
            "{again} tokens generated again"
        );
    });
}

/// A tmpfs of `mib` MiB mounted at a fresh directory, unmounted when
/// dropped; `None` (the test skips) where this process may not mount,
/// except in CI, whose machine runs the tests as root.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(mib: u32) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs the tests as root, which may mount a tmpfs"
            );
            eprintln!("skipped: this process may not mount a tmpfs");
            return None;
        }
        Some(Tmpfs { dir })
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Writes a file until the file system is full.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.path().join("filler")).unwrap();
        let chunk = vec![7u8; 64 << 10];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.flush();
    }

    fn free(&self) {
        std::fs::remove_file(self.path().join("filler")).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// The batch store's file system fills up under a running batch, then
/// gets space again: while it is full the runner sends nothing new and
/// keeps the results it could not store (the store says so in
/// `/metrics`), an upload is answered 507 and leaves nothing behind;
/// once freed the store opens itself again and the batch completes with
/// every item once, the engines having been sent no more requests than
/// the items and the retries the gateway reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_pauses_a_batch_and_it_completes_once_freed() {
    let Some(fs) = Tmpfs::mount(16) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (b0, b1) = (sim("m", 8).await, sim("m", 8).await);
    let toml = policy(dir.path(), "").replace(
        &dir.path().join("data").display().to_string(),
        &fs.path().join("data").display().to_string(),
    );
    let gw = gateway(&toml, &[&b0, &b1]).await;
    let addr = gw.addr();
    let sent = || b0.stats().submitted_total + b1.stats().submitted_total;
    let n = 400;
    let id = start(addr, n, 48).await;
    until_completed(addr, &id, 20).await;

    fs.fill();
    assert!(
        eventually(Duration::from_secs(20), async || {
            metric(&scrape(&gw).await, "fairway_batch_store_up ") == Some(0.0)
        })
        .await,
        "the store never failed"
    );
    // Nothing new goes to the engines while the store cannot write (what
    // was in flight finishes, and its results are held).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stalled = sent();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(sent(), stalled, "items were sent while the store failed");
    let m = scrape(&gw).await;
    assert!(
        metric(&m, "fairway_batch_results_held ").unwrap() > 0.0,
        "{m}"
    );
    // An upload now is refused for want of space, and leaves no bytes.
    let r = upload(addr, "ke", "batch", &input(50, "m", 8)).await;
    assert_eq!(r.status, StatusCode::INSUFFICIENT_STORAGE, "{}", r.text());
    let data = fs.path().join("data");
    assert_eq!(std::fs::read_dir(data.join("tmp")).unwrap().count(), 0);
    let blobs = std::fs::read_dir(data.join("files")).unwrap().count();
    assert_eq!(blobs, 1, "only the batch's input file");

    fs.free();
    let b = ended(addr, "ke", &id, Duration::from_secs(90)).await;
    assert_eq!(b["status"], "completed", "{b}");
    assert_eq!(
        b["request_counts"],
        json!({"total": n, "completed": n, "failed": 0})
    );
    let out = lines(addr, "ke", b["output_file_id"].as_str().unwrap()).await;
    assert_eq!(out.len(), n);
    let m = scrape(&gw).await;
    promtool_check(&m);
    assert_eq!(metric(&m, "fairway_batch_store_up "), Some(1.0));
    assert!(metric(&m, "fairway_batch_store_reopens_total ").unwrap() >= 1.0);
    assert_eq!(metric(&m, "fairway_batch_results_held "), Some(0.0));
    let retried = 0.0
        + metric_sum(&m, "fairway_batch_items_retried_total")
        + metric_sum(&m, "fairway_batch_items_restarted_total")
        + metric_sum(&m, "fairway_batch_items_resumed_total");
    eprintln!(
        "engine requests {} for {n} items and {retried} retries; {} store failures",
        sent(),
        metric(&m, "fairway_batch_store_failures_total ").unwrap()
    );
    assert!(sent() as f64 <= n as f64 + retried, "{} sent", sent());
}

/// Items refused at once by their owner's rate limit (a 429 before any
/// backend is asked) end within microseconds of their start, before the
/// runner could have recorded them if it recorded after spawning: each is
/// tried again after its `retry-after`, and the batch completes with
/// every item once (a record left behind by an item that ended first
/// would hold the batch open until it expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_refused_at_once_are_tried_again_and_the_batch_completes() {
    let dir = tempfile::tempdir().unwrap();
    let (b0, b1) = (sim("m", 8).await, sim("m", 8).await);
    // Not resumable: a resumable item waits out a 429 in its own task.
    let text = policy(dir.path(), "resume = false").replace(
        "name = \"evals\"\napi_keys = [\"ke\"]",
        "name = \"evals\"\napi_keys = [\"ke\"]\nrate = 10\nburst = 1",
    );
    let gw = gateway(&text, &[&b0, &b1]).await;
    let addr = gw.addr();
    let id = start(addr, 12, 4).await;
    let b = ended(addr, "ke", &id, Duration::from_secs(20)).await;
    assert_eq!(b["status"], "completed", "{b}");
    assert_eq!(b["request_counts"]["completed"], 12, "{b}");
    let out = lines(addr, "ke", b["output_file_id"].as_str().unwrap()).await;
    assert_eq!(out.len(), 12);
    let m = scrape(&gw).await;
    let retried = metric(&m, "fairway_batch_items_retried_total{tenant=\"evals\"}").unwrap();
    assert!(retried > 0.0, "no item was refused at once: {m}");
}
