//! The Redis side: membership as a sorted set of replica names scored by
//! when each expires, on the store's own clock (so the replicas' clocks do
//! not matter), renewed and read in one script.

use redis::aio::ConnectionManager;
use redis::{IntoConnectionInfo, Script};

use crate::config::ClusterPolicy;

/// Renews `ARGV[1]` until now + `ARGV[2]` ms, drops the expired, counts.
const HEARTBEAT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return redis.call('ZCARD', KEYS[1])
";

/// A connection to the cluster's store (reconnecting on its own).
pub struct Store {
    con: ConnectionManager,
    replicas_key: String,
    replica: String,
    ttl_ms: u64,
    heartbeat: Script,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("replicas_key", &self.replicas_key)
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// A lazy connection: nothing is sent until the first call, so a store
    /// that is down at start does not stop the gateway.
    pub fn connect(policy: &ClusterPolicy, replica: &str) -> Result<Store, String> {
        let mut info = policy
            .store
            .as_str()
            .into_connection_info()
            .map_err(|e| format!("cluster store {}: {e}", policy.store))?;
        if let Some(pw) = &policy.password {
            let redis = info.redis_settings().clone().set_password(&pw.0);
            info = info.set_redis_settings(redis);
        }
        let client = redis::Client::open(info).map_err(|e| format!("cluster store: {e}"))?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(policy.sync_interval))
            .set_response_timeout(Some(policy.sync_interval))
            .set_number_of_retries(1)
            .set_max_delay(policy.sync_interval);
        let con = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| format!("cluster store: {e}"))?;
        Ok(Store {
            con,
            replicas_key: format!("{}:replicas", policy.key_prefix),
            replica: replica.to_owned(),
            ttl_ms: u64::try_from(policy.replica_ttl.as_millis()).unwrap_or(u64::MAX),
            heartbeat: Script::new(HEARTBEAT),
        })
    }

    /// Renews this replica's membership; the number of replicas alive.
    pub async fn heartbeat(&mut self) -> redis::RedisResult<u32> {
        self.heartbeat
            .key(&self.replicas_key)
            .arg(&self.replica)
            .arg(self.ttl_ms)
            .invoke_async(&mut self.con)
            .await
    }

    /// Leaves the cluster.
    pub async fn leave(&mut self) -> redis::RedisResult<()> {
        redis::cmd("ZREM")
            .arg(&self.replicas_key)
            .arg(&self.replica)
            .query_async(&mut self.con)
            .await
    }
}
