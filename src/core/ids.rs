//! Identifiers and units used across the core. Ids index the scheduler's
//! tables; they are stable across policy reloads (entities are matched by
//! name and never renumbered).

use std::fmt;

/// A tenant: the unit of fairness and quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TenantId(pub u32);

/// A pool: the backends serving one model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolId(pub u32);

/// A LoRA adapter, by name (interned by the scheduler).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AdapterId(pub u32);

/// One backend endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BackendId(pub u32);

/// A request known to the scheduler: slab index plus a generation, so a
/// stale id (already ended) never aliases a newer request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

impl RequestId {
    pub(crate) fn new(index: u32, generation: u32) -> Self {
        RequestId(u64::from(generation) << 32 | u64::from(index))
    }
    pub(crate) fn index(self) -> usize {
        (self.0 & 0xffff_ffff) as usize
    }
    pub(crate) fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Token usage of a finished request, as the backend reported it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Prompt tokens the engine found in its prefix cache, where it
    /// reports them.
    pub cached_tokens: Option<u32>,
}
