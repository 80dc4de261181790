//! Admission: the checks on arrival, in order — tenant concurrency cap,
//! request-rate bucket, GPU-seconds bucket, tenant queue capacity, and the
//! tenant's TTFT SLO against the predicted wait. A refusal is a decision
//! (429), not an error.

pub mod bucket;
pub mod lease;

use std::time::Duration;

pub use bucket::Bucket;
pub use lease::{LeaseAnswer, LeaseAsk, LeaseKind, SharedLimit};

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
    /// The tenant's request-bucket capacity (for `x-ratelimit-limit-requests`), if limited.
    pub requests_limit: Option<f64>,
    /// Whole requests left in the bucket now.
    pub requests_remaining: Option<f64>,
    /// Time until the request bucket is full.
    pub requests_reset: Option<Duration>,
}
