//! What placement's replicas share, in `[cluster]`'s store: the pods seen
//! at `CREATE` (the binding that follows may come to another replica,
//! which needs the pod's model and size), and the reservations of allowed
//! bindings, by node. A binding is judged against its node's reservations
//! as read from the store, and its own is added only if the node's
//! reservations have not changed since (compare-and-set on the node's
//! version, in one script): two replicas judging bindings to one node at
//! once cannot both reserve the same memory; the later one reads the
//! earlier one's reservation and judges again.
//!
//! Keys, under one hash tag (`{<key_prefix>:placement}:`, so that each
//! script's keys are in one slot, as Redis Cluster requires):
//! - `pod:<namespace>/<name>`: the pod's request, for [`POD_TTL`];
//! - `node:<node>`: a hash of the node's reservations by pod, plus its
//!   version (field `~v`);
//! - `nodes`: the nodes with reservations.

use std::time::Duration;

use redis::Script;
use serde::{Deserialize, Serialize};

use super::nodes::Reservation;
use crate::core::placement::PodRequest;
use crate::core::time::Instant;

/// How long a pod seen at `CREATE` is remembered for its binding.
pub const POD_TTL: Duration = Duration::from_secs(3600);

/// Longest wait on the store for one call: a webhook has 5 s
/// (`webhook.yaml`), and a binding makes up to seven calls.
pub const STORE_TIMEOUT: Duration = Duration::from_millis(500);

/// The field of a node's hash that holds its version.
const VERSION: &str = "~v";

/// Adds a reservation if the node's version is the one its judge read.
const RESERVE: &str = r"
local v = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if v ~= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[3], ARGV[4], ARGV[1], v + 1)
redis.call('SADD', KEYS[2], ARGV[5])
return 1
";

/// Drops reservations of a node; a node left with none leaves the set.
const RELEASE: &str = r"
redis.call('HDEL', KEYS[1], unpack(ARGV, 3))
if redis.call('HLEN', KEYS[1]) <= 1 then
  redis.call('DEL', KEYS[1])
  redis.call('SREM', KEYS[2], ARGV[1])
end
return 1
";

/// A reservation as stored: its expiry in Unix milliseconds, the same at
/// every replica.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    gpu: u32,
    model: String,
    memory: u64,
    until_unix_ms: u64,
}

/// A pod's request as stored.
#[derive(Debug, Serialize, Deserialize)]
struct StoredPod {
    model: String,
    memory: u64,
}

/// A node's reservations as read, and the version to add one against.
#[derive(Debug)]
pub struct NodeReservations {
    pub version: u64,
    pub reservations: Vec<Reservation>,
}

/// Placement's link to the store.
pub struct Shared {
    con: crate::cluster::Connection,
    /// `{<key_prefix>:placement}:`
    prefix: String,
    reserve: Script,
    release: Script,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

type Result<T> = redis::RedisResult<T>;

impl Shared {
    /// A lazy connection to the policy's store (nothing is sent yet); each
    /// call bounded by [`STORE_TIMEOUT`].
    pub fn connect(
        policy: &crate::config::ClusterPolicy,
    ) -> std::result::Result<Shared, crate::cluster::ConnectError> {
        let con = crate::cluster::connection(policy, STORE_TIMEOUT)?;
        Ok(Shared {
            con,
            prefix: format!("{{{}:placement}}:", policy.key_prefix),
            reserve: Script::new(RESERVE),
            release: Script::new(RELEASE),
        })
    }

    fn node_key(&self, node: &str) -> String {
        format!("{}node:{node}", self.prefix)
    }

    fn nodes_key(&self) -> String {
        format!("{}nodes", self.prefix)
    }

    /// Records pod `key`'s request, for its binding at any replica.
    pub async fn remember(&self, key: &str, request: &PodRequest) -> Result<()> {
        let value = serde_json::to_string(&StoredPod {
            model: request.model.clone(),
            memory: request.memory,
        })
        .unwrap_or_default();
        let mut con = self.con.clone();
        timed(
            redis::cmd("SET")
                .arg(format!("{}pod:{key}", self.prefix))
                .arg(value)
                .arg("PX")
                .arg(u64::try_from(POD_TTL.as_millis()).unwrap_or(u64::MAX))
                .query_async(&mut con),
        )
        .await
    }

    /// Pod `key`'s request, if a replica saw its `CREATE`.
    pub async fn pod(&self, key: &str) -> Result<Option<PodRequest>> {
        let mut con = self.con.clone();
        let mut get = redis::cmd("GET");
        get.arg(format!("{}pod:{key}", self.prefix));
        let value: Option<String> = timed(get.query_async(&mut con)).await?;
        Ok(value
            .and_then(|v| serde_json::from_str::<StoredPod>(&v).ok())
            .map(|p| PodRequest {
                model: p.model,
                memory: p.memory,
            }))
    }

    /// `node`'s reservations now (expired ones left out), as of `now`.
    pub async fn node(&self, node: &str, now: Instant) -> Result<NodeReservations> {
        let mut con = self.con.clone();
        let mut get = redis::cmd("HGETALL");
        get.arg(self.node_key(node));
        let fields: Vec<(String, String)> = timed(get.query_async(&mut con)).await?;
        Ok(parse(node, fields, now, unix_millis()))
    }

    /// Every node's reservations (expired ones left out), as of `now`.
    pub async fn all(&self, now: Instant) -> Result<Vec<Reservation>> {
        timed(self.read_all(now)).await
    }

    async fn read_all(&self, now: Instant) -> Result<Vec<Reservation>> {
        let mut con = self.con.clone();
        let nodes: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.nodes_key())
            .query_async(&mut con)
            .await?;
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for n in &nodes {
            pipe.cmd("HGETALL").arg(self.node_key(n));
        }
        let hashes: Vec<Vec<(String, String)>> = pipe.query_async(&mut con).await?;
        let unix_ms = unix_millis();
        Ok(nodes
            .iter()
            .zip(hashes)
            .flat_map(|(n, fields)| parse(n, fields, now, unix_ms).reservations)
            .collect())
    }

    /// Adds `r` to its node's reservations if the node is still at
    /// `version`; `false` when another replica changed it first.
    pub async fn reserve(&self, r: &Reservation, version: u64, now: Instant) -> Result<bool> {
        let left = r.until.saturating_since(now);
        let value = serde_json::to_string(&Stored {
            gpu: r.gpu,
            model: r.request.model.clone(),
            memory: r.request.memory,
            until_unix_ms: unix_millis()
                .saturating_add(u64::try_from(left.as_millis()).unwrap_or(u64::MAX)),
        })
        .unwrap_or_default();
        let mut con = self.con.clone();
        let mut call = self.reserve.key(self.node_key(&r.node));
        call.key(self.nodes_key())
            .arg(VERSION)
            .arg(version)
            .arg(&r.pod)
            .arg(value)
            .arg(&r.node);
        let done: i64 = timed(call.invoke_async(&mut con)).await?;
        Ok(done == 1)
    }

    /// Drops reservations that ended (their engine shows, or they
    /// expired).
    pub async fn release(&self, ended: &[Reservation]) -> Result<()> {
        let mut con = self.con.clone();
        let mut by_node: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        for r in ended {
            by_node.entry(&r.node).or_default().push(&r.pod);
        }
        for (node, pods) in by_node {
            let mut call = self.release.key(self.node_key(node));
            call.key(self.nodes_key()).arg(node).arg(VERSION).arg(pods);
            let _: i64 = timed(call.invoke_async(&mut con)).await?;
        }
        Ok(())
    }
}

/// `call`, or an error once it has taken [`STORE_TIMEOUT`].
async fn timed<T>(call: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(STORE_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| {
            Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "the store did not answer in time",
            )))
        })
}

/// Now, in Unix milliseconds: reservations' ends are stored so, the same
/// at every replica.
fn unix_millis() -> u64 {
    u64::try_from(crate::clock::unix_time().as_millis()).unwrap_or(u64::MAX)
}

/// A node's hash as reservations, those still running at `unix_ms`; their
/// ends as `Instant`s from `now`.
fn parse(
    node: &str,
    fields: Vec<(String, String)>,
    now: Instant,
    unix_ms: u64,
) -> NodeReservations {
    let mut version = 0;
    let mut reservations = Vec::new();
    for (field, value) in fields {
        if field == VERSION {
            version = value.parse().unwrap_or(0);
            continue;
        }
        let Ok(s) = serde_json::from_str::<Stored>(&value) else {
            continue;
        };
        if s.until_unix_ms <= unix_ms {
            continue;
        }
        reservations.push(Reservation {
            pod: field,
            node: node.to_owned(),
            gpu: s.gpu,
            request: PodRequest {
                model: s.model,
                memory: s.memory,
            },
            until: now + Duration::from_millis(s.until_unix_ms - unix_ms),
        });
    }
    reservations.sort_by(|a, b| a.pod.cmp(&b.pod));
    NodeReservations {
        version,
        reservations,
    }
}
