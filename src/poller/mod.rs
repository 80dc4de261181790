//! The backend poller: scraping each backend and turning the body into a
//! [`Reading`](crate::core::reading::Reading).
//!
//! - [`live`] is the I/O half: one task per backend, health probes,
//!   ejection and return.
//! - [`expo`] parses the Prometheus text exposition format (and the
//!   OpenMetrics variations a scraper meets).
//! - [`dialect`] maps each backend's metric names onto a `Reading`, keeps
//!   the previous scrape's histogram buckets so that TTFT and end-to-end p99
//!   cover only the last scrape window, and defines the JSON that Fairway's
//!   own `fairway agent` sidecar serves.
//!
//! `expo` and `dialect` open no socket and read no clock: the caller fetches
//! the body and passes the instant it was read.

pub mod dialect;
pub mod expo;
pub mod live;

pub use dialect::{
    AgentGpu, AgentReading, DecodeError, Decoder, HistogramBucket, HistogramWindow,
    collect_buckets, quantile,
};
pub use expo::{ErrorKind, Exposition, MetricType, ParseError, Sample, parse, parse_strict};
pub use live::{PollStats, Pollers, Sink};
