//! How a request ended: the vocabulary of `fairway_requests_total{outcome,
//! reason}`, the access log and the usage windows. Every request that
//! enters ends in exactly one outcome.

use crate::core::admission::LimitKind;

/// How a request ended, for `fairway_requests_total{outcome}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Served,
    Refused(RefusedBy),
    Shed,
    FailedUpstream,
    Cancelled,
    /// Fairway's own fault: a bug or a handler panic (500).
    Error,
}

/// Why a request was refused: an admission limit or a client error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefusedBy {
    Limit(LimitKind),
    Auth,
    InvalidRequest,
    UnknownModel,
    BodyTooLarge,
    /// The body did not arrive within `body_read_timeout`.
    BodyTimeout,
    /// The backend answered 4xx (passed through).
    Backend,
    /// A tenant with limits, while the cluster store is unreachable and
    /// `[cluster] on_store_failure = "closed"`.
    StoreUnavailable,
}

impl Outcome {
    /// How many outcomes there are (with each refusal reason its own).
    pub const COUNT: usize = 17;

    /// Every outcome, in the order of [`Outcome::index`].
    pub const ALL: [Outcome; Outcome::COUNT] = [
        Outcome::Served,
        Outcome::Refused(RefusedBy::Limit(LimitKind::Concurrency)),
        Outcome::Refused(RefusedBy::Limit(LimitKind::Rate)),
        Outcome::Refused(RefusedBy::Limit(LimitKind::GpuSeconds)),
        Outcome::Refused(RefusedBy::Limit(LimitKind::QueueFull)),
        Outcome::Refused(RefusedBy::Limit(LimitKind::Slo)),
        Outcome::Refused(RefusedBy::Auth),
        Outcome::Refused(RefusedBy::InvalidRequest),
        Outcome::Refused(RefusedBy::UnknownModel),
        Outcome::Refused(RefusedBy::BodyTooLarge),
        Outcome::Refused(RefusedBy::BodyTimeout),
        Outcome::Refused(RefusedBy::Backend),
        Outcome::Refused(RefusedBy::StoreUnavailable),
        Outcome::Shed,
        Outcome::FailedUpstream,
        Outcome::Cancelled,
        Outcome::Error,
    ];

    /// This outcome's position in [`Outcome::ALL`]: the metrics keep one
    /// counter per outcome in an array.
    pub fn index(self) -> usize {
        match self {
            Outcome::Served => 0,
            Outcome::Refused(RefusedBy::Limit(LimitKind::Concurrency)) => 1,
            Outcome::Refused(RefusedBy::Limit(LimitKind::Rate)) => 2,
            Outcome::Refused(RefusedBy::Limit(LimitKind::GpuSeconds)) => 3,
            Outcome::Refused(RefusedBy::Limit(LimitKind::QueueFull)) => 4,
            Outcome::Refused(RefusedBy::Limit(LimitKind::Slo)) => 5,
            Outcome::Refused(RefusedBy::Auth) => 6,
            Outcome::Refused(RefusedBy::InvalidRequest) => 7,
            Outcome::Refused(RefusedBy::UnknownModel) => 8,
            Outcome::Refused(RefusedBy::BodyTooLarge) => 9,
            Outcome::Refused(RefusedBy::BodyTimeout) => 10,
            Outcome::Refused(RefusedBy::Backend) => 11,
            Outcome::Refused(RefusedBy::StoreUnavailable) => 12,
            Outcome::Shed => 13,
            Outcome::FailedUpstream => 14,
            Outcome::Cancelled => 15,
            Outcome::Error => 16,
        }
    }

    /// The `outcome` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Served => "served",
            Outcome::Refused(_) => "refused",
            Outcome::Shed => "shed",
            Outcome::FailedUpstream => "failed_upstream",
            Outcome::Cancelled => "cancelled",
            Outcome::Error => "error",
        }
    }

    /// The `reason` label: the limit or error behind a refusal, else "".
    pub fn reason(self) -> &'static str {
        match self {
            Outcome::Refused(RefusedBy::Limit(l)) => l.as_str(),
            Outcome::Refused(RefusedBy::Auth) => "auth",
            Outcome::Refused(RefusedBy::InvalidRequest) => "invalid_request",
            Outcome::Refused(RefusedBy::UnknownModel) => "unknown_model",
            Outcome::Refused(RefusedBy::BodyTooLarge) => "body_too_large",
            Outcome::Refused(RefusedBy::BodyTimeout) => "body_timeout",
            Outcome::Refused(RefusedBy::Backend) => "backend",
            Outcome::Refused(RefusedBy::StoreUnavailable) => "store_unavailable",
            Outcome::Served
            | Outcome::Shed
            | Outcome::FailedUpstream
            | Outcome::Cancelled
            | Outcome::Error => "",
        }
    }
}
