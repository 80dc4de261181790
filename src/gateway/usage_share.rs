//! The tenant usage windows for the whole cluster: each replica publishes
//! its tenants' recent window buckets (and its live numbers: in flight,
//! queued, what its buckets hold) to `[cluster]`'s store every
//! `sync_interval`, and a replica answering the usage API adds every other
//! replica's buckets to its own, so that every replica shows the same
//! numbers for the cluster within one interval (docs/usage.md, "Several
//! replicas").
//!
//! Two hashes per tenant, fields by replica: `{key_prefix}:usage:{tenant}`
//! holds `m␟{replica}␟{start}` and `h␟{replica}␟{start}`, a minute or hour
//! bucket (sketches and counters, encoded by `telemetry::usage`), and
//! `l␟{replica}`, when each outcome last happened;
//! `{key_prefix}:usage-live:{tenant}` holds each replica's live numbers
//! (small: what a report of another tenant needs of this one, its share).
//! A replica replaces its own fields as its buckets fill and deletes the
//! bucket a ring reuses; the hashes expire a day after their last write.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::cluster::Connection;
use crate::config::ClusterPolicy;
use crate::core::admission::LeaseKind;
use crate::telemetry::usage::{Bucket, TenantWindows};

use super::live_policy::Live;

/// What the publication reads of the gateway: the live policy and, per
/// tenant, this replica's live numbers (implemented by `Gateway`).
pub trait UsageSource: Send + Sync {
    fn live(&self) -> Arc<Live>;
    /// This replica's live numbers for the tenant of usage index `index`.
    fn numbers(&self, live: &Live, index: usize, now: f64) -> LiveNumbers;
}

const SEP: char = '\u{1f}';
/// Live numbers that have not changed are published again after this
/// long (seconds), well within [`KEEP_SECS`].
const REPUBLISH_SECS: f64 = 6.0 * 3600.0;
/// The hash outlives the longest window (a day and the hour under way).
const KEEP_SECS: u64 = 26 * 3600;

/// A replica's live numbers for one tenant, as it published them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveNumbers {
    /// Unix seconds of the publication.
    pub at: f64,
    pub in_flight: u32,
    pub queued: u32,
    pub preempted_total: u64,
    pub rate_level: Option<f64>,
    pub gpu_seconds_level: Option<f64>,
    /// Over this replica's last hour: requests, and GPU-seconds served
    /// (the tenants' shares of service).
    pub requests_1h: u64,
    pub gpu_seconds_1h: f64,
    /// Over this replica's last hour: served, served within the SLO, and
    /// refused (what the operator's view sorts the tenants by). Absent
    /// from a replica of an earlier version: 0.
    #[serde(default)]
    pub served_1h: u64,
    #[serde(default)]
    pub goodput_1h: u64,
    #[serde(default)]
    pub refused_1h: u64,
}

/// Every tenant's live numbers, by usage index, as the usage views read
/// them ([`EveryoneCache`]).
#[derive(Debug)]
pub struct Everyone {
    /// Each replica's numbers published within the last hour, this
    /// replica's own first.
    pub numbers: Vec<Vec<LiveNumbers>>,
    /// `cluster` (every replica's) or `replica` (this one's).
    pub scope: &'static str,
    /// How old a replica's numbers may be to count as current (seconds).
    pub fresh: f64,
    /// Why the cluster's numbers could not be read, if they could not.
    pub error: Option<String>,
}

/// One read of every tenant's numbers: when, for which policy (its
/// `Live`'s address), what.
type EveryoneRead = (tokio::time::Instant, usize, Arc<Everyone>);

/// How long one read of every tenant's numbers serves the usage views.
const EVERYONE_FOR: Duration = Duration::from_secs(1);

/// The last read of every tenant's live numbers, by scope: any number of
/// usage views costs one read a second (views that arrive during a read
/// wait for it rather than make their own), so that the operator's view
/// of ten thousand tenants, refreshed by many browsers, stays off the
/// request path's back.
pub struct EveryoneCache {
    /// By scope (replica, cluster): when, for which policy, what.
    slots: tokio::sync::Mutex<[Option<EveryoneRead>; 2]>,
    /// Operators' views of every tenant are built one at a time.
    pages: tokio::sync::Semaphore,
}

impl Default for EveryoneCache {
    fn default() -> Self {
        EveryoneCache {
            slots: tokio::sync::Mutex::default(),
            pages: tokio::sync::Semaphore::new(1),
        }
    }
}

impl EveryoneCache {
    /// Waits for the turn to build a page of the operator's view: one at
    /// a time, so that any number of them keeps at most one of the
    /// request path's threads busy.
    pub async fn page_turn(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.pages.acquire().await.ok()
    }

    /// The numbers of `live`'s tenants read within [`EVERYONE_FOR`], or
    /// `read`'s now.
    pub async fn get<F: Future<Output = Everyone>>(
        &self,
        live: &Live,
        cluster: bool,
        read: impl FnOnce() -> F,
    ) -> Arc<Everyone> {
        // A reloaded policy is another `Live`: its tenants are read anew.
        let policy = std::ptr::from_ref(live) as usize;
        let mut slots = self.slots.lock().await;
        let slot = &mut slots[usize::from(cluster)];
        if let Some((at, of, e)) = slot.as_ref()
            && *of == policy
            && at.elapsed() < EVERYONE_FOR
            && e.numbers.len() == live.usage.len()
        {
            return e.clone();
        }
        let e = Arc::new(read().await);
        *slot = Some((tokio::time::Instant::now(), policy, e.clone()));
        e
    }
}

/// One tenant's windows over the replicas that published them.
#[derive(Debug)]
pub struct ClusterWindows {
    pub windows: TenantWindows,
    /// Replicas whose buckets were added (this one's included).
    pub replicas: usize,
    /// What the store holds of the tenant's request and GPU-seconds
    /// buckets beside the replicas' leases, now
    /// ([`crate::cluster::undistributed`]).
    pub store_rate: Option<f64>,
    pub store_gpu_seconds: Option<f64>,
}

/// The cluster's copy of the usage windows (see the module's docs).
pub struct SharedUsage {
    con: Connection,
    /// `{key_prefix}:usage:`
    prefix: String,
    /// `{key_prefix}:lease:`, the cluster's leases (`cluster::Store`).
    lease_prefix: String,
    replica: String,
    interval: Duration,
    /// By usage index: the records counted at the last publication.
    published: Mutex<HashMap<usize, u64>>,
    /// By usage index: the live numbers last published.
    numbers_sent: Mutex<HashMap<usize, LiveNumbers>>,
}

impl std::fmt::Debug for SharedUsage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedUsage")
            .field("prefix", &self.prefix)
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

/// A tenant's name by usage index: the policy's tenants, then "default".
pub fn tenant_name(live: &Live, index: usize) -> &str {
    live.policy
        .tenants
        .get(index)
        .map_or("default", |t| t.name.as_str())
}

impl SharedUsage {
    /// A lazy connection to the policy's store (nothing is sent yet).
    pub fn connect(
        policy: &ClusterPolicy,
        replica: &str,
    ) -> Result<SharedUsage, crate::cluster::ConnectError> {
        Ok(SharedUsage {
            con: crate::cluster::connection(
                policy,
                policy.sync_interval.max(Duration::from_secs(1)),
            )?,
            prefix: format!("{{{}}}:usage:", policy.key_prefix),
            lease_prefix: crate::cluster::lease_prefix(policy),
            replica: replica.to_owned(),
            interval: policy.sync_interval,
            published: Mutex::new(HashMap::new()),
            numbers_sent: Mutex::new(HashMap::new()),
        })
    }

    /// The hash of each replica's last publication (unix seconds), by
    /// replica: its live numbers count as current while it beats.
    fn beat_key(&self) -> String {
        format!("{}-beat", self.prefix.trim_end_matches(':'))
    }

    fn key(&self, tenant: &str) -> String {
        format!("{}{tenant}", self.prefix)
    }

    fn live_key(&self, tenant: &str) -> String {
        format!("{}-live:{tenant}", self.prefix.trim_end_matches(':'))
    }

    /// Publishes the buckets of the tenants with new records since the
    /// last call, the live numbers that changed since they were last
    /// published (or were last published [`REPUBLISH_SECS`] ago), and this
    /// replica's beat: an idle tenant costs the store nothing.
    pub async fn publish(&self, gw: &dyn UsageSource, now: f64) -> redis::RedisResult<()> {
        let live = gw.live();
        let mut pipe = redis::pipe();
        let mut done = Vec::new();
        let mut sent = Vec::new();
        let beat = self.beat_key();
        pipe.hset(&beat, &self.replica, now).ignore();
        pipe.expire(&beat, KEEP_SECS as i64).ignore();
        for (index, windows) in live.usage.iter().enumerate() {
            let name = tenant_name(&live, index);
            let key = self.key(name);
            let numbers = gw.numbers(&live, index, now);
            let unchanged = self.numbers_sent.lock().get(&index).is_some_and(|last| {
                now - last.at < REPUBLISH_SECS
                    && LiveNumbers {
                        at: last.at,
                        ..numbers
                    } == *last
            });
            if !unchanged {
                let live_key = self.live_key(name);
                pipe.hset(
                    &live_key,
                    &self.replica,
                    serde_json::to_vec(&numbers).unwrap_or_default(),
                )
                .ignore()
                .expire(&live_key, KEEP_SECS as i64)
                .ignore();
                sent.push((index, numbers));
            }
            let w = windows.lock();
            let records = w.records();
            if self.published.lock().get(&index) == Some(&records) {
                continue;
            }
            let mut fields: Vec<(String, Vec<u8>)> = Vec::new();
            let mut stale = Vec::new();
            for (kind, start, bytes) in w.recent(now) {
                let tag = match kind {
                    Bucket::Minute => 'm',
                    Bucket::Hour => 'h',
                };
                fields.push((format!("{tag}{SEP}{}{SEP}{start}", self.replica), bytes));
                // The bucket this one reuses in the ring.
                let reused = start.saturating_sub(kind.ring_seconds());
                stale.push(format!("{tag}{SEP}{}{SEP}{reused}", self.replica));
            }
            fields.push((format!("l{SEP}{}", self.replica), w.last_encoded()));
            done.push((index, records));
            drop(w);
            // An HDEL of no field is an error, which fails the whole
            // pipeline (and so every publication of a tenant with no
            // bucket yet).
            if !stale.is_empty() {
                pipe.hdel(&key, stale).ignore();
            }
            pipe.hset_multiple(&key, &fields).ignore();
            pipe.expire(&key, KEEP_SECS as i64).ignore();
        }
        let mut con = self.con.clone();
        pipe.query_async::<()>(&mut con).await?;
        self.published.lock().extend(done);
        self.numbers_sent.lock().extend(sent);
        Ok(())
    }

    /// Publishes every `sync_interval` until `stop`.
    pub async fn run(self: Arc<Self>, gw: Arc<dyn UsageSource>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            let now = crate::clock::unix_seconds_f64();
            let bounded = tokio::time::timeout(
                self.interval.max(Duration::from_secs(1)),
                self.publish(&*gw, now),
            );
            match bounded.await {
                Ok(Ok(())) => failing = false,
                failed => {
                    if !failing {
                        let cause = match failed {
                            Ok(Err(e)) => e.to_string(),
                            _ => "no answer in time".to_owned(),
                        };
                        tracing::warn!(%cause, "usage windows not published to the cluster's store");
                    }
                    failing = true;
                }
            }
        }
    }

    /// Every tenant's live numbers, by usage index, as each replica
    /// published them within the last hour, this replica's `own` (by
    /// usage index, as of now) first. One pipelined round trip; what it
    /// reads is decoded on the blocking pool, off the request path's
    /// threads.
    pub async fn read_numbers(
        &self,
        live: &Live,
        now: f64,
        own: Vec<LiveNumbers>,
    ) -> redis::RedisResult<Vec<Vec<LiveNumbers>>> {
        let mut pipe = redis::pipe();
        pipe.hgetall(self.beat_key());
        for index in 0..live.usage.len() {
            pipe.hgetall(self.live_key(tenant_name(live, index)));
        }
        let mut con = self.con.clone();
        let mut values: Vec<redis::Value> = pipe.query_async(&mut con).await?;
        let hashes = values.split_off(1.min(values.len()));
        let beats: HashMap<String, f64> = values
            .pop()
            .map(redis::from_redis_value)
            .transpose()?
            .unwrap_or_default();
        let hashes: Vec<HashMap<String, Vec<u8>>> = hashes
            .into_iter()
            .map(redis::from_redis_value)
            .collect::<Result<_, _>>()?;
        let replica = self.replica.clone();
        let decode = move || {
            own.into_iter()
                .zip(hashes)
                .map(|(own, hash)| {
                    let mut all = vec![own];
                    // A replica publishes a tenant's numbers when they
                    // change: they are current as of its last beat.
                    all.extend(
                        hash.iter()
                            .filter(|(r, _)| **r != replica)
                            .filter_map(|(r, b)| {
                                let mut n = serde_json::from_slice::<LiveNumbers>(b).ok()?;
                                n.at = n.at.max(beats.get(r).copied().unwrap_or(0.0));
                                Some(n)
                            })
                            .filter(|n| now - n.at <= 3600.0),
                    );
                    all
                })
                .collect()
        };
        tokio::task::spawn_blocking(decode)
            .await
            .map_err(|e| redis::RedisError::from(std::io::Error::other(e.to_string())))
    }

    /// The cluster's windows of each tenant in `tenants` (by usage index):
    /// its windows here with every other replica's published buckets
    /// added, and what the store holds of its buckets. One pipelined
    /// round trip.
    pub async fn read_windows(
        &self,
        live: &Live,
        tenants: &[usize],
    ) -> redis::RedisResult<Vec<ClusterWindows>> {
        let mut pipe = redis::pipe();
        for &index in tenants {
            pipe.hgetall(self.key(tenant_name(live, index)));
        }
        pipe.cmd("TIME");
        for &index in tenants {
            for kind in [LeaseKind::Requests, LeaseKind::GpuSeconds] {
                let name = tenant_name(live, index);
                pipe.hgetall(format!("{}{name}:{}", self.lease_prefix, kind.as_str()));
            }
        }
        let mut con = self.con.clone();
        let mut values: Vec<redis::Value> = pipe.query_async(&mut con).await?;
        let leases = values.split_off(tenants.len() + 1);
        let (store_secs, micros): (u64, u64) =
            redis::from_redis_value(values.pop().unwrap_or(redis::Value::Nil))?;
        let store_now = store_secs as f64 + micros as f64 / 1e6;
        let hashes = values
            .into_iter()
            .map(redis::from_redis_value::<HashMap<String, Vec<u8>>>)
            .collect::<Result<Vec<_>, _>>()?;
        let mut leases = leases
            .into_iter()
            .map(|v| redis::from_redis_value::<HashMap<String, String>>(v).unwrap_or_default());
        let windows = tenants
            .iter()
            .zip(hashes)
            .map(|(&index, hash)| {
                let mut windows = live.usage[index].lock().clone();
                let mut replicas = std::collections::BTreeSet::from([self.replica.as_str()]);
                for (field, bytes) in &hash {
                    let mut parts = field.split(SEP);
                    let (Some(tag), Some(replica)) = (parts.next(), parts.next()) else {
                        continue;
                    };
                    if replica == self.replica {
                        continue;
                    }
                    let start = parts.next().and_then(|s| s.parse::<u64>().ok());
                    let added = match (tag, start) {
                        ("m", Some(start)) => windows.merge_bucket(Bucket::Minute, start, bytes),
                        ("h", Some(start)) => windows.merge_bucket(Bucket::Hour, start, bytes),
                        ("l", None) => windows.merge_last(bytes),
                        _ => false,
                    };
                    if added {
                        replicas.insert(replica);
                    }
                }
                let policy = live.policy.tenants.get(index);
                let (rate, gpu) = (leases.next(), leases.next());
                ClusterWindows {
                    windows,
                    replicas: replicas.len(),
                    store_rate: policy.and_then(|t| {
                        let r = t.rate?;
                        crate::cluster::undistributed(&rate?, store_now, t.burst.unwrap_or(r), r)
                    }),
                    store_gpu_seconds: policy.and_then(|t| {
                        let per_hour = t.gpu_seconds_per_hour?;
                        crate::cluster::undistributed(&gpu?, store_now, per_hour, per_hour / 3600.0)
                    }),
                }
            })
            .collect();
        Ok(windows)
    }

    /// How long a replica's live numbers count as current: three
    /// publications.
    pub fn fresh(&self) -> f64 {
        3.0 * self.interval.as_secs_f64()
    }
}
