//! The Redis side: membership as a sorted set of replica names scored by
//! when each expires, on the store's own clock (so the replicas' clocks do
//! not matter), renewed and read in one script, which also settles the
//! replica's leases.

use redis::Script;

use crate::config::ClusterPolicy;
use crate::core::admission::{LeaseAnswer, LeaseAsk, LeaseKind};

use super::connection::{ConnectError, Connection, connection};
use super::homes::{Entry, HomesStream};

/// One sync of replica `ARGV[1]`, on the store's clock (`TIME`): renews
/// its membership until now + `ARGV[2]` ms and drops the expired; stores
/// its demand (`ARGV[6]` pairs after it) under `ARGV[3]` + replica; then
/// settles its leases (8 values each: tenant, limit, capacity, rate, level,
/// open, returned, want) in the hashes `ARGV[4]` + tenant + `:` + limit,
/// kept at least `ARGV[5]` ms after their last ask,
/// the steps of [`SharedLimit::sync`](crate::core::admission::SharedLimit::sync),
/// dropping what expired replicas held, and lists in `KEYS[2]` the limits
/// a replica is short of (until its membership would expire). Returns the
/// store's time (ms), whether the store had no replica before (restarted
/// empty, or every replica expired), the number of leases and for each
/// what it gives and how short the others are, the limits some replica is
/// short of, then every live replica's name, number of demand pairs and
/// pairs.
const SYNC: &str = r"
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local me = ARGV[1]
local ttl = tonumber(ARGV[2])
local keep = tonumber(ARGV[5])
local fresh = redis.call('EXISTS', KEYS[1]) == 0
redis.call('ZADD', KEYS[1], now_ms + ttl, me)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
redis.call('PEXPIRE', KEYS[1], ttl * 2)
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
local live = {}
for _, m in ipairs(members) do live[m] = true end

local mine = ARGV[3] .. me
local pairs_n = tonumber(ARGV[6])
redis.call('DEL', mine)
if pairs_n > 0 then
  -- In parts: unpack puts its values on Lua's stack, which holds about
  -- 8,000.
  local last = 6 + 2 * pairs_n
  for i = 7, last, 2000 do
    redis.call('HSET', mine, unpack(ARGV, i, math.min(i + 1999, last)))
  end
  redis.call('PEXPIRE', mine, ttl)
end

local function lease(tenant, kind, cap, rate, level, open, ret, want)
  local key = ARGV[4] .. tenant .. ':' .. kind
  local h = redis.call('HGETALL', key)
  local others, short, started, lvl, upd = 0, 0, false, 0, 0
  for i = 1, #h, 2 do
    local f, v = h[i], tonumber(h[i + 1])
    local tag, r = string.sub(f, 1, 2), string.sub(f, 3)
    if f == 'level' then lvl = v; started = true
    elseif f == 'updated' then upd = v
    elseif (tag == 'h:' or tag == 'u:') and r ~= me then
      if not live[r] then redis.call('HDEL', key, f)
      elseif tag == 'h:' then others = others + v
      else short = short + v end
    end
  end
  local function room(held) return math.max(cap - others - held, 0) end
  local give, held, expire = 0, 0, ttl * 2
  if kind == 'concurrency' then
    held = math.max(level, 0)
    give = math.floor(math.max(0, math.min(want - held, room(held))))
    held = held + give
  else
    local held_in = math.max(level, 0) + open
    if not started then lvl = room(held_in + ret)
    elseif now > upd then lvl = lvl + (now - upd) * rate end
    lvl = math.min(lvl, room(held_in + ret))
    upd = math.max(upd, now)
    lvl = lvl + ret
    if level < 0 then lvl = lvl + level; give = -level end
    local grant = math.max(0, math.min(want - held_in, math.max(lvl, 0)))
    lvl = lvl - grant
    give = give + grant
    held = held_in + grant
    lvl = math.min(lvl, room(held))
    redis.call('HSET', key, 'level', tostring(lvl), 'updated', tostring(upd))
    if rate > 0 then expire = expire + math.ceil(cap / rate * 1000) end
  end
  -- Short by less than a millionth of the limit (floats) is not short.
  local unmet = want - held
  if unmet <= 1e-6 * math.max(cap, 1) then unmet = 0 end
  redis.call('HSET', key, 'h:' .. me, tostring(held), 'u:' .. me, tostring(unmet))
  redis.call('PEXPIRE', key, math.max(expire, keep))
  local listed = tenant .. '\31' .. kind .. '\31' .. me
  if unmet > 0 then
    redis.call('ZADD', KEYS[2], now_ms + ttl, listed)
  else
    redis.call('ZREM', KEYS[2], listed)
  end
  return give, short
end

local out = {tostring(now_ms), fresh and '1' or '0'}
local first = 7 + 2 * pairs_n
local n = math.floor((#ARGV - first + 1) / 8)
table.insert(out, tostring(n))
for i = 0, n - 1 do
  local a = first + i * 8
  local give, short = lease(ARGV[a], ARGV[a + 1],
    tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]),
    tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7]))
  table.insert(out, tostring(give))
  table.insert(out, tostring(short))
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
local short = redis.call('ZRANGE', KEYS[2], 0, -1)
table.insert(out, tostring(#short))
for _, s in ipairs(short) do table.insert(out, s) end
for _, m in ipairs(members) do
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

/// How long the store keeps a lease's record after its last ask: three
/// keepalives ([`crate::core::scheduler::LEASE_KEEPALIVE`], staggered),
/// so that replicas whose tenants are idle ask only at their keepalives
/// and the store never forgets what they hold.
const LEASE_KEEP_MS: u64 = 3
    * 1000
    * (crate::core::scheduler::LEASE_KEEPALIVE.as_secs() + crate::core::scheduler::STAGGER_SECS);

/// The store's answer to one sync.
#[derive(Debug, Default, PartialEq)]
pub struct Answer {
    /// The store had no replica before this sync: it restarted empty (or
    /// every replica expired), and has forgotten every lease.
    pub fresh: bool,
    /// To each lease asked for, in order.
    pub leases: Vec<LeaseAnswer>,
    /// The limits (tenant, limit) some replica is short of.
    pub short: Vec<(String, LeaseKind)>,
    /// Every live replica's demand (the asking one's included).
    pub demands: Demands,
    /// The store's clock, milliseconds.
    pub now_ms: u64,
}

/// A connection to the cluster's store (reconnecting on its own).
pub struct Store {
    con: Connection,
    replicas_key: String,
    /// The limits some replica is short of (see [`SYNC`]).
    short_key: String,
    demand_prefix: String,
    lease_prefix: String,
    replica: String,
    ttl_ms: u64,
    sync: Script,
    homes: HomesStream,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("replicas_key", &self.replicas_key)
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

/// The prefix of the hashes of the tenants' leased limits,
/// `{key_prefix}:lease:`, each `<prefix><tenant>:<limit>`
/// ([`LeaseKind::as_str`](crate::core::admission::LeaseKind::as_str)).
pub fn lease_prefix(policy: &ClusterPolicy) -> String {
    format!("{{{}}}:lease:", policy.key_prefix)
}

/// What the store's side of a tenant's leased bucket (its hash, as
/// [`SYNC`] keeps it: `level` as of `updated`, store
/// seconds, and each replica's holding `h:<replica>`) holds at `now`, of
/// `capacity` refilled at `rate` per second: its level refilled since,
/// into the room the holdings leave (negative while in debt). `None`
/// before the first lease.
pub fn undistributed(
    hash: &std::collections::HashMap<String, String>,
    now: f64,
    capacity: f64,
    rate: f64,
) -> Option<f64> {
    let level: f64 = hash.get("level")?.parse().ok()?;
    let updated: f64 = hash
        .get("updated")
        .and_then(|u| u.parse().ok())
        .unwrap_or(now);
    let held: f64 = hash
        .iter()
        .filter(|(k, _)| k.starts_with("h:"))
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum();
    Some((level + (now - updated).max(0.0) * rate).min((capacity - held).max(0.0)))
}

impl Store {
    /// A lazy connection: nothing is sent until the first call, so a store
    /// that is down at start does not stop the gateway.
    pub fn connect(policy: &ClusterPolicy, replica: &str) -> Result<Store, ConnectError> {
        let con = connection(policy, policy.sync_interval)?;
        // One hash tag, `{key_prefix}`, over every key the script touches
        // (including those it is not passed: the live replicas' demand and
        // the leases), so that they are one slot, as Redis Cluster requires
        // of a script.
        let tag = format!("{{{}}}", policy.key_prefix);
        Ok(Store {
            con,
            replicas_key: format!("{tag}:replicas"),
            short_key: format!("{tag}:short"),
            demand_prefix: format!("{tag}:demand:"),
            lease_prefix: lease_prefix(policy),
            replica: replica.to_owned(),
            ttl_ms: u64::try_from(policy.replica_ttl.as_millis()).unwrap_or(u64::MAX),
            sync: Script::new(SYNC),
            homes: HomesStream::new(&tag),
        })
    }

    /// Renews this replica's membership, publishes its `demand` and
    /// settles its `leases`.
    pub async fn sync(
        &mut self,
        demand: &[(String, f64)],
        leases: &[LeaseAsk],
    ) -> redis::RedisResult<Answer> {
        let mut call = self.sync.key(&self.replicas_key);
        call.key(&self.short_key)
            .arg(&self.replica)
            .arg(self.ttl_ms)
            .arg(&self.demand_prefix)
            .arg(&self.lease_prefix)
            .arg(LEASE_KEEP_MS)
            .arg(demand.len());
        for (field, d) in demand {
            call.arg(field).arg(d.to_string());
        }
        for l in leases {
            call.arg(&l.tenant)
                .arg(l.kind.as_str())
                .arg(l.capacity.to_string())
                .arg(l.rate.to_string())
                .arg(l.level.to_string())
                .arg(l.open.to_string())
                .arg(l.returned.to_string())
                .arg(l.want.to_string());
        }
        let flat: Vec<String> = call.invoke_async(&mut self.con).await?;
        Ok(parse_answer(&flat))
    }

    /// Publishes the homes this replica gave new prefixes and reads every
    /// replica's since the last call ([`super::homes`]).
    pub async fn exchange_homes(
        &mut self,
        placed: &[crate::core::scheduler::PlacedHome],
    ) -> redis::RedisResult<Vec<Entry>> {
        self.homes
            .exchange(&mut self.con, &self.replica, placed)
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

/// Reads the sync's answer: the store's time, whether it was fresh, the
/// number of leases, give and short for each, the number of limits listed
/// short and each (tenant␟limit␟replica), then name, n, n pairs, name, …
fn parse_answer(flat: &[String]) -> Answer {
    let mut it = flat.iter();
    let now_ms = it.next().and_then(|t| t.parse().ok()).unwrap_or(0);
    let fresh = it.next().is_some_and(|f| f == "1");
    let n: usize = it.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let mut num = || it.next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let answers = (0..n)
        .map(|_| LeaseAnswer {
            give: num(),
            short: num(),
        })
        .collect();
    let listed: usize = it.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let short = it
        .by_ref()
        .take(listed)
        .filter_map(|s| {
            let mut parts = s.split('\u{1f}');
            let (tenant, kind) = (parts.next()?, parts.next()?);
            let kind = LeaseKind::ALL.into_iter().find(|k| k.as_str() == kind)?;
            Some((tenant.to_owned(), kind))
        })
        .collect();
    let mut out = Vec::new();
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
    Answer {
        fresh,
        leases: answers,
        short,
        demands: out,
        now_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demands_are_read_back() {
        let flat: Vec<String> = [
            "1700000000123",
            "1",
            "2",
            "3",
            "0",
            "0.5",
            "1",
            "2",
            "t\u{1f}concurrency\u{1f}r2",
            "t\u{1f}unknown\u{1f}r2",
            "r1",
            "2",
            "a",
            "1.5",
            "b",
            "0",
            "r2",
            "0",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let Answer {
            fresh,
            leases,
            short,
            demands,
            now_ms,
        } = parse_answer(&flat);
        assert!(fresh);
        assert_eq!(short, vec![("t".to_owned(), LeaseKind::Concurrency)]);
        assert_eq!(now_ms, 1_700_000_000_123);
        assert_eq!(
            leases,
            vec![
                LeaseAnswer {
                    give: 3.0,
                    short: 0.0
                },
                LeaseAnswer {
                    give: 0.5,
                    short: 1.0
                }
            ]
        );
        assert_eq!(
            demands,
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
