//! Telemetry: Prometheus metrics (`metrics`) and logging setup.

pub mod metrics;
pub mod otel;
