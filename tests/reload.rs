//! Hot reload of the policy file: by endpoint, by file change, by SIGHUP;
//! invalid or restart-only changes keep the running policy.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use fairway::PolicySource;
use fairway::config::load_policy;
use fairway::edge::server::Server;
use support::*;

const M: &str = "sim-model";

fn policy(backend: &str, keys: &[&str]) -> String {
    let mut s = format!(
        "{SERVER}\n[[pools]]\nmodel = \"{M}\"\n[[pools.backends]]\nurl = \"http://{backend}\"\n"
    );
    for (i, k) in keys.iter().enumerate() {
        s += &format!(
            "[[tenants]]\nname = \"t{i}\"\napi_keys = [\"{k}\"]\nrate = 0.01\nburst = 100\n"
        );
    }
    s
}

async fn start(path: &std::path::Path) -> Server {
    let (policy, text) = load_policy(path).unwrap_or_else(|e| panic!("{e:?}"));
    Server::start(
        policy,
        PolicySource {
            path: Some(path.to_path_buf()),
            text,
        },
    )
    .await
    .unwrap()
}

async fn status_with(gw: &Server, key: &str) -> u16 {
    send(
        &client(),
        post(
            gw.addr(),
            "/v1/chat/completions",
            Some(key),
            chat(M, 1, false),
        ),
    )
    .await
    .status
    .as_u16()
}

#[tokio::test]
async fn reload_by_endpoint_applies_a_valid_file_and_keeps_state() {
    let b = sim(M, 8).await;
    let path = temp_policy("endpoint", &policy(&b.addr().to_string(), &["k0"]));
    let gw = start(&path).await;
    assert_eq!(status_with(&gw, "k1").await, 401);
    // A long stream under the old policy must not be cut by the reload.
    let stream = open(
        &client(),
        post(
            gw.addr(),
            "/v1/chat/completions",
            Some("k0"),
            chat(M, 200, true),
        ),
    )
    .await;
    write_atomically(&path, &policy(&b.addr().to_string(), &["k0", "k1"]));
    let r = reload(&gw).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"], "ok");
    assert_eq!(status_with(&gw, "k1").await, 200);
    use http_body_util::BodyExt;
    let body = stream
        .into_body()
        .collect()
        .await
        .expect("stream survives the reload")
        .to_bytes();
    assert!(String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"));
    let m = get(&client(), format!("http://{}/metrics", gw.admin_addr()))
        .await
        .text();
    assert_eq!(
        metric(&m, "fairway_config_reloads_total{result=\"ok\"}"),
        Some(1.0)
    );
    // The unchanged tenant's rate bucket survived (two requests taken of 100).
    let level = metric(&m, "fairway_rate_bucket_requests{tenant=\"t0\"}").unwrap();
    assert!(level < 99.5, "bucket was not reset: {level}");
    let view = get(
        &client(),
        format!("http://{}/admin/policy", gw.admin_addr()),
    )
    .await
    .json();
    assert_eq!(view["policy"]["tenants"].as_array().unwrap().len(), 2);
    assert_eq!(view["source_sha256"].as_str().unwrap().len(), 64);
}

#[tokio::test]
async fn invalid_reload_keeps_the_old_policy_serving() {
    let b = sim(M, 8).await;
    let path = temp_policy("invalid", &policy(&b.addr().to_string(), &["k0"]));
    let gw = start(&path).await;
    write_atomically(&path, "[[pools]]\nmodel = 3\nbogus = true\n");
    let r = reload(&gw).await;
    assert_eq!(r.status, 422);
    let err = r.json()["error"].as_str().unwrap().to_owned();
    assert!(
        err.contains("policy.toml:2:9") && err.contains("bogus"),
        "every error, with positions: {err}"
    );
    assert_eq!(status_with(&gw, "k0").await, 200, "old policy still serves");
    // A restart-only change is refused, not half-applied.
    let moved = policy(&b.addr().to_string(), &["k0", "k1"]).replace(
        "admin_listen = \"127.0.0.1:0\"",
        "admin_listen = \"127.0.0.1:1\"",
    );
    write_atomically(&path, &moved);
    let r = reload(&gw).await;
    assert_eq!(r.status, 422);
    assert!(r.text().contains("server.admin_listen"), "{}", r.text());
    assert_eq!(status_with(&gw, "k1").await, 401, "nothing of it applied");
    // Turning on the trusted tenant header would make the header alone
    // enough to act as a tenant: restart-only too.
    let trusting = policy(&b.addr().to_string(), &["k0", "k1"]).replace(
        "[server]\n",
        "[server]\ntrust_tenant_header = \"x-tenant\"\n",
    );
    assert_ne!(trusting, policy(&b.addr().to_string(), &["k0", "k1"]));
    write_atomically(&path, &trusting);
    let r = reload(&gw).await;
    assert_eq!(r.status, 422);
    assert!(
        r.text().contains("server.trust_tenant_header"),
        "{}",
        r.text()
    );
    assert_eq!(status_with(&gw, "k1").await, 401, "nothing of it applied");
    let m = get(&client(), format!("http://{}/metrics", gw.admin_addr()))
        .await
        .text();
    assert_eq!(
        metric(&m, "fairway_config_reloads_total{result=\"failed\"}"),
        Some(3.0)
    );
}

#[tokio::test]
async fn a_change_to_the_file_is_picked_up() {
    let b = sim(M, 8).await;
    let path = temp_policy("watch", &policy(&b.addr().to_string(), &["k0"]));
    let gw = start(&path).await;
    tokio::spawn(fairway::edge::reload::watch(
        gw.services().clone(),
        Duration::from_millis(50),
        gw.shutdown_token(),
    ));
    write_atomically(&path, &policy(&b.addr().to_string(), &["k0", "k1"]));
    assert!(
        eventually(Duration::from_secs(5), async || status_with(&gw, "k1")
            .await
            == 200)
        .await
    );
}

/// Tenants kept as TokenBucketAdmission resources: editing the resource
/// file (not the policy) reloads, as a ConfigMap update would.
#[tokio::test]
async fn a_change_to_a_tenant_resource_file_is_picked_up() {
    let b = sim(M, 8).await;
    let text = format!(
        "tenant_resources = [\"tenants.yaml\"]\n{}",
        policy(&b.addr().to_string(), &[])
    );
    let path = temp_policy("resources", &text);
    let resource = |name: &str, key_digest: &str| {
        format!(
            "apiVersion: slo.fairway.dev/v1\nkind: TokenBucketAdmission\nmetadata:\n  name: {name}\n\
             spec:\n  apiKeySha256: [{key_digest}]\n  perTenantRate: 100\n"
        )
    };
    let digest = |key: &str| {
        use sha2::Digest;
        fairway::hex::hex(&sha2::Sha256::digest(key.as_bytes()))
    };
    let yaml = path.with_file_name("tenants.yaml");
    write_atomically(&yaml, &resource("a", &digest("ka")));
    let gw = start(&path).await;
    tokio::spawn(fairway::edge::reload::watch(
        gw.services().clone(),
        Duration::from_millis(50),
        gw.shutdown_token(),
    ));
    assert_eq!(status_with(&gw, "ka").await, 200);
    assert_eq!(status_with(&gw, "kb").await, 401);
    let two = format!(
        "{}---\n{}",
        resource("a", &digest("ka")),
        resource("b", &digest("kb"))
    );
    write_atomically(&yaml, &two);
    assert!(
        eventually(Duration::from_secs(5), async || status_with(&gw, "kb")
            .await
            == 200)
        .await
    );
}

#[tokio::test]
async fn sighup_reloads_and_sigterm_drains_the_real_binary() {
    let b = sim(M, 8).await;
    let path = temp_policy("signal", &policy(&b.addr().to_string(), &["k0"]));
    let mut gw = ServeProcess::start(&[], &[], &path, "warn", Stdio::inherit());
    let addr = gw.addr;
    let c = client();
    let status = async |key: &str| {
        send(
            &client(),
            post(addr, "/v1/chat/completions", Some(key), chat(M, 1, false)),
        )
        .await
        .status
        .as_u16()
    };
    assert_eq!(status("k1").await, 401);
    write_atomically(&path, &policy(&b.addr().to_string(), &["k0", "k1"]));
    let pid = gw.pid().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    assert!(eventually(Duration::from_secs(5), async || status("k1").await == 200).await);
    let stream = open(
        &c,
        post(addr, "/v1/chat/completions", Some("k0"), chat(M, 100, true)),
    )
    .await;
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    use http_body_util::BodyExt;
    let body = stream
        .into_body()
        .collect()
        .await
        .expect("in-flight stream finishes")
        .to_bytes();
    assert!(String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"));
    let exit = tokio::task::spawn_blocking(move || gw.child.wait().unwrap())
        .await
        .unwrap();
    assert!(exit.success(), "exits 0 after the drain: {exit:?}");
}

#[tokio::test]
async fn admin_endpoints_need_the_admin_token_when_one_is_set() {
    let b = sim(M, 8).await;
    let text = policy(&b.addr().to_string(), &["k0"]).replace(
        "[server]\n",
        "[server]\nadmin_token_env = \"FAIRWAY_ADMIN_TOKEN\"\nadmin_token_for_metrics = true\n",
    );
    let env = |k: &str| (k == "FAIRWAY_ADMIN_TOKEN").then(|| "t0ken".to_owned());
    let p = fairway::config::parse_policy_with_env(&text, "p.toml", &env).unwrap();
    let gw = Server::start(p, PolicySource { path: None, text })
        .await
        .unwrap();
    let admin = gw.admin_addr();
    let call = async |method: http::Method, path: &str, token: Option<&str>| {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("http://{admin}{path}"));
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        send(&client(), req).await
    };
    use http::Method;
    // Open: liveness and readiness.
    assert_eq!(call(Method::GET, "/healthz", None).await.status, 200);
    assert_eq!(call(Method::GET, "/readyz", None).await.status, 200);
    // Guarded: without or with a wrong token, 401 and nothing done.
    for token in [None, Some("wrong")] {
        for (m, path) in [
            (Method::GET, "/admin/policy"),
            (Method::POST, "/admin/reload"),
            (Method::GET, "/metrics"),
        ] {
            let r = call(m, path, token).await;
            assert_eq!(r.status, 401, "{path} with {token:?}");
            assert_eq!(r.headers["www-authenticate"], "Bearer");
        }
    }
    // With it: served.
    assert_eq!(
        call(Method::GET, "/admin/policy", Some("t0ken"))
            .await
            .status,
        200
    );
    assert_eq!(
        call(Method::GET, "/metrics", Some("t0ken")).await.status,
        200
    );
    // The scheme is matched whatever its case (RFC 9110 §11.1).
    for scheme in ["bearer", "BEARER"] {
        let req = http::Request::get(format!("http://{admin}/admin/policy"))
            .header("authorization", format!("{scheme} t0ken"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        assert_eq!(send(&client(), req).await.status, 200, "{scheme}");
    }
    // No file to reload from (an in-memory policy): refused, but authorised.
    assert_ne!(
        call(Method::POST, "/admin/reload", Some("t0ken"))
            .await
            .status,
        401
    );
}

#[tokio::test]
async fn replacing_the_admin_token_file_and_reloading_rotates_the_token() {
    let b = sim(M, 8).await;
    let text = policy(&b.addr().to_string(), &["k0"])
        .replace("[server]\n", "[server]\nadmin_token_file = \"token\"\n");
    let path = temp_policy("token-file", &text);
    let token_file = path.parent().unwrap().join("token");
    write_atomically(&token_file, "old-token\n");
    let gw = start(&path).await;
    let reload_with = async |token: &str| {
        let req = http::Request::post(format!("http://{}/admin/reload", gw.admin_addr()))
            .header("authorization", format!("Bearer {token}"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        send(&client(), req).await.status
    };
    write_atomically(&token_file, "new-token\n");
    // The policy file did not change; the token did.
    assert_eq!(reload_with("old-token").await, 200);
    assert_eq!(reload_with("old-token").await, 401);
    assert_eq!(reload_with("new-token").await, 200);
}
