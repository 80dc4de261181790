//! Fairway: an inline L7 inference gateway.
//!
//! Module map:
//! - [`core`]: sans-IO scheduling (admission, fair queue, windows, routing, accounting).
//! - [`config`]: the policy file, validation and reload.
//! - [`sim`]: the simulated vLLM-like engine and its HTTP backend.
//! - [`clock`]: the one wall-clock reader.

pub mod clock;
pub mod config;
pub mod core;
pub mod sim;
pub mod tokens;
