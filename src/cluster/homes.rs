//! Prefix homes shared by the replicas (`crate::core::scheduler`'s
//! `shared_homes` has why): each sync publishes the homes this replica
//! gave new prefixes to one stream in the store and reads every replica's
//! since its last read, in the stream's order; the first home published
//! for a prefix (its chain's first block) wins at every replica.
//!
//! The stream keeps about [`STREAM_LEN`] entries and each replica reads
//! at most [`READ_AT_ONCE`] a sync; a replica that falls further behind,
//! or a store that restarts empty, loses hints only (each replica keeps
//! routing on its own homes). A replica that joins reads the entries of
//! the last [`HOME_LIFE`].

use std::collections::{HashMap, VecDeque};

use redis::Script;

use crate::core::prefix::homes::{HOME_LIFE, HomeChange};
use crate::core::scheduler::PlacedHome;

use super::connection::Connection;

/// Entries the stream keeps, about (`XADD … MAXLEN ~`).
pub const STREAM_LEN: u64 = 20_000;
/// Entries a replica reads in one sync, at most.
pub const READ_AT_ONCE: usize = 4096;
/// Prefixes whose first home the ledger remembers, at most.
const LEDGER_CAP: usize = 65_536;

/// Appends this replica's placements (`ARGV[5]…`: backend, keys) to the
/// stream `KEYS[1]` as replica `ARGV[1]`, kept about `ARGV[2]` entries
/// and `ARGV[3]` ms after the last append; then returns the entries after
/// id `ARGV[4]` (`0-0`: those of the last `ARGV[3]` ms), at most
/// `ARGV[6]`… (see `READ`), each as id, replica, backend, keys.
const HOMES: &str = r"
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keep = tonumber(ARGV[3])
for i = 6, #ARGV, 2 do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*',
    'r', ARGV[1], 'b', ARGV[i], 'k', ARGV[i + 1])
end
if #ARGV >= 6 then redis.call('PEXPIRE', KEYS[1], keep) end
local from = ARGV[4]
if from == '0-0' then from = tostring(math.max(now_ms - keep, 0)) .. '-0' end
local entries = redis.call('XRANGE', KEYS[1], from, '+', 'COUNT', tonumber(ARGV[5]) + 1)
local out = {}
for _, e in ipairs(entries) do
  if e[1] ~= ARGV[4] then
    local f, r, b, k = e[2], '', '', ''
    for j = 1, #f, 2 do
      if f[j] == 'r' then r = f[j + 1]
      elseif f[j] == 'b' then b = f[j + 1]
      elseif f[j] == 'k' then k = f[j + 1] end
    end
    table.insert(out, e[1])
    table.insert(out, r)
    table.insert(out, b)
    table.insert(out, k)
  end
end
return out
";

/// One entry of the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The store's time of the append, ms (the entry id's first part).
    pub ms: u64,
    pub replica: String,
    pub placed: PlacedHome,
}

/// The stream, read and appended in one call.
#[derive(Debug)]
pub struct HomesStream {
    key: String,
    script: Script,
    /// The last entry id read (`0-0` before the first read).
    last: String,
}

impl HomesStream {
    /// The stream `{key_prefix}:homes` (`tag` is `{key_prefix}`).
    pub fn new(tag: &str) -> Self {
        HomesStream {
            key: format!("{tag}:homes"),
            script: Script::new(HOMES),
            last: "0-0".to_owned(),
        }
    }

    /// Appends `placed` as `replica`'s and reads every entry since the
    /// last call (its own included, which give its placements their
    /// order).
    pub async fn exchange(
        &mut self,
        con: &mut Connection,
        replica: &str,
        placed: &[PlacedHome],
    ) -> redis::RedisResult<Vec<Entry>> {
        let mut call = self.script.key(&self.key);
        call.arg(replica)
            .arg(STREAM_LEN)
            .arg(u64::try_from(HOME_LIFE.as_millis()).unwrap_or(u64::MAX))
            .arg(&self.last)
            .arg(READ_AT_ONCE);
        for p in placed {
            call.arg(&p.backend).arg(crate::hex::encode_u64s(&p.keys));
        }
        let flat: Vec<String> = call.invoke_async(con).await?;
        let entries = parse_entries(&flat);
        if let Some(id) = flat.chunks_exact(4).last().map(|e| &e[0]) {
            self.last.clone_from(id);
        }
        Ok(entries)
    }
}

fn parse_entries(flat: &[String]) -> Vec<Entry> {
    flat.chunks_exact(4)
        .filter_map(|e| {
            let ms = e[0].split('-').next()?.parse().ok()?;
            let keys = crate::hex::decode_u64s(&e[3])?;
            (!keys.is_empty()).then(|| Entry {
                ms,
                replica: e[1].clone(),
                placed: PlacedHome {
                    backend: e[2].clone(),
                    keys,
                },
            })
        })
        .collect()
}

/// The first home published for each prefix (by its first block's key),
/// for [`HOME_LIFE`] after it was last published.
#[derive(Debug, Default)]
pub struct Ledger {
    first: HashMap<u64, (String, u64)>,
    /// Prefixes by when they were recorded, oldest first (with that time:
    /// a later publication records it again).
    order: VecDeque<(u64, u64)>,
}

impl Ledger {
    /// What `entries` (in the stream's order) change at replica `me`: the
    /// first home of a prefix another replica published is taken; one of
    /// `me`'s own that came after another backend's moves there; a later
    /// one of another replica's is passed over (that replica moves).
    pub fn read(&mut self, me: &str, entries: Vec<Entry>) -> Vec<HomeChange> {
        let life = u64::try_from(HOME_LIFE.as_millis()).unwrap_or(u64::MAX);
        let mut changes = Vec::new();
        for Entry {
            ms,
            replica,
            placed,
        } in entries
        {
            self.forget_before(ms.saturating_sub(life));
            let first = placed.keys[0];
            let won = match self.first.get(&first) {
                Some((backend, _)) if *backend != placed.backend => Some(backend.clone()),
                _ => None,
            };
            let mine = replica == me;
            match won {
                Some(to) if mine => changes.push(HomeChange::Moved {
                    from: placed.backend,
                    to,
                    keys: placed.keys,
                }),
                Some(_) => {}
                None => {
                    self.first.insert(first, (placed.backend.clone(), ms));
                    self.order.push_back((first, ms));
                    if !mine {
                        changes.push(HomeChange::Placed {
                            backend: placed.backend,
                            keys: placed.keys,
                        });
                    }
                }
            }
        }
        while self.first.len() > LEDGER_CAP || self.order.len() > 2 * LEDGER_CAP {
            let Some((key, at)) = self.order.pop_front() else {
                break;
            };
            self.forget(key, at);
        }
        changes
    }

    /// Forgets the prefixes last published before `ms`.
    fn forget_before(&mut self, ms: u64) {
        while let Some(&(key, at)) = self.order.front()
            && at < ms
        {
            self.order.pop_front();
            self.forget(key, at);
        }
    }

    /// Forgets `key` if it was last recorded `at` (a later record keeps it).
    fn forget(&mut self, key: u64, at: u64) {
        if self.first.get(&key).is_some_and(|(_, t)| *t == at) {
            self.first.remove(&key);
        }
    }

    /// Prefixes remembered.
    pub fn len(&self) -> usize {
        self.first.len()
    }

    pub fn is_empty(&self) -> bool {
        self.first.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ms: u64, replica: &str, backend: &str, keys: &[u64]) -> Entry {
        Entry {
            ms,
            replica: replica.to_owned(),
            placed: PlacedHome {
                backend: backend.to_owned(),
                keys: keys.to_vec(),
            },
        }
    }

    #[test]
    fn the_first_home_published_for_a_prefix_wins_at_every_replica() {
        // Replicas a and b placed the prefix of block 1 at about the same
        // time, on different engines; a's came first in the stream.
        let entries = vec![
            entry(10, "a", "e1", &[1, 2, 3]),
            entry(11, "b", "e2", &[1, 2, 4]),
            entry(12, "b", "e2", &[7, 8]),
        ];
        let mut at_a = Ledger::default();
        let mut at_b = Ledger::default();
        let mut at_c = Ledger::default();
        assert_eq!(
            at_a.read("a", entries.clone()),
            vec![HomeChange::Placed {
                backend: "e2".into(),
                keys: vec![7, 8]
            }]
        );
        assert_eq!(
            at_b.read("b", entries.clone()),
            vec![
                HomeChange::Placed {
                    backend: "e1".into(),
                    keys: vec![1, 2, 3]
                },
                HomeChange::Moved {
                    from: "e2".into(),
                    to: "e1".into(),
                    keys: vec![1, 2, 4]
                },
            ]
        );
        let at_c = at_c.read("c", entries);
        assert_eq!(at_c.len(), 2, "{at_c:?}");
        assert!(at_c.iter().all(|c| matches!(c, HomeChange::Placed { .. })));
    }

    #[test]
    fn a_home_is_forgotten_a_home_life_after_it_was_published() {
        let life = u64::try_from(HOME_LIFE.as_millis()).unwrap();
        let mut ledger = Ledger::default();
        ledger.read("a", vec![entry(10, "b", "e1", &[1])]);
        // Published again by another replica on the same engine: it lives
        // on from then.
        ledger.read("a", vec![entry(life, "c", "e1", &[1])]);
        assert_eq!(ledger.len(), 1);
        let later = ledger.read("a", vec![entry(life + 20, "c", "e2", &[1])]);
        assert!(later.is_empty(), "still e1's: {later:?}");
        // Past its life, the prefix is new again: whoever publishes first
        // gives it its home.
        let changes = ledger.read("a", vec![entry(3 * life, "b", "e2", &[1])]);
        assert_eq!(
            changes,
            vec![HomeChange::Placed {
                backend: "e2".into(),
                keys: vec![1]
            }]
        );
        assert_eq!(ledger.len(), 1);
    }

    #[test]
    fn the_stream_is_read_back() {
        let flat: Vec<String> = [
            "1700-0",
            "a",
            "e1",
            "00000000000000010000000000000002",
            "1701-3",
            "b",
            "e2",
            "not hex",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        assert_eq!(parse_entries(&flat), vec![entry(1700, "a", "e1", &[1, 2])]);
    }
}
