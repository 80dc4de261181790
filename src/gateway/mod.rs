//! The request path: one request from its tenant to its access line.
//! [`request`] is the path in order (identify, read, admit, forward,
//! relay, finish); the others are its steps and the state they share.

pub mod access;
pub mod adapters;
pub mod forward;
pub mod handle;
pub mod live;
pub mod origins;
pub mod passthrough;
pub mod pool;
pub mod relay;
pub mod request;
pub mod salt;
pub mod scheduling;
pub mod spans;
pub mod stop;
pub mod tenant;
pub mod ticket;
pub mod upstream;
pub mod usage_share;
