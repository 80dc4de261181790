//! Fairway: an inline L7 inference gateway.
//!
//! [`serve`] runs a gateway on bound listeners until a shutdown future
//! resolves; `fairway serve` and the tests both start it that way.
//!
//! Module map, in layers bottom first (a module uses only those below
//! it; `docs/architecture.md` has the rules, `tests/architecture.rs`
//! keeps them):
//! 0. [`core`]: sans-IO scheduling (admission, fair queue, windows, routing, accounting).
//! 1. [`clock`] (the one wall-clock reader), [`fault`] (whose fault an
//!    error is, its log level, its sources on one line), [`hex`],
//!    [`outcome`] (how a request ended), [`prom`] (the Prometheus text writer), [`tokens`]
//!    (the shared token estimate), [`net`] (accept loop, body types, TLS,
//!    the HTTP client and the scrape helper).
//! 2. [`config`]: the policy file and its validation.
//! 3. [`protocol`]: OpenAI, Triton, audio: what is read of a body, usage,
//!    error shapes.
//! 4. [`cluster`] (the shared store and leases), [`poller`] (readings).
//! 5. [`sim`]: the simulated vLLM-like engine and its HTTP backend.
//! 6. [`telemetry`]: metrics, usage windows, traces, the log.
//! 7. [`agent`] (the GPU-node sidecar), [`replay`] (the policy simulator).
//! 8. [`placement`]: the Kubernetes extender and webhook.
//! 9. [`gateway`]: the request path and the state it shares.
//! 10. [`batch`]: the batches the gateway runs (store and runner).
//! 11. [`edge`]: listeners, the tower layers, admin, reload, the usage
//!     page, the Files and Batch routes.
//! 12. [`top`]: `fairway top`; [`cli`]: the other subcommands; `fuzz`,
//!     the fuzz targets.

pub mod agent;
pub mod batch;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod core;
pub mod edge;
pub mod fault;
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
