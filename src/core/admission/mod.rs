//! Admission: the checks on arrival, in order — tenant concurrency cap,
//! request-rate bucket, GPU-seconds bucket, tenant queue capacity, and the
//! tenant's TTFT SLO against the predicted wait. A refusal is a decision
//! (429), not an error.

pub mod bucket;
mod refusal;
pub mod shared_limit;

pub use bucket::Bucket;
pub use refusal::*;
pub use shared_limit::{LeaseAnswer, LeaseAsk, LeaseKind, SharedLimit, dust};
