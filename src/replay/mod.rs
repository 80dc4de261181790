//! `fairway replay`: the policy evaluated offline.
//!
//! - [`workload`]: the JSONL workload format, and access log → workload.
//! - [`scenario`]: generated workloads (the reference scenario, scenario files).
//! - [`sim`]: the discrete-event simulation driving the live scheduler
//!   against simulated engines on a simulated clock.
//! - [`report`]: per-tenant and overall figures, table, JSON, SVG.
//! - [`capacity`]: the highest arrival rate a variant serves within the SLOs.
//! - [`live`]: the same workload played against a running gateway (`fairway load`).

pub mod capacity;
mod compare;
pub mod handover;
pub mod load;
pub mod report;
pub mod scenario;
pub mod sim;
pub mod variant;
pub mod workload;

pub use compare::*;
pub use variant::Variant;
