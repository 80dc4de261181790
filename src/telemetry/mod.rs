//! Telemetry: Prometheus metrics (`metrics`), traces (`otel`) and the log
//! layer that the process and a traced gateway's dispatch share.

pub mod log_writer;
pub mod metrics;
pub mod otel;
pub mod usage;
mod log;

pub use log::*;
