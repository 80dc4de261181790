//! Homes shared by the replicas of a cluster.
//!
//! Each replica places new prefixes by its own view (its loads, its
//! homes); two replicas that see a prefix first at about the same time
//! may give it different homes, and replicas routing on their own
//! history only (approximate mode, no KV events to show where another
//! replica sent a prefix) never learn of each other's. The partition
//! then splits: each engine caches the prefixes of every replica's part,
//! and a capacity-limited cache thrashes as it would with no homes.
//!
//! So a replica hands the homes it gives new prefixes to the cluster sync
//! ([`Scheduler::placed_homes`]), which publishes them in one order to
//! every replica; the first placement of a prefix wins there, and the
//! sync hands back what changes here ([`Scheduler::homes_changed`]):
//! another replica's placement to take, or this replica's own that lost
//! to an earlier one, to move.

use crate::core::prefix::homes::HomeChange;
use crate::core::scheduler::Scheduler;
use crate::core::time::Instant;

/// Placements kept for the next sync, at most; beyond, they are dropped
/// (the sync is late or the store down; each is a hint).
pub const PLACED_CAP: usize = 1024;

/// A home this replica gave a new prefix: the backend (by name) and the
/// prefix's chain of block keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacedHome {
    pub backend: String,
    pub keys: Vec<u64>,
}

impl Scheduler {
    /// From now on, keeps the homes given to new prefixes for
    /// [`Scheduler::placed_homes`] (a replica of a cluster).
    pub fn share_homes(&mut self) {
        self.placed.get_or_insert_with(Vec::new);
    }

    /// The homes given to new prefixes since the last call, oldest first.
    pub fn placed_homes(&mut self) -> Vec<PlacedHome> {
        let Some(placed) = self.placed.as_mut() else {
            return Vec::new();
        };
        let placed = std::mem::take(placed);
        placed
            .into_iter()
            .filter(|(b, _)| !self.backends[b.0 as usize].retired)
            .map(|(b, keys)| PlacedHome {
                backend: self.backends[b.0 as usize].name.clone(),
                keys,
            })
            .collect()
    }

    /// Applies what the cluster decided of the homes (see the module
    /// docs). A backend this replica does not know, or whose pool routes
    /// on no homes, is passed over.
    pub fn homes_changed(&mut self, now: Instant, changes: &[HomeChange]) {
        for change in changes {
            match change {
                HomeChange::Placed { backend, keys } => {
                    let Some(b) = self.backend(backend) else {
                        continue;
                    };
                    let pool = self.backends[b.0 as usize].pool;
                    if let Some(h) = self.pools[pool.0 as usize].homes.as_mut() {
                        h.settle(now, b, keys);
                    }
                }
                HomeChange::Moved { from, to, keys } => {
                    let (Some(from), Some(to)) = (self.backend(from), self.backend(to)) else {
                        continue;
                    };
                    let pool = self.backends[from.0 as usize].pool;
                    if self.backends[to.0 as usize].pool != pool {
                        continue;
                    }
                    let events = self.backends[from.0 as usize].prefix_events;
                    let ps = &mut self.pools[pool.0 as usize];
                    let Some(h) = ps.homes.as_mut() else {
                        continue;
                    };
                    h.unsettle(from, keys);
                    h.settle(now, to, keys);
                    // What this replica sent there is its guess alone (no
                    // events say what the engine holds): kept, it would
                    // make the prefix's next request adopt `from` again.
                    if !events && let Some(ix) = ps.prefix.as_mut() {
                        ix.removed(from, keys);
                    }
                }
            }
        }
    }
}
