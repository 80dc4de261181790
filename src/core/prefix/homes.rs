//! Where each prefix belongs: the backends the prefix strategy chose for
//! it, which outlive the engines' caches.
//!
//! The index says what an engine holds *now*; an engine with a cache
//! smaller than the pool's prefix set evicts a prefix and holds it no
//! more. Placed again by load alone, the prefix lands on another engine
//! and evicts something there, whose next request does the same: the
//! caches thrash. A home is where the prefix returns after an eviction,
//! so the pool keeps a partition of its prefix set, each engine's part
//! about what its cache holds.
//!
//! A home is recorded for each block of a request's chain sent to it, in
//! a table of the same shape as the index (CLOCK eviction, at most
//! [`HOLDERS`](super::HOLDERS) homes a block) and a quarter of its bound
//! (about 9 MiB at the default `prefix_index_blocks`).
//! It lasts [`HOME_LIFE`] after the last request sent there, and is never
//! cleared by the engine's evictions: only by the backend leaving the
//! pool.
//!
//! A backend's share of the partition is the blocks homed on it. A
//! request sent to its home refreshes only the blocks already homed
//! there, so the part of each prompt that follows its shared prefix is
//! homed once per prefix, not once per request
//! (`Scheduler::settle_home`). Traffic sharing nothing still homes more
//! blocks on every backend than its cache holds: no new prefix then fits
//! anywhere, and new ones go by load alone
//! (`crate::core::routing::prefix_aware`).

use std::time::Duration;

use crate::core::ids::BackendId;
use crate::core::time::Instant;

use super::PrefixIndex;

/// How long a home lasts after the last request sent to it.
pub const HOME_LIFE: Duration = Duration::from_secs(600);

/// One pool's homes. See the module docs.
#[derive(Debug)]
pub struct Homes {
    table: PrefixIndex,
}

impl Homes {
    /// No homes yet; at most `index_cap / 4` blocks.
    pub fn new(index_cap: usize) -> Self {
        Homes {
            table: PrefixIndex::new(index_cap / 4, Some(HOME_LIFE)),
        }
    }

    /// A new cap (a policy reload).
    pub fn reconfigure(&mut self, index_cap: usize) {
        self.table.reconfigure(index_cap / 4, Some(HOME_LIFE));
    }

    /// For each of `backends`, how many of `keys`' leading blocks have it
    /// as their home, into `out`.
    pub fn matched(
        &mut self,
        now: Instant,
        keys: &[u64],
        backends: &[BackendId],
        out: &mut Vec<u32>,
    ) {
        self.table.matched(now, keys, backends, out);
    }

    /// `backend` is a home of `keys` (a chain) for [`HOME_LIFE`] from `now`.
    pub fn settle(&mut self, now: Instant, backend: BackendId, keys: &[u64]) {
        self.table.stored(now, backend, keys);
    }

    /// `backend` is no longer a home of `keys` (another replica's home
    /// for them came first).
    pub fn unsettle(&mut self, backend: BackendId, keys: &[u64]) {
        self.table.removed(backend, keys);
    }

    /// Blocks homed on `backend` (until their slots are reused): its
    /// share of the partition.
    pub fn footprint(&self, backend: BackendId) -> usize {
        self.table.held(backend)
    }

    /// `backend` left the pool: it is no one's home.
    pub fn left(&mut self, backend: BackendId) {
        self.table.cleared(backend);
    }

    /// Heap bytes of its table.
    pub fn heap_bytes(&self) -> usize {
        self.table.heap_bytes()
    }

    /// Blocks with a home now.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

/// What the cluster decided of a prefix's home, by backend name (the
/// replicas' ids differ): handed to each replica's scheduler
/// (`Scheduler::homes_changed`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HomeChange {
    /// Another replica gave the prefix of `keys` (a chain) a home on
    /// `backend`, first.
    Placed { backend: String, keys: Vec<u64> },
    /// This replica's home for `keys` on `from` lost to an earlier one on
    /// `to`.
    Moved {
        from: String,
        to: String,
        keys: Vec<u64>,
    },
}
