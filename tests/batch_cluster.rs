//! Batches with the shared store (docs/batch.md, "Several replicas"): two
//! real `fairway serve` replicas sharing a real `redis-server` and a real
//! S3-compatible server (moto's). A file uploaded at one replica and a
//! batch created there are seen at the other; a cancel at the replica
//! that does not run a batch cancels it; the replica running a batch is
//! killed with SIGKILL mid-batch and the other finishes it, every item in
//! the output exactly once; three replicas share one batch's items, and
//! one killed mid-batch costs only its items in flight.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::json;
use support::batch::*;
use support::*;

const BUCKET: &str = "fairway-batches";

fn policy(
    redis: &str,
    s3: &str,
    replica: &str,
    dir: &std::path::Path,
    backends: [String; 2],
) -> String {
    format!(
        r#"{SERVER}
[cluster]
store = "{redis}"
replica = "{replica}"
sync_interval = "100ms"
replica_ttl = "1s"

[batch]
data_dir = "{}"
object_store = "s3://{BUCKET}/shared"
object_store_endpoint = "{s3}"

[[pools]]
model = "m"
backends = [{{ name = "b0", url = "http://{}" }}, {{ name = "b1", url = "http://{}" }}]

[[tenants]]
name = "api"
api_keys = ["ka"]

[[tenants]]
name = "evals"
api_keys = ["ke"]
"#,
        dir.join(replica).display(),
        backends[0],
        backends[1],
    )
}

/// A replica `replica` of the cluster on `redis` and `s3`, its files in
/// `dir`, in front of `backends`; the object store's credentials and
/// region in its environment, as an operator sets them.
fn serve(
    redis: &RedisServer,
    s3: &S3Server,
    dir: &std::path::Path,
    replica: &str,
    backends: [&fairway::sim::backend::SimHandle; 2],
) -> ServeProcess {
    let path = dir.join(format!("{replica}.toml"));
    let backends = backends.map(|b| b.addr().to_string());
    std::fs::write(
        &path,
        policy(&redis.url(), &s3.url(), replica, dir, backends),
    )
    .unwrap();
    let env = [
        "env",
        "AWS_ACCESS_KEY_ID=test",
        "AWS_SECRET_ACCESS_KEY=test",
        "AWS_REGION=us-east-1",
    ];
    ServeProcess::start(&env, &[], &path, "warn", std::process::Stdio::null())
}

/// Requests of tenant `evals` (batch items) replica `admin` served.
async fn served(admin: std::net::SocketAddr) -> f64 {
    let m = get(&client(), format!("http://{admin}/metrics"))
        .await
        .text();
    metric_sum(
        &m,
        "fairway_requests_total{tenant=\"evals\",model=\"m\",outcome=\"served\"",
    )
}

/// The replica holding batch `id`'s lease, read from the store.
async fn runner_of(redis: &str, id: &str) -> Option<String> {
    let mut con = redis::Client::open(redis)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("GET")
        .arg(format!("{{fairway:batch}}:lease:{id}"))
        .query_async(&mut con)
        .await
        .unwrap()
}

#[test]
fn a_replica_dies_mid_batch_and_the_other_finishes_it() {
    let Some(s3) = S3Server::start() else {
        return;
    };
    s3.bucket(BUCKET);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (b0, b1) = rt.block_on(slow_pair());
    let serve = |replica: &str| serve(&redis, &s3, dir.path(), replica, [&b0, &b1]);
    let mut replicas = [Some(serve("r1")), Some(serve("r2"))];
    let addrs: Vec<std::net::SocketAddr> =
        replicas.iter().map(|r| r.as_ref().unwrap().addr).collect();
    let admins: Vec<std::net::SocketAddr> =
        replicas.iter().map(|r| r.as_ref().unwrap().admin).collect();

    let (id, doomed, before) = rt.block_on(async {
        // Uploaded at r1, seen and read back at r2.
        let f = upload(addrs[0], "ke", "batch", &input(200, "m", 24)).await;
        assert_eq!(f.status, StatusCode::OK, "{}", f.text());
        let file = f.json()["id"].as_str().unwrap().to_owned();
        let got = call(
            Method::GET,
            addrs[1],
            &format!("/v1/files/{file}/content"),
            "ke",
        )
        .await;
        assert_eq!(got.status, StatusCode::OK, "{}", got.text());
        assert_eq!(got.text(), input(200, "m", 24));
        // Another tenant sees nothing of it at either replica.
        for a in &addrs {
            let r = call(Method::GET, *a, &format!("/v1/files/{file}"), "ka").await;
            assert_eq!(r.status, StatusCode::NOT_FOUND);
        }

        // A batch cancelled at the replica that does not run it.
        let c = create(addrs[0], "ke", &file).await;
        assert_eq!(c.status, StatusCode::OK, "{}", c.text());
        let cancelled = c.json()["id"].as_str().unwrap().to_owned();
        let mut runner = None;
        assert!(
            eventually(Duration::from_secs(10), async || {
                runner = runner_of(&redis.url(), &cancelled).await;
                runner.is_some()
            })
            .await
        );
        let other = if runner.as_deref() == Some("r1") {
            1
        } else {
            0
        };
        let r = call(
            Method::POST,
            addrs[other],
            &format!("/v1/batches/{cancelled}/cancel"),
            "ke",
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let b = ended(addrs[other], "ke", &cancelled, Duration::from_secs(20)).await;
        assert_eq!(b["status"], "cancelled", "{b}");
        let c = &b["request_counts"];
        assert_eq!(c["total"], 200);
        assert_eq!(
            c["completed"].as_u64().unwrap() + c["failed"].as_u64().unwrap(),
            200,
            "{b}"
        );

        // The batch whose replica dies.
        let c = create(addrs[1], "ke", &file).await;
        assert_eq!(c.status, StatusCode::OK, "{}", c.text());
        let id = c.json()["id"].as_str().unwrap().to_owned();
        let start = tokio::time::Instant::now();
        while batch(addrs[0], "ke", &id).await["request_counts"]["completed"]
            .as_u64()
            .unwrap()
            < 30
        {
            assert!(start.elapsed() < Duration::from_secs(30), "no progress");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let runner = runner_of(&redis.url(), &id).await.unwrap();
        let doomed = usize::from(runner == "r2");
        (id, doomed, served(admins[1 - doomed]).await)
    });
    replicas[doomed] = None; // SIGKILL
    let survivor = addrs[1 - doomed];
    rt.block_on(async {
        let b = batch(survivor, "ke", &id).await;
        assert_eq!(b["status"], "in_progress", "killed after it ended: {b}");
        let done_at_kill = b["request_counts"]["completed"].as_f64().unwrap();
        let b = ended(survivor, "ke", &id, Duration::from_secs(90)).await;
        assert_eq!(b["status"], "completed", "{b}");
        assert_eq!(
            b["request_counts"],
            json!({"total": 200, "completed": 200, "failed": 0})
        );
        let out = lines(survivor, "ke", b["output_file_id"].as_str().unwrap()).await;
        assert_eq!(out.len(), 200);
        assert!((0..200).all(|i| out.contains_key(&format!("q{i}"))));
        // The survivor ran what the dead replica had not finished.
        assert!(
            served(admins[1 - doomed]).await - before >= 200.0 - done_at_kill,
            "the survivor served {} items of the batch",
            served(admins[1 - doomed]).await - before
        );
        assert_eq!(
            runner_of(&redis.url(), &id).await,
            None,
            "an ended batch keeps no lease"
        );
    });
    // The dead replica, started again, reads the same output.
    let back = serve(if doomed == 0 { "r1" } else { "r2" });
    rt.block_on(async {
        let b = batch(back.addr, "ke", &id).await;
        let out = lines(back.addr, "ke", b["output_file_id"].as_str().unwrap()).await;
        assert_eq!(out.len(), 200);
    });
    // A result the store loses after the runner counted it (as a primary
    // that fails over before replicating its last writes does; here one
    // result and its count are deleted from under the runner): the item
    // runs again before the batch completes, and is in the output once.
    rt.block_on(async {
        let f = upload(back.addr, "ke", "batch", &input(60, "m", 24)).await;
        let file = f.json()["id"].as_str().unwrap().to_owned();
        let c = create(back.addr, "ke", &file).await;
        assert_eq!(c.status, StatusCode::OK, "{}", c.text());
        let id = c.json()["id"].as_str().unwrap().to_owned();
        let mut con = redis::Client::open(redis.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let results = format!("{{fairway:batch}}:results:{id}");
        let mut lost = None;
        let start = tokio::time::Instant::now();
        while lost.is_none() {
            assert!(start.elapsed() < Duration::from_secs(30), "no progress");
            let lines: Vec<String> = redis::cmd("HKEYS")
                .arg(&results)
                .query_async(&mut con)
                .await
                .unwrap();
            if lines.len() >= 10 {
                lost = Some(lines[0].clone());
            } else {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let line = lost.unwrap();
        let _: () = redis::pipe()
            .hdel(&results, &line)
            .hincr(format!("{{fairway:batch}}:counts:{id}"), "completed", -1)
            .query_async(&mut con)
            .await
            .unwrap();
        let b = ended(back.addr, "ke", &id, Duration::from_secs(60)).await;
        assert_eq!(b["status"], "completed", "{b}");
        assert_eq!(
            b["request_counts"],
            json!({"total": 60, "completed": 60, "failed": 0}),
            "{b}"
        );
        let out = lines(back.addr, "ke", b["output_file_id"].as_str().unwrap()).await;
        assert_eq!(out.len(), 60, "line {line} lost");
        assert!((0..60).all(|i| out.contains_key(&format!("q{i}"))));
    });
    // The store full mid-batch (Redis refuses writes past its
    // `maxmemory`): the runner sends nothing new and holds the results it
    // could not write; once the store has room again the batch completes,
    // each item once, the engines sent no item twice.
    rt.block_on(async {
        let sent = || b0.stats().submitted_total + b1.stats().submitted_total;
        let n = 120;
        let f = upload(back.addr, "ke", "batch", &input(n, "m", 24)).await;
        let file = f.json()["id"].as_str().unwrap().to_owned();
        let c = create(back.addr, "ke", &file).await;
        assert_eq!(c.status, StatusCode::OK, "{}", c.text());
        let id = c.json()["id"].as_str().unwrap().to_owned();
        let before = sent();
        let start = tokio::time::Instant::now();
        while batch(back.addr, "ke", &id).await["request_counts"]["completed"]
            .as_u64()
            .unwrap()
            < 10
        {
            assert!(start.elapsed() < Duration::from_secs(30), "no progress");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut con = redis::Client::open(redis.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let maxmemory = async |con: &mut redis::aio::MultiplexedConnection, v: &str| {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory")
                .arg(v)
                .query_async(con)
                .await
                .unwrap();
        };
        maxmemory(&mut con, "1").await;
        let metrics = async || {
            get(&client(), format!("http://{}/metrics", back.admin))
                .await
                .text()
        };
        assert!(
            eventually(Duration::from_secs(20), async || {
                metric(&metrics().await, "fairway_batch_store_up ") == Some(0.0)
            })
            .await,
            "the store never failed"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let stalled = sent();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(sent(), stalled, "items were sent while the store failed");
        maxmemory(&mut con, "0").await;
        let b = ended(back.addr, "ke", &id, Duration::from_secs(60)).await;
        assert_eq!(b["status"], "completed", "{b}");
        assert_eq!(
            b["request_counts"],
            json!({"total": n, "completed": n, "failed": 0}),
            "{b}"
        );
        let out = lines(back.addr, "ke", b["output_file_id"].as_str().unwrap()).await;
        assert_eq!(out.len(), n);
        let m = metrics().await;
        assert_eq!(metric(&m, "fairway_batch_store_up "), Some(1.0));
        let retried = 0.0
            + metric_sum(&m, "fairway_batch_items_retried_total")
            + metric_sum(&m, "fairway_batch_items_restarted_total")
            + metric_sum(&m, "fairway_batch_items_resumed_total");
        let engine = sent() - before;
        eprintln!(
            "store full: {engine} engine requests for {n} items, {retried} retries since start"
        );
        assert!(engine as f64 <= n as f64 + retried, "{engine} sent");
    });
    // The object store down: an upload is refused with the reason, and no
    // record names bytes that were never stored.
    drop(s3);
    rt.block_on(async {
        let files = || async {
            call(Method::GET, back.addr, "/v1/files", "ke").await.json()["data"]
                .as_array()
                .unwrap()
                .len()
        };
        let kept = files().await;
        let r = upload(back.addr, "ke", "batch", &input(3, "m", 24)).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text());
        assert!(r.text().contains("object store"), "{}", r.text());
        assert_eq!(files().await, kept);
    });
}

/// Three replicas share one batch's items (a lease per item,
/// `Store::take_items`): each runs part of them, the batch runs about as
/// fast as one replica alone runs it (before, the replica holding the
/// batch ran every item within its third of each backend's window), and
/// a replica killed mid-batch costs at most its items in flight, which
/// the others run.
#[test]
fn three_replicas_share_a_batch_and_a_dead_one_costs_only_its_items_in_flight() {
    let Some(s3) = S3Server::start() else {
        return;
    };
    s3.bucket(BUCKET);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (b0, b1) = rt.block_on(slow_pair());
    let serve = |replica: &str| serve(&redis, &s3, dir.path(), replica, [&b0, &b1]);
    let n = 900;
    // Runs a batch of `n` at `addr`: its id, and seconds from its
    // creation to its end.
    let run = async |addr: std::net::SocketAddr| {
        let f = upload(addr, "ke", "batch", &input(n, "m", 24)).await;
        let t0 = tokio::time::Instant::now();
        assert_eq!(f.status, StatusCode::OK, "{}", f.text());
        let c = create(addr, "ke", f.json()["id"].as_str().unwrap()).await;
        assert_eq!(c.status, StatusCode::OK, "{}", c.text());
        let id = c.json()["id"].as_str().unwrap().to_owned();
        let b = ended(addr, "ke", &id, Duration::from_secs(90)).await;
        assert_eq!(b["status"], "completed", "{b}");
        (id, t0.elapsed().as_secs_f64())
    };

    // One replica alone: the whole of each backend's window.
    let alone = serve("r1");
    let (_, one) = rt.block_on(run(alone.addr));
    let mut replicas = [Some(alone), Some(serve("r2")), Some(serve("r3"))];
    let addrs: Vec<_> = replicas.iter().map(|r| r.as_ref().unwrap().addr).collect();
    let admins: Vec<_> = replicas.iter().map(|r| r.as_ref().unwrap().admin).collect();
    let (three, counts) = rt.block_on(async {
        // The three see each other (each holds a third of the windows).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before: Vec<f64> =
            futures_util::future::join_all(admins.iter().map(|a| served(*a))).await;
        let (_, three) = run(addrs[0]).await;
        let after: Vec<f64> =
            futures_util::future::join_all(admins.iter().map(|a| served(*a))).await;
        let counts: Vec<f64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        (three, counts)
    });
    eprintln!("a batch of {n}: one replica {one:.1} s; three {three:.1} s, items each {counts:?}");
    assert_eq!(counts.iter().sum::<f64>(), n as f64, "{counts:?}");
    for c in &counts {
        // Without the items' leases the two that did not take the batch
        // ran none or one; how many each runs follows how fast the cluster
        // moves slots to their backlogs (the one where the batch was
        // created starts first: about 515, 195 and 190 of 900).
        assert!(
            *c >= n as f64 / 20.0,
            "a replica ran few of the items: {counts:?}"
        );
    }

    // A replica killed mid-batch: the others run its items.
    let sent = || b0.stats().submitted_total + b1.stats().submitted_total;
    let (id, engine_before) = rt.block_on(async {
        let f = upload(addrs[1], "ke", "batch", &input(n, "m", 24)).await;
        let c = create(addrs[1], "ke", f.json()["id"].as_str().unwrap()).await;
        assert_eq!(c.status, StatusCode::OK, "{}", c.text());
        let id = c.json()["id"].as_str().unwrap().to_owned();
        let start = tokio::time::Instant::now();
        while batch(addrs[1], "ke", &id).await["request_counts"]["completed"]
            .as_u64()
            .unwrap()
            < 60
        {
            assert!(start.elapsed() < Duration::from_secs(30), "no progress");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (id, sent())
    });
    // Not the batch's lease holder: a replica that runs only items.
    let holder = rt.block_on(runner_of(&redis.url(), &id)).unwrap();
    let doomed = ["r1", "r2", "r3"]
        .iter()
        .position(|r| *r != holder)
        .unwrap();
    replicas[doomed] = None; // SIGKILL
    let survivor = addrs[(doomed + 1) % 3];
    rt.block_on(async {
        let b = ended(survivor, "ke", &id, Duration::from_secs(90)).await;
        assert_eq!(b["status"], "completed", "{b}");
        assert_eq!(
            b["request_counts"],
            json!({"total": n, "completed": n, "failed": 0})
        );
        let out = lines(survivor, "ke", b["output_file_id"].as_str().unwrap()).await;
        assert_eq!(out.len(), n);
        assert!((0..n).all(|i| out.contains_key(&format!("q{i}"))));
    });
    // Every item sent once, but those in flight at the dead replica (at
    // most a third of the 16 slots, and what was on its way).
    let again = sent() - engine_before;
    let done_before = 60;
    eprintln!("after the kill: {again} engine requests");
    assert!(
        again as usize <= n - done_before + 16,
        "{again} engine requests after the kill"
    );
}
