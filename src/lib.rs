//! Fairway: an inline L7 inference gateway.
//!
//! [`serve`] runs a gateway on bound listeners until a shutdown future
//! resolves; `fairway serve` and the tests both start it that way.
//!
//! Module map:
//! - [`core`]: sans-IO scheduling (admission, fair queue, windows, routing, accounting).
//! - [`config`]: the policy file, validation and reload.
//! - [`poller`]: sans-IO metrics parsing and backend dialects (scrape body to reading).
//! - [`sim`]: the simulated vLLM-like engine and its HTTP backend.
//! - [`proxy`]: the I/O shell: listeners, the request path, the SSE relay, admin, reload.
//! - [`replay`]: `fairway replay`, the discrete-event policy simulator, its workloads and reports.
//! - [`telemetry`]: Prometheus metrics.
//! - [`agent`]: the `fairway agent` GPU-node sidecar (engine scrape plus NVML, one JSON reading).
//! - [`clock`]: the one wall-clock reader.
//! - [`tokens`]: the shared token estimate.
//! - [`top`]: `fairway top`, the terminal view rendered from a `/metrics` scrape.

pub mod agent;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod core;
pub mod edge;
#[doc(hidden)]
pub mod fuzz;
pub mod gateway;
pub mod hex;
pub mod net;
pub mod outcome;
pub mod placement;
pub mod poller;
pub mod prom;
pub mod protocol;
pub mod replay;
pub mod sim;
pub mod telemetry;
pub mod tokens;
pub mod top;

pub use edge::listeners::Listeners;
pub use edge::server::{ServeOptions, serve};
pub use edge::services::PolicySource;
