//! Several replicas, one policy: three real gateways sharing a real
//! `redis-server` (started on a free port) in front of simulated
//! backends. Membership, a rate limit, a concurrency cap and a GPU-seconds
//! budget leased across the replicas, weighted shares with each tenant at
//! its own replica, a replica leaving or killed, and the store going away
//! and coming back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use fairway::edge::server::Server;
use support::*;

const M: &str = "m";

/// The tests here measure rates and ratios on two cores: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const KEY: &str = "sk-cluster";

fn policy(redis: &str, replica: &str, backend: std::net::SocketAddr, tenant: &str) -> String {
    format!(
        "{SERVER}\n[cluster]\nstore = \"{redis}\"\nreplica = \"{replica}\"\nsync_interval = \"100ms\"\nreplica_ttl = \"600ms\"\n\
         [[pools]]\nmodel = \"{M}\"\n[[pools.backends]]\nurl = \"http://{backend}\"\n\
         [[tenants]]\nname = \"a\"\napi_keys = [\"{KEY}\"]\n{tenant}\n"
    )
}

/// A simulated engine of `M` running `seqs` sequences at once, a decode
/// step of `step_ms` each.
async fn engine(seqs: u32, step_ms: u64) -> fairway::sim::backend::SimHandle {
    fairway::sim::backend::SimBackend::builder(M)
        .max_num_seqs(seqs)
        .decode_step(Duration::from_millis(step_ms), Duration::ZERO)
        .start()
        .await
        .unwrap()
}

async fn replicas_seen(gw: &Server) -> Option<f64> {
    let m = get(&client(), format!("http://{}/metrics", gw.admin_addr()))
        .await
        .text();
    metric(&m, "fairway_cluster_replicas{")
}

async fn all_see(gws: &[&Server], n: f64) -> bool {
    eventually(Duration::from_secs(5), async || {
        for gw in gws {
            if replicas_seen(gw).await != Some(n) {
                return false;
            }
        }
        true
    })
    .await
}

/// One short chat of `key`'s at `addr`.
async fn ask(c: &HttpClient, addr: std::net::SocketAddr, key: &str) -> Reply {
    send(
        c,
        post(addr, "/v1/chat/completions", Some(key), chat(M, 2, false)),
    )
    .await
}

/// Sends requests round-robin over `gws` for `secs`; how many were served.
async fn round_robin(gws: &[&Server], secs: f64) -> (usize, usize) {
    let c = client();
    let (mut served, mut sent) = (0, 0);
    let start = tokio::time::Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        let r = ask(&c, gws[sent % gws.len()].addr(), KEY).await;
        assert!(
            r.status == 200 || r.status == 429,
            "{} {}",
            r.status,
            r.text()
        );
        served += usize::from(r.status == 200);
        sent += 1;
    }
    (served, sent)
}

#[tokio::test]
async fn three_replicas_hold_one_rate_limit_and_follow_membership() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let b = sim(M, 64).await;
    let tenant = "rate = 5.0\nburst = 6";
    let url = redis.url();
    let start = async |name: &str| gateway(&policy(&url, name, b.addr(), tenant), &[]).await;
    let (r1, r2, r3) = (start("r1").await, start("r2").await, start("r3").await);
    assert!(all_see(&[&r1, &r2, &r3], 3.0).await, "membership not seen");

    // 6 burst + 5/s, leased from the store: over 2 s at most 16 for the
    // cluster, exactly (without the cluster it would be three times that).
    let (served, sent) = round_robin(&[&r1, &r2, &r3], 2.0).await;
    assert!(sent > 60, "only {sent} sent");
    eprintln!("served {served} of {sent}");
    assert!((10..=16).contains(&served), "served {served} of {sent}");

    // Skewed ingress: every request now arrives at r1. Its leases follow
    // its demand (a refusal asks the store at once), so the cluster still
    // serves near the limit, and never more: at most 6 + 5/s × 3 = 21
    // (measured 13-15: r2 and r3 keep asking for a second while their
    // smoothed demand from the round-robin phase decays).
    let (served, sent) = round_robin(&[&r1], 3.0).await;
    eprintln!("skewed: served {served} of {sent}");
    assert!(
        (10..=21).contains(&served),
        "skewed: served {served} of {sent}"
    );
    let m = get(&client(), format!("http://{}/metrics", r1.admin_addr()))
        .await
        .text();
    assert_eq!(metric(&m, "fairway_cluster_leasing{"), Some(1.0), "{m}");
    let held = metric(
        &m,
        "fairway_cluster_lease{replica=\"r1\",tenant=\"a\",limit=\"rate\"}",
    );
    assert!(held.is_some_and(|h| (0.0..=6.0).contains(&h)), "{m}");
    let syncs = metric(&m, "fairway_cluster_store_syncs_total{").unwrap();
    assert!(
        syncs < f64::from(u32::try_from(sent).unwrap()),
        "{syncs} syncs for {sent} requests"
    );

    // The store's view: three members, each renewing.
    let policy_view = get(
        &client(),
        format!("http://{}/admin/policy", r1.admin_addr()),
    )
    .await
    .json();
    assert_eq!(policy_view["cluster"]["replicas"], 3, "{policy_view}");
    assert_eq!(policy_view["cluster"]["replica"], "r1");

    // A replica that leaves cleanly is gone from the count at once.
    r3.shutdown().await;
    assert!(all_see(&[&r1, &r2], 2.0).await);

    // One that dies without leaving expires after replica_ttl: a member
    // written straight into the store, never renewed.
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    let expires = secs * 1000 + micros / 1000 + 400;
    let _: () = redis::cmd("ZADD")
        .arg("{fairway}:replicas")
        .arg(expires)
        .arg("ghost")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(
        all_see(&[&r1, &r2], 3.0).await,
        "the ghost was never counted"
    );
    assert!(all_see(&[&r1, &r2], 2.0).await, "the ghost never expired");

    // The store goes away: serving goes on with the last count, and the
    // change is visible; when it returns, both register again.
    redis.kill();
    assert!(
        eventually(Duration::from_secs(5), async || {
            let m = get(&client(), format!("http://{}/metrics", r1.admin_addr()))
                .await
                .text();
            metric(&m, "fairway_cluster_store_up{") == Some(0.0)
        })
        .await
    );
    assert_eq!(replicas_seen(&r1).await, Some(2.0));
    let r = ask(&client(), r1.addr(), KEY).await;
    assert!(r.status == 200 || r.status == 429, "{}", r.status);
    redis.restart();
    assert!(all_see(&[&r1, &r2], 2.0).await);
    assert!(
        eventually(Duration::from_secs(5), async || {
            let m = get(&client(), format!("http://{}/metrics", r2.admin_addr()))
                .await
                .text();
            metric(&m, "fairway_cluster_store_up{") == Some(1.0)
        })
        .await
    );
    let url = redis.url();
    let members = async || -> Vec<String> {
        let Ok(mut con) = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
        else {
            return Vec::new();
        };
        redis::cmd("ZRANGE")
            .arg("{fairway}:replicas")
            .arg(0)
            .arg(-1)
            .query_async(&mut con)
            .await
            .unwrap_or_default()
    };
    assert!(
        eventually(Duration::from_secs(5), async || members().await
            == ["r1", "r2"])
        .await,
        "{:?}",
        members().await
    );
}

fn secs_from_now(secs: u64) -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(secs)
}

/// A client sending `key`'s requests to `addr` back to back until `stop`,
/// every one served; how many ended after `measure_from`.
fn saturate(
    addr: std::net::SocketAddr,
    key: &'static str,
    stop: tokio::time::Instant,
    measure_from: tokio::time::Instant,
) -> tokio::task::JoinHandle<u32> {
    tokio::spawn(async move {
        let c = client();
        let mut served = 0u32;
        while tokio::time::Instant::now() < stop {
            let r = send(
                &c,
                post(addr, "/v1/chat/completions", Some(key), chat(M, 10, false)),
            )
            .await;
            assert_eq!(r.status, 200, "{}", r.text());
            served += u32::from(tokio::time::Instant::now() >= measure_from);
        }
        served
    })
}

#[tokio::test]
async fn weights_hold_across_replicas_when_each_tenant_arrives_at_its_own() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    // The engine has room for more than the window, so the window shares
    // decide who runs.
    let b = engine(16, 4).await;
    let text = |replica: &str| {
        format!(
            "{SERVER}\n[cluster]\nstore = \"{}\"\nreplica = \"{replica}\"\nsync_interval = \"100ms\"\n\
             [[pools]]\nmodel = \"{M}\"\n[[pools.backends]]\nurl = \"http://{}\"\nmax_inflight = 8\n\
             [[tenants]]\nname = \"a\"\napi_keys = [\"sk-a\"]\nweight = 3\n\
             [[tenants]]\nname = \"b\"\napi_keys = [\"sk-b\"]\nweight = 1\n",
            redis.url(),
            b.addr()
        )
    };
    let r1 = gateway(&text("r1"), &[]).await;
    let r2 = gateway(&text("r2"), &[]).await;
    assert!(all_see(&[&r1, &r2], 2.0).await);
    // Tenant a only at r1, tenant b only at r2, both saturating the one
    // backend. Alone, each replica would take half the window: 1:1.
    let (stop, measure_from) = (secs_from_now(6), secs_from_now(1));
    let load = |addr, key| saturate(addr, key, stop, measure_from);
    let tasks: Vec<_> = (0..12)
        .flat_map(|_| [load(r1.addr(), "sk-a"), load(r2.addr(), "sk-b")])
        .collect();
    // Throughout, the two replicas together never have more at the backend
    // than its window plus the rounding bound (max_inflight + N - 1 = 9),
    // although the engine would take 16.
    let mut most = 0.0f64;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let m = get(&client(), format!("http://{}/metrics", b.addr()))
            .await
            .text();
        let at_backend = metric(&m, "vllm:num_requests_running").unwrap_or(0.0)
            + metric(&m, "vllm:num_requests_waiting").unwrap_or(0.0);
        most = most.max(at_backend);
    }
    assert!(most <= 9.0, "{most} at the backend");
    eprintln!("most at the backend at once: {most}");
    // Mid-run, r1 holds about three quarters of the backend's window.
    let m = get(&client(), format!("http://{}/metrics", r1.admin_addr()))
        .await
        .text();
    let share = metric(&m, "fairway_cluster_pool_share{replica=\"r1\",model=\"m\"}").unwrap();
    assert!((0.65..=0.85).contains(&share), "{m}");
    let (mut a, mut b_served) = (0, 0);
    for (i, t) in tasks.into_iter().enumerate() {
        let n = t.await.unwrap();
        if i % 2 == 0 { a += n } else { b_served += n }
    }
    let ratio = f64::from(a) / f64::from(b_served.max(1));
    eprintln!("weighted 3:1 across replicas: a {a}, b {b_served}, ratio {ratio:.2}");
    // 3:1 within 10 % (measured 2.88-2.90; about 1.7 with even windows).
    assert!(
        (2.7..=3.3).contains(&ratio),
        "a {a}, b {b_served}: {ratio:.2}"
    );
}

/// Small windows: three replicas, two backends of `max_inflight = 2` (4
/// slots), weights 3:1 with each tenant at its own replica and the third
/// replica idle. Each replica rounding its own share of every window up
/// held 4 and 2 slots (served 1.99:1); apportioned whole slots are 3 and 1.
#[tokio::test]
async fn a_small_window_is_shared_three_to_one_across_three_replicas() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let (b0, b1) = (engine(16, 4).await, engine(16, 4).await);
    let text = |replica: &str| {
        format!(
            "{SERVER}\n[cluster]\nstore = \"{}\"\nreplica = \"{replica}\"\nsync_interval = \"100ms\"\n\
             [[pools]]\nmodel = \"{M}\"\n\
             [[pools.backends]]\nurl = \"http://{{b0}}\"\nmax_inflight = 2\n\
             [[pools.backends]]\nurl = \"http://{{b1}}\"\nmax_inflight = 2\n\
             [[tenants]]\nname = \"a\"\napi_keys = [\"sk-a\"]\nweight = 3\n\
             [[tenants]]\nname = \"b\"\napi_keys = [\"sk-b\"]\nweight = 1\n",
            redis.url(),
        )
    };
    let r1 = gateway(&text("r1"), &[&b0, &b1]).await;
    let r2 = gateway(&text("r2"), &[&b0, &b1]).await;
    let r3 = gateway(&text("r3"), &[&b0, &b1]).await;
    assert!(all_see(&[&r1, &r2, &r3], 3.0).await);
    let (stop, measure_from) = (secs_from_now(6), secs_from_now(1));
    let load = |addr, key| saturate(addr, key, stop, measure_from);
    let tasks: Vec<_> = (0..8)
        .flat_map(|_| [load(r1.addr(), "sk-a"), load(r2.addr(), "sk-b")])
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let slots = async |gw: &Server, replica: &str| {
        let m = get(&client(), format!("http://{}/metrics", gw.admin_addr()))
            .await
            .text();
        metric(
            &m,
            &format!("fairway_cluster_pool_slots{{replica=\"{replica}\",model=\"m\"}}"),
        )
    };
    assert_eq!(slots(&r1, "r1").await, Some(3.0));
    assert_eq!(slots(&r2, "r2").await, Some(1.0));
    let (mut a, mut b) = (0, 0);
    for (i, t) in tasks.into_iter().enumerate() {
        let n = t.await.unwrap();
        if i % 2 == 0 { a += n } else { b += n }
    }
    let ratio = f64::from(a) / f64::from(b.max(1));
    eprintln!("small window, 3:1 over three replicas: a {a}, b {b}, ratio {ratio:.2}");
    assert!((2.7..=3.3).contains(&ratio), "a {a}, b {b}: {ratio:.2}");
}

/// Issue 37, item 3: interactive work queued at one replica takes the
/// slots that young batch work admitted at another holds. One engine that
/// runs 4 sequences at once, a pool of 4 slots; `jobs` (batch, weight 1)
/// fills it at r2 with long requests, then `app` (weight 3) sends 3 short
/// ones at r1: r2 keeps its share (1 slot) and preempts the rest, which
/// run again later. Without it, `app` waited in the engine behind them.
#[tokio::test]
async fn interactive_work_at_one_replica_preempts_young_batch_work_at_another() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let b0 = engine(4, 2).await;
    let text = |replica: &str| {
        format!(
            "{SERVER}\n[cluster]\nstore = \"{}\"\nreplica = \"{replica}\"\nsync_interval = \"100ms\"\n\
             [preemption]\nmin_wait = \"50ms\"\n\
             [[pools]]\nmodel = \"{M}\"\n[[pools.backends]]\nurl = \"http://{{b0}}\"\nmax_inflight = 4\n\
             [[tenants]]\nname = \"jobs\"\napi_keys = [\"sk-jobs\"]\npriority = \"batch\"\n\
             [[tenants]]\nname = \"app\"\napi_keys = [\"sk-app\"]\nweight = 3\n",
            redis.url(),
        )
    };
    let r1 = gateway(&text("r1"), &[&b0]).await;
    let r2 = gateway(&text("r2"), &[&b0]).await;
    assert!(all_see(&[&r1, &r2], 2.0).await);
    let at = |addr: std::net::SocketAddr, key: &'static str, tokens: u32| {
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            let body = chat(M, tokens, false);
            let r = send(
                &client(),
                post(addr, "/v1/chat/completions", Some(key), body),
            )
            .await;
            (r.status, start.elapsed())
        })
    };
    // Four ~4 s requests; r2 takes the pool's slots as its backlog shows.
    let jobs: Vec<_> = (0..4).map(|_| at(r2.addr(), "sk-jobs", 2000)).collect();
    assert!(
        eventually(Duration::from_secs(5), async || b0.stats().running == 4).await,
        "{:?}",
        b0.stats()
    );
    let app: Vec<_> = (0..3).map(|_| at(r1.addr(), "sk-app", 5)).collect();
    for a in app {
        let (status, took) = a.await.unwrap();
        eprintln!("app answered in {took:?}");
        assert_eq!(status, 200);
        assert!(took < Duration::from_secs(2), "app waited {took:?}");
    }
    // Nothing lost: the preempted requests ran again and were served.
    for j in jobs {
        assert_eq!(j.await.unwrap().0, 200);
    }
    let m = scrape(&r2).await;
    let preempted = metric(&m, "fairway_preemptions_total{tenant=\"jobs\"}").unwrap();
    eprintln!("preempted at r2 for r1: {preempted}");
    assert!((1.0..=3.0).contains(&preempted), "{preempted}");
}

#[tokio::test]
async fn closed_mode_refuses_limited_tenants_while_the_store_is_down() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let b = sim(M, 8).await;
    let text = format!(
        "{SERVER}\n[cluster]\nstore = \"{}\"\nreplica = \"c1\"\nsync_interval = \"100ms\"\non_store_failure = \"closed\"\n\
         [[pools]]\nmodel = \"{M}\"\n[[pools.backends]]\nurl = \"http://{}\"\n\
         [[tenants]]\nname = \"a\"\napi_keys = [\"sk-a\"]\nrate = 100.0\n\
         [[tenants]]\nname = \"free\"\napi_keys = [\"sk-free\"]\n",
        redis.url(),
        b.addr()
    );
    let gw = gateway(&text, &[]).await;
    let c = client();
    let status = async |key: &str| ask(&c, gw.addr(), key).await;
    assert_eq!(status("sk-a").await.status, 200);
    redis.kill();
    assert!(
        eventually(Duration::from_secs(5), async || status("sk-a").await.status
            == 503)
        .await
    );
    let r = status("sk-a").await;
    assert_eq!(
        r.json()["error"]["code"],
        "store_unavailable",
        "{}",
        r.text()
    );
    assert!(r.headers.contains_key("retry-after"));
    // A tenant without limits has nothing to hold: still served.
    assert_eq!(status("sk-free").await.status, 200);
    redis.restart();
    assert!(
        eventually(Duration::from_secs(5), async || status("sk-a").await.status
            == 200)
        .await
    );
    let m = get(&client(), format!("http://{}/metrics", gw.admin_addr()))
        .await
        .text();
    assert!(
        metric(&m, "fairway_requests_total{tenant=\"a\",model=\"m\",outcome=\"refused\",reason=\"store_unavailable\"}")
            .is_some_and(|n| n >= 2.0),
        "{m}"
    );
}

/// In flight at the backends (running and waiting), from their metrics.
async fn at_backends(backends: &[std::net::SocketAddr]) -> f64 {
    let mut n = 0.0;
    for b in backends {
        let m = get(&client(), format!("http://{b}/metrics")).await.text();
        n += metric(&m, "vllm:num_requests_running").unwrap_or(0.0)
            + metric(&m, "vllm:num_requests_waiting").unwrap_or(0.0);
    }
    n
}

/// Clients that send `key`'s requests over `addrs` in turn until `stop`;
/// what each got, by status.
fn clients(
    n: usize,
    addrs: Vec<std::net::SocketAddr>,
    key: &'static str,
    max_tokens: u32,
    stop: tokio::time::Instant,
) -> Vec<tokio::task::JoinHandle<(u32, u32)>> {
    (0..n)
        .map(|i| {
            let addrs = addrs.clone();
            tokio::spawn(async move {
                let c = client();
                let (mut ok, mut refused) = (0, 0);
                let mut k = i;
                while tokio::time::Instant::now() < stop {
                    let addr = addrs[k % addrs.len()];
                    k += 1;
                    let r = send(
                        &c,
                        post(
                            addr,
                            "/v1/chat/completions",
                            Some(key),
                            chat(M, max_tokens, false),
                        ),
                    )
                    .await;
                    match r.status.as_u16() {
                        200 => ok += 1,
                        429 => {
                            refused += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        s => panic!("{s} {}", r.text()),
                    }
                }
                (ok, refused)
            })
        })
        .collect()
}

async fn lease_held(admin: std::net::SocketAddr, replica: &str, tenant: &str, limit: &str) -> f64 {
    let m = get(&client(), format!("http://{admin}/metrics"))
        .await
        .text();
    metric(
        &m,
        &format!(
            "fairway_cluster_lease{{replica=\"{replica}\",tenant=\"{tenant}\",limit=\"{limit}\"}}"
        ),
    )
    .unwrap_or(0.0)
}

#[tokio::test]
async fn concurrency_and_gpu_budget_hold_across_replicas_and_a_killed_replica_frees_its_slots() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    // Two backends; a reply of 30 tokens takes about 0.3 s.
    let backends = [engine(64, 10).await, engine(64, 10).await];
    let addrs: Vec<std::net::SocketAddr> = backends.iter().map(|b| b.addr()).collect();
    let text = |replica: &str| {
        format!(
            "{SERVER}\n[cluster]\nstore = \"{}\"\nreplica = \"{replica}\"\nsync_interval = \"100ms\"\nreplica_ttl = \"600ms\"\n\
             [[pools]]\nmodel = \"{M}\"\n[[pools.backends]]\nurl = \"http://{}\"\n[[pools.backends]]\nurl = \"http://{}\"\n\
             [[tenants]]\nname = \"c\"\napi_keys = [\"sk-c\"]\nmax_concurrency = 4\n\
             [[tenants]]\nname = \"g\"\napi_keys = [\"sk-g\"]\ngpu_seconds_per_hour = 3.6\n",
            redis.url(),
            addrs[0],
            addrs[1]
        )
    };
    let r1 = gateway(&text("r1"), &[]).await;
    let r2 = gateway(&text("r2"), &[]).await;
    // The third is a process, to be killed without leaving.
    let path = temp_policy("cluster-r3", &text("r3"));
    let mut r3 = ServeProcess::start(&[], &[], &path, "error", std::process::Stdio::inherit());
    let three = [r1.addr(), r2.addr(), r3.addr];
    assert!(all_see(&[&r1, &r2], 3.0).await);

    // The concurrency cap: 12 clients over the three replicas for 3 s;
    // the backends never have more than 4 of the tenant's requests.
    let stop = tokio::time::Instant::now() + Duration::from_secs(3);
    let load = clients(12, three.to_vec(), "sk-c", 30, stop);
    let mut most = 0.0f64;
    while tokio::time::Instant::now() < stop {
        most = most.max(at_backends(&addrs).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (mut ok, mut refused) = (0, 0);
    for t in load {
        let (o, r) = t.await.unwrap();
        ok += o;
        refused += r;
    }
    eprintln!("concurrency: at most {most} in flight; {ok} served, {refused} refused");
    assert!(most <= 4.0, "{most} in flight for a cap of 4");
    assert!(ok >= 12, "{ok} served");
    assert!(refused > 0);

    // r3 holds slots, and is killed: they return to the others once its
    // membership expires (replica_ttl 600 ms) and they next sync.
    // Long requests at r3 (they fail when it dies).
    let hold: Vec<_> = (0..4)
        .map(|_| {
            let addr = r3.addr;
            tokio::spawn(async move {
                // Until admitted (the others may hold the slots a while).
                loop {
                    let req = post(
                        addr,
                        "/v1/chat/completions",
                        Some("sk-c"),
                        chat(M, 2000, false),
                    );
                    match client().request(req).await {
                        Ok(r) if r.status() == 429 => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        _ => break,
                    }
                }
            })
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(3), async || lease_held(
            r3.admin,
            "r3",
            "c",
            "concurrency"
        )
        .await
            >= 2.0)
        .await,
        "r3 never held two slots"
    );
    r3.child.kill().unwrap();
    r3.child.wait().unwrap();
    let killed = tokio::time::Instant::now();
    let demand = clients(
        6,
        vec![r1.addr()],
        "sk-c",
        30,
        killed + Duration::from_secs(4),
    );
    assert!(
        eventually(Duration::from_secs(4), async || lease_held(
            r1.admin_addr(),
            "r1",
            "c",
            "concurrency"
        )
        .await
            >= 4.0)
        .await,
        "r1 never got the dead replica's slots"
    );
    let freed = killed.elapsed();
    eprintln!("the killed replica's slots were free again after {freed:?}");
    for t in hold {
        t.await.unwrap();
    }
    for t in demand {
        t.await.unwrap();
    }
    assert!(all_see(&[&r1, &r2], 2.0).await);

    // The GPU-seconds budget (3.6 per hour: 3.6 at once, then 0.001/s),
    // charged to the cluster: 6 clients over the two replicas for 4 s.
    let stop = tokio::time::Instant::now() + Duration::from_secs(4);
    let load = clients(6, vec![r1.addr(), r2.addr()], "sk-g", 30, stop);
    let (mut ok, mut refused) = (0, 0);
    for t in load {
        let (o, r) = t.await.unwrap();
        ok += o;
        refused += r;
    }
    let mut charged = 0.0;
    for gw in [&r1, &r2] {
        let m = get(&client(), format!("http://{}/metrics", gw.admin_addr()))
            .await
            .text();
        charged += metric(&m, "fairway_gpu_seconds_total{tenant=\"g\"}").unwrap_or(0.0);
    }
    eprintln!("gpu budget: {charged:.2} GPU-s charged, {ok} served, {refused} refused");
    assert!(refused > 0, "the budget never refused");
    // The bound: the budget, plus what the requests that ended within a
    // sync interval of running dry cost beyond their estimates (at most the
    // 6 in flight, about 0.15 GPU-s each here). Alone, each replica would
    // have charged up to 3.6: 7.2.
    assert!(charged <= 3.6 + 0.01 + 1.5, "{charged:.2} GPU-s charged");
    // Not starved either. The killed replica held an even part of the
    // budget (1.2 GPU-s), which died with it: its room comes back only as
    // the budget refills (0.001/s), so about 2.4 is left to charge.
    assert!(charged >= 2.0, "{charged:.2} GPU-s charged");
}

/// The store's script and the core's [`SharedLimit`] (which the replay
/// and the unit tests run) take the same steps: the same asks from three
/// replicas, in the same order, get the same answers. No refill (rate 0),
/// so the store's clock does not enter.
#[tokio::test]
async fn the_store_script_answers_as_the_core_model_does() {
    use fairway::core::admission::{LeaseAsk, LeaseKind, SharedLimit};
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let policy = fairway::config::ClusterPolicy {
        store: redis.url(),
        password: None,
        replica: None,
        key_prefix: "diff".into(),
        sync_interval: Duration::from_secs(1),
        replica_ttl: Duration::from_secs(30),
        lease_ahead: Duration::from_secs(2),
        on_store_failure: fairway::config::StoreFailure::Local,
    };
    let mut stores: Vec<_> = (0..3)
        .map(|r| fairway::cluster::Store::connect(&policy, &format!("r{r}")).unwrap())
        .collect();
    let mut model: std::collections::HashMap<LeaseKind, SharedLimit> = Default::default();
    // A fixed pseudo-random walk of levels, returns, debts and wants.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for step in 0..300 {
        let r = usize::try_from(next(3)).unwrap();
        let kind = LeaseKind::ALL[usize::try_from(next(3)).unwrap()];
        let level = next(12) as f64
            - if kind == LeaseKind::GpuSeconds {
                3.0
            } else {
                0.0
            };
        let ask = LeaseAsk {
            tenant: "t".into(),
            kind,
            capacity: 20.0,
            rate: 0.0,
            level,
            open: if kind == LeaseKind::GpuSeconds {
                next(4) as f64
            } else {
                0.0
            },
            returned: if kind == LeaseKind::Concurrency {
                0.0
            } else {
                next(3) as f64
            },
            want: next(15) as f64,
        };
        let expected = model
            .entry(kind)
            .or_default()
            .sync(0.0, &format!("r{r}"), &ask);
        let answers = stores[r]
            .sync(&[], std::slice::from_ref(&ask))
            .await
            .unwrap()
            .leases;
        assert_eq!(answers.len(), 1);
        let got = answers[0];
        assert!(
            (got.give - expected.give).abs() < 1e-6 && (got.short - expected.short).abs() < 1e-6,
            "step {step}: {ask:?}: store {got:?}, model {expected:?}"
        );
    }
}

/// A stored Responses API response is found at any replica: created at
/// one, read and deleted at another (the backends keep it; the cluster's
/// store says which backend), never by another tenant.
#[tokio::test]
async fn a_stored_response_is_found_at_every_replica() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let mut backends = Vec::new();
    for _ in 0..2 {
        backends.push(
            fairway::sim::backend::SimBackend::builder(M)
                .start()
                .await
                .unwrap(),
        );
    }
    let text = |replica: &str| {
        format!(
            "{SERVER}\n[cluster]\nstore = \"{}\"\nreplica = \"{replica}\"\nsync_interval = \"100ms\"\nreplica_ttl = \"600ms\"\n\
             [[pools]]\nmodel = \"{M}\"\n[[pools.backends]]\nurl = \"http://{}\"\n[[pools.backends]]\nurl = \"http://{}\"\n\
             [[tenants]]\nname = \"a\"\napi_keys = [\"{KEY}\"]\n[[tenants]]\nname = \"b\"\napi_keys = [\"sk-b\"]\n",
            redis.url(),
            backends[0].addr(),
            backends[1].addr()
        )
    };
    let r1 = gateway(&text("r1"), &[]).await;
    let r2 = gateway(&text("r2"), &[]).await;
    let c = client();
    let body = format!(r#"{{"model":"{M}","input":"Hello","max_output_tokens":3}}"#);
    let r = send(&c, post(r1.addr(), "/v1/responses", Some(KEY), body)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let call = |method: http::Method, gw: &Server, key: &str| {
        http::Request::builder()
            .method(method)
            .uri(format!("http://{}/v1/responses/{id}", gw.addr()))
            .header("authorization", format!("Bearer {key}"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    // The other replica learns of it through the store (in the background).
    assert!(
        eventually(Duration::from_secs(5), async || {
            send(&c, call(http::Method::GET, &r2, KEY)).await.status == 200
        })
        .await,
        "replica 2 never found {id}"
    );
    let r = send(&c, call(http::Method::GET, &r2, KEY)).await;
    assert_eq!(r.json()["id"], id.as_str());
    let r = send(&c, call(http::Method::GET, &r2, "sk-b")).await;
    assert_eq!(r.status, 404, "another tenant's: {}", r.text());
    let r = send(&c, call(http::Method::DELETE, &r2, KEY)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["deleted"], true);
    // Deleted on its backend: gone at the first replica too.
    let r = send(&c, call(http::Method::GET, &r1, KEY)).await;
    assert_eq!(r.status, 404, "{}", r.text());
}

/// The tenant usage API answers the same at every replica: the cluster's
/// windows (every replica's published buckets added to its own), with
/// the replicas behind them; the operator can still ask one replica for
/// its own (`?scope=replica`).
#[tokio::test]
async fn every_replica_answers_the_usage_api_for_the_cluster() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let b = sim(M, 64).await;
    let dir = std::env::temp_dir().join(format!("fairway-cluster-usage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("admin-token");
    std::fs::write(&token, "operator-token").unwrap();
    let text = |replica: &str| {
        policy(&redis.url(), replica, b.addr(), "rate = 100.0").replace(
            "drain_timeout = \"5s\"\n",
            &format!(
                "drain_timeout = \"5s\"\nadmin_token_file = \"{}\"\n",
                token.display()
            ),
        )
    };
    let (r1, r2, r3) = (
        gateway(&text("r1"), &[]).await,
        gateway(&text("r2"), &[]).await,
        gateway(&text("r3"), &[]).await,
    );
    assert!(all_see(&[&r1, &r2, &r3], 3.0).await);
    let c = client();
    // (A replica's first request waits for its first lease: refused
    // ones are asked again, and counted as refused, not as requests.)
    for (gw, n) in [(&r1, 5), (&r2, 3), (&r3, 1)] {
        for _ in 0..n {
            assert!(
                eventually(Duration::from_secs(3), async || ask(&c, gw.addr(), KEY)
                    .await
                    .status
                    == 200)
                .await
            );
        }
    }
    let usage = async |gw: &Server, path: &str, auth: &str| -> serde_json::Value {
        let req = http::Request::get(format!("http://{}{path}", gw.addr()))
            .header("authorization", format!("Bearer {auth}"))
            .body(http_body_util::Full::default())
            .unwrap();
        send(&client(), req).await.json()
    };
    // Within a sync interval or two, every replica shows all 9.
    let same = eventually(Duration::from_secs(5), async || {
        for gw in [&r1, &r2, &r3] {
            let u = usage(gw, "/fairway/usage", KEY).await;
            if u["windows"]["1h"]["served"] != 9
                || u["windows"]["5m"]["ttft_seconds"]["samples"] != 9
            {
                return false;
            }
        }
        true
    })
    .await;
    let u = usage(&r2, "/fairway/usage", KEY).await;
    assert!(same, "{u}");
    assert_eq!(u["scope"], "cluster", "{u}");
    assert_eq!(u["replicas"], 3, "{u}");
    assert_eq!(u["cluster_replicas"], 3, "{u}");
    assert_eq!(
        u["minutes"]
            .as_array()
            .map(|m| m.iter().map(|p| p["served"].as_u64().unwrap()).sum::<u64>()),
        Some(9),
        "{u}"
    );
    // What the tenant may still send is the cluster's: the replicas'
    // leases and what the store holds beside them (100 when idle), where
    // one replica holds only its lease.
    let available = |u: &serde_json::Value| u["limits"]["rate"]["available"].as_f64().unwrap();
    assert!(
        eventually(Duration::from_secs(3), async || {
            available(&usage(&r2, "/fairway/usage", KEY).await) > 99.0
        })
        .await,
        "{}",
        usage(&r2, "/fairway/usage", KEY).await
    );
    let one = usage(&r2, "/fairway/usage/a?scope=replica", "operator-token").await;
    assert!(available(&one) < 50.0, "{one}");
    // The operator's view is the cluster's too (once a read of the store
    // answered in time: a loaded machine may answer one with this
    // replica's numbers, saying so); one replica's on request.
    let cluster_view = eventually(Duration::from_secs(5), async || {
        let all = usage(&r3, "/fairway/usage", "operator-token").await;
        all["tenants"][0]["windows"]["1h"]["served"] == 9
    });
    assert!(cluster_view.await);
    let all = usage(&r3, "/fairway/usage", "operator-token").await;
    assert_eq!(all["tenants"][0]["windows"]["1h"]["served"], 9, "{all}");
    assert_eq!(all["scope"], "cluster", "{all}");
    let own = usage(&r1, "/fairway/usage/a?scope=replica", "operator-token").await;
    assert_eq!(own["windows"]["1h"]["served"], 5, "{own}");
    assert_eq!(own["scope"], "replica", "{own}");
    // A tenant's key cannot narrow it: the query is ignored.
    let t = usage(&r1, "/fairway/usage?scope=replica", KEY).await;
    assert_eq!(t["windows"]["1h"]["served"], 9, "{t}");
    // The store gone, a replica answers with its own numbers and says so.
    drop(redis);
    let alone = usage(&r1, "/fairway/usage", KEY).await;
    assert_eq!(alone["scope"], "replica", "{alone}");
    assert_eq!(alone["windows"]["1h"]["served"], 5, "{alone}");
    assert!(alone["cluster_error"].is_string(), "{alone}");
}

/// Commands the store ran since start (`INFO commandstats`, every
/// command a script runs counted too).
async fn store_commands(redis: &str) -> u64 {
    let mut con = redis::Client::open(redis)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut con)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            l.split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The store's commands per second over `secs` with `replicas` gateways
/// of `tenants` tenants (each with a rate limit, a GPU-seconds budget and
/// a concurrency cap, all leased), idle, then with `active` of them each
/// sending a request every 100 ms at one replica.
async fn store_traffic(replicas: usize, tenants: usize, active: usize, secs: f64) -> (f64, f64) {
    let redis = RedisServer::start();
    let b = engine(64, 1).await;
    let mut limits = String::new();
    for i in 0..tenants {
        limits.push_str(&format!(
            "[[tenants]]\nname = \"t{i}\"\napi_keys = [\"k{i}\"]\nrate = 50.0\nburst = 10\n\
             max_concurrency = 8\ngpu_seconds_per_hour = 3600.0\n"
        ));
    }
    let mut gws = Vec::new();
    for r in 0..replicas {
        let text = format!(
            "{SERVER}\n[cluster]\nstore = \"{}\"\nreplica = \"r{r}\"\n\
             [[pools]]\nmodel = \"{M}\"\n[[pools.backends]]\nurl = \"http://{}\"\nmax_inflight = 64\n{limits}",
            redis.url(),
            b.addr()
        );
        gws.push(gateway(&text, &[]).await);
    }
    // Settled: every replica has joined and its leases have found their
    // even parts (a few syncs after the last joined).
    tokio::time::sleep(Duration::from_secs(8)).await;
    let rate = async |during: f64| {
        let before = store_commands(&redis.url()).await;
        tokio::time::sleep(Duration::from_secs_f64(during)).await;
        (store_commands(&redis.url()).await - before) as f64 / during
    };
    let idle = rate(secs).await;
    let addr = gws[0].addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..active)
        .map(|i| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let c = client();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Served or refused: either is an admission.
                    ask(&c, addr, &format!("k{i}")).await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let busy = rate(secs).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    (idle, busy)
}

/// Issue 48: what the store does for idle tenants. With 500 tenants
/// each holding three leased limits, an idle replica sends the store a
/// few commands a second, not thousands (it sent 4–8 per tenant per
/// second); with ten tenants active, the traffic follows them. With
/// FAIRWAY_STORE_TRAFFIC=1 it prints the table of docs/cluster.md
/// (1, 3 and 10 replicas × 50 and 5,000 tenants, idle and ten active);
/// FAIRWAY_STORE_CASE=replicas,tenants measures one case instead of
/// 1 × 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tenant_costs_the_store_nothing_between_keepalives() {
    let _serial = SERIAL.lock().await;
    if std::env::var_os("FAIRWAY_STORE_TRAFFIC").is_some() {
        for replicas in [1, 3, 10] {
            for tenants in [50, 5000] {
                let (idle, busy) = store_traffic(replicas, tenants, 10, 10.0).await;
                eprintln!("| {replicas} | {tenants} | {idle:.0} | {busy:.0} |");
            }
        }
    }
    let (replicas, tenants) = std::env::var("FAIRWAY_STORE_CASE")
        .ok()
        .and_then(|c| {
            let (r, t) = c.split_once(',')?;
            Some((r.parse().ok()?, t.parse().ok()?))
        })
        .unwrap_or((1, 500));
    let (idle, busy) = store_traffic(replicas, tenants, 10, 4.0).await;
    eprintln!(
        "{replicas} replicas, {tenants} tenants: {idle:.0} commands/s idle, {busy:.0} with 10 active"
    );
    assert!(idle < 60.0, "{idle} commands a second for 500 idle tenants");
    assert!(busy > idle, "{busy} busy against {idle} idle");
    assert!(
        busy < 1000.0,
        "{busy} commands a second for 10 active tenants"
    );
}

/// Prefix-aware routing over replicas that each route on their own
/// history (no KV events): the replicas share where each prefix lives
/// through the store, so a prefix placed at one replica goes to the same
/// engine from every other, and finds its blocks cached there.
#[tokio::test]
async fn replicas_send_each_prefix_to_the_engine_one_of_them_placed_it_on() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let mut engines = Vec::new();
    for _ in 0..2 {
        engines.push(
            fairway::sim::backend::SimBackend::builder(M)
                .max_num_seqs(16)
                .kv_tokens(64 * 1024)
                .decode_step(Duration::from_millis(2), Duration::ZERO)
                .start()
                .await
                .unwrap(),
        );
    }
    let text = |replica: &str| {
        format!(
            "{SERVER}\n[cluster]\nstore = \"{}\"\nreplica = \"{replica}\"\nsync_interval = \"100ms\"\nreplica_ttl = \"600ms\"\n\
             [[pools]]\nmodel = \"{M}\"\nrouting = \"prefix_aware\"\nprefix_block_tokens = 16\n\
             [[pools.backends]]\nname = \"e0\"\nurl = \"http://{}\"\n[[pools.backends]]\nname = \"e1\"\nurl = \"http://{}\"\n\
             [[tenants]]\nname = \"a\"\napi_keys = [\"{KEY}\"]\nprefix_cache = \"shared\"\n",
            redis.url(),
            engines[0].addr(),
            engines[1].addr()
        )
    };
    let gws = [
        gateway(&text("r1"), &[]).await,
        gateway(&text("r2"), &[]).await,
        gateway(&text("r3"), &[]).await,
    ];
    let c = client();
    // Prompts of about 600 tokens, distinct per `n`.
    let chat = |n: u32, q: &str| {
        let system = format!("You are assistant number {n}. ").repeat(80);
        format!(
            r#"{{"model":"{M}","max_tokens":2,"messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{q}"}}]}}"#
        )
    };
    let cached = async |gw: &Server, body: String| {
        let r = send(&c, post(gw.addr(), "/v1/chat/completions", Some(KEY), body)).await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    // Eight prefixes, each first sent to replica 1.
    for n in 0..8 {
        assert_eq!(cached(&gws[0], chat(n, "first")).await, 0);
    }
    let homes = async |gw: &Server, replica: &str, way: &str| {
        let m = scrape(gw).await;
        metric(
            &m,
            &format!("fairway_cluster_prefix_homes_total{{replica=\"{replica}\",way=\"{way}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert!(
        eventually(Duration::from_secs(5), async || {
            homes(&gws[1], "r2", "learned").await >= 8.0
                && homes(&gws[2], "r3", "learned").await >= 8.0
        })
        .await,
        "the other replicas never learned the homes"
    );
    assert_eq!(homes(&gws[0], "r1", "published").await, 8.0);
    // The others send each prefix where replica 1 placed it (in another
    // order than replica 1 saw them, which placed by its own history
    // would give some another engine): every request finds its prefix.
    for (i, gw) in gws[1..].iter().enumerate() {
        for n in (0..8).rev() {
            let got = cached(gw, chat(n, &format!("from {i}"))).await;
            assert!(got > 500, "prefix {n} at replica {}: {got} cached", i + 2);
        }
    }
    assert_eq!(homes(&gws[1], "r2", "published").await, 0.0);
    assert_eq!(homes(&gws[0], "r1", "moved").await, 0.0);
    let m = scrape(&gws[1]).await;
    promtool_check(&m);
}
