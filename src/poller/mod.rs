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
//! - [`kv_events`] decodes the engines' KV-cache events (vLLM's ZMQ
//!   publisher's msgpack batches, and SGLang's and TensorRT-LLM's), and
//!   encodes them as the simulated engine publishes them.
//!
//! - `tasks::kv_subscriber` is the I/O half of precise prefix routing: one
//!   task per backend with `kv_events`, subscribed to its engine's
//!   publisher, with replay on gaps, resets and a watchdog.
//!
//! `expo`, `dialect` and `kv_events` open no socket and read no clock: the
//! caller fetches the body and passes the instant it was read.

pub mod dialect;
pub mod expo;
pub mod kv_events;
pub mod tasks;

pub use dialect::{
    AgentGpu, AgentReading, DecodeError, Decoder, HistogramBucket, HistogramWindow,
    collect_buckets, quantile,
};
pub use expo::{ErrorKind, Exposition, MetricType, ParseError, Sample, parse, parse_strict};
pub use tasks::{KvEventCounts, PollStats, Pollers, Sink};
