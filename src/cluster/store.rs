//! The Redis side: membership as a sorted set of replica names scored by
//! when each expires, on the store's own clock (so the replicas' clocks do
//! not matter), renewed and read in one script.

use redis::aio::ConnectionManager;
use redis::{IntoConnectionInfo, Script};

use crate::config::ClusterPolicy;

/// Renews replica `ARGV[1]` until now + `ARGV[2]` ms, drops the expired,
/// stores the replica's demand (`ARGV[4..]`: tenant, requests per second,
/// …) under `ARGV[3]` + replica, and returns every live replica's: name,
/// number of pairs, pairs.
const HEARTBEAT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ttl * 2)
local mine = ARGV[3] .. ARGV[1]
redis.call('DEL', mine)
if #ARGV > 3 then
  redis.call('HSET', mine, unpack(ARGV, 4))
  redis.call('PEXPIRE', mine, ttl)
end
local out = {}
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local d = redis.call('HGETALL', ARGV[3] .. m)
  table.insert(out, m)
  table.insert(out, tostring(#d / 2))
  for _, x in ipairs(d) do table.insert(out, x) end
end
return out
";

/// Every live replica's demand: by replica name, tenant → requests per
/// second arriving there.
pub type Demands = Vec<(String, Vec<(String, f64)>)>;

/// A connection to the cluster's store (reconnecting on its own).
pub struct Store {
    con: ConnectionManager,
    replicas_key: String,
    demand_prefix: String,
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
            demand_prefix: format!("{}:demand:", policy.key_prefix),
            replica: replica.to_owned(),
            ttl_ms: u64::try_from(policy.replica_ttl.as_millis()).unwrap_or(u64::MAX),
            heartbeat: Script::new(HEARTBEAT),
        })
    }

    /// Renews this replica's membership and publishes its `demand`;
    /// every live replica's demand (this one's included).
    pub async fn heartbeat(&mut self, demand: &[(String, f64)]) -> redis::RedisResult<Demands> {
        let mut call = self.heartbeat.key(&self.replicas_key);
        call.arg(&self.replica)
            .arg(self.ttl_ms)
            .arg(&self.demand_prefix);
        for (tenant, d) in demand {
            call.arg(tenant).arg(d.to_string());
        }
        let flat: Vec<String> = call.invoke_async(&mut self.con).await?;
        Ok(parse_demands(&flat))
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

/// Reads the heartbeat's answer: name, n, n pairs, name, …
fn parse_demands(flat: &[String]) -> Demands {
    let mut out = Vec::new();
    let mut it = flat.iter();
    while let (Some(name), Some(n)) = (it.next(), it.next()) {
        let n: usize = n.parse().unwrap_or(0);
        let mut pairs = Vec::with_capacity(n);
        for _ in 0..n {
            let (Some(t), Some(d)) = (it.next(), it.next()) else {
                break;
            };
            pairs.push((t.clone(), d.parse().unwrap_or(0.0)));
        }
        out.push((name.clone(), pairs));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demands_are_read_back() {
        let flat: Vec<String> = ["r1", "2", "a", "1.5", "b", "0", "r2", "0"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        assert_eq!(
            parse_demands(&flat),
            vec![
                (
                    "r1".to_owned(),
                    vec![("a".to_owned(), 1.5), ("b".to_owned(), 0.0)]
                ),
                ("r2".to_owned(), vec![]),
            ]
        );
    }
}
