//! The request path: one request from its tenant to its access line.
//! [`request`] is the path in order (identify, read, admit, forward,
//! relay, finish); the others are its steps and the state they share.

pub mod access;
pub mod adapters;
pub mod connections;
pub mod forward;
pub mod live_policy;
pub mod origins;
pub mod passthrough;
pub mod relay;
pub mod request;
pub mod salt;
pub mod scheduling;
pub mod spans;
pub mod state;
pub mod tenant;
pub mod ticket;
pub mod triton_stop;
pub mod upstream;
pub mod usage_share;
