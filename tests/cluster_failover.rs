//! The cluster's store failing under load: stalled (`DEBUG SLEEP`, a store
//! that answers late) and, with Sentinel, its primary killed and a replica
//! promoted. Three real gateways, a real `redis-server` (and real Sentinel
//! processes), simulated backends; a rate-limited tenant's requests sent
//! round-robin over the replicas throughout, every answer recorded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use fairway::edge::server::Server;
use support::*;

const M: &str = "m";
const KEY: &str = "sk-failover";
/// The tests here measure rates on two cores: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn policy(store: &str, replica: &str, backend: std::net::SocketAddr) -> String {
    format!(
        "{SERVER}\n[cluster]\n{store}\nreplica = \"{replica}\"\nsync_interval = \"100ms\"\n\
         [[pools]]\nmodel = \"{M}\"\n[[pools.backends]]\nurl = \"http://{backend}\"\n\
         [[tenants]]\nname = \"a\"\napi_keys = [\"{KEY}\"]\nrate = 20.0\nburst = 20\n"
    )
}

async fn all_see(gws: &[&Server], n: f64) -> bool {
    eventually(Duration::from_secs(10), async || {
        for gw in gws {
            let m = scrape_admin(gw).await;
            if metric(&m, "fairway_cluster_replicas{") != Some(n)
                || metric(&m, "fairway_cluster_store_up{") != Some(1.0)
            {
                return false;
            }
        }
        true
    })
    .await
}

/// Three replicas on `store`, every one counting the three.
async fn three(store: &str, backend: std::net::SocketAddr) -> [Server; 3] {
    let r1 = gateway(&policy(store, "r1", backend), &[]).await;
    let r2 = gateway(&policy(store, "r2", backend), &[]).await;
    let r3 = gateway(&policy(store, "r3", backend), &[]).await;
    assert!(all_see(&[&r1, &r2, &r3], 3.0).await, "membership not seen");
    [r1, r2, r3]
}

async fn scrape_admin(gw: &Server) -> String {
    get(&client(), format!("http://{}/metrics", gw.admin_addr()))
        .await
        .text()
}

/// Every answer the clients got: when (since `t0`), and whether served.
type Answers = Vec<(f64, bool)>;

/// `n` clients sending over `addrs` in turn until `stop`. Every request is
/// answered 200 or 429 (anything else fails the test: none is lost).
fn load(
    n: usize,
    addrs: Vec<std::net::SocketAddr>,
    t0: tokio::time::Instant,
    stop: tokio::time::Instant,
) -> Vec<tokio::task::JoinHandle<Answers>> {
    (0..n)
        .map(|i| {
            let addrs = addrs.clone();
            tokio::spawn(async move {
                let c = client();
                let mut seen = Vec::new();
                let mut k = i;
                while tokio::time::Instant::now() < stop {
                    let addr = addrs[k % addrs.len()];
                    k += 1;
                    let r = send(
                        &c,
                        post(addr, "/v1/chat/completions", Some(KEY), chat(M, 2, false)),
                    )
                    .await;
                    let at = t0.elapsed().as_secs_f64();
                    match r.status.as_u16() {
                        200 => seen.push((at, true)),
                        429 => {
                            seen.push((at, false));
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        s => panic!("{s} {}", r.text()),
                    }
                }
                seen
            })
        })
        .collect()
}

async fn answers(tasks: Vec<tokio::task::JoinHandle<Answers>>) -> Answers {
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

/// Served in `[from, to)`.
fn served(all: &Answers, from: f64, to: f64) -> usize {
    all.iter()
        .filter(|(at, ok)| *ok && (from..to).contains(at))
        .count()
}

/// The most served in any span of `secs` (sliding by 0.1 s) within
/// `[from, to)`.
fn most_served(all: &Answers, from: f64, to: f64, secs: f64) -> usize {
    let mut most = 0;
    let mut t = from;
    while t + secs <= to + 1e-9 {
        most = most.max(served(all, t, t + secs));
        t += 0.1;
    }
    most
}

/// A store that answers late holds the limits as a store that does not
/// answer does: Redis stalled for 6 s by `DEBUG SLEEP` under load. Each
/// sync then times out after `sync_interval`, the replicas enforce their
/// shares locally, and the cluster serves at most `burst + rate × T` in
/// any span (here 20 + 20/s).
#[tokio::test]
async fn a_stalled_store_holds_the_rate_as_a_dead_one_does() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let b = sim(M, 64).await;
    let store = format!("store = \"{}\"", redis.url());
    let [r1, r2, r3] = three(&store, b.addr()).await;
    let t0 = tokio::time::Instant::now();
    let stop = t0 + Duration::from_secs(11);
    let tasks = load(6, vec![r1.addr(), r2.addr(), r3.addr()], t0, stop);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new().set_response_timeout(None),
        )
        .await
        .unwrap();
    let stalled = t0.elapsed().as_secs_f64();
    let _: () = redis::cmd("DEBUG")
        .arg("SLEEP")
        .arg(6)
        .query_async(&mut con)
        .await
        .unwrap();
    let woke = t0.elapsed().as_secs_f64();
    let all = answers(tasks).await;
    let before = most_served(&all, 0.5, stalled, 1.0);
    let during = served(&all, stalled, woke);
    let after = most_served(&all, woke, 11.0, 1.0);
    let worst = most_served(&all, 0.0, 11.0, 1.0);
    let per_half: Vec<usize> = (0..18)
        .map(|i| served(&all, f64::from(i) * 0.5, f64::from(i + 1) * 0.5))
        .collect();
    eprintln!("served per half second: {per_half:?}");
    eprintln!(
        "stalled {stalled:.2}-{woke:.2} s: served {during} ({:.1}/s); most in a second: before {before}, after {after}, anywhere {worst}; {} answers",
        during as f64 / (woke - stalled),
        all.len()
    );
    // In any span of T: at most burst + rate × T, with one request of
    // rounding per replica.
    let bound = |t: f64| 20.0 + 20.0 * t + 3.0;
    assert!(
        during as f64 <= bound(woke - stalled),
        "served {during} in {:.2} s of stall",
        woke - stalled
    );
    assert!(worst as f64 <= bound(1.0), "{worst} in one second");
    // Past its first second, the stall runs at the rate within 10 % (the
    // replicas' local shares add up to 1; they added up to 1.2 when the
    // arrival rates were averaged per sync rather than over time).
    let steady = served(&all, stalled + 1.0, woke);
    assert!(
        steady as f64 <= 1.1 * 20.0 * (woke - stalled - 1.0),
        "served {steady} in the stall's last {:.2} s",
        woke - stalled - 1.0
    );
    // And the limit is not starved either: the stall serves near the rate.
    assert!(during as f64 >= 0.5 * 20.0 * (woke - stalled), "{during}");
    for gw in [&r1, &r2, &r3] {
        let m = scrape_admin(gw).await;
        assert!(
            metric_sum(&m, "fairway_cluster_store_errors_total{") >= 1.0,
            "{m}"
        );
    }
}

/// A `redis-server` process (a node or, with `--sentinel`, a sentinel)
/// with its own folder, killed when dropped.
struct Node {
    child: Option<std::process::Child>,
    port: u16,
}

impl Node {
    #[allow(clippy::disallowed_methods)] // waits for the process on the wall clock
    fn start(args: &[String], config: Option<String>) -> Node {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("fairway-node-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = std::process::Command::new("redis-server");
        if let Some(text) = config {
            // A sentinel rewrites its configuration file: it must be its own.
            let path = dir.join("sentinel.conf");
            std::fs::write(
                &path,
                format!("port {port}\nbind 127.0.0.1\ndir {}\n{text}", dir.display()),
            )
            .unwrap();
            cmd.arg(&path).arg("--sentinel");
        } else {
            cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&dir);
        }
        let child = cmd
            .args(args)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server runs (tests/run.sh installs it)");
        let start = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Node {
            child: Some(child),
            port,
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}"))?
        .get_multiplexed_async_connection()
        .await?;
    cmd.query_async(&mut con).await
}

/// The port the sentinel at `port` names as the primary of `fw`.
async fn primary_port(sentinel: u16) -> Option<u16> {
    let addr: Vec<String> = query(
        sentinel,
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg("fw"),
    )
    .await
    .ok()?;
    addr.get(1)?.parse().ok()
}

/// The store survives the loss of its node: a primary, a replica and three
/// sentinels; the gateways reach the store through the sentinels
/// (`redis+sentinel://`). The primary is killed under load; the sentinels
/// promote the replica and every gateway finds it, leasing again. No
/// request is lost (each answered 200 or 429) or counted twice (the
/// gateways' served counters match what the clients got), and the rate
/// holds within its bound throughout.
#[tokio::test]
async fn the_store_fails_over_to_a_replica_under_load() {
    let _serial = SERIAL.lock().await;
    let mut primary = Node::start(&[], None);
    let replica = Node::start(
        &[
            "--replicaof".into(),
            "127.0.0.1".into(),
            primary.port.to_string(),
        ],
        None,
    );
    let monitor = format!(
        "sentinel monitor fw 127.0.0.1 {} 2\nsentinel down-after-milliseconds fw 500\n\
         sentinel failover-timeout fw 2000\nsentinel parallel-syncs fw 1\n",
        primary.port
    );
    let sentinels: Vec<Node> = (0..3)
        .map(|_| Node::start(&[], Some(monitor.clone())))
        .collect();
    // The replica in sync and known to every sentinel.
    assert!(
        eventually(Duration::from_secs(15), async || {
            let info: String = query(replica.port, redis::cmd("INFO").arg("replication"))
                .await
                .unwrap_or_default();
            let mut known = true;
            for s in &sentinels {
                let replicas: Vec<redis::Value> =
                    query(s.port, redis::cmd("SENTINEL").arg("replicas").arg("fw"))
                        .await
                        .unwrap_or_default();
                known &= primary_port(s.port).await == Some(primary.port) && !replicas.is_empty();
            }
            info.contains("master_link_status:up") && known
        })
        .await,
        "the replica or the sentinels never came up"
    );
    let hosts: Vec<String> = sentinels
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    let store = format!("store = \"redis+sentinel://{}/fw\"", hosts.join(","));
    let b = sim(M, 64).await;
    let [r1, r2, r3] = three(&store, b.addr()).await;
    let t0 = tokio::time::Instant::now();
    let stop = t0 + Duration::from_secs(10);
    let tasks = load(6, vec![r1.addr(), r2.addr(), r3.addr()], t0, stop);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed = t0.elapsed().as_secs_f64();
    primary.kill();
    // The sentinels promote the replica; every gateway leases from it.
    assert!(
        eventually(Duration::from_secs(8), async || {
            primary_port(sentinels[0].port).await == Some(replica.port)
        })
        .await,
        "no failover"
    );
    let promoted = t0.elapsed().as_secs_f64();
    assert!(
        all_see(&[&r1, &r2, &r3], 3.0).await,
        "the gateways did not follow the failover"
    );
    let recovered = t0.elapsed().as_secs_f64();
    let all = answers(tasks).await;
    let worst = most_served(&all, 0.0, 10.0, 1.0);
    let outage = served(&all, killed, recovered);
    let per_half: Vec<usize> = (0..20)
        .map(|i| served(&all, f64::from(i) * 0.5, f64::from(i + 1) * 0.5))
        .collect();
    eprintln!(
        "primary killed at {killed:.2} s, replica promoted by {promoted:.2} s, every gateway leasing again by {recovered:.2} s \
         ({:.2} s after the kill); served {outage} meanwhile; most in a second {worst}; per half second {per_half:?}",
        recovered - killed
    );
    let bound = |t: f64| 20.0 + 20.0 * t + 3.0;
    assert!(worst as f64 <= bound(1.0), "{worst} in one second");
    assert!(
        outage as f64 <= bound(recovered - killed),
        "{outage} served in the failover"
    );
    // Counted once: what the gateways count as served is what the clients got.
    let ok = all.iter().filter(|(_, ok)| *ok).count();
    let mut counted = 0.0;
    for gw in [&r1, &r2, &r3] {
        counted += metric_sum(
            &scrape(gw).await,
            "fairway_requests_total{tenant=\"a\",model=\"m\",outcome=\"served\"",
        );
    }
    assert_eq!(
        counted, ok as f64,
        "the gateways counted {counted}, the clients got {ok}"
    );
    // The new primary holds the cluster: three members.
    let members: Vec<String> = query(
        replica.port,
        redis::cmd("ZRANGE")
            .arg("{fairway}:replicas")
            .arg(0)
            .arg(-1),
    )
    .await
    .unwrap();
    assert_eq!(members.len(), 3, "{members:?}");
}

/// The store's key layout runs on Redis Cluster: every key the sync's
/// script touches (the membership, every replica's demand, the leases) is
/// under one hash tag, `{fairway}`, so in one slot, on one node, as a
/// cluster requires of a script (a key of a slot that another node serves
/// is refused, "non local key"). Two cluster nodes split the slots; the
/// gateways talk to the one serving the tag's slot (the client is a
/// single-node one: docs/cluster.md, "Store layout"). Every key the
/// gateways write is in that slot, no sync fails, and the rate holds.
#[tokio::test]
async fn the_store_layout_runs_on_a_redis_cluster() {
    let _serial = SERIAL.lock().await;
    let cluster_node = || {
        Node::start(
            &[
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-config-file".into(),
                "nodes.conf".into(),
            ],
            None,
        )
    };
    let nodes = [cluster_node(), cluster_node()];
    for (node, (from, to)) in nodes.iter().zip([(0, 8191), (8192, 16383)]) {
        let _: () = query(
            node.port,
            redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(from).arg(to),
        )
        .await
        .unwrap();
    }
    let _: () = query(
        nodes[0].port,
        redis::cmd("CLUSTER")
            .arg("MEET")
            .arg("127.0.0.1")
            .arg(nodes[1].port),
    )
    .await
    .unwrap();
    assert!(
        eventually(Duration::from_secs(15), async || {
            let mut ok = true;
            for n in &nodes {
                let info: String = query(n.port, redis::cmd("CLUSTER").arg("INFO"))
                    .await
                    .unwrap_or_default();
                ok &= info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:2");
            }
            ok
        })
        .await,
        "the cluster never formed"
    );
    let slot: u16 = query(
        nodes[0].port,
        redis::cmd("CLUSTER").arg("KEYSLOT").arg("{fairway}"),
    )
    .await
    .unwrap();
    let node = &nodes[usize::from(slot > 8191)];
    let store = format!("store = \"redis://127.0.0.1:{}\"", node.port);
    let b = sim(M, 64).await;
    let [r1, r2, r3] = three(&store, b.addr()).await;
    let t0 = tokio::time::Instant::now();
    let all = answers(load(
        6,
        vec![r1.addr(), r2.addr(), r3.addr()],
        t0,
        t0 + Duration::from_secs(3),
    ))
    .await;
    let served = served(&all, 0.0, 3.0);
    eprintln!(
        "on a Redis Cluster: served {served} of {} in 3 s",
        all.len()
    );
    assert!((40..=20 + 60 + 3).contains(&served), "{served}");
    for gw in [&r1, &r2, &r3] {
        let m = scrape_admin(gw).await;
        assert_eq!(
            metric(&m, "fairway_cluster_store_errors_total{"),
            Some(0.0),
            "{m}"
        );
        assert_eq!(metric(&m, "fairway_cluster_leasing{"), Some(1.0), "{m}");
    }
    // Every key written (membership, demand, leases) is in the tag's slot.
    let keys: Vec<String> = query(node.port, redis::cmd("KEYS").arg("*")).await.unwrap();
    assert!(keys.len() >= 5, "{keys:?}");
    for k in &keys {
        let s: u16 = query(node.port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(k))
            .await
            .unwrap();
        assert_eq!(s, slot, "{k}");
    }
}
