//! The tenant usage API and page (`/fairway/usage`, `/fairway/`): numbers
//! that agree with what the test sent, each tenant reading only itself, the
//! operator reading all, and the page in a real headless Chromium
//! (`tests/browser/usage_page.py`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use fairway::edge::server::Server;
use fairway::sim::backend::SimHandle;
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::Value;
use support::*;

const ADMIN: &str = "operator-token-for-tests";
static STARTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A policy's start: the admin token in a file in `dir`, the batch store
/// in `data_dir`, one pool of one backend serving `m`; tenants follow.
fn policy_head(dir: &std::path::Path, data_dir: &std::path::Path) -> String {
    let token = dir.join("admin-token");
    std::fs::write(&token, ADMIN).unwrap();
    format!(
        r#"{SERVER}admin_token_file = "{}"

[batch]
data_dir = "{}"

[[pools]]
model = "m"
backends = [{{ name = "b0", url = "http://{{b0}}" }}]
"#,
        token.display(),
        data_dir.display()
    )
}

/// Three tenants: `alpha` (no limits), `beta` (a burst of one request),
/// `gamma` (a GPU-seconds budget a single request spends); the admin token
/// in a file.
async fn start() -> (SimHandle, Server) {
    let dir = std::env::temp_dir().join(format!("fairway-usage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // One store a gateway: the tests of this file run at once.
    let data_dir = dir.join(format!(
        "batches-{}",
        STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let policy = policy_head(&dir, &data_dir)
        + r#"
[[tenants]]
name = "alpha"
api_keys = ["ka"]
slo = { ttft = "5s", e2e = "30s" }

[[tenants]]
name = "beta"
api_keys = ["kb"]
rate = 0.01
burst = 1

[[tenants]]
name = "gamma"
api_keys = ["kc"]
gpu_seconds_per_hour = 0.0001
"#;
    let b = sim("m", 8).await;
    let gw = gateway(&policy, &[&b]).await;
    (b, gw)
}

async fn chat_as(gw: &Server, key: &str) -> StatusCode {
    let req = post(
        gw.addr(),
        "/v1/chat/completions",
        Some(key),
        chat("m", 4, false),
    );
    send(&client(), req).await.status
}

async fn usage(gw: &Server, path: &str, auth: Option<&str>) -> (StatusCode, Value) {
    let mut req = Request::get(format!("http://{}{path}", gw.addr()));
    if let Some(a) = auth {
        req = req.header("authorization", format!("Bearer {a}"));
    }
    let reply = send(&client(), req.body(Full::default()).unwrap()).await;
    let json = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
    (reply.status, json)
}

/// Sends what the usage numbers must then show: alpha served twice, beta
/// served once and refused once by its rate, gamma refused by its budget.
async fn traffic(gw: &Server) {
    assert_eq!(chat_as(gw, "ka").await, StatusCode::OK);
    assert_eq!(chat_as(gw, "ka").await, StatusCode::OK);
    assert_eq!(chat_as(gw, "kb").await, StatusCode::OK);
    assert_eq!(chat_as(gw, "kb").await, StatusCode::TOO_MANY_REQUESTS);
    let mut refused = false;
    for _ in 0..10 {
        if chat_as(gw, "kc").await == StatusCode::TOO_MANY_REQUESTS {
            refused = true;
            break;
        }
    }
    assert!(refused, "gamma's budget never refused");
}

#[tokio::test]
async fn usage_numbers_agree_with_what_was_sent() {
    let (_b, gw) = start().await;
    traffic(&gw).await;

    let (status, a) = usage(&gw, "/fairway/usage", Some("ka")).await;
    assert_eq!(status, StatusCode::OK, "{a}");
    assert_eq!(a["tenant"], "alpha");
    assert_eq!(a["slo"]["ttft_seconds"], 5.0);
    let five = &a["windows"]["5m"];
    assert_eq!(
        (five["requests"].as_u64(), five["served"].as_u64()),
        (Some(2), Some(2)),
        "{a}"
    );
    assert_eq!(five["goodput"], 2);
    assert_eq!(five["slo_attainment"], 1.0);
    assert!(five["ttft_seconds"]["p50"].as_f64().unwrap() > 0.0);
    assert_eq!(a["windows"]["24h"]["served"], 2);
    assert_eq!(
        a["minutes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["requests"].as_u64().unwrap())
            .sum::<u64>(),
        2
    );
    assert_eq!(a["refusal_events"], serde_json::json!([]));
    assert!(a["limits"]["rate"]["requests_per_second"].is_null());

    let (_, b) = usage(&gw, "/fairway/usage", Some("kb")).await;
    assert_eq!(b["tenant"], "beta");
    assert_eq!(b["windows"]["1h"]["outcomes"]["refused"], 1, "{b}");
    assert_eq!(b["windows"]["1h"]["refusals"]["rate"], 1);
    assert_eq!(b["limits"]["rate"]["refused_1h"], 1);
    assert_eq!(b["limits"]["rate"]["burst"], 1.0);
    assert_eq!(b["refusal_events"][0]["reason"], "rate");
    assert_eq!(b["refusal_events"][0]["count_1h"], 1);

    let (_, c) = usage(&gw, "/fairway/usage", Some("kc")).await;
    let budget = &c["limits"]["gpu_seconds"];
    assert_eq!(budget["per_hour"], 0.0001);
    assert!(budget["refused_1h"].as_u64().unwrap() >= 1, "{c}");
    assert!(budget["used_1h"].as_f64().unwrap() > 0.0, "{c}");
    assert!(budget["available"].as_f64().unwrap() <= 0.0, "{c}");
    assert!(
        budget["available_again_unix"].as_f64().unwrap() > 0.0,
        "{c}"
    );
    assert_eq!(c["refusal_events"][0]["reason"], "gpu_seconds");

    // The operator sees all three.
    let (status, all) = usage(&gw, "/fairway/usage", Some(ADMIN)).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = all["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "{all}");
    for n in ["alpha", "beta", "gamma"] {
        assert!(names.contains(&n), "{names:?}");
    }
    assert_eq!(all["total"], 3);
    assert_eq!(all["sort"], "slo");
    assert!(all["next_offset"].is_null());
    // In the order asked for, a page at a time.
    let order = async |query: &str| -> Vec<String> {
        let (status, page) = usage(&gw, &format!("/fairway/usage?{query}"), Some(ADMIN)).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let tenants = page["tenants"].as_array().unwrap().iter();
        tenants
            .map(|t| t["tenant"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(order("sort=name").await, ["alpha", "beta", "gamma"]);
    // Refused once each, beta and gamma, by name; alpha never.
    assert_eq!(order("sort=refused").await, ["beta", "gamma", "alpha"]);
    // Alpha was served twice, the others once.
    assert_eq!(order("sort=gpu_seconds").await[0], "alpha");
    assert_eq!(order("sort=name&limit=2").await, ["alpha", "beta"]);
    assert_eq!(order("sort=name&limit=2&offset=2").await, ["gamma"]);
    let (_, page) = usage(&gw, "/fairway/usage?sort=name&limit=2", Some(ADMIN)).await;
    assert_eq!(page["next_offset"], 2);
    for bad in ["sort=worst", "limit=-1", "limit=1001", "offset=x"] {
        let (status, e) = usage(&gw, &format!("/fairway/usage?{bad}"), Some(ADMIN)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {e}");
    }
    let (_, one) = usage(&gw, "/fairway/usage/beta", Some(ADMIN)).await;
    assert_eq!(one["tenant"], "beta");
    // Shares: alpha's weight share among the three active tenants is a third.
    let share = a["share"]["weight_share"].as_f64().unwrap();
    assert!((share - 1.0 / 3.0).abs() < 1e-9, "{share}");
}

#[tokio::test]
async fn a_tenant_reads_only_itself() {
    let (_b, gw) = start().await;
    traffic(&gw).await;
    // Its own name is fine.
    let (status, own) = usage(&gw, "/fairway/usage/alpha", Some("ka")).await;
    assert_eq!(
        (status, own["tenant"].as_str()),
        (StatusCode::OK, Some("alpha"))
    );
    // Another tenant's, real or not, and tricks in the path or query.
    for path in [
        "/fairway/usage/beta",
        "/fairway/usage/nobody",
        "/fairway/usage/beta?tenant=alpha",
        "/fairway/usage/%62eta",
        "/fairway/usage/alpha/../beta",
        "/fairway/usage/../usage/beta",
        "/fairway/usage/beta/",
        "/fairway/usage//beta",
        "/fairway/usage/alpha%2F..%2Fbeta",
    ] {
        let (status, body) = usage(&gw, path, Some("ka")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert!(!body.to_string().contains("\"beta\""), "{path}: {body}");
    }
    // A query cannot widen the view either.
    let (status, body) = usage(&gw, "/fairway/usage?tenant=beta&all=1", Some("ka")).await;
    assert_eq!(
        (status, body["tenant"].as_str()),
        (StatusCode::OK, Some("alpha"))
    );
    assert!(body.get("tenants").is_none());
    // No key, a wrong key, a tenant key where the admin token goes.
    for auth in [None, Some("nope"), Some("Bearer ka")] {
        let (status, body) = usage(&gw, "/fairway/usage", auth).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{auth:?}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    }
    // Other methods.
    let req = post(gw.addr(), "/fairway/usage", Some("ka"), "{}");
    let reply = send(&client(), req).await;
    assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(reply.headers.get("allow").unwrap(), "GET");
    // The page is one self-contained document with a strict policy.
    let reply = get(&client(), format!("http://{}/fairway/", gw.addr())).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.text().starts_with("<!doctype html>"));
    let csp = reply
        .headers
        .get("content-security-policy")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    let page = reply.text().replace("http://www.w3.org/2000/svg", "");
    assert!(
        !page.contains("http://") && !page.contains("https://") && !page.contains("//cdn"),
        "the page loads nothing from elsewhere"
    );
}

/// The page in a real headless Chromium: sign in with a key, see the
/// attainment and the refusal the test caused explained, a name with
/// markup shown as text, the operator's view; screenshots kept in
/// `target/artifacts/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_in_a_real_browser() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("target/browser-venv/bin/python");
    let ready = python.exists() && std::path::Path::new("/usr/bin/chromedriver").exists();
    if !ready {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install chromium, chromium-driver and Selenium (tests/run.sh)"
        );
        eprintln!("skipped: no browser (run tests/run.sh)");
        return;
    }
    let (_b, gw) = start().await;
    traffic(&gw).await;
    // A batch of beta's: its rate holds it in progress.
    let item = r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}}"#;
    let f = support::batch::upload(gw.addr(), "kb", "batch", &format!("{item}\n")).await;
    let c = support::batch::create(gw.addr(), "kb", f.json()["id"].as_str().unwrap()).await;
    let batch = c.json()["id"].as_str().unwrap().to_owned();
    // In beta's usage, not in alpha's.
    let (_, beta) = usage(&gw, "/fairway/usage", Some("kb")).await;
    assert_eq!(beta["batches"][0]["id"], batch.as_str(), "{beta}");
    let (_, alpha) = usage(&gw, "/fairway/usage", Some("ka")).await;
    assert_eq!(alpha["batches"], serde_json::json!([]), "{alpha}");
    let base = format!("http://{}", gw.addr());
    let script = root.join("tests/browser/usage_page.py");
    let out_dir = root.join("target/artifacts");
    let args = vec![
        base.into(),
        "beta".into(),
        "kb".into(),
        ADMIN.into(),
        out_dir.into(),
        batch.into(),
    ];
    let (ok, text) = run_python(python, script, args).await;
    assert!(ok && text.contains("ok"), "{text}");
    assert!(root.join("target/artifacts/usage-page.png").exists());
}

/// Ten thousand tenants: the operator's view comes a page at a time, in
/// the order asked for, and twenty views at once, again and again, leave
/// a keyed request's latency alone (each view's cost is bounded: every
/// tenant's numbers are read at most once a second, off the request
/// path's threads, and only the page is built).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_tenants_viewed_at_once_leave_keyed_requests_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut policy = policy_head(dir.path(), &dir.path().join("batches"));
    for i in 0..10_000 {
        let rate = if i == 7 { 0.01 } else { 1000.0 };
        policy.push_str(&format!(
            "\n[[tenants]]\nname = \"t{i:05}\"\napi_keys = [\"k{i}\"]\nrate = {rate}\nburst = 2\n"
        ));
    }
    let b = sim("m", 8).await;
    let gw = gateway(&policy, &[&b]).await;
    let chat_time = async |key: &str| {
        let start = tokio::time::Instant::now();
        assert_eq!(chat_as(&gw, key).await, StatusCode::OK);
        start.elapsed().as_secs_f64()
    };
    // Traffic to sort by: t00007 refused (a burst of two, slowly
    // refilled), t00042 served.
    for _ in 0..3 {
        chat_as(&gw, "k7").await;
    }
    let mut alone = Vec::new();
    for _ in 0..20 {
        alone.push(chat_time("k42").await);
    }

    let started = tokio::time::Instant::now();
    let (status, page) = usage(&gw, "/fairway/usage?sort=refused", Some(ADMIN)).await;
    let one_view = started.elapsed().as_secs_f64();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["total"], 10_000);
    assert_eq!(page["tenants"].as_array().unwrap().len(), 100);
    assert_eq!(
        page["tenants"][0]["tenant"], "t00007",
        "{}",
        page["tenants"][0]
    );
    assert_eq!(page["next_offset"], 100);
    let page_bytes = page.to_string().len();
    assert!(page_bytes < 1 << 20, "{page_bytes} bytes");
    // The two served tenants first (attainment ties go by name), then
    // those that were not.
    let (_, page) = usage(&gw, "/fairway/usage?sort=slo&limit=3", Some(ADMIN)).await;
    let names: Vec<&str> = (0..3)
        .map(|i| page["tenants"][i]["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["t00007", "t00042", "t00000"]);
    let (_, last) = usage(&gw, "/fairway/usage?sort=name&offset=9999", Some(ADMIN)).await;
    assert_eq!(last["tenants"][0]["tenant"], "t09999");
    assert!(last["next_offset"].is_null());

    // Twenty operators' views at once, again and again, while a tenant
    // sends its requests.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let addr = gw.addr();
    let viewers: Vec<_> = (0..20)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut views = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let req = Request::get(format!("http://{addr}/fairway/usage"))
                        .header("authorization", format!("Bearer {ADMIN}"))
                        .body(Full::default())
                        .unwrap();
                    let r = send(&client(), req).await;
                    assert_eq!(r.status, StatusCode::OK);
                    views += 1;
                }
                views
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut during = Vec::new();
    for _ in 0..20 {
        during.push(chat_time("k42").await);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut views = 0;
    for v in viewers {
        views += v.await.unwrap();
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let worst = during.iter().copied().fold(0.0, f64::max);
    let (alone, during) = (median(&mut alone), median(&mut during));
    eprintln!(
        "one view {one_view:.3} s, {page_bytes} bytes; chat alone {alone:.4} s, during {views} views {during:.4} s (worst {worst:.3} s)"
    );
    // It was 1.2 s beside one view and up to 17 s beside twenty.
    assert!(worst < 1.0, "a keyed request waited {worst} s");
    assert!(during < alone + 0.2, "{during} s against {alone} s alone");
}
