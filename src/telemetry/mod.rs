//! Telemetry: Prometheus metrics (`metrics`), traces (`otel`) and the log
//! layer that the process and a traced gateway's dispatch share.

mod edge_counters;
mod log;
pub mod log_writer;
pub mod metrics;
pub mod otel;
mod snapshot;
pub mod usage;

pub use log::*;
