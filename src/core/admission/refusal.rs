//! What admission says: which limit refused a request, the refusal with its retry-after, a bucket's state, a tenant's rate limits for the headers.

use super::bucket::Bucket;
use std::time::Duration;

/// Which limit refused a request; becomes the `limit` metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitKind {
    Concurrency,
    Rate,
    GpuSeconds,
    QueueFull,
    /// Predicted to miss its tenant's TTFT SLO (`on_late = "refuse"`).
    Slo,
}

impl LimitKind {
    /// Every kind, for metric pre-registration.
    pub const ALL: [LimitKind; 5] = [
        LimitKind::Concurrency,
        LimitKind::Rate,
        LimitKind::GpuSeconds,
        LimitKind::QueueFull,
        LimitKind::Slo,
    ];

    /// Stable label value.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Concurrency => "concurrency",
            LimitKind::Rate => "rate",
            LimitKind::GpuSeconds => "gpu_seconds",
            LimitKind::QueueFull => "queue_full",
            LimitKind::Slo => "slo",
        }
    }
}

/// A refused arrival, with what the 429 needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    pub limit: LimitKind,
    /// When a retry may succeed.
    pub retry_after: Duration,
    /// The tenant's buckets, for the `x-ratelimit-*` headers.
    pub limits: RateLimits,
}

/// One bucket as the `x-ratelimit-*` headers show it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketState {
    /// Its capacity.
    pub limit: f64,
    /// What is left in it now (at least 0).
    pub remaining: f64,
    /// Time until it is full again.
    pub reset: Duration,
}

impl BucketState {
    pub fn of(b: &Bucket) -> Self {
        BucketState {
            limit: b.capacity(),
            remaining: b.last_level().max(0.0),
            reset: b.time_to_full(),
        }
    }
}

/// A tenant's buckets after its arrival was admitted or refused (`None`:
/// no such limit).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RateLimits {
    /// The request-rate bucket (`rate` / `burst`).
    pub requests: Option<BucketState>,
    /// The GPU-seconds bucket (`gpu_seconds_per_hour`).
    pub gpu_seconds: Option<BucketState>,
}
