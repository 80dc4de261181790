//! The shared store's leases: a batch's (the replica that validates,
//! finalizes, cancels and expires it) and each of its items' (the
//! replica that runs it), each expiring unless its replica renews it.

use std::collections::HashSet;

use super::{Shared, redis_failed};
use crate::batch::store::{StoreError, Taken};

/// Takes items of a batch for replica `ARGV[1]` for `ARGV[2]` ms (`KEYS`:
/// the batch's results, its items' leases, each `replica expiry-ms` by
/// line): of the lines `ARGV[4..]`, in order, at most `ARGV[3]` that have
/// no result and no lease of another replica's that runs yet (this
/// replica's own are renewed). Returns the lines taken, those with a
/// result, and those another replica holds.
pub(super) const TAKE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[3])
local taken, done, busy = {}, {}, {}
for i = 4, #ARGV do
  local line = ARGV[i]
  if redis.call('HEXISTS', KEYS[1], line) == 1 then
    table.insert(done, line)
  else
    local v = redis.call('HGET', KEYS[2], line)
    local owner, expiry = nil, 0
    if v then
      owner, expiry = string.match(v, '^(.*) (%d+)$')
      expiry = tonumber(expiry) or 0
    end
    if not owner or owner == ARGV[1] or expiry < now then
      if #taken < n then
        redis.call('HSET', KEYS[2], line, ARGV[1] .. ' ' .. (now + tonumber(ARGV[2])))
        table.insert(taken, line)
      end
    else
      table.insert(busy, line)
    end
  end
end
return {taken, done, busy}
";

/// Drops the leases of lines `ARGV[2..]` that replica `ARGV[1]` holds
/// (`KEYS`: the batch's items' leases).
pub(super) const RELEASE_ITEMS: &str = r"
for i = 2, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  if v and string.match(v, '^(.*) ') == ARGV[1] then redis.call('HDEL', KEYS[1], ARGV[i]) end
end
return 0
";

/// Takes or renews the leases `KEYS` for replica `ARGV[1]` for `ARGV[2]`
/// ms: a lease nobody holds is taken, one this replica holds renewed.
/// Returns the indexes (1-based) of the leases it holds now.
pub(super) const CLAIM: &str = r"
local mine = {}
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if not v then
    redis.call('SET', k, ARGV[1], 'PX', ARGV[2])
    table.insert(mine, i)
  elseif v == ARGV[1] then
    redis.call('PEXPIRE', k, ARGV[2])
    table.insert(mine, i)
  end
end
return mine
";

/// Drops the leases `KEYS` that replica `ARGV[1]` holds.
pub(super) const RELEASE: &str = r"
for _, k in ipairs(KEYS) do
  if redis.call('GET', k) == ARGV[1] then redis.call('DEL', k) end
end
return 0
";

impl Shared {
    fn lease_keys(&self, ids: &[String]) -> Vec<String> {
        ids.iter()
            .map(|id| self.key(&format!("lease:{id}")))
            .collect()
    }

    pub async fn claim(&self, ids: &[String]) -> Result<HashSet<String>, StoreError> {
        if ids.is_empty() {
            return Ok(HashSet::new());
        }
        let mut call = self.claim.prepare_invoke();
        for k in self.lease_keys(ids) {
            call.key(k);
        }
        let mine: Vec<usize> = call
            .arg(&self.replica)
            .arg(self.lease_ms)
            .invoke_async(&mut self.con())
            .await
            .map_err(redis_failed)?;
        Ok(mine
            .into_iter()
            .filter_map(|i| ids.get(i.checked_sub(1)?).cloned())
            .collect())
    }

    pub async fn release(&self, ids: &[String]) {
        if ids.is_empty() {
            return;
        }
        let mut call = self.release.prepare_invoke();
        for k in self.lease_keys(ids) {
            call.key(k);
        }
        let done: Result<u32, _> = call.arg(&self.replica).invoke_async(&mut self.con()).await;
        if let Err(e) = done {
            tracing::warn!(error = %e, "batch store: leases not released; they expire");
        }
    }

    pub async fn take_items(&self, id: &str, lines: &[u32], n: usize) -> Result<Taken, StoreError> {
        if lines.is_empty() {
            return Ok(Taken::default());
        }
        let mut call = self.take.key(self.key(&format!("results:{id}")));
        call.key(self.key(&format!("items:{id}")))
            .arg(&self.replica)
            .arg(self.lease_ms)
            .arg(n);
        for line in lines {
            call.arg(line);
        }
        let (taken, done, busy): (Vec<u32>, Vec<u32>, Vec<u32>) = call
            .invoke_async(&mut self.con())
            .await
            .map_err(redis_failed)?;
        Ok(Taken { taken, done, busy })
    }

    pub async fn release_items(&self, id: &str, lines: &[u32]) {
        if lines.is_empty() {
            return;
        }
        let mut call = self.release_items.key(self.key(&format!("items:{id}")));
        call.arg(&self.replica);
        for line in lines {
            call.arg(line);
        }
        if let Err(e) = call.invoke_async::<u32>(&mut self.con()).await {
            tracing::warn!(error = %e, "batch store: item leases not released; they expire");
        }
    }
}
