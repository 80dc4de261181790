//! The simulated backend: a vLLM-like engine model (`engine`, sans-IO, reused
//! by replay) and the HTTP server that exposes it with vLLM's wire format
//! (`backend`).

pub mod backend;
pub mod engine;
